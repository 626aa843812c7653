"""Gram tasks: the partial Gram matrix of a range of records (plain, augmented or grouped) and the
combine and fold steps of its tree reduction."""

from __future__ import annotations

import numpy as np

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.records import StackedMatrix, ZarrLabels, ZarrMatrix, canonical_blocks
from mvg_dask.engine.tasks.outcome import Outcome
from mvg_dask.errors import MvgDaskError
from mvg_dask.plan.queries.moment import augmented_gram


def grouped_gram(
    x: np.ndarray, index: np.ndarray, groups: int, into: np.ndarray | None = None
) -> np.ndarray:
    """The stacked augmented Gram matrices of a block's groups: ``(G, m + 1, m + 1)``, entry
    ``g`` ``[[X_g X_g^T, X_g 1], [1^T X_g^T, b_g]]`` of the records of group ``g`` (as
    :func:`~mvg_dask.plan.queries.moment.augmented_gram`, each entry a sum of exact products).

    The block's kept records are gathered once, group after group in record order (a stable
    sort of the indices), so each group's records are one contiguous run of columns; its Gram
    product and its row sums (a sequential sum) read that run only, so a group's bytes are
    fixed by its own records.

    Parameters
    ----------
    x : ndarray
        ``m x b`` clipped records.
    index : ndarray
        Each record's group index (``-1``: dropped).
    groups : int
        ``G``.
    into : ndarray, optional
        A running ``(G, m + 1, m + 1)`` sum to add the block's matrices to, in place (each
        non-empty group's entries, the same additions as ``into + grouped_gram(x, ...)``).

    Returns
    -------
    ndarray
        ``(G, m + 1, m + 1)`` (``into``, when given).
    """
    m = x.shape[0]
    out = np.zeros((groups, m + 1, m + 1), dtype=np.float64) if into is None else into
    # int16 indices (G <= 10,000): numpy's stable sort is then a radix sort
    small = index.astype(np.int16 if groups < 2**15 else np.int64)
    order = np.argsort(small, kind="stable")
    starts = np.searchsorted(small[order], np.arange(groups + 1))
    kept = np.take(x, order[starts[0] :], axis=1)  # group after group, in record order
    starts -= starts[0]
    counts = np.diff(starts)
    filled = np.flatnonzero(counts)
    if filled.size == 0:
        return out
    sums = np.add.reduceat(kept, starts[filled], axis=1)  # one run per non-empty group
    for g in filled:
        run = kept[:, starts[g] : starts[g + 1]]
        out[g, :m, :m] += run @ run.T
    out[filled, :m, m] += sums.T
    out[filled, m, :m] += sums.T
    out[filled, m, m] += counts[filled]
    return out


def gram_task(
    start: int,
    stop: int,
    *,
    source: ZarrMatrix | StackedMatrix,
    clipper: Clipper,
    block: int,
    step: int | None = None,
    labels: ZarrLabels | None = None,
) -> Outcome:
    """Partial Gram matrix ``X_i X_i^T`` of the clipped records ``[start, stop)``.

    The range is read ``step`` records (one stored chunk; the whole range by default) at a time,
    and the products of its canonical record blocks of ``block`` records
    (:func:`~mvg_dask.engine.records.canonical_blocks`) are added in record order, so a task
    over many chunks holds one chunk, one block and one ``M x M`` accumulator, never the whole
    range, and the products are the same whatever the chunk grid. With ``labels`` (a grouped
    release) the partial is the stack of the groups' augmented Gram matrices
    (:func:`grouped_gram`), and the records whose label is not declared are dropped and counted
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
                assert labels is not None
                index = indices[a - start : b - start]
                total = grouped_gram(x, index, len(labels.groups), into=total)
                clipped += c + int(np.count_nonzero(index < 0))
                continue
            part = augmented_gram(x) if clipper.augment else x @ x.T
            if total is None:
                total = part
            else:
                total += part
            clipped += c
        if total is None:  # no record (an empty input): the sum over no record, zeros
            x = np.asarray(source.read(start, start), dtype=np.float64)  # m x 0
            if labels is not None:
                total = grouped_gram(x, np.empty(0, dtype=np.int64), len(labels.groups))
            else:
                total = augmented_gram(x) if clipper.augment else x @ x.T
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


def combine_grams(parts: list[Outcome]) -> Outcome:
    """Combine partial Gram matrices in the order given (the tree reduction's combine step);
    the first failure, in record order, wins."""
    for p in parts:
        if p.error is not None:
            return p
    total = parts[0].value[0].copy()
    count = parts[0].value[1]
    for p in parts[1:]:
        g, c = p.value
        total += g
        count += c
    return Outcome((total, count))


def add_grams(acc: Outcome, part: Outcome) -> Outcome:
    """One step of a left fold of partial Gram matrices: ``acc + part``.

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
    a, b = acc.value[0], part.value[0]
    out = a if a.flags.writeable else b if b.flags.writeable else None
    return Outcome((np.add(a, b, out=out), acc.value[1] + part.value[1]))
