"""The consolidated root of a release: its children's metadata inlined in the root ``zarr.json``.

Consolidated metadata lets a plain ``xr.open_zarr(path)`` open a release without a warning; Zarr
v3 readers that do not know it ignore the key (``must_understand: false``). The commit writes it
once every array is final (so the inlined copies never go stale), in one write that also carries
the final attributes: the document ``zarr.consolidate_metadata`` followed by
``Group.update_attributes`` writes, made in memory.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["consolidated_root", "write_consolidated_root"]


def consolidated_root(root: bytes, children: dict[str, bytes], attributes: dict[str, Any]) -> bytes:
    """The root ``zarr.json`` of a flat group with its children's metadata consolidated in it
    and ``attributes`` merged into its own: the document ``zarr.consolidate_metadata`` followed
    by ``Group.update_attributes`` writes, made in memory (one write instead of two, and none
    of the reads through Zarr's event loop).

    Parameters
    ----------
    root : bytes
        The group's ``zarr.json``.
    children : dict
        Each child array's name and ``zarr.json``.
    attributes : dict
        Attributes to add to (or replace in) the group's.

    Returns
    -------
    bytes
        The new root ``zarr.json``.
    """
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.group import ConsolidatedMetadata, GroupMetadata
    from zarr.core.metadata import ArrayV2Metadata
    from zarr.core.metadata.v3 import ArrayV3Metadata

    group = GroupMetadata.from_dict(json.loads(root))
    members: dict[str, ArrayV2Metadata | ArrayV3Metadata | GroupMetadata] = {
        name: ArrayV3Metadata.from_dict(json.loads(doc)) for name, doc in sorted(children.items())
    }
    final = GroupMetadata(
        attributes={**group.attributes, **attributes},
        consolidated_metadata=ConsolidatedMetadata(metadata=members),
    )
    return final.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes()


def write_consolidated_root(fs: Any, root: str, attributes: dict[str, Any]) -> None:
    """Rewrite the root ``zarr.json`` of the flat group at ``root`` with its children's metadata
    consolidated and ``attributes`` merged (:func:`consolidated_root`): one metadata write.

    The children are listed and read one by one, never globbed: fsspec expands the paths of a
    batch as patterns, and a store path may hold ``[``, ``]`` or ``*``.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The group's filesystem.
    root : str
        The group's path on ``fs``.
    attributes : dict
        Attributes to add to (or replace in) the group's.
    """
    children = {}
    for entry in sorted(fs.ls(root, detail=False)):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        try:
            children[name] = fs.cat_file(f"{root}/{name}/zarr.json")
        except (FileNotFoundError, NotADirectoryError):
            continue  # the root's own zarr.json, or not a Zarr node
    fs.pipe_file(
        f"{root}/zarr.json",
        consolidated_root(fs.cat_file(f"{root}/zarr.json"), children, attributes),
    )
