"""The ``gram`` stage: ``X X^T`` of the clipped records, one pass, a fixed-order sum."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from distributed import Client, Future

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.cluster import Progress, gather_with_progress
from mvg_dask.engine.stages.context import (
    GramPass,
    RunContext,
    clipper_for,
    gram_source_of,
    labels_of,
)
from mvg_dask.engine.tasks.gram import add_grams, combine_grams, gram_task
from mvg_dask.plan.input_metadata import TREE_FAN_IN
from mvg_dask.plan.release_plan import ReleasePlan

#: Partial Gram matrices up to this many bytes in all are summed on the client.
CLIENT_REDUCE_BYTES = 64 * 2**20


def run_gram(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``gram`` stage: submit the Gram pass; the stages after it wait for its sum
    (:func:`wait_for_gram`), so the output's skeleton can be written while it runs.

    Parameters
    ----------
    ctx : RunContext
        The run.
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    ctx.gram_pass = submit_gram(ctx, rplan)
    return rplan


def wait_for_gram(ctx: RunContext, rplan: ReleasePlan) -> np.ndarray:
    """The sum of the run's Gram pass (waits for it once; raises the first data error met, in
    record order)."""
    if ctx.gram is None:
        assert ctx.gram_pass is not None, "the gram stage runs first"
        ctx.gram = finish_gram(ctx, rplan, ctx.gram_pass)
    return ctx.gram


def submit_gram(ctx: RunContext, rplan: ReleasePlan, clipper: Clipper | None = None) -> GramPass:
    """Start the Gram pass, ``X X^T`` of the clipped records (:func:`finish_gram` waits for
    it and returns the sum): per-task partials, then a fixed-order tree reduction (groups of
    ``TREE_FAN_IN`` consecutive nodes, level by level), the same sum on every run.

    Every query sums canonical record blocks
    (:meth:`~mvg_dask.plan.input_metadata.InputMetadata.canonical_ranges`), so the bytes of the
    sum, and the float-error depth the plan bounds, never depend on the input's chunk grid or
    layout (docs/bounds.md Sec. 11).

    Small partials are summed on the client (two fewer scheduler round trips after the last
    task). Large ones are reduced on the workers, each group as a left fold of pairwise
    additions (:func:`~mvg_dask.engine.tasks.gram.add_grams`): the additions of one combine of
    the group, in its order, so the same bytes; and a fold step can run as soon as its two
    operands exist. Consecutive leaves are placed on one worker (:func:`homes`), so a fold
    moves a partial between workers only where its group crosses from one worker's leaves
    to the next one's (placement never changes the bytes: the tree is fixed by metadata).

    Parameters
    ----------
    ctx : RunContext
        The run (its client; it records that the input is being read).
    rplan : ReleasePlan
        The plan.
    clipper : Clipper, optional
        The records' clipper and shift (the plan's by default; the mean-first route's second
        pass shifts by its released centre).

    Returns
    -------
    GramPass
        The submitted pass.
    """
    client = ctx.client
    # canonical record blocks; an empty input is one task over no record (its sum: zeros)
    ranges = rplan.input.canonical_ranges() or [(0, 0)]
    m = rplan.input.stacked_features  # [x; y] with a second variable
    # a grouped release's partials stack one matrix per group
    on_client = rplan.query.group_count * m * m * 8 * len(ranges) <= CLIENT_REDUCE_BYTES
    places = [None] * len(ranges) if on_client else homes(client, len(ranges))
    ctx.read_started = True
    # one scheduler message per run of leaves that share a home (one for the whole pass
    # when the client sums). Within a message the leaves keep their order (``map``'s internal
    # priorities): record order on each worker, at the default user priority (never above
    # other work's)
    leaves: list[Future] = []
    for home, run in itertools.groupby(zip(ranges, places, strict=True), key=lambda r: r[1]):
        starts, stops = zip(*(r for r, _ in run), strict=True)
        leaves += client.map(
            gram_task,
            starts,
            stops,
            source=gram_source_of(rplan),
            clipper=clipper_for(rplan) if clipper is None else clipper,
            step=rplan.input.record_chunk,
            block=rplan.input.canonical_block(),
            labels=labels_of(rplan),
            pure=False,
            **placed(home),
        )
    if on_client:
        return GramPass(leaves, None)
    return GramPass(leaves, _fold_on_workers(client, list(zip(leaves, places, strict=True))))


def _fold_on_workers(client: Client, level: list[tuple[Future, str | None]]) -> Future:
    """The root of the reduction tree, each group a left fold of pairwise additions."""
    while len(level) > 1:
        folded = []
        for i in range(0, len(level), TREE_FAN_IN):
            (acc, home), *rest = level[i : i + TREE_FAN_IN]
            for part, home in rest:
                # a step runs as soon as its operands exist: a partial is folded in
                # (and its memory freed) before the worker starts another leaf
                acc = client.submit(add_grams, acc, part, pure=False, priority=1, **placed(home))
            folded.append((acc, home))
        level = folded
    return level[0][0]


def finish_gram(ctx: RunContext, rplan: ReleasePlan, gram_pass: GramPass) -> np.ndarray:
    """Wait for a Gram pass and return ``X X^T`` (raises the first data error met, in record
    order); adds its clipped values to ``ctx.clipped``.

    Parameters
    ----------
    ctx : RunContext
        The run.
    rplan : ReleasePlan
        The plan.
    gram_pass : GramPass
        From :func:`submit_gram`.

    Returns
    -------
    ndarray
        The ``m x m`` sum (a grouped release: ``G x m x m``, one per group).
    """
    client, leaves = ctx.client, gram_pass.leaves
    gather_with_progress(
        client,
        leaves,
        Progress(len(leaves), "gram", enabled=ctx.progress, private_total=ctx.private_total(rplan)),
        keep=False,
    )
    if gram_pass.root is None:
        parts = client.gather(leaves)
        while len(parts) > 1:
            parts = [
                combine_grams(parts[i : i + TREE_FAN_IN]) for i in range(0, len(parts), TREE_FAN_IN)
            ]
        result = parts[0]
    else:
        result = gram_pass.root.result()
    gram, clipped = result.unwrap()
    ctx.clipped += int(clipped)
    return np.asarray(gram)


def homes(client: Client, tasks: int) -> list[str | None]:
    """A worker per task: runs of consecutive tasks on one worker (task ``i`` of ``T`` on worker
    ``i W // T`` of the ``W`` workers, sorted by address)."""
    workers = sorted(client.ncores())
    if not workers:
        return [None] * tasks
    return [workers[i * len(workers) // tasks] for i in range(tasks)]


def placed(home: str | None) -> dict[str, Any]:
    """``submit`` and ``map`` options placing a task on ``home``, loosely: another worker takes
    it if ``home`` has left the cluster."""
    return {} if home is None else {"workers": [home], "allow_other_workers": True}
