"""The engine side of the lattice release: whiten, round to the grid, add exact integer noise,
publish (docs/lattice.md; the plan side is :mod:`mvg_dask.plan.lattice`).

Every function here computes, from a block of the clipped query's values (float64), the
whitened value ``g`` with the float sequence the plan's error bound covers (diagonal whitening
``fl(f_ij w_i)`` then ``fl(. w_j)`` with ``w = fl(1 / fl(sqrt(v)))``; dense whitening
``fl(P @ f)`` with ``P = fl(W^T / d)``), its lattice coordinates, the exact integers
``t = rint(g / 2^k) + K`` with ``K`` from the noise grid
(:func:`mvg_dask.noise.tiles.tile_lattice_noise`,
:func:`~mvg_dask.noise.tiles.square_lattice_block`,
:func:`~mvg_dask.noise.tiles.symmetric_lattice_block`), and the published value
``A (2^k t) B^T`` in float: post-processing of ``t`` only. A block's bytes depend on the key, the
plan and the block's query values, never on how a release is blocked.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mvg_dask.errors import ReleaseError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import (
    feature_blocks,
    square_lattice_block,
    symmetric_lattice_block,
    tile_lattice_noise,
    windowed_product,
)
from mvg_dask.plan.lattice import LATTICE_RANGE, Lattice
from mvg_dask.plan.noise_plan import NoisePlan


def to_lattice(values: np.ndarray, log2_grid: int) -> np.ndarray:
    """``rint(values / 2^k)`` as exact int64 (``values / 2^k`` is exact: a power of two)."""
    y = np.ldexp(values, -log2_grid)
    if not np.all(np.abs(y) <= LATTICE_RANGE):  # also catches NaN
        raise ReleaseError(  # pragma: no cover - the plan bounds the whitened query
            "a whitened query value left the lattice's range: the plan's bound does not hold"
        )
    return np.rint(y).astype(np.int64)


def from_lattice(t: np.ndarray, log2_grid: int) -> np.ndarray:
    """``2^k t`` in float64 (a deterministic function of the exact integers ``t``)."""
    return np.ldexp(t.astype(np.float64), log2_grid)


def _factors(variances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``d = fl(sqrt(v))`` and ``w = fl(1 / d)``."""
    d = np.sqrt(np.asarray(variances, dtype=np.float64))
    return d, 1.0 / d


@dataclass(frozen=True, eq=False)
class RecordLattice:
    """What an identity task needs to privatize its records on the lattice.

    Attributes
    ----------
    log2_grid : int
        ``k``.
    scale : float
        The rounded Gaussian's scale in grid units.
    inverse : ndarray
        ``w`` (length ``m``, standard directions) or ``P = W^T / d`` (``m x m``).
    factor : ndarray
        ``d`` or ``B = W diag(d)``.
    """

    log2_grid: int
    scale: float
    inverse: np.ndarray
    factor: np.ndarray

    @classmethod
    def for_plan(cls, plan: NoisePlan) -> RecordLattice:
        """The record lattice of an identity release's plan."""
        lattice = _lattice(plan)
        d, w = _factors(plan.row_variances)
        inverse, factor = plan.covariance.scaled_directions(d, w)
        return cls(lattice.log2_grid, lattice.scale, inverse, factor)

    def release(
        self,
        x: np.ndarray,
        key: NoiseKey,
        start: int,
        stop: int,
        *,
        tile: int,
        n_total: int,
        overwrite: bool = False,
    ) -> np.ndarray:
        """The published values of records ``[start, stop)`` (``x``: ``m x (stop - start)``).

        With standard directions, each noise tile is drawn and at once applied to its records
        in one compiled pass (:func:`diagonal_release`), while it is in the core's cache: the
        chunk's integers are never assembled. ``overwrite`` lets the pass write the result into
        ``x`` (when it is a C-ordered float64 array; the identity task's own block).
        """
        if self.inverse.ndim == 1:  # one fused pass, the same operations as the dense path's
            return self._diagonal(x, key, start, stop, tile, n_total, overwrite)
        K = tile_lattice_noise(
            key, x.shape[0], start, stop, tile=tile, n_total=n_total, scale=self.scale
        )
        t = to_lattice(windowed_product(self.inverse, x, start), self.log2_grid)
        t += K
        return windowed_product(self.factor, from_lattice(t, self.log2_grid), start)

    def _diagonal(
        self,
        x: np.ndarray,
        key: NoiseKey,
        start: int,
        stop: int,
        tile: int,
        n_total: int,
        overwrite: bool,
    ) -> np.ndarray:
        """:meth:`release` with standard directions, tile by tile (the grid of
        :func:`~mvg_dask.noise.tiles.tile_lattice_noise`)."""
        if not 0 <= start < stop <= n_total or x.shape[1] != stop - start:
            raise ValueError(f"record range [{start}, {stop}) does not match the block")
        reuse = overwrite and x.dtype == np.float64 and x.flags.c_contiguous and x.flags.writeable
        x = x if reuse else np.ascontiguousarray(x, dtype=np.float64)
        out = x if reuse else np.empty_like(x)
        w = np.ascontiguousarray(self.inverse, dtype=np.float64)
        d = np.ascontiguousarray(self.factor, dtype=np.float64)
        m, k = x.shape[0], self.log2_grid
        ok = True
        for t in range(start // tile, (stop - 1) // tile + 1):
            a, b = t * tile, min((t + 1) * tile, n_total)
            lo, hi = max(start, a), min(stop, b)
            K = key.tile_lattice(t, (m, b - a), self.scale)  # drawn whole, C order
            ok &= _run_kernel(x, w, d, K, lo - a, lo - start, hi - lo, k, out)
        if not ok:  # the plan bounds the whitened query: a NaN or a broken bound
            raise ReleaseError(_LEFT_RANGE)
        return out


_LEFT_RANGE = "a whitened query value left the lattice's range: the plan's bound does not hold"


def diagonal_release(
    x: np.ndarray, w: np.ndarray, d: np.ndarray, K: np.ndarray, log2_grid: int
) -> np.ndarray:
    """``d_i 2^k (rint(fl(x_ij w_i) / 2^k) + K_ij)`` for every entry, in one compiled pass.

    The same float operations, in the same order, as :func:`to_lattice` and
    :func:`from_lattice` around a diagonal whitening (a product by a power of two is exact, so
    ``fl(fl(x w) 2^-k)`` is ``ldexp(fl(x w), -k)``), hence the same bytes; numpy's version
    makes eight passes over the block where this makes one.
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    w = np.ascontiguousarray(w, dtype=np.float64)
    d = np.ascontiguousarray(d, dtype=np.float64)
    K = np.ascontiguousarray(K, dtype=np.int64)
    if not _run_kernel(x, w, d, K, 0, 0, x.shape[1], log2_grid, out):
        raise ReleaseError(_LEFT_RANGE)  # the plan bounds the whitened query
    return out


def _run_kernel(
    x: np.ndarray,
    w: np.ndarray,
    d: np.ndarray,
    K: np.ndarray,
    k0: int,
    x0: int,
    n: int,
    log2_grid: int,
    out: np.ndarray,
) -> bool:
    """Columns ``[x0, x0 + n)`` of ``out`` from those of ``x`` and columns ``[k0, k0 + n)`` of
    ``K`` (all C-ordered: one compiled specialisation); False if a value left the range."""
    return bool(
        _diagonal_kernel()(
            x,
            w,
            d,
            K,
            k0,
            x0,
            n,
            math.ldexp(1.0, -log2_grid),
            math.ldexp(1.0, log2_grid),
            LATTICE_RANGE,
            out,
        )
    )


@functools.cache
def _diagonal_kernel() -> Any:
    """The compiled kernel of :func:`diagonal_release` (numba, compiled on first use and cached
    on disk; no fast-math: every operation is IEEE, in the order written)."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def kernel(
        x: np.ndarray,
        w: np.ndarray,
        d: np.ndarray,
        K: np.ndarray,
        k0: int,
        x0: int,
        n: int,
        down: float,
        up: float,
        limit: float,
        out: np.ndarray,
    ) -> bool:
        ok = True
        for i in range(x.shape[0]):
            wi = w[i]
            di = d[i]
            for j in range(n):
                y = (x[i, x0 + j] * wi) * down
                if not abs(y) <= limit:
                    ok = False
                    y = 0.0
                t = np.int64(np.rint(y)) + K[i, k0 + j]
                out[i, x0 + j] = (np.float64(t) * up) * di
        return ok

    return kernel


def _lattice(plan: NoisePlan) -> Lattice:
    if plan.lattice is None:
        raise ValueError("this plan adds float noise, not lattice noise")
    return plan.lattice


@dataclass(frozen=True, eq=False)
class StandardSquareLattice:
    """The lattice release of a square query with standard directions, block by block on the
    noise grid (the whole-matrix path and the panel path call the same :meth:`block`).

    Attributes
    ----------
    key : NoiseKey
        The release's noise key.
    variances : ndarray
        The ``m`` noise variances.
    algorithm : str
        ``symmetric``, ``equi-modal`` or ``unimodal``.
    ratio : float or None
        ``r`` of symmetric noise.
    log2_grid : int
        ``k``.
    scale : float
        The rounded Gaussian's scale.
    """

    key: NoiseKey
    variances: np.ndarray
    algorithm: str
    ratio: float | None
    log2_grid: int
    scale: float

    @classmethod
    def for_plan(cls, plan: NoisePlan, key: NoiseKey) -> StandardSquareLattice:
        """The lattice of a square release's plan (standard directions)."""
        lattice = _lattice(plan)
        return cls(
            key,
            np.asarray(plan.row_variances, dtype=np.float64),
            plan.algorithm,
            plan.symmetric_ratio,
            lattice.log2_grid,
            lattice.scale,
        )

    @functools.cached_property
    def _dw(self) -> tuple[np.ndarray, np.ndarray]:
        return _factors(self.variances)

    def _whitened(self, f: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
        w = self._dw[1]
        g = f * w[rows, None]
        if self.algorithm != "unimodal":
            g = g * w[None, cols]
        return np.asarray(g)

    def _published(self, G: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
        d = self._dw[0]
        out = d[rows, None] * G
        if self.algorithm != "unimodal":
            out = out * d[None, cols]
        return np.asarray(out)

    def block(self, f: np.ndarray, i: int, j: int) -> np.ndarray:
        """Block ``(i, j)`` of the published matrix, from ``f`` = block ``(i, j)`` of the
        query (a symmetric query: block ``(j, i)`` is ``f.T``).

        Parameters
        ----------
        f : ndarray
            The query's block, float64.
        i, j : int
            Grid block indices.

        Returns
        -------
        ndarray
            The published block.
        """
        m = self.variances.size
        blocks = feature_blocks(m)
        (a, b), (c, e) = blocks[i], blocks[j]
        rows, cols = slice(a, b), slice(c, e)
        k, s = self.log2_grid, self.scale
        if self.algorithm == "unimodal":
            t = to_lattice(self._whitened(f, rows, cols), k)
            t += square_lattice_block(self.key, m, i, j, s)
            return self._published(from_lattice(t, k), rows, cols)
        if self.algorithm == "equi-modal":
            t_ij = to_lattice(self._whitened(f, rows, cols), k)
            t_ij += square_lattice_block(self.key, m, i, j, s)
            p_ij = self._published(from_lattice(t_ij, k), rows, cols)
            if i == j:
                return np.asarray((p_ij + p_ij.T) / 2.0)
            t_ji = to_lattice(self._whitened(f.T, cols, rows), k)
            t_ji += square_lattice_block(self.key, m, j, i, s)
            p_ji = self._published(from_lattice(t_ji, k), cols, rows)
            return np.asarray((p_ij + p_ji.T) / 2.0)
        if i > j:
            return self.block(f.T, j, i).T
        G = self._symmetric_values(self._whitened(f, rows, cols), i, j)
        return self._published(G, rows, cols)

    def _symmetric_values(self, g: np.ndarray, i: int, j: int) -> np.ndarray:
        """The lattice values ``2^k t`` of a symmetric release's block ``(i, j)``, ``i <= j``,
        back in the ensemble's units (off-diagonal coordinates are ``g_ij / sqrt(r)``)."""
        return symmetric_values(g, i == j, self.ratio, self.key, self.variances.size, i, j, self)

    def region(self, f: np.ndarray, rs: tuple[int, int], cs: tuple[int, int]) -> np.ndarray:
        """The published region ``rs x cs`` (whole grid blocks) from the query's region ``f``."""
        from mvg_dask.noise.tiles import NOISE_TILE_FEATURES

        tf = NOISE_TILE_FEATURES
        out = np.empty_like(f)
        for i in range(rs[0] // tf, -(-rs[1] // tf)):
            for j in range(cs[0] // tf, -(-cs[1] // tf)):
                a0, b0 = i * tf - rs[0], j * tf - cs[0]
                fb = f[a0 : a0 + tf, b0 : b0 + tf]
                out[a0 : a0 + fb.shape[0], b0 : b0 + fb.shape[1]] = self.block(fb, i, j)
        return out


def _ratio_factors(ratio: float | None) -> tuple[float, float]:
    """``q = fl(1 / sqrt(r))`` (whitened off-diagonal to coordinate) and ``sqrt(r)`` (back)."""
    if ratio is None:
        raise ValueError("symmetric noise needs its ratio r")
    root = math.sqrt(ratio)
    return 1.0 / root, root


def symmetric_values(
    g: np.ndarray,
    diagonal: bool,
    ratio: float | None,
    key: NoiseKey,
    m: int,
    i: int,
    j: int,
    lattice: StandardSquareLattice | DenseSquareLattice | LowRankSquareLattice,
) -> np.ndarray:
    """Lattice values of a symmetric release's block ``(i, j)`` (``i <= j``) or whole matrix
    (``i = j = -1``: all grid blocks): coordinates ``g_kk`` and ``fl(g_kl q)``, rounded, plus the
    noise's integers, times ``2^k``, off-diagonals times ``sqrt(r)``; a diagonal block is
    mirrored from its upper triangle."""
    q, root = _ratio_factors(ratio)
    k, s = lattice.log2_grid, lattice.scale
    coords = g * q
    if diagonal:
        np.fill_diagonal(coords, np.diagonal(g))
    t = to_lattice(coords, k)
    if i < 0:
        t += _assembled(key, m, s, symmetric=True)
    else:
        t += symmetric_lattice_block(key, m, i, j, s)
    if diagonal:
        t = np.triu(t) + np.triu(t, 1).T
    G = from_lattice(t, k) * root
    if diagonal:
        np.fill_diagonal(G, from_lattice(np.diagonal(t).copy(), k))
    return np.asarray(G)


def _assembled(key: NoiseKey, m: int, scale: float, *, symmetric: bool) -> np.ndarray:
    """The whole ``m x m`` integer noise matrix, assembled from the grid blocks."""
    blocks = feature_blocks(m)
    out = np.empty((m, m), dtype=np.int64)
    for i, (a, b) in enumerate(blocks):
        for j, (c, d) in enumerate(blocks):
            if symmetric:
                out[a:b, c:d] = symmetric_lattice_block(key, m, i, j, scale)
            else:
                out[a:b, c:d] = square_lattice_block(key, m, i, j, scale)
    return out


@dataclass(frozen=True, eq=False)
class DenseSquareLattice:
    """The lattice release of a square query with dense directions (whole matrix, client).

    ``P = fl(W^T / d)`` whitens (``fl(fl(P @ f) @ P^T)``, one-sided ``fl(P @ f)``), and the
    published value is ``B G B^T`` (``B G``), symmetrised for the two-sided noises.
    """

    key: NoiseKey
    directions: np.ndarray
    variances: np.ndarray
    algorithm: str
    ratio: float | None
    log2_grid: int
    scale: float

    @classmethod
    def for_plan(cls, plan: NoisePlan, key: NoiseKey) -> DenseSquareLattice:
        """The lattice of a square release's plan (dense directions)."""
        lattice = _lattice(plan)
        return cls(
            key,
            plan.directions.matrix,
            np.asarray(plan.row_variances, dtype=np.float64),
            plan.algorithm,
            plan.symmetric_ratio,
            lattice.log2_grid,
            lattice.scale,
        )

    def release(self, f: np.ndarray) -> np.ndarray:
        """The published matrix from the query ``f`` (``m x m``, float64)."""
        d, _ = _factors(self.variances)
        W = self.directions
        P = W.T / d[:, None]
        B = W * d[None, :]
        m = f.shape[0]
        k, s = self.log2_grid, self.scale
        g = P @ f
        if self.algorithm == "unimodal":
            t = to_lattice(g, k) + _assembled(self.key, m, s, symmetric=False)
            return np.asarray(B @ from_lattice(t, k))
        g = g @ P.T
        if self.algorithm == "symmetric":
            G = symmetric_values(g, True, self.ratio, self.key, m, -1, -1, self)
        else:
            t = to_lattice(g, k) + _assembled(self.key, m, s, symmetric=False)
            G = from_lattice(t, k)
        Z = B @ G @ B.T
        return np.asarray((Z + Z.T) / 2.0)


def square_release(f: np.ndarray, plan: NoisePlan, key: NoiseKey) -> np.ndarray:
    """The published ``m x m`` matrix of a square lattice release assembled on the client."""
    if plan.covariance.diagonal:
        lattice = StandardSquareLattice.for_plan(plan, key)
        m = f.shape[0]
        return lattice.region(np.asarray(f, dtype=np.float64), (0, m), (0, m))
    return DenseSquareLattice.for_plan(plan, key).release(np.asarray(f, dtype=np.float64))


def gram_step(gram: np.ndarray, lattice: Lattice, sigma: float, key: NoiseKey) -> np.ndarray:
    """Analyze Gauss on the lattice: the symmetric release of ``X X^T`` with noise ``sigma S``
    (``r = 1``), i.e. standard directions with every variance ``sigma`` (whitened by
    ``1 / sqrt(sigma)`` on both sides), on the same symmetric grid as the float step."""
    m = gram.shape[0]
    step = StandardSquareLattice(
        key, np.full(m, float(sigma)), "symmetric", 1.0, lattice.log2_grid, lattice.scale
    )
    return step.region(np.asarray(gram, dtype=np.float64), (0, m), (0, m))


def vector_release(f: np.ndarray, std: float, lattice: Lattice, key: NoiseKey) -> np.ndarray:
    """A vector with noise ``N(0, std^2 I)`` on the lattice: whitened ``g = fl(f w)``,
    ``w = fl(1 / std)``, rounded to the grid, plus the rounded Gaussian of the lattice's scale
    (the key's tile 0), published as ``fl(std 2^k (h + K))`` (the mean-first route's mean,
    docs/bounds.md, Sec. 14)."""
    w = 1.0 / float(std)
    f = np.asarray(f, dtype=np.float64)
    t = to_lattice(f * w, lattice.log2_grid)
    t += key.tile_lattice(0, f.shape, lattice.scale)
    return float(std) * from_lattice(t, lattice.log2_grid)


def noisy_count(records: int, count_mu: float, key: NoiseKey) -> float:
    """``N + K`` with ``K`` the rounded Gaussian of scale ``1 / mu`` (rounded up): the Gaussian
    mechanism of sensitivity 1 rounded, exact on the integers."""
    scale = (1.0 / count_mu) * (1.0 + 2.0**-50)
    return float(records + int(key.tile_lattice(0, (1,), scale)[0]))


@dataclass(frozen=True, eq=False)
class LowRankSquareLattice:
    """The lattice release of a wide covariance with low-rank (DP-PCA) directions, computed
    grid block by grid block on the workers (no ``m x m`` matrix in memory).

    The noise factor is ``A = Sigma^(1/2) = a I + U diag(delta) U^T``. The whitening is the
    low-rank sequence the plan's error bound covers (docs/bounds.md, Lemma 11.5):
    ``L(Y) = fl(fl(c Y) + fl(V fl(U^T Y)))`` with ``c = fl(1/a)``, ``beta = fl(fl(1/fl(a +
    delta)) - c)``, ``V = fl(U diag(beta))``; ``g = L(L(f)^T)^T`` (two-sided) or ``L(f)``
    (unimodal). From row blocks of ``f``: ``P = U^T f`` (a first pass, summed over the row
    blocks in grid order), ``H = c f + V P``, ``Q = H U`` and ``g = c H + Q V^T``: the same
    scalar operations as the sequence on the whole matrix (the inner products of ``U^T Y``
    summed in another order, which the bound allows).

    Attributes
    ----------
    key : NoiseKey
        The release's noise key.
    basis : ndarray
        ``U`` (``m x k``).
    a : float
        ``a``.
    delta : ndarray
        ``delta`` (``k``).
    algorithm : str
        ``symmetric``, ``equi-modal`` or ``unimodal``.
    ratio : float or None
        ``r`` of symmetric noise.
    log2_grid : int
        ``k`` of the grid.
    scale : float
        The rounded Gaussian's scale.
    """

    key: NoiseKey
    basis: np.ndarray
    a: float
    delta: np.ndarray
    algorithm: str
    ratio: float | None
    log2_grid: int
    scale: float

    @classmethod
    def for_plan(cls, plan: NoisePlan, key: NoiseKey) -> LowRankSquareLattice:
        """The lattice of a wide release's plan (low-rank directions)."""
        from mvg_dask.plan.low_rank import low_rank_factor

        lattice = _lattice(plan)
        U = np.asarray(plan.directions.matrix, dtype=np.float64)
        a, delta = low_rank_factor(U, plan.row_variances)
        return cls(
            key, U, a, delta, plan.algorithm, plan.symmetric_ratio, lattice.log2_grid, lattice.scale
        )

    @functools.cached_property
    def _whitening(self) -> tuple[float, np.ndarray]:
        """``(c, V)`` of the whitening sequence."""
        c = 1.0 / self.a
        beta = 1.0 / (self.a + self.delta) - c
        return c, self.basis * beta[None, :]

    def projection(self, f_rows: np.ndarray, rows: slice) -> np.ndarray:
        """``U[rows]^T f[rows]``: a row block's part of ``P = U^T f`` (``k x m``)."""
        return np.asarray(self.basis[rows].T @ f_rows)

    def whitened(self, f_rows: np.ndarray, rows: slice, P: np.ndarray) -> np.ndarray:
        """The rows ``rows`` of ``g`` from the same rows of ``f`` and ``P = U^T f``."""
        c, V = self._whitening
        H = c * f_rows + V[rows] @ P
        if self.algorithm == "unimodal":
            return np.asarray(H)
        return np.asarray(c * H + (H @ self.basis) @ V.T)

    def lattice_block(self, g: np.ndarray, i: int, j: int) -> np.ndarray:
        """``2^k t`` of grid block ``(i, j)`` (``i <= j`` for symmetric noise) from that block of
        ``g``, in the ensemble's units (symmetric noise: off-diagonals times ``sqrt(r)``)."""
        if self.algorithm == "symmetric":
            return symmetric_values(
                g, i == j, self.ratio, self.key, self.basis.shape[0], i, j, self
            )
        t = to_lattice(g, self.log2_grid)
        t += square_lattice_block(self.key, self.basis.shape[0], i, j, self.scale)
        return from_lattice(t, self.log2_grid)

    def published_rows(
        self, T_rows: np.ndarray, rows: slice, R: np.ndarray, TU_rows: np.ndarray, S: np.ndarray
    ) -> np.ndarray:
        """Rows of ``A T`` (unimodal) or ``A T A^T`` from the same rows of ``T``, ``R = U^T T``,
        the rows of ``T U`` and ``S = R U``."""
        U, a = self.basis, self.a
        Ud = U * self.delta[None, :]
        Y = a * T_rows + Ud[rows] @ R
        if self.algorithm == "unimodal":
            return np.asarray(Y)
        return np.asarray(a * Y + (a * TU_rows + Ud[rows] @ S) @ Ud.T)

    def published_columns(
        self, T_cols: np.ndarray, cols: slice, R: np.ndarray, TU: np.ndarray, S: np.ndarray
    ) -> np.ndarray:
        """Columns ``cols`` of ``A T A^T`` from the same columns of ``T``, ``R``, ``T U`` and
        ``S`` (the other half of the equi-modal noise's symmetrisation)."""
        U, a = self.basis, self.a
        Ud = U * self.delta[None, :]
        Z = a * T_cols + TU @ Ud[cols].T
        return np.asarray(a * Z + Ud @ (a * R[:, cols] + S @ Ud[cols].T))
