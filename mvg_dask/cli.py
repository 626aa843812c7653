"""The ``mvg-dask`` command line (click).

Every mistake in the arguments ends with a one-line ``mvg-dask: error: ...`` on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import sys

import click

from mvg_dask._version import __version__

CALIBRATION_NAMES = ("exact", "mvg-thm2", "mvg-thm3", "mgm", "mgm-udn", "mgm-idn")


@click.group(
    name="mvg-dask",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(
    __version__, "--version", prog_name="mvg-dask", message="%(prog)s %(version)s"
)
def app() -> None:
    """Differentially private matrix-valued releases with the MVG mechanism."""


def _parse_indices(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(
            f"takes comma-separated integers, got {text!r}", param_hint="--important"
        ) from None


@app.command()
@click.option(
    "--query",
    type=click.Choice(["identity", "covariance"]),
    required=True,
    help="Query: identity X or covariance XX^T/N.",
)
@click.option("--features", type=click.IntRange(min=1), required=True, help="M, features.")
@click.option("--records", type=click.IntRange(min=1), required=True, help="N, records.")
@click.option("--epsilon", type=float, required=True, help="Privacy parameter epsilon > 0.")
@click.option("--delta", type=float, required=True, help="Privacy parameter delta in (0, 1).")
@click.option(
    "--algorithm",
    type=click.Choice(["unimodal", "equi-modal"]),
    required=True,
    help="Alg. 1 (Psi = I) or Alg. 2 (Psi = Sigma).",
)
@click.option(
    "--calibration",
    type=click.Choice(CALIBRATION_NAMES),
    required=True,
    help="Calibration theorem.",
)
@click.option(
    "--bounds",
    type=(float, float),
    default=None,
    metavar="LO HI",
    help="Record box: every feature in [LO, HI].",
)
@click.option("--l2-norm", type=float, default=None, help="Record L2-ball radius C.")
@click.option(
    "--sensitivity",
    type=float,
    default=None,
    help="Declared L2 sensitivity s2 (overrides the domain's).",
)
@click.option(
    "--gamma", type=float, default=None, help="Declared sup ||f(X)||_F (overrides the domain's)."
)
@click.option(
    "--allocation",
    type=click.Choice(["uniform", "binary"]),
    default="uniform",
    show_default=True,
    help="Precision allocation.",
)
@click.option("--important", default=None, help="Important directions for binary, e.g. 0,3.")
@click.option(
    "--share",
    type=float,
    default=0.8,
    show_default=True,
    help="Binary share tau of the important directions.",
)
@click.option(
    "--neighbours",
    type=click.Choice(["replace-one", "add-remove"]),
    default="replace-one",
    show_default=True,
    help="Neighbouring relation.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
def calibrate(
    query: str,
    features: int,
    records: int,
    epsilon: float,
    delta: float,
    algorithm: str,
    calibration: str,
    bounds: tuple[float, float] | None,
    l2_norm: float | None,
    sensitivity: float | None,
    gamma: float | None,
    allocation: str,
    important: str | None,
    share: float,
    neighbours: str,
    as_json: bool,
) -> None:
    """Calibrate an MVG noise plan from metadata only (no data is read)."""
    from mvg_dask.plan import AllocationSpec, BoxDomain, L2BallDomain, QuerySpec, build_noise_plan

    if (bounds is None) == (l2_norm is None):
        raise click.UsageError("give exactly one record domain: --bounds LO HI or --l2-norm C")
    important_idx = _parse_indices(important)
    if allocation == "binary" and not important_idx:
        raise click.UsageError("--allocation binary needs --important i,j,...")
    if allocation != "binary" and important_idx:
        raise click.UsageError("--important is only used with --allocation binary")
    try:
        domain = (
            BoxDomain.create(bounds[0], bounds[1], features)
            if bounds is not None
            else L2BallDomain(float(l2_norm), features)  # type: ignore[arg-type]
        )
        spec = QuerySpec(
            kind=query,  # type: ignore[arg-type]
            features=features,
            records=records,
            sensitivity=sensitivity,
            gamma=gamma,
        )
        plan = build_noise_plan(
            spec,
            domain,
            epsilon=epsilon,
            delta=delta,
            algorithm=algorithm,  # type: ignore[arg-type]
            calibration=calibration,  # type: ignore[arg-type]
            allocation=AllocationSpec(
                strategy=allocation,  # type: ignore[arg-type]
                important=important_idx,
                share=share if allocation == "binary" else None,
            ),
            neighbours=neighbours,  # type: ignore[arg-type]
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(plan.to_json() if as_json else plan.summary())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mvg-dask`` script.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit code: 0 on success, 2 for invalid input, 1 for a failed run.
    """
    from mvg_dask import cli_commands  # noqa: F401  (registers the other subcommands)

    try:
        result = app.main(
            args=argv if argv is not None else sys.argv[1:],
            prog_name="mvg-dask",
            standalone_mode=False,
        )
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        message = " ".join(exc.format_message().split())
        click.echo(f"mvg-dask: error: {message}", err=True)
        return exc.exit_code if exc.exit_code else 2
    except click.exceptions.Abort:
        click.echo("mvg-dask: aborted", err=True)
        return 130
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":  # pragma: no cover
    from mvg_dask.cli import main as _package_main  # the module the subcommands register on

    sys.exit(_package_main())
