"""Gram tasks: the partial Gram matrix of a range of records (plain, augmented or grouped) and the
combine and fold steps of its tree reduction."""

from __future__ import annotations

import numpy as np

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.records import StackedMatrix, ZarrLabels, ZarrMatrix, canonical_blocks
from mvg_dask.engine.tasks.outcome import Outcome
from mvg_dask.errors import MvgDaskError
from mvg_dask.plan.queries import MatrixQuery


def gram_task(
    start: int,
    stop: int,
    *,
    source: ZarrMatrix | StackedMatrix,
    clipper: Clipper,
    block: int,
    step: int | None = None,
    labels: ZarrLabels | None = None,
    query: MatrixQuery,
) -> Outcome:
    """The partial of the clipped records ``[start, stop)``: ``query.partial`` of each canonical
    block, added by ``query.combine`` in record order (the Gram ``X_i X_i^T`` of a covariance;
    ``query`` is the plan's :meth:`~mvg_dask.plan.MatrixQuery.gram_pass`).

    The range is read ``step`` records (one stored chunk; the whole range by default) at a time,
    and the products of its canonical record blocks of ``block`` records
    (:func:`~mvg_dask.engine.records.canonical_blocks`) are added in record order, so a task
    over many chunks holds one chunk, one block and one ``M x M`` accumulator, never the whole
    range, and the products are the same whatever the chunk grid. With ``labels`` (a grouped
    release) the partial is the stack of the groups' augmented Gram matrices (the query's
    ``grouped_partial``), and the records whose label is not declared are dropped and counted
    with the clipped values (curator side). With a :class:`StackedMatrix` source (a two-variable
    cross-covariance) each chunk is the stacked ``[X_b; Y_b]``, checked and clipped against the
    stacked box.
    """
    step = stop - start if step is None else step
    total: np.ndarray | None = None
    clipped = 0
    try:  # the task's group labels, read at once (one small 1-D read per task)
        indices = None if labels is None else labels.read(start, stop)
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    pieces = canonical_blocks(source, clipper, start, stop, step, block)
    try:
        for a, x, c in pieces:
            b = a + x.shape[1]
            if clipper.centre is not None:  # fl(x - c), in the block's own fresh buffer
                x = _shifted(x, clipper.centre)
            if indices is not None:  # added into the task's running sum, group by group
                index = indices[a - start : b - start]
                total = query.grouped_partial(x, index, into=total)
                clipped += c + int(np.count_nonzero(index < 0))
                continue
            part = query.partial(x)
            total = part if total is None else query.combine(total, part)
            clipped += c
        if total is None:  # no record (an empty input): the sum over no record, zeros
            x = np.asarray(source.read(start, start), dtype=np.float64)  # m x 0
            if labels is not None:
                total = query.grouped_partial(x, np.empty(0, dtype=np.int64))
            else:
                total = query.partial(x)
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    return Outcome((total, clipped))


def _shifted(x: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``fl(x - c)`` of a clipped block (the values of
    :func:`~mvg_dask.plan.queries.moment.augmented_gram`'s shift), formed in place: the block is
    a fresh buffer of this task (a decoded chunk or its clipped copy), and a second ``m x b``
    array per chunk costs its page faults."""
    c = centre.reshape(-1, 1)
    if x.flags.writeable:
        return np.subtract(x, c, out=x)
    return x - c


def combine_grams(parts: list[Outcome], query: MatrixQuery) -> Outcome:
    """Combine partials in the order given by ``query.combine`` (the tree reduction's combine
    step); the first failure, in record order, wins."""
    for p in parts:
        if p.error is not None:
            return p
    total = parts[0].value[0].copy()
    count = parts[0].value[1]
    for p in parts[1:]:
        g, c = p.value
        total = query.combine(total, g)
        count += c
    return Outcome((total, count))


def add_grams(acc: Outcome, part: Outcome, query: MatrixQuery) -> Outcome:
    """One step of a left fold of partials: ``query.combine(acc, part)``.

    A fold over a group adds exactly what :func:`combine_grams` adds, in the same order, so the
    sum has the same bytes (``a + b`` and ``b + a`` are the same IEEE sum). ``acc`` covers the
    earlier records: its failure wins.

    The sum is formed in place, in whichever operand is writeable (a transferred one may be a
    read-only view of a network frame): in a fold each partial has exactly one consumer, this
    step, and a fresh ``M x M`` array per step costs its page faults (several times the
    addition's own cost at thousands of features).
    """
    for p in (acc, part):
        if p.error is not None:
            return p
    return Outcome((query.combine(acc.value[0], part.value[0]), acc.value[1] + part.value[1]))
