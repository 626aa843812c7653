"""What every worker process of the embedded cluster loads as it starts (a Dask preload).

A worker process needs the release's task modules (and with them zarr, the codecs, the plan
layer and the keyed noise), and for an identity release with lattice noise also numba's
compiled kernels (docs/lattice.md). The embedded LocalCluster
(:func:`mvg_dask.engine.cluster.local_cluster`) names this module as its workers' preload.

On Linux the cluster forks its worker processes from the client, which has imported all of that
already (and loaded the kernels, when the release needs them): :func:`dask_setup` then finds
everything in place. A forked process keeps the allocator and the BLAS thread pool the client
started with: the environment the nanny sets for its workers
(``distributed.nanny.pre-spawn-environ``: glibc's malloc thresholds, one BLAS thread) is read by
those libraries only when a process starts, so :func:`apply_worker_environment` applies it
again, in the worker, before any task runs.

A spawned worker (elsewhere, or one the nanny restarts) imports them here, before it registers
with the scheduler. They used to be imported in a background thread while the worker already
served; a scatter that arrived meanwhile imported the plan layer in the event loop's thread at
the same time, and the two threads' imports of its circular modules met half-initialized
(``ImportError: cannot import name 'NoisePlan' from partially initialized module``). No value,
key or byte depends on when the modules are loaded.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import click

log = logging.getLogger("mvg_dask")

#: The modules a release's tasks are defined in (imported when a task is deserialized).
TASK_MODULES = (
    "mvg_dask.engine.tasks.gram",
    "mvg_dask.engine.tasks.identity",
    "mvg_dask.engine.tasks.panels",
    "mvg_dask.engine.tasks.low_rank",
    "mvg_dask.engine.lattice",  # the identity stage's scattered lattice parameters
)


@click.command()
@click.option("--kernels", is_flag=True, help="Also load numba's lattice kernels.")
def dask_setup(worker: Any, kernels: bool) -> None:
    """Apply the nanny's environment and load the task modules (and with ``--kernels`` the
    lattice kernels) in this worker process, before it registers (instant in a forked worker,
    which has them)."""
    apply_worker_environment()
    load(kernels)
    if TOUCH_BYTES:  # in the thread that will run the tasks, while the worker registers
        worker.executor.submit(touch_heap, TOUCH_BYTES)


#: The heap a worker's task thread faults in as the worker starts (:func:`touch_heap`).
TOUCH_BYTES = 48 * 2**20


def touch_heap(nbytes: int, block: int = 8 * 2**20) -> None:
    """Allocate ``nbytes`` in blocks of ``block`` bytes, write every page, and free them: the
    calling thread's malloc arena then holds them (below glibc's trim threshold, the workers'
    ``MALLOC_TRIM_THRESHOLD_``), so that its first tasks' chunk-sized buffers reuse pages
    already mapped instead of faulting fresh ones while they run."""
    import threading

    import numpy as np

    blocks = []
    for _ in range(max(0, nbytes // block)):
        b = np.empty(block, dtype=np.uint8)
        b[::4096] = 1  # one write per page
        blocks.append(b)
    del blocks
    touched.append(threading.current_thread().name)


#: The threads :func:`touch_heap` has run in (this process).
touched: list[str] = []


def load(kernels: bool = False) -> None:
    """Import the task modules, and with ``kernels`` load the lattice kernels (idempotent; a
    failure is left for the task that needs the module to report)."""
    try:
        for name in TASK_MODULES:
            importlib.import_module(name)
        if kernels:
            from mvg_dask.engine.warmup import load_kernels

            load_kernels()
    except Exception as exc:  # pragma: no cover - the first task raises it again
        log.debug("worker set-up incomplete: %s", type(exc).__name__)


#: glibc's ``mallopt`` parameters (``malloc.h``) and the variables that set them at start-up.
_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}


def apply_worker_environment() -> None:
    """Apply the malloc thresholds and the BLAS thread count of this process's environment
    (the nanny's ``pre-spawn-environ``) to the libraries already loaded: a worker forked from
    the client inherits the client's settings, which the environment no longer changes
    (idempotent in a worker that was started afresh; best effort: Linux, glibc; the BLAS
    libraries threadpoolctl knows)."""
    apply_malloc_settings(os.environ)
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "")
    if threads.isdigit():
        from threadpoolctl import threadpool_limits

        threadpool_limits(int(threads), user_api="blas")


def blas_threads_per_task(tasks: int) -> AbstractContextManager[object]:
    """While in the context, the BLAS libraries loaded in this process run
    ``cpu_count // tasks`` threads per call (at least one), then what they ran before: for a
    cluster of threads in this process running ``tasks`` tasks at once, as its worker processes
    would run with the nanny's ``OPENBLAS_NUM_THREADS=1``. Left alone, each of its concurrent
    BLAS calls (a chunk's Gram product, say) would start a thread per core, and the calls'
    threads would contend for the same cores (a release of 10^6 x 64 spent 0.41 s on its Gram
    products instead of 0.29 s). A library loaded while in the context (scipy's own OpenBLAS,
    say) starts with its default."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(max(1, (os.cpu_count() or 1) // max(1, tasks)), user_api="blas")


def apply_malloc_settings(env: Mapping[str, str]) -> None:
    """Set glibc's malloc thresholds named in ``env`` (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_``: :data:`mvg_dask.engine.kube.WORKER_MALLOC_ENV`) in this process
    now, as glibc reads them from the environment at a process's start (best effort: Linux,
    glibc). A worker forked from the client applies its nanny's; the command line's process
    applies the workers' own before it runs a cluster of threads
    (:func:`mvg_dask.engine.cluster.connect`), whose tasks then reuse their chunk-sized buffers
    as a worker process's do, instead of mapping and faulting fresh pages for each."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for name, param in _MALLOPT.items():
        value = env.get(name)
        if value and value.isdigit():
            mallopt(ctypes.c_int(param), ctypes.c_int(int(value)))
