"""Calibrations against independent computations: high-precision textbook formulas, scipy's
chi-square law, dp-accounting's analytic Gaussian, and the paper's worked setups."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal, getcontext

import dp_accounting
import numpy as np
import pytest
from scipy import special, stats

from mvg_dask.privacy import calibration as cal

getcontext().prec = 60


# -- independent oracles (Decimal arithmetic, textbook forms) ------------------------------------
def d_harmonic(r: int, order: Decimal = Decimal(1)) -> Decimal:
    return sum((Decimal(1) / Decimal(i) ** order for i in range(1, r + 1)), Decimal(0))


def d_zeta(delta: float, m: int, n: int) -> Decimal:
    mn = Decimal(m) * Decimal(n)
    ln_d = Decimal(delta).ln()
    return (mn + 2 * (-mn * ln_d).sqrt() - 2 * ln_d).sqrt()


def d_root(a: Decimal, b: Decimal, eps: float) -> Decimal:
    e = Decimal(eps)
    return (-b + (b * b + 8 * a * e).sqrt()) ** 2 / (4 * a * a)


def oracle_mvg_thm2(m, n, eps, delta, s2, gamma, algorithm) -> Decimal:
    r = min(m, n)
    h, h2 = d_harmonic(r), d_harmonic(r, Decimal("0.5"))
    s, g = Decimal(s2), Decimal(gamma)
    alpha = (h + h2) * g * g + 2 * h * g * s
    beta = 2 * (Decimal(m) * Decimal(n)).sqrt().sqrt() * d_zeta(delta, m, n) * h * s
    bound = d_root(alpha, beta, eps)
    return bound * bound / n if algorithm == "unimodal" else bound


def oracle_mvg_thm3(m, eps, delta, s2, gamma) -> Decimal:
    h = d_harmonic(m)
    s, g = Decimal(s2), Decimal(gamma)
    omega = 4 * h * g * s
    beta = 2 * Decimal(m).sqrt() * d_zeta(delta, m, m) * h * s
    return d_root(omega, beta, eps)


def oracle_mgm(m, n, eps, delta, s2) -> Decimal:
    s = Decimal(s2)
    return d_root(s * s, 2 * d_zeta(delta, m, n) * s, eps)


def oracle_mgm_idn(m, n, eps, delta, a, b) -> Decimal:
    z = d_zeta(delta, m, n)
    s_hat = Decimal(b - a) * (Decimal(m) * Decimal(n)).sqrt()
    return Decimal(m) / (s_hat * s_hat) * (-z + (z * z + 2 * Decimal(eps)).sqrt()) ** 2


GRID = list(
    itertools.product(
        [(2, 3), (6, 248), (4, 4), (21, 2126), (50, 50)],
        [0.1, 1.0, 3.0],
        [1e-2, 1e-6],
        [0.01, 2.449],
        [1.0, 38.6],
    )
)


def rel(a: float, b: Decimal) -> float:
    return abs(Decimal(a) - b) / abs(b)


@pytest.mark.parametrize(("shape", "eps", "delta", "s2", "gamma"), GRID)
def test_paper_calibrations_match_decimal_oracle(shape, eps, delta, s2, gamma):
    m, n = shape
    for algorithm in ("unimodal", "equi-modal") if m == n else ("unimodal",):
        got = cal.mvg_thm2_budget(
            m=m, n=n, epsilon=eps, delta=delta, sensitivity=s2, gamma=gamma, algorithm=algorithm
        ).budget
        assert rel(got, oracle_mvg_thm2(m, n, eps, delta, s2, gamma, algorithm)) < 1e-9
        got = cal.mgm_budget(
            m=m, n=n, epsilon=eps, delta=delta, sensitivity=s2, algorithm=algorithm
        ).budget
        want = oracle_mgm(m, n, eps, delta, s2)
        want = want / n if algorithm == "unimodal" else want.sqrt()
        assert rel(got, want) < 1e-9
    if m == n:
        got = cal.mvg_thm3_budget(m=m, epsilon=eps, delta=delta, sensitivity=s2, gamma=gamma)
        assert rel(got.budget, oracle_mvg_thm3(m, eps, delta, s2, gamma)) < 1e-9
    got = cal.mgm_udn_budget(m=m, n=n, epsilon=eps, delta=delta, sensitivity=s2).budget
    assert rel(got, oracle_mgm(m, n, eps, delta, s2)) < 1e-9
    got = cal.mgm_idn_budget(m=m, n=n, epsilon=eps, delta=delta, entry_range=(0.0, gamma)).budget
    assert rel(got, oracle_mgm_idn(m, n, eps, delta, 0.0, gamma)) < 1e-9


def test_harmonic_numbers_against_closed_forms():
    for r in (1, 2, 7, 1000, 123_457):
        # H_r = digamma(r + 1) + Euler gamma
        assert cal.harmonic_number(r) == pytest.approx(
            float(special.digamma(r + 1) + np.euler_gamma), rel=1e-13
        )
    for r in (1, 5, 200):
        assert cal.harmonic_number(r, 0.5) == pytest.approx(
            float(d_harmonic(r, Decimal("0.5"))), rel=1e-13
        )
    # Euler-Maclaurin for H_{r,1/2}: 2 sqrt(r) + zeta(1/2) + 1/(2 sqrt r) - 1/(24 r^1.5)
    r = 3_000_000
    asym = 2 * math.sqrt(r) - 1.4603545088095868 + 0.5 / math.sqrt(r) - 1 / (24 * r**1.5)
    assert cal.harmonic_number(r, 0.5) == pytest.approx(asym, rel=1e-12)
    with pytest.raises(ValueError, match="positive integer"):
        cal.harmonic_number(0)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (6, 248), (21, 2126), (100, 100)])
@pytest.mark.parametrize("delta", [0.3, 1e-3, 1e-9])
def test_zeta_is_a_valid_chi_square_tail_bound(m, n, delta):
    z = cal.zeta(delta, m, n)
    # ||N||_F^2 ~ chi2(mn): P[||N||_F > zeta] must not exceed delta (Laurent-Massart)
    assert stats.chi2.sf(z**2, m * n) <= delta
    assert z == pytest.approx(float(d_zeta(delta, m, n)), rel=1e-13)


def test_quadratic_root_solves_the_theorems_quadratic():
    rng = np.random.default_rng(7)
    for _ in range(200):
        a, b, eps = 10 ** rng.uniform(-6, 6), 10 ** rng.uniform(-6, 6), 10 ** rng.uniform(-2, 1)
        phi = math.sqrt(cal.quadratic_root_bound(a, b, eps))
        # a phi^2 + b phi = 2 eps
        assert a * phi**2 + b * phi == pytest.approx(2 * eps, rel=1e-10)


def test_paper_worked_setup_exp1_identity_liver():
    """MVG paper Exp. I: identity 6x248 in [0,1], eps=1, delta=1/248, Alg. 1, uniform."""
    b = cal.mvg_thm2_budget(
        m=6,
        n=248,
        epsilon=1.0,
        delta=1 / 248,
        sensitivity=math.sqrt(6),
        gamma=math.sqrt(6 * 248),
        algorithm="unimodal",
    )
    var = b.variances(np.full(6, 1 / 6))
    assert np.allclose(var, 9.04e7, rtol=5e-3)
    assert math.sqrt(var[0]) == pytest.approx(9.5e3, rel=1e-2)
    # the analytic Gaussian iid baseline with Delta = sqrt(6): std ~ 5.3
    assert math.sqrt(6) / cal.analytic_gaussian_mu(1.0, 1 / 248) == pytest.approx(5.3, rel=1e-2)


def test_paper_worked_setup_exp2_covariance_movement():
    """Exp. II: covariance 4x4 in [-1,1], N=10176, s2=8/N, gamma=4, Alg. 2, uniform."""
    N = 10_176
    kw = dict(m=4, epsilon=1.0, delta=1 / N, sensitivity=8 / N, gamma=4.0)
    thm2 = cal.mvg_thm2_budget(n=4, algorithm="equi-modal", **kw)
    thm3 = cal.mvg_thm3_budget(**kw)
    theta = np.full(4, 0.25)
    # an entry's variance with Alg. 2 is sigma_i(Sigma) sigma_j(Sigma)
    assert math.sqrt(thm2.variances(theta)[0] ** 2) == pytest.approx(12.5, rel=1e-2)
    assert math.sqrt(thm3.variances(theta)[0] ** 2) == pytest.approx(0.26, rel=2e-2)
    assert (8 / N) / cal.analytic_gaussian_mu(1.0, 1 / N) == pytest.approx(2.5e-3, rel=2e-2)


@pytest.mark.parametrize("eps", [0.05, 0.3, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [0.1, 1e-3, 1 / 248, 1e-6, 1e-10])
def test_analytic_gaussian_is_valid_tight_and_matches_dp_accounting(eps, delta):
    mu = cal.analytic_gaussian_mu(eps, delta)
    assert cal.analytic_gaussian_delta(eps, mu) <= delta
    assert cal.analytic_gaussian_delta(eps, mu * (1 + 1e-6)) > delta
    assert cal.analytic_gaussian_delta(eps, mu) >= delta * (1 - 1e-6)
    # dp-accounting's independent implementation (sigma for unit sensitivity)
    assert 1.0 / dp_accounting.get_sigma_gaussian(eps, delta, tol=1e-14) == pytest.approx(
        mu, rel=1e-8
    )
    # and epsilon back from mu
    assert cal.analytic_gaussian_epsilon(mu, delta) == pytest.approx(eps, rel=1e-8)


def test_analytic_gaussian_delta_matches_privacy_loss_integral():
    # delta(eps) = E[(1 - e^{eps - L})^+] with L ~ N(mu^2/2, mu^2): numeric integration
    from scipy import integrate

    for mu, eps in [(0.5, 0.2), (1.0, 1.0), (3.0, 2.0)]:
        law = stats.norm(mu**2 / 2, mu)
        val, _ = integrate.quad(
            lambda x, e=eps, d=law: (1 - math.exp(e - x)) * d.pdf(x), eps, np.inf
        )
        assert cal.analytic_gaussian_delta(eps, mu) == pytest.approx(val, rel=1e-7)


def test_invalid_privacy_parameters_are_rejected_with_the_field_name():
    kw = dict(m=2, n=3, sensitivity=1.0, gamma=1.0, algorithm="unimodal")
    with pytest.raises(ValueError, match="epsilon"):
        cal.mvg_thm2_budget(epsilon=0.0, delta=0.1, **kw)
    with pytest.raises(ValueError, match="delta"):
        cal.mvg_thm2_budget(epsilon=1.0, delta=1.0, **kw)
    with pytest.raises(ValueError, match="sensitivity"):
        cal.mgm_udn_budget(m=2, n=3, epsilon=1.0, delta=0.1, sensitivity=-1.0)
    with pytest.raises(ValueError, match="square"):
        cal.mvg_thm2_budget(epsilon=1.0, delta=0.1, **{**kw, "algorithm": "equi-modal"})
    with pytest.raises(ValueError, match="entry_range"):
        cal.mgm_idn_budget(m=2, n=3, epsilon=1.0, delta=0.1, entry_range=(1.0, 1.0))


@pytest.mark.parametrize("epsilon", [1e50, 1e160, 1e300])
def test_an_absurd_epsilon_is_a_clean_refusal_not_a_hang(epsilon: float) -> None:
    """For an epsilon so large that ``Phi(mu / 2 - epsilon / mu)`` underflows, delta is 0 (not
    NaN), so the search finds no finite ``mu`` below 1e12 and says why; before, a NaN delta
    sent the bisection into subnormal brackets it never left (epsilon = 1e300) or planned an
    infinite noise variance. Below that, the calibration still holds: at 1e20 ``mu`` is finite
    and meets delta."""
    with pytest.raises(ValueError, match="no noise can be calibrated"):
        cal.analytic_gaussian_mu(epsilon, 1e-6)
    mu = cal.analytic_gaussian_mu(1e20, 1e-6)
    assert math.isfinite(mu) and cal.analytic_gaussian_delta(1e20, mu) <= 1e-6


def test_log_ndtr_is_scipys_own_ufunc_without_importing_scipy_special():
    """The analytic Gaussian loads scipy's ``log_ndtr`` without the ``scipy.special`` package
    (0.3 s of imports): the same values bit for bit, and ``scipy.special`` still imports and
    works afterwards."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from mvg_dask.privacy import calibration as cal\n"
        "mu = cal.analytic_gaussian_mu(1.0, 1e-6)\n"
        "assert 'scipy.special' not in sys.modules, 'scipy.special imported'\n"
        "xs = np.concatenate([np.linspace(-60, 12, 20001), -np.logspace(-3, 8, 2001)])\n"
        "ours = np.array([cal._log_ndtr()(float(x)) for x in xs])\n"
        "import scipy.special, scipy.stats\n"
        "assert cal._log_ndtr() is scipy.special.log_ndtr\n"
        "assert np.array_equal(ours, scipy.special.log_ndtr(xs))\n"
        "assert scipy.stats.norm.logcdf(-3.0) == scipy.special.log_ndtr(-3.0)\n"
        "print(repr(mu))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip()) == cal.analytic_gaussian_mu(1.0, 1e-6)
