"""Input codecs: compression ratio against decode speed, on the shipped data and on synthetic data.

Run: ``make bench`` or ``.venv/bin/python -m tests.benchmarks.bench_codecs [--repeats 7]``

For each shipped dataset (its ``features x records`` values, float64, as one chunk) and one
~8 MiB chunk of :func:`mvg_dask.data.synthetic` (uniform floats: high entropy),
it encodes the bytes with each codec and prints the ratio and the median decode and encode
speed (GB/s of decoded bytes, one thread, into a kept buffer), beside ``memcpy``. The codecs
are zarr's default (zstd level 0), the level :func:`mvg_dask.data.write_matrix` uses (zstd
level -1: literals stored raw), faster zstd levels and Blosc. A release reads zstd and raw
chunks of a local store directly (``mvg_dask.engine.zarr_io.chunks``); Blosc goes through
zarr. Speed is reported, never asserted (docs/guide/performance.md, "Input codec").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _median_rate(fn: Callable[[], Any], nbytes: int, repeats: int) -> float:
    """GB/s: the median of ``repeats`` timings, each of enough calls for ~8 MiB."""
    calls = max(1, 2**23 // nbytes)
    spent = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        spent.append((time.perf_counter() - t) / calls)
    return nbytes / statistics.median(spent) / 1e9


def codecs() -> list[tuple[str, Any]]:
    """The codecs compared (name, numcodecs codec)."""
    from numcodecs import Blosc, Zstd, blosc

    blosc.use_threads = False  # one thread, like the others (a worker's thread decodes alone)
    return [
        ("zstd 0 (zarr)", Zstd(level=0)),
        ("zstd -1 (ours)", Zstd(level=-1)),
        ("zstd -3", Zstd(level=-3)),
        ("blosc lz4 shuf", Blosc("lz4", 5, Blosc.SHUFFLE)),
        ("blosc zstd1 shuf", Blosc("zstd", 1, Blosc.SHUFFLE)),
    ]


def bench(name: str, x: np.ndarray, repeats: int) -> None:
    """Print one row per codec for the values ``x``."""
    raw = np.ascontiguousarray(x, dtype="<f8").tobytes()
    out = np.empty(len(raw), dtype=np.uint8)
    src = np.frombuffer(raw, dtype=np.uint8)
    copy = _median_rate(lambda: np.copyto(out, src), len(raw), repeats)
    print(f"{name:>10} {len(raw) / 2**20:>6.2f} {'memcpy':>17} {'':>6} {copy:>8.2f}", flush=True)
    for label, codec in codecs():
        enc = codec.encode(raw)
        dec = _median_rate(lambda c=codec, e=enc: c.decode(e, out=out), len(raw), repeats)
        put = _median_rate(lambda c=codec: c.encode(raw), len(raw), max(1, repeats // 2))
        print(
            f"{name:>10} {len(raw) / 2**20:>6.2f} {label:>17} {len(raw) / len(enc):>6.2f} "
            f"{dec:>8.2f} {put:>8.2f}",
            flush=True,
        )


def main() -> None:
    from mvg_dask.data import synthetic
    from mvg_dask.datasets import load_ctg, load_liver, load_movement

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=7, help="median of N timings")
    args = p.parse_args()
    print(f"{'data':>10} {'MiB':>6} {'codec':>17} {'ratio':>6} {'decode':>8} {'encode':>8}")
    for name, load in (("ctg", load_ctg), ("liver", load_liver), ("movement", load_movement)):
        bench(name, load().X, args.repeats)
    bench("synthetic", synthetic(2**23 // (8 * 64), 64).compute(), args.repeats)
    print("decode and encode: GB/s of decoded bytes, one thread, medians")


if __name__ == "__main__":
    main()
