"""The ``noisy-count`` stage: the record count with Gaussian noise."""

from __future__ import annotations

from mvg_dask.engine.lattice import noisy_count as lattice_noisy_count
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.release_plan import ReleasePlan


def draw_noisy_count(rplan: ReleasePlan, key: NoiseKey) -> float:
    """The record count with Gaussian noise (sensitivity 1 under add-remove), charged in the
    release's own accounting (its share of the budget: ``budgets.count_mu``).

    Parameters
    ----------
    rplan : ReleasePlan
        A plan that releases a noisy count.
    key : NoiseKey
        The release key (the count's noise comes from its ``count`` sub-key).

    Returns
    -------
    float
        The noisy count.
    """
    count_mu = rplan.budgets.count_mu
    assert count_mu is not None
    if rplan.noise_kind == "lattice":
        return lattice_noisy_count(rplan.input.records, count_mu, key.derive("count"))
    z = float(key.derive("count").tile_normals(0, (1,))[0])
    return rplan.input.records + z / count_mu


def run_noisy_count(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``noisy-count`` stage: :func:`draw_noisy_count` into ``ctx.count`` (reads no chunk)."""
    ctx.count = draw_noisy_count(rplan, ctx.key)
    return rplan
