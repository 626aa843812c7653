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

__all__ = ["dry_run", "load", "open_release", "release"]

SpecLike = ReleaseSpec | dict[str, Any] | str | Path


def load(spec: SpecLike, *, output: str | None = None) -> ReleaseSpec:
    """A validated spec, from a :class:`ReleaseSpec`, a mapping or a YAML file.

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        The spec. Relative paths of a mapping resolve against the working directory, those of a
        file against the file's directory.
    output : str, optional
        Overrides ``output.store`` (relative to the working directory): a scheduled job writes
        each run to its own store.

    Returns
    -------
    ReleaseSpec
        The spec.
    """
    if isinstance(spec, ReleaseSpec):
        s = spec
    elif isinstance(spec, dict):
        s = resolve_paths(parse_spec(spec), Path.cwd())
    else:
        s = load_spec(spec)
    if output is not None:
        store = output if "://" in output else str(Path(output).resolve())
        s = s.model_copy(update={"output": s.output.model_copy(update={"store": store})})
    return s


def dry_run(
    spec: SpecLike, *, release_id: str | None = None, output: str | None = None
) -> ReleasePlan:
    """Validate a spec and plan its release from metadata only (no chunk is read).

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        The spec, or a YAML file.
    release_id : str, optional
        Overrides the spec's release id.
    output : str, optional
        Overrides the spec's output store.

    Returns
    -------
    ReleasePlan
        The plan; ``.public_dict()`` is what ``mvg-dask release --dry-run`` prints.
    """
    s = load(spec, output=output)
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
    output: str | None = None,
    cluster: str = "local",
    cluster_spec: str | Path | None = None,
    security: Any = None,
    insecure_transport: bool = False,
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
    output : str, optional
        Overrides the spec's output store.
    cluster : {"local", "kubernetes"}
        ``kubernetes``: an ephemeral dask-kubernetes cluster (extra ``[kubernetes]``).
    cluster_spec : path, optional
        Options of the ephemeral cluster.
    security : distributed.Security, optional
        TLS for ``scheduler`` (:func:`mvg_dask.engine.security.make_security`).
    insecure_transport : bool
        Accept sending a private key in plaintext to a remote scheduler.

    Returns
    -------
    ReleaseResult
        The finished release.
    """
    from mvg_dask.engine.cluster import connect
    from mvg_dask.engine.release import execute_release

    rplan = dry_run(spec, release_id=release_id, output=output)
    if client is not None:
        return execute_release(
            rplan, client, seed=seed, progress=progress, insecure_transport=insecure_transport
        )
    with connect(
        scheduler,
        cluster=cluster,
        cluster_spec=cluster_spec,
        security=security,
        seeded=seed is not None,
        insecure_transport=insecure_transport,
    ) as new_client:
        return execute_release(
            rplan, new_client, seed=seed, progress=progress, insecure_transport=insecure_transport
        )


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
