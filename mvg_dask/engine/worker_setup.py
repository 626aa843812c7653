"""What every worker process of the embedded cluster loads as it starts (a Dask preload).

A fresh worker process imports the release's task modules (and with them zarr, the codecs, the
plan layer and the keyed noise) when its first task arrives, and an identity release with lattice
noise also loads numba's compiled kernels there (docs/lattice.md). Both sit on the critical path
of a cold release: the first task of each worker waits for them. The embedded LocalCluster
(:func:`mvg_dask.engine.cluster.local_cluster`) names this module as its workers' preload:
:func:`dask_setup` starts the same imports in a background thread as soon as the worker process
exists, so that they overlap the cluster's start, the ledger's reservation, the output's
skeleton and the graph's construction on the client. A task that needs a module before it is
loaded waits for the same import (Python imports a module once, under its lock), so nothing
changes but when the work is done: no value, key or byte depends on it.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

import click

log = logging.getLogger("mvg_dask")

#: The modules a release's tasks are defined in (imported when a task is deserialized).
TASK_MODULES = (
    "mvg_dask.engine.tasks.gram",
    "mvg_dask.engine.tasks.identity",
    "mvg_dask.engine.tasks.panels",
    "mvg_dask.engine.tasks.low_rank",
)


@click.command()
@click.option("--kernels", is_flag=True, help="Also load numba's lattice kernels.")
def dask_setup(worker: Any, kernels: bool) -> None:
    """Start loading the task modules (and with ``--kernels`` the lattice kernels) in this
    worker process, in a daemon thread: the worker registers and serves meanwhile."""
    threading.Thread(
        target=load, args=(kernels,), name="mvg-dask-worker-setup", daemon=True
    ).start()


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
