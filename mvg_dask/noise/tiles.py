"""The canonical noise tile grid: the one sampling path of every MVG release.

A release draws its noise from the keyed generator on a grid that does not depend on how the
data is chunked. Tile ``t`` of the record axis covers records ``[t*tile, min((t+1)*tile, N))``;
its standard normals are drawn whole, as an ``M x tile`` C-ordered matrix, from
``key.generator(t)``. The noise of a record therefore depends only on the key and the record's
index, never on the chunking, the cluster or how often a task runs. A square (``m x m``) query's
noise uses tile 0 of its own derived key: ``m x m`` normals (:func:`matrix_noise`) or, for
symmetric noise, the ``m (m + 1) / 2`` normals of an upper triangle
(:func:`symmetric_matrix_noise`).
"""

from __future__ import annotations

import numpy as np

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.samplers import affine_sample

TILE_RECORDS = 1024


def tile_normals(
    key: NoiseKey, features: int, start: int, stop: int, *, tile: int, n_total: int
) -> np.ndarray:
    """Standard normals of records ``[start, stop)`` cut from the canonical tile grid.

    Parameters
    ----------
    key : NoiseKey
        The release's noise key.
    features : int
        Rows ``M`` of a tile.
    start, stop : int
        Record range, ``0 <= start < stop <= n_total``.
    tile : int
        Records per tile.
    n_total : int
        Number of records of the dataset (the last tile may be short).

    Returns
    -------
    ndarray
        ``M x (stop - start)`` iid ``N(0, 1)`` (a fresh array the caller may modify).
    """
    if not 0 <= start < stop <= n_total:
        raise ValueError(f"record range [{start}, {stop}) is not inside [0, {n_total})")
    t0, t1 = start // tile, (stop - 1) // tile
    parts = []
    for t in range(t0, t1 + 1):
        a = t * tile
        b = min(a + tile, n_total)
        normals = key.tile_normals(t, (features, b - a))
        lo, hi = max(start - a, 0), min(stop, b) - a
        parts.append(normals if (lo, hi) == (0, b - a) else normals[:, lo:hi])
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def record_noise(
    key: NoiseKey,
    factor: np.ndarray,
    start: int,
    stop: int,
    *,
    tile: int,
    n_total: int,
    diagonal: bool,
) -> np.ndarray:
    """Unimodal noise ``B_Sigma N`` (MVG Alg. 1, ``Psi = I``) for records ``[start, stop)``.

    Parameters
    ----------
    key : NoiseKey
        The release's noise key.
    factor : ndarray
        ``B_Sigma`` (``M x M``); when ``diagonal``, only its diagonal is used.
    start, stop : int
        Record range.
    tile : int
        Records per tile.
    n_total : int
        Number of records of the dataset.
    diagonal : bool
        True when the directions are the standard basis (``B_Sigma`` is diagonal).

    Returns
    -------
    ndarray
        ``M x (stop - start)`` noise (a fresh array the caller may modify).

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Alg. 1 and Lemma 7.
    """
    N = tile_normals(key, factor.shape[0], start, stop, tile=tile, n_total=n_total)
    if diagonal:
        N *= np.diag(factor)[:, None]  # N is fresh (or a view of a fresh tile): scale in place
        return N
    return affine_sample(N, factor)


def matrix_noise(
    key: NoiseKey, row_factor: np.ndarray, col_factor: np.ndarray | None = None, *, tile: int = 0
) -> np.ndarray:
    """Noise ``B_Sigma N B_Psi^T`` of a whole ``m x n`` query output, from one tile.

    Parameters
    ----------
    key : NoiseKey
        The key of this noise (a release derives one per purpose).
    row_factor : ndarray
        ``B_Sigma`` (``m x m``).
    col_factor : ndarray, optional
        ``B_Psi`` (``n x n``); ``None`` means ``Psi = I`` and an ``m x m`` output.
    tile : int, default 0
        The tile to draw (independent draws of one key use different tiles).

    Returns
    -------
    ndarray
        ``Z ~ MVG(0, B_Sigma B_Sigma^T, B_Psi B_Psi^T)``.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Alg. 2 and Lemma 7.
    """
    m = row_factor.shape[0]
    n = m if col_factor is None else col_factor.shape[0]
    return affine_sample(key.tile_normals(tile, (m, n)), row_factor, col_factor)


def symmetric_normals(key: NoiseKey, m: int, ratio: float, *, tile: int = 0) -> np.ndarray:
    """A symmetric ``m x m`` Gaussian matrix ``S``: ``S_ii ~ N(0, 1)``, ``S_ij = S_ji ~ N(0, r)``.

    The ``m (m + 1) / 2`` normals of the upper triangle (row-major order, diagonal included, as
    :func:`numpy.triu_indices`) are one whole draw from tile ``tile`` of ``key``; the
    off-diagonal ones are scaled by ``sqrt(r)`` and mirrored. The bytes depend only on the key,
    ``m`` and ``r``.

    Parameters
    ----------
    key : NoiseKey
        The key of this noise (a release derives one per purpose).
    m : int
        Size.
    ratio : float
        ``r = b^2 / a^2``, the off-diagonal over the diagonal variance.
    tile : int, default 0
        The tile to draw.

    Returns
    -------
    ndarray
        ``S``.
    """
    iu = np.triu_indices(m)
    z = key.tile_normals(tile, (iu[0].size,))
    z[iu[0] != iu[1]] *= np.sqrt(ratio)
    S = np.zeros((m, m))
    S[iu] = z
    return S + np.triu(S, 1).T


def symmetric_matrix_noise(
    key: NoiseKey, factor: np.ndarray, ratio: float, *, tile: int = 0
) -> np.ndarray:
    """Symmetric noise ``B S B^T`` of an ``m x m`` symmetric query (docs/bounds.md, Sec. 1).

    Parameters
    ----------
    key : NoiseKey
        The key of this noise.
    factor : ndarray
        ``B = W diag(sqrt(v))`` (``m x m``): the basis the ensemble ``S`` lives in.
    ratio : float
        ``r``: ``S_ii ~ N(0, 1)``, ``S_ij = S_ji ~ N(0, r)`` (:func:`symmetric_normals`).
    tile : int, default 0
        The tile to draw.

    Returns
    -------
    ndarray
        ``Z = B S B^T`` (exactly symmetric).
    """
    Z = factor @ symmetric_normals(key, factor.shape[0], ratio, tile=tile) @ factor.T
    return np.asarray((Z + Z.T) / 2.0)  # exact symmetry in floating point


def _diagonal_product(d: np.ndarray, core: np.ndarray, right: bool) -> np.ndarray:
    """``diag(d) core`` (and ``diag(d) core diag(d)`` with ``right``) in O(m^2): the same numbers
    as the dense products with a diagonal factor, whose other terms are exact zeros."""
    out = d[:, None] * core
    return np.asarray(out * d[None, :] if right else out)


def symmetric_query_noise(
    key: NoiseKey,
    factor: np.ndarray,
    algorithm: str,
    ratio: float | None = None,
    *,
    diagonal: bool = False,
) -> np.ndarray:
    """The noise a release adds to a symmetric ``m x m`` query output (tile 0 of ``key``).

    * ``symmetric``: ``B S B^T``, ``S`` symmetric with ratio ``r`` (:func:`symmetric_matrix_noise`);
    * ``equi-modal`` (MVG Alg. 2): ``(Z + Z^T) / 2`` of ``Z = B N B^T`` (:func:`matrix_noise`).
      Averaging the release with its transpose is post-processing (same privacy); the published
      noise is ``B S B^T`` with ``S = (N + N^T) / 2``, the ensemble with ``r = 1/2``, and its
      expected squared error is ``(m + 1) / (2m)`` times that of ``Z`` for uniform variances
      (docs/bounds.md, Sec. 6);
    * ``unimodal``: ``B N`` (not symmetric).

    Parameters
    ----------
    key : NoiseKey
        The key of this noise.
    factor : ndarray
        ``B`` (``m x m``).
    algorithm : {"unimodal", "equi-modal", "symmetric"}
        Noise type.
    ratio : float, optional
        ``r`` of symmetric noise.
    diagonal : bool, default False
        ``factor`` is diagonal (standard directions): the products take O(m^2) instead of
        O(m^3), from the same normals.

    Returns
    -------
    ndarray
        ``m x m`` noise.
    """
    m = factor.shape[0]
    d = np.diagonal(factor).copy() if diagonal else None
    if algorithm == "symmetric":
        if ratio is None:
            raise ValueError("symmetric noise needs its ratio r")
        if d is None:
            return symmetric_matrix_noise(key, factor, ratio)
        return _diagonal_product(d, symmetric_normals(key, m, ratio), right=True)
    if algorithm == "equi-modal":
        if d is None:
            Z = matrix_noise(key, factor, factor)
        else:
            Z = _diagonal_product(d, key.tile_normals(0, (m, m)), right=True)
        return np.asarray((Z + Z.T) / 2.0)
    if d is None:
        return matrix_noise(key, factor, None)
    return _diagonal_product(d, key.tile_normals(0, (m, m)), right=False)
