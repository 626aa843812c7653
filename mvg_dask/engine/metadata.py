"""Input metadata from Zarr without reading a chunk (and without importing dask or xarray).

A dry run is metadata plus planning: this module opens the store's group and array metadata
(a local Zarr v3 store's ``zarr.json`` files directly, :mod:`~mvg_dask.engine.zarr_io.local_meta`;
others with zarr), checks the variable and its dimensions, and returns the plan layer's
:class:`~mvg_dask.plan.input_metadata.InputMetadata`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mvg_dask.engine.store import Store
from mvg_dask.engine.zarr_io.local_meta import LocalArray, Unsupported, local_arrays
from mvg_dask.errors import DataError
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.spec import GroupBySpec, InputSpec, ReleaseSpec

MAX_FEATURE_NAMES = 1_000_000


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def array_dims(arr: Any) -> tuple[str, ...] | None:
    """Dimension names of a Zarr array (v3 ``dimension_names`` or v2 ``_ARRAY_DIMENSIONS``)."""
    if isinstance(arr, LocalArray):
        return arr.dims
    names = getattr(arr.metadata, "dimension_names", None)
    if names is None:
        names = arr.attrs.get("_ARRAY_DIMENSIONS")
    return None if names is None else tuple(str(n) for n in names)


def read_input_metadata(
    inp: InputSpec, group_by: GroupBySpec | None = None, cols_variable: str | None = None
) -> InputMetadata:
    """Open the input's metadata and check the variable (no chunk is read).

    Parameters
    ----------
    inp : InputSpec
        The spec's input section.
    group_by : GroupBySpec, optional
        The spec's ``group_by``: its variable is checked too (:func:`check_group_variable`).
    cols_variable : str, optional
        The second variable of a two-variable cross-covariance
        (:attr:`~mvg_dask.spec.ReleaseSpec.cols_variable`): read and checked too
        (:func:`second_variable_metadata`), as the result's ``cols_input``.

    Returns
    -------
    InputMetadata
        Shape, dims, chunking, dtype and feature names.

    Raises
    ------
    DataError
        When the store, the variable or its dimensions do not fit the spec.
    """
    check_dimension_names(inp)
    store = inp.store
    source = Store(store, inp.storage_options)
    if source.local and not source.exists():
        raise DataError(f"input.store: {store} does not exist")
    if not source.local:
        _probe(source)
    if source.local:  # its zarr.json files, without importing zarr (the same metadata)
        try:
            return _metadata(inp, group_by, cols_variable, dict(local_arrays(source.path)))
        except Unsupported:
            pass  # a layout the shortcut does not read: zarr reads it
    return _metadata(inp, group_by, cols_variable, _zarr_arrays(inp))


def reserved_output_names() -> frozenset[str]:
    """The names a release's output may give its variables and dimensions: the fixed ones
    (:data:`~mvg_dask.release_format.OUTPUT_NAMES`) and each query's own variables."""
    from mvg_dask.plan.queries import QUERY_TYPES
    from mvg_dask.release_format import OUTPUT_NAMES

    own = {
        name
        for q in QUERY_TYPES.values()
        for name in (q.output_variable, q.noisy_variable, q.sum_variable)
        if name
    }
    return OUTPUT_NAMES | own


def check_dimension_names(inp: InputSpec, *dims: str) -> None:
    """Refuse an input dimension named like a variable or dimension of a release's output
    (``mean``, ``term``, ``group``, ...): its coordinate or its axis would clash with that name
    in the output. Checked from the spec alone, before anything is read or charged.

    Parameters
    ----------
    inp : InputSpec
        The spec's input section (its ``record_dim`` and ``feature_dim``).
    *dims : str
        Further dimension names of the input to check (a second variable's features).

    Raises
    ------
    DataError
        Naming the field, the clash and the remedy.
    """
    reserved = reserved_output_names()
    fields = [("input.record_dim", inp.record_dim), ("input.feature_dim", inp.feature_dim)]
    for field, name in [*fields, *(("the second variable's feature dimension", d) for d in dims)]:
        if name in reserved:
            raise DataError(
                f"{field}: {name!r} is a name a release gives one of its output variables or "
                f"dimensions ({', '.join(sorted(reserved))}); rename the store's dimension "
                "(xarray: ds.rename({" + repr(name) + ": 'feature'}).to_zarr(...))"
            )


def _zarr_arrays(inp: InputSpec) -> dict[str, Any]:
    """The input group's arrays, opened with zarr."""
    import zarr

    store = inp.store
    try:
        group = zarr.open_group(store, mode="r", storage_options=inp.storage_options)
        return dict(group.arrays())
    except Exception as exc:  # zarr raises many types for a store that is not Zarr
        raise DataError(
            f"input.store: cannot open {store} as Zarr ({type(exc).__name__}: {_first_line(exc)})"
        ) from None


def _metadata(
    inp: InputSpec,
    group_by: GroupBySpec | None,
    cols_variable: str | None,
    arrays: dict[str, Any],
) -> InputMetadata:
    """:func:`read_input_metadata` from the group's arrays (zarr's or :class:`LocalArray`)."""
    store = inp.store
    dims_of = {name: array_dims(a) for name, a in arrays.items()}
    coords = {n for n, d in dims_of.items() if d is not None and len(d) == 1 and d[0] == n}
    if inp.variable not in arrays or inp.variable in coords:
        have = ", ".join(sorted(n for n in arrays if n not in coords)) or "none"
        raise DataError(f"input.variable: {inp.variable!r} is not in {store} (variables: {have})")
    arr = arrays[inp.variable]
    dims = dims_of[inp.variable] or ()
    if len(dims) != 2 or set(dims) != {inp.record_dim, inp.feature_dim}:
        raise DataError(
            f"input: {inp.variable!r} has dims {dims}; expected the two dims "
            f"record_dim={inp.record_dim!r} and feature_dim={inp.feature_dim!r}"
        )
    dtype = _real_dtype(arr, "input.variable", inp.variable)
    shape = (int(arr.shape[0]), int(arr.shape[1]))
    axis = dims.index(inp.record_dim)
    if group_by is not None:
        check_group_variable(group_by, inp, arrays, dims_of, shape[axis])
    names = _feature_names(arrays, coords, inp.feature_dim, shape[1 - axis])
    second = None
    if cols_variable is not None:
        second = second_variable_metadata(
            inp, cols_variable, arrays, dims_of, coords, (shape[axis], int(arr.chunks[axis]))
        )
    return InputMetadata(
        store=store,
        variable=inp.variable,
        record_dim=inp.record_dim,
        feature_dim=inp.feature_dim,
        dims=(dims[0], dims[1]),
        shape=shape,
        dtype=str(dtype),
        record_chunk=int(arr.chunks[axis]),
        feature_names=names,
        storage_options=inp.storage_options,
        cols_input=second,
    )


def _feature_names(
    arrays: dict[str, Any], coords: set[str], feature_dim: str, m: int
) -> tuple[Any, ...] | None:
    """The values of the feature coordinate ``feature_dim`` (``None``: none, or too many)."""
    feat = arrays.get(feature_dim)
    if feat is None or feature_dim not in coords or feat.shape != (m,) or m > MAX_FEATURE_NAMES:
        return None
    return tuple(np.asarray(feat[...]).tolist())


def _real_dtype(arr: Any, field: str, name: str) -> np.dtype[Any]:
    """``arr``'s dtype, refused (naming ``field``) unless it holds real numbers."""
    dtype = np.dtype(arr.dtype)
    if not np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.complexfloating):
        raise DataError(f"{field}: {name!r} has dtype {dtype}; need real numbers")
    return dtype


def second_variable_metadata(
    inp: InputSpec,
    name: str,
    arrays: dict[str, Any],
    dims_of: dict[str, tuple[str, ...] | None],
    coords: set[str],
    records: tuple[int, int],
) -> InputMetadata:
    """The metadata of the second variable ``Y`` of a two-variable cross-covariance: a 2-D real
    variable of the input store with the input's record dimension (same name, same length);
    its other dimension is its feature dimension (metadata only; its record chunking may
    differ from the input's: it is read by the input's record ranges).

    Parameters
    ----------
    inp : InputSpec
        The spec's input section.
    name : str
        ``query.cross-covariance.cols.variable``.
    arrays, dims_of, coords : dict, dict, set
        The store's arrays, their dimension names and its coordinate variables.
    records : tuple of int
        The input's record count and record chunk.

    Returns
    -------
    InputMetadata
        ``Y``'s metadata.

    Raises
    ------
    DataError
        Naming ``query.cross-covariance.cols.variable`` and what is wrong.
    """
    field = "query.cross-covariance.cols.variable"
    if name not in arrays or name in coords:
        have = ", ".join(sorted(n for n in arrays if n not in coords and n != inp.variable))
        raise DataError(
            f"{field}: {name!r} is not a variable of {inp.store} (other variables: "
            f"{have or 'none'})"
        )
    arr, dims = arrays[name], dims_of[name] or ()
    if len(dims) != 2 or inp.record_dim not in dims or dims[0] == dims[1]:
        raise DataError(
            f"{field}: {name!r} has dims {dims}; a second variable has two dims, one of them "
            f"the input's record dimension {inp.record_dim!r}"
        )
    axis = dims.index(inp.record_dim)
    if int(arr.shape[axis]) != records[0]:
        raise DataError(
            f"{field}: {name!r} has {int(arr.shape[axis])} records along {inp.record_dim!r}, "
            f"the input variable {inp.variable!r} has {records[0]}; both need the same records"
        )
    dtype = _real_dtype(arr, field, name)
    feature_dim = dims[1 - axis]
    check_dimension_names(inp, feature_dim)
    shape = (int(arr.shape[0]), int(arr.shape[1]))
    return InputMetadata(
        store=inp.store,
        variable=name,
        record_dim=inp.record_dim,
        feature_dim=feature_dim,
        dims=(dims[0], dims[1]),
        shape=shape,
        dtype=str(dtype),
        record_chunk=int(arr.chunks[axis]),
        feature_names=_feature_names(arrays, coords, feature_dim, shape[1 - axis]),
        storage_options=inp.storage_options,
    )


def check_group_variable(
    group_by: GroupBySpec,
    inp: InputSpec,
    arrays: dict[str, Any],
    dims_of: dict[str, tuple[str, ...] | None],
    records: int,
) -> None:
    """Refuse a ``group_by.variable`` that is not a 1-D variable of the input store along the
    record dimension, one label per record, of the declared labels' type (metadata only).

    Raises
    ------
    DataError
        Naming ``group_by.variable`` and what is wrong.
    """
    name = group_by.variable
    if name not in arrays or name == inp.variable:
        have = ", ".join(sorted(n for n in arrays if n != inp.variable)) or "none"
        raise DataError(
            f"group_by.variable: {name!r} is not a variable of {inp.store} beside "
            f"{inp.variable!r} (variables: {have})"
        )
    arr = arrays[name]
    if dims_of[name] != (inp.record_dim,) or tuple(arr.shape) != (records,):
        raise DataError(
            f"group_by.variable: {name!r} has dims {dims_of[name]} and shape "
            f"{tuple(arr.shape)}; a group variable holds one label per record, dims "
            f"({inp.record_dim!r},) and shape ({records},)"
        )
    dtype = np.dtype(arr.dtype)
    integer = np.issubdtype(dtype, np.integer)
    if isinstance(group_by.groups[0], int) != integer or dtype.kind not in "iuUSOT":
        want = "integers" if isinstance(group_by.groups[0], int) else "strings"
        raise DataError(
            f"group_by.variable: {name!r} has dtype {dtype}, but the declared groups are "
            f"{want}; declare labels of the variable's type"
        )


def load_directions_matrix(spec: ReleaseSpec) -> np.ndarray | None:
    """The ``.npy`` matrix of ``directions: {method: matrix}`` (``None`` for other methods)."""
    d = spec.mechanism.directions
    if d.method != "matrix":
        return None
    assert d.path is not None
    try:
        return np.asarray(np.load(d.path, allow_pickle=False), dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise DataError(f"mechanism.directions.path: cannot load {d.path} ({exc})") from None


def check_chunks_present(
    store: str,
    path: str,
    storage_options: dict[str, Any] | None = None,
    *,
    fills_missing: bool = False,
) -> None:
    """Refuse an input with missing chunks (Zarr would silently read them as the fill value).

    Lists the store's chunk keys; reads no chunk data. With ``fills_missing`` (the release
    declares ``domain.missing: {fill: ...}``) and a NaN fill value, an absent chunk is accepted:
    Zarr leaves out a chunk whose values all equal the fill value (``write_empty_chunks``
    false), so it reads as the all-NaN chunk it was written as, which the release fills as it
    fills any NaN. Refusing it would make whether a release runs depend on the data.

    Parameters
    ----------
    store, path : str
        The store and the array's path in it.
    storage_options : dict, optional
        fsspec options.
    fills_missing : bool
        The release fills NaN with a declared value.

    Raises
    ------
    DataError
        When chunks are missing (and are not all-NaN chunks the release fills).
    """
    import zarr

    arr = zarr.open_array(store=store, path=path, mode="r", storage_options=storage_options)
    fill = arr.metadata.fill_value
    if fills_missing and isinstance(fill, float) and math.isnan(fill):
        return
    have, want = arr.nchunks_initialized, arr.nchunks
    if have != want:
        raise DataError(
            f"input.store: {want - have} of {want} chunks of {path!r} are missing in {store} "
            "(Zarr would read them as fill values); restore the input store"
        )


def _probe(source: Store) -> None:
    """Read an object store's root ``zarr.json`` once, so that an unreachable store or refused
    credentials are one clear error before anything is charged (:mod:`mvg_dask.engine.faults`),
    not the failure of Zarr's concurrent reads.

    Raises
    ------
    ReleaseError
        A :class:`~mvg_dask.engine.faults.Fault` with ``charged = False``.
    """
    from mvg_dask.engine.faults import classify

    try:
        source.fs.cat_file(source.key("zarr.json"))
    except FileNotFoundError:
        return  # not Zarr v3 (or no such store): Zarr says which
    except Exception as exc:
        fault = classify(exc, release_id="", store=source, charged=False)
        if fault is None:
            return
        raise fault from None
