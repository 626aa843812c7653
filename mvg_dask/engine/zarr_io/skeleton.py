"""Writing an output's skeleton: the Zarr metadata of a dataset and its small variables.

``Dataset.to_zarr(compute=False)`` makes about three Zarr calls per variable, each a round trip
to Zarr's event-loop thread and, for a local store, one more to a file-writing thread: client
CPU time on a machine whose cores the workers are using (the skeleton is written while the Gram
pass runs).

:func:`write_skeleton` writes the same files in one batch:

1. the variables are encoded as ``to_zarr`` encodes them (CF conventions, ``_FillValue``, chunk
   encoding, attribute values): for the plain variables of a release's skeleton (numbers or
   strings, declared or in memory, dimension coordinates only, no CF attributes or encoding)
   here, without importing xarray and pandas (about a third of a second of a small release's
   CPU); for anything else by xarray's own Zarr encoders, the ones ``to_zarr`` calls;
2. the group, its arrays and the values of the in-memory variables are made in a Zarr
   :class:`~zarr.storage.MemoryStore`, concurrently, in one call into Zarr's event loop;
3. the files are written to the target in one ``fsspec`` batch.

The files are the bytes ``to_zarr(mode="w-", compute=False, zarr_format=3, consolidated=False)``
writes: ``tests/test_skeleton.py`` compares them, file by file, for every kind of release output
and for random datasets. Lazy (dask) variables are declared only, as with ``compute=False``: their
chunks are written by the release's tasks; so are the release's declared arrays
(:class:`~mvg_dask.engine.output_arrays.Declared`), which need no dask.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask.engine.output_arrays import Declared, Skeleton, SkeletonVariable
from mvg_dask.engine.store import Store

if TYPE_CHECKING:
    import xarray as xr

#: An array to make: its name, the options of ``create_array`` and its values (``None``: lazy).
_Array = tuple[str, dict[str, Any], np.ndarray | None]

#: Attributes xarray's CF encoders read or write: a variable holding one is encoded by xarray.
_CF_ATTRS = frozenset(
    {
        "_FillValue", "missing_value", "scale_factor", "add_offset", "coordinates", "_Unsigned",
        "dtype", "calendar", "_Encoding", "bounds", "grid_mapping", "cell_measures",
        "formula_terms", "ancillary_variables", "climatology", "flag_values", "flag_meanings",
    }
)  # fmt: skip

#: Encoding keys encoded here (any other: by xarray, which uses or refuses it).
_PLAIN_ENCODING = frozenset({"chunks", "compressors", "fill_value"})

#: The ``_FillValue`` attribute xarray gives floating-point variables (NaN, base64 of a double).
_NAN_FILL = base64.standard_b64encode(struct.pack("<d", float("nan"))).decode()


def write_skeleton(
    ds: Skeleton | xr.Dataset,
    store: str,
    *,
    encoding: dict[str, dict[str, Any]] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Create ``ds`` as a new Zarr v3 group at ``store``: metadata, attributes and the values of
    its in-memory variables (lazy ones are declared, not written).

    Parameters
    ----------
    ds : Skeleton or xarray.Dataset
        The dataset; its declared (or dask-backed) variables are placeholders whose chunks are
        written later.
    store : str
        A path or an fsspec URL where nothing exists yet.
    encoding : dict, optional
        Per-variable Zarr encoding, as for :meth:`xarray.Dataset.to_zarr` (``chunks``,
        ``compressors``, ``fill_value``, ...).
    storage_options : dict, optional
        fsspec options of ``store``.

    Raises
    ------
    FileExistsError
        When ``store`` already holds a Zarr group or array.
    """
    files = skeleton_files(ds, encoding or {})
    target = Store(store, storage_options)
    fs, root = target.fs, target.root
    if fs.exists(f"{root}/zarr.json"):
        raise FileExistsError(f"{store} already holds a Zarr node")
    if target.local:  # a local filesystem writes into existing directories only
        parents = {f"{root}/{key}".rsplit("/", 1)[0] for key in files}
        for parent in sorted(parents):  # the deepest ones (makedirs makes their ancestors)
            if not any(other.startswith(f"{parent}/") for other in parents):
                fs.makedirs(parent, exist_ok=True)
    # the root's zarr.json last: the group exists only once everything else does
    fs.pipe({f"{root}/{key}": value for key, value in files.items() if key != "zarr.json"})
    fs.pipe_file(f"{root}/zarr.json", files["zarr.json"])


def skeleton_files(
    ds: Skeleton | xr.Dataset, encoding: dict[str, dict[str, Any]]
) -> dict[str, bytes]:
    """The files (key relative to the group, bytes) of ``ds`` written as a new Zarr v3 group
    (see :func:`write_skeleton`)."""
    names = (
        set(ds.data_vars) | set(ds.coords)
        if isinstance(ds, Skeleton)
        else {str(name) for name in ds.variables}
    )
    unknown = set(encoding) - names
    if unknown:
        raise ValueError(f"encoding names variables the dataset does not have: {sorted(unknown)}")
    plain = _plain_arrays(ds, encoding)
    if plain is None:
        plain = _xarray_arrays(ds.to_xarray() if isinstance(ds, Skeleton) else ds, encoding)
    return _zarr_files(*plain)


def _plain_arrays(
    ds: Skeleton | xr.Dataset, encoding: dict[str, dict[str, Any]]
) -> tuple[list[_Array], dict[str, Any]] | None:
    """The arrays and group attributes of ``ds`` encoded as ``to_zarr`` encodes them, when
    every variable is plain (:func:`_plain_array`) and every coordinate a dimension coordinate;
    else ``None`` (xarray encodes them: :func:`_xarray_arrays`)."""
    variables = _plain_variables(ds)
    if variables is None or not _plain_attrs(ds.attrs):
        return None
    arrays = []
    for name, (dims, data, attrs) in variables.items():
        array = _plain_array(name, dims, data, attrs, encoding.get(name, {}))
        if array is None:
            return None
        arrays.append(array)
    return arrays, {k: _attr_value(v) for k, v in ds.attrs.items()}


def _plain_variables(
    ds: Skeleton | xr.Dataset,
) -> dict[Any, tuple[tuple[Any, ...], Any, dict[Any, Any]]] | None:
    """Each variable's dims, values (numpy or declared) and attributes, or ``None`` when one is
    not plain: xarray's (an identity release's coordinates copied from its input), lazy (dask),
    with an encoding of its own, or a coordinate that is not its dimension's or has no values
    (declared: xarray indexes its values); or when the skeleton is not a dataset xarray would
    make (a name both a data variable and a coordinate, a dimension of two lengths): xarray
    refuses it, with its own error."""
    out: dict[Any, tuple[tuple[Any, ...], Any, dict[Any, Any]]] = {}
    if isinstance(ds, Skeleton):
        if set(ds.data_vars) & set(ds.coords):
            return None
        sizes: dict[Any, int] = {}
        for name, var in (ds.data_vars | ds.coords).items():
            if not isinstance(var, SkeletonVariable):
                return None
            if name in ds.coords and (var.dims != (name,) or isinstance(var.data, Declared)):
                return None
            if len(var.dims) != len(var.shape):
                return None
            for dim, n in zip(var.dims, var.shape, strict=True):
                if sizes.setdefault(dim, n) != n:
                    return None
            out[name] = (var.dims, var.data, var.attrs)
        return out
    for name, xvar in ds.variables.items():
        if xvar.encoding or (name in ds.coords and xvar.dims != (name,)):
            return None
        data = xvar.data
        if not isinstance(data, Declared):
            if _is_lazy(data):
                return None
            data = xvar.values
        out[name] = (xvar.dims, data, xvar.attrs)
    return out


def _plain_array(
    name: Any, dims: tuple[Any, ...], data: Any, attrs: dict[Any, Any], enc: dict[str, Any]
) -> _Array | None:
    """``create_array``'s options and the values of one variable, encoded as xarray's Zarr
    encoders encode it (``encode_zarr_variable``, ``extract_zarr_variable_encoding``), or
    ``None`` when it is not plain: a name or dimension that is not a string, a data type other
    than native integers, float32/float64 and (in memory) ``str`` objects, a CF attribute
    (:data:`_CF_ATTRS`), an encoding key other than :data:`_PLAIN_ENCODING`, chunks that are
    not integers."""
    if not isinstance(name, str) or not all(isinstance(d, str) for d in dims):
        return None
    if set(enc) - _PLAIN_ENCODING or not _plain_attrs(attrs) or set(attrs) & _CF_ATTRS:
        return None
    declared = isinstance(data, Declared)
    values = None if declared else np.asarray(data)
    kind = data.dtype.kind
    dtype: Any = np.dtype(data.dtype)
    if kind == "O":  # variable-length strings, in memory
        # exactly str: xarray refuses an object array of several types (str and numpy.str_)
        if values is None or not values.size or not all(type(v) is str for v in values.flat):
            return None
        dtype = str
    elif not dtype.isnative or (kind not in "iu" and dtype not in (np.float32, np.float64)):
        return None
    chunks = _chunks(enc.get("chunks", data.shape if declared else None), len(data.shape))
    if chunks is None:
        return None
    encoded = {k: _attr_value(v) for k, v in attrs.items()}
    fill_value = enc.get("fill_value")
    if kind == "f":  # CF: NaN is the missing value; Zarr's fill value NaN unless given
        encoded["_FillValue"] = _NAN_FILL
        fill_value = np.nan if fill_value is None else fill_value
    options = {
        "shape": tuple(data.shape),
        "dtype": dtype,
        "fill_value": fill_value,
        "attributes": encoded,
        "dimension_names": tuple(dims),
        "config": {},
        "chunks": chunks,
        **({"compressors": enc["compressors"]} if "compressors" in enc else {}),
    }
    return name, options, values


def _chunks(chunks: Any, ndim: int) -> tuple[int, ...] | str | None:
    """Encoded chunks as xarray gives them to Zarr (``_determine_zarr_chunks`` of a variable
    without dask chunks): ``"auto"`` for none (or the wrong number), a tuple of integers; or
    ``None`` for anything xarray refuses."""
    if not chunks:
        return "auto"
    if isinstance(chunks, int | np.integer):
        chunks = ndim * (chunks,)
    chunks = tuple(chunks)
    if len(chunks) != ndim:
        return "auto"
    return chunks if all(type(c) is int for c in chunks) else None


def _plain_attrs(attrs: Any) -> bool:
    """True for attributes with string names and JSON values (numbers, strings, booleans,
    ``None``, lists and dicts of them; numpy scalars and arrays)."""
    return all(isinstance(k, str) and _json_value(v) for k, v in attrs.items())


def _json_value(value: Any) -> bool:
    if value is None or isinstance(value, str | int | float | np.generic | np.ndarray):
        return True
    if isinstance(value, list | tuple):
        return all(_json_value(v) for v in value)
    if isinstance(value, dict):
        return _plain_attrs(value)
    return False


def _attr_value(value: Any) -> Any:
    """An attribute's value as xarray's ``encode_zarr_attr_value`` gives it."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _xarray_arrays(
    ds: xr.Dataset, encoding: dict[str, dict[str, Any]]
) -> tuple[list[_Array], dict[str, Any]]:
    """The arrays and group attributes of ``ds`` encoded by xarray's own Zarr encoders."""
    from xarray import conventions
    from xarray.backends.zarr import (
        FillValueCoder,
        encode_zarr_attr_value,
        encode_zarr_variable,
        extract_zarr_variable_encoding,
    )
    from xarray.coding.strings import check_vlen_dtype

    # what `to_zarr` does (xarray.backends.writers.dump_to_store, ZarrStore.store and
    # ZarrStore.set_variables), for a new group
    variables, attributes = conventions.encode_dataset_coordinates(ds)
    arrays: list[_Array] = []
    for name, raw in variables.items():
        if not isinstance(name, str):
            raise TypeError(f"variable names must be strings, not {name!r}")
        if name in encoding:
            raw.encoding = dict(encoding[name])
        var = encode_zarr_variable(raw, name=name, zarr_format=3)
        attrs = var.attrs.copy()
        fill_value = var.encoding.pop("fill_value", None)
        if fill_value is None and var.dtype.kind == "f":
            fill_value = np.nan  # xarray's default for floating point data
        if "_FillValue" in attrs:
            fv = attrs.pop("_FillValue")
            if fv is not None:
                attrs["_FillValue"] = FillValueCoder.encode(fv, var.dtype)
        var.encoding.pop("_FillValue", None)  # the CF encoder moved it to the attributes
        if isinstance(var.data, Declared):  # one chunk, as to_zarr makes of a one-chunk dask array
            var.encoding.setdefault("chunks", var.shape)
        zarr_encoding = extract_zarr_variable_encoding(
            var, raise_on_invalid=name in encoding, name=name, zarr_format=3
        )
        zarr_encoding.pop("fill_value", None)
        config = {
            k: zarr_encoding.pop(k) for k in ("write_empty_chunks", "order") if k in zarr_encoding
        }
        dtype: Any = str if check_vlen_dtype(var.dtype) is str else var.dtype
        options = {
            "shape": var.shape,
            "dtype": dtype,
            "fill_value": fill_value,
            "attributes": {k: encode_zarr_attr_value(v) for k, v in attrs.items()},
            "dimension_names": var.dims,
            "config": config,
            **zarr_encoding,
        }
        values = None if _is_lazy(var.data) else np.asarray(var.data)
        arrays.append((name, options, values))
    return arrays, {k: encode_zarr_attr_value(v) for k, v in attributes.items()}


def _zarr_files(arrays: list[_Array], group_attrs: dict[str, Any]) -> dict[str, bytes]:
    """The files of a new group with ``group_attrs`` and ``arrays``, made by Zarr in memory."""
    import zarr.api.asynchronous as zarr_async
    from zarr.core.sync import sync
    from zarr.storage import MemoryStore

    content: dict[str, Any] = {}

    async def make() -> None:
        group = await zarr_async.open_group(
            store=MemoryStore(content), mode="w-", zarr_format=3, attributes=group_attrs
        )
        made = await asyncio.gather(
            *(group.create_array(name, overwrite=False, **options) for name, options, _ in arrays)
        )
        await asyncio.gather(
            *(
                array.setitem(Ellipsis, values)
                for array, (_, _, values) in zip(made, arrays, strict=True)
                if values is not None
            )
        )

    sync(make())
    return {key: buffer.to_bytes() for key, buffer in content.items()}


def _is_lazy(data: Any) -> bool:
    """True for a declared or chunked (dask) array: declared by the skeleton, written later."""
    if isinstance(data, Declared):
        return True
    from xarray.namedarray.pycompat import is_chunked_array

    return bool(is_chunked_array(data))
