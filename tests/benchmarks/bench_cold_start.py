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
   threads in the releasing process up to 1 GiB (identity: 512 MiB), else worker processes
   forked from it on Linux once the client has imported the engine) against the same release
   on a cluster kept warm (:func:`mvg_dask.api.embedded_client`) and on a kept cluster of the
   other kind (worker processes where the embedded one is of threads, and the reverse), at
   ``--sizes`` records x 64 features, interleaved. Each of the three runs in a Python process
   of its own, as a command line's release does (a kept cluster's scheduler, nannies and
   threads would otherwise share the cold release's process and its GIL); the cold one has
   imported the engine and, after one unclocked cold release, keeps the lattice kernels loaded,
   which a command line's process loads once. Before each release the page cache's pending
   writes are flushed (``os.sync``), so that none waits for the previous one's output. It
   prints the medians, their ratio (the target is at most 1.3) and the cold release's ratio to
   the faster of the two warm ones.

Speed is reported, never asserted; on a busy machine read the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import os
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


#: Part 3's three kinds of release, each served by its own Python process.
_KINDS = ("cold", "warm", "other")


def _serve(kind: str, store: str, query: str, out: str) -> None:
    """Part 3's child: release ``query`` of ``store`` each time a line arrives on stdin, and
    print the seconds it took. ``cold``: :func:`mvg_dask.api.release` without a client, a
    fresh embedded cluster each time, as the command line runs it (this process has imported
    the engine and, after one unclocked cold release, keeps the lattice kernels loaded, as a
    command line's process has and does by then); ``warm``: on the cluster the command line
    would start, kept (:func:`mvg_dask.api.embedded_client`); ``other``: on a kept cluster of
    the other kind (worker processes where that one is of threads, and the reverse). It first
    prints ``ready <the kind of the kept cluster>``, after one unclocked release."""
    from contextlib import ExitStack

    from mvg_dask import api
    from mvg_dask.engine.cluster import connect

    def once(client: object) -> float:
        shutil.rmtree(out, ignore_errors=True)
        Path(f"{out}.ledger.sqlite").unlink(missing_ok=True)
        t = time.perf_counter()
        api.release(spec(store, out, query), client=client, progress=False)  # type: ignore[arg-type]
        return time.perf_counter() - t

    the_spec = api.load(spec(store, out, query))
    processes = not api.in_process(api.dry_run(the_spec).input, the_spec)  # the embedded kind
    with ExitStack() as stack:
        client = None
        if kind == "warm":
            client = stack.enter_context(api.embedded_client(the_spec))
        elif kind == "other":
            processes = not processes
            client = stack.enter_context(connect(processes=processes))
        once(client)  # a warm cluster's first tasks; the cold process's imports and kernels
        print("ready", "processes" if processes else "threads", flush=True)
        for _ in sys.stdin:
            print(f"{once(client):.6f}", flush=True)


def cold_against_warm(repeats: int, sizes: list[int], queries: list[str]) -> None:
    """Part 3: ``api.release(spec)`` as the CLI runs it (a fresh embedded cluster each time:
    worker processes above 1 GiB, 512 MiB for identity) against the same release on a cluster
    kept warm (:func:`mvg_dask.api.embedded_client`) and on a kept cluster of the other kind,
    interleaved, ``records x 64`` float64. Each of the three runs in a Python process of its
    own (:func:`_serve`), as a command line's release does: the kept clusters' schedulers,
    nannies and threads would otherwise share the cold release's process and its GIL."""
    from mvg_dask.data import synthetic, write_matrix
    from tests.benchmarks.bench_release import CHUNK_BYTES

    work = Path(tempfile.mkdtemp(prefix="mvg-cold-warm-"))
    m = 64
    chunk = CHUNK_BYTES // (8 * m)
    print(
        f"cold (fresh embedded cluster) against warm, {m} features, median of {repeats}, "
        "each kind in its own process:"
    )
    try:
        for records in sizes:
            store = str(work / f"in{records}.zarr")
            write_matrix(synthetic(records, m, record_chunk=chunk), store, record_chunk=chunk)
            for query in queries:
                times = _served_rounds(work, store, query, repeats)
                (c_s, _), (w_s, w_kind), (o_s, o_kind) = (
                    (statistics.median(times[k][1]), times[k][0]) for k in _KINDS
                )
                print(
                    f"  {records:>10} x {m} {query:<11} cold {c_s:6.2f} s  warm {w_s:6.2f} s "
                    f"({w_kind})  ratio {c_s / w_s:5.2f}  (target <= 1.3); warm on "
                    f"{o_kind} {o_s:6.2f} s, cold / best warm {c_s / min(w_s, o_s):5.2f}"
                )
            shutil.rmtree(store, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _served_rounds(
    work: Path, store: str, query: str, repeats: int
) -> dict[str, tuple[str, list[float]]]:
    """Start part 3's three serving processes (one after another), then ``repeats`` rounds of
    one release each, in alternating order; per kind: its cluster's kind and the seconds."""
    children: dict[str, subprocess.Popen[str]] = {}
    kinds: dict[str, str] = {}
    try:
        for kind in _KINDS:
            out = str(work / f"out-{kind}.zarr")
            child = subprocess.Popen(
                [sys.executable, "-m", _MODULE, "--serve", kind, store, query, out],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            children[kind] = child
            assert child.stdout is not None
            line = child.stdout.readline().split()
            if line[:1] != ["ready"]:
                raise RuntimeError(f"the {kind} release process did not start")
            kinds[kind] = line[1]
        seconds: dict[str, list[float]] = {kind: [] for kind in _KINDS}
        for r in range(repeats):
            for kind in _KINDS if r % 2 == 0 else reversed(_KINDS):
                child = children[kind]
                assert child.stdin is not None and child.stdout is not None
                os.sync()  # each release starts without the last one's writes pending
                child.stdin.write("go\n")
                child.stdin.flush()
                seconds[kind].append(float(child.stdout.readline()))
        return {kind: (kinds[kind], seconds[kind]) for kind in _KINDS}
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=120)


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
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)  # part 3's children
    args = parser.parse_args()
    from mvg_dask import _startup

    _startup.FORK_WORKERS = True  # the embedded cluster as the command line starts it
    if args.one:
        _one_cold_release(args.one[0], args.one[1], args.one[2] == "1")
        return
    if args.serve:
        _serve(*args.serve)
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
