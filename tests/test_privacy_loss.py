"""Monte Carlo audit of the ``exact`` calibration on worst-case neighbouring pairs.

The privacy loss ``L = log p(Y | X) - log p(Y | X')`` of ``Y = f(X) + Z`` is computed from the
matrix-variate Gaussian density (trace form, MVG Def. 2) — not from the whitening argument the
calibration relies on — and compared with the law the formula assumes, ``N(mu^2/2, mu^2)`` with
``mu = Delta_M``. ALPHA and seeds are stated; the tests are deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mvg_dask.noise import NoiseKey
from mvg_dask.plan import Allocation, BoxDomain, Directions, build_noise_plan
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery
from mvg_dask.privacy import calibration as cal

ALPHA = 1e-3
TRIALS = 100_000


def log_density_ratio(Y, M1, M2, Sigma_inv, Psi_inv):
    """log MVG(Y; M1) - log MVG(Y; M2), from the density's trace form (per trial)."""

    def quad(M):
        D = Y - M
        if Psi_inv is None:
            return np.einsum("tij,ik,tkj->t", D, Sigma_inv, D)
        return np.einsum("tji,jk,tkl,li->t", D, Sigma_inv, D, Psi_inv)

    return -0.5 * quad(M1) + 0.5 * quad(M2)


def _audit(plan, M1, M2, key):
    m, n = M1.shape
    B = plan.row_factor
    N = key.tile_normals(0, (TRIALS, m, n))
    Z = B @ N if plan.algorithm == "unimodal" else B @ N @ B.T
    Y = M1 + Z
    Sinv = plan.row_precision
    L = log_density_ratio(Y, M1, M2, Sinv, None if plan.algorithm == "unimodal" else Sinv)
    return L


def test_identity_unimodal_worst_case_pair():
    m, n = 4, 3
    domain = BoxDomain.create([0, -1, 0, 2], [1, 1, 3, 2.5], m)
    plan = build_noise_plan(
        IdentityQuery(m, n),
        domain,
        epsilon=1.0,
        delta=1e-3,
        allocation=Allocation(strategy="binary", important=[0, 2], share=0.7),
    )
    rng = np.random.default_rng(0)
    X = rng.uniform(domain.lower[:, None], domain.upper[:, None], (m, n))
    X2 = X.copy()
    X[:, 1], X2[:, 1] = domain.lower, domain.upper  # the worst case with the standard basis
    mu = plan.mahalanobis_sensitivity
    L = _audit(plan, X, X2, NoiseKey.from_seed(1))
    # the privacy-loss distribution is the one the formula assumes
    assert stats.kstest(L, stats.norm(mu**2 / 2, mu).cdf).pvalue > ALPHA
    _check_delta(L, plan.epsilon, plan.delta)


@pytest.mark.parametrize("neighbours", ["replace-one", "add-remove"])
def test_covariance_equimodal_near_worst_case_pair(neighbours):
    m, N = 3, 40
    domain = BoxDomain.create(-1, 1, m)
    W = np.linalg.qr(np.random.default_rng(2).standard_normal((m, m)))[0]
    plan = build_noise_plan(
        CovarianceQuery(m, N),
        domain,
        epsilon=2.0,
        delta=1e-3,
        algorithm="equi-modal",
        directions=Directions.from_matrix(W),
        neighbours=neighbours,
    )
    # choose the pair that maximises the whitened difference among box vertices
    Ainv = np.linalg.inv(plan.row_factor)
    verts = np.array(np.meshgrid(*[[-1, 1]] * m)).reshape(m, -1).T
    best, pair = -1.0, None
    candidates = [np.zeros(m)] if neighbours == "add-remove" else list(verts)
    for x in verts:
        for y in candidates:
            D = Ainv @ (np.outer(x, x) - np.outer(y, y)) @ Ainv.T / N
            if np.linalg.norm(D) > best:
                best, pair = float(np.linalg.norm(D)), (x, y)
    assert best <= plan.mahalanobis_sensitivity * (1 + 1e-12)
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (m, N))
    X[:, 0] = pair[0]
    X2 = X.copy()
    X2[:, 0] = pair[1]
    L = _audit(plan, X @ X.T / N, X2 @ X2.T / N, NoiseKey.from_seed(4))
    assert stats.kstest(L, stats.norm(best**2 / 2, best).cdf).pvalue > ALPHA
    _check_delta(L, plan.epsilon, plan.delta)


def _empirical_delta(L, eps):
    """Monte Carlo delta(eps) = E[(1 - e^{eps - L})^+] and its standard error."""
    terms = np.clip(1 - np.exp(eps - L), 0, None)
    return terms.mean(), terms.std(ddof=1) / math.sqrt(terms.size)


def _check_delta(L, eps, delta):
    """Privacy audit: the empirical privacy loss never exceeds the claimed epsilon at delta.

    One-sided test at level ALPHA: the lower confidence bound of the empirical delta at the
    claimed epsilon must not exceed the claimed delta (if the release leaked more, it would).
    The empirical epsilon at the claimed delta (bisection on the point estimate) is reported in
    the failure message and must not exceed the claim by more than the MC resolution.
    """
    est, se = _empirical_delta(L, eps)
    z = stats.norm.isf(ALPHA)
    lo, hi = 0.0, 4 * eps + 10
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _empirical_delta(L, mid)[0] > delta else (lo, mid)
    eps_hat = hi
    assert est - z * se <= delta, f"empirical delta {est:.3g} at epsilon {eps}: eps_hat {eps_hat}"
    assert eps_hat <= eps * 1.05 + 0.01, f"empirical epsilon {eps_hat:.4f} > claimed {eps}"
    return eps_hat


def test_paper_calibration_audit_shows_huge_slack():
    """The paper's mvg-thm2 noise gives a real epsilon far below the claim (implied_epsilon)."""
    plan = build_noise_plan(
        IdentityQuery(6, 248, sensitivity=math.sqrt(6), gamma=math.sqrt(6 * 248)),
        BoxDomain.create(0, 1, 6),
        epsilon=1.0,
        delta=1 / 248,
        calibration="mvg-thm2",
    )
    assert plan.mahalanobis_sensitivity < 1e-3
    assert cal.analytic_gaussian_delta(1.0, plan.mahalanobis_sensitivity) == 0.0
