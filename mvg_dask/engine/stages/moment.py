"""The ``moment`` stage: the augmented second moment ``Z Z^T / N`` of ``z = [x; 1]``, privatized
on the client, written with the mean and the covariance around it (post-processing)."""

from __future__ import annotations

from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.lattice import square_release as lattice_square_release
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.covariance import covariance_noise
from mvg_dask.engine.stages.gram import wait_for_gram
from mvg_dask.plan.queries.moment import centered_from_moment
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_format import COVARIANCE, MEAN, MOMENT


def run_moment(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``moment`` stage: the skeleton and the float noise (while a Gram pass without DP-PCA
    still runs), then ``Z Z^T / N`` plus noise, and the ``mean`` and ``covariance`` computed from
    the noisy moment (:func:`~mvg_dask.plan.queries.moment.centered_from_moment`), written.

    Parameters
    ----------
    ctx : RunContext
        The run (after its ``gram`` stage, whose pass sums the augmented records).
    rplan : ReleasePlan
        The resolved plan of a centered-covariance or regression release.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    ctx.target.write_matrix_skeleton(rplan, MOMENT)
    crash_point("skeleton")
    release_key = ctx.key.derive("release")
    noise = (
        None if rplan.noise_kind == "lattice" else covariance_noise(rplan.noise_plan(), release_key)
    )
    query = wait_for_gram(ctx, rplan) / rplan.query.records
    if noise is None:  # lattice noise: the released moment is exactly a lattice point
        noisy = lattice_square_release(query, rplan.noise_plan(), release_key)
    else:
        noisy = query + noise
    mean, covariance = centered_from_moment(noisy)
    ctx.target.write_matrix_values({MOMENT: noisy, MEAN: mean, COVARIANCE: covariance})
    return rplan
