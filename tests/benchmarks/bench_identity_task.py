"""The identity task's stages, CPU ns per element, in one process.

Run: ``.venv/bin/python tests/benchmarks/bench_identity_task.py [--features 16] [--repeats 3]``
(by path, with ``PYTHONPATH`` set to the source tree to measure: runs of two trees alternated
compare them under the same load).

On ~8 MiB chunks (``--features`` x ``2^20 / features`` records, float64, ``[0, 1]``, stored raw)
it times, with the thread's CPU clock, what an identity task with lattice noise does to each
chunk: the read (``ZarrMatrix.read``), the domain check and clip (``Clipper``), the noise step
(``RecordLattice.release``: the exact integers drawn tile by tile and applied to the values),
the write (``ZarrMatrix.write``), their sum, and the float path's noise (``record_noise``) for
comparison; medians over the chunks and repeats. It prints a hash of the published bytes, equal
across trees when they publish the same bytes. Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    import zarr

    import mvg_dask
    from mvg_dask.engine.clipping import Clipper
    from mvg_dask.engine.lattice import RecordLattice
    from mvg_dask.engine.records import ZarrMatrix
    from mvg_dask.noise import NoiseKey
    from mvg_dask.noise.tiles import record_noise, tile_records_for

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    m = args.features
    chunk = (1 << 20) // m
    n = chunk * args.chunks
    work = Path(tempfile.mkdtemp(prefix="mvg-idtask-"))
    try:
        for name in ("in", "out"):
            zarr.create_array(
                store=str(work / name),
                shape=(m, n),
                chunks=(m, chunk),
                dtype="float64",
                compressors=None,
            )
        zarr.open_array(str(work / "in"), mode="r+")[:] = np.random.default_rng(0).random((m, n))
        src, sink = (
            ZarrMatrix(str(work / "in"), "", False),
            ZarrMatrix(str(work / "out"), "", False),
        )
        clip = Clipper("box", np.zeros((m, 1)), np.ones((m, 1)), None, "clip")
        key = NoiseKey.from_seed(1).derive("release")
        tile = tile_records_for(m)
        d = np.sqrt(np.full(m, 0.37))
        lattice = RecordLattice(-25, 2.0**25, 1.0 / d, d)
        params = inspect.signature(lattice.release).parameters
        kw = {"overwrite": True} if "overwrite" in params else {}
        lattice.release(np.zeros((m, 4)), key, 0, 4, tile=tile, n_total=n)  # load the kernels
        names = ("read", "clip", "noise", "write", "task", "float noise")
        spent: dict[str, list[float]] = {k: [] for k in names}
        digest = hashlib.sha256()
        clock = time.thread_time_ns
        for _ in range(args.repeats):
            for a in range(0, n, chunk):
                b = a + chunk
                t0 = clock()
                x = src.read(a, b)
                t1 = clock()
                x, _ = clip(x, a)
                t2 = clock()
                y = lattice.release(x, key, a, b, tile=tile, n_total=n, **kw)
                t3 = clock()
                sink.write(a, b, y)
                t4 = clock()
                digest.update(y.tobytes())
                t5 = clock()
                record_noise(key, d, a, b, tile=tile, n_total=n, diagonal=True)
                t6 = clock()
                times = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0, t6 - t5)
                for k, dt in zip(names, times, strict=True):
                    spent[k].append(dt / (m * chunk))
        tree = Path(mvg_dask.__file__).parent.parent
        print(
            f"{tree} m={m}: ns/el "
            + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in spent.items())
            + f"; published bytes sha256 {digest.hexdigest()[:12]}",
            flush=True,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
