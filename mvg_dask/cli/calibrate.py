"""``mvg-dask calibrate``: a noise plan from metadata only (no data is read, no dask)."""

from __future__ import annotations

from typing import Any

import click

from mvg_dask.privacy.calibration import ALGORITHMS
from mvg_dask.privacy.registry import CALIBRATIONS


def _parse_indices(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(
            f"takes comma-separated integers, got {text!r}", param_hint="--important"
        ) from None


@click.command()
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
    type=click.Choice(ALGORITHMS),
    required=True,
    help="Alg. 1 (Psi = I) or Alg. 2 (Psi = Sigma).",
)
@click.option(
    "--calibration",
    type=click.Choice(CALIBRATIONS),
    required=True,
    help="Calibration (theorem); see mvg_dask.privacy.registry.",
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
    """Calibrate an MVG noise plan from metadata only (no data is read).

    Prints two stds: along the directions (the square root of each row variance of Sigma) and
    of each released entry, as the dry run's noise line (for equi-modal noise the entry's std
    is the row variance itself on the diagonal).
    """
    from mvg_dask.plan import (
        Allocation,
        BoxDomain,
        DeclaredBoundError,
        L2BallDomain,
        build_noise_plan,
    )
    from mvg_dask.plan.queries import make_query

    if (bounds is None) == (l2_norm is None):
        raise click.UsageError("give exactly one record domain: --bounds LO HI or --l2-norm C")
    important_idx = _parse_indices(important)
    if allocation == "binary" and not important_idx:
        raise click.UsageError("--allocation binary needs --important i,j,...")
    if allocation != "binary" and important_idx:
        raise click.UsageError("--important is only used with --allocation binary")
    try:
        domain = (
            BoxDomain.declared(bounds[0], bounds[1], features)
            if bounds is not None
            else L2BallDomain.declared(float(l2_norm), features)  # type: ignore[arg-type]
        )
    except ValueError as exc:  # named by this command's option, not the spec field
        option = "--bounds" if bounds is not None else "--l2-norm"
        raise click.UsageError(f"{option}: {str(exc).removeprefix('l2_norm: ')}") from None
    try:
        matrix_query = make_query(
            query, features=features, records=records, sensitivity=sensitivity, gamma=gamma
        )
        plan = build_noise_plan(
            matrix_query,
            domain,
            epsilon=epsilon,
            delta=delta,
            algorithm=algorithm,  # type: ignore[arg-type]
            calibration=calibration,  # type: ignore[arg-type]
            allocation=Allocation(
                strategy=allocation,  # type: ignore[arg-type]
                important=important_idx,
                share=share if allocation == "binary" else None,
            ),
            neighbours=neighbours,  # type: ignore[arg-type]
        )
    except DeclaredBoundError as exc:  # named by this command's option, not the spec field
        raise click.UsageError(f"--{str(exc).removeprefix('mechanism.')}") from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(plan.to_json() if as_json else f"{plan.summary()}\n{_entry_std_line(plan)}")


def _entry_std_line(plan: Any) -> str:
    """The std of each released entry (the dry run's noise line), beside the summary's std along
    the directions: ``sqrt(v_i)`` per direction, against ``sqrt(v_i)`` per entry for unimodal
    noise, ``v_i`` on the diagonal of equi-modal noise and ``sqrt(r v_i v_j)`` off it."""
    diag, off = plan.released_std_ranges()
    text = f"{diag[0]:.4g} .. {diag[1]:.4g}"
    if off is not None and (off[0], off[1]) != (diag[0], diag[1]):
        text += f" on the diagonal, {off[0]:.4g} .. {off[1]:.4g} off it"
    return f"  noise std of each released entry: {text}"
