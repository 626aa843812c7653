"""Writing datasets to Zarr: the shipped paper data and synthetic data for scale runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr

#: The codec of the stores :func:`write_matrix` writes: zstd at level -1. Its literals are stored
#: raw, so a chunk of high-entropy floats decodes at memory speed (about 12 times faster than
#: zarr's default, level 0, which Huffman-codes them for a 1.07 ratio), and real data keeps most
#: of its compression (docs/guide/performance.md, "Input codec").
INPUT_ZSTD_LEVEL = -1


def write_matrix(
    X: np.ndarray | da.Array,
    store: str | Path,
    *,
    variable: str = "X",
    feature_names: Sequence[str] | None = None,
    record_chunk: int = 100_000,
    records_first: bool = False,
) -> str:
    """Write an ``M x N`` (features x records) matrix as an xarray-readable Zarr v3 store.

    The chunks are zstd frames at level :data:`INPUT_ZSTD_LEVEL` (-1), which a release decodes
    at about memory speed (docs/guide/performance.md, "Input codec").

    Parameters
    ----------
    X : ndarray or dask array
        Features x records.
    store : str or Path
        Target (must not exist).
    variable : str
        Variable name.
    feature_names : sequence of str, optional
        Feature coordinate.
    record_chunk : int
        Records per chunk.
    records_first : bool
        Store as ``records x features`` instead.

    Returns
    -------
    str
        The store path.
    """
    M, N = X.shape
    dims: tuple[str, str] = ("feature", "record")
    chunks: tuple[int, int] = (M, min(record_chunk, N))
    arr: np.ndarray | da.Array
    if isinstance(X, da.Array):  # lazy data is written blockwise by dask
        arr = X.rechunk(chunks)
    else:  # in-memory data is written directly (no task graph carrying the data)
        arr = np.asarray(X)
    if records_first:
        arr = arr.T
        dims = ("record", "feature")
        chunks = (chunks[1], chunks[0])
    coords = {}
    if feature_names is not None:
        coords["feature"] = np.array(list(feature_names), dtype=object)
    ds = xr.Dataset({variable: (dims, arr)}, coords=coords)
    from zarr.codecs import ZstdCodec

    compressors = [ZstdCodec(level=INPUT_ZSTD_LEVEL)]
    ds.to_zarr(
        str(store),
        mode="w-",
        zarr_format=3,
        consolidated=False,
        encoding={variable: {"chunks": chunks, "compressors": compressors}},
        write_empty_chunks=True,  # an all-NaN chunk is stored, not left out as "fill value"
    )
    return str(store)


def synthetic(
    records: int, features: int, *, seed: int = 0, record_chunk: int = 250_000
) -> da.Array:
    """A lazy ``features x records`` dataset in ``[0, 1]`` with a few strong directions.

    Each chunk is generated from its own seeded generator, so any size fits in memory.

    Parameters
    ----------
    records, features : int
        Size.
    seed : int
        Seed of the (non-private, synthetic) data.
    record_chunk : int
        Records per chunk.

    Returns
    -------
    dask.array.Array
        The data.
    """
    loadings = np.random.default_rng([seed, 2**31]).uniform(0, 1, (features, 3)) / 3

    def block(block_id: tuple[int, int], size: int) -> np.ndarray:
        rng = np.random.default_rng([seed, block_id[1]])
        z = rng.uniform(0, 1, (3, size))
        x = loadings @ z + rng.normal(0, 0.05, (features, size))
        return np.clip(x, 0.0, 1.0)

    chunks = (
        (features,),
        tuple(min(record_chunk, records - i) for i in range(0, records, record_chunk)),
    )
    return da.map_blocks(
        lambda block_id=None, block_info=None: block(
            block_id,
            block_info[None]["chunk-shape"][1],
        ),
        chunks=chunks,
        dtype=np.float64,
    )
