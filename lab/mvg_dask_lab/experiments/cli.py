"""The ``mvg-dask experiments`` command: run the paper's experiments and write their outputs.

Register it on the main group with ``app.add_command(experiments)``.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Literal

import click

__all__ = ["experiments"]

_CHOICES = ("regression", "first-pc", "covariance", "all", "covariance-bench", "mgm")
_METAVAR = "{" + ",".join(_CHOICES) + "}"


@click.command(name="experiments")
@click.argument("which", type=click.Choice(_CHOICES), metavar=_METAVAR)
@click.option(
    "--trials",
    type=click.IntRange(min=2),
    default=None,
    help="Trials per (method, ε) setting; the paper uses 100 (the default), covariance-bench "
    "5 (its default).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/experiments"),
    show_default=True,
    help=(
        "Directory for the CSV, Markdown and PNG files of each experiment (created; relative "
        "to the working directory). The committed outputs are in notebooks/paper: pass "
        "--out notebooks/paper to regenerate them."
    ),
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the noise keys (reproducible, not private).",
)
@click.option(
    "--noise",
    type=click.Choice(("float", "lattice")),
    default="float",
    show_default=True,
    help="Noise of the MVG rows: float (the papers' path: noise matrices added to the query) "
    "or lattice (what a floating-point-safe lattice release publishes, docs/lattice.md). "
    "The baselines and the other non-MVG rows are the same under both.",
)
@click.option(
    "--quick",
    is_flag=True,
    default=False,
    help="mgm only: a reduced grid (CTG, 2 and 4 rounds, epsilon 10, 2 runs per point) that "
    "runs in the test suite.",
)
@click.option(
    "--baselines-from",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="covariance-bench only: take the baselines' rows from an earlier run's "
    "covariance_bench.csv of the same --seed and --trials (their errors are a deterministic "
    "function of the seed) and measure only the product's rows.",
)
@click.option(
    "--results-doc",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also (re)write the results document here, e.g. notebooks/results.md (needs 'all').",
)
def experiments(
    which: str,
    trials: int | None,
    out_dir: Path,
    seed: int,
    noise: Literal["float", "lattice"],
    quick: bool,
    baselines_from: Path | None,
    results_doc: Path | None,
) -> None:
    """Reproduce the MVG paper's experiments (Tables 3-5) with every calibration and baseline,
    or run the covariance benchmark against the modern DP covariance estimators.

    Runs WHICH experiment (or all three) over ε in {0.1, 0.3, 1, 3} at δ = 1/N and writes, per
    experiment, <name>.csv, <name>_tau_sweep.csv, <name>.md and <name>.png into --out.
    covariance-bench releases X^T X / N of synthetic spiked and full-rank records (d in
    {20, 100, 500}, N in {10^4, 10^6}, δ = 1e-10) with the product's release and with
    SeparateCov, AdaptiveCov, CoinPress, Amin et al. and Analyze Gauss, and writes
    covariance_bench.csv, .md and .png into --out. mgm runs the MGM paper's federated-learning
    experiments (horizontal and vertical, every mechanism at the same total epsilon and with
    the paper's per-element accounting) and writes mgm.csv, mgm.md and mgm.png into --out.
    """
    if quick and which != "mgm":
        raise click.UsageError("--quick goes with mgm")
    if which == "mgm":
        from mvg_dask_lab.experiments.mgm_cli import run_mgm_command

        run_mgm_command(trials=trials, out_dir=out_dir, quick=quick)
        return
    if which == "covariance-bench":
        _covariance_bench(trials or 5, out_dir, seed, results_doc, baselines_from)
        return
    if baselines_from is not None:
        raise click.UsageError("--baselines-from goes with covariance-bench")
    trials = trials or 100
    from mvg_dask_lab.experiments import EXPERIMENTS, run_experiment
    from mvg_dask_lab.experiments.document import write_results_document
    from mvg_dask_lab.experiments.report import write_experiment_files

    if results_doc is not None and which != "all":
        raise click.UsageError("--results-doc needs all three experiments: use 'all'")
    if out_dir.exists() and not out_dir.is_dir():
        raise click.UsageError(f"--out {out_dir} exists and is not a directory")
    names = list(EXPERIMENTS) if which == "all" else [which]
    start = time.perf_counter()
    results, files = [], {}
    for name in names:
        lattice = " (lattice noise)" if noise == "lattice" else ""
        click.echo(
            f"[{name}] loading data and running {trials} trials per setting{lattice}", err=True
        )
        try:
            result = run_experiment(
                EXPERIMENTS[name](noise=noise),
                trials=trials,
                seed=seed,
                progress=lambda line: click.echo(line, err=True),
            )
            written = write_experiment_files(result, out_dir)
        except OSError as exc:
            raise click.ClickException(f"cannot write the outputs: {exc}") from None
        click.echo(
            f"[{name}] finished in {result.elapsed:.1f} s: {written.csv}, {written.markdown}, "
            f"{written.plot}",
            err=True,
        )
        results.append(result)
        files[name] = written
    total = time.perf_counter() - start
    if results_doc is not None:
        command = " ".join(
            [
                "mvg-dask experiments",
                which,
                "--trials",
                str(trials),
                "--seed",
                str(seed),
                *(["--noise", noise] if noise != "float" else []),
                "--out",
                shlex.quote(out_dir.as_posix()),
                "--results-doc",
                shlex.quote(results_doc.as_posix()),
            ]
        )
        try:
            write_results_document(
                results, files, results_doc, command=command, total_seconds=total
            )
        except OSError as exc:
            raise click.ClickException(f"cannot write the results document: {exc}") from None
        click.echo(f"results document: {results_doc}", err=True)
    click.echo(f"all done in {total:.1f} s", err=True)


def _covariance_bench(
    trials: int, out_dir: Path, seed: int, results_doc: Path | None, baselines_from: Path | None
) -> None:
    from mvg_dask_lab.experiments.covariance_bench import (
        read_bench_rows,
        run_covariance_bench,
        write_bench_files,
    )

    if results_doc is not None:
        raise click.UsageError("--results-doc goes with the paper's experiments ('all')")
    if out_dir.exists() and not out_dir.is_dir():
        raise click.UsageError(f"--out {out_dir} exists and is not a directory")
    click.echo(f"[covariance-bench] {trials} trials per method and setting", err=True)
    reused = None
    if baselines_from is not None:
        try:
            reused = read_bench_rows(baselines_from)
        except (OSError, KeyError, ValueError) as exc:
            raise click.UsageError(f"--baselines-from {baselines_from}: {exc}") from None
    try:
        result = run_covariance_bench(
            trials=trials,
            seed=seed,
            progress=lambda line: click.echo(line, err=True),
            baseline_rows=reused,
            baselines_from=None if baselines_from is None else baselines_from.as_posix(),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    words = ["mvg-dask experiments covariance-bench --trials", str(trials), "--seed", str(seed)]
    if baselines_from is not None:
        words += ["--baselines-from", shlex.quote(baselines_from.as_posix())]
    command = " ".join([*words, "--out", shlex.quote(out_dir.as_posix())])
    try:
        files = write_bench_files(result, out_dir, command=command)
    except OSError as exc:
        raise click.ClickException(f"cannot write the outputs: {exc}") from None
    click.echo(
        f"[covariance-bench] finished in {result.elapsed:.1f} s: {files.csv}, {files.markdown}, "
        f"{files.plot}",
        err=True,
    )
