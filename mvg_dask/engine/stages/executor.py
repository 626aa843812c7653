"""The executor: a plan's stages, in order, one function each."""

from __future__ import annotations

from collections.abc import Callable

from mvg_dask.engine.metadata import check_chunks_present
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.count import run_noisy_count
from mvg_dask.engine.stages.covariance import run_covariance
from mvg_dask.engine.stages.cross import run_cross_covariance
from mvg_dask.engine.stages.dp_pca import run_dp_pca, run_dp_pca_panels
from mvg_dask.engine.stages.gram import run_gram
from mvg_dask.engine.stages.identity import run_identity
from mvg_dask.engine.stages.mean_first import run_covariance_about_mean, run_mean
from mvg_dask.engine.stages.moment import run_moment
from mvg_dask.engine.stages.panels import run_covariance_panels, run_low_rank_lattice_panels
from mvg_dask.engine.stages.query import run_query
from mvg_dask.plan import stages as names
from mvg_dask.plan.release_plan import ReleasePlan

#: A stage: it runs on the run's context and returns the plan (DP-PCA resolves it).
Stage = Callable[[RunContext, ReleasePlan], ReleasePlan]

#: the function of each stage name (:mod:`mvg_dask.plan.stages`)
STAGE_FUNCTIONS: dict[str, Stage] = {
    names.NOISY_COUNT: run_noisy_count,
    names.GRAM: run_gram,
    names.DP_PCA: run_dp_pca,
    names.DP_PCA_PANELS: run_dp_pca_panels,
    names.IDENTITY: run_identity,
    names.COVARIANCE: run_covariance,
    names.MOMENT: run_moment,
    names.MEAN: run_mean,
    names.COVARIANCE_ABOUT_MEAN: run_covariance_about_mean,
    names.CROSS_COVARIANCE: run_cross_covariance,
    names.QUERY: run_query,
    names.COVARIANCE_PANELS: run_covariance_panels,
    names.LOW_RANK_LATTICE_PANELS: run_low_rank_lattice_panels,
}


def run_stages(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """Run every stage of ``rplan.stages`` in order (after checking that the input's chunks are
    all present, from metadata).

    Parameters
    ----------
    ctx : RunContext
        The run: it records whether the input was read and what was clipped.
    rplan : ReleasePlan
        The plan (pending until a DP-PCA stage resolves it).

    Returns
    -------
    ReleasePlan
        The resolved plan.
    """
    inp = rplan.input
    check_chunks_present(
        inp.store, inp.variable, inp.storage_options, fills_missing=rplan.missing_fill is not None
    )
    for name in rplan.stages:
        rplan = STAGE_FUNCTIONS[name](ctx, rplan)
    return rplan
