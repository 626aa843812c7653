"""Dask clients: an existing scheduler, or the embedded LocalCluster sized to the machine."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster, Nanny, as_completed, wait
from distributed.core import Status

from mvg_dask.errors import ReleaseError

log = logging.getLogger("mvg_dask")

#: The embedded cluster's worker preload (:mod:`mvg_dask.engine.worker_setup`).
WORKER_SETUP = "mvg_dask.engine.worker_setup"
#: The embedded cluster's worker processes can be forked from this one (Linux), which has
#: imported dask, distributed, numpy and the task modules already, instead of spawned as fresh
#: interpreters that import them again (about 0.7 s of CPU each); see :func:`fork_workers`.
FORK_WORKERS = sys.platform == "linux"
#: ... unless this process, once it has imported what the release needs, is resident for more
#: than this fraction of a worker's memory limit: a forked worker's resident size counts the
#: pages it shares with this process, and its nanny holds them against that limit (a spawned
#: worker starts at about 0.15-0.25 GB of its own after its imports; a command line's process
#: is about 0.15 GB after the engine's imports, 0.27 GB with numba's kernels). A quarter keeps
#: a forked worker well below the fraction at which dask starts to spill (0.6 by default).
FORK_MAX_SHARE = 0.25
#: How long the embedded cluster may take to start (seconds): each worker must have started
#: (its preload included) and registered within it, else the release fails before anything is
#: charged (:class:`ClusterStartError`).
START_TIMEOUT = 60.0


class ClusterStartError(ReleaseError):
    """The embedded cluster did not start (a worker process failed or hung at its start);
    raised before anything is read or charged."""


def fork_allowed() -> bool:
    """Whether this process may fork the embedded cluster's worker processes at all: only the
    command line's (``mvg_dask._startup.FORK_WORKERS``: one command, no other thread that could
    hold a lock at the fork), on Linux (:data:`FORK_WORKERS`)."""
    from mvg_dask import _startup

    return FORK_WORKERS and _startup.FORK_WORKERS


def worker_memory_limit(n_workers: int, memory_limit: str | int | None = None) -> int:
    """The memory limit, in bytes, of each of the embedded cluster's ``n_workers`` workers
    (dask's reading of ``memory_limit``; by default the machine's memory shared among them)."""
    from distributed.system import MEMORY_LIMIT
    from distributed.worker_memory import parse_memory_limit

    limit = parse_memory_limit(
        "auto" if memory_limit is None else memory_limit, 1, max(1, n_workers), logger=log
    )
    return int(limit or MEMORY_LIMIT)


def fork_workers(worker_memory: int) -> bool:
    """Whether the embedded cluster's worker processes are forked from this process rather
    than spawned: when it may (:func:`fork_allowed`) and is resident for at most
    :data:`FORK_MAX_SHARE` of ``worker_memory`` (a worker's memory limit, bytes). Measured when
    it is called: :func:`connect` calls it once this process has imported what the release
    needs (and loaded the kernels), just before the cluster starts."""
    if not fork_allowed():
        return False
    try:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return False
    return resident <= FORK_MAX_SHARE * worker_memory


def local_cluster(
    n_workers: int | None = None,
    *,
    memory_limit: str | int | None = None,
    threads_per_worker: int = 1,
    processes: bool = True,
    loop: Any = None,
    kernels: bool = False,
    fork: bool | None = None,
) -> LocalCluster:
    """The embedded cluster: worker processes on loopback, no fixed dashboard port.

    The one place a LocalCluster is made (the CLI, the API, the tests and the benchmarks).

    From the command line on Linux (:func:`fork_workers`) the worker processes are forked from
    this process: each starts with what this one has imported, and sets the nanny's environment
    (malloc thresholds, one BLAS thread) in its preload
    (:func:`mvg_dask.engine.worker_setup.apply_worker_environment`). Only the cluster's first
    workers are forked; one the nanny restarts later is spawned afresh (dask's default), so no
    fork happens while a release's threads run; :func:`connect` runs its ``while_starting``
    first when it forks. Elsewhere (a library process: a notebook, a test runner) they are
    spawned.

    Parameters
    ----------
    n_workers : int, optional
        Workers (default: one per core).
    memory_limit : str or int, optional
        Memory limit per worker (default: machine memory / workers).
    threads_per_worker : int, default 1
        Threads per worker (the tasks are numpy-bound: one thread per core).
    processes : bool, default True
        Worker processes (``False``: threads in this process). Either way the scheduler
        serves Dask's dashboard only in a Jupyter kernel (with the ``notebook`` extra).
    loop : tornado.ioloop.IOLoop, optional
        A running event loop to run on (default: the cluster starts its own, and stops it when
        it closes).
    kernels : bool, default False
        The worker processes also load numba's lattice kernels as they start (an identity
        release with lattice noise; :mod:`mvg_dask.engine.worker_setup`).
    fork : bool, optional
        Fork the worker processes from this one (default: :func:`fork_workers`, measured now);
        otherwise they are spawned (dask's default).

    Returns
    -------
    distributed.LocalCluster
        The running cluster (close it, or use it as a context manager).

    Raises
    ------
    ClusterStartError
        A worker did not start and register within :data:`START_TIMEOUT` (a preload that
        hangs, a process that cannot start); the cluster is closed.
    """
    import dask

    from mvg_dask.engine.kube import WORKER_MALLOC_ENV

    kwargs: dict[str, Any] = {} if memory_limit is None else {"memory_limit": memory_limit}
    if processes:
        kwargs["host"] = "127.0.0.1"
        kwargs["worker_class"] = _Nanny  # a start-up timeout (START_TIMEOUT)
        # each worker process loads the task modules (and the kernels) as it starts, off the
        # critical path of its first task
        kwargs["preload"] = [*dask.config.get("distributed.worker.preload", []), WORKER_SETUP]
        kwargs["preload_argv"] = ["--kernels"] if kernels else []
    # the nannies read this when they are made: glibc's dynamic mmap threshold stays on in the
    # workers (cluster/dask.yaml), so chunk-sized buffers are reused instead of mmapped afresh
    env = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **WORKER_MALLOC_ENV}
    silence = _silence_level()  # the workers log only what is critical
    config: dict[str, Any] = {"distributed.nanny.pre-spawn-environ": env}
    workers = n_workers or max(1, os.cpu_count() or 1)
    if fork is None:
        fork = fork_workers(worker_memory_limit(workers, memory_limit))
    if processes and fork:
        config["distributed.worker.multiprocessing-method"] = "fork"
    try:
        with dask.config.set(config), warnings.catch_warnings():
            # Python 3.12+ warns of any fork in a process with threads (the event loop's own)
            warnings.filterwarnings(
                "ignore", r".*fork\(\) may lead to deadlocks", DeprecationWarning
            )
            return LocalCluster(
                n_workers=workers,
                threads_per_worker=threads_per_worker,
                processes=processes,
                dashboard_address=":0",
                # a dashboard only in a notebook, where its link is shown: importing bokeh for
                # it costs 0.5-0.7 s of CPU (1-1.5 s of a cold release's wall time on a loaded
                # machine), and from the command line its random port is never shown; the
                # scheduler's HTTP server stays on a free port
                scheduler_kwargs=None if processes and _in_notebook() else {"dashboard": False},
                silence_logs=silence,
                loop=loop,
                **kwargs,
            )
    except TimeoutError:  # from a worker process that did not start in time (_Nanny)
        raise ClusterStartError(
            f"the embedded Dask cluster did not start within {START_TIMEOUT:g} s (a worker "
            "process failed or hung at its start: its preload, or the machine's load); nothing "
            "was charged; set MVG_DASK_DEBUG=1 to see the workers' logs"
        ) from None


class _Nanny(Nanny):
    """The embedded cluster's nanny: its worker process must start (its preload included) and
    register within :data:`START_TIMEOUT`, else it is killed and the start fails with
    ``TimeoutError``.

    Dask's own ``death_timeout`` cannot be used for this: on its timeout the nanny asks the
    worker process to stop while that process is still marked as starting, which fails, and the
    cluster's close then waits for that nanny forever."""

    async def instantiate(self) -> Status:
        try:
            return await asyncio.wait_for(super().instantiate(), START_TIMEOUT)
        except TimeoutError:
            await self._kill_starting_process()
            raise

    async def _kill_starting_process(self) -> None:
        """Kill the worker process that did not start, and mark it stopped (so that the
        nanny's close does not wait for it)."""
        import signal

        worker = self.process
        proc = None if worker is None else worker.process
        if proc is None:
            return
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        try:
            await proc.join(5)
        except TimeoutError:  # pragma: no cover - SIGKILL is not refused
            log.debug("a killed worker process has not exited yet")
        if worker is not None and worker.status == Status.starting:
            worker.status = Status.failed


def scheduler_address(scheduler: str | None = None) -> tuple[str | None, str]:
    """The scheduler to use and where its address came from.

    ``scheduler`` wins; otherwise dask's ``scheduler-address`` setting, which the environment
    variable ``DASK_SCHEDULER_ADDRESS`` sets (the dask-kubernetes operator sets it in a DaskJob's
    job pod); ``(None, "local")`` means the embedded LocalCluster.
    """
    if scheduler:
        return scheduler, "--scheduler"
    import dask

    configured = dask.config.get("scheduler-address", None)
    if configured:
        source = (
            "DASK_SCHEDULER_ADDRESS" if os.environ.get("DASK_SCHEDULER_ADDRESS") else "dask config"
        )
        return str(configured), source
    return None, "local"


@contextmanager
def connect(
    scheduler: str | None = None,
    *,
    cluster: str = "local",
    cluster_spec: str | Path | None = None,
    security: Any = None,
    seeded: bool = False,
    insecure_transport: bool = False,
    n_workers: int | None = None,
    memory_limit: str | None = None,
    timeout: str = "30s",
    cluster_class: Any = None,
    processes: bool = True,
    kernels: bool = False,
    while_starting: Callable[[], object] | None = None,
) -> Iterator[Client]:
    """Yield a client: an ephemeral Kubernetes cluster, a given scheduler (or
    ``DASK_SCHEDULER_ADDRESS``), else a new LocalCluster on loopback.

    Parameters
    ----------
    scheduler : str, optional
        Scheduler address such as ``tls://10.0.0.5:8786``.
    cluster : {"local", "kubernetes"}
        ``kubernetes``: an ephemeral dask-kubernetes cluster, deleted on exit
        (:func:`mvg_dask.engine.kube.kube_cluster`).
    cluster_spec : path, optional
        Options of the ephemeral cluster (YAML).
    security : distributed.Security, optional
        TLS settings (:func:`mvg_dask.engine.security.make_security`).
    seeded : bool
        The release uses a user seed (its key is not secret).
    insecure_transport : bool
        Accept plaintext transport of a private key to a remote scheduler.
    n_workers : int, optional
        LocalCluster workers (default: one per core, one thread each).
    memory_limit : str, optional
        LocalCluster memory limit per worker (default: machine memory / workers).
    timeout : str, default "30s"
        How long to try to reach an existing scheduler.
    cluster_class : type, optional
        The ``KubeCluster`` class (tests inject one that runs on loopback).
    processes : bool, default True
        The LocalCluster's workers are processes (``False``: threads in this process, for small
        inputs).
    kernels : bool, default False
        The LocalCluster's worker processes load the lattice kernels as they start.
    while_starting : callable, optional
        Called in this thread while a new LocalCluster of threads starts in another (the
        client's own imports, for instance), so that both proceed at once; before a cluster
        whose worker processes are forked from this one starts, so that they inherit it.

    Yields
    ------
    distributed.Client
        The client; closed (with its cluster) on exit.

    Raises
    ------
    ReleaseError
        When a given scheduler cannot be reached (never a silent local run instead), or the
        transport would expose a private key (checked before connecting).
    """
    if cluster == "kubernetes":
        with _kubernetes_client(
            scheduler, cluster_spec, security, seeded, insecure_transport, cluster_class
        ) as client:
            yield client
        return
    if cluster != "local":
        raise ReleaseError(f"--cluster must be local or kubernetes, got {cluster!r}")
    if cluster_spec is not None:
        raise ReleaseError("--cluster-spec needs --cluster kubernetes")
    address, source = scheduler_address(scheduler)
    if address is not None:
        with _remote_client(
            address, source, security, seeded, insecure_transport, timeout
        ) as client:
            yield client
        return
    if security is not None:
        raise ReleaseError("TLS options need --scheduler tls://HOST:PORT")
    with _local_client(n_workers, memory_limit, processes, kernels, while_starting) as client:
        yield client


#: After the embedded cluster has closed, its event loop runs at most this long (in steps of
#: :data:`SETTLE_STEP`, until nothing the close left is scheduled) before it is stopped; see
#: :func:`_local_client`.
SETTLE_SECONDS = 0.05
SETTLE_STEP = 0.005


@contextmanager
def _local_client(
    n_workers: int | None,
    memory_limit: str | None,
    processes: bool,
    kernels: bool = False,
    while_starting: Callable[[], object] | None = None,
) -> Iterator[Client]:
    """:func:`connect` without a scheduler: a new LocalCluster, closed on exit.

    The cluster and its client run on an event loop (in its own thread) that this function owns
    and stops last. Left to itself, ``LocalCluster.close`` stops its loop as soon as the
    cluster reports closed, while the comms' batched senders may still be waiting on a timeout
    (tornado futures, every few milliseconds): a timeout that fires during the loop's teardown
    sets a ``TimeoutError`` that its coroutine never reads, and asyncio reports it when the
    future is collected, as ``Future exception was never retrieved ... TimeoutError``, after a
    release that succeeded. Here the loop runs after the close until every such coroutine has
    read its outcome and ended (at most :data:`SETTLE_SECONDS`, :func:`_settle`), and only then
    stops
    (:func:`_close_cluster` says how a slow worker process's exit is handled).

    With ``while_starting``, the cluster starts in a helper thread while this thread calls it
    (a cluster of threads, or spawned worker processes), or after it returns when this process
    may fork the workers (:func:`fork_allowed`; with ``kernels``, this process then also loads
    the lattice kernels before it forks them). Whether it forks them is decided then, with this
    process's size after those imports (:func:`fork_workers`).
    """
    from distributed.utils import LoopRunner, silence_logging_cmgr, sync

    may_fork = processes and fork_allowed()
    if not processes and fork_allowed():  # the command line's process: its allocator
        from mvg_dask.engine.kube import WORKER_MALLOC_ENV
        from mvg_dask.engine.worker_setup import apply_malloc_settings

        apply_malloc_settings(WORKER_MALLOC_ENV)  # as in a worker process (see its docstring)
    if may_fork and kernels:  # loaded once here, before the fork, instead of in every worker
        while_starting = _with_kernels(while_starting)
    limit = worker_memory_limit(n_workers or max(1, os.cpu_count() or 1), memory_limit)
    runner = LoopRunner(asynchronous=False)
    # dask's log level, which the cluster silences while it runs, is restored only after its
    # loop has stopped: a comm's batched sender cut off by the close logs an INFO traceback
    # ("Batched Comm Closed") as the loop settles or stops, after the cluster's own restore
    with silence_logging_cmgr(_silence_level()):
        runner.start()
        own = sync(runner.loop, _loop_tasks)
        restore_environ = _own_environ()
        try:
            try:
                cluster = _start_meanwhile(
                    lambda: local_cluster(
                        n_workers,
                        memory_limit=memory_limit,
                        processes=processes,
                        loop=runner.loop,
                        kernels=kernels,
                        fork=may_fork and fork_workers(limit),  # measured after while_starting
                    ),
                    while_starting,
                    overlap=not may_fork,
                )
            finally:
                restore_environ()
            try:
                client = Client(cluster)
                try:
                    with _task_blas(processes, cluster):
                        yield client
                finally:
                    client.close()
            finally:
                _close_cluster(cluster)
                sync(runner.loop, _settle, own)
                restore_environ()  # a worker the nanny restarted meanwhile wrote it again
        finally:
            runner.stop()


def _own_environ() -> Callable[[], None]:
    """A function that puts this process's environment back as it is now: a dask nanny writes
    its ``pre-spawn-environ`` (one BLAS and OpenMP thread, malloc thresholds) into the
    environment of the process that starts it, before it starts its worker (or restarts one),
    and leaves it there. A notebook's libraries loaded afterwards (scipy's BLAS, say) would then
    run one thread, and its subprocesses inherit the settings. :func:`_local_client` calls it
    once the cluster has started and again after it has closed; the workers have their own
    copy."""
    import dask

    from mvg_dask.engine.kube import WORKER_MALLOC_ENV

    keys = {*dask.config.get("distributed.nanny.pre-spawn-environ", {}), *WORKER_MALLOC_ENV}
    before = {key: os.environ.get(key) for key in keys}

    def restore() -> None:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    return restore


def _silence_level() -> int:
    """The level of the embedded cluster's own log lines (a worker's heartbeat failing while
    the cluster shuts down, a task's traceback), which would reach the user's terminal: every
    error of a release is raised on the client as one line, so only what is critical is logged
    (``MVG_DASK_DEBUG=1`` keeps the warnings)."""
    return logging.WARNING if os.environ.get("MVG_DASK_DEBUG") else logging.CRITICAL


def _task_blas(processes: bool, cluster: LocalCluster) -> AbstractContextManager[object]:
    """For a cluster of threads in this process, the BLAS threads per call that its tasks
    share the cores with (:func:`mvg_dask.engine.worker_setup.blas_threads_per_task`), set
    after the client's imports and restored when it closes; worker processes set their own."""
    if processes:
        return nullcontext()
    from mvg_dask.engine.worker_setup import blas_threads_per_task

    specs = cluster.worker_spec.values()
    return blas_threads_per_task(sum(w.get("options", {}).get("nthreads", 1) for w in specs))


def _close_cluster(cluster: LocalCluster) -> None:
    """Close the embedded cluster. On a loaded machine a worker process can outlive the
    nanny's deadline: the nanny kills it and then waits for its exit with whatever time is left,
    possibly none, and ``LocalCluster.close`` raises that wait's ``TimeoutError``. The release
    has finished by then (it is complete, or its own error is being raised), and the killed
    process is reaped by the nanny's watcher: the timeout is logged, not raised."""
    try:
        cluster.close()
    except TimeoutError:
        log.debug("the embedded cluster's worker processes were killed on close (timeout)")


def _with_kernels(meanwhile: Callable[[], object] | None) -> Callable[[], object]:
    """``meanwhile``, then the lattice kernels loaded in this process
    (:func:`mvg_dask.engine.warmup.load_kernels`): the workers forked after it start with
    them, instead of each importing numba and loading them while its first task waits."""

    def both() -> None:
        from mvg_dask.engine.warmup import load_kernels

        if meanwhile is not None:
            meanwhile()
        load_kernels()

    return both


def _start_meanwhile(
    start: Callable[[], LocalCluster],
    meanwhile: Callable[[], object] | None,
    *,
    overlap: bool = True,
) -> LocalCluster:
    """``start()`` in a helper thread while this thread runs ``meanwhile()``; the cluster, or
    the exception of either (a cluster that started is closed if ``meanwhile`` fails).

    Without ``overlap`` (a cluster that forks its workers), ``meanwhile()`` runs first and the
    cluster starts after it: a fork while this thread imports could leave a module's import lock
    held in the child, and the forked workers inherit what ``meanwhile`` imported."""
    if meanwhile is None:
        return start()
    if not overlap:
        meanwhile()
        return start()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="mvg-dask-cluster-start") as pool:
        started = pool.submit(start)
        try:
            meanwhile()
        except BaseException:
            cluster = started.exception() is None and started.result()
            if cluster:
                cluster.close()
            raise
        return started.result()


async def _settle(before: frozenset[asyncio.Task[Any]] = frozenset()) -> None:
    """Run the loop until what a close left scheduled has run to its end: no task but those of
    ``before`` (the loop's own, from before the cluster started) and no live timer due within
    :data:`SETTLE_SECONDS`; at most :data:`SETTLE_SECONDS`, in steps of :data:`SETTLE_STEP`.
    A close that left nothing (the usual case: every comm closed, its timers cancelled) returns
    after one step, instead of waiting for the whole interval."""
    loop = asyncio.get_running_loop()
    for _ in range(round(SETTLE_SECONDS / SETTLE_STEP)):
        await asyncio.sleep(SETTLE_STEP)
        if _settled(loop, before):
            return


def _settled(loop: asyncio.AbstractEventLoop, before: frozenset[asyncio.Task[Any]]) -> bool:
    """No task running on ``loop`` but this one and ``before``, and no live timer due within
    :data:`SETTLE_SECONDS` (asyncio's scheduled handles; a loop without them counts none)."""
    current = asyncio.current_task()
    if any(t is not current and t not in before for t in asyncio.all_tasks(loop)):
        return False
    soon = loop.time() + SETTLE_SECONDS
    timers = getattr(loop, "_scheduled", ())
    return not any(not h.cancelled() and h.when() <= soon for h in timers)


async def _loop_tasks() -> frozenset[asyncio.Task[Any]]:
    """The tasks of the running loop (but this one): its own, before a cluster starts on it."""
    current = asyncio.current_task()
    return frozenset(t for t in asyncio.all_tasks() if t is not current)


@contextmanager
def _kubernetes_client(
    scheduler: str | None,
    cluster_spec: str | Path | None,
    security: Any,
    seeded: bool,
    insecure_transport: bool,
    cluster_class: Any,
) -> Iterator[Client]:
    """:func:`connect` with ``cluster="kubernetes"``: an ephemeral cluster, deleted on exit."""
    from mvg_dask.engine.kube import KubernetesError, kube_cluster, load_cluster_options
    from mvg_dask.engine.security import check_transport

    if scheduler is not None:
        raise KubernetesError("--cluster kubernetes creates its own scheduler: drop --scheduler")
    if security is not None:
        raise KubernetesError(
            "--cluster kubernetes cannot use TLS (dask-kubernetes' KubeCluster connects over "
            "tcp:// only): run a DaskJob or DaskCluster with TLS from cluster/ instead"
        )
    options = load_cluster_options(cluster_spec)
    # the operator's scheduler service: plaintext, inside the pod network
    check_transport(f"tcp://{options.name or 'mvg'}-scheduler:8786", seeded, insecure_transport)
    with kube_cluster(options, cluster_class=cluster_class) as client:
        yield client


@contextmanager
def _remote_client(
    address: str,
    source: str,
    security: Any,
    seeded: bool,
    insecure_transport: bool,
    timeout: str,
) -> Iterator[Client]:
    """:func:`connect` to a running scheduler at ``address`` (named by ``source``)."""
    from mvg_dask.engine.preflight import probe_scheduler
    from mvg_dask.engine.security import check_transport

    check_transport(address, seeded, insecure_transport)
    probe_scheduler(address, source)  # distributed would retry for the whole timeout
    try:
        client = Client(address, timeout=timeout, security=security)
    except (OSError, TimeoutError) as exc:
        raise ReleaseError(
            f"cannot reach the Dask scheduler at {address} (from {source}): "
            f"{type(exc).__name__}; start it, fix the address, or unset it to run locally"
        ) from None
    except Exception as exc:  # something answers on the port, but not a Dask scheduler
        raise ReleaseError(
            f"the server at {address} (from {source}) does not speak Dask's protocol "
            f"({type(exc).__name__}); is it a Dask scheduler's address?"
        ) from None
    try:
        yield client
    finally:
        close_client(client)


def _in_notebook() -> bool:
    """True inside a Jupyter kernel with ipywidgets installed (extra ``[notebook]``)."""
    if "ipykernel" not in sys.modules:
        return False
    import importlib.util

    if importlib.util.find_spec("ipywidgets") is None:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and "IPKernelApp" in shell.config


class Progress:
    """Progress over a known number of tasks: a widget in a notebook, a bar in a terminal, log
    lines otherwise.

    With a private total (add-remove neighbours: the chunk count would tell the record count)
    there is no bar, only one log line per 10 % step, the same lines for any chunk count.
    """

    def __init__(
        self, total: int, label: str, *, enabled: bool = True, private_total: bool = False
    ) -> None:
        self.total = max(total, 1)
        self.label = label
        self.private_total = private_total
        self.done = 0
        self.enabled = enabled
        self._bar: Any = None
        self._next_log = 0.1
        if enabled and not private_total and _in_notebook():
            from tqdm.notebook import tqdm as widget_bar  # an ipywidgets progress bar

            self._bar = widget_bar(total=self.total, desc=label, unit="task")
        elif enabled and sys.stderr.isatty() and not private_total:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=label, unit="task", file=sys.stderr)
        elif enabled and not private_total:
            log.info("%s: %d tasks", label, total)

    def update(self, n: int = 1) -> None:
        """Record ``n`` finished tasks."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and self.done / self.total >= self._next_log:
            if self.private_total:
                # the chunk count would tell the record count: every 10% step is logged once,
                # so the lines are the same for any number of chunks
                while self._next_log <= self.done / self.total:
                    log.info("%s: %.0f%%", self.label, 100 * self._next_log)
                    self._next_log += 0.1
            else:
                log.info(
                    "%s: %d/%d tasks (%.0f%%)",
                    self.label,
                    self.done,
                    self.total,
                    100 * self.done / self.total,
                )
            while self._next_log <= self.done / self.total:
                self._next_log += 0.1

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.close()


def close_client(client: Client) -> None:
    """Close ``client``. One that has lost its scheduler is still trying to reconnect, and
    closing it cancels that attempt, which distributed logs as an error with a traceback: the
    release has already reported the lost scheduler in one line, so that log is left out."""
    if client.status == "running":
        client.close()
        return
    logger = logging.getLogger("distributed.client")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        client.close()
    finally:
        logger.setLevel(level)


def gather_with_progress(
    client: Client,
    futures: list[Any],
    progress: Progress,
    *,
    keep: bool = True,
    on_result: Callable[[int], None] | None = None,
    on_failure: Callable[[], None] | None = None,
) -> list[Any]:
    """Wait for every future, updating ``progress``; stop at the first failure.

    A task's expected failure is an :class:`~mvg_dask.engine.tasks.outcome.Outcome` carrying an
    error; it is raised here. After a failure, ``on_failure`` runs (it tells the remaining tasks to
    do nothing) and this function waits until *every* task has finished before it raises, so that
    no task is still writing when the caller cleans up. (Cancelling futures does not stop a task
    that is already running.)

    Parameters
    ----------
    client : distributed.Client
        The client.
    futures : list of Future
        Futures to wait for.
    progress : Progress
        Progress reporter.
    keep : bool
        Collect the results (``False``: only wait, results stay on the workers).
    on_result : callable, optional
        Called with the number of finished futures after each one.
    on_failure : callable, optional
        Called once at the first failure, before waiting for the in-flight tasks.

    Returns
    -------
    list
        Results in the order of ``futures`` (``None`` entries when ``keep`` is False).
    """
    from mvg_dask.engine.tasks.outcome import Outcome

    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    done = 0
    try:
        for fut in as_completed(futures):
            if fut.status == "error":
                fut.result()  # raises the task's own (unexpected) exception
            if keep:
                result = fut.result()
                if isinstance(result, Outcome):
                    result.unwrap()  # raises an expected error as a one-line message
                results[index[fut.key]] = result
            done += 1
            progress.update()
            if on_result is not None:
                on_result(done)
    except BaseException:
        stop_tasks(client, futures, on_failure)
        raise
    finally:
        progress.close()
    return results


def stop_tasks(
    client: Client, futures: list[Any], on_failure: Callable[[], None] | None = None
) -> None:
    """After a failure: run ``on_failure`` (it tells the remaining tasks to do nothing), then
    wait until every task has finished, so that none is still writing when the caller cleans up.

    Both are best effort and never hide the failure being handled: ``on_failure`` may meet the
    same fault (a full disk, a failing object store), and with the scheduler lost there is
    nothing to wait for (the tasks of a resumed run rewrite any chunk that was being written).
    """
    if on_failure is not None:
        try:
            on_failure()
        except Exception as exc:
            log.debug("could not mark the release as failed: %r", exc)
    if client.status != "running":
        return
    try:
        wait(futures)
    except Exception as exc:
        log.debug("could not wait for the release's tasks: %r", exc)
