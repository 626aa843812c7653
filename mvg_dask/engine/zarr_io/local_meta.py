"""A local Zarr v3 store's array metadata from its ``zarr.json`` files, without importing zarr.

A dry run reads metadata only, and ``import zarr`` alone costs more CPU than the rest of a
small dry run (its codec registry imports numcodecs, fsspec and asyncio). The metadata of a
local v3 store is JSON: the root group's ``zarr.json`` (with the children's metadata when it is
consolidated) and one ``zarr.json`` per array. :func:`local_arrays` reads them as zarr would
(``zarr.open_group(store, mode="r").arrays()``: the consolidated metadata when the root has it,
else the child directories), and :meth:`LocalArray.read` reads a small one-chunk coordinate
variable (the feature names) through the codecs zarr writes by default.

Anything else (a Zarr v2 store, sharding, a chunk key encoding, codec or data type not listed
here, a missing or unreadable file) raises :class:`Unsupported`, and the caller opens the store
with zarr as before: this is a shortcut for the common case, never a second reading of the
format. ``tests/test_local_meta.py`` compares it with zarr.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

#: Codecs of zarr's own registry that a store's arrays may name here; any other name (a codec
#: zarr may not know) is left to zarr, which refuses it when it does not
KNOWN_CODECS = frozenset(
    ["bytes", "vlen-utf8", "vlen-bytes", "zstd", "gzip", "blosc", "transpose", "crc32c"]
)
#: Zarr v3 ``data_type`` names read here, as numpy dtypes (``string``: variable-length UTF-8)
NUMERIC_TYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
)


class Unsupported(Exception):
    """The store is not one this module reads: open it with zarr."""


@dataclass(frozen=True)
class LocalArray:
    """One array's metadata (the attributes :mod:`mvg_dask.engine.metadata` uses of a zarr
    array) and its directory.

    Parameters
    ----------
    path : Path
        The array's directory.
    meta : dict
        Its ``zarr.json``.
    """

    path: Path
    meta: dict[str, Any]

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return tuple(int(n) for n in self.meta["shape"])

    @property
    def chunks(self) -> tuple[int, ...]:
        """The regular chunk grid's chunk shape."""
        return tuple(int(n) for n in self.meta["chunk_grid"]["configuration"]["chunk_shape"])

    @property
    def dims(self) -> tuple[str, ...] | None:
        """``dimension_names``, else the ``_ARRAY_DIMENSIONS`` attribute (as zarr reads them)."""
        names = self.meta.get("dimension_names")
        if names is None:
            names = self.meta.get("attributes", {}).get("_ARRAY_DIMENSIONS")
        return None if names is None else tuple(str(n) for n in names)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype of a numeric ``data_type`` (:class:`Unsupported` for others)."""
        name = self.meta["data_type"]
        if not isinstance(name, str) or name not in NUMERIC_TYPES:
            raise Unsupported(f"data type {name!r}")
        dtype = np.dtype(name)
        first = (self.meta.get("codecs") or [{}])[0]
        endian = (first.get("configuration") or {}).get("endian", "little")
        if dtype.itemsize > 1 and (first.get("name") != "bytes" or endian != "little"):
            raise Unsupported("not little-endian bytes")  # zarr's dtype says the byte order
        return dtype

    def __getitem__(self, key: Any) -> np.ndarray:
        """``array[...]``: :meth:`read`."""
        if key is not Ellipsis:
            raise Unsupported("only [...] is read")
        return self.read()

    def read(self) -> np.ndarray:
        """The values of a 1-D array stored in one chunk (numeric or ``string``).

        Raises
        ------
        Unsupported
            Another layout, codec or data type, or a missing chunk (zarr reads it as the fill
            value).
        """
        shape = self.shape
        if len(shape) != 1 or shape[0] > self.chunks[0]:
            raise Unsupported("not a 1-D array in one chunk")
        codecs = list(self.meta.get("codecs", []))
        try:
            data = (self.path / _chunk_key(self.meta)).read_bytes()
        except OSError:
            raise Unsupported("chunk not readable") from None
        try:
            return self._decode(data, codecs, shape[0])
        except Unsupported:
            raise
        except Exception:  # a chunk that does not decode: zarr reads it, or says why not
            raise Unsupported("chunk does not decode") from None

    def _decode(self, data: bytes, codecs: list[Any], n: int) -> np.ndarray:
        for codec in reversed(codecs[1:]):
            data = _bytes_codec(codec, data)
        first = codecs[0] if codecs else {}
        if self.meta["data_type"] == "string" and first.get("name") == "vlen-utf8":
            return np.array(_vlen_utf8(data, self.chunks[0])[:n], dtype=object)
        if first.get("name") != "bytes":
            raise Unsupported(f"codec {first.get('name')!r}")
        dtype = self.dtype.newbyteorder("<")
        return np.frombuffer(data, dtype=dtype, count=self.chunks[0])[:n].copy()


def local_arrays(root: Path) -> dict[str, LocalArray]:
    """The arrays of the local Zarr v3 group at ``root``, by name, as
    ``dict(zarr.open_group(root, mode="r").arrays())`` lists them.

    Raises
    ------
    Unsupported
        Not a v3 group this module reads (the caller opens it with zarr).
    """
    group = _json(root / "zarr.json")
    if group.get("zarr_format") != 3 or group.get("node_type") != "group":
        raise Unsupported("not a Zarr v3 group")
    consolidated = group.get("consolidated_metadata")
    if consolidated is not None:
        children = {
            name: meta
            for name, meta in (consolidated.get("metadata") or {}).items()
            if "/" not in name
        }
    else:
        children = {}
        for child in root.iterdir():
            if child.name == "zarr.json":
                continue
            if not child.is_dir():
                raise Unsupported(f"unexpected file {child.name}")
            children[child.name] = _json(child / "zarr.json")
    arrays = {}
    for name, meta in sorted(children.items()):
        if meta.get("node_type") == "group":
            continue
        _check_array(meta)
        arrays[name] = LocalArray(root / name, meta)
    return arrays


def _json(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError):
        raise Unsupported(f"cannot read {path}") from None
    if not isinstance(meta, dict):
        raise Unsupported(f"{path} is not a JSON object")
    return meta


def _check_array(meta: dict[str, Any]) -> None:
    """Refuse (:class:`Unsupported`) an array's metadata other than the plain layout read here."""
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise Unsupported("not a Zarr v3 array")
    grid = meta.get("chunk_grid") or {}
    if grid.get("name") != "regular" or meta.get("storage_transformers"):
        raise Unsupported("not a regular chunk grid")
    names = [c.get("name") for c in meta.get("codecs", []) if isinstance(c, dict)]
    if "sharding_indexed" in names or len(names) != len(meta.get("codecs", [])):
        raise Unsupported("sharded array")
    if not set(names) <= KNOWN_CODECS:
        raise Unsupported("a codec zarr must resolve")  # zarr's registry says if it exists
    if meta.get("data_type") not in NUMERIC_TYPES | {"string"}:
        raise Unsupported("a data type zarr must resolve")
    if len(meta.get("shape", ())) != len(grid.get("configuration", {}).get("chunk_shape", ())):
        raise Unsupported("chunk shape")


def _chunk_key(meta: dict[str, Any]) -> str:
    """The key of chunk 0 of a 1-D array."""
    encoding = meta.get("chunk_key_encoding") or {}
    separator = (encoding.get("configuration") or {}).get("separator", "/")
    if encoding.get("name") == "default" and separator in "/.":
        return f"c{separator}0"
    if encoding.get("name") == "v2":
        return "0"
    raise Unsupported("chunk key encoding")


def _bytes_codec(codec: dict[str, Any], data: bytes) -> bytes:
    """Undo one bytes-to-bytes codec (zstd or gzip)."""
    name = codec.get("name")
    if name == "zstd":
        return bytes(_zstd().decompress(data))
    if name == "gzip":
        import gzip

        return gzip.decompress(data)
    raise Unsupported(f"codec {name!r}")


def _vlen_utf8(data: bytes, n: int) -> list[str]:
    """numcodecs' ``VLenUTF8`` encoding: a little-endian uint32 item count, then each item's
    uint32 byte length and UTF-8 bytes."""
    view = memoryview(data)
    if len(view) < 4 or int.from_bytes(view[:4], "little") != n:
        raise Unsupported("vlen-utf8 chunk")
    out, pos = [], 4
    for _ in range(n):
        size = int.from_bytes(view[pos : pos + 4], "little")
        out.append(bytes(view[pos + 4 : pos + 4 + size]).decode("utf-8"))
        pos += 4 + size
    if pos != len(view):
        raise Unsupported("vlen-utf8 chunk")
    return out


@functools.cache
def _zstd() -> ModuleType:
    """numcodecs' ``zstd`` module (the decoder zarr calls), imported as usual.

    Its package's ``__init__`` registers every codec, which costs a dry run some 0.05 s; loading
    the compiled module alone under a stand-in package was cheaper, but the compiled module is
    loaded once per process, so its ``Zstd`` kept the stand-in's ``numcodecs.abc.Codec`` as its
    base and was no longer an instance of the real one when numcodecs was imported later.
    """
    if importlib.util.find_spec("numcodecs") is None:
        raise Unsupported("numcodecs is not installed")
    return importlib.import_module("numcodecs.zstd")
