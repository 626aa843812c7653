"""Input metadata from Zarr without reading a chunk (and without importing dask or xarray).

A dry run is metadata plus planning: this module opens the store's group and array metadata
with zarr alone, checks the variable and its dimensions, and returns the plan layer's
:class:`~mvg_dask.plan.release_plan.InputMetadata`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mvg_dask.errors import DataError
from mvg_dask.plan.release_plan import InputMetadata
from mvg_dask.spec import GroupBySpec, InputSpec, ReleaseSpec, is_local

MAX_FEATURE_NAMES = 1_000_000


def local_path(store: str) -> Path:
    """The filesystem path of a local store."""
    return Path(store.removeprefix("file://"))


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def array_dims(arr: Any) -> tuple[str, ...] | None:
    """Dimension names of a Zarr array (v3 ``dimension_names`` or v2 ``_ARRAY_DIMENSIONS``)."""
    names = getattr(arr.metadata, "dimension_names", None)
    if names is None:
        names = arr.attrs.get("_ARRAY_DIMENSIONS")
    return None if names is None else tuple(str(n) for n in names)


def read_input_metadata(inp: InputSpec, group_by: GroupBySpec | None = None) -> InputMetadata:
    """Open the input's metadata and check the variable (no chunk is read).

    Parameters
    ----------
    inp : InputSpec
        The spec's input section.
    group_by : GroupBySpec, optional
        The spec's ``group_by``: its variable is checked too (:func:`check_group_variable`).

    Returns
    -------
    InputMetadata
        Shape, dims, chunking, dtype and feature names.

    Raises
    ------
    DataError
        When the store, the variable or its dimensions do not fit the spec.
    """
    import zarr

    store = inp.store
    if is_local(store) and not local_path(store).exists():
        raise DataError(f"input.store: {store} does not exist")
    if not is_local(store):
        _probe(store, inp.storage_options)
    try:
        group = zarr.open_group(store, mode="r", storage_options=inp.storage_options)
        arrays = dict(group.arrays())
    except Exception as exc:  # zarr raises many types for a store that is not Zarr
        raise DataError(
            f"input.store: cannot open {store} as Zarr ({type(exc).__name__}: {_first_line(exc)})"
        ) from None
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
    dtype = np.dtype(arr.dtype)
    if not np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.complexfloating):
        raise DataError(f"input.variable: {inp.variable!r} has dtype {dtype}; need real numbers")
    shape = (int(arr.shape[0]), int(arr.shape[1]))
    axis = dims.index(inp.record_dim)
    if group_by is not None:
        check_group_variable(group_by, inp, arrays, dims_of, shape[axis])
    names = None
    feat = arrays.get(inp.feature_dim)
    m = shape[1 - axis]
    if feat is not None and inp.feature_dim in coords and feat.shape == (m,):
        if m <= MAX_FEATURE_NAMES:
            names = tuple(np.asarray(feat[...]).tolist())
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
    store: str, path: str, storage_options: dict[str, Any] | None = None
) -> None:
    """Refuse an input with missing chunks (Zarr would silently read them as the fill value).

    Lists the store's chunk keys; reads no chunk data.
    """
    import zarr

    arr = zarr.open_array(store=store, path=path, mode="r", storage_options=storage_options)
    have, want = arr.nchunks_initialized, arr.nchunks
    if have != want:
        raise DataError(
            f"input.store: {want - have} of {want} chunks of {path!r} are missing in {store} "
            "(Zarr would read them as fill values); restore the input store"
        )


def _probe(store: str, storage_options: dict[str, Any] | None) -> None:
    """Read an object store's root ``zarr.json`` once, so that an unreachable store or refused
    credentials are one clear error before anything is charged (:mod:`mvg_dask.engine.faults`),
    not the failure of Zarr's concurrent reads.

    Raises
    ------
    ReleaseError
        A :class:`~mvg_dask.engine.faults.Fault` with ``charged = False``.
    """
    import fsspec

    from mvg_dask.engine.faults import classify

    try:
        fs, root = fsspec.core.url_to_fs(store, **(storage_options or {}))
        fs.cat_file(f"{root.rstrip('/')}/zarr.json")
    except FileNotFoundError:
        return  # not Zarr v3 (or no such store): Zarr says which
    except Exception as exc:
        fault = classify(exc, release_id="", store=store, charged=False, remote=True)
        if fault is None:
            return
        raise fault from None
