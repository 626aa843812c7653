"""Property tests (hypothesis) of noise plans, allocations and the Mahalanobis bounds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mvg_dask.plan import (
    Allocation,
    BoxDomain,
    Directions,
    L2BallDomain,
    build_noise_plan,
)
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery, make_query
from mvg_dask.privacy import allocation as alloc
from mvg_dask.privacy import calibration as cal
from tests.strategies import allocations, boxes, deltas, epsilons, orthonormal


@st.composite
def plan_inputs(draw: st.DrawFn):
    """Random but valid (query, domain, algorithm, calibration, directions, allocation)."""
    m = draw(st.integers(1, 6))
    kind = draw(st.sampled_from(["identity", "covariance"]))
    records = draw(st.integers(2, 3000))
    lo, hi = draw(boxes(m))
    domain = (
        BoxDomain.create(lo, hi, m)
        if draw(st.booleans())
        else L2BallDomain(draw(st.floats(0.1, 10)), m)
    )
    query = make_query(kind, features=m, records=records)
    algorithm = "equi-modal" if kind == "covariance" and draw(st.booleans()) else "unimodal"
    choices = ["exact", "mvg-thm2", "mgm"]
    if algorithm == "unimodal":
        choices += ["mgm-udn", "mgm-idn"]
    else:
        choices += ["mvg-thm3"]
    calibration = draw(st.sampled_from(choices))
    standard = calibration == "mgm-idn" or draw(st.booleans())
    directions = (
        Directions.standard(m) if standard else Directions.from_matrix(draw(orthonormal(m)))
    )
    theta = draw(allocations(m))
    return dict(
        query=query,
        domain=domain,
        algorithm=algorithm,
        calibration=calibration,
        directions=directions,
        allocation=Allocation(strategy="custom", theta=theta),
    )


def _plan(inputs, eps, delta):
    return build_noise_plan(
        inputs["query"],
        inputs["domain"],
        epsilon=eps,
        delta=delta,
        algorithm=inputs["algorithm"],
        calibration=inputs["calibration"],
        directions=inputs["directions"],
        allocation=inputs["allocation"],
    )


@given(plan_inputs(), epsilons, deltas)
def test_every_calibration_satisfies_its_own_theorem(inputs, eps, delta):
    plan = _plan(inputs, eps, delta)
    lhs, rhs = plan.theorem_check()
    assert lhs <= rhs
    assert np.all(plan.row_variances > 0)


@given(plan_inputs(), epsilons, deltas)
def test_exact_plan_meets_delta_and_is_tight(inputs, eps, delta):
    inputs = {**inputs, "calibration": "exact"}
    plan = _plan(inputs, eps, delta)
    got = cal.analytic_gaussian_delta(eps, plan.mahalanobis_sensitivity)
    assert got <= delta
    assert got >= delta * (1 - 1e-6)


@given(plan_inputs(), st.floats(0.05, 4.0), st.floats(1.01, 5.0), deltas)
def test_smaller_epsilon_never_gives_smaller_noise(inputs, eps, factor, delta):
    small = _plan(inputs, eps, delta)
    large = _plan(inputs, eps * factor, delta)
    assert np.all(small.row_variances >= large.row_variances * (1 - 1e-9))


@given(plan_inputs(), epsilons, deltas, st.data())
def test_more_budget_to_a_direction_never_gives_it_more_noise(inputs, eps, delta, data):
    m = inputs["query"].features
    theta = np.asarray(inputs["allocation"].theta)
    i = data.draw(st.integers(0, m - 1))
    bump = data.draw(st.floats(1.01, 3.0))
    new = theta.copy()
    new[i] *= bump
    new = new / max(1.0, new.sum())  # keep sum <= 1: others can only shrink
    assume(new[i] > theta[i])
    if inputs["calibration"] == "exact":
        # exact rescales theta, so its precision in a direction is c * theta_i with c chosen from
        # Delta_M; the property is claimed for the bound that is linear in the precisions
        # (identity query, standard basis, box domain)
        assume(
            inputs["query"].kind == "identity"
            and inputs["directions"].is_standard
            and isinstance(inputs["domain"], BoxDomain)
        )
    before = _plan(inputs, eps, delta)
    after = _plan({**inputs, "allocation": Allocation(strategy="custom", theta=new)}, eps, delta)
    assert after.row_variances[i] <= before.row_variances[i] * (1 + 1e-9)


@given(
    st.integers(1, 12),
    st.data(),
)
def test_allocations_sum_to_at_most_one(m, data):
    k = data.draw(st.integers(1, m))
    important = data.draw(st.permutations(range(m)))[:k]
    share = data.draw(st.floats(0.01, 0.99 if k < m else 1.0))
    lam = np.array(data.draw(st.lists(st.floats(-1, 1e3), min_size=m, max_size=m)))
    utility = np.array(data.draw(st.lists(st.floats(-3, 3), min_size=2 * m, max_size=2 * m)))
    results = [
        alloc.uniform(m),
        alloc.binary(m, important, share),
        alloc.max_pnr(lam, total_precision=data.draw(st.floats(1e-3, 1e3)), kind="squared"),
        alloc.max_pnr(lam, total_precision=data.draw(st.floats(1e-3, 1e3)), kind="linear"),
        alloc.mgm_optimal(utility.reshape(2, m), np.eye(m), kind="linear"),
        alloc.mgm_optimal(utility.reshape(2, m), np.eye(m), kind="squared"),
    ]
    for theta in results:
        assert theta.shape == (m,)
        assert np.all(theta > 0)
        assert theta.sum() <= 1 + 1e-9


def test_binary_allocation_values_and_errors():
    theta = alloc.binary(5, [0, 3], 0.8)
    assert np.allclose(theta, [0.4, 0.2 / 3, 0.2 / 3, 0.4, 0.2 / 3])
    with pytest.raises(ValueError, match="out of range"):
        alloc.binary(5, [7], 0.8)
    with pytest.raises(ValueError, match="sum to"):
        alloc.check_allocation([0.6, 0.6], 2)
    with pytest.raises(ValueError, match="> 0"):
        alloc.check_allocation([0.5, 0.0], 2)


def test_max_pnr_is_water_filling():
    lam = np.array([10.0, 2.0, 1.0])
    T = 5.0
    theta = alloc.max_pnr(lam, total_precision=T, kind="linear")
    # closed form of Thm. 7 when every direction is above water: q_i = c - 1/lambda_i
    c = (T + np.sum(1 / lam)) / 3
    q = c - 1 / lam
    assert np.all(q > 0)
    assert np.allclose(theta, q / q.sum())
    # brute force: no other split of T does better on prod(q_i + 1/lambda_i)
    rng = np.random.default_rng(3)
    best = np.sum(np.log(theta * T + 1 / lam))
    for _ in range(2000):
        w = rng.dirichlet(np.ones(3)) * T
        assert np.sum(np.log(w + 1 / lam)) <= best + 1e-9


def test_mgm_optimal_minimises_utility_error_brute_force():
    rng = np.random.default_rng(11)
    m = 4
    W1 = rng.standard_normal((2, m))
    W = np.linalg.qr(rng.standard_normal((m, m)))[0]
    theta = alloc.mgm_optimal(W1, W, kind="linear")
    P = np.sum((W1 @ W) ** 2, axis=0)

    def err(t):  # E||W1 Z||^2 with variances 1/t (linear budget sum t = 1)
        return float(np.sum(P / t))

    for _ in range(3000):
        assert err(theta) <= err(rng.dirichlet(np.ones(m))) + 1e-9


# -- Mahalanobis sensitivity bounds against brute force -----------------------------------------
def _whiten(plan):
    Sigma = plan.row_cov
    return np.linalg.inv(np.linalg.cholesky(Sigma))


@given(st.integers(1, 5), st.data(), epsilons, deltas)
def test_identity_bound_dominates_vertex_enumeration(m, data, eps, delta):
    lo, hi = data.draw(boxes(m))
    domain = BoxDomain.create(lo, hi, m)
    W = data.draw(orthonormal(m))
    plan = build_noise_plan(
        IdentityQuery(m, 10),
        domain,
        epsilon=eps,
        delta=delta,
        directions=Directions.from_matrix(W),
        allocation=Allocation(strategy="custom", theta=data.draw(allocations(m))),
    )
    Ainv = _whiten(plan)
    # the sup of a convex quadratic over the difference box is at a vertex: d_i = +-w_i
    best = max(
        float(np.linalg.norm(Ainv @ (np.array(s) * domain.widths)))
        for s in itertools.product([-1, 1], repeat=m)
    )
    assert best <= plan.mahalanobis_sensitivity * (1 + 1e-9)
    if np.allclose(W, np.eye(m)) or m == 1:
        assert best == pytest.approx(plan.mahalanobis_sensitivity, rel=1e-9)


@pytest.mark.parametrize("algorithm", ["unimodal", "equi-modal"])
@pytest.mark.parametrize("neighbours", ["replace-one", "add-remove"])
def test_covariance_bound_dominates_sampled_pairs(algorithm, neighbours):
    rng = np.random.default_rng(5)
    for trial in range(20):
        m = int(rng.integers(1, 5))
        lo = rng.uniform(-2, 1, m)
        hi = lo + rng.uniform(0.1, 2, m)
        domain = BoxDomain.create(lo, hi, m)
        W = np.linalg.qr(rng.standard_normal((m, m)))[0]
        N = 50
        plan = build_noise_plan(
            CovarianceQuery(m, N),
            domain,
            epsilon=1.0,
            delta=1e-5,
            algorithm=algorithm,
            directions=Directions.from_matrix(W),
            neighbours=neighbours,
            allocation=Allocation(strategy="custom", theta=rng.dirichlet(np.ones(m))),
        )
        Ainv = _whiten(plan)
        verts = np.array(list(itertools.product(*zip(lo, hi, strict=True))))
        pts = np.vstack([verts, rng.uniform(lo, hi, (300, m))])
        worst = 0.0
        for x in pts[:: max(1, len(pts) // 60)]:
            others = pts if neighbours == "replace-one" else np.zeros((1, m))
            for y in others:
                D = (np.outer(x, x) - np.outer(y, y)) / N
                M = Ainv @ D
                if algorithm == "equi-modal":
                    M = M @ Ainv.T
                worst = max(worst, float(np.linalg.norm(M)))
        assert worst <= plan.mahalanobis_sensitivity * (1 + 1e-9), trial


def test_l2_ball_identity_bound():
    plan = build_noise_plan(IdentityQuery(3, 7), L2BallDomain(2.0, 3), epsilon=1.0, delta=1e-5)
    lam = np.max(1 / plan.row_variances)
    assert plan.mahalanobis_sensitivity == pytest.approx(2 * 2.0 * math.sqrt(lam), rel=1e-12)
