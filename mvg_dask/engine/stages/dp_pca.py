"""The ``dp-pca`` and ``dp-pca-panels`` stages: the directions of the noise, chosen privately
from the data (Analyze Gauss)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mvg_dask.engine.cluster import Progress, gather_with_progress
from mvg_dask.engine.lattice import StandardSquareLattice
from mvg_dask.engine.lattice import gram_step as lattice_gram_step
from mvg_dask.engine.stages.context import RunContext, clipper_for, panel_reads, source_of
from mvg_dask.engine.stages.gram import wait_for_gram
from mvg_dask.engine.tasks.panels import PanelNoise, noisy_gram_panel_task, panel_product_task
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan import dp_pca, gram_sensitivity
from mvg_dask.plan.directions import directions_from_noisy_gram, top_k_directions
from mvg_dask.plan.input_metadata import PANEL_RECORDS
from mvg_dask.plan.lattice import panel_inner_groups
from mvg_dask.plan.release_plan import ReleasePlan

#: The scratch group of a wide release's DP-PCA (its noisy Gram matrix).
DP_PCA_SCRATCH = "dp-pca"


def dp_pca_directions(
    rplan: ReleasePlan, key: NoiseKey, gram: np.ndarray, normaliser: float
) -> ReleasePlan:
    """The DP-PCA step on a Gram matrix: the plan with its directions filled in.

    Parameters
    ----------
    rplan : ReleasePlan
        A plan whose directions DP-PCA chooses.
    key : NoiseKey
        The release key (the step's noise comes from its ``dp-pca`` sub-key).
    gram : ndarray
        ``X X^T`` of the clipped records.
    normaliser : float
        The record count the Gram matrix is divided by (public, or the noisy count).

    Returns
    -------
    ReleasePlan
        The resolved plan.
    """
    step = rplan.dp_pca
    assert step is not None and rplan.budgets.step_mu is not None
    step_key = key.derive("dp-pca")
    if step.lattice is not None:
        sigma = step.noise_std(
            rplan.query.record_domain(rplan.domain), rplan.neighbours, rplan.budgets.step_mu
        )
        noisy = lattice_gram_step(gram, step.lattice, sigma, step_key)
        return rplan.resolve(directions_from_noisy_gram(noisy, records=normaliser, k=step.k))
    directions = dp_pca(
        gram,
        records=normaliser,
        k=step.k,
        mu=rplan.budgets.step_mu,
        sensitivity=gram_sensitivity(rplan.query.record_domain(rplan.domain), rplan.neighbours),  # type: ignore[arg-type]
        key=step_key,
    )
    return rplan.resolve(directions)


def run_dp_pca(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``dp-pca`` stage: waits for the Gram pass, returns the resolved plan
    (:func:`dp_pca_directions`)."""
    return dp_pca_directions(rplan, ctx.key, wait_for_gram(ctx, rplan), ctx.normaliser(rplan))


def _scratch_product(
    ctx: RunContext, scratch: str, panels: list[tuple[int, int]]
) -> Callable[[np.ndarray], np.ndarray]:
    """``Q -> G Q`` for the noisy Gram matrix ``G`` in the scratch array, panel by panel on the
    workers."""
    client, target = ctx.client, ctx.target

    def apply(Q: np.ndarray) -> np.ndarray:
        q = client.scatter(Q, broadcast=True)
        parts = [
            client.submit(
                panel_product_task,
                rows,
                sink=scratch,
                storage_options=target.storage_options,
                Q=q,
                pure=False,
            )
            for rows in panels
        ]
        return np.vstack(client.gather(parts))

    return apply


def run_dp_pca_panels(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``dp-pca-panels`` stage: DP-PCA of a wide release, with no ``m x m`` matrix in memory.

    The workers write the noisy Gram matrix (Analyze Gauss, its noise from the grid of the
    step's key) panel by panel to a scratch array, then a subspace iteration finds its top ``k``
    eigenvectors (:func:`~mvg_dask.plan.directions.top_k_directions`, post-processing) and the
    plan takes them as low-rank directions. The scratch array is removed. A resumed run whose
    saved plan is already resolved skips the stage.

    Parameters
    ----------
    ctx : RunContext
        The run.
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    ReleasePlan
        The resolved plan.
    """
    if rplan.is_resolved:
        return rplan
    target, client = ctx.target, ctx.client
    step = rplan.dp_pca
    assert step is not None and rplan.budgets.step_mu is not None
    m, block = rplan.input.features, rplan.matrix_chunk
    assert block is not None
    sigma = step.noise_std(
        rplan.query.record_domain(rplan.domain), rplan.neighbours, rplan.budgets.step_mu
    )
    key = ctx.key.derive("dp-pca")
    scratch = target.scratch_matrix(DP_PCA_SCRATCH, m, block)
    # sqrt(v) S sqrt(v) with v = sigma: sigma S, the whole-matrix step's noise
    noise = PanelNoise(key, np.full(m, sigma), "symmetric", 1.0)
    lattice = inner = None
    if step.lattice is not None:  # the step on the lattice, as lattice_gram_step
        assert rplan.lattice_context is not None
        lattice = StandardSquareLattice(
            key, np.full(m, sigma), "symmetric", 1.0, step.lattice.log2_grid, step.lattice.scale
        )
        inner = panel_inner_groups(rplan.lattice_context.records, PANEL_RECORDS)
    panels = [(r0, min(r0 + block, m)) for r0 in range(0, m, block)]
    source, clipper, reads = source_of(rplan), clipper_for(rplan), panel_reads(rplan)
    ctx.read_started = True
    futures = [
        client.submit(
            noisy_gram_panel_task,
            rows,
            source=source,
            sink=scratch,
            storage_options=target.storage_options,
            clipper=clipper,
            reads=reads,
            noise=noise,
            block=block,
            lattice=lattice,
            inner=inner,
            pure=False,
        )
        for rows in panels
    ]
    results = gather_with_progress(
        client, futures, Progress(len(futures), "dp-pca", enabled=ctx.progress, private_total=False)
    )
    ctx.clipped += int(np.sum([r.unwrap() for r in results], axis=0)[0])

    directions = top_k_directions(
        _scratch_product(ctx, scratch, panels),
        m,
        step.k,
        start=key.derive("start"),
        records=ctx.normaliser(rplan),
    )
    target.remove_scratch(DP_PCA_SCRATCH)
    return rplan.resolve(directions)
