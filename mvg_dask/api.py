"""The Python front end: plan and run releases, open their outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distributed import Client

from mvg_dask.engine.cluster import connect
from mvg_dask.engine.release import ReleasePlan, ReleaseResult, execute_release, plan_release
from mvg_dask.engine.store import open_release
from mvg_dask.spec import ReleaseSpec, load_spec, parse_spec, resolve_paths

__all__ = ["dry_run", "open_release", "release"]


def _as_spec(spec: ReleaseSpec | dict[str, Any] | str | Path) -> ReleaseSpec:
    if isinstance(spec, ReleaseSpec):
        return spec
    if isinstance(spec, dict):
        return resolve_paths(parse_spec(spec), Path.cwd())
    return load_spec(spec)


def dry_run(spec: ReleaseSpec | dict[str, Any] | str | Path) -> ReleasePlan:
    """Validate a spec and plan its release from metadata only (no chunk is read).

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        The spec, or a YAML file.

    Returns
    -------
    ReleasePlan
        The plan; ``.to_dict()`` is what ``mvg-dask release --dry-run`` prints.
    """
    return plan_release(_as_spec(spec))


def release(
    spec: ReleaseSpec | dict[str, Any] | str | Path,
    *,
    client: Client | None = None,
    scheduler: str | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> ReleaseResult:
    """Plan and run a release.

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        The spec, or a YAML file.
    client : distributed.Client, optional
        Use this client.
    scheduler : str, optional
        Connect to this scheduler (ignored when ``client`` is given); default: a LocalCluster.
    seed : int, optional
        Reproducible noise for tests and demos, recorded as NOT private.
    progress : bool, default True
        Show progress.

    Returns
    -------
    ReleaseResult
        The finished release.
    """
    rplan = plan_release(_as_spec(spec))
    if client is not None:
        return execute_release(rplan, client, seed=seed, progress=progress)
    with connect(scheduler) as new_client:
        return execute_release(rplan, new_client, seed=seed, progress=progress)


open_release = open_release
