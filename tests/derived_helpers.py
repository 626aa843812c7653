"""Coverage and width of the derived statistics' intervals, measured against the noise law of a
real plan (tests/test_derived_intervals.py; the numbers in docs/guide/python.md).

For a grid cell ``(n, d, epsilon)`` the dry run of a real regression spec (``d`` features in
``[0, 1]``, ``n`` records, target ``f0``, ``delta = 1e-6``, the exact calibration) gives the
noise plan. The truth is the moment ``Z Z^T / n0`` of ``z = [x - c; s]`` for ``n0 = 20,000``
records of a fixed model (two latent factors, a linear target; :func:`model_records`): the
noise law does not depend on the data, so any moment of records in the box serves. ``releases``
releases are the truth plus independent draws of the published noise
(:func:`~mvg_dask.plan.derived_stats.published_noise_draws`, whose law the tests check against
the plan and tests/test_accuracy.py checks against real releases). On each release the
accessor's own functions compute the statistic and its 95 % interval:

* regression coefficients (least squares with an intercept, target ``f0``): the exact pivot
  (:func:`mvg_dask.interactive.derived.pivot_regression`), under ``regression (all)`` every
  interval, under ``regression`` the bounded ones and ``regression (unresolved)`` the others;
* explained-variance fractions: the basic parametric bootstrap
  (:func:`mvg_dask.interactive.derived.fraction_interval_arrays`);
* correlations: the delta method on the PSD-projected correlation
  (:func:`mvg_dask.plan.derived_stats.correlation_matrix`);
* the largest principal angle of the top-2 subspace: the bootstrap's one-sided bound
  (:func:`mvg_dask.interactive.derived.angle_arrays`).

Coverage is the mean over releases of each release's share of covered entries, its standard
error the releases' own (independent across releases). The oracle knows the truth and the law:
its interval for an entry is the central 95 % of the entry's error over the releases, so its
width is that spread; a method's width is compared by the median over entries of (median
width over releases / oracle width).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np

from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.interactive.derived import (
    VALUE,
    NoisyRelease,
    RegressionTerms,
    angle_arrays,
    fraction_interval_arrays,
    pivot_regression,
    regression_fits,
)
from mvg_dask.plan.derived_stats import (
    centered_covariance_std,
    correlation_matrix,
    explained_variance_fractions,
    largest_principal_angle,
    published_noise_draws,
    top_subspace,
)
from mvg_dask.plan.noise_plan import NoisePlan
from mvg_dask.plan.queries.moment import scale_constant

Z95 = 1.959963984540054
#: records of the truth's moment
TRUTH_RECORDS = 20_000
#: the PCA subspace's dimension (the model's two factors)
K = 2
#: the correlation method measured
METHOD = "floor"
#: releases whose bootstrap draws are made and decomposed together
BLOCK = 50


def regression_plan(root: Path, n: int, d: int, epsilon: float) -> NoisePlan:
    """The noise plan of a real regression spec on ``d`` features and ``n`` records (a
    metadata-only input: the dry run reads no data)."""
    store = root / f"in-{n}-{d}.zarr"
    if not store.exists():
        chunk = min(n, 250_000)
        X = da.zeros((d, n), chunks=(d, chunk))
        write_matrix(X, store, feature_names=[f"f{i}" for i in range(d)], record_chunk=chunk)
    spec = {
        "name": "derived",
        "input": {"store": str(store), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": {"regression": {"target": "f0"}},
        "mechanism": {"calibration": "exact"},
        "privacy": {"epsilon": epsilon, "delta": 1e-6},
        "output": {"store": str(root / "out.zarr")},
    }
    return api.dry_run(spec).noise_plan()


def model_records(d: int, n: int, seed: int = 0) -> np.ndarray:
    """``d x n`` records in ``[0, 1]``: ``d - 1`` predictors ``0.5 + L f + 0.08 e`` (two
    standard normal factors ``f``, loadings ``L`` with std 0.1) and the target
    ``f0 = 0.5 + b^T (x_P - 0.5) + 0.05 e`` (``b`` with std ``1 / sqrt(d - 1)``), clipped."""
    rng = np.random.default_rng(seed)
    L = rng.normal(0.0, 0.1, (d - 1, K))
    xp = 0.5 + L @ rng.standard_normal((K, n)) + 0.08 * rng.standard_normal((d - 1, n))
    b = rng.normal(0.0, 1.0 / np.sqrt(d - 1), d - 1)
    y = 0.5 + b @ (xp - 0.5) + 0.05 * rng.standard_normal(n)
    return np.clip(np.vstack([y, xp]), 0.0, 1.0)


def truth_moment(plan: NoisePlan, d: int) -> np.ndarray:
    """``Z Z^T / n0`` of ``z = [x - c; s]`` for the model's records, as the release holds it."""
    X = model_records(d, TRUTH_RECORDS)
    query: Any = plan.query
    Z = np.vstack([X - np.asarray(query.centre)[:, None], np.full(X.shape[1], query.scale)])
    return np.asarray(Z @ Z.T / X.shape[1])


def _correlation(C: np.ndarray) -> np.ndarray:
    root = np.sqrt(np.diagonal(C, axis1=-2, axis2=-1))
    return np.asarray(C / (root[..., :, None] * root[..., None, :]))


@dataclass
class Measured:
    """Per statistic: each release's share of covered entries, the intervals' widths and the
    estimates (``releases x entries``)."""

    hits: dict[str, list[np.ndarray]] = field(default_factory=dict)
    widths: dict[str, list[np.ndarray]] = field(default_factory=dict)
    errors: dict[str, list[np.ndarray]] = field(default_factory=dict)
    masks: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, name: str, covered: np.ndarray, width: np.ndarray, error: np.ndarray) -> None:
        self.hits.setdefault(name, []).append(np.asarray(covered, dtype=float))
        self.widths.setdefault(name, []).append(np.asarray(width, dtype=float))
        self.errors.setdefault(name, []).append(np.asarray(error, dtype=float))

    def add_split(self, name: str, res: dict[str, np.ndarray], truth: np.ndarray) -> None:
        """The resolved entries of one release under ``name``, the others under
        ``name + " (unresolved)"``; a release without any adds nothing there."""
        lo = res["lower"].reshape(-1)
        hi = res["upper"].reshape(-1)
        value = res["value"].reshape(-1)
        resolved = np.asarray(res["resolved"]).reshape(-1)
        t = np.asarray(truth).reshape(-1)
        covered = (lo <= t) & (t <= hi)
        for key, mask in ((name, resolved), (f"{name} (unresolved)", ~resolved)):
            if np.any(mask):
                self.add(key, covered[mask], (hi - lo)[mask], (value - t)[mask])
                self.masks.setdefault(key, []).append(mask)

    def summary(self) -> dict[str, dict[str, float]]:
        """Coverage, its standard error and the width ratio against the oracle, per statistic."""
        out = {}
        for name, hits in self.hits.items():
            per_release = np.array([np.mean(h) for h in hits])
            row = {
                "coverage": float(per_release.mean()),
                "se": float(per_release.std(ddof=1) / np.sqrt(len(per_release)))
                if len(per_release) > 1
                else 0.0,
                "releases": float(len(per_release)),
            }
            row["entries"] = float(np.mean([len(h) for h in hits]))
            if name != "angle" and name in self.masks:
                # the oracle's width per entry: the central 95 % of its error over the releases
                # where it is in this class (at least 40 of them)
                masks = np.stack(self.masks[name])
                errors = np.full(masks.shape, np.nan)
                widths = np.full(masks.shape, np.nan)
                for i, (m, e, w) in enumerate(
                    zip(masks, self.errors[name], self.widths[name], strict=True)
                ):
                    errors[i, m], widths[i, m] = e, w
                enough = np.sum(masks, axis=0) >= 40
                if np.any(enough):
                    lo, hi = np.nanquantile(errors[:, enough], [0.025, 0.975], axis=0)
                    ratio = np.nanmedian(widths[:, enough], axis=0) / (hi - lo)
                    row["width_ratio"] = float(np.median(ratio))
                    row["width_ratio_max"] = float(np.max(ratio))
            out[name] = row
        return out


def measure_cell(
    root: Path,
    n: int,
    d: int,
    epsilon: float,
    *,
    releases: int,
    draws: int,
    seed: int,
    block: int = BLOCK,
) -> dict[str, dict[str, float]]:
    """The coverage and widths of the four intervals on ``releases`` simulated releases of one
    grid cell (releases drawn with ``seed``; the bootstrap's draws for releases
    ``[i * block, (i + 1) * block)`` with ``seed + 1 + i``, independent across releases).

    Every release's statistics come from the accessor's functions, called on all releases at
    once (a leading axis of releases): the regression's pivot, the fractions' and the
    angle's bootstrap on the covariances of the release and of its draws, the correlations'
    delta method."""
    plan = regression_plan(root, n, d, epsilon)
    model = NoisyRelease("moment", plan)
    T = truth_moment(plan, d)
    truth = {VALUE: T[None]}
    labels = [*(f"f{i}" for i in range(d)), "1"]
    terms = RegressionTerms(labels, "f0", True, model.centre)
    zero = np.zeros(1)
    b_true = regression_fits(model.regression_moments(truth), terms, zero)[0][0, 0]
    C_true = model.covariances(truth)[0, 0]
    f_true = explained_variance_fractions(C_true)
    r_true = _correlation(C_true)
    V_true = top_subspace(C_true, K)
    off = ~np.eye(d, dtype=bool)
    s = scale_constant(np.broadcast_to(plan.released_entry_std(), T.shape), 1.0 / model.scale)
    noisy = T + published_noise_draws(plan, np.random.default_rng(seed), releases)
    out = Measured()
    reg = pivot_regression(model, noisy, terms, zero, 0.95)
    assert reg is not None  # symmetric noise: the pivot applies
    reg["value"] = regression_fits(model.regression_moments({VALUE: noisy}), terms, zero)[0]
    for r in range(releases):
        one = {k: v[r, 0] for k, v in reg.items()}
        out.add_split("regression", one, b_true)
        out.add_split("regression (all)", {**one, "resolved": np.ones(d, dtype=bool)}, b_true)
    C_all = model.covariances({VALUE: noisy})[:, 0]
    values = scale_constant(noisy, 1.0 / model.scale)
    sd_c = centered_covariance_std(values, s, grouped=False)
    rho, sd, dominated = correlation_matrix(C_all, sd_c, method=METHOD)
    for start in range(0, releases, block):
        sl = slice(start, min(start + block, releases))
        rng = np.random.default_rng(seed + 1 + start // block)
        drawn = noisy[sl][None] + published_noise_draws(plan, rng, (draws, sl.stop - start))
        C, Cb = C_all[sl], model.covariances({VALUE: drawn})[:, 0]
        frac = fraction_interval_arrays(C, Cb, 0.95)
        V, boot = angle_arrays(C, Cb, K)
        bound = np.quantile(boot, 0.95, axis=0)
        angle = largest_principal_angle(V, V_true)
        for i in range(sl.stop - start):
            out.add_split("fractions", {k: v[i] for k, v in frac.items()}, f_true)
            out.add("angle", np.array([angle[i] <= bound[i]]), bound[i : i + 1], angle[i : i + 1])
    for r in range(releases):
        corr = {
            "value": rho[r][off],
            "lower": np.where(dominated[r], -1.0, np.clip(rho[r] - Z95 * sd[r], -1, 1))[off],
            "upper": np.where(dominated[r], 1.0, np.clip(rho[r] + Z95 * sd[r], -1, 1))[off],
            "resolved": ~dominated[r][off],
        }
        out.add_split("correlation", corr, r_true[off])
    return out.summary()
