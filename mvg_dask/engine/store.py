"""Zarr I/O: input metadata, staging, the atomic commit, readers that refuse incomplete output."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import xarray as xr

from mvg_dask.engine.blocks import PROGRESS_DIR
from mvg_dask.errors import DataError, IncompleteReleaseError, ReleaseError

STATUS_ATTR = "mvg_dask_status"
RELEASE_ID_ATTR = "mvg_dask_release_id"
MAX_EAGER_COORD = 10_000_000


def is_local(store: str) -> bool:
    """True for a plain path or a ``file://`` URL."""
    return "://" not in store or store.startswith("file://")


def local_path(store: str) -> Path:
    """The filesystem path of a local store."""
    return Path(store.removeprefix("file://"))


@dataclass(frozen=True, eq=False)
class InputInfo:
    """What a release needs to know about its input, read from metadata only.

    Attributes
    ----------
    variable : xarray.DataArray
        The (lazy, dask-backed) input variable.
    features, records : int
        ``M`` and ``N``.
    records_first : bool
        True when the stored array is ``records x features``.
    record_chunk : int
        Records per stored chunk (the release's task size).
    """

    variable: xr.DataArray
    features: int
    records: int
    records_first: bool
    record_chunk: int
    feature_dim: str
    record_dim: str


def open_input(
    store: str,
    variable: str,
    record_dim: str,
    feature_dim: str,
    storage_options: dict[str, Any] | None = None,
) -> InputInfo:
    """Open the input variable lazily and check its dimensions (no chunk is read).

    Parameters
    ----------
    store : str
        Zarr store path or URL.
    variable : str
        Variable name.
    record_dim, feature_dim : str
        Dimension names.
    storage_options : dict, optional
        fsspec options.

    Returns
    -------
    InputInfo
        Metadata and the lazy variable.
    """
    if is_local(store) and not local_path(store).exists():
        raise DataError(f"input.store: {store} does not exist")
    try:
        ds = xr.open_zarr(store, consolidated=False, storage_options=storage_options, chunks={})
    except Exception as exc:  # zarr/xarray raise many types for a store that is not Zarr
        raise DataError(
            f"input.store: cannot open {store} as Zarr ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    if variable not in ds.data_vars:
        have = ", ".join(map(str, ds.data_vars)) or "none"
        raise DataError(f"input.variable: {variable!r} is not in {store} (variables: {have})")
    da_ = ds[variable]
    if da_.ndim != 2 or set(da_.dims) != {record_dim, feature_dim}:
        raise DataError(
            f"input: {variable!r} has dims {tuple(map(str, da_.dims))}; expected the two dims "
            f"record_dim={record_dim!r} and feature_dim={feature_dim!r}"
        )
    if not np.issubdtype(da_.dtype, np.number) or np.issubdtype(da_.dtype, np.complexfloating):
        raise DataError(f"input.variable: {variable!r} has dtype {da_.dtype}; need real numbers")
    records_first = da_.dims[0] == record_dim
    axis = 0 if records_first else 1
    chunks = da_.data.chunks[axis]
    return InputInfo(
        variable=da_,
        features=int(da_.sizes[feature_dim]),
        records=int(da_.sizes[record_dim]),
        records_first=records_first,
        record_chunk=int(chunks[0]),
        feature_dim=feature_dim,
        record_dim=record_dim,
    )


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


def small_coords(variable: xr.DataArray, skip_dim: str | None = None) -> dict[str, xr.DataArray]:
    """Coordinates small enough to copy eagerly into the output."""
    out = {}
    for name, coord in variable.coords.items():
        if skip_dim is not None and skip_dim in coord.dims:
            continue
        if coord.size <= MAX_EAGER_COORD:
            out[str(name)] = coord.load()
    return out


class OutputTarget:
    """Where a release is written: a staging directory renamed into place (local stores), or the
    final location with ``status = incomplete`` until the end (object stores).

    Parameters
    ----------
    store : str
        Final output store.
    release_id : str
        Release id (names the staging directory).
    storage_options : dict, optional
        fsspec options for object stores.
    """

    def __init__(
        self, store: str, release_id: str, storage_options: dict[str, Any] | None = None
    ) -> None:
        self.store = store
        self.release_id = release_id
        self.storage_options = storage_options
        self.local = is_local(store)
        if self.local:
            final = local_path(store)
            self.final: Path | None = final
            self.write_store = str(final.with_name(f"{final.name}.staging-{release_id}"))
        else:
            self.final = None
            self.write_store = store

    def check_free(self) -> None:
        """Refuse an output location that already holds something else."""
        if self.local:
            assert self.final is not None
            if self.final.exists():
                raise ReleaseError(
                    f"output.store: {self.store} already exists "
                    f"({_describe_existing(self.store)}); choose another output.store or remove it"
                )
        else:
            try:
                ds = xr.open_zarr(
                    self.store, consolidated=False, storage_options=self.storage_options
                )
            except Exception:
                return
            if ds.attrs.get(RELEASE_ID_ATTR) != self.release_id:
                raise ReleaseError(
                    f"output.store: {self.store} already holds other data; choose another store"
                )

    def is_complete(self) -> bool:
        """True when the final location holds this release, complete."""
        try:
            ds = xr.open_zarr(self.store, consolidated=False, storage_options=self.storage_options)
        except Exception:
            return False
        return bool(
            ds.attrs.get(STATUS_ATTR) == "complete"
            and ds.attrs.get(RELEASE_ID_ATTR) == self.release_id
        )

    def has_skeleton(self) -> bool:
        """True when an earlier run of this release created the output skeleton."""
        fs, root = fsspec.core.url_to_fs(self.write_store, **(self.storage_options or {}))
        return bool(fs.exists(f"{root}/zarr.json") and fs.exists(f"{root}/{PROGRESS_DIR}"))

    def make_progress_dir(self) -> None:
        """Create the directory of per-chunk completion markers."""
        fs, root = fsspec.core.url_to_fs(self.write_store, **(self.storage_options or {}))
        fs.makedirs(f"{root}/{PROGRESS_DIR}", exist_ok=True)
        if not self.local:  # object stores have no directories: keep a key there
            fs.pipe_file(f"{root}/{PROGRESS_DIR}/.keep", b"")

    def clear_staging(self) -> None:
        """Remove a leftover staging directory of this release id."""
        if self.local and Path(self.write_store).exists():
            shutil.rmtree(self.write_store)

    def abort(self) -> None:
        """Remove everything this release wrote: the staging directory (local stores) or the
        in-place output (object stores; :meth:`check_free` made sure it held nothing else)."""
        if self.local:
            shutil.rmtree(self.write_store, ignore_errors=True)
            return
        fs, root = fsspec.core.url_to_fs(self.write_store, **(self.storage_options or {}))
        if fs.exists(root):
            fs.rm(root, recursive=True)

    def commit(self, attrs: dict[str, Any]) -> None:
        """Write the final attrs with ``status = complete`` last, then move into place."""
        import zarr

        fs, root = fsspec.core.url_to_fs(self.write_store, **(self.storage_options or {}))
        if fs.exists(f"{root}/{PROGRESS_DIR}"):
            fs.rm(f"{root}/{PROGRESS_DIR}", recursive=True)
        if self.local:  # leftovers of writes interrupted by a crash (zarr writes tmp + rename)
            for partial in Path(self.write_store).rglob("*.partial"):
                partial.unlink()
        group = zarr.open_group(self.write_store, mode="r+", storage_options=self.storage_options)
        # one metadata write; status "complete" is part of the last write of the release
        group.update_attributes({**attrs, STATUS_ATTR: "complete"})
        if self.local:
            assert self.final is not None
            os.replace(self.write_store, self.final)


def _describe_existing(store: str) -> str:
    try:
        ds = xr.open_zarr(store, consolidated=False)
    except Exception:
        return "not a Zarr store of mvg_dask"
    rid = ds.attrs.get(RELEASE_ID_ATTR)
    return f"release {rid!r}" if rid else "data that is not an mvg_dask release"


def open_release(store: str, **kwargs: Any) -> xr.Dataset:
    """Open a released dataset, refusing one whose status is not ``complete``.

    Parameters
    ----------
    store : str
        Output store path or URL.
    **kwargs
        Passed to :func:`xarray.open_zarr`.

    Returns
    -------
    xarray.Dataset
        The release with its provenance attrs.

    Raises
    ------
    IncompleteReleaseError
        When the store is not a complete mvg_dask release.
    """
    import mvg_dask.xarray  # noqa: F401  (registers the .mvg accessor)

    kwargs.setdefault("consolidated", False)
    try:
        ds = xr.open_zarr(store, **kwargs)
    except Exception as exc:
        raise IncompleteReleaseError(f"{store} is not a readable release ({exc})") from None
    status = ds.attrs.get(STATUS_ATTR)
    if status != "complete":
        raise IncompleteReleaseError(
            f"{store} is not a complete release (status: {status!r}); it may still be running, "
            "or it crashed: re-run the release with the same release_id to finish it"
        )
    return ds
