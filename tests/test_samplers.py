"""Statistical tests of the keyed generator and the MVG samplers.

Every test states its significance level ALPHA and uses a fixed seed, so it is deterministic;
with a correct sampler each would fail with probability about ALPHA on a fresh seed.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mvg_dask.noise import NoiseKey, affine_sample, kronecker_sample, sqrt_factor
from mvg_dask.plan import Allocation, BoxDomain, Directions, build_noise_plan
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery

ALPHA = 1e-3


def _random_plan(m: int, algorithm: str, seed: int):
    rng = np.random.default_rng(seed)
    W = np.linalg.qr(rng.standard_normal((m, m)))[0]
    query = CovarianceQuery(m, 100) if algorithm == "equi-modal" else IdentityQuery(m, 50)
    return build_noise_plan(
        query,
        BoxDomain.create(-1, 1, m),
        epsilon=1.0,
        delta=1e-5,
        algorithm=algorithm,
        directions=Directions.from_matrix(W),
        allocation=Allocation(strategy="custom", theta=rng.dirichlet(np.ones(m))),
    )


def test_key_streams_are_reproducible_and_distinct():
    key = NoiseKey.from_seed(42)
    a = key.tile_normals(3, (4, 5))
    assert np.array_equal(a, NoiseKey.from_seed(42).tile_normals(3, (4, 5)))
    assert not np.array_equal(a, key.tile_normals(4, (4, 5)))
    assert not np.array_equal(a, key.derive("dp-pca").tile_normals(3, (4, 5)))
    assert not np.array_equal(a, NoiseKey.from_seed(43).tile_normals(3, (4, 5)))
    # a prefix of a tile does not depend on how much of it is drawn
    assert np.array_equal(key.tile_normals(7, (10,))[:4], key.tile_normals(7, (4,)))


def test_key_never_shows_in_repr_or_str():
    key = NoiseKey.fresh()
    secret = key.to_hex()
    assert secret not in repr(key) and secret not in str(key)
    assert str(int(secret, 16)) not in repr(key)
    assert key.seeded is False and NoiseKey.from_seed(1).seeded is True


def test_keyed_normals_are_standard_normal():
    z = NoiseKey.from_seed(2024).tile_normals(0, (200_000,))
    assert stats.kstest(z, "norm").pvalue > ALPHA
    # lag-1 independence: correlation within its 1 - ALPHA band
    r = np.corrcoef(z[:-1], z[1:])[0, 1]
    assert abs(r) < stats.norm.isf(ALPHA / 2) / np.sqrt(z.size)


@pytest.mark.parametrize("algorithm", ["unimodal", "equi-modal"])
def test_whitened_noise_is_iid_standard_normal(algorithm):
    m = 5
    plan = _random_plan(m, algorithm, seed=1)
    B = plan.row_factor
    n = 4000 if algorithm == "unimodal" else m
    reps = 1 if algorithm == "unimodal" else 800
    key = NoiseKey.from_seed(77)
    Ainv = np.linalg.inv(B)
    whitened = []
    for t in range(reps):
        N = key.tile_normals(t, (m, n))
        Z = affine_sample(N, B, B if algorithm == "equi-modal" else None)
        Wz = Ainv @ Z
        if algorithm == "equi-modal":
            Wz = Wz @ Ainv.T
        whitened.append(Wz.ravel())
    w = np.concatenate(whitened)
    assert stats.kstest(w, "norm").pvalue > ALPHA
    # whitening any factor with B B^T = Sigma: use Cholesky, a different square root
    L = np.linalg.cholesky(plan.row_cov)
    N = key.tile_normals(999, (m, 4000))
    Y = np.linalg.solve(L, affine_sample(N, B))
    # entries iid N(0,1): the sample covariance of rows is I within a chi-square band
    C = np.cov(Y)
    assert np.max(np.abs(C - np.eye(m))) < 6 / np.sqrt(4000)


def test_empirical_row_and_column_covariances_match():
    m = 4
    plan = _random_plan(m, "equi-modal", seed=3)
    Sigma = plan.row_cov
    B = plan.row_factor
    key = NoiseKey.from_seed(5)
    reps = 20_000
    N = key.tile_normals(0, (reps, m, m))
    Z = B @ N @ B.T
    # E[Z Z^T] = tr(Psi) Sigma, E[Z^T Z] = tr(Sigma) Psi with Psi = Sigma
    row = np.mean(Z @ Z.transpose(0, 2, 1), axis=0) / np.trace(Sigma)
    col = np.mean(Z.transpose(0, 2, 1) @ Z, axis=0) / np.trace(Sigma)
    scale = np.sqrt(np.outer(np.diag(Sigma), np.diag(Sigma)))
    assert np.max(np.abs(row - Sigma) / scale) < 0.06
    assert np.max(np.abs(col - Sigma) / scale) < 0.06
    # unimodal: columns iid N(0, Sigma)
    plan1 = _random_plan(m, "unimodal", seed=4)
    Z1 = affine_sample(key.tile_normals(1, (m, 50_000)), plan1.row_factor)
    S1 = plan1.row_cov
    s1 = np.sqrt(np.outer(np.diag(S1), np.diag(S1)))
    assert np.max(np.abs(np.cov(Z1, bias=True) - S1) / s1) < 0.05


def test_affine_and_kronecker_samplers_agree_in_distribution():
    rng_seed = 9
    m, n = 2, 3
    rng = np.random.default_rng(rng_seed)
    Sigma = np.array([[2.0, 0.6], [0.6, 1.0]])
    A = rng.standard_normal((n, n))
    Psi = A @ A.T + np.eye(n)
    w, V = np.linalg.eigh(Sigma)
    wp, Vp = np.linalg.eigh(Psi)
    Bs, Bp = sqrt_factor(V, w), sqrt_factor(Vp, wp)
    reps = 20_000
    key = NoiseKey.from_seed(rng_seed)
    aff = np.stack([affine_sample(key.tile_normals(t, (m, n)), Bs, Bp) for t in range(reps)])
    kro = kronecker_sample(key.derive("oracle").generator(), Sigma, Psi, size=reps)
    # same covariance of vec(Z): Psi kron Sigma
    vec = lambda s: s.transpose(0, 2, 1).reshape(reps, m * n)  # noqa: E731
    K = np.kron(Psi, Sigma)
    sc = np.sqrt(np.outer(np.diag(K), np.diag(K)))
    for sample in (aff, kro):
        assert np.max(np.abs(np.cov(vec(sample), rowvar=False) - K) / sc) < 0.05
    # same law on random projections: two-sample KS, Bonferroni over 10 projections
    proj = np.random.default_rng(rng_seed + 1).standard_normal((10, m * n))
    for p in proj:
        assert stats.ks_2samp(vec(aff) @ p, vec(kro) @ p).pvalue > ALPHA / 10
