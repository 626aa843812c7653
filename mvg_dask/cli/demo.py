"""``mvg-dask demo``: end-to-end releases of the shipped CTG data on the embedded LocalCluster.

The release specs are YAML templates in ``pipelines/demo/`` (installed as the package data
``mvg_dask.cli.demo_specs``); the demo fills in what depends on the data and writes each spec
into ``--out``, where its relative paths (input, output, ledger) resolve.
"""

from __future__ import annotations

import shutil
import time
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

import click

from mvg_dask.cli._common import fail, setup_logging
from mvg_dask.errors import MvgDaskError

DEMO_MARKER = ".mvg_dask_demo"
#: Each demo release's delta, and the dataset budget's: far below one record's share 1/N.
DEMO_DELTA, DEMO_BUDGET_DELTA = 1e-6, 1e-5
SPEC_PACKAGE = "mvg_dask.cli.demo_specs"


def demo_spec_text(name: str, **values: object) -> str:
    """The demo spec template ``name`` (e.g. ``"ctg-covariance"``) with its ``${...}`` filled in.

    Parameters
    ----------
    name : str
        Template name, without ``.yaml``.
    **values : object
        The template's fields; their ``str`` is substituted (a list gives a YAML flow list).

    Returns
    -------
    str
        A complete YAML release spec.

    Raises
    ------
    KeyError
        When the template uses a field that is not given.
    """
    text = resources.files(SPEC_PACKAGE).joinpath(f"{name}.yaml").read_text()
    return Template(text).substitute({k: str(v) for k, v in values.items()})


def _demo_spec(path: Path, seed: int | None) -> Any:
    """The spec at ``path``; with a seed, without its ledger (a seeded release is not private
    and is refused with a ledger)."""
    from mvg_dask import api

    spec = api.load(path)
    return spec if seed is None else spec.model_copy(update={"ledger": None})


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / DEMO_MARKER).exists():
            raise click.UsageError(
                f"--out {out} exists and was not made by the demo; choose an empty directory"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("made by mvg-dask demo; safe to delete\n")


def _write_spec(root: Path, name: str, **values: object) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(demo_spec_text(name, **values))
    return path


@click.command()
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
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Reproducible (NOT private) noise; the releases then go without the ledger.",
)
def demo(
    out: str,
    synthetic_records: int | None,
    features: int,
    scheduler: str | None,
    seed: int | None,
) -> None:
    """End-to-end releases of the shipped CTG data on the embedded LocalCluster."""
    import numpy as np

    from mvg_dask import api
    from mvg_dask.data import write_matrix
    from mvg_dask.datasets import load_ctg
    from mvg_dask.engine.cluster import connect
    from mvg_dask.release_format import released_variable

    setup_logging()
    root = Path(out)
    _prepare_out(root)
    ctg = load_ctg()
    M, N = ctg.X.shape
    store = write_matrix(
        ctg.X, root / "ctg.zarr", feature_names=ctg.feature_names, record_chunk=512
    )
    click.echo(f"CTG: {M} features x {N} records (scaled to [0, 1]) -> {store}")
    important = [int(i) for i in ctg.important]
    click.echo(_privacy_text(N))
    deltas = {"delta": DEMO_DELTA, "budget_delta": DEMO_BUDGET_DELTA}
    specs = {
        "covariance": _write_spec(root, "ctg-covariance", **deltas),
        "identity": _write_spec(root, "ctg-identity", important=important, **deltas),
    }
    X = np.asarray(ctg.X)
    try:
        with connect(scheduler) as client:
            click.echo(f"dask scheduler: {client.scheduler_info().get('address', '?')}")
            for name, path in specs.items():
                t = time.perf_counter()
                res = api.release(_demo_spec(path, seed), client=client, seed=seed)
                ds = api.open_release(res.output)
                Y = ds[released_variable(ds.attrs)].values  # the privatized variable
                click.echo(
                    f"{name}: {res.output} [{res.plan.calibration}, eps={res.plan.epsilon:g}, "
                    f"delta={res.plan.delta:.3g}, Delta_M={res.plan.mahalanobis_sensitivity:.4g}]"
                    f" in {time.perf_counter() - t:.1f} s"
                )
                click.echo(_accuracy_text(name, X, Y, res.plan, important))
            if synthetic_records:
                _synthetic_run(root, client, synthetic_records, features, seed)
    except (MvgDaskError, OSError, RuntimeError, ValueError) as exc:
        fail(exc)
    from mvg_dask.ledger import open_ledger

    if seed is not None:
        click.echo("seeded releases (NOT private): no ledger, nothing charged")
    else:
        with open_ledger(root / "ledger.sqlite") as book:
            for entry in book.summary():
                s, b = entry["spent"], entry["budget"]
                click.echo(
                    f"ledger: dataset {entry['dataset']} spent epsilon={s['epsilon']:.3g} of "
                    f"{b['epsilon']:g} ({entry['composition']} composition: two epsilon = 1 "
                    "releases spend less than 2; docs/guide/ledger.md explains the numbers)"
                )
    click.echo(
        f"done; specs, ledger and outputs are in {root}/ (open the outputs with "
        "mvg_dask.api.open_release or xarray.open_zarr)"
    )


def _privacy_text(records: int) -> str:
    """Why the demo's deltas are what they are."""
    return (
        f"privacy: each release epsilon = 1, delta = {DEMO_DELTA:g}; the dataset's budget "
        f"epsilon = 4, delta = {DEMO_BUDGET_DELTA:g}. delta is the chance that the guarantee "
        f"fails outright, so it is kept far below one record's share 1/N = {1 / records:.2g}"
    )


def _iid_std(plan: Any) -> float:
    """The noise std of the plain Gaussian mechanism (i.i.d. noise on every entry) at the
    release's (epsilon, delta) and l2 sensitivity: the baseline the MVG noise is compared to."""
    from mvg_dask.privacy.calibration import analytic_gaussian_mu

    return float(plan.sensitivity / analytic_gaussian_mu(plan.epsilon, plan.delta))


def _accuracy_text(name: str, X: Any, Y: Any, plan: Any, important: list[int]) -> str:
    """A release's error beside the scale of the data, the error without noise (clipping only)
    and the expected error of i.i.d. Gaussian noise at the same privacy."""
    import numpy as np

    M, N = X.shape
    clipped = np.clip(X, 0.0, 1.0)  # the declared box
    sigma = _iid_std(plan)
    if name == "covariance":
        C = X @ X.T / N
        norm = np.linalg.norm(C)
        err = np.linalg.norm(Y - C) / norm
        exact = np.linalg.norm(clipped @ clipped.T / N - C) / norm
        return (
            f"    relative Frobenius error vs the non-private XX^T/N: {err:.2%} (entries of "
            f"XX^T/N are {C.min():.2g}..{C.max():.2g}); without noise (epsilon = inf, clipping "
            f"only): {exact:.2%}; i.i.d. Gaussian noise at the same privacy: {sigma * M / norm:.2%}"
            " expected"
        )
    rmse = np.sqrt(np.mean((Y - X) ** 2, axis=1))
    imp = np.zeros(M, dtype=bool)
    imp[important] = True
    exact_rmse = float(np.sqrt(np.mean((clipped - X) ** 2)))
    mean_err = np.mean(np.abs(Y.mean(axis=1) - X.mean(axis=1)))
    return (
        f"    RMSE per entry vs the non-private X (values in [0, 1], feature std "
        f"{X.std(axis=1).mean():.2g} on average): important features {rmse[imp].mean():.3g}, "
        f"others {rmse[~imp].mean():.3g} (directional noise); without noise: {exact_rmse:.2g}; "
        f"i.i.d. Gaussian noise at the same privacy: {sigma:.3g} everywhere. Feature means "
        f"from the release (averages over {N} records): mean abs error {mean_err:.3g}"
    )


def _synthetic_run(root: Path, client: Any, records: int, features: int, seed: int | None) -> None:
    import dask

    from mvg_dask import api
    from mvg_dask.data import synthetic, write_matrix

    t = time.perf_counter()
    chunk = max(1000, min(250_000, 2**25 // (8 * features)))
    store = root / "synthetic.zarr"
    with dask.config.set(scheduler=client.get):
        write_matrix(synthetic(records, features, record_chunk=chunk), store, record_chunk=chunk)
    click.echo(f"synthetic: {features} x {records} written in {time.perf_counter() - t:.1f} s")
    for query in ("covariance", "identity"):
        t = time.perf_counter()
        spec = _demo_spec(_write_spec(root, f"synthetic-{query}"), seed)
        res = api.release(spec, client=client, seed=seed)
        seconds = time.perf_counter() - t  # the demo measures throughput (curator side)
        click.echo(
            f"synthetic {query}: {res.output} in {seconds:.1f} s "
            f"({records * features / seconds / 1e6:.1f} M elements/s)"
        )
