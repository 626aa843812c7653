"""Release benchmarks: ratios against baselines measured in the same run (machines are noisy).

Run: ``.venv/bin/python -m tests.benchmarks.bench_release [--sizes 1e7,1e8,1e9] [--features 64]``

Prints, for each size:
* covariance release time / non-private ``X @ X.T`` (dask) from the same Zarr store,
* identity release time / a naive dask pipeline adding iid numpy noise (read -> add -> write),
* ns per element of each release, and the peak memory of the busiest worker.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import dask.array as da
import numpy as np
from distributed import Client
from distributed.diagnostics import MemorySampler

from mvg_dask import api
from mvg_dask.data import synthetic, write_matrix
from mvg_dask.engine.cluster import local_cluster


def spec(store: str, out: str, query: str) -> dict[str, object]:
    """A release spec, charged to a ledger next to the output (the production path)."""
    return {
        "name": f"bench-{query}",
        "input": {"store": store},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": query,
        "mechanism": {"algorithm": "equi-modal" if query == "covariance" else "unimodal"},
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "output": {"store": out},
        "ledger": {
            "path": f"{out}.ledger.sqlite",
            "dataset": "bench",
            "budget": {"epsilon": 10.0, "delta": 1e-5},
        },
    }


def timed(fn, sampler: MemorySampler, label: str) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    with sampler.sample(label, interval=0.1):
        fn()
    return time.perf_counter() - t


def naive_identity(store: str, out: str, client: Client) -> None:
    x = da.from_zarr(store, component="X")

    def add_noise(block: np.ndarray, block_info=None) -> np.ndarray:  # type: ignore[no-untyped-def]
        loc = block_info[0]["chunk-location"]
        rng = np.random.default_rng(list(loc))
        return block + rng.standard_normal(block.shape)

    y = x.map_blocks(add_noise, dtype=np.float64)
    y.to_zarr(out, component="X", compute=True, zarr_format=3)


def nonprivate_gram(store: str, client: Client) -> None:
    x = da.from_zarr(store, component="X")
    (x @ x.T).compute()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="1e7,1e8", help="total elements, comma-separated")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="best of N for each timing")
    p.add_argument("--memory-limit", default="4GiB", help="per worker")
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    M = args.features
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mvg-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = local_cluster(2, memory_limit=args.memory_limit)
    client = Client(cluster)
    print(
        f"workers: 2 x 1 thread, memory limit {args.memory_limit}; features M={M}; "
        f"best of {args.repeats}"
    )
    header = (
        f"{'elements':>10} {'cov/XXt':>8} {'id/naive':>8} {'cov ns/el':>9} "
        f"{'id ns/el':>9} {'naive ns/el':>11} {'peak MiB/worker':>15}"
    )
    print(header)
    try:
        for size in sizes:
            N = size // M
            chunk = max(1000, 2**23 // (8 * M))  # ~8 MiB chunks
            store = str(work / f"in-{size}.zarr")
            if not Path(store).exists():
                with __import__("dask").config.set(scheduler=client.get):
                    write_matrix(synthetic(N, M, record_chunk=chunk), store, record_chunk=chunk)
            ms = MemorySampler()
            best: dict[str, float] = {}
            for r in range(args.repeats):
                outs = [str(work / f"{k}-{size}-{r}.zarr") for k in ("cov", "id", "naive")]
                for o in outs:
                    shutil.rmtree(o, ignore_errors=True)
                    Path(f"{o}.ledger.sqlite").unlink(missing_ok=True)
                t = {
                    "xxt": timed(lambda s=store: nonprivate_gram(s, client), ms, "xxt"),
                    "cov": timed(
                        lambda s=store, o=outs[0]: api.release(
                            spec(s, o, "covariance"), client=client, progress=False
                        ),
                        ms,
                        "cov",
                    ),
                    "naive": timed(
                        lambda s=store, o=outs[2]: naive_identity(s, o, client), ms, "naive"
                    ),
                    "id": timed(
                        lambda s=store, o=outs[1]: api.release(
                            spec(s, o, "identity"), client=client, progress=False
                        ),
                        ms,
                        "id",
                    ),
                }
                for k, v in t.items():
                    best[k] = min(best.get(k, np.inf), v)
                for o in outs:
                    shutil.rmtree(o, ignore_errors=True)
            df = ms.to_pandas() if hasattr(ms, "to_pandas") else None
            peak = float(np.nanmax(df.to_numpy())) / 2 / 2**20 if df is not None else float("nan")
            n_el = N * M
            print(
                f"{n_el:>10.0e} {best['cov'] / best['xxt']:>8.3f} "
                f"{best['id'] / best['naive']:>8.3f} {best['cov'] / n_el * 1e9:>9.2f} "
                f"{best['id'] / n_el * 1e9:>9.2f} {best['naive'] / n_el * 1e9:>11.2f} "
                f"{peak:>15.0f}",
                flush=True,
            )
    finally:
        client.close()
        cluster.close()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
