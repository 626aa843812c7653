"""Block functions: what one Dask task does to one chunk of records.

They are plain numpy (plus zarr for the region write) so they run on any worker, are easy to
test, and keep the graph small: one task per chunk reads, checks, clips, adds noise and writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mvg_dask.errors import DataError
from mvg_dask.noise.rng import NoiseKey


@dataclass(frozen=True, eq=False)
class Clipper:
    """Checks a block against the declared record domain and clips (or rejects) violations.

    Attributes
    ----------
    kind : {"box", "l2"}
        Domain kind.
    lower, upper : ndarray or None
        Box bounds (column vectors, shape ``(M, 1)``).
    radius : float or None
        L2-ball radius.
    on_violation : {"clip", "error"}
        What to do with values outside the domain.
    """

    kind: str
    lower: np.ndarray | None
    upper: np.ndarray | None
    radius: float | None
    on_violation: str

    def __call__(self, block: np.ndarray, start: int) -> tuple[np.ndarray, int]:
        """Return the block inside the domain (float64) and the number of clipped values.

        Parameters
        ----------
        block : ndarray
            ``M x b`` (features x records).
        start : int
            Index of the block's first record (for messages).

        Returns
        -------
        tuple
            ``(block, clipped)``: clipped counts values (box) or records (L2 ball).
        """
        x = np.asarray(block, dtype=np.float64)
        stop = start + x.shape[1]
        if self.kind == "box":
            assert self.lower is not None and self.upper is not None
            lo_seen = x.min(axis=1, keepdims=True)
            hi_seen = x.max(axis=1, keepdims=True)
            if not (np.all(np.isfinite(lo_seen)) and np.all(np.isfinite(hi_seen))):
                raise _nonfinite(start, stop)
            if np.all(lo_seen >= self.lower) and np.all(hi_seen <= self.upper):
                return x, 0
            count = int(np.count_nonzero(x < self.lower) + np.count_nonzero(x > self.upper))
            if self.on_violation == "error":
                raise DataError(
                    f"{count} values of records {start}..{stop - 1} lie outside the declared "
                    "domain box; fix the data, widen domain.box, or set domain.on_violation: clip"
                )
            return np.clip(x, self.lower, self.upper), count
        assert self.radius is not None
        norms = np.sqrt(np.einsum("ij,ij->j", x, x))
        if not np.all(np.isfinite(norms)):
            raise _nonfinite(start, stop)
        over = norms > self.radius
        count = int(np.count_nonzero(over))
        if count == 0:
            return x, 0
        if self.on_violation == "error":
            raise DataError(
                f"{count} records in {start}..{stop - 1} have an L2 norm above the declared "
                "domain.l2_norm; fix the data, raise l2_norm, or set domain.on_violation: clip"
            )
        scale = np.where(over, self.radius / np.where(over, norms, 1.0), 1.0)
        return x * scale[None, :], count


def _nonfinite(start: int, stop: int) -> DataError:
    return DataError(
        f"the input has NaN or infinite values in records {start}..{stop - 1}; remove or impute "
        "them before a release (a record domain cannot bound them)"
    )


def unimodal_noise(
    key: NoiseKey,
    factor: np.ndarray,
    start: int,
    stop: int,
    *,
    tile: int,
    n_total: int,
    diagonal: bool,
) -> np.ndarray:
    """Noise ``B_Sigma N`` for records ``[start, stop)`` from the canonical tile grid.

    Tile ``t`` covers records ``[t*tile, min((t+1)*tile, n_total))`` and its normals are drawn
    whole, record-major, from ``key.generator(t)``: the noise of a record depends only on the key
    and its index, never on how the records are chunked or how often a task runs.

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
        ``M x (stop - start)`` noise.
    """
    m = factor.shape[0]
    t0, t1 = start // tile, (stop - 1) // tile
    parts = []
    for t in range(t0, t1 + 1):
        a = t * tile
        b = min(a + tile, n_total)
        parts.append(key.tile_normals(t, (b - a, m)))
    normals = parts[0] if len(parts) == 1 else np.concatenate(parts)
    normals = normals[start - t0 * tile : stop - t0 * tile]
    if diagonal:
        return np.ascontiguousarray((normals * np.diag(factor)[None, :]).T)
    return np.asarray(factor @ normals.T)


def identity_block(
    block: np.ndarray,
    *,
    start: int,
    clipper: Clipper,
    key: NoiseKey,
    factor: np.ndarray,
    tile: int,
    n_total: int,
    diagonal: bool,
    out_store: str,
    out_path: str,
    records_first: bool,
    storage_options: dict[str, Any] | None,
) -> np.ndarray:
    """One task of the identity release: read, check, clip, add MVG noise, write the region.

    Returns
    -------
    ndarray
        ``[clipped_count, records]`` (int64) for the client's bookkeeping.
    """
    import zarr

    x, clipped = clipper(block, start)
    stop = start + x.shape[1]
    y = x + unimodal_noise(key, factor, start, stop, tile=tile, n_total=n_total, diagonal=diagonal)
    arr = zarr.open_array(
        store=out_store, path=out_path, mode="r+", storage_options=storage_options
    )
    if records_first:
        arr[start:stop, :] = y.T
    else:
        arr[:, start:stop] = y
    return np.array([clipped, x.shape[1]], dtype=np.int64)


def gram_block(block: np.ndarray, *, start: int, clipper: Clipper) -> tuple[np.ndarray, int]:
    """Partial Gram matrix ``X_i X_i^T`` of the clipped block and its clipped count."""
    x, clipped = clipper(block, start)
    return x @ x.T, clipped


def combine_grams(parts: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """Combine partial Gram matrices (the tree reduction's combine step)."""
    total = parts[0][0].copy()
    count = parts[0][1]
    for g, c in parts[1:]:
        total += g
        count += c
    return total, count
