"""Empirical privacy audit of a stream: a record added in period s (s in {1, 4, 8} of 8).

The method is ``tests/test_audit.py``'s (``tests/audit_helpers.py``): many independent runs of
the mechanism on ``D`` and on ``D'``, the likelihood-ratio statistic of the pair standardised
with the claimed ``mu``, and a Clopper-Pearson lower bound on epsilon over a fixed grid of
thresholds (``ALPHA = 0.01`` family-wise, Bonferroni). Every bound must be at most the claimed
epsilon.

The mechanism audited is the whole stream: every period's noisy outputs ``y_t`` together (the
published periods are the float decoder's post-processing of them, so a bound on ``y`` bounds
what is published). Through the product's code path:

* the plan is :func:`mvg_dask.plan.stream.plan_stream`'s for an add-remove covariance stream
  (its ``gram`` and its noisy record count, two streams of outputs under one claim), 8 periods,
  ``(epsilon, delta) = (1, 1e-2)`` as the one-shot audits;
* each period's exact integer increment is the engine's: its partial sum over the period's
  records read on the cluster (:func:`mvg_dask.engine.stream.read_increment`: the real reads and
  clipper), its query value and lattice coordinates
  (:func:`~mvg_dask.engine.stream.query_value`,
  :func:`~mvg_dask.engine.stream_noise.lattice_increment`);
* each trial's outputs are the engine's :func:`mvg_dask.engine.stream._outputs` and
  :func:`~mvg_dask.engine.stream._count_outputs` for every period (the exact encoder outputs
  plus the rounded Gaussian keyed by ``(stream key, period, output)``) with the key
  ``NoiseKey.from_seed(seed)``: trial ``i`` of ``D`` uses seed ``SEED + i``, of ``D'`` seed
  ``SEED + n + i``.

``D`` holds ``K`` records per period; ``D'_s`` the same plus the corner record ``(1, ..., 1)``
(the largest of the box) appended in period ``s``. In the lattice coordinates the noise is iid
with std ``2^b s`` (the period plan's scale ``s``, the encoder's dyadic bits ``b``; the count's:
``2^b / mu_count``), so the log-likelihood ratio of all outputs is ``<e, d> - |d|^2 / 2`` with
``e`` the residual against ``D``'s exact outputs
(:func:`~mvg_dask.privacy.continual.encode_period`) and ``d`` the pair's shift, both over that
std. ``|d|`` is the pair's effective ``mu``; it must be at most the
claim's (an exact check), and equals it up to the grid's rounding when the changed column of
``C`` has the largest norm (``s = 1`` for the square root).

The default suite runs the exact check (the pair's shift against the claim); the sampled audits
(``TRIALS`` per dataset, both factorizations) and the under-noised control are slow (about
50 ms per 8-period trial on a loaded machine).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask.engine import stream_noise
from mvg_dask.engine.metadata import read_input_metadata
from mvg_dask.engine.stream import _count_outputs, _outputs, query_value, read_increment
from mvg_dask.engine.stream_noise import lattice_increment
from mvg_dask.noise import NoiseKey
from mvg_dask.plan.stream import StreamPlan, plan_stream
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.continual import encode_period
from mvg_dask.spec import ReleaseSpec
from tests.audit_helpers import epsilon_lower_bound, gaussian_log_lr, standardise
from tests.pipeline_helpers import make_input

EPSILON, DELTA = 1.0, 1e-2  # the stream's claim (the one-shot audits' too)
M = 3
PERIODS = 8
K = 20  # records per period of D
SEED = 39_500_000
#: per dataset, the slow audits (the tree's trials cost about twice the square root's)
TRIALS = {"square-root": 6_000, "tree": 2_000}
CONTROL = 1_500  # per dataset, the under-noised control
POSITIONS = (1, 4, 8)
CORNER = np.ones(M)


def _spec(store: Path, factorization: str) -> ReleaseSpec:
    return ReleaseSpec.model_validate(
        {
            "name": "audit",
            "input": {"store": str(store), "variable": "X"},
            "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
            "query": "covariance",
            "privacy": {"epsilon": EPSILON, "delta": DELTA, "neighbours": "add-remove"},
            "output": {"store": str(store.parent / "out")},
            "stream": {"horizon": PERIODS, "max_records": 4096, "factorization": factorization},
        }
    )


@dataclass
class Data:
    """One dataset's exact inputs to the stream: each period's lattice increment and count."""

    increments: list[np.ndarray]
    counts: list[np.ndarray]


@dataclass
class Pair:
    stream: StreamPlan
    scales: tuple[float, float]  # the outputs' noise std, integer units: gram, count
    d: Data
    exact: np.ndarray  # D's exact outputs over their std, all periods, flattened
    neighbours: dict[int, Data]  # D'_s, per s


def _data(client: Any, root: Path, X: np.ndarray, sizes: list[int], stream: StreamPlan) -> Data:
    """The engine's increments of the store ``X`` whose periods end at ``sizes``."""
    shutil.rmtree(root, ignore_errors=True)
    make_input(root, X, chunk=16)
    spec = _spec(root, "square-root")
    metadata = read_input_metadata(spec.input, spec.group_by, spec.cols_variable)
    read_plan = replace(stream.plan, input=metadata)
    increments, counts = [], []
    for w0, w1 in zip([0, *sizes[:-1]], sizes, strict=True):
        total, _ = read_increment(client, read_plan, w0, w1)
        increments.append(
            lattice_increment(query_value(stream.plan, total), stream.plan.noise_plan())
        )
        counts.append(np.array([w1 - w0], dtype=np.int64))
    return Data(increments, counts)


def _exact(stream: StreamPlan, data: Data, scales: tuple[float, float]) -> np.ndarray:
    """The noise-free outputs of every period over their std, flattened."""
    f = stream.factorization
    parts = []
    for t in range(1, PERIODS + 1):
        gram = encode_period(f, t, np.stack(data.increments[:t]), bound=stream.increment_bound)
        count = encode_period(f, t, np.stack(data.counts[:t]), bound=stream.max_records)
        parts += [gram.ravel() / scales[0], count.ravel() / scales[1]]
    return np.concatenate(parts)


def _pair(tmp: Path, client: Any, factorization: str) -> Pair:
    rng = np.random.default_rng(5)
    X = rng.uniform(0.0, 1.0, (M, K * PERIODS))
    spec = _spec(tmp / "d.zarr", factorization)
    make_input(tmp / "d.zarr", X, chunk=16)
    stream = plan_stream(spec, read_input_metadata(spec.input, spec.group_by, spec.cols_variable))
    assert stream.mu == pytest.approx(cal.analytic_gaussian_mu(EPSILON, DELTA), rel=1e-12)
    plan = stream.plan.noise_plan()
    count_mu = stream.plan.budgets.count_mu
    assert plan.lattice is not None and count_mu is not None  # add-remove: a noisy count
    bits = stream.factorization.scale_bits
    scales = (math.ldexp(plan.lattice.scale, bits), math.ldexp(1.0 / count_mu, bits))
    d = _data(client, tmp / "d.zarr", X, [K * t for t in range(1, PERIODS + 1)], stream)
    neighbours = {}
    for s in POSITIONS:
        Xs = np.insert(X, K * s, CORNER, axis=1)  # the last record of period s
        sizes = [K * t + (t >= s) for t in range(1, PERIODS + 1)]
        neighbours[s] = _data(client, tmp / f"d{s}.zarr", Xs, sizes, stream)
        moved = [
            t for t in range(PERIODS) if np.any(neighbours[s].increments[t] != d.increments[t])
        ]
        assert moved == [s - 1]  # one record moves one increment only
    return Pair(stream, scales, d, _exact(stream, d, scales), neighbours)


def _residuals(pair: Pair, data: Data, first_seed: int, n: int) -> np.ndarray:
    """``(y - exact outputs of D) / std`` of ``n`` streams, every period's outputs flattened."""
    out = np.empty((n, pair.exact.size))
    for i in range(n):
        key = NoiseKey.from_seed(first_seed + i)
        parts = []
        for t in range(1, PERIODS + 1):
            gram = _outputs(pair.stream, t, data.increments, key)
            count = _count_outputs(pair.stream, t, data.counts, key)
            assert count is not None
            parts += [gram.ravel() / pair.scales[0], count.ravel() / pair.scales[1]]
        out[i] = np.concatenate(parts) - pair.exact
    return out


def _audit(pair: Pair, n: int) -> dict[int, Any]:
    mu = pair.stream.mu
    e0 = _residuals(pair, pair.d, SEED, n)
    results = {}
    for s in POSITIONS:
        shift = _exact(pair.stream, pair.neighbours[s], pair.scales) - pair.exact
        effective = float(np.linalg.norm(shift))
        assert effective <= mu * (1 + 1e-9), (s, effective, mu)  # the sensitivity, exact
        e1 = _residuals(pair, pair.neighbours[s], SEED + n, n)
        t0 = standardise(gaussian_log_lr(e0, shift), mu)
        t1 = standardise(gaussian_log_lr(e1, shift), mu)
        result = epsilon_lower_bound(t0, t1, DELTA)
        print(
            f"\nstream audit ({pair.stream.factorization.to_dict()['factorization']}, record "
            f"added in period {s} of {PERIODS}, {n} trials each): effective mu {effective:.4f} "
            f"of the claimed {mu:.4f}; {result.describe(EPSILON)}"
        )
        results[s] = (effective, result)
    return results


def _check(results: dict[int, Any], powerful: bool) -> None:
    for s, (_, result) in results.items():
        assert result.epsilon_lower <= EPSILON, s
    if powerful:
        assert results[1][1].epsilon_lower > 0.3 * EPSILON  # 0.51 measured (10,000 trials)


def test_a_record_in_period_1_4_or_8_moves_the_stream_by_at_most_the_claim(
    tmp_path: Path, client
) -> None:
    """The exact half of the audit, in the default suite: the pair's shift over the outputs'
    std (the effective ``mu`` of a record added in period ``s``) is at most the claimed ``mu``,
    and reaches it for ``s = 1`` (the square root's largest column: the bound is tight)."""
    pair = _pair(tmp_path, client, "square-root")
    mu = pair.stream.mu
    for s in POSITIONS:
        shift = _exact(pair.stream, pair.neighbours[s], pair.scales) - pair.exact
        effective = float(np.linalg.norm(shift))
        print(f"\nrecord added in period {s}: effective mu {effective:.4f} of {mu:.4f}")
        assert effective <= mu * (1 + 1e-9)
        if s == 1:
            assert effective >= 0.99 * mu


@pytest.mark.slow
@pytest.mark.parametrize("factorization", ["square-root", "tree"])
def test_stream_audit_full(tmp_path: Path, client, factorization: str) -> None:
    pair = _pair(tmp_path, client, factorization)
    _check(_audit(pair, TRIALS[factorization]), powerful=factorization == "square-root")


@pytest.mark.slow
def test_the_stream_audit_flags_an_under_noised_stream(tmp_path: Path, client, monkeypatch) -> None:
    """The same audit with every output's noise halved (the rounded Gaussian's scale in
    :func:`~mvg_dask.engine.stream_noise.output_noise`), the claim unchanged, must exceed the
    claim for a record in period 1: the audit can fail."""
    real = stream_noise.output_noise

    def halved(key, period, output, part, shape, scale):  # type: ignore[no-untyped-def]
        return real(key, period, output, part, shape, scale / 2)

    monkeypatch.setattr(stream_noise, "output_noise", halved)
    pair = _pair(tmp_path, client, "square-root")
    results = _audit(pair, CONTROL)  # the statistic as planned: a rescaled likelihood ratio
    assert results[1][1].epsilon_lower > EPSILON
