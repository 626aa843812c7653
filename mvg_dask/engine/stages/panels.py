"""The ``covariance-panels`` and ``low-rank-lattice-panels`` stages: a wide covariance, row
panel by row panel on the workers (``matrix_chunk``), with no ``m x m`` matrix anywhere."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from mvg_dask.engine.cluster import Progress, gather_with_progress
from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.lattice import LowRankSquareLattice, StandardSquareLattice
from mvg_dask.engine.stages.context import (
    RunContext,
    clipper_for,
    mark_aborted,
    panel_reads,
    source_of,
)
from mvg_dask.engine.tasks.low_rank import (
    low_rank_lattice_task,
    low_rank_products_task,
    low_rank_projection_task,
    low_rank_publish_task,
    projection_task,
)
from mvg_dask.engine.tasks.panels import PanelNoise, covariance_panel_task
from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, feature_blocks
from mvg_dask.plan import NoisePlan
from mvg_dask.plan.covariance import Dense, LowRank
from mvg_dask.plan.input_metadata import PANEL_RECORDS
from mvg_dask.plan.lattice import panel_inner_groups
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_format import COVARIANCE, GRAM, RECORD_COUNT

#: the lattice values of a wide low-rank lattice release, between its passes
LOW_RANK_SCRATCH = "low-rank-lattice"


def grid_sum(parts: list[np.ndarray]) -> np.ndarray:
    """The sum of per-grid-block parts (each task's stacked along axis 0), added one by one in
    grid order: the same sequence of additions whatever the panels."""
    stacked = np.concatenate(parts, axis=0)
    total = stacked[0].copy()
    for part in stacked[1:]:
        total += part
    return total


def _write_skeleton(ctx: RunContext, rplan: ReleasePlan) -> None:
    """The blocked output's skeleton (kept when a resume finds it)."""
    count = ctx.count
    names = (COVARIANCE,) if count is None else (COVARIANCE, GRAM)
    if not (ctx.resume and ctx.target.has_skeleton()):
        scalars = {} if count is None else {RECORD_COUNT: count}
        ctx.target.write_blocked_skeleton(rplan, names, scalars)
    crash_point("skeleton")


def _panels(rplan: ReleasePlan) -> list[tuple[int, int]]:
    m, block = rplan.input.features, rplan.matrix_chunk
    assert block is not None
    return [(r0, min(r0 + block, m)) for r0 in range(0, m, block)]


def run_covariance_panels(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``covariance-panels`` stage: each task reads the input, computes one row panel of
    ``X X^T``, adds the noise of its blocks from the noise grid and writes them. With low-rank
    directions a first pass computes the noise's ``m x k`` projection (:func:`compute_panel_noise`).

    Parameters
    ----------
    ctx : RunContext
        The run.
    rplan : ReleasePlan
        The resolved plan.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    target = ctx.target
    plan = rplan.noise_plan()
    block = rplan.matrix_chunk
    assert block is not None and not isinstance(plan.covariance, Dense)
    _write_skeleton(ctx, rplan)
    noise = compute_panel_noise(ctx, plan, block)
    lattice = inner = None
    if plan.lattice is not None:
        assert rplan.lattice_context is not None
        lattice = StandardSquareLattice.for_plan(plan, ctx.key.derive("release"))
        inner = panel_inner_groups(rplan.lattice_context.records, PANEL_RECORDS)
    source, clipper, reads = source_of(rplan), clipper_for(rplan), panel_reads(rplan)
    ctx.read_started = True
    futures = [
        ctx.client.submit(
            covariance_panel_task,
            rows,
            source=source,
            sink=target.write_store,
            storage_options=target.storage_options,
            clipper=clipper,
            reads=reads,
            normaliser=float(rplan.query.records),
            count=ctx.count,
            noise=noise,
            block=block,
            lattice=lattice,
            inner=inner,
            pure=False,
        )
        for rows in _panels(rplan)
    ]
    results = gather_with_progress(
        ctx.client,
        futures,
        Progress(len(futures), "covariance", enabled=ctx.progress, private_total=False),
        on_result=functools.partial(crash_point, "chunk"),
        on_failure=functools.partial(mark_aborted, target),
    )
    ctx.clipped += int(np.sum([r.unwrap() for r in results], axis=0)[0])
    return rplan


def compute_panel_noise(ctx: RunContext, plan: NoisePlan, block: int) -> PanelNoise:
    """The panel tasks' noise: the diagonal factor, or for low-rank directions the factor
    ``Sigma^(1/2)`` with the first pass's projection (computed on the workers, grid block by
    grid block: the same bytes whatever ``block``).

    Parameters
    ----------
    ctx : RunContext
        The run.
    plan : NoisePlan
        The resolved noise plan.
    block : int
        Features per panel.

    Returns
    -------
    PanelNoise
        What every panel task needs of the noise.
    """
    key = ctx.key.derive("release")
    if not isinstance(plan.covariance, LowRank):
        return PanelNoise(key, plan.row_variances, plan.algorithm, plan.symmetric_ratio)
    U = plan.directions.matrix
    nb = len(feature_blocks(U.shape[0]))
    per = max(1, block // NOISE_TILE_FEATURES)
    u = ctx.client.scatter(U, broadcast=True)
    futures = [
        ctx.client.submit(
            projection_task,
            (i, min(i + per, nb)),
            noise_key=key,
            U=u,
            algorithm=plan.algorithm,
            ratio=plan.symmetric_ratio,
            pure=False,
        )
        for i in range(0, nb, per)
    ]
    projection = np.vstack(ctx.client.gather(futures))
    core = None
    if plan.algorithm != "unimodal":
        K = U.T @ projection
        core = (K + K.T) / 2.0
    return PanelNoise(
        key,
        plan.row_variances,
        plan.algorithm,
        plan.symmetric_ratio,
        basis=U,
        projection=projection,
        core=core,
    )


def _pass_runner(ctx: RunContext, rplan: ReleasePlan) -> Callable[..., list[Any]]:
    """``run(fn, name, **kw)``: one task per panel, gathered with progress."""
    client, panels = ctx.client, _panels(rplan)

    def run(fn: Any, name: str, **kw: Any) -> list[Any]:
        futures = [client.submit(fn, rows, **kw, pure=False) for rows in panels]
        return gather_with_progress(
            client,
            futures,
            Progress(len(futures), name, enabled=ctx.progress, private_total=False),
            # the last pass writes the output: a crash there is the one a rerun resumes
            on_result=functools.partial(crash_point, "chunk") if name == "covariance" else None,
            on_failure=functools.partial(mark_aborted, ctx.target),
        )

    return run


def run_low_rank_lattice_panels(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``low-rank-lattice-panels`` stage: a wide lattice release with low-rank directions,
    in four passes over row panels (:class:`~mvg_dask.engine.lattice.LowRankSquareLattice`).

    ``P = U^T f`` (reads the data), the lattice values ``T = 2^k t`` of the whitened query to a
    scratch array (reads the data again), ``R = U^T T`` and ``T U`` (the scratch), then the
    published ``A T A^T`` with the noise description. Every product is formed grid block by
    grid block and summed in grid order, so the bytes do not depend on ``matrix_chunk``.

    Parameters
    ----------
    ctx : RunContext
        The run.
    rplan : ReleasePlan
        The resolved plan.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    client, target = ctx.client, ctx.target
    plan = rplan.noise_plan()
    assert rplan.lattice_context is not None and rplan.matrix_chunk is not None
    _write_skeleton(ctx, rplan)
    m, block = rplan.input.features, rplan.matrix_chunk
    lattice = LowRankSquareLattice.for_plan(plan, ctx.key.derive("release"))
    # the noise description (Sigma's blocks) needs no projection of float noise
    noise = PanelNoise(
        lattice.key, plan.row_variances, plan.algorithm, plan.symmetric_ratio, basis=lattice.basis
    )
    common = {
        "source": source_of(rplan),
        "clipper": clipper_for(rplan),
        "reads": panel_reads(rplan),
        "normaliser": float(rplan.query.records),
        "lattice": client.scatter(lattice, broadcast=True),
        "inner": panel_inner_groups(rplan.lattice_context.records, PANEL_RECORDS),
    }
    ctx.read_started = True
    run = _pass_runner(ctx, rplan)
    parts = run(low_rank_projection_task, "projection", **common)
    P = grid_sum([p.unwrap() for p in parts])
    scratch = target.scratch_matrix(LOW_RANK_SCRATCH, m, block)
    options = {"sink": scratch, "storage_options": target.storage_options}
    P_all = client.scatter(P, broadcast=True)
    results = run(low_rank_lattice_task, "lattice", P=P_all, **options, **common)
    ctx.clipped += int(np.sum([r.unwrap() for r in results], axis=0)[0])
    basis = client.scatter(lattice.basis, broadcast=True)
    products = run(low_rank_products_task, "products", basis=basis, **options)
    R = grid_sum([r for r, _ in products])
    TU = np.vstack([tu for _, tu in products])
    run(
        low_rank_publish_task,
        "covariance",
        scratch=scratch,
        sink=target.write_store,
        storage_options=target.storage_options,
        lattice=common["lattice"],
        R=client.scatter(R, broadcast=True),
        TU=client.scatter(TU, broadcast=True),
        S=R @ lattice.basis,
        count=ctx.count,
        noise=noise,
    )
    target.remove_scratch(LOW_RANK_SCRATCH)
    return rplan
