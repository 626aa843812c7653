"""Subcommands of ``mvg-dask`` that run releases: ``release``, ``demo``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import yaml

from mvg_dask.cli import app
from mvg_dask.errors import DataError, MvgDaskError
from mvg_dask.spec import SpecError

DEMO_MARKER = ".mvg_dask_demo"


class RunFailed(click.ClickException):
    """A run failed for a reason other than bad input (exit code 1)."""

    exit_code = 1


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s mvg_dask %(message)s", stream=sys.stderr
    )
    for noisy in ("distributed", "tornado", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(exc: BaseException) -> None:
    """Turn an expected failure into a one-line click error (exit 2 for bad input, 1 else)."""
    if os.environ.get("MVG_DASK_DEBUG"):
        raise exc
    if isinstance(exc, (SpecError, DataError)):
        raise click.UsageError(str(exc)) from None
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not isinstance(exc, MvgDaskError):
        message = f"{type(exc).__name__}: {message}"
    raise RunFailed(message) from None


@app.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help="Dask scheduler address (default: a LocalCluster sized to this machine).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate, read metadata only and print the plan as JSON; compute nothing.",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Reproducible noise for tests and demos; recorded as NOT private.",
)
@click.option("--quiet", is_flag=True, help="No progress output.")
def release(spec: str, scheduler: str | None, dry_run: bool, seed: int | None, quiet: bool) -> None:
    """Run the release described by the YAML file SPEC."""
    from mvg_dask import api

    try:
        if dry_run:
            click.echo(json.dumps(api.dry_run(spec).to_dict(), indent=2))
            return
        if not quiet:
            _setup_logging()
        result = api.release(spec, scheduler=scheduler, seed=seed, progress=not quiet)
    except (MvgDaskError, OSError, RuntimeError, ValueError) as exc:
        _fail(exc)
        return
    note = " (seeded: NOT private)" if result.seeded else ""
    click.echo(
        f"release {result.release_id} complete: {result.output}{note}; "
        f"clipped values: {result.clipped_count}; {result.seconds:.1f} s"
    )


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / DEMO_MARKER).exists():
            raise click.UsageError(
                f"--out {out} exists and was not made by the demo; choose an empty directory"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("made by mvg-dask demo; safe to delete\n")


def _write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@app.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="out/demo",
    show_default=True,
    help="Directory for the demo's data, specs and releases (recreated).",
)
@click.option(
    "--synthetic",
    "synthetic_records",
    type=click.IntRange(min=10),
    default=None,
    help="Also release a synthetic dataset of this many records (scale run).",
)
@click.option(
    "--features",
    type=click.IntRange(min=2),
    default=64,
    show_default=True,
    help="Features of the synthetic dataset.",
)
@click.option("--scheduler", default=None, metavar="ADDRESS", help="Dask scheduler address.")
@click.option("--seed", type=int, default=None, help="Reproducible (NOT private) noise.")
def demo(
    out: str,
    synthetic_records: int | None,
    features: int,
    scheduler: str | None,
    seed: int | None,
) -> None:
    """End-to-end releases of the shipped CTG data on the embedded LocalCluster."""
    from mvg_dask import api
    from mvg_dask.data import write_matrix
    from mvg_dask.datasets import load_ctg
    from mvg_dask.engine import connect

    _setup_logging()
    root = Path(out)
    _prepare_out(root)
    ctg = load_ctg()
    M, N = ctg.X.shape
    store = write_matrix(
        ctg.X, root / "ctg.zarr", feature_names=ctg.feature_names, record_chunk=512
    )
    click.echo(f"CTG: {M} features x {N} records (scaled to [0, 1]) -> {store}")
    important = list(ctg.important)
    common = {
        "input": {"store": "ctg.zarr", "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "privacy": {"epsilon": 1.0, "delta": float(1.0 / N)},
        "ledger": {
            "path": "ledger.sqlite",
            "dataset": "ctg",
            "budget": {"epsilon": 4.0, "delta": float(4.0 / N)},
        },
    }
    specs = {
        "covariance": _write_spec(
            root / "ctg-covariance.yaml",
            {
                "name": "ctg-covariance",
                **common,
                "query": "covariance",
                "mechanism": {
                    "algorithm": "equi-modal",
                    "calibration": "exact",
                    "allocation": {"strategy": "uniform"},
                },
                "output": {"store": "ctg-covariance.zarr"},
            },
        ),
        "identity": _write_spec(
            root / "ctg-identity.yaml",
            {
                "name": "ctg-identity",
                **common,
                "query": "identity",
                "mechanism": {
                    "algorithm": "unimodal",
                    "calibration": "exact",
                    "allocation": {"strategy": "binary", "important": important, "share": 0.8},
                },
                "output": {"store": "ctg-identity.zarr"},
            },
        ),
    }
    X = np.asarray(ctg.X)
    C = X @ X.T / N
    try:
        with connect(scheduler) as client:
            click.echo(f"dask scheduler: {client.scheduler_info().get('address', '?')}")
            for name, path in specs.items():
                t = time.perf_counter()
                res = api.release(path, client=client, seed=seed)
                ds = api.open_release(res.output)
                if name == "covariance":
                    est = ds["covariance"].values
                    err = np.linalg.norm(est - C) / np.linalg.norm(C)
                    what = f"relative Frobenius error vs non-private XX^T/N: {err:.3%}"
                else:
                    Y = ds["X"].values
                    err = np.sqrt(np.mean((Y - X) ** 2, axis=1))
                    imp = np.zeros(M, dtype=bool)
                    imp[important] = True
                    mean_err = np.mean(np.abs(Y.mean(axis=1) - X.mean(axis=1)))
                    what = (
                        f"RMSE per entry vs non-private X: important features "
                        f"{err[imp].mean():.3g}, others {err[~imp].mean():.3g} (directional "
                        f"noise); feature means from the release: mean abs error {mean_err:.3g}"
                    )
                click.echo(
                    f"{name}: {res.output} [{res.plan.calibration}, eps={res.plan.epsilon:g}, "
                    f"delta={res.plan.delta:.3g}, Delta_M={res.plan.mahalanobis_sensitivity:.4g}]"
                    f" in {time.perf_counter() - t:.1f} s\n    {what}"
                )
            if synthetic_records:
                _synthetic_run(root, client, synthetic_records, features, seed)
    except (MvgDaskError, OSError, RuntimeError, ValueError) as exc:
        _fail(exc)
    from mvg_dask.engine.ledger import open_ledger

    with open_ledger(root / "ledger.sqlite") as book:
        for entry in book.summary():
            s, b = entry["spent"], entry["budget"]
            click.echo(
                f"ledger: dataset {entry['dataset']} spent epsilon={s['epsilon']:.3g} of "
                f"{b['epsilon']:g} ({entry['composition']} composition)"
            )
    click.echo(
        f"done; specs, ledger and outputs are in {root}/ (open the outputs with "
        "mvg_dask.api.open_release or xarray.open_zarr)"
    )


def _synthetic_run(root: Path, client: Any, records: int, features: int, seed: int | None) -> None:
    from mvg_dask import api
    from mvg_dask.data import synthetic, write_matrix

    t = time.perf_counter()
    chunk = max(1000, min(250_000, 2**25 // (8 * features)))
    store = root / "synthetic.zarr"
    import dask

    with dask.config.set(scheduler=client.get):
        write_matrix(synthetic(records, features, record_chunk=chunk), store, record_chunk=chunk)
    click.echo(f"synthetic: {features} x {records} written in {time.perf_counter() - t:.1f} s")
    for query in ("covariance", "identity"):
        spec = {
            "name": f"synthetic-{query}",
            "input": {"store": "synthetic.zarr"},
            "domain": {"box": {"lower": 0.0, "upper": 1.0}},
            "query": query,
            "mechanism": {"algorithm": "equi-modal" if query == "covariance" else "unimodal"},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "output": {"store": f"synthetic-{query}.zarr"},
            "ledger": {
                "path": "ledger.sqlite",
                "dataset": "synthetic",
                "budget": {"epsilon": 2.0, "delta": 2e-6},
            },
        }
        path = _write_spec(root / f"synthetic-{query}.yaml", spec)
        res = api.release(path, client=client, seed=seed)
        click.echo(
            f"synthetic {query}: {res.output} in {res.seconds:.1f} s "
            f"({records * features / res.seconds / 1e6:.1f} M elements/s)"
        )


@app.command()
@click.argument("name", type=click.Choice(["ctg", "liver", "movement"]))
@click.option("--out", required=True, type=click.Path(), help="Zarr store to create.")
@click.option("--records-first", is_flag=True, help="Store as records x features.")
@click.option(
    "--chunk", type=click.IntRange(min=1), default=512, show_default=True, help="Records per chunk."
)
def dataset(name: str, out: str, records_first: bool, chunk: int) -> None:
    """Write a shipped paper dataset (scaled to its declared domain) to a Zarr store."""
    from mvg_dask.data import write_matrix
    from mvg_dask.datasets import load_ctg, load_liver, load_movement

    ds = {"ctg": load_ctg, "liver": load_liver, "movement": load_movement}[name]()
    if Path(out).exists():
        raise click.UsageError(f"--out {out} already exists; choose another path")
    write_matrix(
        ds.X, out, feature_names=ds.feature_names, record_chunk=chunk, records_first=records_first
    )
    lo, hi = float(np.min(ds.lower)), float(np.max(ds.upper))
    click.echo(
        f"{name}: {ds.X.shape[0]} features x {ds.X.shape[1]} records in [{lo:g}, {hi:g}] -> {out}"
    )


@app.group()
def ledger() -> None:
    """Inspect, export and migrate a privacy ledger (SQLite file or PostgreSQL URL)."""


_LEDGER_HELP = (
    "The ledger: a SQLite file, sqlite:///path, or postgresql://user@host/db (no password in "
    "the URL: PGPASSWORD, a libpq passfile or --password-file)."
)


def _ledger_options(f: Any) -> Any:
    f = click.option(
        "--password-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="PostgreSQL: a file holding the password (a mounted secret).",
    )(f)
    return click.option("--ledger", "location", required=True, help=_LEDGER_HELP)(f)


def _open_existing(location: str, password_file: str | None) -> Any:
    from mvg_dask.engine.ledger import open_ledger

    try:
        return open_ledger(location, password_file=password_file, create=False)
    except MvgDaskError as exc:
        raise RunFailed(str(exc)) from None


@ledger.command("show")
@_ledger_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ledger_show(location: str, password_file: str | None, as_json: bool) -> None:
    """List releases (id, status, epsilon, delta, time) and the budget spent and left."""
    from mvg_dask.engine.ledger import summary_text

    with _open_existing(location, password_file) as book:
        summary = book.summary()
    click.echo(json.dumps(summary, indent=2) if as_json else summary_text(summary))


@ledger.command("export")
@_ledger_options
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the JSON here (default: stdout).",
)
def ledger_export(location: str, password_file: str | None, out: str | None) -> None:
    """Write every budget and every entry as JSON (never a key)."""
    from mvg_dask.engine.ledger import export_ledger

    with _open_existing(location, password_file) as book:
        text = json.dumps(export_ledger(book), indent=2)
    if out is None:
        click.echo(text)
    else:
        Path(out).write_text(text + "\n")


@ledger.command("abort")
@_ledger_options
@click.argument("release_id")
@click.option("--reason", required=True, help="Why (kept in the ledger, curator-side).")
def ledger_abort(location: str, password_file: str | None, release_id: str, reason: str) -> None:
    """Abort a pending (crashed) release: it stays charged and its key is erased."""
    with _open_existing(location, password_file) as book:
        try:
            book.abort(release_id, reason)
        except MvgDaskError as exc:
            raise RunFailed(str(exc)) from None
    click.echo(f"release {release_id} aborted; it stays charged")


@ledger.command("migrate")
@_ledger_options
def ledger_migrate(location: str, password_file: str | None) -> None:
    """Create a ledger's schema, or upgrade it in place to this version's (back it up first)."""
    from mvg_dask.engine.ledger import migrate_ledger

    try:
        click.echo(migrate_ledger(location, password_file=password_file))
    except MvgDaskError as exc:
        raise RunFailed(str(exc)) from None


def _register_experiments() -> None:
    from mvg_dask.experiments.cli import experiments

    app.add_command(experiments)


_register_experiments()
