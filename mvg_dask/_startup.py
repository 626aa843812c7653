"""Start-up helpers: importing a command's libraries without the cyclic garbage collector."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: Set by the command line (one command, then the process exits): after each block of
#: :func:`imports_without_gc` that imported something (start-up; a command that runs several
#: releases imports nothing new for the later ones), every object alive is moved to the
#: collector's permanent generation (:func:`gc.freeze`), so that it is not walked again by later
#: collections. A library process (a notebook, a service) keeps it off: there, objects frozen
#: would never be collected.
FREEZE_AFTER_IMPORTS = False
#: Set by the command line too: the embedded cluster forks its worker processes from this one
#: (:func:`mvg_dask.engine.cluster.fork_workers`). A library process keeps it off: other threads
#: of a notebook or a test runner may hold a lock (a file's buffer, a log handler's stream) at
#: the moment of the fork, and the forked worker would wait on it forever. With it, a cluster of
#: threads in this process also sets this process's malloc thresholds to the worker processes'
#: (:func:`mvg_dask.engine.worker_setup.apply_malloc_settings`): a library process keeps its own.
FORK_WORKERS = False


@contextmanager
def imports_without_gc() -> Iterator[None]:
    """Run the block (imports) with the cyclic garbage collector paused, then resume it.

    Importing pydantic models, dask, distributed and xarray allocates hundreds of thousands of
    long-lived objects, and the collector walks them again and again while they are made (a
    twentieth of a small release's CPU time); importing creates almost no cyclic garbage, so
    nothing is left for it to collect. The collector is resumed on exit (it stays paused only
    if it was paused on entry, or another thread paused it meanwhile and has not resumed it);
    with :data:`FREEZE_AFTER_IMPORTS`, and if the block imported a module, the objects alive are
    frozen first.
    """
    if not gc.isenabled():
        yield
        return
    modules = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if FREEZE_AFTER_IMPORTS and len(sys.modules) > modules:  # start-up, not a later release
            gc.freeze()
        gc.enable()
