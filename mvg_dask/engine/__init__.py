"""Engine layer: Dask execution of queries and noise, Zarr I/O."""

from mvg_dask.engine.cluster import connect
from mvg_dask.engine.release import (
    ReleasePlan,
    ReleaseResult,
    execute_release,
    new_release_id,
    plan_release,
)
from mvg_dask.engine.store import open_release

__all__ = [
    "ReleasePlan",
    "ReleaseResult",
    "connect",
    "execute_release",
    "new_release_id",
    "open_release",
    "plan_release",
]
