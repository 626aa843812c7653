"""Block functions: what one Dask task does to one chunk of records (or one row panel).

They are plain numpy (plus zarr for the region write) so they run on any worker, are easy to
test, and keep the graph small: one task per chunk reads, checks, clips, adds noise and writes.
The records are read by :mod:`mvg_dask.engine.records` and clipped by
:mod:`mvg_dask.engine.clipping`; a task returns an
:class:`~mvg_dask.engine.tasks.outcome.Outcome`.
"""
