"""Block functions: what one Dask task does to one chunk of records.

They are plain numpy (plus zarr for the region write) so they run on any worker, are easy to
test, and keep the graph small: one task per chunk reads, checks, clips, adds noise and writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mvg_dask.errors import DataError, ReleaseError
from mvg_dask.noise.rng import NoiseKey

PROGRESS_DIR = ".mvg_dask_progress"


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

    Tile ``t`` covers records ``[t*tile, min((t+1)*tile, n_total))``; its normals are drawn
    whole, as an ``M x tile`` C-ordered matrix, from ``key.generator(t)``. The noise of a record
    therefore depends only on the key and its index, never on how the records are chunked or
    how often a task runs.

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
    """
    m = factor.shape[0]
    t0, t1 = start // tile, (stop - 1) // tile
    parts = []
    for t in range(t0, t1 + 1):
        a = t * tile
        b = min(a + tile, n_total)
        normals = key.tile_normals(t, (m, b - a))
        lo, hi = max(start - a, 0), min(stop, b) - a
        parts.append(normals if (lo, hi) == (0, b - a) else normals[:, lo:hi])
    N = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
    if diagonal:
        N *= np.diag(factor)[:, None]  # N is fresh (or a view of a fresh tile): scale in place
        return N
    return np.asarray(factor @ N)


@dataclass(frozen=True)
class ZarrMatrix:
    """A 2-D Zarr array seen as ``features x records``, read and written by record ranges.

    Attributes
    ----------
    store : str
        Store path or URL.
    path : str
        Array path inside the store (the variable name).
    records_first : bool
        True when the stored array is ``records x features``.
    storage_options : dict or None
        fsspec options.
    """

    store: str
    path: str
    records_first: bool
    storage_options: dict[str, Any] | None = None

    def _open(self, mode: str) -> Any:
        import zarr

        return zarr.open_array(
            store=self.store, path=self.path, mode=mode, storage_options=self.storage_options
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        """Records ``[start, stop)`` as an ``M x b`` array; a failed read is a ReleaseError."""
        try:
            arr = self._open("r")
            if self.records_first:
                return np.asarray(arr[start:stop, :]).T
            return np.asarray(arr[:, start:stop])
        except Exception as exc:
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise ReleaseError(
                f"input chunk with records {start}..{stop - 1} of {self.store}/{self.path} "
                f"cannot be read ({type(exc).__name__}: {detail}); restore the input store"
            ) from None

    def write(self, start: int, stop: int, values: np.ndarray) -> None:
        """Write records ``[start, stop)`` from an ``M x b`` array (whole chunks only)."""
        arr = self._open("r+")
        if self.records_first:
            arr[start:stop, :] = values.T
        else:
            arr[:, start:stop] = values


def progress_marker(write_store: str, start: int) -> str:
    """Path of the marker that says the chunk starting at ``start`` is written."""
    return f"{write_store.rstrip('/')}/{PROGRESS_DIR}/{start}.json"


def identity_task(
    start: int,
    stop: int,
    *,
    source: ZarrMatrix,
    sink: ZarrMatrix,
    clipper: Clipper,
    noise_key: NoiseKey,
    factor: np.ndarray,
    tile: int,
    n_total: int,
    diagonal: bool,
) -> np.ndarray:
    """One task of the identity release: read, check, clip, add MVG noise, write, mark done.

    A chunk whose marker exists (written by an earlier, interrupted run of the same release) is
    skipped: its bytes are already in place, identical to what this run would write.

    Returns
    -------
    ndarray
        ``[clipped_count, records]`` (int64) for the client's bookkeeping.
    """
    import json

    import fsspec

    fs, marker = fsspec.core.url_to_fs(
        progress_marker(sink.store, start), **(sink.storage_options or {})
    )
    if fs.exists(marker):
        done = json.loads(fs.cat_file(marker))
        return np.array([done["clipped"], done["records"]], dtype=np.int64)
    x, clipped = clipper(source.read(start, stop), start)
    y = unimodal_noise(
        noise_key, factor, start, stop, tile=tile, n_total=n_total, diagonal=diagonal
    )
    y += x
    sink.write(start, stop, y)
    fs.pipe_file(marker, json.dumps({"clipped": clipped, "records": stop - start}).encode())
    return np.array([clipped, stop - start], dtype=np.int64)


def gram_task(
    start: int, stop: int, *, source: ZarrMatrix, clipper: Clipper
) -> tuple[np.ndarray, int]:
    """Partial Gram matrix ``X_i X_i^T`` of the clipped records ``[start, stop)``."""
    x, clipped = clipper(source.read(start, stop), start)
    return x @ x.T, clipped


def combine_grams(parts: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """Combine partial Gram matrices in the order given (the tree reduction's combine step)."""
    total = parts[0][0].copy()
    count = parts[0][1]
    for g, c in parts[1:]:
        total += g
        count += c
    return total, count
