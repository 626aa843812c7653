"""The ``identity`` stage: every record, clipped, with noise, chunk by chunk."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from mvg_dask.engine.cluster import Progress, gather_with_progress, stop_tasks
from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.lattice import RecordLattice
from mvg_dask.engine.records import ZarrMatrix
from mvg_dask.engine.stages.context import RunContext, clipper_for, mark_aborted, source_of
from mvg_dask.engine.tasks.identity import identity_task
from mvg_dask.errors import ChargedFailure, ReleaseError
from mvg_dask.plan.release_plan import ReleasePlan


def _write_skeleton(ctx: RunContext, rplan: ReleasePlan) -> None:
    """The output's skeleton, from the input's metadata (kept when a resume finds it)."""
    import xarray as xr

    info, target = rplan.input, ctx.target
    if not (ctx.resume and target.has_skeleton()):
        variable = xr.open_zarr(
            info.store, consolidated=False, storage_options=info.storage_options, chunks={}
        )[info.variable]
        target.write_identity_skeleton(rplan, variable)
    crash_point("skeleton")


def run_identity(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``identity`` stage: read, check, clip, add noise and write every chunk (skipping
    written ones).

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
    plan = rplan.noise_plan()
    info, target, client = rplan.input, ctx.target, ctx.client
    _write_skeleton(ctx, rplan)
    sink = ZarrMatrix(target.write_store, info.variable, info.records_first, target.storage_options)
    # a diagonal covariance: the tasks need sqrt(v) only (no m x m matrix is shipped)
    factor: Any = plan.covariance.sampler_factor()
    lattice: Any = RecordLattice.for_plan(plan) if plan.lattice is not None else None
    ranges = info.task_ranges()
    if len(ranges) > 1:
        factor = client.scatter(factor, broadcast=True)
        if lattice is not None:
            lattice = client.scatter(lattice, broadcast=True)
    ctx.read_started = True
    # one scheduler message for the whole pass, the tasks in record order (as the Gram pass)
    futures = client.map(
        identity_task,
        [a for a, _ in ranges],
        [b for _, b in ranges],
        source=source_of(rplan),
        sink=sink,
        clipper=clipper_for(rplan),
        noise_key=ctx.key.derive("release"),
        factor=factor,
        tile=rplan.tile_records,
        n_total=info.records,
        diagonal=plan.covariance.diagonal,
        step=info.record_chunk,
        lattice=lattice,
        pure=False,
    )
    # the noise matrices (a function of the plan) are written while the tasks run
    try:
        target.write_noise_matrices(plan)
    except BaseException:
        stop_tasks(client, futures, functools.partial(mark_aborted, target))
        raise
    results = gather_with_progress(
        client,
        futures,
        Progress(
            len(futures), "release", enabled=ctx.progress, private_total=ctx.private_total(rplan)
        ),
        on_result=functools.partial(crash_point, "chunk"),
        on_failure=functools.partial(mark_aborted, target),
    )
    if any(r.skipped for r in results):  # another run of this release marked it failed
        raise ChargedFailure(
            f"release {rplan.release_id!r}: tasks found the release marked as failed by "
            "another run of it; let that run end, then re-run the same release id to resume"
        )
    counts = np.sum([r.unwrap() for r in results], axis=0)
    if int(counts[1]) != info.records:  # pragma: no cover - a bookkeeping invariant
        raise ReleaseError(f"wrote {counts[1]} records, expected {info.records}")
    ctx.clipped += int(counts[0])
    return rplan
