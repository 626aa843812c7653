"""A stream's period against a one-shot release over the same new records, interleaved in one run.

Run: ``.venv/bin/python -m tests.benchmarks.bench_stream [--records 262144] [--features 64]
[--periods 6] [--factorization square-root]``

One warm cluster (2 worker processes x 1 thread, the embedded default's settings). Each round
appends ``--records`` new records to a growing store and releases the stream's next period (the
covariance under add-remove: its noisy ``gram`` and count), then releases the same query once
over a store holding only those new records (no stream). The two alternate, so the machine's load
affects both alike. It prints each round's seconds, the medians and their ratio (a period's cost
over the one-shot's), and the stream's curator-side state per period.

The first period is reported but left out of the medians (it opens the stream). A period's cost
over the one-shot's is the exact-integer bookkeeping and the decoder: ``O(t m^2)`` for the square
root at period ``t``, ``O(m^2 log t)`` for the tree, against the ``O(n m^2)`` Gram product both
share.

Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mvg_dask.data import write_matrix


def _spec(root: Path, store: str, out: str, stream: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "nightly" if stream else "one-shot",
        "input": {"store": store, "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": "covariance",
        "privacy": {"epsilon": 1.0, "delta": 1e-6, "neighbours": "add-remove"},
        "output": {"store": out},
    }
    if stream:
        spec["stream"] = stream
    return spec


def _write(path: Path, X: np.ndarray, chunk: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    write_matrix(X, path, record_chunk=chunk, feature_names=[f"f{i}" for i in range(X.shape[0])])


def _state_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    from distributed import Client, LocalCluster

    from mvg_dask import api

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2**18, help="new records per period")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--periods", type=int, default=6)
    ap.add_argument("--factorization", default="square-root", choices=["square-root", "tree"])
    args = ap.parse_args(argv)
    for name in ("mvg_dask", "distributed"):  # "not charged" notices, nanny shutdown chatter
        logging.getLogger(name).setLevel(logging.ERROR)
    n, m, periods = args.records, args.features, args.periods
    chunk = max(1, 2**23 // (8 * m))  # ~8 MiB chunks
    rng = np.random.default_rng(2026)
    root = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    stream = {
        "horizon": 365,
        "factorization": args.factorization,
        "max_records": n * (periods + 1),
    }
    grow, new = root / "growing.zarr", root / "new.zarr"
    s_spec = _spec(root, str(grow), str(root / "stream-out"), stream)
    rows: list[tuple[int, float, float, int]] = []
    print(
        f"stream period vs one-shot: covariance, add-remove, {m} features, {n:,} new records "
        f"per period, {args.factorization}, T = 365 (a loaded machine reads the ratio)"
    )
    try:
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
            Client(cluster) as client,
        ):
            X = np.empty((m, 0))
            for t in range(1, periods + 1):
                fresh = rng.random((m, n))
                X = np.concatenate([X, fresh], axis=1)
                _write(grow, X, chunk)
                _write(new, fresh, chunk)
                t0 = time.perf_counter()
                api.release(s_spec, client=client, progress=False)
                period = time.perf_counter() - t0
                out = root / f"one-shot-{t}"
                t0 = time.perf_counter()
                api.release(_spec(root, str(new), str(out), None), client=client, progress=False)
                one = time.perf_counter() - t0
                state = _state_bytes(root / "stream-out.stream-state")
                rows.append((t, period, one, state))
                print(
                    f"period {t:>3}: {period:7.3f} s   one-shot {one:7.3f} s   "
                    f"ratio {period / one:5.2f}   state {state / 2**20:8.2f} MiB"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    later = rows[1:] or rows
    p = statistics.median(r[1] for r in later)
    o = statistics.median(r[2] for r in later)
    print(
        f"median over periods 2..{periods}: period {p:.3f} s, one-shot {o:.3f} s, "
        f"ratio {p / o:.2f} (target <= 1.2)"
    )


if __name__ == "__main__":
    main()
