"""Writing an output's skeleton: the Zarr metadata of a dataset and its small variables.

``Dataset.to_zarr(compute=False)`` makes about three Zarr calls per variable, each a round trip
to Zarr's event-loop thread and, for a local store, one more to a file-writing thread: client
CPU time on a machine whose cores the workers are using (the skeleton is written while the Gram
pass runs).

:func:`write_skeleton` writes the same files in one batch:

1. the variables are encoded by xarray's own Zarr encoders, the ones ``to_zarr`` calls
   (CF conventions, ``_FillValue``, chunk encoding, attribute values);
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
from typing import Any

import numpy as np
import xarray as xr

from mvg_dask.engine.output_arrays import Declared
from mvg_dask.engine.store import Store


def write_skeleton(
    ds: xr.Dataset,
    store: str,
    *,
    encoding: dict[str, dict[str, Any]] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Create ``ds`` as a new Zarr v3 group at ``store``: metadata, attributes and the values of
    its in-memory variables (lazy ones are declared, not written).

    Parameters
    ----------
    ds : xarray.Dataset
        The dataset; its dask-backed variables are placeholders whose chunks are written later.
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


def skeleton_files(ds: xr.Dataset, encoding: dict[str, dict[str, Any]]) -> dict[str, bytes]:
    """The files (key relative to the group, bytes) of ``ds`` written as a new Zarr v3 group
    (see :func:`write_skeleton`)."""
    import zarr.api.asynchronous as zarr_async
    from xarray import conventions
    from xarray.backends.zarr import (
        FillValueCoder,
        encode_zarr_attr_value,
        encode_zarr_variable,
        extract_zarr_variable_encoding,
    )
    from xarray.coding.strings import check_vlen_dtype
    from zarr.core.sync import sync
    from zarr.storage import MemoryStore

    unknown = set(encoding) - {str(name) for name in ds.variables}
    if unknown:
        raise ValueError(f"encoding names variables the dataset does not have: {sorted(unknown)}")
    # what `to_zarr` does (xarray.backends.writers.dump_to_store, ZarrStore.store and
    # ZarrStore.set_variables), for a new group
    variables, attributes = conventions.encode_dataset_coordinates(ds)
    arrays: list[tuple[str, dict[str, Any], np.ndarray | None]] = []
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
    group_attrs = {k: encode_zarr_attr_value(v) for k, v in attributes.items()}

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
