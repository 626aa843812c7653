"""Speed of the exact rounded-Gaussian sampler against the keyed normals, in one run.

Run: ``.venv/bin/python -m tests.benchmarks.bench_lattice_sampler [--repeats 7]``

For the tiles an identity release draws (16 x 1024 and 64 x 1024: ``tile_records_for``) and a
1024 x 1024 tile, and several scales, it reports ns per element of ``NoiseKey.tile_lattice``,
of ``NoiseKey.tile_normals`` (the keyed AES normals of the float-noise path) and of numpy's
``default_rng().standard_normal`` (PCG64, not keyed), each the median of ``--repeats`` runs
timed interleaved in this process after a warm-up (so numba's loading is excluded), and the
ratios, plus the share of elements that went to the exact path. Speed is reported, never
asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from mvg_dask.noise import NoiseKey
from mvg_dask.noise.lattice import _draw

SHAPES = [(16, 1024), (64, 1024), (1024, 1024)]
SCALES = [1.0, 3.7, 2.0**10, 2.0**24, 2.0**40]


def _median_ns(fns: dict[str, Callable[[int], object]], n: int, repeats: int) -> dict[str, float]:
    """Median ns per element of each function, the functions timed in turn, ``repeats`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn(0)  # warm-up
    for r in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(r + 1)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) * 1e9 / n for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    key = NoiseKey.from_seed(2024)
    rng = np.random.default_rng(2024)
    print(
        f"{'tile':>11} {'scale':>10} {'lattice ns':>11} {'AES ns':>7} {'numpy ns':>9} "
        f"{'/AES':>5} {'/numpy':>6}"
    )
    for shape in SHAPES:
        n = shape[0] * shape[1]
        repeats = args.repeats * max(1, 2**16 // n)
        for scale in SCALES:
            ns = _median_ns(
                {
                    "lattice": lambda t, sh=shape, s=scale: key.tile_lattice(t, sh, s),
                    "aes": lambda t, sh=shape: key.tile_normals(t, sh),
                    "numpy": lambda t, sh=shape: rng.standard_normal(sh),
                },
                n,
                repeats,
            )
            print(
                f"{shape[0]:>5}x{shape[1]:<5} {scale:>10.4g} {ns['lattice']:>11.2f} "
                f"{ns['aes']:>7.2f} {ns['numpy']:>9.2f} {ns['lattice'] / ns['aes']:>5.2f} "
                f"{ns['lattice'] / ns['numpy']:>6.2f}"
            )
    total = undecided = tail = 0
    for t in range(64):
        _, st = _draw(key, 1000 + t, (1024, 1024), 2.0**20)
        total += 1024 * 1024
        undecided += st.undecided
        tail += st.tail
    # per trial: the tail has probability c_T / 2^32 = 2^-32; an undecided comparison about
    # 2^-32 + 2 * margin = 2^-32 + 2^-39 (W within its last read bit or the margin of p)
    print(
        f"exact path: {undecided} of {total} elements ({tail} tail trials) at scale 2^20 "
        f"(expected about {total * (2.0**-31 + 2.0**-39):.3f})"
    )


if __name__ == "__main__":
    main()
