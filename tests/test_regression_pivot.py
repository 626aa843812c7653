"""The regression intervals' pivot (mvg_dask/plan/regression_pivot.py), checked against draws
of the published noise law (:func:`~mvg_dask.plan.derived_stats.published_noise_draws`, the
engine's law) and against an independent sampler of ``B S B^T``.

Statistical tests are seeded; each states its alpha.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from mvg_dask.interactive.derived import NoisyRelease, RegressionTerms, pivot_regression
from mvg_dask.plan.derived_stats import published_noise_draws
from mvg_dask.plan.regression_pivot import pivot_covariance, pivot_intervals, pivot_problem
from tests.derived_helpers import regression_plan, truth_moment

SEED = 41_500


def _symmetric_noise(B: np.ndarray, ratio: float, rng: np.random.Generator, size: int):
    """``B S B^T`` with ``S`` symmetric, ``N(0, 1)`` diagonal, ``N(0, ratio)`` off it."""
    J = B.shape[1]
    S = np.zeros((size, J, J))
    iu = np.triu_indices(J, 1)
    S[:, iu[0], iu[1]] = rng.normal(0.0, np.sqrt(ratio), (size, iu[0].size))
    S = S + np.swapaxes(S, -1, -2)
    S[:, np.arange(J), np.arange(J)] = rng.standard_normal((size, J))
    return B @ S @ B.T


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("shape", ["diagonal", "dense", "rows"])
def test_pivot_covariance_is_the_noise_law(shape: str, fixed: bool) -> None:
    """``Cov((E w)_{1:})`` against 40,000 draws of ``E``: every entry within 5 standard errors
    (alpha about 1e-5 per entry)."""
    rng = np.random.default_rng(SEED)
    B = {
        "diagonal": np.diag(rng.uniform(0.5, 2.0, 5)),
        "dense": rng.normal(size=(5, 5)),
        "rows": rng.normal(size=(4, 5)),
    }[shape]
    ratio, draws = 1.7, 40_000
    w = rng.normal(size=B.shape[0])
    E = _symmetric_noise(B, ratio, rng, draws)
    if fixed:
        E[:, -1, -1] = 0.0
    g = (E @ w)[:, 1:]
    want = pivot_covariance(w, B, ratio, fixed_corner=fixed)
    got = g.T @ g / draws
    v = np.diag(want)
    se = np.sqrt((np.outer(v, v) + want**2) / draws)
    assert np.all(np.abs(got - want) <= 5 * se), np.max(np.abs(got - want) / se)


def test_pivot_is_chi_square_at_the_truth(tmp_path: Path) -> None:
    """A real plan's noise (n = 10^4, d = 4, eps = 1) on the model's moment: at the true
    coefficients the pivot's statistic ``g^T V^-1 g`` over 4,000 releases is chi-square with
    as many degrees of freedom as coefficients (Kolmogorov-Smirnov, alpha = 0.001)."""
    plan = regression_plan(tmp_path, 10**4, 4, 1.0)
    model = NoisyRelease("moment", plan)
    T = truth_moment(plan, 4)
    args = pivot_problem(
        T[None],
        np.asarray(plan.row_factor),
        plan.output_symmetric_ratio,
        np.zeros(1),
        moment=True,
        grouped=False,
        scale=model.scale,
        target=0,
        intercept=True,
        centre=model.centre,
    )
    Y0 = args["Y"][0, 0]
    beta = np.linalg.solve(Y0[1:, 1:], Y0[1:, 0])
    w = np.concatenate([[1.0], -beta])
    noisy = T + published_noise_draws(plan, np.random.default_rng(SEED), 4000)
    Y = pivot_problem(
        noisy,
        np.asarray(plan.row_factor),
        plan.output_symmetric_ratio,
        np.zeros(1),
        moment=True,
        grouped=False,
        scale=model.scale,
        target=0,
        intercept=True,
        centre=model.centre,
    )["Y"][:, 0]
    g = Y[:, 1:, :] @ w
    V = pivot_covariance(w, args["B"], args["ratio"], fixed_corner=True)
    ar = np.sum(g * np.linalg.solve(V, g.T).T, axis=-1)
    assert stats.kstest(ar, stats.chi2(len(beta)).cdf).pvalue > 0.001


def test_unbounded_where_the_noise_swamps_the_predictors(tmp_path: Path) -> None:
    """Predictors without spread (every record's predictors at 0.5): no release bounds a
    slope, and the pivot says so (``-inf`` to ``inf``, not resolved); the intercept stays
    bounded. A release without noise gives the exact coefficients, bounded."""
    plan = regression_plan(tmp_path, 10**4, 4, 1.0)
    model = NoisyRelease("moment", plan)
    rng = np.random.default_rng(SEED)
    X = np.vstack([rng.uniform(0, 1, 2000), np.full((3, 2000), 0.5)])
    Z = np.vstack([X - 0.5, np.full(2000, model.scale)])
    T = Z @ Z.T / 2000
    terms = RegressionTerms(["f0", "f1", "f2", "f3", "1"], "f0", True, model.centre)
    noisy = T + published_noise_draws(plan, rng, 20)
    res = pivot_regression(model, noisy, terms, np.zeros(1), 0.95)
    assert res is not None
    assert np.all(np.isneginf(res["lower"][..., :3])) and np.all(np.isposinf(res["upper"][..., :3]))
    assert not np.any(res["resolved"][..., :3])


def test_pivot_intervals_refuse_a_bad_level() -> None:
    with pytest.raises(ValueError, match="level must lie in"):
        pivot_intervals(np.eye(3)[None], np.eye(3), 1.0, np.eye(2), 1.5)
