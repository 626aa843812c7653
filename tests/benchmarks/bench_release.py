"""Release benchmarks: ratios against the hardware floor and against baselines, in one run.

Run: ``make bench`` or
``.venv/bin/python -m tests.benchmarks.bench_release [--sizes 1e7,1e8,1e9] [--features 64]``

For every input (``--features`` x ``--sizes``; ~8 MiB chunks, float64, ``[0, 1]``) it measures:

* **floors**, in the workers of one cluster (2 processes x 1 thread, the embedded default's
  settings), on the release's own task grid (runs of whole chunks, ``task_ranges``), each a
  single kernel over the whole input called once per chunk and timed inside the task (ns per
  element per worker core):
  read+decode (``ZarrMatrix.read``), the keyed float noise draw (``record_noise``), the
  lattice release's noise step (its exact integers drawn and applied to a chunk in place,
  ``RecordLattice.release``), encode+write of a noisy chunk (raw codec, the release's default)
  and the Gram product of a resident chunk.
  ``floor(covariance) = floor(centered-covariance) = read + Gram``,
  ``floor(identity) = read + lattice + write`` (``read + noise + write`` for float noise; a
  worker runs them one after the other).
  ``efficiency = floor / release`` on the same warm cluster.
* **baselines the way a user writes them**, each with its own cluster start (dask's defaults:
  ``Client()``): dask's non-private ``(x @ x.T).compute()`` on ``da.from_zarr``, and a naive
  identity pipeline (``map_blocks`` adding numpy noise, ``to_zarr``); against ``mvg_dask``'s
  own cold start (``api.release(spec)``: the embedded cluster started as the command line
  starts it, its worker processes forked from this one on Linux; the ledger, the output
  protocol).
  The cold release and its baseline run interleaved, ``--repeats`` times each, and their
  medians are printed (``ratio``: the median of the runs' cold / baseline), so a loaded
  machine's load falls on both.
* **the read path against the raw decode floor**: ``ZarrMatrix.read`` (and with the domain
  check, as the Gram task reads) against each chunk file read into a kept buffer and decoded
  into a kept array, in the same workers, interleaved, best of each.
* ns per element per worker core, and the peak process memory per worker (the cluster's total
  at its peak over the workers) during the warm releases.
* **where the CPU goes** in the fastest warm release (ms): this process (``client``:
  planning, ledger, output protocol, and the embedded cluster's scheduler and nannies) and the
  workers together (``workers``); ``bound`` is their sum over this machine's cores, the least
  wall time those CPU seconds allow when the client and the workers share the cores.

Speed is reported, never asserted: machines are noisy, and the numbers are ratios measured in
the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CHUNK_BYTES = 2**23  # ~8 MiB input chunks


def spec(
    store: str,
    out: str,
    query: str,
    dp_pca_k: int = 0,
    noise: str = "lattice",
    m: int = 0,
    groups: int = 0,
) -> dict[str, object]:
    """A release spec with the product's defaults, charged to a ledger next to the output
    (``dp_pca_k``: DP-PCA directions, the top ``k`` important, binary allocation; ``noise``:
    the lattice release, the default, or the float path it replaced; ``cross``: the
    cross-covariance of the first ``m // 2`` features with the others; ``groups``: a grouped
    release over the input's ``site`` variable, groups ``0 .. groups - 1``)."""
    mechanism: dict[str, object] = {"noise": noise}
    if dp_pca_k:
        mechanism |= {
            "directions": {"method": "dp-pca", "k": dp_pca_k},
            "allocation": {"strategy": "binary"},
        }
    grouped = {"group_by": {"variable": "site", "groups": list(range(groups))}} if groups else {}
    return {
        **grouped,
        "name": f"bench-{query}",
        "input": {"store": store},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": query
        if query != "cross"
        else {"cross-covariance": {"rows": list(range(m // 2)), "cols": list(range(m // 2, m))}},
        "mechanism": mechanism,
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "output": {"store": out},
        "ledger": {
            "path": f"{out}.ledger.sqlite",
            "dataset": "bench",
            "budget": {"epsilon": 1e6, "delta": 0.5},
        },
    }


def _clean(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    Path(f"{path}.ledger.sqlite").unlink(missing_ok=True)


class CpuMeter:
    """CPU time spent during each timed run, by this process and by the workers; reported for
    the fastest run (the one whose wall time is reported).

    This process is the client: planning, the ledger, the output's skeleton and commit; with
    the embedded cluster also the scheduler and the nannies. When the client and the workers
    share the machine's cores, no run can take less wall time than their CPU time divided by
    the cores (:attr:`bound`), however its work is scheduled.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.runs: list[tuple[float, float, float]] = []  # (wall, client, workers) s per run
        self._start: tuple[float, float] | None = None

    def _workers(self) -> float:
        return float(sum(self.client.run(time.process_time).values()))

    def start(self) -> None:
        """Before a run (the workers are asked first: asking costs this process CPU)."""
        workers = self._workers()
        self._start = (time.process_time(), workers)

    def stop(self, wall: float) -> None:
        """After a run that took ``wall`` seconds (this process is read first, for the same
        reason)."""
        assert self._start is not None
        mine = time.process_time()
        workers = self._workers()
        self.runs.append((wall, mine - self._start[0], workers - self._start[1]))
        self._start = None

    @property
    def client_cpu(self) -> float:
        """CPU seconds of this process in the fastest run."""
        return min(self.runs)[1]

    @property
    def workers_cpu(self) -> float:
        """CPU seconds of all workers together in the fastest run."""
        return min(self.runs)[2]

    @property
    def bound(self) -> float:
        """The least wall time a run's CPU allows on this machine's cores (seconds)."""
        return (self.client_cpu + self.workers_cpu) / _cores()


def _cores() -> int:
    """The cores this process may run on (its affinity where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def best_of(
    repeats: int,
    fn: Callable[[], Any],
    before: Callable[[], Any] | None = None,
    meter: CpuMeter | None = None,
) -> float:
    """Smallest wall time of ``repeats`` runs (``before`` runs untimed before each; ``meter``
    records each run's CPU time, outside the timed span)."""
    best = float("inf")
    for _ in range(repeats):
        if before is not None:
            before()
        os.sync()  # no write-back of an earlier run's output competes with this one
        if meter is not None:
            meter.start()
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
        best = min(best, wall)
        if meter is not None:
            meter.stop(wall)
    return best


# -- floors (one kernel per task, on the workers) ------------------------------------------------
def _each_chunk(kernel: Callable[..., int]) -> Callable[..., int]:
    """A floor task over a run of chunks: the kernel's in-task time summed over its chunks."""

    def task(start: int, stop: int, step: int, **kw: Any) -> int:
        return sum(kernel(a, min(a + step, stop), **kw) for a in range(start, stop, step))

    return task


def _read(start: int, stop: int, source: Any) -> int:
    t = time.perf_counter()
    source.read(start, stop)
    return int(1e9 * (time.perf_counter() - t))  # ns spent reading and decoding


def _read_checked(start: int, stop: int, source: Any, m: int) -> int:
    """The release's read path of a chunk: :func:`canonical_blocks` with the box ``[0, 1]``'s
    check (and clip), as a Gram task reads it."""
    from mvg_dask.engine.clipping import Clipper
    from mvg_dask.engine.records import canonical_blocks

    clip = Clipper("box", np.zeros((m, 1)), np.ones((m, 1)), None, "clip")
    t = time.perf_counter()
    for _ in canonical_blocks(source, clip, start, stop, stop - start, stop - start):
        pass
    return int(1e9 * (time.perf_counter() - t))  # ns spent reading, decoding and checking


def _decode(start: int, stop: int, root: str, chunk: int) -> int:
    """The raw decode floor of a chunk: its file read into a buffer this process keeps and
    decoded (zstd, or the raw bytes) into an array this process keeps; nothing else (no
    metadata, no checks, no allocation)."""
    import sys

    import numcodecs

    # kept by the worker process: run as ``__main__``, this module's globals travel with each
    # task by value, so a module-level cache would be a fresh one per task
    kept: dict[str, dict[str, Any]] = sys.__dict__.setdefault("_mvg_bench_decode", {})
    meta = kept.get(root)
    if meta is None:
        import json

        with open(os.path.join(root, "zarr.json"), "rb") as f:
            stored = json.loads(f.read())
        codecs = [c["name"] for c in stored["codecs"]]
        shape = stored["chunk_grid"]["configuration"]["chunk_shape"]
        out = np.empty(shape, dtype=stored["data_type"])
        meta = kept[root] = {"zstd": "zstd" in codecs, "out": out, "buf": None}
    path = os.path.join(root, "c", "0", str(start // chunk))
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if meta["buf"] is None or len(meta["buf"]) < size:
            meta["buf"] = bytearray(size)
        view = memoryview(meta["buf"])[:size]
        f.readinto(view)
    if meta["zstd"]:
        numcodecs.Zstd().decode(view, out=meta["out"])
    else:
        meta["out"].reshape(-1).view(np.uint8)[:] = np.frombuffer(view, dtype=np.uint8)
    return int(1e9 * (time.perf_counter() - t))  # ns spent reading and decoding


def _noise(start: int, stop: int, m: int, n: int) -> int:
    from mvg_dask.noise import NoiseKey
    from mvg_dask.noise.tiles import record_noise, tile_records_for

    key = NoiseKey.from_seed(1)
    factor = np.ones(m)  # the diagonal a release ships to its tasks
    t = time.perf_counter()
    record_noise(key, factor, start, stop, tile=tile_records_for(m), n_total=n, diagonal=True)
    return int(1e9 * (time.perf_counter() - t))  # ns spent drawing


def _lattice(start: int, stop: int, m: int, n: int) -> int:
    """The lattice release's noise step of a chunk: the exact integers drawn tile by tile and
    applied to the chunk's values in place (``RecordLattice.release``, standard directions)."""
    from mvg_dask.engine.lattice import RecordLattice
    from mvg_dask.noise import NoiseKey
    from mvg_dask.noise.tiles import tile_records_for

    key = NoiseKey.from_seed(1)
    lattice = RecordLattice(-25, 2.0**25, np.ones(m), np.ones(m))
    x = np.random.default_rng(start).random((m, stop - start))
    t = time.perf_counter()
    lattice.release(x, key, start, stop, tile=tile_records_for(m), n_total=n, overwrite=True)
    return int(1e9 * (time.perf_counter() - t))  # ns spent drawing and applying


def _write(start: int, stop: int, sink: Any, m: int) -> int:
    y = np.random.default_rng(start).standard_normal((m, stop - start))
    t = time.perf_counter()
    sink.write(start, stop, y)
    return int(1e9 * (time.perf_counter() - t))  # ns spent encoding and writing


def _gram(start: int, stop: int, m: int) -> int:
    """The Gram product of a chunk: ``x x^T`` (one task), or for a wide input the row panels
    of a blocked release (``acc += x[rows] x[rows0:]^T`` in place), timed without allocation."""
    from scipy.linalg.blas import dgemm

    from mvg_dask.plan.input_metadata import WIDE_BLOCK, WIDE_FEATURES

    x = np.random.default_rng(start).random((m, stop - start))
    if m <= WIDE_FEATURES:
        t = time.perf_counter()
        x @ x.T
        return int(1e9 * (time.perf_counter() - t))  # ns spent in the product
    spent = 0.0
    for r0 in range(0, m, WIDE_BLOCK):
        r1 = min(r0 + WIDE_BLOCK, m)
        acc = np.zeros((r1 - r0, m - r0))
        t = time.perf_counter()
        dgemm(1.0, x[r0:].T, x[r0:r1].T, beta=1.0, c=acc.T, trans_a=1, overwrite_c=1)
        spent += time.perf_counter() - t
    return int(1e9 * spent)


def floors(
    client: Any, store: str, work: Path, m: int, n: int, chunk: int, repeats: int = 2
) -> dict[str, float]:
    """Per-element cost (ns, per worker core) of each kernel, measured in the workers (the best
    of ``repeats`` passes over the input, each started with no write-back pending)."""
    import zarr

    from mvg_dask.engine.records import ZarrMatrix
    from mvg_dask.plan.input_metadata import TASK_ELEMENTS, chunk_runs

    # the release's task grid: runs of whole chunks, one kernel call per chunk, so the floor and
    # the release share the per-task costs (and the chunk size)
    step = chunk
    ranges = chunk_runs(n, chunk, -(-TASK_ELEMENTS // (m * chunk)))
    if m > 8192:  # a wide release multiplies groups of 256 records (of whole chunks here)
        from mvg_dask.plan.input_metadata import PANEL_RECORDS

        group = -(-PANEL_RECORDS // chunk) * chunk
        ranges = [(a, min(a + group, n)) for a in range(0, n, group)]
        step = n
    source = ZarrMatrix(store, "X", False)
    sink_path = str(work / "floor-write.zarr")
    out: dict[str, float] = {}

    def run(fn: Callable[..., int], **kw: Any) -> float:
        best = float("inf")
        for _ in range(repeats):
            if fn is _write:
                shutil.rmtree(sink_path, ignore_errors=True)
                zarr.create_array(
                    store=sink_path,
                    shape=(m, n),
                    chunks=(m, chunk),
                    dtype="float64",
                    compressors=None,
                )
            os.sync()
            task = _each_chunk(fn)
            futs = [client.submit(task, a, b, step, pure=False, **kw) for a, b in ranges]
            best = min(best, sum(int(v) for v in client.gather(futs)) / (m * n))
        return best

    # the write first: an output as large as the input may push the input out of the page
    # cache, and the read pass then brings it back for the releases that follow
    out["write"] = run(_write, sink=ZarrMatrix(sink_path, "", False), m=m)
    shutil.rmtree(sink_path, ignore_errors=True)
    out["read"] = run(_read, source=source)
    out["decode"] = run(_decode, root=str(Path(store) / "X"), chunk=chunk)
    out["checked"] = run(_read_checked, source=source, m=m)
    # again, interleaved: best of each
    out["read"] = min(out["read"], run(_read, source=source))
    out["decode"] = min(out["decode"], run(_decode, root=str(Path(store) / "X"), chunk=chunk))
    out["checked"] = min(out["checked"], run(_read_checked, source=source, m=m))
    out["noise"] = run(_noise, m=m, n=n)
    out["lattice"] = run(_lattice, m=m, n=n)
    out["gram"] = run(_gram, m=m)
    keys = ("read", "decode", "checked", "noise", "lattice", "write", "gram")
    return {k: out[k] for k in keys}


# -- baselines, the way a user writes them (own cluster start, dask defaults) --------------------
def add_sites(store: str, n: int, chunk: int, groups: int) -> None:
    """A ``site`` variable beside the input: a random label in ``0 .. groups - 1`` per record
    (seed 0), stored in the input's record chunks (once per store)."""
    import xarray as xr

    if (Path(store) / "site").exists():
        return
    labels = np.random.default_rng(0).integers(0, groups, n)
    xr.Dataset({"site": (("record",), labels)}).to_zarr(
        store, mode="a", zarr_format=3, consolidated=False, encoding={"site": {"chunks": (chunk,)}}
    )


def user_xxt(store: str) -> None:
    import dask.array as da
    from distributed import Client

    with Client():
        x = da.from_zarr(store, component="X")
        (x @ x.T).compute()


def user_naive_identity(store: str, out: str) -> None:
    import dask.array as da
    from distributed import Client

    def add_noise(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        loc = block_info[0]["chunk-location"]
        return block + np.random.default_rng(list(loc)).standard_normal(block.shape)

    with Client():
        x = da.from_zarr(store, component="X")
        x.map_blocks(add_noise, dtype=np.float64).to_zarr(out, component="X", zarr_format=3)


#: The queries computed by one Gram pass (floor: read + Gram; baseline: ``x @ x.T``).
GRAM_QUERIES = ("covariance", "centered-covariance", "cross")


def bench_query(
    client: Any,
    store: str,
    work: Path,
    query: str,
    m: int,
    elements: int,
    fl: dict[str, float],
    args: argparse.Namespace,
    noise: str = "lattice",
    groups: int = 0,
) -> float:
    """Time one query on one input (warm, cold and its baseline), print its row and return the
    warm release's seconds (``groups``: the query grouped by the input's ``site``)."""
    from distributed.diagnostics import MemorySampler

    from mvg_dask import api

    out = str(work / f"out-{query}.zarr")
    naive = str(work / "naive.zarr")

    k = args.dp_pca_k if query == "covariance" else 0
    gram_query = query in GRAM_QUERIES

    def warm_run() -> None:
        api.release(spec(store, out, query, k, noise, m, groups), client=client, progress=False)

    def cold_run() -> None:
        # the embedded cluster as the command line starts it (worker processes forked from
        # this one on Linux: mvg_dask._startup.FORK_WORKERS)
        from mvg_dask import _startup

        _startup.FORK_WORKERS = True
        try:
            api.release(spec(store, out, query, k, noise, m, groups), progress=False)
        finally:
            _startup.FORK_WORKERS = False

    def baseline() -> None:
        if gram_query:
            user_xxt(store)
        else:
            user_naive_identity(store, naive)

    sampler = MemorySampler()
    meter = CpuMeter(client)
    with sampler.sample(query, interval=0.1):
        warm = best_of(args.repeats, warm_run, before=lambda: _clean(out), meter=meter)
    # the sampler records the cluster's total process memory: per worker at the peak
    workers = len(client.scheduler_info()["workers"])
    peak = float(np.nanmax(sampler.to_pandas().to_numpy())) / workers / 2**20
    noise_floor = fl["lattice"] if noise == "lattice" else fl["noise"]
    floor = fl["read"] + (fl["gram"] if gram_query else noise_floor + fl["write"])
    if k:  # DP-PCA reads the input and forms the Gram matrix once more
        floor *= 2
    per_el = warm * 2 / elements * 1e9  # per worker core
    cold = base = ratio = float("nan")
    if not args.no_baselines:  # interleaved, so the machine's load falls on both alike
        colds, bases = [], []
        for _ in range(args.repeats):
            colds.append(best_of(1, cold_run, before=lambda: _clean(out)))
            bases.append(
                best_of(1, baseline, before=lambda: shutil.rmtree(naive, ignore_errors=True))
            )
        cold, base = statistics.median(colds), statistics.median(bases)
        ratio = statistics.median(c / b for c, b in zip(colds, bases, strict=True))
    _clean(out)
    shutil.rmtree(naive, ignore_errors=True)
    label = query + ("+pca" if k else "") + (f"/g{groups}" if groups else "")
    label += ":float" if noise == "float" else ""
    print(
        f"{m:>6} {elements:>9.1e} {label:>16} {warm:>9.2f} {per_el:>7.2f} {floor:>7.2f} "
        f"{floor / per_el:>5.0%} {1e3 * meter.client_cpu:>7.0f} {1e3 * meter.workers_cpu:>7.0f} "
        f"{meter.bound:>6.2f} {cold:>7.2f} {base:>10.2f} {ratio:>6.2f} {peak:>10.0f}",
        flush=True,
    )
    return warm


def main() -> None:
    from distributed import Client

    from mvg_dask.data import synthetic, write_matrix
    from mvg_dask.engine.cluster import local_cluster

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="1e7,1e8", help="total elements, comma-separated")
    p.add_argument("--features", default="64", help="features, comma-separated")
    p.add_argument("--repeats", type=int, default=2, help="best of N for each timing")
    p.add_argument("--memory-limit", default="4GiB", help="per worker of the warm cluster")
    p.add_argument(
        "--queries",
        default="covariance,identity",
        help="comma-separated: covariance, identity, centered-covariance, cross",
    )
    p.add_argument(
        "--noise",
        default="lattice,float",
        help="noise kinds, comma-separated: the lattice release and the float path (label :float)",
    )
    p.add_argument("--no-baselines", action="store_true", help="skip the cold user baselines")
    p.add_argument(
        "--dp-pca-k",
        type=int,
        default=0,
        help="covariance with DP-PCA directions (top k, binary allocation; floor: two passes)",
    )
    p.add_argument(
        "--groups",
        type=int,
        default=0,
        help="also time the centered covariance grouped into G groups (group_by over a random "
        "label per record, in the input's record chunks) against the ungrouped one",
    )
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    features = [int(f) for f in args.features.split(",")]
    queries = args.queries.split(",")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mvg-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = local_cluster(2, memory_limit=args.memory_limit)
    client = Client(cluster)
    print(f"warm cluster: 2 workers x 1 thread, {args.memory_limit} each; best of {args.repeats}")
    print(
        f"{'M':>6} {'elements':>9} {'query':>16} {'release s':>9} {'ns/el':>7} {'floor':>7} "
        f"{'eff':>5} {'client':>7} {'workers':>7} {'bound':>6} {'cold s':>7} {'baseline s':>10} "
        f"{'ratio':>6} {'MiB/worker':>10}",
        flush=True,
    )
    try:
        for m in features:
            for size in sizes:
                n = size // m
                chunk = max(64, min(n, CHUNK_BYTES // (8 * m)))
                store = str(work / f"in-{m}-{size}.zarr")
                if not Path(store).exists():
                    import dask

                    with dask.config.set(scheduler=client.get):
                        write_matrix(synthetic(n, m, record_chunk=chunk), store, record_chunk=chunk)
                if args.groups:
                    add_sites(store, n, chunk, args.groups)
                fl = floors(client, store, work, m, n, chunk, args.repeats)
                warm: dict[str, float] = {}
                for query in queries:
                    for noise in args.noise.split(","):
                        label = f"{query}:{noise}"
                        warm[label] = bench_query(
                            client, store, work, query, m, m * n, fl, args, noise
                        )
                    if args.groups and query == "centered-covariance":
                        for noise in args.noise.split(","):
                            warm[f"grouped:{noise}"] = bench_query(
                                client, store, work, query, m, m * n, fl, args, noise, args.groups
                            )
                for noise in args.noise.split(","):
                    one, grouped = (
                        warm.get(f"centered-covariance:{noise}"),
                        warm.get(f"grouped:{noise}"),
                    )
                    if one and grouped:  # the same data, the same warm cluster, this run
                        print(
                            f"{'':>6} centered-covariance with {args.groups} groups / without "
                            f"({noise}): {grouped / one:.2f}x"
                        )
                for noise in args.noise.split(","):
                    cov = warm.get(f"covariance:{noise}")
                    other = warm.get(f"centered-covariance:{noise}")
                    if cov and other:  # the same data, the same warm cluster, this run
                        print(
                            f"{'':>6} centered-covariance / covariance ({noise}): "
                            f"{other / cov:.2f}x"
                        )
                print(
                    f"{'':>6} floors ns/el per core: read {fl['read']:.2f}, noise "
                    f"{fl['noise']:.2f} (lattice, applied: {fl['lattice']:.2f}), write "
                    f"{fl['write']:.2f}, Gram {fl['gram']:.2f}; "
                    f"raw decode {fl['decode']:.2f}: the read path is "
                    f"{fl['read'] / fl['decode']:.2f}x the raw decode floor "
                    f"({fl['checked'] / fl['decode']:.2f}x with the domain check, "
                    f"{fl['checked']:.2f})",
                    flush=True,
                )
                if args.workdir is None:
                    shutil.rmtree(store, ignore_errors=True)
    finally:
        client.close()
        cluster.close()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
