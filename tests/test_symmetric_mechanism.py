"""The symmetric mechanism f(X) + A S A^T (docs/bounds.md): sampler law, privacy loss, plan,
spec default, symmetrised equi-modal outputs and the unbiased covariance of an identity release.

Statistical tests state ALPHA and their seeds; they are deterministic.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from mvg_dask.engine.stages.covariance import covariance_noise
from mvg_dask.noise import NoiseKey
from mvg_dask.noise.tiles import matrix_noise, record_noise, symmetric_matrix_noise
from mvg_dask.plan import (
    Allocation,
    BoxDomain,
    Directions,
    L2BallDomain,
    build_noise_plan,
)
from mvg_dask.plan.directions import symmetric_noise
from mvg_dask.plan.estimators import covariance_from_identity
from mvg_dask.plan.noise_plan import noise_plan_from_dict
from mvg_dask.plan.queries import CovarianceQuery, CustomQuery, IdentityQuery
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.registry import CompatibilityError, check_compatible
from mvg_dask.spec import SpecError, parse_spec
from tests.strategies import allocations, boxes, deltas, epsilons, orthonormal
from tests.test_privacy_loss import _check_delta

ALPHA = 1e-3


def _rotated_plan(m: int = 4, seed: int = 1, ratio: float | None = None, **kw):
    rng = np.random.default_rng(seed)
    W = np.linalg.qr(rng.standard_normal((m, m)))[0]
    return build_noise_plan(
        CovarianceQuery(m, 50),
        kw.pop("domain", BoxDomain.create(-1, 1, m)),
        epsilon=1.0,
        delta=1e-5,
        algorithm="symmetric",
        directions=Directions.from_matrix(W),
        allocation=Allocation(strategy="custom", theta=rng.dirichlet(np.ones(m))),
        symmetric_ratio=ratio,
        **kw,
    )


def _vech_r(G: np.ndarray, r: float) -> np.ndarray:
    """(G_ii)_i then (G_ij / sqrt(r))_{i<j}, for a stack of symmetric matrices."""
    m = G.shape[-1]
    i, j = np.triu_indices(m, 1)
    return np.concatenate(
        [np.diagonal(G, axis1=-2, axis2=-1), G[..., i, j] / math.sqrt(r)], axis=-1
    )


# -- sampler ------------------------------------------------------------------------------------
def test_symmetric_sampler_law_and_whitened_vech_is_iid_standard_normal():
    m, r, reps = 4, 2.5, 3000
    plan = _rotated_plan(m, seed=2, ratio=r)
    B = plan.row_factor
    Binv = np.linalg.inv(B)
    key = NoiseKey.from_seed(21)
    Z = np.stack([symmetric_matrix_noise(key, B, r, tile=t) for t in range(reps)])
    assert np.array_equal(Z, np.swapaxes(Z, 1, 2))  # exactly symmetric
    S = Binv @ Z @ Binv.T
    # diagonal variance a^2 = 1, off-diagonal b^2 = r
    diag = np.diagonal(S, axis1=1, axis2=2).ravel()
    off = S[:, *np.triu_indices(m, 1)].ravel()
    assert stats.kstest(diag, "norm").pvalue > ALPHA
    assert stats.kstest(off / math.sqrt(r), "norm").pvalue > ALPHA
    v = _vech_r(S, r)  # reps x m(m+1)/2, should be iid N(0, 1)
    assert stats.kstest(v.ravel(), "norm").pvalue > ALPHA
    corr = np.corrcoef(v.T)
    k = v.shape[1]
    band = stats.norm.isf(ALPHA / (k * (k - 1))) / math.sqrt(reps)  # Bonferroni over pairs
    assert np.max(np.abs(corr - np.eye(k))) < band
    # entry variances of Z match the plan's formula (chi-square band, Bonferroni over entries)
    var = Z.var(axis=0, ddof=1)
    lo = stats.chi2.ppf(ALPHA / (2 * m * m), reps - 1) / (reps - 1)
    hi = stats.chi2.isf(ALPHA / (2 * m * m), reps - 1) / (reps - 1)
    ratio = var / plan.entry_std() ** 2
    assert np.all((ratio > lo) & (ratio < hi)), ratio


def test_symmetric_sampler_bytes_are_deterministic_and_dp_pca_noise_is_its_r1_case():
    key = NoiseKey.from_seed(5).derive("release")
    B = np.diag([1.0, 2.0, 3.0])
    a = symmetric_matrix_noise(key, B, 2.0)
    assert (
        a.tobytes()
        == symmetric_matrix_noise(NoiseKey.from_seed(5).derive("release"), B, 2.0).tobytes()
    )
    assert not np.array_equal(a, symmetric_matrix_noise(key, B, 2.0, tile=1))
    # the upper triangle is one draw of tile 0, row-major
    z = key.tile_normals(0, (6,))
    iu = np.triu_indices(3)
    S = np.linalg.inv(B) @ a @ np.linalg.inv(B)
    scale = np.where(iu[0] == iu[1], 1.0, math.sqrt(2.0))
    assert np.allclose(S[iu], z * scale, rtol=1e-12)
    # Analyze Gauss noise (DP-PCA) keeps its bytes: iid upper triangle, mirrored
    E = symmetric_noise(key, 3, 0.5)
    ref = np.zeros((3, 3))
    ref[iu] = z * 0.5
    ref = ref + np.triu(ref, 1).T
    assert E.tobytes() == ref.tobytes()


# -- privacy loss ----------------------------------------------------------------------------
def _vech_density_log_ratio(Y, M1, M2, B, r):
    """log p(vech Y | M1) - log p(vech Y | M2) from the covariance of vech(B S B^T), built by
    mapping the independent entries of S (not from the whitening argument)."""
    m = B.shape[0]
    iu = np.triu_indices(m)
    k = iu[0].size
    L = np.zeros((k, k))  # vech(B E B^T) for each unit entry E of S's upper triangle
    for c, (i, j) in enumerate(zip(*iu, strict=True)):
        E = np.zeros((m, m))
        E[i, j] = E[j, i] = 1.0
        L[:, c] = (B @ E @ B.T)[iu]
    var = np.where(iu[0] == iu[1], 1.0, r)
    C = (L * var) @ L.T
    Cinv = np.linalg.inv(C)
    y = Y[:, *iu]

    def quad(M):
        d = y - M[iu]
        return np.einsum("ti,ij,tj->t", d, Cinv, d)

    dist = math.sqrt(float((M1[iu] - M2[iu]) @ Cinv @ (M1[iu] - M2[iu])))
    return -0.5 * quad(M1) + 0.5 * quad(M2), dist


@pytest.mark.parametrize(("rotated", "r"), [(False, None), (True, 1.0), (False, 0.5)])
def test_symmetric_privacy_loss_on_worst_case_pair(rotated, r):
    """L ~ N(Delta^2/2, Delta^2) on the pair, and the empirical epsilon at delta <= the claim.

    Standard directions on [-1,1]^4 with uniform precisions: the bound is attained (x = 1,
    x' = (1,-1,1,-1)), so the audit runs at the worst case itself."""
    m, N, trials = 4, 30, 100_000
    domain = BoxDomain.create(-1, 1, m)
    W = np.linalg.qr(np.random.default_rng(4).standard_normal((m, m)))[0] if rotated else np.eye(m)
    plan = build_noise_plan(
        CovarianceQuery(m, N),
        domain,
        epsilon=1.0,
        delta=1e-3,
        algorithm="symmetric",
        directions=Directions.from_matrix(W),
        symmetric_ratio=r,
    )
    ratio = plan.symmetric_ratio
    X = np.random.default_rng(6).uniform(-1, 1, (m, N))
    X[:, 0] = 1.0
    X2 = X.copy()
    X2[:, 0] = [1.0, -1.0, 1.0, -1.0]
    M1, M2 = X @ X.T / N, X2 @ X2.T / N
    B = plan.row_factor
    key = NoiseKey.from_seed(8)
    iu = np.triu_indices(m)
    z = key.tile_normals(0, (trials, iu[0].size))
    S = np.zeros((trials, m, m))
    S[:, *iu] = z * np.where(iu[0] == iu[1], 1.0, math.sqrt(ratio))
    S = S + np.triu(S, 1).transpose(0, 2, 1)
    Y = M1 + B @ S @ B.T
    L, dist = _vech_density_log_ratio(Y, M1, M2, B, ratio)
    assert dist <= plan.mahalanobis_sensitivity * (1 + 1e-9)
    if not rotated:
        assert dist == pytest.approx(plan.mahalanobis_sensitivity, rel=1e-9)  # the worst case
    assert stats.kstest(L, stats.norm(dist**2 / 2, dist).cdf).pvalue > ALPHA
    _check_delta(L, plan.epsilon, plan.delta)


def test_symmetric_privacy_loss_through_the_release_sampler():
    """The same audit with the noise drawn by the engine's own function (covariance_noise, one
    key per trial, seeds 50_000 + t), at the attained worst case of [-1,1]^4."""
    m, N, trials = 4, 30, 40_000
    plan = build_noise_plan(
        CovarianceQuery(m, N),
        BoxDomain.create(-1, 1, m),
        epsilon=1.0,
        delta=1e-3,
        algorithm="symmetric",
    )
    X = np.random.default_rng(16).uniform(-1, 1, (m, N))
    X[:, 0] = 1.0
    X2 = X.copy()
    X2[:, 0] = [1.0, -1.0, 1.0, -1.0]
    M1, M2 = X @ X.T / N, X2 @ X2.T / N
    Y = M1 + np.stack(
        [covariance_noise(plan, NoiseKey.from_seed(50_000 + t)) for t in range(trials)]
    )
    L, dist = _vech_density_log_ratio(Y, M1, M2, plan.row_factor, plan.symmetric_ratio)
    assert dist == pytest.approx(plan.mahalanobis_sensitivity, rel=1e-9)
    assert stats.kstest(L, stats.norm(dist**2 / 2, dist).cdf).pvalue > ALPHA
    _check_delta(L, plan.epsilon, plan.delta)


# -- plan ----------------------------------------------------------------------------------------
def test_symmetric_plan_round_trip_theorem_check_and_ratio():
    plan = _rotated_plan(4, seed=3)
    lhs, rhs = plan.theorem_check()
    assert lhs <= rhs and lhs == pytest.approx(rhs, rel=1e-6)
    d = json.loads(plan.to_json())
    assert d["algorithm"] == "symmetric" and d["symmetric_ratio"] == plan.symmetric_ratio
    assert d["col_variances"] == d["row_variances"]
    again = noise_plan_from_dict(d)
    assert again.symmetric_ratio == plan.symmetric_ratio
    assert np.array_equal(again.row_variances, plan.row_variances)
    assert np.allclose(plan.col_cov, plan.row_cov)
    explicit = _rotated_plan(4, seed=3, ratio=1.7)
    assert noise_plan_from_dict(explicit.to_dict()).symmetric_ratio == 1.7
    with pytest.raises(ValueError, match=r">= 0\.5"):
        _rotated_plan(4, ratio=0.3)


@pytest.mark.parametrize(
    ("domain", "expected"),
    [
        (BoxDomain.create(-1, 1, 4), 2.5),  # (m + 1) / 2
        (BoxDomain.create(-1, 1, 6), 3.5),
        (BoxDomain.create(0, 1, 6), 1 / math.sqrt(2)),
        (L2BallDomain(2.0, 5), 0.5),
    ],
)
def test_default_ratio_is_the_closed_form_optimum(domain, expected):
    plan = build_noise_plan(
        CovarianceQuery(domain.m, 1000), domain, epsilon=1, delta=1e-5, algorithm="symmetric"
    )
    assert plan.symmetric_ratio == pytest.approx(expected)
    # and it is no worse than r = 1/2 (symmetrised equi-modal) or r = 1 (iid on vech)
    err = float(np.sum(plan.entry_std() ** 2))
    for r in (0.5, 1.0):
        other = build_noise_plan(
            CovarianceQuery(domain.m, 1000),
            domain,
            epsilon=1,
            delta=1e-5,
            algorithm="symmetric",
            symmetric_ratio=r,
        )
        assert err <= float(np.sum(other.entry_std() ** 2)) * (1 + 1e-9)


def test_exp2_numbers_symmetric_beats_equimodal_and_iid():
    N, m = 10_176, 4
    common = dict(epsilon=1.0, delta=1 / N)
    q, box = CovarianceQuery(m, N), BoxDomain.create(-1, 1, m)
    sym = build_noise_plan(q, box, algorithm="symmetric", **common)
    equi = build_noise_plan(q, box, algorithm="equi-modal", **common)
    mu = cal.analytic_gaussian_mu(1.0, 1 / N)
    iid_var = (math.sqrt(2) * m / N / mu) ** 2
    sym_mse = float(np.sum(sym.entry_std() ** 2))
    equi_mse = float(np.sum(equi.released_entry_std() ** 2))
    raw_mse = float(np.sum(np.broadcast_to(equi.entry_std(), (m, m)) ** 2))
    assert raw_mse == pytest.approx(m * m * iid_var, rel=1e-9)
    assert equi_mse == pytest.approx(raw_mse * (m + 1) / (2 * m), rel=1e-9)
    assert sym_mse < 0.7 * equi_mse and sym_mse < 0.45 * m * m * iid_var


def test_registry_and_spec_rules_for_symmetric_noise():
    check_compatible(
        "exact",
        "symmetric",
        query_kind="covariance",
        psd=True,
        square=True,
        standard_directions=False,
    )
    with pytest.raises(CompatibilityError, match="needs a symmetric query"):
        check_compatible(
            "exact",
            "symmetric",
            query_kind="identity",
            psd=False,
            square=False,
            standard_directions=True,
        )
    with pytest.raises(CompatibilityError, match="does not cover symmetric noise") as info:
        check_compatible(
            "mvg-thm2",
            "symmetric",
            query_kind="covariance",
            psd=True,
            square=True,
            standard_directions=True,
        )
    assert info.value.field == "algorithm"
    # a custom query declared symmetric may use it; a non-symmetric square one may not
    sym = CustomQuery(features=3, records=10, shape_=(3, 3), sensitivity=1.0, symmetric=True)
    plan = build_noise_plan(
        sym, BoxDomain.create(0, 1, 3), epsilon=1, delta=1e-5, algorithm="symmetric"
    )
    assert plan.mahalanobis_sensitivity <= plan.budgets.release_mu * (1 + 1e-12)
    with pytest.raises(ValueError, match="needs a symmetric query"):
        build_noise_plan(
            CustomQuery(features=3, records=10, shape_=(3, 3), sensitivity=1.0),
            BoxDomain.create(0, 1, 3),
            epsilon=1,
            delta=1e-5,
            algorithm="symmetric",
        )


def _spec(query, mechanism=None):
    data = {
        "name": "x",
        "input": {"store": "a.zarr"},
        "domain": {"box": {"lower": 0, "upper": 1}},
        "query": query,
        "privacy": {"epsilon": 1, "delta": 1e-5},
        "output": {"store": "o.zarr"},
    }
    if mechanism is not None:
        data["mechanism"] = mechanism
    return parse_spec(data)


def test_spec_default_algorithm_is_query_dependent():
    assert _spec("covariance").mechanism.algorithm == "symmetric"
    assert _spec("covariance", {"calibration": "exact"}).mechanism.algorithm == "symmetric"
    assert _spec("identity").mechanism.algorithm == "unimodal"
    assert _spec("covariance", {"calibration": "mvg-thm2"}).mechanism.algorithm == "unimodal"
    explicit = _spec("covariance", {"algorithm": "equi-modal"})
    assert explicit.mechanism.algorithm == "equi-modal"
    with pytest.raises(SpecError, match=r"mechanism\.algorithm"):
        _spec("identity", {"algorithm": "symmetric"})


# -- symmetrised equi-modal output ------------------------------------------------------------
def test_equimodal_covariance_noise_is_symmetrised_post_processing():
    m, reps = 3, 4000
    rng = np.random.default_rng(12)
    W = np.linalg.qr(rng.standard_normal((m, m)))[0]
    plan = build_noise_plan(
        CovarianceQuery(m, 40),
        BoxDomain.create(-1, 1, m),
        epsilon=1.0,
        delta=1e-5,
        algorithm="equi-modal",
        directions=Directions.from_matrix(W),
        allocation=Allocation(strategy="custom", theta=[0.6, 0.3, 0.1]),
    )
    assert plan.output_symmetric_ratio == 0.5
    key = NoiseKey.from_seed(13)
    Z = covariance_noise(plan, key)
    raw = matrix_noise(key, plan.row_factor, plan.row_factor)
    assert np.array_equal(Z, (raw + raw.T) / 2)
    draws = np.stack([covariance_noise(plan, NoiseKey.from_seed(100 + t)) for t in range(reps)])
    var = draws.var(axis=0, ddof=1)
    lo = stats.chi2.ppf(ALPHA / (2 * m * m), reps - 1) / (reps - 1)
    hi = stats.chi2.isf(ALPHA / (2 * m * m), reps - 1) / (reps - 1)
    ratio = var / plan.released_entry_std() ** 2
    assert np.all((ratio > lo) & (ratio < hi)), ratio
    # the expected squared error falls by 1/2 (1 + sum v^2 / (sum v)^2), (m+1)/(2m) if uniform
    v = plan.row_variances
    factor = float(np.sum(plan.released_entry_std() ** 2) / np.sum(plan.entry_std() ** 2))
    assert factor == pytest.approx(0.5 * (1 + np.sum(v**2) / np.sum(v) ** 2), rel=1e-9)
    uniform = build_noise_plan(
        CovarianceQuery(m, 40),
        BoxDomain.create(-1, 1, m),
        epsilon=1,
        delta=1e-5,
        algorithm="equi-modal",
    )
    factor = float(np.sum(uniform.released_entry_std() ** 2) / np.sum(uniform.entry_std() ** 2))
    assert factor == pytest.approx((m + 1) / (2 * m), rel=1e-9)


# -- unbiased covariance from an identity release --------------------------------------------
def test_covariance_from_identity_is_unbiased_monte_carlo():
    """Mean of the estimate over REPS releases vs X X^T / N: z-test per entry at ALPHA
    (Bonferroni), seed 31; the naive Y Y^T / N fails the same test (the test has power)."""
    m, N, reps = 3, 40, 4000
    rng = np.random.default_rng(31)
    X = rng.uniform(0, 1, (m, N))
    W = np.linalg.qr(rng.standard_normal((m, m)))[0]
    plan = build_noise_plan(
        IdentityQuery(m, N),
        BoxDomain.create(0, 1, m),
        epsilon=2.0,
        delta=1e-5,
        directions=Directions.from_matrix(W),
        allocation=Allocation(strategy="custom", theta=[0.5, 0.3, 0.2]),
    )
    est, naive = [], []
    for t in range(reps):
        Z = record_noise(
            NoiseKey.from_seed(1000 + t), plan.row_factor, 0, N, tile=N, n_total=N, diagonal=False
        )
        Y = X + Z
        est.append(covariance_from_identity(Y, plan))
        naive.append(Y @ Y.T / N)
    truth = X @ X.T / N
    z_crit = stats.norm.isf(ALPHA / (2 * m * m))

    def zscores(samples):
        s = np.stack(samples)
        return np.abs(s.mean(axis=0) - truth) / (s.std(axis=0, ddof=1) / math.sqrt(reps))

    assert np.all(zscores(est) < z_crit)
    assert np.any(zscores(naive) > z_crit)
    with pytest.raises(ValueError, match="identity release"):
        covariance_from_identity(np.zeros((m, m)), _rotated_plan(m))


# -- through the release engine ---------------------------------------------------------------
@pytest.mark.parametrize("noise", ["lattice", "float"])
@pytest.mark.parametrize("algorithm", [None, "equi-modal"])
def test_covariance_release_adds_the_planned_symmetric_noise(tmp_path, client, algorithm, noise):
    """A covariance release (default: symmetric noise; equi-modal: symmetrised) publishes
    f(X) + noise with exactly the plan's noise (float), or the engine's lattice release of
    f(X) (lattice), a symmetric output and its noise description; a neighbouring dataset (one
    record replaced) with the same seed changes only the noisy values."""
    from mvg_dask import api
    from mvg_dask.engine.lattice import square_release
    from tests.pipeline_helpers import data, make_input, spec_dict

    m, N, seed = 4, 1500, 3
    X = data(m, N, seed=7)
    X2 = X.copy()
    X2[:, 10] = [1.0, 0.0, 1.0, 0.0]
    outs = []
    for i, values in enumerate((X, X2)):
        store = make_input(tmp_path / f"in{i}.zarr", values, chunk=500)
        spec = spec_dict(store, str(tmp_path / f"out{i}.zarr"), query="covariance")
        spec["mechanism"]["noise"] = noise
        if algorithm is None:
            del spec["mechanism"]["algorithm"]
        else:
            spec["mechanism"]["algorithm"] = algorithm
        res = api.release(spec, client=client, seed=seed, progress=False)
        outs.append((res, api.open_release(res.output)))
    (res, ds), (_, ds2) = outs
    plan = res.plan
    assert plan.algorithm == (algorithm or "symmetric")
    cov = ds["covariance"].values
    assert np.array_equal(cov, cov.T)
    Xc = np.clip(X, 0, 1)
    key = NoiseKey.from_seed(seed).derive("release")
    if noise == "float":
        want = Xc @ Xc.T / N + covariance_noise(plan, key)
    else:
        want = square_release(Xc @ Xc.T / N, plan, key)
    assert np.allclose(cov, want, rtol=0, atol=1e-12)
    assert float(ds["symmetric_ratio"]) == plan.output_symmetric_ratio
    assert np.allclose(ds["col_cov"], ds["row_cov"])
    assert ds.attrs["mvg_dask_algorithm"] == plan.algorithm
    # neighbours: same seed, only the noisy values differ
    assert not np.array_equal(cov, ds2["covariance"].values)
    for name in ("row_cov", "col_cov", "directions", "noise_variances", "symmetric_ratio"):
        assert np.array_equal(ds[name].values, ds2[name].values)
    volatile = {"mvg_dask_created", "mvg_dask_release_id", "mvg_dask_input_store"}
    assert {k: v for k, v in ds.attrs.items() if k not in volatile} == {
        k: v for k, v in ds2.attrs.items() if k not in volatile
    }


def test_dp_pca_covariance_release_with_symmetric_noise(tmp_path, client):
    """DP-PCA directions (rotated) with the default symmetric noise: the ratio is chosen for the
    directions at run time, published as a data variable, null in the public plan attribute."""
    from mvg_dask import api
    from tests.pipeline_helpers import data, make_input, spec_dict

    X = data(5, 2000, seed=8, low=-1, high=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=500)
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        query="covariance",
        domain={"box": {"lower": -1.0, "upper": 1.0}},
        mechanism={"directions": {"method": "dp-pca", "k": 2}},
    )
    del spec["mechanism"]["algorithm"]
    res = api.release(spec, client=client, seed=4, progress=False)
    ds = api.open_release(res.output)
    plan = res.plan
    assert plan.algorithm == "symmetric" and plan.symmetric_ratio is not None
    assert float(ds["symmetric_ratio"]) == plan.symmetric_ratio
    assert json.loads(ds.attrs["mvg_dask_plan"])["symmetric_ratio"] is None
    cov = ds["covariance"].values
    assert np.array_equal(cov, cov.T)
    lhs, rhs = plan.theorem_check()
    assert lhs <= rhs


# -- properties ---------------------------------------------------------------------------------
@st.composite
def symmetric_inputs(draw: st.DrawFn):
    m = draw(st.integers(1, 6))
    lo, hi = draw(boxes(m))
    domain = (
        BoxDomain.create(lo, hi, m)
        if draw(st.booleans())
        else L2BallDomain(draw(st.floats(0.1, 10)), m)
    )
    standard = draw(st.booleans())
    directions = (
        Directions.standard(m) if standard else Directions.from_matrix(draw(orthonormal(m)))
    )
    return dict(
        query=CovarianceQuery(m, draw(st.integers(2, 3000))),
        domain=domain,
        directions=directions,
        allocation=Allocation(strategy="custom", theta=draw(allocations(m))),
        neighbours=draw(st.sampled_from(["replace-one", "add-remove"])),
        symmetric_ratio=draw(st.one_of(st.none(), st.floats(0.5, 20))),
    )


@given(symmetric_inputs(), epsilons, deltas)
def test_symmetric_plan_meets_delta_tightly_and_round_trips(inputs, eps, delta):
    plan = build_noise_plan(epsilon=eps, delta=delta, algorithm="symmetric", **inputs)
    got = cal.analytic_gaussian_delta(eps, plan.mahalanobis_sensitivity)
    assert delta * (1 - 1e-6) <= got <= delta
    assert np.all(plan.row_variances > 0) and plan.symmetric_ratio >= 0.5
    again = noise_plan_from_dict(plan.to_dict())
    assert np.array_equal(again.row_variances, plan.row_variances)


@given(symmetric_inputs(), st.floats(0.05, 4.0), st.floats(1.01, 5.0), deltas)
def test_symmetric_smaller_epsilon_never_gives_smaller_noise(inputs, eps, factor, delta):
    small = build_noise_plan(epsilon=eps, delta=delta, algorithm="symmetric", **inputs)
    large = build_noise_plan(epsilon=eps * factor, delta=delta, algorithm="symmetric", **inputs)
    if small.symmetric_ratio == large.symmetric_ratio:
        assert np.all(small.row_variances >= large.row_variances * (1 - 1e-9))
