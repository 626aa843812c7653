"""How a release's arrays are stored: the matrices' chunks and compressors, the noise
description's encoding, and the lazy placeholders that declare the skeleton's variables."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import xarray as xr

from mvg_dask.noise.tiles import NOISE_TILE_FEATURES
from mvg_dask.plan.noise_plan import NoisePlan
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_format import NOISE_MATRICES

#: Chunk of a whole-matrix covariance output (``m <= WIDE_FEATURES``) and of its noisy sum:
#: 8 MiB of float64, the input's chunk size; one chunk up to 1,024 features.
MATRIX_CHUNK = 1024


def compressors(rplan: ReleasePlan) -> tuple[Any, ...] | None:
    """The Zarr v3 compressors of a release's arrays (``output.codec``; ``None``: raw bytes)."""
    from zarr.codecs import BloscCodec, ZstdCodec

    codec = rplan.output_codec
    if codec == "none":
        return None
    if codec == "zstd":
        return (ZstdCodec(),)
    if codec == "lz4":
        return (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)
    raise ValueError(f"unknown output codec {codec!r}")


#: Chunk of the noise-description matrices (``row_cov``, ``col_cov``, ``directions``) of identity
#: and whole-matrix covariance outputs: the noise grid's block. Their fill value is 0, so zero
#: blocks are not stored: standard directions (diagonal ``Sigma``) are described in O(m) stored
#: bytes and written block by block, without an ``m x m`` matrix.
NOISE_MATRIX_CHUNK = NOISE_TILE_FEATURES


def eager_noise_matrices(plan: NoisePlan) -> bool:
    """True when the noise matrices fit one chunk (``m <= NOISE_MATRIX_CHUNK``): they are then
    written whole with the metadata; else block by block
    (:meth:`~mvg_dask.engine.output.OutputTarget.write_noise_matrices`). Zarr stores no all-zero
    chunk either way: the same files."""
    return plan.directions.dim <= NOISE_MATRIX_CHUNK


def placeholder(shape: tuple[int, ...], dtype: Any = np.float64) -> Any:
    """A lazy array that declares a skeleton variable and is never computed (its chunks are
    written by the tasks): one dask chunk, so declaring it builds no per-chunk graph (the Zarr
    chunks come from the encoding). Named, not tokenized: tokenizing would pickle the array's
    constructor on the client in every release."""
    import dask.array as da

    return da.zeros(shape, chunks=shape, dtype=dtype, name=f"placeholder-{uuid.uuid4().hex}")


def noise_matrix_encoding(ds: xr.Dataset) -> dict[str, dict[str, Any]]:
    """The Zarr encoding of the noise-description matrices of ``ds``: chunks of
    :data:`NOISE_MATRIX_CHUNK`, zstd, fill value 0 (zero blocks are not stored)."""
    from zarr.codecs import ZstdCodec

    return {
        name: {
            "chunks": tuple(min(NOISE_MATRIX_CHUNK, n) for n in ds[name].shape),
            "compressors": (ZstdCodec(),),
            "fill_value": 0.0,
        }
        for name in NOISE_MATRICES
        if name in ds.data_vars
    }
