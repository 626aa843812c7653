"""The Python front end: plan and run releases, open their outputs.

A dry run is metadata plus planning and imports neither dask nor distributed; a release
composes the dry run, the refusals decided from metadata (:func:`preflight`, before any cluster
starts) and :func:`mvg_dask.engine.release.execute_release`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask._startup import imports_without_gc
from mvg_dask.engine.metadata import load_directions_matrix, read_input_metadata
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.spec import (
    ReleaseSpec,
    SpecError,
    load_spec,
    parse_spec,
    resolve_paths,
    with_output_store,
)

if TYPE_CHECKING:
    import xarray as xr
    from distributed import Client

    from mvg_dask.engine.check import CheckReport
    from mvg_dask.engine.preview import PlanPreview
    from mvg_dask.engine.release import ReleaseResult
    from mvg_dask.engine.stream import PeriodResult
    from mvg_dask.plan.stream import StreamPreview

__all__ = [
    "check",
    "dry_run",
    "embedded_client",
    "in_process",
    "load",
    "open_release",
    "performance_report_path",
    "preflight",
    "preview",
    "release",
    "release_round",
    "release_spec",
    "training_run",
]

SpecLike = ReleaseSpec | dict[str, Any] | str | Path

from mvg_dask.api.rounds import release_round, training_run  # noqa: E402 (after SpecLike)

_SECTIONS = ("input", "domain", "mechanism", "privacy", "output", "ledger", "group_by")

#: Inputs up to this many bytes are released on an embedded cluster of threads in this process
#: (no worker processes to start, close or warm up: below it a release takes about as long as
#: their start, and the Gram pass's decoding and BLAS products release the GIL, so threads are
#: as fast once started); larger ones on a LocalCluster of worker processes. The published
#: bytes are the same either way.
IN_PROCESS_MAX_BYTES = 2**30


def release_spec(
    *,
    name: str | None = None,
    input: Any = None,
    domain: Any = None,
    query: str | dict[str, Any] | None = None,
    privacy: Any = None,
    output: Any = None,
    mechanism: Any = None,
    ledger: Any = None,
    release_id: str | None = None,
    group_by: Any = None,
    **unknown: Any,
) -> ReleaseSpec:
    """A release spec from keyword arguments, without YAML: the same schema and the same errors.

    Each section is a mapping (as in the YAML file) or the section's model from
    :mod:`mvg_dask.spec`; the whole is validated by :func:`mvg_dask.spec.parse_spec`, so an
    error names the same dotted field as for the YAML file (``release_spec: privacy.epsilon:
    ...`` where the file gives ``spec.yaml: privacy.epsilon: ...``). Relative paths resolve
    against the working directory.

    Parameters
    ----------
    name : str
        The release's name (its id is ``name`` plus a unique suffix unless ``release_id``).
    input, domain, privacy, output : dict or model
        The spec's sections, e.g. ``input={"store": "data/ctg.zarr", "variable": "X"}``,
        ``domain={"box": {"lower": 0, "upper": 1}}``, ``privacy={"epsilon": 1, "delta": 1e-6}``,
        ``output={"store": "out/ctg.zarr"}``.
    query : str or dict
        The query: ``"identity"``, ``"covariance"``, ``"centered-covariance"``,
        ``{"regression": {"target": "f4"}}`` or ``{"cross-covariance": {"rows": [...],
        "cols": [...]}}``, optionally with ``"col_allocation": {"strategy": "binary",
        "important": [...], "share": 0.8}`` for its column covariance ``Psi``
        (docs/concepts/queries.md).
    mechanism, ledger : dict or model, optional
        Left out: the defaults (unimodal, exact, standard directions; allocation scale-aware
        where the declared box gives the features different scales, else uniform) and no
        ledger.
    release_id : str, optional
        A fixed release id (retry-safe).
    group_by : dict or GroupBySpec, optional
        ``{"variable": "site", "groups": [0, 1, 2]}``: one moment release per declared group
        (docs/concepts/queries.md, "Grouped releases").
    **unknown
        Any other keyword is refused as the YAML spec refuses an unknown key.

    Returns
    -------
    ReleaseSpec
        The validated spec, for :func:`dry_run` and :func:`release`.

    Raises
    ------
    SpecError
        Naming every invalid field.

    Examples
    --------
    >>> from mvg_dask import api
    >>> spec = api.release_spec(
    ...     name="ctg", input={"store": "ctg.zarr"}, domain={"box": {"lower": 0, "upper": 1}},
    ...     query="covariance", privacy={"epsilon": 1.0, "delta": 1e-6},
    ...     output={"store": "out.zarr"})
    >>> spec.mechanism.calibration
    'exact'
    """
    values = {
        "name": name,
        "release_id": release_id,
        "input": input,
        "domain": domain,
        "query": query,
        "mechanism": mechanism,
        "privacy": privacy,
        "output": output,
        "ledger": ledger,
        "group_by": group_by,
        **unknown,
    }
    data: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue  # left out, as a YAML file leaves the key out (a missing one: an error)
        if hasattr(value, "model_dump") and key in _SECTIONS:
            value = value.model_dump(exclude_unset=True)
        data[key] = value
    return resolve_paths(parse_spec(data, source="release_spec"), Path.cwd())


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
        s = with_output_store(s, store)
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
        The plan; ``.public_dict()`` is what ``mvg-dask release --dry-run --json`` prints.
    """
    s = load(spec, output=output)
    return plan_release(
        s,
        read_input_metadata(s.input, s.group_by, s.cols_variable),
        release_id=release_id,
        directions_matrix=load_directions_matrix(s),
    )


def stream_dry_run(
    spec: SpecLike, *, release_id: str | None = None, output: str | None = None
) -> StreamPreview:
    """Plan a stream's next period from metadata only (no chunk is read, nothing is charged).

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        A spec with a ``stream`` section.
    release_id, output : str, optional
        Overrides, as for :func:`dry_run`.

    Returns
    -------
    StreamPreview
        The stream's plan, the next period's std and the comparison at the same budget
        (naive re-release, the tree, the tree with Honaker's estimator, the square root);
        ``.text`` is what ``mvg-dask release --dry-run`` prints.
    """
    from mvg_dask.engine.stream import next_period
    from mvg_dask.plan.stream import one_shot_plan, plan_stream, preview_stream

    s = load(spec, output=output)
    if s.stream is None:
        raise SpecError("stream_dry_run needs a spec with a stream section")
    metadata = read_input_metadata(s.input, s.group_by, s.cols_variable)
    stream = plan_stream(s, metadata, release_id=release_id)
    return preview_stream(stream, one_shot_plan(s, metadata), next_period(s, stream))


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
    performance_report: str | Path | bool | None = None,
    period_label: str | None = None,
) -> ReleaseResult:
    """Plan and run a release; for a spec with a ``stream`` section, release the stream's next
    period (docs/guide/streams.md).

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
        Reproducible noise for tests and demos, recorded as NOT private. Refused for a spec
        with a ledger (a seeded release's noise can be recovered from its output, so it can be
        neither charged as private nor left out of the budget): give seeds only to releases of
        test or demo data without a ledger.
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
    performance_report : path or True, optional
        Write Dask's performance report (HTML: task stream, worker profiles, timings) to this
        file; ``True``: next to a local output, ``<output>.performance-report.html`` (never
        inside the output store). It is a curator-side file: its task counts and timings can
        depend on the data, so it must not be published (docs/guide/privacy.md, "What a release
        publishes").
        Needs bokeh (extra ``[notebook]``).
    period_label : str, optional
        A stream's period label (its coordinate in the stream's store, e.g. a date); default:
        the period's index. Only for a spec with a ``stream`` section.

    Returns
    -------
    ReleaseResult
        The finished release (a stream: the released period, a
        :class:`~mvg_dask.engine.stream.PeriodResult`).

    Without ``client``, ``scheduler``, ``DASK_SCHEDULER_ADDRESS`` or ``cluster="kubernetes"``,
    an input of at most ``IN_PROCESS_MAX_BYTES`` (1 GiB; 512 MiB for an identity release) is
    released on an embedded cluster of threads in this process, a larger one on a LocalCluster
    of worker processes (the same bytes either way; under add-remove neighbours the size is that
    of ``privacy.max_records`` records, see :func:`in_process`).

    Raises
    ------
    SpecError
        An invalid spec, a declared bound below the proved one, or a ``seed`` with a ledger
        (all before anything is read, written or charged).
    ReleaseError, BudgetError, LedgerError
        A refusal :func:`preflight` decides from metadata, before any cluster starts and before
        anything is charged; or a failure of the release itself (its ``charged`` attribute says
        whether the ledger holds a charge for it).
    DataError
        The data does not fit the spec. Found after a chunk was read (a NaN with
        ``domain.missing: error``, an infinite value, a value outside the domain with
        ``on_violation: error``), the release is aborted and stays charged: ``charged`` is
        true, ``charge`` and the message say what was charged to which ledger dataset
        (without a ledger, nothing is charged and the message says nothing of a charge).
    """
    s = load(spec, output=output)
    if s.stream is not None:
        return _release_period(
            s, client, scheduler, seed, period_label, release_id, cluster, security
        )
    if period_label is not None:
        raise SpecError("period_label names a period of a stream; the spec has no stream section")
    rplan = dry_run(s, release_id=release_id)
    rplan.check_seed(seed)
    report = performance_report_path(rplan.output_store, performance_report)
    local = client is None and cluster == "local"
    preflight(rplan, scheduler=scheduler, probe=local)
    if client is not None:
        return _execute(rplan, client, seed, progress, insecure_transport, report)
    with imports_without_gc():
        from mvg_dask.engine.cluster import connect
        from mvg_dask.engine.warmup import needs_kernels

    with connect(
        scheduler,
        cluster=cluster,
        cluster_spec=cluster_spec,
        security=security,
        seeded=seed is not None,
        insecure_transport=insecure_transport,
        processes=not in_process(rplan.input, s),
        kernels=needs_kernels(rplan),
        while_starting=lambda: _import_engine(rplan),
    ) as new_client:
        return _execute(rplan, new_client, seed, progress, insecure_transport, report)


def in_process(metadata: InputMetadata, spec: ReleaseSpec) -> bool:
    """Whether the embedded cluster of a release runs on threads in this process (an input of
    at most ``IN_PROCESS_MAX_BYTES``, 1 GiB, or its query type's smaller ``threads_max_bytes``:
    512 MiB for an identity release) rather than on worker processes.

    Decided from public values only. Under add-remove neighbours the record count is private,
    and so is the input's size: the size counted is that of ``privacy.max_records`` records
    (the declared public bound; by default ``2**32``, so worker processes).

    Parameters
    ----------
    metadata : InputMetadata
        The input's metadata (:func:`mvg_dask.engine.metadata.read_input_metadata`).
    spec : ReleaseSpec
        The spec.

    Returns
    -------
    bool
        True for threads in this process.
    """
    inp = metadata
    from mvg_dask.plan.queries import query_type

    own = query_type(spec.query_kind).threads_max_bytes  # the query is public
    limit = IN_PROCESS_MAX_BYTES if own is None else min(IN_PROCESS_MAX_BYTES, own)
    if spec.privacy.neighbours != "add-remove":
        return inp.nbytes <= limit
    from mvg_dask.plan.input_metadata import DEFAULT_MAX_RECORDS

    records = spec.privacy.max_records or DEFAULT_MAX_RECORDS
    per_record = sum(
        part.features * np.dtype(part.dtype).itemsize
        for part in (inp, inp.cols_input)
        if part is not None
    )
    return records * per_record <= limit


@contextmanager
def embedded_client(spec: SpecLike, *, output: str | None = None) -> Iterator[Client]:
    """One client for several releases of a spec's input (the periods of a stream, say):
    the cluster :func:`release` would start for ``spec``, started once.

    Each release on it is planned, reserved, charged and committed on its own, as with
    ``release(spec, client=client)``; only the cluster is shared, and with it the cost of its
    start (worker processes, their imports, the lattice kernels). Reusing it is safe: the choice
    of threads or worker processes comes from public values only (:func:`in_process`), every
    release sends its own key with its own tasks, and the workers keep no result of one release
    once it is complete. ``DASK_SCHEDULER_ADDRESS``, when set, is used as by :func:`release`.

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        A spec of the releases to come (its input and plan pick the cluster).
    output : str, optional
        Overrides the spec's output store (for planning only).

    Yields
    ------
    distributed.Client
        The client; its cluster is closed on exit.

    Examples
    --------
    >>> with api.embedded_client("period.yaml") as client:  # doctest: +SKIP
    ...     for period in periods:
    ...         api.release(period, client=client)
    """
    from mvg_dask.engine.cluster import connect
    from mvg_dask.engine.warmup import needs_kernels

    s = load(spec, output=output)
    rplan = dry_run(s)
    with connect(
        processes=not in_process(rplan.input, s),
        kernels=needs_kernels(rplan),
        while_starting=lambda: _import_engine(rplan),
    ) as client:
        yield client


def _release_period(
    s: ReleaseSpec,
    client: Client | None,
    scheduler: str | None,
    seed: int | None,
    period_label: str | None,
    release_id: str | None,
    cluster: str,
    security: Any,
) -> PeriodResult:
    """The next period of the stream of ``s``
    (:func:`~mvg_dask.engine.stream.run_stream_release`)."""
    from mvg_dask.engine.stream import run_stream_release

    options: dict[str, Any] = {"period_label": period_label, "seed": seed, "release_id": release_id}
    if client is not None:
        return run_stream_release(s, client, **options)
    from mvg_dask.engine.cluster import connect

    metadata = read_input_metadata(s.input, s.group_by, s.cols_variable)
    with connect(
        scheduler,
        cluster=cluster,
        security=security,
        seeded=seed is not None,
        processes=not in_process(metadata, s),  # public values only (add-remove)
    ) as new:
        return run_stream_release(s, new, **options)


def check(
    spec: SpecLike,
    *,
    client: Client | None = None,
    scheduler: str | None = None,
    progress: bool = True,
    cluster: str = "local",
    cluster_spec: str | Path | None = None,
    security: Any = None,
) -> CheckReport:
    """Count what a release would meet in a spec's input: NaN, infinite and out-of-domain values.

    A curator-side check to fix the data before spending budget (``mvg-dask check``). It reads
    the input's records once, on Dask, and counts the NaN and infinite values per feature, the
    values below and above a box domain per feature (an L2 domain: the records whose norm
    exceeds the radius), the same for the second variable of a two-variable cross-covariance
    against ``query.cross-covariance.cols.box``, and with ``group_by`` the records whose label
    is not declared.

    It charges nothing and publishes nothing: no ledger is opened and no output store is
    written. Its counts are exact functions of the data, **not** differentially private: they
    are for the curator only and must not be shared (docs/guide/privacy.md, "Trust model").

    Parameters
    ----------
    spec : ReleaseSpec, dict or path
        The release spec, or its YAML file (paths resolve as for :func:`release`); its privacy,
        mechanism, output and ledger sections are validated but not used.
    client : distributed.Client, optional
        Use this client.
    scheduler : str, optional
        Connect to this scheduler (ignored when ``client`` is given); default as for
        :func:`release`: ``DASK_SCHEDULER_ADDRESS``, else threads in this process for an input
        of at most ``IN_PROCESS_MAX_BYTES``, else a LocalCluster.
    progress : bool, default True
        Show progress.
    cluster : {"local", "kubernetes"}
        ``kubernetes``: an ephemeral dask-kubernetes cluster (extra ``[kubernetes]``).
    cluster_spec : path, optional
        Options of the ephemeral cluster.
    security : distributed.Security, optional
        TLS for ``scheduler`` (:func:`mvg_dask.engine.security.make_security`).

    Returns
    -------
    CheckReport
        The counts; ``str(report)`` is what ``mvg-dask check`` prints, ``report.to_dict()``
        what ``mvg-dask check --json`` prints.

    Raises
    ------
    SpecError
        An invalid spec.
    DataError
        The input store, its variables or a declared domain do not fit (from metadata, before
        any cluster starts), or chunks are missing.
    ReleaseError
        A chunk cannot be read, or the scheduler cannot be reached.

    Examples
    --------
    >>> report = api.check("spec.yaml")  # doctest: +SKIP
    >>> report.input.nan_total, report.input.outside  # doctest: +SKIP
    (0, 12)
    """
    from mvg_dask.engine.check import run_check, setup_check

    s = load(spec)
    metadata = read_input_metadata(s.input, s.group_by, s.cols_variable)
    setup = setup_check(s, metadata)
    if client is not None:
        return run_check(setup, client, progress=progress)
    from mvg_dask.engine.cluster import connect

    with connect(
        scheduler,
        cluster=cluster,
        cluster_spec=cluster_spec,
        security=security,
        # no release key travels: the transport rule that guards it does not apply
        insecure_transport=True,
        processes=metadata.nbytes > IN_PROCESS_MAX_BYTES,
    ) as new_client:
        return run_check(setup, new_client, progress=progress)


def preflight(
    spec: SpecLike | ReleasePlan,
    *,
    scheduler: str | None = None,
    probe: bool = True,
    release_id: str | None = None,
    output: str | None = None,
) -> ReleasePlan:
    """Refuse, from metadata alone, a release that would be refused later; nothing is read,
    written or charged, no cluster starts and neither dask nor xarray is imported.

    :func:`release` runs it before it starts a cluster; ``mvg-dask release --dry-run`` runs it
    after printing the plan (:func:`mvg_dask.engine.preflight.preflight` lists the checks).

    Parameters
    ----------
    spec : ReleaseSpec, dict, path or ReleasePlan
        The spec (planned with :func:`dry_run`), or a plan.
    scheduler : str, optional
        A scheduler address to probe (default: ``DASK_SCHEDULER_ADDRESS`` if set).
    probe : bool, default True
        Probe the scheduler (``False`` when the release brings its own client or cluster).
    release_id, output : str, optional
        Overrides, as for :func:`dry_run`.

    Returns
    -------
    ReleasePlan
        The plan, when nothing refuses it.

    Raises
    ------
    ReleaseError
        The output store holds another release or other data; the release id is in the ledger
        with another spec, committed without its output, or aborted; the scheduler does not
        answer within 5 s.
    BudgetError
        The spec's budget differs from the registered one, or the release would exceed it.
    LedgerError
        The ledger cannot be read.
    """
    from mvg_dask.engine.preflight import preflight as _preflight
    from mvg_dask.engine.preflight import probe_scheduler

    rplan = (
        spec
        if isinstance(spec, ReleasePlan)
        else dry_run(spec, release_id=release_id, output=output)
    )
    _preflight(rplan)
    if probe:
        env = os.environ.get("DASK_SCHEDULER_ADDRESS")
        if scheduler:
            probe_scheduler(scheduler, "--scheduler")
        elif env:
            probe_scheduler(env, "DASK_SCHEDULER_ADDRESS")
    return rplan


def performance_report_path(output_store: str, option: str | Path | bool | None) -> Path | None:
    """Where :func:`release` writes Dask's performance report (``None``: nowhere).

    Parameters
    ----------
    output_store : str
        The release's output store.
    option : path, bool or None
        A file path; ``True`` for ``<output>.performance-report.html`` beside a local output.

    Returns
    -------
    Path or None
        The report file.

    Raises
    ------
    ValueError
        ``True`` with an object-store output, a path inside the output store, an existing
        directory, or bokeh missing.
    """
    from mvg_dask.engine.store import Store

    output = Store(output_store)
    if option is None or option is False:
        return None
    if option is True:
        if not output.local:
            raise ValueError(
                "performance_report=True writes next to a local output; the output is "
                f"{output_store}: give the report a local file path"
            )
        out = output.path.resolve()
        path = out.with_name(f"{out.name}.performance-report.html")
    else:
        path = Path(option).resolve()
        if output.local:
            out = output.path.resolve()
            if path == out or out in path.parents:
                raise ValueError(
                    f"performance_report: {path} is inside the output store {out}; the report "
                    "is curator-side and must not be published with the release"
                )
    if path.is_dir():
        raise ValueError(f"performance_report: {path} is a directory; give a file path")
    import importlib.util

    if importlib.util.find_spec("bokeh") is None:
        raise ValueError(
            "performance_report needs bokeh: pip install 'mvg_dask[notebook]' (or bokeh>=3.1)"
        )
    return path


def _import_engine(rplan: ReleasePlan) -> None:
    """Import what running ``rplan`` needs on the client (the output format, zarr, the noise
    generator; for lattice noise its sampler; for an identity release, which reads its input
    through xarray as dask arrays, xarray and dask.array), while the
    embedded cluster starts (:func:`mvg_dask.engine.cluster.connect`'s ``while_starting``),
    without the garbage collector (:func:`mvg_dask._startup.imports_without_gc`)."""
    import importlib

    from mvg_dask.plan import stages as names

    modules = ["zarr", "randomgen", "mvg_dask.engine.release"]
    if names.IDENTITY in rplan.stages:
        modules += ["xarray", "dask.array"]
    if rplan.noise_kind == "lattice":
        modules.append("mvg_dask.noise.lattice")
    with imports_without_gc():
        for module in modules:
            importlib.import_module(module)


def _execute(
    rplan: ReleasePlan,
    client: Client,
    seed: int | None,
    progress: bool,
    insecure_transport: bool,
    report: Path | None,
) -> ReleaseResult:
    from mvg_dask.engine.release import execute_release

    if report is None:
        return execute_release(
            rplan, client, seed=seed, progress=progress, insecure_transport=insecure_transport
        )
    from distributed import performance_report as dask_report

    report.parent.mkdir(parents=True, exist_ok=True)
    with dask_report(filename=str(report)):
        return execute_release(
            rplan, client, seed=seed, progress=progress, insecure_transport=insecure_transport
        )


def preview(
    spec: SpecLike | ReleasePlan, *, release_id: str | None = None, output: str | None = None
) -> PlanPreview:
    """The dry run to read: the plan and what the ledger would have left (nothing reserved).

    Parameters
    ----------
    spec : ReleaseSpec, dict, path or ReleasePlan
        The spec (planned with :func:`dry_run`), or a plan.
    release_id, output : str, optional
        Overrides, as for :func:`dry_run`.

    Returns
    -------
    PlanPreview
        ``.text()`` is what ``mvg-dask release --dry-run`` prints; a notebook shows a table.
    """
    from mvg_dask.engine.preview import preview as _preview

    rplan = (
        spec
        if isinstance(spec, ReleasePlan)
        else dry_run(spec, release_id=release_id, output=output)
    )
    return _preview(rplan)


def open_release(store: str, *, period: int | str | None = None, **kwargs: Any) -> xr.Dataset:
    """Open a released dataset, refusing one that is not complete.

    Parameters
    ----------
    store : str
        Output store path or URL.
    period : int or str, optional
        A stream's store (docs/guide/streams.md): this period alone (its index or label), a
        complete release whose ``.mvg`` gives the period's accuracy; default: every complete
        period along a ``period`` dimension.
    **kwargs
        Passed to :func:`xarray.open_zarr`.

    Returns
    -------
    xarray.Dataset
        The release (its ``.mvg`` accessor is registered by ``import mvg_dask.xarray``).
    """
    from mvg_dask.engine.output import open_release as _open
    from mvg_dask.engine.stream_store import is_stream_store, open_period, open_stream

    options = kwargs.get("storage_options")
    if is_stream_store(store, options):
        if period is not None:
            return open_period(store, period, storage_options=options)
        return open_stream(store, storage_options=options)
    if period is not None:
        raise ValueError(f"{store} is not a stream's store: it has no periods")
    return _open(store, **kwargs)
