"""Speed of the exact rounded-Gaussian sampler against the keyed normals, in one run.

Run: ``.venv/bin/python -m tests.benchmarks.bench_lattice_sampler [--repeats 7]``

For a 1024 x 1024 and a 64 x 1024 tile and several scales it reports ns per element of
``NoiseKey.tile_lattice`` and of ``NoiseKey.tile_normals`` (best of ``--repeats`` after a
warm-up, so numba's compilation is excluded) and their ratio, plus the share of elements that
went to the exact path over all timed draws. Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from mvg_dask.noise import NoiseKey
from mvg_dask.noise.lattice import _draw

SHAPES = [(1024, 1024), (64, 1024)]
SCALES = [1.0, 3.7, 2.0**10, 2.0**24, 2.0**40]


def _best_ns(fn: Callable[[int], object], n: int, repeats: int) -> float:
    fn(0)  # warm-up
    best = float("inf")
    for r in range(repeats):
        t = time.perf_counter()
        fn(r + 1)
        best = min(best, time.perf_counter() - t)
    return best * 1e9 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    key = NoiseKey.from_seed(2024)
    print(f"{'tile':>11} {'scale':>10} {'lattice ns':>11} {'normals ns':>11} {'ratio':>6}")
    for shape in SHAPES:
        n = shape[0] * shape[1]
        normals = _best_ns(lambda t, shape=shape: key.tile_normals(t, shape), n, args.repeats)
        for scale in SCALES:
            lattice = _best_ns(
                lambda t, shape=shape, scale=scale: key.tile_lattice(t, shape, scale),
                n,
                args.repeats,
            )
            print(
                f"{shape[0]:>5}x{shape[1]:<5} {scale:>10.4g} {lattice:>11.2f} {normals:>11.2f} "
                f"{lattice / normals:>6.2f}"
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
