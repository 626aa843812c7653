"""Direct chunk reads and writes (``mvg_dask.engine.zarr_io.chunks``) against zarr, byte for byte.

The fast path may only ever change speed: every read equals zarr's selection, every chunk file
it writes equals the file zarr writes for the same values, and every layout it does not know
falls back to zarr (the fast path answers ``None`` / ``False``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from mvg_dask.engine.records import ZarrMatrix
from mvg_dask.engine.zarr_io.chunks import layout, read_rows, write_rows
from mvg_dask.errors import ReleaseError


def _array(path: Path, values: np.ndarray, chunks: tuple[int, int], **kw: object) -> str:
    kw.setdefault("fill_value", np.nan)
    arr = zarr.create_array(
        store=str(path), shape=values.shape, chunks=chunks, dtype=values.dtype, **kw
    )
    arr[...] = values
    return str(path)


LAYOUTS = [
    # (records_first, dtype, chunks in stored orientation, compressors)
    (False, np.float64, (7, 10), "zstd"),
    (False, np.float64, (7, 10), None),
    (False, np.float32, (7, 10), "zstd"),
    (False, np.float64, (3, 10), "zstd"),  # feature-chunked: 3 chunks across 7 features
    (True, np.float64, (10, 7), "zstd"),
    (True, np.float32, (10, 2), None),
    (False, np.float64, (7, 10), "zstd-1"),  # write_matrix's level: literals stored raw
]


@pytest.mark.parametrize(("records_first", "dtype", "chunks", "codec"), LAYOUTS)
def test_reads_equal_zarr(tmp_path, records_first, dtype, chunks, codec):
    """Every range of records (aligned or not, edge chunk included) reads the same values as
    zarr; the aligned ones take the direct path."""
    rng = np.random.default_rng(5)
    m, n = 7, 47  # the last record chunk is short (padded in storage)
    x = rng.random((m, n)).astype(dtype)
    stored = x.T if records_first else x
    compressors = [ZstdCodec(level=-1 if codec == "zstd-1" else 0)] if codec else None
    store = _array(
        tmp_path / "a.zarr", np.ascontiguousarray(stored), chunks, compressors=compressors
    )
    src = ZarrMatrix(store, "", records_first)
    arr = zarr.open_array(store=store, mode="r")
    lay = layout(store, "", None)
    assert lay is not None and lay.zstd == bool(codec)
    axis = 0 if records_first else 1
    direct = 0
    for a in range(0, n, 5):
        for b in range(a + 1, n + 1):
            want = np.asarray(arr[a:b, :]).T if records_first else np.asarray(arr[:, a:b])
            got = src.read(a, b)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
            fast = read_rows(lay, axis, a, b)
            aligned = a % 10 == 0 and (b % 10 == 0 or b == n)
            assert (fast is not None) == aligned
            direct += fast is not None
    assert direct >= 10
    # a direct read is writable, like zarr's
    got = src.read(0, 10)
    got[0, 0] = 2.0


def test_unknown_layouts_fall_back(tmp_path):
    x = np.random.default_rng(1).random((4, 30))
    blosc = _array(tmp_path / "b.zarr", x, (4, 10), compressors=[BloscCodec()])
    assert layout(blosc, "", None) is None
    sharded = str(tmp_path / "s.zarr")
    arr = zarr.create_array(store=sharded, shape=x.shape, chunks=(4, 5), shards=(4, 10), dtype="f8")
    arr[...] = x
    assert layout(sharded, "", None) is None
    v2 = str(tmp_path / "v2.zarr")
    arr = zarr.create_array(store=v2, shape=x.shape, chunks=(4, 10), dtype="f8", zarr_format=2)
    arr[...] = x
    assert layout(v2, "", None) is None
    ints = _array(tmp_path / "i.zarr", (x * 100).astype(np.int32), (4, 10), fill_value=0)
    assert layout(ints, "", None) is None
    plain = _array(tmp_path / "p.zarr", x, (4, 10))
    assert layout(plain, "", {"auto_mkdir": True}) is None  # fsspec options: zarr reads it
    assert layout("memory://p.zarr", "", None) is None
    assert layout(f"file://{plain}", "", None) is not None
    for store in (blosc, sharded, v2):
        np.testing.assert_array_equal(ZarrMatrix(store, "", False).read(0, 10), x[:, :10])
    want = (x * 100).astype(np.int32)[:, :10]
    np.testing.assert_array_equal(ZarrMatrix(ints, "", False).read(0, 10), want)


def test_missing_chunk_reads_the_fill_value_through_zarr(tmp_path):
    x = np.random.default_rng(2).random((3, 30))
    store = _array(tmp_path / "a.zarr", x, (3, 10))
    os.remove(Path(store) / "c" / "0" / "1")
    lay = layout(store, "", None)
    assert lay is not None and read_rows(lay, 1, 10, 20) is None
    got = ZarrMatrix(store, "", False).read(10, 20)
    assert np.all(np.isnan(got))  # the array's fill value
    np.testing.assert_array_equal(ZarrMatrix(store, "", False).read(0, 10), x[:, :10])


def test_corrupt_chunk_is_a_release_error(tmp_path):
    store = _array(tmp_path / "a.zarr", np.ones((3, 30)), (3, 10), compressors=[ZstdCodec()])
    (Path(store) / "c" / "0" / "2").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ReleaseError, match=r"records 20\.\.29 .* cannot be read"):
        ZarrMatrix(store, "", False).read(20, 30)


def test_rewritten_array_is_parsed_again(tmp_path):
    """The layout cache is keyed by the metadata file's identity: an array rewritten in place
    with another chunking is read with its new layout."""
    path = tmp_path / "a.zarr"
    x = np.random.default_rng(3).random((3, 40))
    _array(path, x, (3, 10))
    np.testing.assert_array_equal(ZarrMatrix(str(path), "", False).read(0, 10), x[:, :10])
    y = np.random.default_rng(4).random((3, 40)).astype(np.float32)
    zarr.create_array(store=str(path), shape=y.shape, chunks=(3, 20), dtype="f4", overwrite=True)[
        ...
    ] = y
    lay = layout(str(path), "", None)
    assert lay is not None and lay.chunks == (3, 20) and lay.dtype == np.float32
    np.testing.assert_array_equal(ZarrMatrix(str(path), "", False).read(0, 20), y[:, :20])


@pytest.mark.parametrize("records_first", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_direct_writes_equal_zarr_files(tmp_path, records_first, dtype):
    """A chunk written directly is the file zarr writes for the same values; chunks the fast
    path declines (edge, fill value first) are written by zarr, with zarr's semantics."""
    m, n, c = 5, 34, 8
    rng = np.random.default_rng(6)
    y = rng.standard_normal((m, n))
    y[0, 16] = np.nan  # chunk 2 starts with the fill value: zarr decides (it is stored)
    shape, chunks = ((n, m), (c, m)) if records_first else ((m, n), (m, c))
    paths = []
    for name in ("direct", "zarr"):
        paths.append(str(tmp_path / f"{name}.zarr"))
        zarr.create_array(
            store=paths[-1],
            shape=shape,
            chunks=chunks,
            dtype=dtype,
            compressors=None,
            fill_value=np.nan,
        )
    sink = ZarrMatrix(paths[0], "", records_first)
    lay = layout(paths[0], "", None)
    assert lay is not None
    taken = []
    for a in range(0, n, c):
        b = min(a + c, n)
        stored = y[:, a:b].T if records_first else y[:, a:b]
        taken.append(write_rows(lay, 0 if records_first else 1, a, b, stored))
        if not taken[-1]:
            sink.write(a, b, y[:, a:b])
        arr = zarr.open_array(store=paths[1], mode="r+")
        if records_first:
            arr[a:b, :] = y[:, a:b].T
        else:
            arr[:, a:b] = y[:, a:b]
    assert taken == [True, True, False, True, False]  # chunk 2: NaN first; chunk 4: edge
    files = sorted(p.relative_to(paths[1]) for p in Path(paths[1]).rglob("*") if p.is_file())
    assert (
        sorted(p.relative_to(paths[0]) for p in Path(paths[0]).rglob("*") if p.is_file()) == files
    )
    for rel in files:
        assert (Path(paths[0]) / rel).read_bytes() == (Path(paths[1]) / rel).read_bytes(), rel
    want = y.astype(dtype)
    np.testing.assert_array_equal(ZarrMatrix(paths[0], "", records_first).read(0, n), want)


def test_direct_write_declines_compressed_and_partial(tmp_path):
    y = np.ones((4, 10))
    z = _array(tmp_path / "z.zarr", np.zeros((4, 20)), (4, 10), compressors=[ZstdCodec()])
    lz = layout(z, "", None)
    assert lz is not None and not write_rows(lz, 1, 0, 10, y)
    split = _array(tmp_path / "s.zarr", np.zeros((4, 20)), (2, 10), compressors=None)
    ls = layout(split, "", None)
    assert ls is not None and not write_rows(ls, 1, 0, 10, y)  # two feature chunks
    raw = _array(tmp_path / "r.zarr", np.zeros((4, 20)), (4, 10), compressors=None)
    lr = layout(raw, "", None)
    assert lr is not None
    assert not write_rows(lr, 1, 5, 15, y)  # not on a chunk boundary
    assert not write_rows(lr, 1, 0, 20, np.ones((4, 20)))  # two chunks
    assert write_rows(lr, 1, 10, 20, y)
    assert not list(Path(raw).rglob("*.partial"))
    np.testing.assert_array_equal(zarr.open_array(store=raw, mode="r")[:, 10:20], y)


@pytest.mark.parametrize("nbytes", [1, 100, 255, 256, 300, 65791, 65792, 70_000, 2**23])
def test_zstd_frame_content_size_is_the_decoded_size(nbytes):
    """The header parse (RFC 8878) against numcodecs' decoder, across every field width."""
    from numcodecs import Zstd

    from mvg_dask.engine.zarr_io.chunks import frame_content_size

    data = np.random.default_rng(nbytes).integers(0, 4, nbytes, dtype=np.uint8).tobytes()
    for level in (-5, 0, 3, 19) if nbytes < 2**20 else (0,):
        frame = Zstd(level=level).encode(data)
        assert frame_content_size(frame) == len(Zstd().decode(frame)) == nbytes
    assert frame_content_size(b"\x00garbage" * 10) is None


def test_short_zstd_chunk_is_an_error_not_padding(tmp_path):
    """A zstd chunk that decodes to fewer bytes than a chunk is refused (zarr refuses it too),
    never padded with stale memory."""
    from numcodecs import Zstd

    store = _array(tmp_path / "a.zarr", np.ones((3, 30)), (3, 10), compressors=[ZstdCodec()])
    (Path(store) / "c" / "0" / "1").write_bytes(Zstd().encode(np.ones(29).tobytes()))
    with pytest.raises(ReleaseError, match=r"records 10\.\.19 .* cannot be read"):
        ZarrMatrix(store, "", False).read(10, 20)


def test_write_matrix_writes_zstd_level_minus_one_read_directly(tmp_path):
    """write_matrix's codec (docs/guide/performance.md, "Input codec") is zstd at level -1, and
    the release reads its chunks on the direct path, equal to zarr's reads."""
    import json

    from mvg_dask.data import INPUT_ZSTD_LEVEL, write_matrix

    x = np.random.default_rng(3).random((5, 40))
    store = write_matrix(x, tmp_path / "w.zarr", record_chunk=10)
    codecs = json.loads((tmp_path / "w.zarr" / "X" / "zarr.json").read_text())["codecs"]
    assert INPUT_ZSTD_LEVEL == -1
    assert codecs[1] == {"name": "zstd", "configuration": {"level": -1, "checksum": False}}
    lay = layout(store, "X", None)
    assert lay is not None and lay.zstd
    np.testing.assert_array_equal(read_rows(lay, 1, 10, 30), x[:, 10:30])
    np.testing.assert_array_equal(ZarrMatrix(store, "X", False).read(0, 40), x)
