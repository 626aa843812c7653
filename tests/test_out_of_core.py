"""Out of core: an identity release of a dataset larger than the workers' memory."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client
from distributed.diagnostics import MemorySampler

from mvg_dask import api
from mvg_dask.data import synthetic, write_matrix
from mvg_dask.engine.cluster import local_cluster
from tests.pipeline_helpers import spec_dict

# per worker: the lattice release's compiled kernels (numba, LLVM) take about 130 MiB of a
# worker's memory once loaded, so 400 MiB (the float path's figure) would pause the workers
MEMORY_LIMIT = 512 * 2**20


@pytest.mark.slow
def test_identity_release_larger_than_worker_memory(tmp_path):
    M, N = 64, 2_200_000  # 1.05 GiB of float64: more than both workers' memory together
    assert M * N * 8 > 2 * MEMORY_LIMIT
    chunk = 16_384  # 8 MiB chunks
    cluster = local_cluster(2, memory_limit=MEMORY_LIMIT)
    with Client(cluster) as client:
        import dask

        with dask.config.set(scheduler=client.get):
            store = write_matrix(
                synthetic(N, M, record_chunk=chunk), tmp_path / "in.zarr", record_chunk=chunk
            )
        sampler = MemorySampler()
        with sampler.sample("release", interval=0.1):
            res = api.release(
                spec_dict(store, str(tmp_path / "out.zarr")), client=client, seed=1, progress=False
            )
        # no worker was lost (the nanny restarts a worker that exceeds its limit)
        assert len(client.scheduler_info()["workers"]) == 2
        peak = float(np.nanmax(sampler.to_pandas().to_numpy()))  # both workers together
    cluster.close()
    assert peak < 2 * MEMORY_LIMIT
    ds = api.open_release(res.output)
    assert ds["X"].shape == (M, N)
    # spot-check a chunk far from the start: finite and noisy around the input
    x = ds["X"][:, 1_500_000:1_500_100].values
    assert np.all(np.isfinite(x))
