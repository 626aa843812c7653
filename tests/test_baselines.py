"""Calibrations and samplers of the literature baselines (JL transform, PPCA, BLR).

Each calibration is checked against its paper's formula written out independently, each sampler
against its exact law. Statistical tests state their alpha and seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from mvg_dask_lab.baselines import (
    BASELINES,
    BLRMechanism,
    IidMechanism,
    acg_parameter,
    bbds_projections,
    bbds_w,
    blr_candidates,
    blr_mechanism,
    iid_baseline,
    jl_transform,
    moment_answers,
    ppca,
    sample_bingham,
)

ALPHA = 0.001


def test_existing_names_still_importable() -> None:
    assert BASELINES == ("gaussian-classic", "gaussian-analytic", "laplace")
    assert callable(iid_baseline) and IidMechanism.__name__ == "IidMechanism"


# -- JL transform (Blocki, Blum, Datta, Sheffet 2012) --------------------------------------------


@pytest.mark.parametrize(
    ("eps", "delta", "r"), [(1.0, 1 / 248, 8), (0.1, 1e-5, 128), (3.0, 0.5, 1)]
)
def test_bbds_w_is_the_papers_formula(eps: float, delta: float, r: int) -> None:
    # BBDS Thm. 3.1: w = 16 sqrt(r log(2/delta)) log(16 r/delta) / eps, written out separately
    expected = 16 * (r * np.log(2 / delta)) ** 0.5 * np.log(16 * r / delta) / eps
    assert bbds_w(eps, delta, r) == pytest.approx(float(expected), rel=1e-12)


def test_bbds_w_monotone_and_rejects_bad_input() -> None:
    assert bbds_w(1.0, 1e-6, 8) > bbds_w(1.0, 1e-3, 8) > bbds_w(2.0, 1e-3, 8)
    assert bbds_w(1.0, 1e-3, 32) > bbds_w(1.0, 1e-3, 8)
    with pytest.raises(ValueError, match="projections"):
        bbds_w(1.0, 1e-3, 0)


def test_bbds_projections() -> None:
    # r = 8 ln(2/nu) / eta^2, rounded up: eta = 0.5, nu = 0.1 gives 95.87 -> 96
    assert bbds_projections(0.5, 0.1) == 96
    assert bbds_projections(1.0, 0.5) == math.ceil(8 * math.log(4))


def test_jl_lift_floors_every_singular_value() -> None:
    """The privacy condition: every singular value of the lifted, scaled matrix is >= w."""
    rng = np.random.default_rng(0)
    records = rng.uniform(0, 1, size=(50, 4))
    mech = jl_transform(epsilon=1.0, delta=0.01, projections=8, row_change=2.0)
    factor = mech.gram_factor(records)
    scaled_gram = factor @ factor.T / mech.row_change**2
    assert np.linalg.eigvalsh(scaled_gram).min() >= mech.w**2 * (1 - 1e-12)
    np.testing.assert_allclose(
        scaled_gram - records.T @ records / 4.0, mech.w**2 * np.eye(4), rtol=1e-9, atol=1e-6
    )


def test_jl_release_law_and_unbiased_gram() -> None:
    """Rows of M A_w are N(0, A^T A + lift I): Monte-Carlo mean of the Gram estimate (seed 1)."""
    rng = np.random.default_rng(1)
    records = rng.uniform(-1, 1, size=(30, 3))
    mech = jl_transform(epsilon=50.0, delta=0.1, projections=16, row_change=0.01)
    rel = mech.sample(records, np.random.default_rng(1), 4000)
    assert rel.shape == (4000, 16, 3)
    est = mech.gram_estimate(rel).mean(axis=0)
    truth = records.T @ records
    sd = np.sqrt(np.diag(truth + mech.lift)[:, None] * np.diag(truth + mech.lift)[None, :])
    # each entry: mean of 4000 x 16 products; 6 standard errors is far beyond alpha = 0.001
    assert np.all(np.abs(est - truth) <= 6 * sd * np.sqrt(2 / (4000 * 16)))


# -- PPCA (Chaudhuri, Sarwate, Sinha 2012) and the Bingham sampler ---------------------------------


def test_acg_parameter_solves_its_equation() -> None:
    lam = np.array([0.0, 0.5, 3.0, 40.0])
    b = acg_parameter(lam)
    assert 1.0 <= b <= 4.0
    assert np.sum(1 / (b + 2 * lam)) == pytest.approx(1.0, abs=1e-12)
    assert acg_parameter(np.zeros(3)) == 3.0


@pytest.mark.parametrize("kappa", [0.0, 2.0, 40.0])
def test_bingham_sampler_matches_exact_law_in_2d(kappa: float) -> None:
    """d = 2: the angle of v has density ~ exp(-kappa sin^2(theta)) on [0, pi) (antipodes folded).

    KS test against the CDF from numerical quadrature; alpha = 0.001, seed 2.
    """
    B = np.diag([0.0, kappa])
    v = sample_bingham(B, np.random.default_rng(2), 4000)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-12)
    theta = np.mod(np.arctan2(v[:, 1], v[:, 0]), np.pi)

    def dens(t: float) -> float:
        return math.exp(-kappa * math.sin(t) ** 2)

    z = integrate.quad(dens, 0, np.pi)[0]

    def cdf(x: np.ndarray) -> np.ndarray:
        return np.array([integrate.quad(dens, 0, t)[0] / z for t in np.atleast_1d(x)])

    assert stats.kstest(theta, cdf).pvalue > ALPHA


def test_bingham_sampler_second_moment_in_3d() -> None:
    """d = 3, rotated B: E[v v^T] against the exact moments by quadrature (seed 3)."""
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    lam = np.array([0.0, 1.5, 6.0])
    B = Q @ np.diag(lam) @ Q.T
    v = sample_bingham(B, np.random.default_rng(3), 20000)
    w = v @ Q  # coordinates in B's eigenbasis

    def moment(i: int) -> float:
        def f(phi: float, th: float) -> float:
            x = np.array([np.sin(th) * np.cos(phi), np.sin(th) * np.sin(phi), np.cos(th)])
            return float(np.exp(-lam @ x**2) * x[i] ** 2 * np.sin(th))

        def g(phi: float, th: float) -> float:
            x = np.array([np.sin(th) * np.cos(phi), np.sin(th) * np.sin(phi), np.cos(th)])
            return float(np.exp(-lam @ x**2) * np.sin(th))

        num = integrate.dblquad(f, 0, np.pi, 0, 2 * np.pi)[0]
        return num / integrate.dblquad(g, 0, np.pi, 0, 2 * np.pi)[0]

    for i in range(3):
        exact = moment(i)
        se = math.sqrt(exact * (1 - exact) / 20000)  # x_i^2 in [0, 1]: variance <= m(1-m)
        assert abs(np.mean(w[:, i] ** 2) - exact) < 4 * se + 1e-3


def test_ppca_calibration_is_chaudhuri_et_al() -> None:
    """B = (eps/2)(lambda_max I - G / R^2): density exp((eps/2) v^T G v / R^2) up to a constant."""
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, size=(4, 200))
    mech = ppca(epsilon=0.7, record_norm=2.0)
    G = X @ X.T
    B = mech.bingham_matrix(G)
    v = rng.standard_normal((5, 4))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    log_f = 0.35 * np.einsum("ti,ij,tj->t", v, G, v) / 4.0
    log_bing = -np.einsum("ti,ij,tj->t", v, B, v)
    np.testing.assert_allclose(log_f - log_bing, (log_f - log_bing)[0], atol=1e-9)
    assert mech.delta == 0.0


def test_ppca_score_sensitivity_is_one_by_brute_force() -> None:
    """Replacing one record in [-1, 1]^4 changes v^T G v / max||x||^2 by at most 1 (seed 5)."""
    rng = np.random.default_rng(5)
    worst = 0.0
    for _ in range(2000):
        x, y = rng.choice([-1.0, 1.0], size=4), rng.uniform(-1, 1, 4)
        v = rng.standard_normal(4)
        v /= np.linalg.norm(v)
        worst = max(worst, abs((v @ x) ** 2 - (v @ y) ** 2) / 4.0)
    assert worst <= 1.0


# -- BLR's exponential mechanism ------------------------------------------------------------------


def _blr_small(eps: float = 1.0) -> tuple[BLRMechanism, np.ndarray]:
    rng = np.random.default_rng(6)
    records = rng.uniform(0, 2, size=(40, 2))
    cands = blr_candidates(np.random.default_rng(7), count=5, size=6, features=2, grid=5)
    mech = blr_mechanism(
        epsilon=eps, records=40, lower=np.zeros(2), upper=np.full(2, 2.0), candidates=cands, grid=5
    )
    return mech, records


def test_blr_probabilities_are_the_exponential_mechanism() -> None:
    mech, records = _blr_small()
    z = records / 2.0
    truth = np.concatenate(
        [z.mean(0), [np.mean(z[:, 0] ** 2), np.mean(z[:, 0] * z[:, 1]), np.mean(z[:, 1] ** 2)]]
    )
    err = []
    for c in mech.candidates:
        ans = np.concatenate(
            [c.mean(0), [np.mean(c[:, 0] ** 2), np.mean(c[:, 0] * c[:, 1]), np.mean(c[:, 1] ** 2)]]
        )
        err.append(np.max(np.abs(ans - truth)))
    w = np.exp(-0.5 * 1.0 * 40 * np.array(err))
    np.testing.assert_allclose(mech.probabilities(records), w / w.sum(), rtol=1e-10)


def test_blr_sampler_matches_its_law() -> None:
    """Chi-square goodness of fit of 20,000 Gumbel-max draws; alpha = 0.001, seed 8."""
    mech, records = _blr_small(eps=0.5)
    p = mech.probabilities(records)
    idx = mech.sample(records, np.random.default_rng(8), 20000)
    counts = np.bincount(idx, minlength=p.size)
    keep = p * 20000 >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(p[keep], p[~keep].sum()) * 20000
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert stats.chisquare(obs, exp).pvalue > ALPHA


def test_blr_score_sensitivity_by_brute_force() -> None:
    """Replacing one record changes every candidate's max query error by at most 1/N (seed 9)."""
    mech, records = _blr_small()
    rng = np.random.default_rng(9)
    base = mech.errors(records)
    for _ in range(300):
        other = records.copy()
        other[rng.integers(40)] = rng.choice([0.0, 2.0], size=2)
        diff = np.abs(mech.errors(other) - base)
        assert diff.max() <= 1 / 40 + 1e-12


def test_blr_candidates_are_on_the_grid_and_data_independent() -> None:
    a = blr_candidates(np.random.default_rng(1), count=3, size=4, features=2, grid=11)
    b = blr_candidates(np.random.default_rng(1), count=3, size=4, features=2, grid=11)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a * 10, np.round(a * 10), atol=1e-12)
    assert moment_answers(a).shape == (3, 2 + 3)
