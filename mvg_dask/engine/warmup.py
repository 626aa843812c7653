"""The lattice kernels: which releases run them, and loading them in a process.

An identity release with lattice noise runs two numba kernels in every worker (the exact
sampler, :mod:`mvg_dask.noise.lattice`, and the fused diagonal release,
:func:`mvg_dask.engine.lattice.diagonal_release`). Importing numba and loading their cached
machine code costs a fresh process about 0.6 s of CPU. The embedded cluster of worker processes
loads them once in the releasing process before it forks its workers, which start with them
(:func:`mvg_dask.engine.cluster.local_cluster`), or, when its workers are spawned, in each
worker's preload before it registers (:mod:`mvg_dask.engine.worker_setup`). On any other
cluster the first task of each worker loads them (numba compiles or loads a kernel once per
process, under its lock). Loading them draws from a fixed throwaway key: it publishes nothing
and changes no bytes.

This module used to also send a warm-up to the workers of any cluster (``client.run``, loading
the kernels in a background thread while the graph was built). It was removed: measured on
fresh worker processes without a preload it made a cold identity release slower, not faster
(docs/guide/performance.md, "Start-up"), and its background import of the lattice modules could
meet the event loop's own import of them half-initialized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mvg_dask.plan.release_plan import ReleasePlan


def needs_kernels(rplan: ReleasePlan) -> bool:
    """Whether ``rplan``'s workers run the compiled lattice kernels (an identity release with
    lattice noise: every task privatizes its records with them)."""
    from mvg_dask.plan import stages as names

    return rplan.noise_kind == "lattice" and names.IDENTITY in rplan.stages


def load_kernels() -> None:
    """Import numba and load both lattice kernels in this process (idempotent)."""
    import numpy as np

    from mvg_dask.engine.lattice import diagonal_release
    from mvg_dask.noise.lattice import load_kernel
    from mvg_dask.noise.rng import NoiseKey

    load_kernel(NoiseKey(0))
    one = np.ones((1, 1))
    diagonal_release(one, np.ones(1), np.ones(1), np.zeros((1, 1), dtype=np.int64), 0)
