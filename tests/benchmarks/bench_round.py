"""A round against a bare numpy noise draw, on the MGM paper's Adult gradient (105 x 12).

Run: ``.venv/bin/python -m tests.benchmarks.bench_round [--repeats 400]``

* **round**: :meth:`mvg_dask.engine.rounds.TrainingRun.release` of a run planned once
  (``mgm-idn``, clip 0.015, the paper's Adult clip): the matrix is checked, clipped, whitened,
  rounded to the lattice, given exact rounded-Gaussian integers from the keyed AES-CTR
  generator and published;
* **numpy**: ``x + rng.normal(0, sigma, x.shape)`` with the analytic Gaussian's ``sigma``
  computed once and ``numpy.random.default_rng`` (PCG64): float noise, what Flower's DP
  strategies add.

The two are interleaved (one of each per repeat, after a warm-up), so the machine's load hits
both alike; the medians and their ratio are printed. The target is a ratio <= 3.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mvg_dask import api
from mvg_dask.privacy import calibration as cal

SHAPE = (105, 12)
CLIP = 0.015
TARGET = 3.0


def measure(repeats: int) -> tuple[float, float]:
    """Median seconds of one round and of one numpy draw (interleaved)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-CLIP, CLIP, SHAPE)
    run = api.training_run(
        shape=SHAPE, rounds=repeats + 20, epsilon=1.0, delta=1e-5, clip=CLIP, seed=0
    )
    sigma = 2 * CLIP * np.sqrt(x.size) / cal.analytic_gaussian_mu(1.0, 1e-5)
    noise_rng = np.random.default_rng(1)
    for _ in range(20):  # warm-up: compiled kernels, the sampler's tables
        run.release(x)
        x + noise_rng.normal(0.0, sigma, x.shape)
    rounds, draws = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run.release(x)
        t1 = time.perf_counter()
        x + noise_rng.normal(0.0, sigma, x.shape)
        t2 = time.perf_counter()
        rounds.append(t1 - t0)
        draws.append(t2 - t1)
    return statistics.median(rounds), statistics.median(draws)


def main() -> None:
    """Print the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=400)
    args = parser.parse_args()
    r, d = measure(args.repeats)
    ratio = r / d
    verdict = "meets" if ratio <= TARGET else "misses"
    print(
        f"round {SHAPE[0]}x{SHAPE[1]} (mgm-idn, lattice): {r * 1e6:.1f} us; numpy analytic "
        f"Gaussian draw: {d * 1e6:.1f} us; ratio {ratio:.2f} ({verdict} the target <= {TARGET:g})"
    )


if __name__ == "__main__":
    main()
