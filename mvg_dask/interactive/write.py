"""The accessor's write side: release an xarray object (:mod:`mvg_dask.xarray`'s
``.mvg.dry_run`` and ``.mvg.release``).

:func:`release_xarray` / :func:`dry_run_xarray` release an in-memory or lazy DataArray. The
input is **always written** to a new Zarr store ``<directory>/<release_id>.input.zarr`` and the
release to ``<directory>/<release_id>.zarr``. An object opened from a Zarr store is written too:
xarray keeps a variable's ``encoding`` (its source) through many operations, so reusing the
source could release the stored values instead of the ones the analyst sees. To release a stored
array without a copy, give its store in a spec (:func:`mvg_dask.api.release_spec`). The input
copy holds the private data: it stays with the curator, beside the ledger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import xarray as xr

from mvg_dask import api
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.planning import new_release_id, plan_release
from mvg_dask.plan.release_plan import ReleasePlan

if TYPE_CHECKING:
    from distributed import Client

    from mvg_dask.engine.preview import PlanPreview

__all__ = [
    "DEFAULT_RECORD_CHUNK",
    "dry_run_xarray",
    "release_xarray",
    "select_variable",
    "write_input",
]

#: records per chunk of the input copy (one release task per chunk)
DEFAULT_RECORD_CHUNK = 100_000


def select_variable(
    obj: xr.DataArray | xr.Dataset, variable: str | None, exclude: frozenset[str] = frozenset()
) -> xr.DataArray:
    """The DataArray to release: ``obj`` itself, or a Dataset's ``variable`` (its only data
    variable besides those in ``exclude``, copied beside it, when not given)."""
    if isinstance(obj, xr.DataArray):
        if variable is not None and obj.name is not None and variable != obj.name:
            raise ValueError(f"variable={variable!r} but the DataArray is named {obj.name!r}")
        return obj.rename(variable or obj.name or "X")
    if variable is None:
        names = [str(n) for n in obj.data_vars if n not in exclude]
        if len(names) != 1:
            raise ValueError(
                f"the Dataset has {len(names)} data variables ({', '.join(names) or 'none'}); "
                "say which one to release with variable=..."
            )
        variable = names[0]
    if variable not in obj.data_vars:
        have = ", ".join(str(n) for n in obj.data_vars) or "none"
        raise ValueError(f"variable {variable!r} is not in the Dataset (data variables: {have})")
    return obj[variable]


def _check_dims(arr: xr.DataArray, record_dim: str, feature_dim: str) -> None:
    if arr.ndim != 2 or set(arr.dims) != {record_dim, feature_dim}:
        raise ValueError(
            f"{arr.name!r} has dims {tuple(arr.dims)}; expected the two dims "
            f"record_dim={record_dim!r} and feature_dim={feature_dim!r} (pass them, or rename)"
        )
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{arr.name!r} has dtype {arr.dtype}; need real numbers")


def _record_chunk(arr: xr.DataArray, record_dim: str, record_chunk: int | None) -> int:
    n = int(arr.sizes[record_dim])
    chunk = DEFAULT_RECORD_CHUNK if record_chunk is None else int(record_chunk)
    if chunk < 1:
        raise ValueError(f"record_chunk must be >= 1, got {chunk}")
    return max(1, min(chunk, n))


def _input_metadata(
    arr: xr.DataArray, store: str, record_dim: str, feature_dim: str, record_chunk: int
) -> InputMetadata:
    """What :func:`mvg_dask.engine.metadata.read_input_metadata` will read from the copy."""
    names = None
    if feature_dim in arr.coords and arr.coords[feature_dim].ndim == 1:
        names = tuple(np.asarray(arr.coords[feature_dim].values).tolist())
    dims = (str(arr.dims[0]), str(arr.dims[1]))
    return InputMetadata(
        store=store,
        variable=str(arr.name),
        record_dim=record_dim,
        feature_dim=feature_dim,
        dims=dims,
        shape=(int(arr.shape[0]), int(arr.shape[1])),
        dtype="float64",
        record_chunk=record_chunk,
        feature_names=names,
    )


def _paths(directory: str | Path, release_id: str) -> tuple[str, str]:
    root = Path(directory).resolve()
    return str(root / f"{release_id}.input.zarr"), str(root / f"{release_id}.zarr")


def _spec(
    arr: xr.DataArray,
    input_store: str,
    output_store: str,
    release_id: str,
    *,
    name: str,
    record_dim: str,
    feature_dim: str,
    fields: Mapping[str, Any],
) -> Any:
    return api.release_spec(
        name=name,
        release_id=release_id,
        input={
            "store": input_store,
            "variable": str(arr.name),
            "record_dim": record_dim,
            "feature_dim": feature_dim,
        },
        output={"store": output_store},
        **fields,
    )


class _PlannedCopy(NamedTuple):
    """The spec and plan of an xarray object's release, and where its input copy goes."""

    spec: Any
    plan: ReleasePlan
    input_store: str
    output_store: str
    record_chunk: int
    beside: tuple[xr.DataArray, ...] = ()


def _plan_copy(
    obj: xr.DataArray | xr.Dataset,
    arr: xr.DataArray,
    directory: str | Path,
    name: str,
    release_id: str | None,
    record_dim: str,
    feature_dim: str,
    record_chunk: int | None,
    fields: Mapping[str, Any],
) -> _PlannedCopy:
    """Plan the release of ``arr`` (of ``obj``) from the metadata its input copy will have, and
    check a grouped release's labels (nothing written)."""
    from mvg_dask.engine.metadata import load_directions_matrix

    _check_dims(arr, record_dim, feature_dim)
    rid = release_id or new_release_id(name)
    input_store, output_store = _paths(directory, rid)
    spec = _spec(
        arr,
        input_store,
        output_store,
        rid,
        name=name,
        record_dim=record_dim,
        feature_dim=feature_dim,
        fields=fields,
    )
    beside: tuple[xr.DataArray, ...] = ()
    if spec.group_by is not None:
        beside = (_group_labels(obj, arr, spec),)
    chunk = _record_chunk(arr, record_dim, record_chunk)
    meta = _input_metadata(arr, input_store, record_dim, feature_dim, chunk)
    if spec.cols_variable is not None:
        second, second_meta = _second_variable(obj, arr, spec, input_store, chunk)
        beside += (second,)
        meta = dataclasses.replace(meta, cols_input=second_meta)
    rplan = plan_release(spec, meta, directions_matrix=load_directions_matrix(spec))
    return _PlannedCopy(spec, rplan, input_store, output_store, chunk, beside)


def _second_variable(
    obj: xr.DataArray | xr.Dataset, arr: xr.DataArray, spec: Any, store: str, chunk: int
) -> tuple[xr.DataArray, InputMetadata]:
    """A two-variable cross-covariance's ``Y``: the Dataset's ``cols.variable``, checked as a
    store's second variable is (:func:`~mvg_dask.engine.metadata.second_variable_metadata`:
    2-D, real, the input's record dimension and records) and copied beside the data as float64
    in the data's record chunks; with the metadata that copy will have."""
    from mvg_dask.engine.metadata import second_variable_metadata

    name, inp = spec.cols_variable, spec.input
    if not isinstance(obj, xr.Dataset):
        raise ValueError(
            f"query.cross-covariance.cols.variable: {name!r} is a variable beside the data; "
            f"release a Dataset holding {arr.name!r} and {name!r}"
        )
    arrays: dict[str, Any] = {str(k): np.asarray(v.values) for k, v in obj.coords.items()}
    dims_of: dict[str, tuple[str, ...] | None] = {k: None for k in arrays}
    if name in obj.data_vars:
        y = obj[name]
        shape = tuple(int(n) for n in y.shape)
        dims = tuple(str(d) for d in y.dims)
        chunks = tuple(
            chunk if d == inp.record_dim else n for d, n in zip(dims, shape, strict=True)
        )
        arrays[name] = SimpleNamespace(shape=shape, dtype=y.dtype, chunks=chunks)
        dims_of[name] = tuple(str(d) for d in y.dims)
    records = (int(arr.sizes[inp.record_dim]), chunk)
    meta = second_variable_metadata(inp, name, arrays, dims_of, set(arrays) - {name}, records)
    return obj[name], dataclasses.replace(meta, store=store, dtype="float64")


def _beside_variables(fields: Mapping[str, Any]) -> frozenset[str]:
    """The variables a spec's sections name beside the data (before the spec is validated): a
    grouped release's labels, a two-variable cross-covariance's second variable."""
    names: set[str] = set()
    group_by = fields.get("group_by")
    if isinstance(group_by, Mapping) and isinstance(group_by.get("variable"), str):
        names.add(str(group_by["variable"]))
    query = fields.get("query")
    cross = query.get("cross-covariance") if isinstance(query, Mapping) else None
    cols = cross.get("cols") if isinstance(cross, Mapping) else None
    if isinstance(cols, Mapping) and isinstance(cols.get("variable"), str):
        names.add(str(cols["variable"]))
    return frozenset(names)


def _group_labels(obj: xr.DataArray | xr.Dataset, arr: xr.DataArray, spec: Any) -> xr.DataArray:
    """A grouped release's labels: the Dataset's ``group_by.variable``, one per record, of the
    declared labels' type (the checks of a store's group variable,
    :func:`~mvg_dask.engine.metadata.check_group_variable`), copied with the data."""
    from mvg_dask.engine.metadata import check_group_variable

    group_by, inp = spec.group_by, spec.input
    if not isinstance(obj, xr.Dataset):
        raise ValueError(
            f"group_by: the labels are a variable beside the data; release a Dataset holding "
            f"{arr.name!r} and {group_by.variable!r} (one label per record)"
        )
    arrays = {str(k): v for k, v in obj.variables.items() if str(k) not in obj.dims}
    dims_of: dict[str, tuple[str, ...] | None] = {
        k: tuple(str(d) for d in v.dims) for k, v in arrays.items()
    }
    check_group_variable(group_by, inp, arrays, dims_of, int(arr.sizes[inp.record_dim]))
    return obj[group_by.variable]


def dry_run_xarray(
    obj: xr.DataArray | xr.Dataset,
    directory: str | Path | None = None,
    *,
    variable: str | None = None,
    name: str = "xarray",
    release_id: str | None = None,
    record_dim: str = "record",
    feature_dim: str = "feature",
    record_chunk: int | None = None,
    **fields: Any,
) -> PlanPreview:
    """Plan the release of an xarray object without writing or reading anything.

    Parameters
    ----------
    obj : DataArray or Dataset
        The data (features and records along ``feature_dim`` and ``record_dim``).
    directory : path, optional
        Where :func:`release_xarray` would write (default: the working directory).
    variable : str, optional
        The Dataset's variable (default: its only one).
    name, release_id : str
        The release's name and id.
    record_dim, feature_dim : str
        Dimension names.
    record_chunk : int, optional
        Records per chunk of the input copy.
    **fields
        The spec's other sections: ``query``, ``domain``, ``privacy``, ``mechanism``, ``ledger``
        (as in :func:`mvg_dask.api.release_spec`).

    Returns
    -------
    PlanPreview
        The plan (``.plan``) and the budget the ledger would have left; a table in a notebook.
    """
    from mvg_dask.engine.preview import preview

    arr = select_variable(obj, variable, _beside_variables(fields))
    planned = _plan_copy(
        obj,
        arr,
        directory or Path.cwd(),
        name,
        release_id,
        record_dim,
        feature_dim,
        record_chunk,
        fields,
    )
    return preview(planned.plan)


def write_input(
    arr: xr.DataArray,
    store: str,
    record_dim: str,
    feature_dim: str,
    record_chunk: int,
    beside: tuple[xr.DataArray, ...] = (),
) -> None:
    """Write ``arr`` (in memory or lazy) as a new float64 Zarr v3 store, one chunk per
    ``record_chunk`` records (lazy data blockwise, in-memory data directly), with the variables
    ``beside`` it: a grouped release's labels (strings as Zarr v3 variable-length strings), a
    two-variable cross-covariance's second variable (float64, in the same record chunks)."""
    out = arr.astype(np.float64)
    out.encoding = {}
    chunks = {record_dim: record_chunk, feature_dim: int(arr.sizes[feature_dim])}
    if out.chunks is not None:
        out = out.chunk(chunks)
    ds = out.to_dataset(name=str(arr.name))
    enc: dict[str, Any] = {str(arr.name): {"chunks": tuple(chunks[str(d)] for d in out.dims)}}
    for extra in beside:  # with its own coordinates (a second variable's feature labels)
        values = extra.compute()
        if values.dtype.kind in "US":
            values = values.astype(object)
        elif values.ndim == 2:
            values = values.astype(np.float64)
        values.encoding = {}
        ds[str(extra.name)] = values
        enc[str(extra.name)] = {
            "chunks": tuple(
                record_chunk if d == record_dim else int(values.sizes[d]) for d in values.dims
            )
        }
    for v in ds.variables.values():
        v.encoding = {}
    # strings as objects: Zarr v3 variable-length strings (fixed-width unicode has no v3 spec)
    ds = ds.assign_coords(
        {
            str(k): c.astype(object)
            for k, c in ds.coords.items()
            if c.dtype.kind == "U" and c.ndim == 1
        }
    )
    # an all-NaN chunk is stored, not left out as a "fill value" chunk
    ds.to_zarr(
        store,
        mode="w-",
        zarr_format=3,
        consolidated=False,
        encoding=enc,
        write_empty_chunks=True,
    )


def _check_same_input(arr: xr.DataArray, store: str, beside: tuple[xr.DataArray, ...] = ()) -> None:
    """A retried release id must release the data of its first run: same dims and shape, and,
    for in-memory data, the same values and the same variables beside it (group labels, a
    second variable; lazy data is not read again to compare)."""
    stored = xr.open_zarr(store, consolidated=False)
    copy = stored[str(arr.name)]
    same = copy.dims == arr.dims and copy.shape == arr.shape
    if same and arr.chunks is None:
        same = bool(np.array_equal(copy.values, np.asarray(arr.values, dtype=np.float64)))
    for extra in beside:
        name = str(extra.name)
        same = (
            same
            and name in stored.variables
            and stored[name].dims == extra.dims
            and bool(np.array_equal(stored[name].values.astype(extra.dtype), extra.values))
        )
    if not same:
        raise ValueError(
            f"{store} already holds the input of this release id with other data; choose a new "
            "release_id (a release id names one release of one dataset)"
        )


def release_xarray(
    obj: xr.DataArray | xr.Dataset,
    directory: str | Path,
    *,
    variable: str | None = None,
    name: str = "xarray",
    release_id: str | None = None,
    record_dim: str = "record",
    feature_dim: str = "feature",
    record_chunk: int | None = None,
    client: Client | None = None,
    scheduler: str | None = None,
    seed: int | None = None,
    progress: bool = True,
    performance_report: str | Path | bool | None = None,
    **fields: Any,
) -> xr.Dataset:
    """Write an xarray object to a new Zarr store, release it and open the release.

    The spec is validated and the release planned before anything is written; the input copy
    is then written to ``<directory>/<release_id>.input.zarr`` (curator-side: it is the private
    data) and the release to ``<directory>/<release_id>.zarr``. Re-running the same release id
    (after a crash, or a retry) reuses the first run's copy and resumes or finds the release
    complete; in-memory data that differs from that copy is refused.

    Parameters
    ----------
    obj : DataArray or Dataset
        The data.
    directory : path
        Where the input copy and the release are written.
    variable, name, release_id, record_dim, feature_dim, record_chunk
        As for :func:`dry_run_xarray`.
    client, scheduler, seed, progress, performance_report
        As for :func:`mvg_dask.api.release`.
    **fields
        ``query``, ``domain``, ``privacy``, ``mechanism``, ``ledger``.

    Returns
    -------
    xarray.Dataset
        The opened release (:func:`mvg_dask.api.open_release`).
    """
    arr = select_variable(obj, variable, _beside_variables(fields))
    # the whole plan is checked before anything is written
    planned = _plan_copy(
        obj, arr, directory, name, release_id, record_dim, feature_dim, record_chunk, fields
    )
    planned.plan.check_seed(seed)
    api.performance_report_path(planned.output_store, performance_report)
    Path(directory).mkdir(parents=True, exist_ok=True)
    if Path(planned.input_store).exists():  # a retry of the same release id reuses its first copy
        _check_same_input(arr, planned.input_store, planned.beside)
    else:
        write_input(
            arr,
            planned.input_store,
            record_dim,
            feature_dim,
            planned.record_chunk,
            planned.beside,
        )
    result = api.release(
        planned.spec,
        client=client,
        scheduler=scheduler,
        seed=seed,
        progress=progress,
        performance_report=performance_report,
    )
    return api.open_release(result.output)
