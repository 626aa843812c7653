"""Tasks of the releases with low-rank noise directions: the noise's first-pass projection, and
the four passes of a wide low-rank release on the lattice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.records import PanelReads, ZarrMatrix
from mvg_dask.engine.store import Store
from mvg_dask.engine.tasks.outcome import (
    Outcome,
    read_marker,
    write_marker,
)
from mvg_dask.engine.tasks.panels import PanelNoise
from mvg_dask.errors import MvgDaskError
from mvg_dask.noise.rng import NoiseKey

if TYPE_CHECKING:
    from mvg_dask.engine.lattice import LowRankSquareLattice


def projection_task(
    grid_blocks: tuple[int, int],
    *,
    noise_key: NoiseKey,
    U: np.ndarray,
    algorithm: str,
    ratio: float | None,
) -> np.ndarray:
    """Grid blocks ``[i0, i1)`` of the low-rank noise's first-pass projection, stacked."""
    from mvg_dask.noise.tiles import low_rank_projection_block

    return np.vstack(
        [low_rank_projection_block(noise_key, U, algorithm, ratio, i) for i in range(*grid_blocks)]
    )


# -- wide releases with low-rank directions on the lattice ---------------------------------------
def _grid_rows(rows: tuple[int, int]) -> list[tuple[int, int]]:
    """The noise grid's row blocks of a panel (a panel is whole grid blocks but for the last)."""
    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES

    step = NOISE_TILE_FEATURES
    return [(a, min(a + step, rows[1])) for a in range(rows[0], rows[1], step)]


def _gram_rows(
    rows: tuple[int, int],
    m: int,
    source: ZarrMatrix,
    clipper: Clipper,
    reads: PanelReads,
    inner: int,
) -> tuple[list[np.ndarray], int] | Outcome:
    """Full-width rows ``X[rows] X^T`` of the clipped records, one accumulator per grid block of
    rows (the same BLAS call for a grid block whatever the panel), summed as
    :func:`~mvg_dask.engine.tasks.panels._gram_panel` sums a lattice panel (``inner`` groups per
    fold); or the data's error."""
    from scipy.linalg.blas import dgemm

    grid = _grid_rows(rows)
    acc = [np.zeros((b - a, m)) for a, b in grid]
    part = [np.zeros_like(x) for x in acc]
    clipped = 0
    try:
        for n, (_, x, c) in enumerate(reads.groups(source, clipper)):
            for (r0, r1), p in zip(grid, part, strict=True):
                out = dgemm(1.0, x.T, x[r0:r1].T, beta=1.0, c=p.T, trans_a=1, overwrite_c=1)
                if not np.shares_memory(out, p):  # pragma: no cover - BLAS copied c
                    p[...] = out.T
            clipped += c
            if (n + 1) % inner == 0:
                for s, p in zip(acc, part, strict=True):
                    s += p
                    p[...] = 0.0
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    for s, p in zip(acc, part, strict=True):
        s += p
    return acc, clipped


def low_rank_projection_task(
    rows: tuple[int, int],
    *,
    source: ZarrMatrix,
    clipper: Clipper,
    reads: PanelReads,
    normaliser: float,
    lattice: LowRankSquareLattice,
    inner: int,
) -> Outcome:
    """First pass of a wide low-rank lattice release: the panel's parts ``U[gb]^T f[gb]`` of
    ``P = U^T f``, one per grid block of its rows (``len x k x m``), for the client to sum in
    grid order."""
    m = lattice.basis.shape[0]
    got = _gram_rows(rows, m, source, clipper, reads, inner)
    if isinstance(got, Outcome):
        return got
    acc, _ = got
    parts = [
        lattice.projection(s / normaliser, slice(a, b))
        for (a, b), s in zip(_grid_rows(rows), acc, strict=True)
    ]
    return Outcome(np.stack(parts))


def low_rank_lattice_task(
    rows: tuple[int, int],
    *,
    source: ZarrMatrix,
    sink: str,
    storage_options: dict[str, Any] | None,
    clipper: Clipper,
    reads: PanelReads,
    normaliser: float,
    lattice: LowRankSquareLattice,
    inner: int,
    P: np.ndarray,
) -> Outcome:
    """Second pass: the panel's rows of the whitened query ``g`` (from ``P = U^T f``), rounded
    to the grid with the noise's integers added (``2^k t``, grid block by grid block), written
    to the scratch array ``gram`` at ``sink`` (symmetric noise: the blocks on and above the
    diagonal and their mirrors).

    Returns
    -------
    Outcome
        ``[clipped values (first panel only), 0]`` (int64), or the error.
    """
    import zarr

    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, feature_blocks

    m = lattice.basis.shape[0]
    got = _gram_rows(rows, m, source, clipper, reads, inner)
    if isinstance(got, Outcome):
        return got
    acc, clipped = got
    arr = zarr.open_array(store=sink, path="gram", mode="r+", storage_options=storage_options)
    blocks = feature_blocks(m)
    symmetric = lattice.algorithm == "symmetric"
    for (a, b), s in zip(_grid_rows(rows), acc, strict=True):
        g = lattice.whitened(s / normaliser, slice(a, b), P)
        i = a // NOISE_TILE_FEATURES
        first = i if symmetric else 0
        T = np.empty((b - a, m - blocks[first][0]))
        for j in range(first, len(blocks)):
            c, d = blocks[j]
            T[:, c - blocks[first][0] : d - blocks[first][0]] = lattice.lattice_block(
                np.ascontiguousarray(g[:, c:d]), i, j
            )
        arr[a:b, blocks[first][0] :] = T
        if symmetric and b < m:
            arr[b:, a:b] = T[:, b - a :].T
    return Outcome(np.array([clipped if rows[0] == 0 else 0, 0], dtype=np.int64))


def low_rank_products_task(
    rows: tuple[int, int],
    *,
    sink: str,
    storage_options: dict[str, Any] | None,
    basis: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Third pass: the panel's parts ``U[gb]^T T[gb]`` of ``R = U^T T`` (``len x k x m``) and its
    rows of ``T U``, grid block by grid block, from the scratch array."""
    import zarr

    arr = zarr.open_array(store=sink, path="gram", mode="r", storage_options=storage_options)
    parts, tu = [], []
    for a, b in _grid_rows(rows):
        T = np.asarray(arr[a:b, :])
        parts.append(basis[a:b].T @ T)
        tu.append(T @ basis)
    return np.stack(parts), np.vstack(tu)


def low_rank_publish_task(
    rows: tuple[int, int],
    *,
    scratch: str,
    sink: str,
    storage_options: dict[str, Any] | None,
    lattice: LowRankSquareLattice,
    R: np.ndarray,
    TU: np.ndarray,
    S: np.ndarray,
    count: float | None,
    noise: PanelNoise,
) -> Outcome:
    """Last pass: the panel's rows of the published ``A T A^T`` (equi-modal: symmetrised with
    its columns; unimodal: ``A T``), written with their mirrors for the symmetric noises, with
    the noise description's blocks. A panel whose marker exists is skipped (resume); once the
    release failed (abort marker) the task does nothing.

    Returns
    -------
    Outcome
        ``[0, 0]`` (int64): the clipped values were counted by the second pass.
    """
    import zarr

    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, feature_blocks

    r0 = rows[0]
    target = Store(sink, storage_options)
    fs, marker = target.fs, target.chunk_marker(r0)
    if read_marker(fs, marker) is not None:
        return Outcome(np.array([0, 0], dtype=np.int64))
    if fs.exists(target.abort_marker):
        return Outcome(skipped=True)
    m = lattice.basis.shape[0]
    blocks = feature_blocks(m)
    T_arr = zarr.open_array(store=scratch, path="gram", mode="r", storage_options=storage_options)

    def open_(name: str) -> Any:
        return zarr.open_array(store=sink, path=name, mode="r+", storage_options=storage_options)

    cov = open_("covariance")
    gram = open_("gram") if count is not None else None
    names = ["row_cov"] + (["col_cov"] if lattice.algorithm != "unimodal" else [])
    described = [open_(n) for n in names]
    two_sided = lattice.algorithm != "unimodal"
    for a, b in _grid_rows(rows):
        i = a // NOISE_TILE_FEATURES
        out = lattice.published_rows(np.asarray(T_arr[a:b, :]), slice(a, b), R, TU[a:b], S)
        if lattice.algorithm == "equi-modal":
            cols = lattice.published_columns(np.asarray(T_arr[:, a:b]), slice(a, b), R, TU, S)
            out = (out + cols.T) / 2.0
        start = blocks[i][0] if two_sided else 0
        noisy = out[:, start:]
        if two_sided:  # the diagonal block from its upper triangle: exactly symmetric
            h = b - a
            noisy[:, :h] = np.triu(noisy[:, :h]) + np.triu(noisy[:, :h], 1).T
        # grid block by grid block: the noise description's diagonal blocks are (rs, rs)
        regions = []
        for c, d in blocks[i if two_sided else 0 :]:
            value = noisy[:, c - start : d - start]
            regions.append(((a, b), (c, d), value))
            if two_sided and c >= b:
                regions.append(((c, d), (a, b), value.T))
        for (p, q), (c, d), value in regions:
            cov[p:q, c:d] = value if count is None else value / max(count, 1.0)
            if gram is not None:
                gram[p:q, c:d] = value
            sigma = noise.covariance((p, q), (c, d))
            for arr in described:
                arr[p:q, c:d] = sigma
    write_marker(fs, marker, b'{"clipped": 0, "records": 0}')
    return Outcome(np.array([0, 0], dtype=np.int64))
