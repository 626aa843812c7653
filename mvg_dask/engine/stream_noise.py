"""A stream period's exact integers, its noise and its decoding (docs/guide/streams.md).

The three steps of period ``t`` of a stream, each a small pure function that tests and tools can
call on their own:

1. :func:`lattice_increment`: the period's query value ``f_t`` (the query over the period's new
   records, normalised by the plan's public record bound), whitened and rounded to the plan's
   grid: the exact integer increment ``g̃_t`` (docs/lattice.md, steps 1-2);
2. :func:`period_outputs`: the factorization's exact integer encoder outputs
   ``C_int[rows of t] [g̃_1 .. g̃_t]`` (:func:`~mvg_dask.privacy.continual.encode_period`) plus
   the rounded Gaussian noise of scale ``2**b s`` keyed by ``(stream key, period, output)``
   (:func:`output_noise`): a retried period re-derives the same noise, never draws anew;
3. :func:`decode_period`: ``x̂_t = B[t] y / 2**b`` in grid units (float, post-processing), and
   :func:`published_matrix`: ``x̂_t`` back to the query's units, as the one-shot lattice
   release publishes (off-diagonals of symmetric noise times ``sqrt(r)``, mirrored, then
   ``d_i x d_j``).

With ``y`` every output's std is the period plan's unit noise, so ``x̂_t`` carries the plan's
noise times ``‖B[t]‖₂``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mvg_dask.engine.lattice import from_lattice, to_lattice
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.noise_plan import NoisePlan
from mvg_dask.privacy.continual import Factorization, encode_period


def _whitening(plan: NoisePlan) -> tuple[np.ndarray, np.ndarray]:
    """``d = fl(sqrt(v))`` and ``w = fl(1 / d)`` (the one-shot lattice's factors)."""
    d = np.sqrt(np.asarray(plan.row_variances, dtype=np.float64))
    return d, 1.0 / d


def _ratio(plan: NoisePlan) -> tuple[float, float]:
    """``q = fl(1 / sqrt(r))`` and ``sqrt(r)`` of symmetric noise (``1, 1`` otherwise)."""
    if plan.algorithm != "symmetric":
        return 1.0, 1.0
    assert plan.symmetric_ratio is not None
    root = math.sqrt(plan.symmetric_ratio)
    return 1.0 / root, root


def lattice_increment(f: np.ndarray, plan: NoisePlan) -> np.ndarray:
    """The exact integer lattice coordinates of a period's query value.

    Parameters
    ----------
    f : numpy.ndarray
        The query's value over the period's records, ``(..., m, m)`` float64 (a grouped
        release: one matrix per group).
    plan : NoisePlan
        The stream's period plan (standard directions, lattice noise).

    Returns
    -------
    numpy.ndarray
        ``int64`` of ``f``'s shape: ``rint(g / 2^k)`` with ``g`` the whitened value (symmetric
        noise: ``g_ii`` and ``fl(g_ij q)``, upper triangle; the lower one is zero).
    """
    assert plan.lattice is not None, "a stream adds lattice noise"
    _, w = _whitening(plan)
    g = np.asarray(f, dtype=np.float64) * w[:, None]
    if plan.algorithm == "unimodal":
        return to_lattice(g, plan.lattice.log2_grid)
    g = g * w[None, :]
    q, _ = _ratio(plan)
    coords = g * q
    diag = np.arange(g.shape[-1])
    coords[..., diag, diag] = g[..., diag, diag]
    return np.triu(to_lattice(coords, plan.lattice.log2_grid))


def output_noise(
    key: NoiseKey, period: int, output: str, part: str, shape: tuple[int, ...], scale: float
) -> np.ndarray:
    """The rounded Gaussian integers of one output of one period, keyed by
    ``(stream key, period, output, part)``.

    Parameters
    ----------
    key : NoiseKey
        The stream's key.
    period : int
        ``t``.
    output : str
        The output's name (:meth:`~mvg_dask.privacy.continual.Factorization.output_keys`).
    part : str
        What the output carries: ``release`` (a grouped release: ``release/group-<i>``) or
        ``count``.
    shape : tuple of int
        The output's shape.
    scale : float
        The rounded Gaussian's scale in integer units.

    Returns
    -------
    numpy.ndarray
        ``int64`` of ``shape``.
    """
    sub = key.derive(f"period-{period}").derive(output)
    for name in part.split("/"):
        sub = sub.derive(name)
    return sub.tile_lattice(0, shape, scale)


def period_outputs(
    factorization: Factorization,
    period: int,
    increments: Sequence[np.ndarray],
    key: NoiseKey,
    *,
    scale: float,
    bound: int,
    part: str = "release",
    symmetric: bool = False,
) -> np.ndarray:
    """Period ``t``'s noisy outputs ``y = C_int[rows of t] g̃ + K`` (exact integers).

    Parameters
    ----------
    factorization : Factorization
        The stream's factorization.
    period : int
        ``t`` (1-based).
    increments : sequence of numpy.ndarray
        ``g̃_1 .. g̃_t`` (``int64``, one shape).
    key : NoiseKey
        The stream's key.
    scale : float
        The rounded Gaussian's scale in the outputs' integer units: ``2**b s`` (``s`` the
        period plan's scale in grid units, ``b`` the encoder's dyadic bits).
    bound : int
        Public bound on the increments' entries (the overflow check uses it only).
    part : str, default "release"
        The noise's sub-key (:func:`output_noise`).
    symmetric : bool, default False
        Keep the upper triangle of the noise only (symmetric noise's coordinates).

    Returns
    -------
    numpy.ndarray
        ``int64``, ``(outputs_at(t), *shape)``.
    """
    history = np.stack([np.asarray(g, dtype=np.int64) for g in increments[:period]])
    encoded = encode_period(factorization, period, history, bound=bound)
    names = factorization.output_keys(period)
    out = np.empty_like(encoded)
    for i, name in enumerate(names):
        noise = output_noise(key, period, name, part, encoded.shape[1:], scale)
        if symmetric:
            noise = np.triu(noise)
        out[i] = encoded[i] + noise
    return out


def decode_period(
    factorization: Factorization, period: int, outputs: Sequence[np.ndarray]
) -> np.ndarray:
    """``x̂_t = B[t] y / 2**b``: period ``t``'s estimate of the prefix sum, in grid units.

    Parameters
    ----------
    factorization : Factorization
        The stream's factorization.
    period : int
        ``t``.
    outputs : sequence of numpy.ndarray
        Every period's outputs up to ``t`` (:func:`period_outputs`), in period order.

    Returns
    -------
    numpy.ndarray
        Float64, the increments' shape.
    """
    y = np.concatenate([np.asarray(o) for o in outputs[:period]]).astype(np.float64)
    row = factorization.decoder_row(period)
    if row.size != y.shape[0]:
        raise ValueError(f"period {period} decodes {row.size} outputs, got {y.shape[0]}")
    x = np.tensordot(row, y, axes=1)
    return np.asarray(np.ldexp(x, -factorization.scale_bits))


def published_matrix(x: np.ndarray, plan: NoisePlan) -> np.ndarray:
    """A decoded period back in the query's units, as the one-shot lattice release publishes
    its integers: ``2^k x``, symmetric noise's off-diagonals times ``sqrt(r)`` and mirrored,
    then ``d_i (.) d_j`` (``d_i (.)`` for unimodal noise).

    Parameters
    ----------
    x : numpy.ndarray
        :func:`decode_period`'s value, ``(..., m, m)``.
    plan : NoisePlan
        The period plan.

    Returns
    -------
    numpy.ndarray
        The published matrix (or stack).
    """
    assert plan.lattice is not None
    d, _ = _whitening(plan)
    G = from_lattice(np.asarray(x, dtype=np.float64), plan.lattice.log2_grid)
    if plan.algorithm == "unimodal":
        return np.asarray(d[:, None] * G)
    _, root = _ratio(plan)
    upper = np.triu(G, 1) * root
    G = upper + np.swapaxes(upper, -1, -2) + G * np.eye(G.shape[-1])
    return np.asarray(d[:, None] * G * d[None, :])


def decode_count(factorization: Factorization, period: int, outputs: Sequence[np.ndarray]) -> float:
    """A noisy record count's period estimate ``B[t] y / 2**b`` (a scalar stream).

    Parameters
    ----------
    factorization : Factorization
        The stream's factorization.
    period : int
        ``t``.
    outputs : sequence of numpy.ndarray
        Every period's count outputs up to ``t``, each ``(outputs_at(s), 1)``.

    Returns
    -------
    float
        The estimate.
    """
    return float(decode_period(factorization, period, outputs).reshape(-1)[0])


__all__ = [
    "decode_count",
    "decode_period",
    "lattice_increment",
    "output_noise",
    "period_outputs",
    "published_matrix",
]
