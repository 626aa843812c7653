"""``mvg-dask experiments mgm [--quick]``: the MGM paper's learning experiments."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

__all__ = ["run_mgm_command"]


def run_mgm_command(*, trials: int | None, out_dir: Path, quick: bool) -> None:
    """Run the experiments and write ``mgm.csv``, ``mgm.md`` and ``mgm.png`` into ``out_dir``.

    Parameters
    ----------
    trials : int or None
        Seeded runs per point (default 5; ``--quick``: 2).
    out_dir : Path
        Output directory (created).
    quick : bool
        The reduced grid of the test suite.
    """
    from mvg_dask_lab.experiments.mgm import EPSILONS, default_settings, run_mgm
    from mvg_dask_lab.experiments.mgm_report import write_mgm_files

    if out_dir.exists() and not out_dir.is_dir():
        raise click.UsageError(f"--out {out_dir} exists and is not a directory")
    seeds = trials or (2 if quick else 5)
    epsilons = (10.0,) if quick else EPSILONS
    click.echo(f"[mgm] {seeds} seeded runs per point, epsilon {list(epsilons)}", err=True)
    result = run_mgm(
        default_settings(quick=quick),
        epsilons=epsilons,
        seeds=seeds,
        progress=lambda line: click.echo(line, err=True),
    )
    result.quick = quick
    command = " ".join(
        [
            "mvg-dask experiments mgm",
            *(["--quick"] if quick else []),
            *(["--trials", str(trials)] if trials else []),
            "--out",
            shlex.quote(out_dir.as_posix()),
        ]
    )
    try:
        files = write_mgm_files(result, out_dir, command=command)
    except OSError as exc:
        raise click.ClickException(f"cannot write the outputs: {exc}") from None
    click.echo(
        f"[mgm] finished in {result.elapsed:.1f} s: {files.csv}, {files.markdown}, {files.plot}",
        err=True,
    )
