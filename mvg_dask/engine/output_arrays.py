"""How a release's arrays are stored: the matrices' chunks and compressors, the noise
description's encoding, and the declared arrays of the skeleton's variables."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

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


class SkeletonVariable:
    """A variable of an output's skeleton: dimensions, values (a numpy array or a
    :class:`Declared` one) and attributes, made without xarray (whose import, with pandas, is
    about a third of a second of a small release's CPU); :meth:`to_xarray` gives the
    ``xarray.Variable`` it stands for.

    Parameters
    ----------
    dims : tuple of str
        Dimension names.
    data : numpy.ndarray or Declared
        Values, or the declared array whose chunks the release's tasks write.
    attrs : dict, optional
        Attributes.
    """

    __slots__ = ("attrs", "data", "dims")

    def __init__(self, dims: tuple[str, ...], data: Any, attrs: dict[str, Any] | None = None):
        self.dims = tuple(dims)
        self.data = data
        self.attrs = dict(attrs or {})

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the values."""
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The data type of the values."""
        return np.dtype(self.data.dtype)

    def to_xarray(self) -> Any:
        """The ``xarray.Variable`` (made without xarray's checks of new data: the values are a
        numpy or a declared array)."""
        import xarray as xr

        return xr.Variable(self.dims, self.data, self.attrs or None, fastpath=True)


class Skeleton:
    """An output's skeleton as the skeleton writer
    (:func:`~mvg_dask.engine.zarr_io.skeleton.write_skeleton`) takes it: data variables,
    coordinates (each named after its dimension) and attributes; :meth:`to_xarray` gives the
    ``xarray.Dataset`` it stands for.

    Parameters
    ----------
    data_vars : dict
        The data variables (:class:`SkeletonVariable`).
    coords : dict, optional
        The coordinates: :class:`SkeletonVariable`, or xarray objects (an identity release's
        coordinates copied from its input).
    attrs : dict, optional
        The group's attributes.
    """

    def __init__(
        self,
        data_vars: dict[str, SkeletonVariable],
        coords: dict[str, Any] | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> None:
        self.data_vars = dict(data_vars)
        self.coords = dict(coords or {})
        self.attrs = dict(attrs or {})

    def __getitem__(self, name: str) -> Any:
        return self.data_vars[name] if name in self.data_vars else self.coords[name]

    def copy(self) -> Skeleton:
        """A copy (its own dictionaries of variables and attributes; the variables shared)."""
        return Skeleton(self.data_vars, self.coords, self.attrs)

    def to_xarray(self) -> Any:
        """The ``xarray.Dataset``: the data variables, the coordinates and the attributes."""
        import xarray as xr

        coords = {
            name: value.to_xarray() if isinstance(value, SkeletonVariable) else value
            for name, value in self.coords.items()
        }
        data_vars = {name: var.to_xarray() for name, var in self.data_vars.items()}
        return xr.Dataset(data_vars, coords=coords, attrs=self.attrs)


def output_variable(
    data: Any, dims: tuple[str, ...] = (), attrs: dict[str, Any] | None = None
) -> SkeletonVariable:
    """An output variable of ``data``: a :class:`Declared` array, or values taken as a numpy
    array.

    A :class:`SkeletonVariable`, not an ``xarray.Variable``: a small release's process imports
    neither xarray nor pandas (nor, through a new ``DataArray``'s check of its data, dask.array
    and scipy's sparse and FFT modules).
    """
    values = data if isinstance(data, Declared) else np.asarray(data)
    return SkeletonVariable(dims, values, attrs)


def output_dataset(data_vars: dict[str, Any], coords: dict[str, Any] | None = None) -> Skeleton:
    """An output's skeleton of :func:`output_variable` data variables, its dimension coordinates
    made the same way (each coordinate named after its dimension); coordinates that are already
    variables (xarray's, copied from an input) are kept."""
    made = {
        name: value if _is_variable(value) else output_variable(value, (name,))
        for name, value in (coords or {}).items()
    }
    return Skeleton(data_vars, coords=made)


def _is_variable(value: Any) -> bool:
    """True for a :class:`SkeletonVariable` or an xarray variable or data array (which exists
    only once xarray is imported)."""
    if isinstance(value, SkeletonVariable):
        return True
    xr = sys.modules.get("xarray")
    return xr is not None and isinstance(value, xr.Variable | xr.DataArray)


def noise_matrix_encoding(ds: Skeleton) -> dict[str, dict[str, Any]]:
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
