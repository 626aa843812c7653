"""Load numba's compiled lattice kernels in the workers while a release is being prepared.

An identity release with lattice noise runs two numba kernels in every worker (the exact
sampler, :mod:`mvg_dask.noise.lattice`, and the fused diagonal release,
:func:`mvg_dask.engine.lattice.diagonal_release`). Importing numba and loading their cached
machine code costs a fresh worker process about 0.4 s of CPU, which its first task would
otherwise wait for. :func:`start_kernel_warmup` asks every worker to do it in a background
thread as soon as the client knows the plan, so that it overlaps the ledger reservation, the
output's skeleton and the graph's construction; a task that needs a kernel before it is loaded
waits for the same load (numba compiles or loads a kernel once per process, under its lock).
The warm-up draws from a fixed throwaway key: it publishes nothing and changes no bytes.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed import Client

    from mvg_dask.plan.release_plan import ReleasePlan

log = logging.getLogger("mvg_dask")


def needs_kernels(rplan: ReleasePlan) -> bool:
    """Whether ``rplan``'s workers run the compiled lattice kernels (an identity release with
    lattice noise: every task privatizes its records with them)."""
    from mvg_dask.plan import stages as names

    return rplan.noise_kind == "lattice" and names.IDENTITY in rplan.stages


def start_kernel_warmup(client: Client, rplan: ReleasePlan) -> bool:
    """Start loading the kernels in every worker of ``client`` (fire and forget).

    Parameters
    ----------
    client : distributed.Client
        The release's client.
    rplan : ReleasePlan
        The release's plan; nothing is started unless :func:`needs_kernels`.

    Returns
    -------
    bool
        True when the warm-up was sent to the workers (not to the embedded cluster's worker
        processes: they load the kernels as they start).
    """
    if not needs_kernels(rplan) or _preloaded(client):
        return False
    try:
        client.run(_warm_in_background, wait=False)
    except Exception as exc:  # pragma: no cover - the release's own first task reports it
        log.debug("kernel warm-up not started: %s", type(exc).__name__)
        return False
    return True


def _preloaded(client: Client) -> bool:
    """Whether ``client``'s cluster is an embedded one whose workers load the kernels as they
    start, or start with them (:func:`mvg_dask.engine.cluster.local_cluster` with ``kernels``):
    a warm-up would only wait for their busy event loops."""
    spec = getattr(getattr(client, "cluster", None), "new_spec", None)
    options = spec.get("options", {}) if isinstance(spec, dict) else {}
    return "--kernels" in (options.get("preload_argv") or ())


def _warm_in_background() -> None:
    """On a worker: load the kernels in a daemon thread (the worker's event loop goes on)."""
    threading.Thread(target=load_kernels, name="mvg-dask-kernel-warmup", daemon=True).start()


def load_kernels() -> None:
    """Import numba and load both lattice kernels in this process (idempotent)."""
    import numpy as np

    from mvg_dask.engine.lattice import diagonal_release
    from mvg_dask.noise.lattice import load_kernel
    from mvg_dask.noise.rng import NoiseKey

    load_kernel(NoiseKey(0))
    one = np.ones((1, 1))
    diagonal_release(one, np.ones(1), np.ones(1), np.zeros((1, 1), dtype=np.int64), 0)
