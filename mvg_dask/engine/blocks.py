"""Block functions: what one Dask task does to one chunk of records.

They are plain numpy (plus zarr for the region write) so they run on any worker, are easy to
test, and keep the graph small: one task per chunk reads, checks, clips, adds noise and writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mvg_dask.errors import DataError, MvgDaskError, ReleaseError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import record_noise

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


def abort_marker(write_store: str) -> str:
    """Path of the marker that tells the remaining tasks of a failed release to do nothing."""
    return f"{write_store.rstrip('/')}/{PROGRESS_DIR}/ABORT"


@dataclass(frozen=True)
class Outcome:
    """What a task returns: its value, or the expected error it met.

    Tasks return expected failures (bad data, an unreadable chunk) as values instead of raising
    them, so that a worker never logs a traceback for a data problem; the client raises the
    error once, as a one-line message.
    """

    value: Any = None
    error: str | None = None
    error_type: str = "DataError"
    skipped: bool = False

    def unwrap(self) -> Any:
        """The value, or raise the task's error."""
        if self.error is not None:
            raise (ReleaseError if self.error_type == "ReleaseError" else DataError)(self.error)
        return self.value

    @classmethod
    def failure(cls, exc: MvgDaskError) -> Outcome:
        """The outcome of a task that met an expected error."""
        return cls(error=str(exc), error_type=type(exc).__name__)


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
) -> Outcome:
    """One task of the identity release: read, check, clip, add MVG noise, write, mark done.

    A chunk whose marker exists (written by an earlier, interrupted run of the same release) is
    skipped: its bytes are already in place, identical to what this run would write. Once the
    release has failed (its abort marker exists) the task does nothing.

    Returns
    -------
    Outcome
        ``[clipped_count, records]`` (int64) for the client's bookkeeping, or the error.
    """
    import json

    import fsspec

    fs, marker = fsspec.core.url_to_fs(
        progress_marker(sink.store, start), **(sink.storage_options or {})
    )
    done = _read_marker(fs, marker)
    if done is not None:
        return Outcome(np.array([done["clipped"], done["records"]], dtype=np.int64))
    _, abort_path = fsspec.core.url_to_fs(abort_marker(sink.store), **(sink.storage_options or {}))
    if fs.exists(abort_path):
        return Outcome(skipped=True)
    try:
        x, clipped = clipper(source.read(start, stop), start)
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    y = record_noise(noise_key, factor, start, stop, tile=tile, n_total=n_total, diagonal=diagonal)
    y += x
    sink.write(start, stop, y)
    _write_marker(fs, marker, json.dumps({"clipped": clipped, "records": stop - start}).encode())
    return Outcome(np.array([clipped, stop - start], dtype=np.int64))


def _read_marker(fs: Any, path: str) -> dict[str, int] | None:
    """A chunk's completion marker, or ``None`` when there is none or it is unreadable (a worker
    killed while writing it): the chunk is then written again, with the same bytes."""
    import json

    try:
        done = json.loads(fs.cat_file(path))
        return {"clipped": int(done["clipped"]), "records": int(done["records"])}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _write_marker(fs: Any, path: str, payload: bytes) -> None:
    """Write a marker whole: on a local filesystem to a temporary name renamed into place (a
    worker killed mid-write leaves no truncated marker); an object store's PUT is whole."""
    import os

    if "file" in fs.protocol or "local" in fs.protocol:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
        return
    fs.pipe_file(path, payload)


def gram_task(
    start: int, stop: int, *, source: ZarrMatrix, clipper: Clipper, step: int | None = None
) -> Outcome:
    """Partial Gram matrix ``X_i X_i^T`` of the clipped records ``[start, stop)``.

    The range is read ``step`` records (one stored chunk) at a time and the chunk products are
    added in record order, so a task over many chunks holds one chunk and one ``M x M``
    accumulator, never the whole range.
    """
    step = stop - start if step is None else step
    total: np.ndarray | None = None
    clipped = 0
    for a in range(start, stop, step):
        b = min(a + step, stop)
        try:
            x, c = clipper(source.read(a, b), a)
        except MvgDaskError as exc:
            return Outcome.failure(exc)
        part = x @ x.T
        if total is None:
            total = part
        else:
            total += part
        clipped += c
    return Outcome((total, clipped))


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


#: A panel task reads at least this many records at a time (wide inputs have short chunks,
#: and the panel product is a matrix product over the records read).
PANEL_RECORDS = 256


def _read_groups(ranges: list[tuple[int, int]], records: int) -> list[tuple[int, int]]:
    """Consecutive chunk ranges merged until each holds at least ``records`` records."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] - out[-1][0] < records and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


@dataclass(frozen=True)
class PanelNoise:
    """What a covariance panel task needs to draw and describe its noise (standard directions).

    Attributes
    ----------
    key : NoiseKey
        The release's noise key (its ``derive("release")`` sub-key).
    variances : ndarray
        The per-feature noise variances ``v`` (``B = diag(sqrt(v))``).
    algorithm : str
        ``symmetric``, ``equi-modal`` or ``unimodal``.
    ratio : float or None
        ``r`` of symmetric noise.
    """

    key: NoiseKey
    variances: np.ndarray
    algorithm: str
    ratio: float | None


def covariance_panel_task(
    rows: tuple[int, int],
    *,
    source: ZarrMatrix,
    sink: str,
    storage_options: dict[str, Any] | None,
    clipper: Clipper,
    ranges: list[tuple[int, int]],
    normaliser: float,
    count: float | None,
    noise: PanelNoise,
    block: int,
) -> Outcome:
    """One row panel of a blocked covariance release: ``X[rows] X[rows:]^T``, privatized, written.

    The task streams every chunk of the input (full records: a record's clipping needs all its
    features), accumulates the panel ``rows x [rows[0], m)`` of the Gram matrix (the diagonal
    block mirrored from its upper triangle, so the output is exactly symmetric), adds the
    noise of each output block drawn from the noise grid (:func:`~mvg_dask.noise.tiles.
    diagonal_noise_block`: the same bytes as the whole-matrix path, whatever ``block``) and
    writes the panel's blocks and their transposes, with the noise description's blocks. Memory:
    one input chunk and one ``block x m`` panel. A panel whose marker exists is skipped (resume);
    once the release failed (abort marker) the task does nothing.

    Returns
    -------
    Outcome
        ``[clipped values (first panel only), 0]`` (int64), or the error.
    """
    import json

    import fsspec
    import zarr

    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, diagonal_noise_block

    r0, r1 = rows
    fs, marker = fsspec.core.url_to_fs(progress_marker(sink, r0), **(storage_options or {}))
    done = _read_marker(fs, marker)
    if done is not None:
        return Outcome(np.array([done["clipped"], done["records"]], dtype=np.int64))
    _, abort_path = fsspec.core.url_to_fs(abort_marker(sink), **(storage_options or {}))
    if fs.exists(abort_path):
        return Outcome(skipped=True)
    from scipy.linalg.blas import dgemm

    m = noise.variances.size
    acc = np.zeros((r1 - r0, m - r0))
    clipped = 0
    for a, b in _read_groups(ranges, PANEL_RECORDS):
        try:
            x, c = clipper(source.read(a, b), a)
        except MvgDaskError as exc:
            return Outcome.failure(exc)
        x = np.ascontiguousarray(x)
        # acc += X[rows] X[r0:]^T in place (BLAS beta = 1 on acc^T, Fortran-ordered): no
        # panel-sized temporary per chunk
        out = dgemm(1.0, x[r0:].T, x[r0:r1].T, beta=1.0, c=acc.T, trans_a=1, overwrite_c=1)
        if not np.shares_memory(out, acc):  # pragma: no cover - BLAS copied c
            acc[...] = out.T
        clipped += c
    h = r1 - r0
    acc[:, :h] = np.triu(acc[:, :h]) + np.triu(acc[:, :h], 1).T
    d = np.sqrt(noise.variances)
    tf = NOISE_TILE_FEATURES

    def open_(name: str) -> Any:
        return zarr.open_array(store=sink, path=name, mode="r+", storage_options=storage_options)

    cov = open_("covariance")
    gram = open_("gram") if count is not None else None
    names = ["row_cov"] + (["col_cov"] if noise.algorithm != "unimodal" else [])
    described = [open_(n) for n in names]
    directions = open_("directions")

    def grid_noise(rs: tuple[int, int], cs: tuple[int, int]) -> np.ndarray:
        """The published noise of the output region ``rs x cs`` (whole grid blocks)."""
        z = np.empty((rs[1] - rs[0], cs[1] - cs[0]))
        for i in range(rs[0] // tf, -(-rs[1] // tf)):
            for j in range(cs[0] // tf, -(-cs[1] // tf)):
                zb = diagonal_noise_block(noise.key, d, noise.algorithm, noise.ratio, i, j)
                a0, b0 = i * tf - rs[0], j * tf - cs[0]
                z[a0 : a0 + zb.shape[0], b0 : b0 + zb.shape[1]] = zb
        return z

    def put(arr: Any, rs: tuple[int, int], cs: tuple[int, int], value: np.ndarray) -> None:
        arr[rs[0] : rs[1], cs[0] : cs[1]] = value

    symmetric_noise = noise.algorithm != "unimodal"
    for c0 in range(r0, m, block):
        cs = (c0, min(c0 + block, m))
        data = acc[:, c0 - r0 : cs[1] - r0] / normaliser
        regions = [(rows, cs, data + grid_noise(rows, cs))]
        if c0 != r0:  # the mirrored block: the same data; symmetric noise is the transpose
            lower = regions[0][2].T if symmetric_noise else data.T + grid_noise(cs, rows)
            regions.append((cs, rows, lower))
        for rs, cs_, noisy in regions:
            put(cov, rs, cs_, noisy if count is None else noisy / max(count, 1.0))
            if gram is not None:
                put(gram, rs, cs_, noisy)
            if c0 == r0:
                v = noise.variances[r0:r1]
                for arr in described:
                    put(arr, rs, cs_, np.diag(v))
                put(directions, rs, cs_, np.eye(h))
            else:
                zeros = np.zeros((rs[1] - rs[0], cs_[1] - cs_[0]))
                for arr in (*described, directions):
                    put(arr, rs, cs_, zeros)
    first = r0 == 0
    _write_marker(
        fs, marker, json.dumps({"clipped": clipped if first else 0, "records": 0}).encode()
    )
    return Outcome(np.array([clipped if first else 0, 0], dtype=np.int64))
