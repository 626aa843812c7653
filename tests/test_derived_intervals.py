"""Intervals for what analysts derive, their coverage measured against the noise law
(tests/derived_helpers.py says how; the numbers are in docs/guide/python.md).

95 % intervals (alpha = 0.05): regression coefficients (least squares with an intercept, the
exact pivot test-inverted), explained-variance fractions (basic parametric bootstrap),
correlations (delta method) and a 95 % bound on the largest principal angle of the top-2
subspace. Releases are seeded (``SEED``; the bootstrap of releases ``50 i .. 50 i + 49``
``SEED + 1 + i``).

* Where the release resolves the statistic (``resolved``; for a correlation, both variances
  significantly above 0; for the regression, a cell whose intervals are (almost) all bounded)
  coverage is 95 % within 3 standard errors and the median width within 1.5x the oracle's
  (which knows the truth and the law);
* elsewhere the fractions' Weyl intervals, the correlations' [-1, 1] and the regression's
  intervals (unbounded where the release does not bound the coefficient) cover at least 95 %
  (within 3 standard errors), and the angle's bound at least 95 %.

The default suite runs one cell of the grid on 300 releases and the regression of two
``n = 1e4, d = 5`` cells (one bounded, one often unbounded); the slow test the whole grid
``n in {1e4, 1e6}``, ``d in {5, 20}``, ``epsilon in {0.5, 1, 4}`` on 1,000 releases each. A
real release (its plan and its values) gives the same intervals through the accessor as the
functions measured here, and (slow) 300 releases by the audit's trial sampler (bit for bit the
cluster's) cover through the accessor.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.interactive.derived import (
    PIVOT_METHOD,
    VALUE,
    NoisyRelease,
    RegressionTerms,
    regression_interval_arrays,
)
from mvg_dask.plan.derived_stats import NoiseDominatedWarning
from tests.audit_helpers import moment_trial
from tests.derived_helpers import measure_cell, model_records
from tests.pipeline_helpers import make_input
from tests.test_audit import engine_gram

SEED = 41_000
LEVEL = 0.95
#: bootstrap draws per release in the full grid (the fractions' and the angle's)
DRAWS = 200
GRID = [(n, d, eps) for n in (10**4, 10**6) for d in (5, 20) for eps in (0.5, 1.0, 4.0)]
#: statistics whose coverage is claimed where resolved
CLAIMED = ("fractions", "correlation")
#: the share of unbounded regression intervals below which a cell's are claimed calibrated
BOUNDED = 0.01


def _unbounded_share(summary: dict[str, dict[str, float]]) -> float:
    """The share of a cell's regression intervals that are unbounded."""
    row = summary.get("regression (unresolved)")
    if row is None:
        return 0.0
    total = summary["regression (all)"]
    return row["entries"] * row["releases"] / (total["entries"] * total["releases"])


def _check(summary: dict[str, dict[str, float]]) -> None:
    """Resolved: 95 % within 3 SE and width within 1.5x the oracle's; unresolved fractions and
    correlations and the angle's bound: at least 95 % within 3 SE. The regression's intervals
    (all of them, bounded or not): at least 95 % within 3 SE in every cell, and 95 % within
    3 SE with the width within 1.5x where (almost) all are bounded."""
    for name, row in summary.items():
        floor = np.sqrt(LEVEL * (1 - LEVEL) / row["releases"])  # all covered: SE 0
        se = max(row["se"], floor)
        calibrated = name in CLAIMED or (
            name == "regression (all)" and _unbounded_share(summary) < BOUNDED
        )
        if calibrated:
            assert abs(row["coverage"] - LEVEL) <= 3 * se, f"{name}: {row}"
            if "width_ratio" in row:
                assert row["width_ratio"] <= 1.5, f"{name}: {row}"
        elif name in (
            "regression (all)",
            "fractions (unresolved)",
            "correlation (unresolved)",
            "angle",
        ):
            assert row["coverage"] >= LEVEL - 3 * se, f"{name}: {row}"


def test_reduced_grid(tmp_path: Path) -> None:
    summary = measure_cell(tmp_path, 10**6, 5, 1.0, releases=300, draws=200, seed=SEED)
    assert {*CLAIMED, "regression (all)"} <= set(summary)  # everything resolved in this cell
    assert _unbounded_share(summary) == 0.0
    _check(summary)


def test_unresolved_cell_regression(tmp_path: Path) -> None:
    """Where the noise is near the predictors' covariance floor (n = 10^4, d = 5, eps = 1) the
    pivot's intervals are bounded and calibrated, and where it swamps it (eps = 0.5) they are
    unbounded often and cover at least 95 % (300 releases each)."""
    for eps in (1.0, 0.5):
        summary = measure_cell(tmp_path, 10**4, 5, eps, releases=300, draws=200, seed=SEED)
        _check(summary)
        assert (_unbounded_share(summary) < BOUNDED) == (eps == 1.0), summary


@pytest.mark.slow
@pytest.mark.parametrize(("n", "d", "eps"), GRID)
def test_full_grid(tmp_path_factory: pytest.TempPathFactory, n: int, d: int, eps: float) -> None:
    root = tmp_path_factory.getbasetemp() / "derived-grid"
    root.mkdir(exist_ok=True)
    summary = measure_cell(root, n, d, eps, releases=1000, draws=DRAWS, seed=SEED)
    _check(summary)


# -- through real releases ----------------------------------------------------------------------
D, N_REAL = 4, 20_000


def _spec(root: Path) -> dict[str, Any]:
    return {
        "name": "derived",
        "input": {"store": str(root / "in.zarr"), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": {"regression": {"target": "f0"}},
        "mechanism": {"calibration": "exact"},
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "output": {"store": str(root / "out.zarr")},
    }


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, client: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("derived-real")
    X = model_records(D, N_REAL, seed=3)
    make_input(root / "in.zarr", X, chunk=5000)
    spec = _spec(root)
    ds = api.open_release(api.release(spec, client=client, seed=SEED, progress=False).output)
    return {"X": X, "ds": ds.load(), "spec": spec, "client": client}


def _truth(X: np.ndarray) -> dict[str, np.ndarray]:
    design = np.column_stack([X[1:].T, np.ones(X.shape[1])])
    b = np.linalg.lstsq(design, X[0], rcond=None)[0]
    C = np.cov(X, bias=True)
    w = np.linalg.eigvalsh(C)[::-1]
    return {"b": b, "fractions": w / w.sum(), "r": np.corrcoef(X)}


def test_accessor_on_a_real_release_is_what_is_measured(real: dict[str, Any]) -> None:
    """The accessor's regression intervals on a real release are those of the measured
    functions on its plan and values, with the same seed."""
    ds = real["ds"]
    got = ds.mvg.regression_intervals()
    model = NoisyRelease("moment", ds.mvg.noise_plan())
    raw = {VALUE: ds["moment"].values[None]}
    labels = [*(f"f{i}" for i in range(D)), "1"]
    terms = RegressionTerms(labels, "f0", True, model.centre)
    want, names, method = regression_interval_arrays(model, raw, terms, np.zeros(1), LEVEL)
    assert list(got["term"].values) == list(names) == ["f1", "f2", "f3", "1"]
    for key in ("value", "lower", "upper", "std", "resolved"):
        np.testing.assert_array_equal(got[key].values, want[key][0])
    assert got.attrs["method"] == method == PIVOT_METHOD and got.attrs["level"] == LEVEL
    assert bool(got["resolved"].all())
    assert np.all(got["lower"].values < got["value"].values)
    assert np.all(got["value"].values < got["upper"].values)


@pytest.mark.slow
def test_real_releases_cover(real: dict[str, Any], tmp_path: Path) -> None:
    """300 releases of the real plan by the audit's trial sampler (the engine's moment stage
    with the key of each seed ``SEED + t``), each read through the accessor: the regression's,
    the fractions' and the correlations' 95 % intervals cover the clipped data's values 95 % of
    the time within 3 standard errors."""
    trials = 300
    root = tmp_path / "plan"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    make_input(root / "in.zarr", real["X"], chunk=5000)
    rplan = api.dry_run(_spec(root))
    gram = engine_gram(rplan, real["client"])
    truth = _truth(real["X"])
    base = real["ds"]
    off = ~np.eye(D, dtype=bool)
    hits: dict[str, list[float]] = {"regression": [], "fractions": [], "correlation": []}
    for t in range(trials):
        out = moment_trial(rplan, gram, SEED + t)
        ds = base.copy()
        ds["moment"] = base["moment"].copy(data=out.value)
        ds["covariance"] = base["covariance"].copy(data=out.extra["covariance"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoiseDominatedWarning)
            reg = ds.mvg.regression_intervals(draws=300, seed=SEED + 1 + t)
            ev = ds.mvg.explained_variance(draws=300, seed=SEED + 1 + t)
            corr = ds.mvg.correlation()
        for name, res, value, mask in (
            ("regression", reg, truth["b"], slice(None)),
            ("fractions", ev, truth["fractions"], ev["resolved"].values),
            ("correlation", corr, truth["r"], off),
        ):
            lo, hi = res["lower"].values, res["upper"].values
            covered = ((lo <= value) & (value <= hi))[mask]
            if covered.size:
                hits[name].append(float(np.mean(covered)))
    for name, per_trial in hits.items():
        rate = float(np.mean(per_trial))
        se = max(float(np.std(per_trial, ddof=1)) / np.sqrt(len(per_trial)), 0.0126)
        print(f"{name}: coverage {rate:.4f} +- {se:.4f} over {len(per_trial)} releases")
        assert abs(rate - LEVEL) <= 3 * se, f"{name}: coverage {rate:.4f} +- {se:.4f}"
