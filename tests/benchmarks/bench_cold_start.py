"""What numba's kernels cost a fresh worker, a cold identity release with the kernels loaded as
its cluster starts and without (:mod:`mvg_dask.engine.warmup`), and a cold release against a
warm one, each interleaved in one run.

Run: ``.venv/bin/python -m tests.benchmarks.bench_cold_start [--repeats 5] [--records 262144]
[--sizes 1e6,1e7] [--queries covariance,identity] [--parts 1,2,3]``

1. In ``--repeats`` fresh Python processes (medians; wall and CPU seconds): importing the
   package's lattice modules, importing numba, creating the kernels' dispatchers, the first
   call of the sampler's kernel (numba's on-disk cache loaded; compiled if the cache is cold),
   the first call of the fused diagonal kernel, and a second 16 x 1024 tile (the steady cost).
2. A cold identity release with lattice noise of ``16 x --records`` values: each repetition
   starts a fresh Python process and LocalCluster of worker processes (the embedded default's
   settings) and releases on it, alternately with the kernels loaded as the cluster starts and
   without (each worker's first task loads them; the same bytes either way). It prints the
   medians and their ratio.
3. A cold release as the command line runs it (``api.release(spec)``: a fresh embedded cluster,
   threads in this process up to 1 GiB (identity: 256 MiB), else worker processes forked from
   this process on Linux once the client has imported the engine; this process has imported it
   before, and, after its first cold identity release, keeps the kernels loaded, which a
   command line's process loads once)
   against the same release on a cluster kept warm
   (:func:`mvg_dask.api.embedded_client`), at ``--sizes`` records x 64 features; the target is a
   ratio of at most 1.3. The same release on a warm cluster of the other kind (worker processes
   where the embedded one is of threads, and the reverse) is timed in the same rounds, and the
   cold release's ratio to the faster of the two warm ones printed too.

Speed is reported, never asserted; on a busy machine read the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.benchmarks.bench_release import spec

_MODULE = "tests.benchmarks.bench_cold_start"

_PROBE = """
import resource, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
marks = [(time.perf_counter(), cpu())]
import numpy as np
from mvg_dask.noise import NoiseKey
from mvg_dask.noise import lattice as L
from mvg_dask.engine import lattice as EL
marks.append((time.perf_counter(), cpu()))
import numba
marks.append((time.perf_counter(), cpu()))
L._kernel(); EL._diagonal_kernel()
marks.append((time.perf_counter(), cpu()))
L._uncompiled_left[0] = 0
key = NoiseKey.from_seed(1)
key.tile_lattice(0, (16, 1024), 3.7)
marks.append((time.perf_counter(), cpu()))
x = np.ones((16, 8))
EL.diagonal_release(x, np.ones(16), np.ones(16), np.zeros((16, 8), np.int64), -10)
marks.append((time.perf_counter(), cpu()))
key.tile_lattice(1, (16, 1024), 3.7)
marks.append((time.perf_counter(), cpu()))
print(" ".join(f"{b[0] - a[0]:.6f},{b[1] - a[1]:.6f}" for a, b in zip(marks, marks[1:])))
"""
_STEPS = [
    "import mvg_dask lattice modules",
    "import numba",
    "create dispatchers",
    "sampler first call (cache load)",
    "diagonal first call",
    "second 16x1024 tile",
]


def kernel_costs(repeats: int) -> None:
    """Part 1: the median cost of each step in fresh processes."""
    rows: list[list[tuple[float, float]]] = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True
        ).stdout.split()
        rows.append([(float(a), float(b)) for a, b in (f.split(",") for f in out)])
    print(f"{'fresh process, median of ' + str(repeats):<34} {'wall s':>8} {'CPU s':>8}")
    for i, step in enumerate(_STEPS):
        wall = statistics.median(r[i][0] for r in rows)
        cpu = statistics.median(r[i][1] for r in rows)
        print(f"{step:<34} {wall:>8.3f} {cpu:>8.3f}")


def cold_releases(repeats: int, records: int) -> None:
    """Part 2: fresh-cluster identity releases, with the kernels loaded as the cluster starts
    (``connect(kernels=True)``: in this process before its workers are forked, or in each
    spawned worker's preload) and without (each worker's first task loads them), interleaved.
    In one process the kernels stay loaded once loaded here, so each repetition runs in a fresh
    Python process (``--one`` below) and the medians are printed with their ratio."""
    from mvg_dask.data import synthetic, write_matrix

    work = Path(tempfile.mkdtemp(prefix="mvg-cold-"))
    store = str(work / "in.zarr")
    chunk = min(records, 2**23 // (8 * 16))
    write_matrix(synthetic(records, 16, record_chunk=chunk), store, record_chunk=chunk)
    times: dict[str, list[float]] = {"kernels at start": [], "at first task": []}
    try:
        for r in range(repeats):
            for label in times if r % 2 == 0 else reversed(list(times)):
                out = str(work / "out.zarr")
                shutil.rmtree(out, ignore_errors=True)
                Path(f"{out}.ledger.sqlite").unlink(missing_ok=True)
                kernels = "1" if label == "kernels at start" else "0"
                done = subprocess.run(
                    [sys.executable, "-m", _MODULE, "--one", store, out, kernels],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                times[label].append(float(done.stdout.split()[-1]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    at_start, at_first = (statistics.median(v) for v in times.values())
    print(f"cold identity release, 16 x {records}, fresh process and cluster each:")
    print(f"  medians of {repeats}, interleaved")
    print(
        f"  kernels at start {at_start:.2f} s, at first task {at_first:.2f} s, "
        f"ratio {at_start / at_first:.2f}"
    )


def _one_cold_release(store: str, out: str, kernels: bool) -> None:
    """Part 2's child: one release on a fresh cluster; prints its wall seconds."""
    from mvg_dask import api
    from mvg_dask.engine.cluster import connect

    rplan = api.dry_run(spec(store, out, "identity"))  # the client's own imports, unclocked
    t = time.perf_counter()
    start = connect(
        None, processes=True, kernels=kernels, while_starting=lambda: api._import_engine(rplan)
    )
    with start as c:
        api.release(spec(store, out, "identity"), client=c, progress=False)
    print(f"{time.perf_counter() - t:.4f}")


def cold_against_warm(repeats: int, sizes: list[int], queries: list[str]) -> None:
    """Part 3: ``api.release(spec)`` as the CLI runs it (a fresh embedded cluster each time:
    worker processes above 1 GiB, 256 MiB for identity) against the same release on a cluster
    kept warm (:func:`mvg_dask.api.embedded_client`), interleaved, ``records x 64`` float64."""
    from contextlib import ExitStack

    from mvg_dask import api
    from mvg_dask.data import synthetic, write_matrix
    from mvg_dask.engine.cluster import connect
    from tests.benchmarks.bench_release import CHUNK_BYTES

    work = Path(tempfile.mkdtemp(prefix="mvg-cold-warm-"))
    m = 64
    chunk = CHUNK_BYTES // (8 * m)
    print(f"cold (fresh embedded cluster) against warm, {m} features, median of {repeats}:")
    try:
        for records in sizes:
            store = str(work / f"in{records}.zarr")
            write_matrix(synthetic(records, m, record_chunk=chunk), store, record_chunk=chunk)
            for query in queries:
                out = str(work / "out.zarr")

                def once(
                    client: object = None, query: str = query, out: str = out, store: str = store
                ) -> float:
                    shutil.rmtree(out, ignore_errors=True)
                    Path(f"{out}.ledger.sqlite").unlink(missing_ok=True)
                    t = time.perf_counter()
                    api.release(spec(store, out, query), client=client, progress=False)  # type: ignore[arg-type]
                    return time.perf_counter() - t

                cold: list[float] = []
                warm: list[float] = []
                other: list[float] = []  # warm on the other kind of cluster
                with ExitStack() as stack:
                    client = stack.enter_context(api.embedded_client(spec(store, out, query)))
                    processes = bool(client.cluster.processes)  # type: ignore[attr-defined]
                    # a user keeping a cluster warm could keep either kind: both are timed
                    second = stack.enter_context(connect(processes=not processes))
                    for c in (client, second):
                        once(c)  # a warm cluster's first release (its workers' first tasks)
                    for r in range(repeats):
                        runs = [(cold, None), (warm, client), (other, second)]
                        for times, c in runs if r % 2 == 0 else reversed(runs):
                            times.append(once(c))
                c_s, w_s, o_s = (statistics.median(v) for v in (cold, warm, other))
                kinds = ("processes", "threads") if processes else ("threads", "processes")
                print(
                    f"  {records:>10} x {m} {query:<11} cold {c_s:6.2f} s  warm {w_s:6.2f} s "
                    f"({kinds[0]})  ratio {c_s / w_s:5.2f}  (target <= 1.3); warm on "
                    f"{kinds[1]} {o_s:6.2f} s, cold / best warm {c_s / min(w_s, o_s):5.2f}"
                )
            shutil.rmtree(store, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--records", type=int, default=2**18)
    parser.add_argument(
        "--sizes", default="1e6,1e7", help="Records of part 3 (64 features), comma-separated."
    )
    parser.add_argument("--queries", default="covariance,identity", help="Queries of part 3.")
    parser.add_argument("--parts", default="1,2,3", help="Which parts to run.")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # part 2's child
    args = parser.parse_args()
    from mvg_dask import _startup

    _startup.FORK_WORKERS = True  # the embedded cluster as the command line starts it
    if args.one:
        _one_cold_release(args.one[0], args.one[1], args.one[2] == "1")
        return
    parts = {int(p) for p in args.parts.split(",")}
    if 1 in parts:
        kernel_costs(args.repeats)
    if 2 in parts:
        cold_releases(args.repeats, args.records)
    if 3 in parts:
        sizes = [int(float(x)) for x in args.sizes.split(",")]
        cold_against_warm(args.repeats, sizes, args.queries.split(","))


if __name__ == "__main__":
    main()
