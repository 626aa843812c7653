"""Zarr's byte-level shortcuts of the engine, in one package.

Each writes or reads the bytes zarr itself would, faster or in fewer round trips, and a test
compares it with zarr byte for byte:

* :mod:`~mvg_dask.engine.zarr_io.chunks`: direct reads and writes of whole stored chunks of a
  local array (``tests/test_chunks.py``);
* :mod:`~mvg_dask.engine.zarr_io.skeleton`: an output's metadata and small variables in one
  batch, the files ``Dataset.to_zarr(compute=False)`` writes (``tests/test_skeleton.py``);
* :mod:`~mvg_dask.engine.zarr_io.consolidated`: the commit's root ``zarr.json`` with the
  children's metadata consolidated and the final attributes, in one write;
* :mod:`~mvg_dask.engine.zarr_io.arrays`: scratch arrays and whole-array writes of an output
  being written.
* :mod:`~mvg_dask.engine.zarr_io.local_meta`: a local v3 store's array metadata (and a small
  coordinate's values) read from its ``zarr.json`` files without importing zarr, for the dry
  run (``tests/test_local_meta.py``).

What the files mean (names, dimensions, completeness) is :mod:`mvg_dask.release_format`'s.
"""
