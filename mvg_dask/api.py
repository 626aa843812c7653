"""The Python front end: plan and run releases, open their outputs.

A dry run is metadata plus planning and imports neither dask nor distributed; a release
composes the dry run with :func:`mvg_dask.engine.release.execute_release`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mvg_dask.engine.metadata import load_directions_matrix, read_input_metadata
from mvg_dask.plan.release_plan import ReleasePlan, plan_release
from mvg_dask.spec import ReleaseSpec, load_spec, parse_spec, resolve_paths

if TYPE_CHECKING:
    import xarray as xr
    from distributed import Client

    from mvg_dask.engine.release import ReleaseResult

__all__ = ["dry_run", "open_release", "release"]

SpecLike = ReleaseSpec | dict[str, Any] | str | Path


def _as_spec(spec: SpecLike) -> ReleaseSpec:
    if isinstance(spec, ReleaseSpec):
        return spec
    if isinstance(spec, dict):
        return resolve_paths(parse_spec(spec), Path.cwd())
    return load_spec(spec)


def dry_run(spec: SpecLike, *, release_id: str | None = None) -> ReleasePlan:
    """Validate a spec and plan its release from metadata only (no chunk is read).

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        The spec, or a YAML file.
    release_id : str, optional
        Overrides the spec's release id.

    Returns
    -------
    ReleasePlan
        The plan; ``.public_dict()`` is what ``mvg-dask release --dry-run`` prints.
    """
    s = _as_spec(spec)
    return plan_release(
        s,
        read_input_metadata(s.input),
        release_id=release_id,
        directions_matrix=load_directions_matrix(s),
    )


def release(
    spec: SpecLike,
    *,
    client: Client | None = None,
    scheduler: str | None = None,
    seed: int | None = None,
    progress: bool = True,
    release_id: str | None = None,
) -> ReleaseResult:
    """Plan and run a release.

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        The spec, or a YAML file.
    client : distributed.Client, optional
        Use this client.
    scheduler : str, optional
        Connect to this scheduler (ignored when ``client`` is given); default: the one named by
        ``DASK_SCHEDULER_ADDRESS``, else a LocalCluster.
    seed : int, optional
        Reproducible noise for tests and demos, recorded as NOT private.
    progress : bool, default True
        Show progress.
    release_id : str, optional
        Overrides the spec's release id.

    Returns
    -------
    ReleaseResult
        The finished release.
    """
    from mvg_dask.engine.cluster import connect
    from mvg_dask.engine.release import execute_release

    rplan = dry_run(spec, release_id=release_id)
    if client is not None:
        return execute_release(rplan, client, seed=seed, progress=progress)
    with connect(scheduler) as new_client:
        return execute_release(rplan, new_client, seed=seed, progress=progress)


def open_release(store: str, **kwargs: Any) -> xr.Dataset:
    """Open a released dataset, refusing one that is not complete.

    Parameters
    ----------
    store : str
        Output store path or URL.
    **kwargs
        Passed to :func:`xarray.open_zarr`.

    Returns
    -------
    xarray.Dataset
        The release, with the ``.mvg`` accessor registered.
    """
    import mvg_dask.xarray  # noqa: F401  (registers the .mvg accessor)
    from mvg_dask.engine.output import open_release as _open

    return _open(store, **kwargs)
