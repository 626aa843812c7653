"""Unbiased estimators from released values, checked by Monte Carlo through the release's own
noise sampler (``NoisePlan.draw``, the function of the key a release adds)."""

from __future__ import annotations

import numpy as np
import pytest

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan import AllocationSpec, BoxDomain, Directions, QuerySpec, build_noise_plan
from mvg_dask.plan.estimators import covariance_from_identity

M, N = 3, 40
TRIALS = 3000
SEED = 20261122


def _plan(directions: Directions):  # type: ignore[no-untyped-def]
    return build_noise_plan(
        QuerySpec.identity(M, N),
        BoxDomain.create(0.0, 1.0, M),
        epsilon=3.0,
        delta=1e-3,
        calibration="exact",
        directions=directions,
        allocation=AllocationSpec(strategy="binary", important=[0], share=0.7),
    )


@pytest.mark.parametrize(
    "directions",
    [
        Directions.standard(M, (0,)),
        # rotated directions: Sigma is not diagonal, so the correction needs its off-diagonal
        Directions.from_matrix(
            np.linalg.qr(np.random.default_rng(1).standard_normal((M, M)))[0], (0,)
        ),
    ],
    ids=["standard", "rotated"],
)
def test_covariance_from_identity_is_unbiased(directions: Directions) -> None:
    """Monte Carlo over TRIALS releases (seed SEED): every entry of the mean estimate is within
    4.5 standard errors of X X^T / N (two-sided alpha ~ 7e-6 per entry, 9 entries), while the
    plug-in Y Y^T / N is off by Sigma, which is many standard errors away on the diagonal."""
    plan = _plan(directions)
    X = np.random.default_rng(2).uniform(0, 1, (M, N))
    truth = X @ X.T / N
    key = NoiseKey.from_seed(SEED)
    est = np.empty((TRIALS, M, M))
    plug = np.empty((TRIALS, M, M))
    for t in range(TRIALS):
        Y = X + plan.draw(key.derive(f"trial/{t}"))
        est[t] = covariance_from_identity(Y, plan)
        plug[t] = Y @ Y.T / N
    se = est.std(axis=0, ddof=1) / np.sqrt(TRIALS)
    z = (est.mean(axis=0) - truth) / se
    assert np.all(np.abs(z) < 4.5), z
    z_plug = (plug.mean(axis=0) - truth) / (plug.std(axis=0, ddof=1) / np.sqrt(TRIALS))
    assert np.all(np.diag(z_plug) > 20), z_plug  # the bias the estimator removes
    # the correction is exactly Sigma: a second formula for the same estimate
    Y = X + plan.draw(key.derive("check"))
    assert np.allclose(covariance_from_identity(Y, plan), Y @ Y.T / N - plan.row_cov)


def test_covariance_from_identity_refuses_other_plans() -> None:
    plan = _plan(Directions.standard(M, (0,)))
    with pytest.raises(ValueError, match="its plan describes an"):
        covariance_from_identity(np.zeros((M + 1, N)), plan)
    cov = build_noise_plan(
        QuerySpec.covariance(M, N),
        BoxDomain.create(0.0, 1.0, M),
        epsilon=1.0,
        delta=1e-3,
        algorithm="equi-modal",
    )
    with pytest.raises(ValueError, match="plan of an identity release"):
        covariance_from_identity(np.zeros((M, M)), cov)
