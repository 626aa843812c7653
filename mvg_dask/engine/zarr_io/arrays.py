"""Arrays of an output being written: scratch matrices and whole-array writes, through zarr."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["create_scratch_matrix", "write_arrays"]


def create_scratch_matrix(
    path: str, m: int, chunk: int, storage_options: dict[str, Any] | None = None
) -> None:
    """Create a Zarr group at ``path`` with an ``m x m`` float64 array ``gram`` of
    ``chunk x chunk`` raw (uncompressed) chunks.

    Parameters
    ----------
    path : str
        The group's location (a path or URL where no array exists).
    m : int
        The matrix's order.
    chunk : int
        The chunks' order.
    storage_options : dict, optional
        fsspec options of ``path``.
    """
    import zarr

    zarr.create_array(
        store=path,
        name="gram",
        shape=(m, m),
        chunks=(chunk, chunk),
        dtype="float64",
        compressors=None,
        storage_options=storage_options,
    )


def write_arrays(
    store: str, values: dict[str, np.ndarray], storage_options: dict[str, Any] | None = None
) -> None:
    """Write whole arrays, declared before, of the group at ``store``.

    Parameters
    ----------
    store : str
        The group's location.
    values : dict
        Each array's name and its values.
    storage_options : dict, optional
        fsspec options of ``store``.
    """
    import zarr

    group = zarr.open_group(store, mode="r+", storage_options=storage_options)
    for name, value in values.items():
        arr = group[name]
        assert isinstance(arr, zarr.Array)
        arr[...] = value
