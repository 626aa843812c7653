"""The canonical noise tile grid: the one sampling path of every MVG release.

A release draws its noise from the keyed generator on a grid that does not depend on how the
data is chunked. Tile ``t`` of the record axis covers records ``[t*tile, min((t+1)*tile, N))``;
its standard normals are drawn whole, as an ``M x tile`` C-ordered matrix, from
``key.generator(t)``. The noise of a record therefore depends only on the key and the record's
index, never on the chunking, the cluster or how often a task runs. A square (``m x m``) query's
noise uses its own derived key on a grid of feature blocks of ``NOISE_TILE_FEATURES``
(:func:`feature_blocks`): block ``(I, J)`` of the ``m x m`` normals is drawn whole, C-ordered,
from tile ``I * blocks + J`` (:func:`square_normals`); for symmetric noise the upper triangle of
a diagonal block ``(I, I)`` (row-major, as :func:`numpy.triu_indices`) and the whole block
``(I, J)``, ``I < J``, come from tile ``J (J + 1) / 2 + I`` (:func:`symmetric_normals`). A query of
at most ``NOISE_TILE_FEATURES`` features is one block drawn from tile 0. Any block of the noise
can be drawn on its own, so a wide release draws it where it writes it, with the same bytes
whatever its blocking (:func:`diagonal_noise_block`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.samplers import affine_sample

TILE_RECORDS = 1024
#: Normals per record tile at most: wide inputs get shorter tiles (:func:`tile_records_for`).
TILE_NORMALS = 2**20


def tile_records_for(features: int) -> int:
    """Records per tile of an identity release of ``features`` features (metadata only).

    ``TILE_RECORDS`` up to 1,024 features; beyond, tiles of about ``TILE_NORMALS`` normals (at
    least 16 records), so that a task of a wide input (whose chunks hold few records) does not
    draw whole tiles it mostly discards.
    """
    return max(16, min(TILE_RECORDS, TILE_NORMALS // max(1, features)))


#: Features per block of the noise grid of a square query (see the module text).
NOISE_TILE_FEATURES = 256


def feature_blocks(m: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` feature ranges of the noise grid of an ``m x m`` query."""
    b = NOISE_TILE_FEATURES
    return [(a, min(a + b, m)) for a in range(0, m, b)]


def square_normals_block(key: NoiseKey, m: int, i: int, j: int, *, tile: int = 0) -> np.ndarray:
    """Block ``(i, j)`` of the ``m x m`` iid normals of a square query (tile ``i * nb + j``)."""
    blocks = feature_blocks(m)
    (a, b), (c, d) = blocks[i], blocks[j]
    return key.tile_normals(tile + i * len(blocks) + j, (b - a, d - c))


def square_normals(key: NoiseKey, m: int, *, tile: int = 0) -> np.ndarray:
    """The ``m x m`` iid standard normals of a square query, assembled from the block grid."""
    blocks = feature_blocks(m)
    if len(blocks) == 1:
        return square_normals_block(key, m, 0, 0, tile=tile)
    out = np.empty((m, m))
    for i, (a, b) in enumerate(blocks):
        for j, (c, d) in enumerate(blocks):
            out[a:b, c:d] = square_normals_block(key, m, i, j, tile=tile)
    return out


def square_lattice_block(key: NoiseKey, m: int, i: int, j: int, scale: float) -> np.ndarray:
    """Block ``(i, j)`` of the ``m x m`` rounded-Gaussian integers of a square query's lattice
    release: the grid of :func:`square_normals_block`, tile ``i * nb + j`` drawn whole."""
    blocks = feature_blocks(m)
    (a, b), (c, d) = blocks[i], blocks[j]
    return key.tile_lattice(i * len(blocks) + j, (b - a, d - c), scale)


def symmetric_lattice_block(key: NoiseKey, m: int, i: int, j: int, scale: float) -> np.ndarray:
    """Block ``(i, j)`` of the symmetric ``m x m`` integer matrix whose upper triangle is the
    rounded-Gaussian noise of a symmetric lattice release (the ``vech`` coordinates): the grid
    of :func:`symmetric_normals_block` (a diagonal block's upper triangle, row-major, from tile
    ``J (J + 1) / 2 + I``; an off-diagonal block ``I < J`` whole), mirrored."""
    if i > j:
        return symmetric_lattice_block(key, m, j, i, scale).T
    blocks = feature_blocks(m)
    (a, b), (c, d) = blocks[i], blocks[j]
    t = j * (j + 1) // 2 + i
    if i < j:
        return key.tile_lattice(t, (b - a, d - c), scale)
    size = b - a
    iu = np.triu_indices(size)
    K = np.zeros((size, size), dtype=np.int64)
    K[iu] = key.tile_lattice(t, (iu[0].size,), scale)
    return K + np.triu(K, 1).T


def symmetric_normals_block(
    key: NoiseKey, m: int, ratio: float, i: int, j: int, *, tile: int = 0
) -> np.ndarray:
    """Block ``(i, j)`` of :func:`symmetric_normals` (``S_ji`` blocks are transposes)."""
    if i > j:
        return symmetric_normals_block(key, m, ratio, j, i, tile=tile).T
    blocks = feature_blocks(m)
    (a, b), (c, d) = blocks[i], blocks[j]
    t = tile + j * (j + 1) // 2 + i
    if i < j:
        return key.tile_normals(t, (b - a, d - c)) * np.sqrt(ratio)
    size = b - a
    iu = np.triu_indices(size)
    z = key.tile_normals(t, (iu[0].size,))
    z[iu[0] != iu[1]] *= np.sqrt(ratio)
    S = np.zeros((size, size))
    S[iu] = z
    return S + np.triu(S, 1).T


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
    return _record_tiles(key.tile_normals, features, start, stop, tile=tile, n_total=n_total)


def tile_lattice_noise(
    key: NoiseKey,
    features: int,
    start: int,
    stop: int,
    *,
    tile: int,
    n_total: int,
    scale: float,
) -> np.ndarray:
    """Rounded-Gaussian integers of records ``[start, stop)``, cut from the canonical tile grid
    exactly as :func:`tile_normals` cuts normals (tile ``t`` drawn whole by
    :meth:`NoiseKey.tile_lattice`).

    Returns
    -------
    ndarray
        ``M x (stop - start)`` int64 of scale ``scale``.
    """

    def draw(t: int, shape: tuple[int, ...]) -> np.ndarray:
        return key.tile_lattice(t, shape, scale)

    return _record_tiles(draw, features, start, stop, tile=tile, n_total=n_total)


def _record_tiles(
    draw: Callable[[int, tuple[int, ...]], np.ndarray],
    features: int,
    start: int,
    stop: int,
    *,
    tile: int,
    n_total: int,
) -> np.ndarray:
    """Records ``[start, stop)`` of the tile grid whose tile ``t`` is ``draw(t, shape)``."""
    if not 0 <= start < stop <= n_total:
        raise ValueError(f"record range [{start}, {stop}) is not inside [0, {n_total})")
    t0, t1 = start // tile, (stop - 1) // tile
    parts = []
    for t in range(t0, t1 + 1):
        a = t * tile
        b = min(a + tile, n_total)
        normals = draw(t, (features, b - a))
        lo, hi = max(start - a, 0), min(stop, b) - a
        parts.append(normals if (lo, hi) == (0, b - a) else normals[:, lo:hi])
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


#: Dense per-record products are formed over windows of this many records, aligned to the
#: record index (see :func:`windowed_product`).
PRODUCT_WINDOW = 256


def windowed_product(A: np.ndarray, x: np.ndarray, start: int) -> np.ndarray:
    """``A @ x`` for the records ``[start, start + n)`` (``x``: ``m x n``), formed window by
    window: each window of ``PRODUCT_WINDOW`` records aligned to the record index is one
    ``A @ buffer`` on a zero-padded C-contiguous buffer of that width. A record's product is then
    the same BLAS call at the same column whatever task, chunk or layout it came in (a
    one-record chunk would otherwise be a matrix-vector product, rounded differently), so the
    published bytes do not depend on the input's chunk grid.

    Parameters
    ----------
    A : ndarray
        ``p x m``.
    x : ndarray
        ``m x n``, records ``start .. start + n - 1``.
    start : int
        The index of ``x``'s first record.

    Returns
    -------
    ndarray
        ``p x n``.
    """
    n = x.shape[1]
    out = np.empty((A.shape[0], n))
    buffer = np.zeros((x.shape[0], PRODUCT_WINDOW))
    first = start - start % PRODUCT_WINDOW
    for a in range(first, start + n, PRODUCT_WINDOW):
        lo, hi = max(a, start), min(a + PRODUCT_WINDOW, start + n)
        buffer[...] = 0.0
        buffer[:, lo - a : hi - a] = x[:, lo - start : hi - start]
        out[:, lo - start : hi - start] = (A @ buffer)[:, lo - a : hi - a]
    return out


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
        ``B_Sigma`` (``M x M``); when ``diagonal``, only its diagonal is used, and it may be
        given as that vector (what a release ships to its tasks: no ``M x M`` matrix).
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
    if diagonal:
        d = factor if factor.ndim == 1 else np.diag(factor)
        return _scaled_tiles(key, d, start, stop, tile=tile, n_total=n_total)
    N = tile_normals(key, factor.shape[0], start, stop, tile=tile, n_total=n_total)
    if factor.ndim == 1:
        raise ValueError("a vector factor means diagonal=True")
    return windowed_product(factor, N, start)  # B N, the same bits whatever the chunk grid


def _scaled_tiles(
    key: NoiseKey, d: np.ndarray, start: int, stop: int, *, tile: int, n_total: int
) -> np.ndarray:
    """``d_i N_ij`` for records ``[start, stop)``: each tile of :func:`tile_normals` scaled into
    its columns of the result as it is drawn (the products of scaling the assembled normals,
    without assembling them)."""
    if not 0 <= start < stop <= n_total:
        raise ValueError(f"record range [{start}, {stop}) is not inside [0, {n_total})")
    out = np.empty((d.size, stop - start))
    col = d.reshape(-1, 1)
    for t in range(start // tile, (stop - 1) // tile + 1):
        a, b = t * tile, min((t + 1) * tile, n_total)
        lo, hi = max(start, a), min(stop, b)
        normals = key.tile_normals(t, (d.size, b - a))
        np.multiply(normals[:, lo - a : hi - a], col, out=out[:, lo - start : hi - start])
    return out


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
    normals = square_normals(key, m, tile=tile) if n == m else key.tile_normals(tile, (m, n))
    return affine_sample(normals, row_factor, col_factor)


def symmetric_normals(key: NoiseKey, m: int, ratio: float, *, tile: int = 0) -> np.ndarray:
    """A symmetric ``m x m`` Gaussian matrix ``S``: ``S_ii ~ N(0, 1)``, ``S_ij = S_ji ~ N(0, r)``.

    Up to ``NOISE_TILE_FEATURES`` features the ``m (m + 1) / 2`` normals of the upper triangle
    (row-major order, diagonal included, as :func:`numpy.triu_indices`) are one whole draw from
    tile ``tile`` of ``key``; beyond, the upper triangle is drawn block by block from the grid of
    the module text (:func:`symmetric_normals_block`). Off-diagonal normals are scaled by
    ``sqrt(r)`` and mirrored. The bytes depend only on the key, ``m`` and ``r``.

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
    blocks = feature_blocks(m)
    if len(blocks) == 1:
        return symmetric_normals_block(key, m, ratio, 0, 0, tile=tile)
    S = np.empty((m, m))
    for i, (a, b) in enumerate(blocks):
        for j in range(i, len(blocks)):
            c, d = blocks[j]
            block = symmetric_normals_block(key, m, ratio, i, j, tile=tile)
            S[a:b, c:d] = block
            S[c:d, a:b] = block.T
    return S


def diagonal_noise_block(
    key: NoiseKey, d: np.ndarray, algorithm: str, ratio: float | None, i: int, j: int
) -> np.ndarray:
    """Block ``(i, j)`` (of the :func:`feature_blocks` grid) of the noise a release of a square
    query publishes with a diagonal factor ``B = diag(d)`` (standard directions).

    Exactly block ``(i, j)`` of :func:`symmetric_query_noise` with ``diagonal=True``, drawn from
    the blocks it needs only: ``(Z_ij + Z_ji^T) / 2`` for symmetric and equi-modal noise (the
    symmetrisation of the whole-matrix path, entry for entry), ``d_i N_ij`` for unimodal noise.

    Parameters
    ----------
    key : NoiseKey
        The release's noise key (its ``derive("release")`` sub-key).
    d : ndarray
        The diagonal of ``B`` (``sqrt`` of the noise variances), length ``m``.
    algorithm : {"symmetric", "equi-modal", "unimodal"}
        Noise type.
    ratio : float or None
        ``r`` of symmetric noise.
    i, j : int
        Block indices.

    Returns
    -------
    ndarray
        The block.
    """
    m = d.size
    blocks = feature_blocks(m)
    (a, b), (c, e) = blocks[i], blocks[j]
    di, dj = d[a:b], d[c:e]
    if algorithm == "unimodal":
        return _diagonal_product(di, square_normals_block(key, m, i, j), None)
    if algorithm == "symmetric":
        if ratio is None:
            raise ValueError("symmetric noise needs its ratio r")
        n_ij = symmetric_normals_block(key, m, ratio, i, j)
        n_ji = n_ij.T
    else:
        n_ij = square_normals_block(key, m, i, j)
        n_ji = n_ij if i == j else square_normals_block(key, m, j, i)
    # Z = diag(d) N diag(d) blockwise, then (Z + Z^T) / 2 entry for entry as the whole matrix
    z_ij = _diagonal_product(di, n_ij, dj)
    z_ji = _diagonal_product(dj, n_ji, di)
    return np.asarray((z_ij + z_ji.T) / 2.0)


def _core_block(
    key: NoiseKey, m: int, algorithm: str, ratio: float | None, i: int, j: int
) -> np.ndarray:
    """Block ``(i, j)`` of the normals ``M`` a square query's noise is made from: ``S``
    (symmetric), ``(N + N^T) / 2`` (equi-modal, published symmetrised), ``N`` (unimodal)."""
    if algorithm == "symmetric":
        if ratio is None:
            raise ValueError("symmetric noise needs its ratio r")
        return symmetric_normals_block(key, m, ratio, i, j)
    n_ij = square_normals_block(key, m, i, j)
    if algorithm == "unimodal":
        return n_ij
    n_ji = n_ij if i == j else square_normals_block(key, m, j, i)
    return np.asarray((n_ij + n_ji.T) / 2.0)


def low_rank_projection_block(
    key: NoiseKey, U: np.ndarray, algorithm: str, ratio: float | None, i: int
) -> np.ndarray:
    """Grid block ``i`` of the ``m x k`` projection a low-rank factor needs (first pass).

    ``(M U)_i = sum_j M_ij U_j`` for symmetric and equi-modal noise (``M`` symmetric), and
    ``(N^T U)_i = sum_j N_ji^T U_j`` for unimodal noise, summed over ``j`` in grid order: the
    bytes of block ``i`` depend only on the key, ``U`` and ``i``, never on a release's blocking.

    Parameters
    ----------
    key : NoiseKey
        The release's noise key.
    U : ndarray
        ``m x k`` directions.
    algorithm : {"symmetric", "equi-modal", "unimodal"}
        Noise type.
    ratio : float or None
        ``r`` of symmetric noise.
    i : int
        Grid block.

    Returns
    -------
    ndarray
        ``b_i x k``.
    """
    m = U.shape[0]
    blocks = feature_blocks(m)
    a, b = blocks[i]
    out = np.zeros((b - a, U.shape[1]))
    for j, (c, d) in enumerate(blocks):
        if algorithm == "unimodal":
            out += square_normals_block(key, m, j, i).T @ U[c:d]
        else:
            out += _core_block(key, m, algorithm, ratio, i, j) @ U[c:d]
    return out


def low_rank_noise_block(
    key: NoiseKey,
    U: np.ndarray,
    scale: float,
    delta: np.ndarray,
    algorithm: str,
    ratio: float | None,
    projection: np.ndarray,
    core: np.ndarray | None,
    i: int,
    j: int,
) -> np.ndarray:
    """Block ``(i, j)`` of the noise a square query's release publishes with the low-rank factor
    ``B = scale I + U diag(delta) U^T`` (``Sigma^(1/2)`` of identity-plus-low-rank directions).

    * symmetric and equi-modal noise ``B M B`` (``M`` symmetric, :func:`_core_block`), with
      ``G = M U`` and ``K = U^T G``: ``a^2 M_ij + a G_i D U_j^T + a U_i D G_j^T + U_i D K D U_j^T``
      (``D = diag(delta)``); a block below the diagonal is the transpose of its mirror and a
      diagonal block is symmetrised, so the matrix is exactly symmetric;
    * unimodal noise ``B N``, with ``H^T = N^T U``: ``a N_ij + U_i D (H^T)_j^T``.

    The same numbers as the dense ``B M B`` up to rounding, in O(b^2 k) per block from the
    ``m x k`` projection of the first pass (:func:`low_rank_projection_block`).

    Parameters
    ----------
    key : NoiseKey
        The release's noise key.
    U : ndarray
        ``m x k`` directions.
    scale : float
        ``a``.
    delta : ndarray
        Length ``k``.
    algorithm : {"symmetric", "equi-modal", "unimodal"}
        Noise type.
    ratio : float or None
        ``r`` of symmetric noise.
    projection : ndarray
        ``G`` (``m x k``; unimodal: ``H^T``).
    core : ndarray or None
        ``K`` (``k x k``, symmetric; ``None`` for unimodal noise).
    i, j : int
        Grid block.

    Returns
    -------
    ndarray
        The block.
    """
    m = U.shape[0]
    blocks = feature_blocks(m)
    (r0, r1), (c0, c1) = blocks[i], blocks[j]
    ud_i = U[r0:r1] * delta
    if algorithm == "unimodal":
        n = square_normals_block(key, m, i, j)
        return np.asarray(scale * n + ud_i @ projection[c0:c1].T)
    if i > j:
        return low_rank_noise_block(
            key, U, scale, delta, algorithm, ratio, projection, core, j, i
        ).T
    assert core is not None
    ud_j = U[c0:c1] * delta
    g_i, g_j = projection[r0:r1], projection[c0:c1]
    out = (
        scale * scale * _core_block(key, m, algorithm, ratio, i, j)
        + scale * ((g_i * delta) @ U[c0:c1].T + ud_i @ g_j.T)
        + ud_i @ core @ ud_j.T
    )
    if i == j:
        out = (out + out.T) / 2.0
    return np.asarray(out)


def _diagonal_product(left: np.ndarray, core: np.ndarray, right: np.ndarray | None) -> np.ndarray:
    """``diag(left) core`` (``diag(left) core diag(right)``) in O(m^2): the numbers of the dense
    products with diagonal factors, whose other terms are exact zeros."""
    out = left[:, None] * core
    return np.asarray(out if right is None else out * right[None, :])


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
        Z = _diagonal_product(d, symmetric_normals(key, m, ratio), d)
        return np.asarray((Z + Z.T) / 2.0)  # as the dense path: exactly symmetric
    if algorithm == "equi-modal":
        if d is None:
            Z = matrix_noise(key, factor, factor)
        else:
            Z = _diagonal_product(d, square_normals(key, m), d)
        return np.asarray((Z + Z.T) / 2.0)
    if d is None:
        return matrix_noise(key, factor, None)
    return _diagonal_product(d, square_normals(key, m), None)
