"""Direct reads of whole stored chunks of a local Zarr v3 array (the release's input fast path).

Reading one stored chunk through ``zarr.open_array(...)[:, a:b]`` costs about half as much again
as decoding the chunk's bytes: the array is opened (its metadata parsed, an event loop entered)
for every task, and the decoded chunk is copied once more into the selection's output array. For
the common input layout, a local Zarr v3 array of float64 or float32 with a regular chunk grid
and only the ``bytes`` codec (little endian) optionally followed by ``zstd``, a read of whole
stored chunks decodes each chunk file straight into the returned array instead. Writing one
whole uncompressed chunk (the release's default output codec) likewise writes its bytes the way
zarr's local store does (a temporary file renamed into place), without opening the array.

Anything else (another codec, sharding, a remote store, a missing chunk, a range that does not
start and end on chunk boundaries, a chunk that may equal the fill value) falls back to zarr, so
the fast path never changes a result: ``tests/test_chunks.py`` compares it byte for byte with
zarr, reads and writes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from mvg_dask.engine.store import Store

_DTYPES = {"float64": "<f8", "float32": "<f4"}


@dataclass(frozen=True)
class ChunkLayout:
    """What a direct read needs to know about a stored array.

    Attributes
    ----------
    root : str
        Directory of the array.
    shape, chunks : tuple of int
        Array and chunk shape (two dimensions).
    dtype : numpy.dtype
        Little-endian element type.
    zstd : bool
        True when the chunks are zstd frames (else raw bytes).
    separator : str
        Chunk key separator of the default encoding.
    fill : float or None
        The fill value (``None`` when it is not a plain number: no direct writes).
    """

    root: str
    shape: tuple[int, int]
    chunks: tuple[int, int]
    dtype: np.dtype[Any]
    zstd: bool
    separator: str
    fill: float | None

    def chunk_path(self, i: int, j: int) -> str:
        """File of chunk ``(i, j)``."""
        sep = self.separator
        return os.path.join(self.root, "c" + sep + str(i) + sep + str(j))


def _local_root(store: str, path: str) -> str | None:
    """The array directory of a local store, or ``None`` for a remote one."""
    where = Store(store)
    if not where.local:
        return None
    return os.path.join(where.path, path) if path else str(where.path)


def layout(store: str, path: str, storage_options: dict[str, Any] | None) -> ChunkLayout | None:
    """The direct-read layout of ``store/path``, or ``None`` when zarr must read it.

    Parameters
    ----------
    store : str
        Store path or URL.
    path : str
        Array path inside the store.
    storage_options : dict or None
        fsspec options (any makes the store remote for this purpose).

    Returns
    -------
    ChunkLayout or None
        Cached per metadata file version (its inode, size and modification time).
    """
    if storage_options:
        return None
    root = _local_root(store, path)
    if root is None:
        return None
    meta = os.path.join(root, "zarr.json")
    try:
        st = os.stat(meta)
    except OSError:
        return None
    return _parse(root, st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _parse(root: str, inode: int, size: int, mtime_ns: int) -> ChunkLayout | None:
    # ``inode``, ``size`` and ``mtime_ns`` key the cache: a rewritten array is parsed again
    try:
        with open(os.path.join(root, "zarr.json"), "rb") as f:
            meta = json.loads(f.read())
        return _from_metadata(root, meta)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _from_metadata(root: str, meta: dict[str, Any]) -> ChunkLayout | None:
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        return None
    if meta.get("storage_transformers") or meta.get("data_type") not in _DTYPES:
        return None
    shape = tuple(int(s) for s in meta["shape"])
    grid = meta["chunk_grid"]
    if grid["name"] != "regular" or len(shape) != 2:
        return None
    chunks = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
    encoding = meta["chunk_key_encoding"]
    if encoding["name"] != "default":
        return None
    separator = encoding.get("configuration", {}).get("separator", "/")
    codecs = meta["codecs"]
    if not codecs or codecs[0]["name"] != "bytes":
        return None
    if codecs[0].get("configuration", {}).get("endian", "little") != "little":
        return None
    rest = [c["name"] for c in codecs[1:]]
    if rest not in ([], ["zstd"]):
        return None
    if len(chunks) != 2 or min(chunks) <= 0:
        return None
    fill = meta.get("fill_value")
    named = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
    if isinstance(fill, str):
        fill_value = named.get(fill)  # a hex form stays None: no direct writes
    elif isinstance(fill, int | float):
        fill_value = float(fill)
    else:
        return None
    return ChunkLayout(
        root=root,
        shape=(shape[0], shape[1]),
        chunks=(chunks[0], chunks[1]),
        dtype=np.dtype(_DTYPES[meta["data_type"]]),
        zstd=bool(rest),
        separator=separator,
        fill=fill_value,
    )


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def frame_content_size(frame: bytes) -> int | None:
    """The decompressed size a zstd frame's header declares (RFC 8878, 3.1.1.1), or ``None``
    when the header does not declare it (or this is not a single zstd frame header)."""
    if len(frame) < 6 or frame[:4] != _ZSTD_MAGIC:
        return None
    descriptor = frame[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    pos = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or len(frame) < pos + width:
        return None
    size = int.from_bytes(frame[pos : pos + width], "little")
    return size + 256 if width == 2 else size


#: Chunk files up to this size are read into one buffer per thread, reused from chunk to chunk.
SCRATCH_BYTES = 2**26
_scratch = threading.local()


def _file_bytes(path: str) -> memoryview:
    """The bytes of the file at ``path``, in this thread's reusable buffer (valid until the
    thread's next call).

    A fresh ``bytes`` per chunk (``f.read()``) costs as much again as decoding a raw-literal zstd
    chunk: next to the decoded array it is a second large allocation per chunk, mapped and
    faulted in page by page; read into a buffer the thread keeps, it costs the copy only.
    """
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf: bytearray | None = getattr(_scratch, "buf", None)
        if buf is None or len(buf) < size:
            buf = bytearray(size)
            if size <= SCRATCH_BYTES:
                _scratch.buf = buf
        view = memoryview(buf)[:size]
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
    return view[:got]


def _decode(lay: ChunkLayout, i: int, j: int) -> np.ndarray | None:
    """Stored chunk ``(i, j)`` as a writable array of the chunk shape, ``None`` if absent."""
    path = lay.chunk_path(i, j)
    out = np.empty(lay.chunks, dtype=lay.dtype)
    if not lay.zstd:  # raw bytes: read straight into the array
        try:
            with open(path, "rb", buffering=0) as f:
                held = os.fstat(f.fileno()).st_size
                if held != out.nbytes:
                    raise ValueError(f"chunk {i},{j} holds {held} bytes, expected {out.nbytes}")
                target = memoryview(out.data).cast("B")
                got = 0
                while got < held:
                    n = f.readinto(target[got:])
                    if not n:
                        raise ValueError(f"chunk {i},{j} holds {got} bytes, expected {held}")
                    got += n
        except FileNotFoundError:
            return None  # a chunk equal to the fill value is not stored: zarr knows it
        return out
    try:
        raw = _file_bytes(path)
    except FileNotFoundError:
        return None  # a chunk equal to the fill value is not stored: zarr knows its fill value
    from numcodecs import Zstd

    size = frame_content_size(bytes(raw[:18]))
    if size is None:  # no size in the frame header: decode to a new buffer, then check
        decoded = Zstd().decode(raw)
        size = len(decoded)
        if size == out.nbytes:
            out.reshape(-1).view(np.uint8)[:] = np.frombuffer(decoded, dtype=np.uint8)
            return out
    if size != out.nbytes:
        raise ValueError(f"chunk {i},{j} decodes to {size} bytes, expected {out.nbytes}")
    Zstd().decode(raw, out=out)
    return out


def read_rows(lay: ChunkLayout, axis: int, start: int, stop: int) -> np.ndarray | None:
    """Indices ``[start, stop)`` along ``axis`` (every index of the other), in stored
    orientation, decoded chunk by chunk; ``None`` unless the range is whole stored chunks and
    every chunk is stored.

    Parameters
    ----------
    lay : ChunkLayout
        The array.
    axis : int
        The sliced dimension (0 or 1).
    start, stop : int
        The range; ``start`` on a chunk boundary, ``stop`` on one or at the array's end.

    Returns
    -------
    ndarray or None
        The selection, or ``None`` when zarr must read it.
    """
    c = lay.chunks[axis]
    n = lay.shape[axis]
    if not (0 <= start < stop <= n) or start % c or (stop % c and stop != n):
        return None
    other = 1 - axis
    co, no = lay.chunks[other], lay.shape[other]
    j0, j1 = start // c, -(-stop // c)
    ni = -(-no // co)
    single = j1 - j0 == 1 and ni == 1
    out: np.ndarray | None = None
    for j in range(j0, j1):
        for i in range(ni):
            idx = (i, j) if axis == 1 else (j, i)
            block = _decode(lay, *idx)
            if block is None:
                return None
            # the valid part of the chunk (edge chunks are stored padded to the chunk shape)
            a, b = j * c, min((j + 1) * c, stop)
            p, q = i * co, min((i + 1) * co, no)
            valid = block[: q - p, : b - a] if axis == 1 else block[: b - a, : q - p]
            if single:
                return valid
            if out is None:
                shape = (no, stop - start) if axis == 1 else (stop - start, no)
                out = np.empty(shape, dtype=lay.dtype)
            if axis == 1:
                out[p:q, a - start : b - start] = valid
            else:
                out[a - start : b - start, p:q] = valid
    return out


def write_rows(lay: ChunkLayout, axis: int, start: int, stop: int, values: np.ndarray) -> bool:
    """Write indices ``[start, stop)`` along ``axis`` as one whole uncompressed stored chunk.

    Parameters
    ----------
    lay : ChunkLayout
        The array.
    axis : int
        The sliced dimension (0 or 1).
    start, stop : int
        Exactly one interior or full-size chunk along ``axis``.
    values : ndarray
        The chunk, in stored orientation.

    Returns
    -------
    bool
        False when zarr must write it: another codec, more than one chunk, a padded edge
        chunk, or a first value equal to the fill value (zarr does not store a chunk that is
        all fill value; the caller then lets zarr decide).
    """
    c = lay.chunks[axis]
    other = 1 - axis
    if lay.zstd or lay.fill is None or lay.chunks[other] != lay.shape[other]:
        return False
    if start % c or stop - start != c or stop > lay.shape[axis]:
        return False
    data = np.ascontiguousarray(values, dtype=lay.dtype)
    if data.shape != lay.chunks:
        return False
    first = float(data.flat[0])
    if first == lay.fill or (np.isnan(first) and np.isnan(lay.fill)):
        return False
    path = lay.chunk_path(0, start // c) if axis == 1 else lay.chunk_path(start // c, 0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(data.data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True
