"""How a release's arrays are stored: the matrices' chunks and compressors, the noise
description's encoding, and the declared arrays of the skeleton's variables."""

from __future__ import annotations

import math
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


class Declared:
    """A skeleton variable's array, declared and never computed: its shape and dtype only (the
    release's tasks write its chunks).

    A duck array to xarray (``__array_function__``, ``__array_ufunc__``), held by a dataset as
    a lazy array would be; the skeleton writer
    (:func:`~mvg_dask.engine.zarr_io.skeleton.write_skeleton`) declares it, in one Zarr chunk
    unless the encoding gives its chunks, as ``to_zarr(compute=False)`` declares a dask array
    of one chunk (``tests/test_skeleton.py``). It needs no dask.
    """

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: Any = np.float64) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes its values will take."""
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"Declared(shape={self.shape}, dtype={self.dtype})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError("a declared skeleton variable has no values (the tasks write them)")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return NotImplemented

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return NotImplemented


def placeholder(shape: tuple[int, ...], dtype: Any = np.float64) -> Declared:
    """A declared array (:class:`Declared`) for a skeleton variable whose chunks the tasks
    write."""
    return Declared(shape, dtype)


def output_variable(
    data: Any, dims: tuple[str, ...] = (), attrs: dict[str, Any] | None = None
) -> Any:
    """An output variable (an ``xarray.Variable``) of ``data``: a :class:`Declared` array, or
    values taken as a numpy array.

    Made without the check xarray runs on the data of a new ``DataArray`` (whether it is a dask
    array, which imports ``dask.array`` and with it scipy's sparse and FFT modules, about half
    a second of CPU in a small release's process): the data is a numpy array or a declared one,
    so that check has nothing to find.
    """
    values = data if isinstance(data, Declared) else np.asarray(data)
    return xr.Variable(dims, values, attrs, fastpath=True)


def output_dataset(data_vars: dict[str, Any], coords: dict[str, Any] | None = None) -> xr.Dataset:
    """An output dataset of :func:`output_variable` data variables, its dimension coordinates made
    the same way (each coordinate named after its dimension); coordinates that are already
    xarray objects are kept."""
    made = {
        name: value
        if isinstance(value, xr.Variable | xr.DataArray)
        else output_variable(value, (name,))
        for name, value in (coords or {}).items()
    }
    return xr.Dataset(data_vars, coords=made)


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
