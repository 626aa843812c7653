"""Exact integer combinations of a stream's lattice increments.

A period's outputs are integer combinations ``Σ_s C_int[r, s] g̃_s`` of the integer lattice
increments ``g̃_s`` (docs/lattice.md): computed in ``int64`` only after an exact (Python ``int``)
bound proves that no product and no partial sum can leave ``[-(2**63 - 1), 2**63 - 1]``, in any
order of summation; otherwise refused with :class:`StreamOverflowError`, never wrapped.

For privacy, pass ``bound``: a *public* bound on the increments' entries (from the plan). The
refusal then depends on public numbers only; an increment beyond the bound is an error of the
caller. Without it the bound is the data's own largest entry (for tests and tools only: a refusal
would depend on the data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mvg_dask.privacy.continual.factorizations import Factorization, TreeFactorization

INT64_MAX = (1 << 63) - 1


class StreamOverflowError(OverflowError):
    """An exact integer combination could leave the ``int64`` range."""


def max_abs(values: np.ndarray) -> int:
    """Largest ``|entry|`` of an integer array, as an exact Python ``int`` (0 if empty)."""
    if values.size == 0:
        return 0
    return max(int(values.max()), -int(values.min()))


def _integer_array(name: str, values: object) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype != np.int64:
        raise TypeError(f"{name} must be an int64 array (lattice increments), got {arr.dtype}")
    return arr


def increment_headroom(factorization: Factorization) -> int:
    """Largest public bound on the increments' entries that every period's combination fits.

    Parameters
    ----------
    factorization : Factorization
        The stream's factorization.

    Returns
    -------
    int
        ``floor((2**63 - 1) / max_r Σ_s |C_int[r, s]|)``.
    """
    return INT64_MAX // factorization.max_row_sum_int()


def _magnitudes(history: np.ndarray, bound: int | None) -> list[int]:
    found = [max_abs(history[i]) for i in range(history.shape[0])]
    if bound is None:
        return found
    if bound < 0:
        raise ValueError(f"bound must be >= 0, got {bound!r}")
    if any(f > bound for f in found):
        raise ValueError(f"an increment has an entry beyond the declared bound {bound}")
    return [bound] * len(found)


def combine_exact(
    coefficients: Sequence[int] | np.ndarray, history: np.ndarray, *, bound: int | None = None
) -> np.ndarray:
    """``Σ_i coefficients[i] · history[i]`` exactly, in ``int64``.

    Parameters
    ----------
    coefficients : sequence of int
        One integer per increment (e.g. a row of ``C_int``).
    history : numpy.ndarray
        ``int64`` increments, shape ``(len(coefficients), ...)``.
    bound : int, optional
        Public bound on the increments' entries (see the module's docstring).

    Returns
    -------
    numpy.ndarray
        The exact integer combination, ``int64``, shape ``history.shape[1:]``.

    Raises
    ------
    StreamOverflowError
        If ``Σ |coefficients[i]| · max|history[i]|`` exceeds ``2**63 - 1``.
    """
    coefs = list(np.asarray(coefficients, dtype=object).ravel())
    if not all(isinstance(c, int | np.integer) and not isinstance(c, bool) for c in coefs):
        raise TypeError("coefficients must be integers (a row of the integer encoder)")
    coefs = [int(c) for c in coefs]
    if any(abs(c) > INT64_MAX for c in coefs):
        raise StreamOverflowError("a coefficient exceeds the int64 range")
    hist = _integer_array("history", history)
    if hist.ndim < 1 or hist.shape[0] != len(coefs):
        raise ValueError(
            f"history must hold one increment per coefficient ({len(coefs)}), "
            f"got shape {hist.shape}"
        )
    total = sum(abs(c) * m for c, m in zip(coefs, _magnitudes(hist, bound), strict=True))
    if total > INT64_MAX:
        raise StreamOverflowError(
            f"the exact integer combination could reach {total:.3e} > 2**63 - 1: the "
            "increments are too large for int64 (use a coarser lattice or fewer bits)"
        )
    out = np.zeros(hist.shape[1:], dtype=np.int64)
    for c, h in zip(coefs, hist, strict=True):
        if c:
            out += np.int64(c) * h
    return out


def encode_period(
    factorization: Factorization, t: int, history: np.ndarray, *, bound: int | None = None
) -> np.ndarray:
    """Period ``t``'s exact integer encoder outputs ``C_int[rows of t] g̃``.

    Parameters
    ----------
    factorization : Factorization
        The stream's factorization.
    t : int
        The period, ``1 <= t <= horizon``.
    history : numpy.ndarray
        The most recent increments ``g̃_{t-k+1} .. g̃_t`` (``history[-1]`` is ``g̃_t``), ``int64``
        of shape ``(k, ...)``; ``k`` must cover every increment the period's rows use.
    bound : int, optional
        Public bound on the increments' entries.

    Returns
    -------
    numpy.ndarray
        ``int64``, shape ``(outputs_at(t), ...)``; ``C = C_int / 2**scale_bits``.
    """
    rows = factorization.encoder_rows(t)
    hist = _integer_array("history", history)
    k = hist.shape[0] if hist.ndim else 0
    if not 1 <= k <= t:
        raise ValueError(f"period {t} needs between 1 and {t} recent increments, got {k}")
    if np.any(rows[:, : t - k]):
        need = t - int(np.flatnonzero(rows.any(axis=0))[0])
        raise ValueError(f"period {t} needs its last {need} increments, got {k}")
    return np.stack([combine_exact(row[t - k :], hist, bound=bound) for row in rows])


@dataclass(frozen=True)
class TreeState:
    """The tree's curator-side state after ``period`` periods: its open (partial) nodes.

    Attributes
    ----------
    period : int
        Periods consumed so far.
    open : tuple of (int, numpy.ndarray)
        ``(level, partial sum)`` of every started node that completes within the horizon and
        has not completed yet, levels ascending; at most ``floor(log2 T)`` of them.
    """

    period: int = 0
    open: tuple[tuple[int, np.ndarray], ...] = ()


def _checked_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if max_abs(a) + max_abs(b) > INT64_MAX:
        raise StreamOverflowError(
            "a tree node's exact integer sum could exceed 2**63 - 1: the increments are too "
            "large for int64 (use a coarser lattice)"
        )
    return a + b


def tree_advance(
    tree: TreeFactorization,
    state: TreeState,
    increment: np.ndarray,
    *,
    bound: int | None = None,
) -> tuple[np.ndarray, TreeState]:
    """Add period ``state.period + 1``'s increment; release the nodes that complete.

    Parameters
    ----------
    tree : TreeFactorization
        The stream's tree.
    state : TreeState
        The state after the previous period (``TreeState()`` before the first).
    increment : numpy.ndarray
        ``g̃_t``, ``int64``.
    bound : int, optional
        Public bound on the increments' entries: checked once against the tree's headroom
        (``2**(levels - 1)`` increments per node) instead of per addition.

    Returns
    -------
    released : numpy.ndarray
        ``int64``, shape ``(outputs_at(t), *increment.shape)``: the completed nodes, levels
        ascending (the rows of ``encoder_rows(t)``).
    state : TreeState
        The state after period ``t``.
    """
    t = state.period + 1
    if t > tree.horizon:
        raise ValueError(f"the stream's horizon is {tree.horizon} periods: period {t} is past it")
    inc = _integer_array("increment", increment)
    if bound is not None:
        _magnitudes(inc[np.newaxis], bound)
        if bound > increment_headroom(tree):
            raise StreamOverflowError(
                f"bound {bound} exceeds the tree's int64 headroom {increment_headroom(tree)}"
            )
    if any(p.shape != inc.shape for _, p in state.open):
        raise ValueError(f"increment of shape {inc.shape} does not match the stream's open nodes")
    add = np.add if bound is not None else _checked_add
    partial = dict(state.open)
    released, still_open = [], []
    for level in range(tree.levels):
        end = (((t - 1) >> level) + 1) << level  # last period of the level's node holding t
        if end > tree.horizon:
            continue  # never completes within the horizon: never released, not kept
        value = inc.copy() if level not in partial else add(partial[level], inc)
        if end == t:
            released.append(value)
        else:
            still_open.append((level, value))
    return np.stack(released), TreeState(t, tuple(still_open))
