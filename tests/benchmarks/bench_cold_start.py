"""What numba's kernels cost a fresh worker, and a cold identity release with and without the
kernel warm-up (:mod:`mvg_dask.engine.warmup`), interleaved in one run.

Run: ``.venv/bin/python -m tests.benchmarks.bench_cold_start [--repeats 5] [--records 262144]``

1. In ``--repeats`` fresh Python processes (medians; wall and CPU seconds): importing the
   package's lattice modules, importing numba, creating the kernels' dispatchers, the first
   call of the sampler's kernel (numba's on-disk cache loaded; compiled if the cache is cold),
   the first call of the fused diagonal kernel, and a second 16 x 1024 tile (the steady cost).
2. A cold identity release with lattice noise of ``16 x --records`` values: each repetition
   starts a fresh LocalCluster of worker processes (the embedded default's settings) and
   releases on it, alternately with the warm-up and without it (the same bytes either way).
   It prints the medians and their ratio.

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
    """Part 2: fresh-cluster identity releases, with and without the warm-up, interleaved."""
    from mvg_dask import api
    from mvg_dask.data import synthetic, write_matrix
    from mvg_dask.engine import warmup
    from mvg_dask.engine.cluster import connect

    work = Path(tempfile.mkdtemp(prefix="mvg-cold-"))
    store = str(work / "in.zarr")
    chunk = min(records, 2**23 // (8 * 16))
    write_matrix(synthetic(records, 16, record_chunk=chunk), store, record_chunk=chunk)
    needs = warmup.needs_kernels
    times: dict[str, list[float]] = {"with warm-up": [], "without": []}
    try:
        for r in range(repeats):
            for label in times if r % 2 == 0 else reversed(list(times)):
                out = str(work / "out.zarr")
                shutil.rmtree(out, ignore_errors=True)
                Path(f"{out}.ledger.sqlite").unlink(missing_ok=True)
                warmup.needs_kernels = needs if label == "with warm-up" else lambda _: False  # type: ignore[assignment]
                t = time.perf_counter()
                with connect(None, processes=True) as client:
                    api.release(spec(store, out, "identity"), client=client, progress=False)
                times[label].append(time.perf_counter() - t)
    finally:
        warmup.needs_kernels = needs  # type: ignore[assignment]
        shutil.rmtree(work, ignore_errors=True)
    with_, without = (statistics.median(v) for v in times.values())
    print(f"cold identity release, 16 x {records}, fresh LocalCluster each, median of {repeats}:")
    print(f"  with warm-up {with_:.2f} s, without {without:.2f} s, ratio {with_ / without:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--records", type=int, default=2**18)
    args = parser.parse_args()
    kernel_costs(args.repeats)
    cold_releases(args.repeats, args.records)


if __name__ == "__main__":
    main()
