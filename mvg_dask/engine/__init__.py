"""Engine layer: Dask execution of release plans, Zarr I/O, the privacy ledger.

Submodules are imported where they are used, so that reading metadata for a dry run
(:mod:`mvg_dask.engine.metadata`) imports neither dask nor distributed.
"""
