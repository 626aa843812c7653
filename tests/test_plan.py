"""Noise plans: compatibility rules, budget split, DP-PCA, serialisation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mvg_dask.noise import NoiseKey
from mvg_dask.plan import (
    Allocation,
    BoxDomain,
    Directions,
    L2BallDomain,
    build_noise_plan,
    dp_pca,
    gram_sensitivity,
    share_budget,
)
from mvg_dask.plan.queries import CovarianceQuery, CustomQuery, IdentityQuery
from mvg_dask.privacy import calibration as cal


def test_compatibility_errors_name_the_remedy():
    box = BoxDomain.create(0, 1, 3)
    ident = IdentityQuery(3, 10)
    cov = CovarianceQuery(3, 10)
    with pytest.raises(ValueError, match="use algorithm: unimodal"):
        build_noise_plan(ident, box, epsilon=1, delta=1e-5, algorithm="equi-modal")
    with pytest.raises(ValueError, match="symmetric PSD"):
        build_noise_plan(ident, box, epsilon=1, delta=1e-5, calibration="mvg-thm3")
    with pytest.raises(ValueError, match="equi-modal"):
        build_noise_plan(cov, box, epsilon=1, delta=1e-5, calibration="mvg-thm3")
    with pytest.raises(ValueError, match="unimodal"):
        build_noise_plan(
            cov, box, epsilon=1, delta=1e-5, calibration="mgm-udn", algorithm="equi-modal"
        )
    W = np.linalg.qr(np.random.default_rng(0).standard_normal((3, 3)))[0]
    with pytest.raises(ValueError, match="directions: standard"):
        build_noise_plan(
            ident,
            box,
            epsilon=1,
            delta=1e-5,
            calibration="mgm-idn",
            directions=Directions.from_matrix(W),
        )
    with pytest.raises(ValueError, match="not orthonormal"):
        Directions.from_matrix(W * 1.01)
    with pytest.raises(ValueError, match="4 features"):
        build_noise_plan(ident, BoxDomain.create(0, 1, 4), epsilon=1, delta=1e-5)
    with pytest.raises(ValueError, match="entry_range"):
        build_noise_plan(
            CustomQuery(features=3, records=10, shape_=(3, 5), sensitivity=1.0),
            box,
            epsilon=1,
            delta=1e-5,
            calibration="mgm-idn",
        )
    with pytest.raises(ValueError, match="gamma"):
        build_noise_plan(
            CustomQuery(features=3, records=10, shape_=(3, 5), sensitivity=1.0),
            box,
            epsilon=1,
            delta=1e-5,
            calibration="mvg-thm2",
        )
    with pytest.raises(ValueError, match="max-pnr"):
        build_noise_plan(
            ident, box, epsilon=1, delta=1e-5, allocation=Allocation(strategy="max-pnr")
        )


def test_custom_query_uses_declared_sensitivity():
    q = CustomQuery(
        features=3,
        records=10,
        shape_=(2, 5),
        sensitivity=0.5,
        gamma=3.0,
        entry_range=(0.0, 1.0),
    )
    box = BoxDomain.create(0, 1, 3)
    for calibration in ("exact", "mvg-thm2", "mgm", "mgm-udn", "mgm-idn"):
        plan = build_noise_plan(q, box, epsilon=1, delta=1e-5, calibration=calibration)
        assert plan.shape == (2, 5) and plan.sensitivity == 0.5
        lhs, rhs = plan.theorem_check()
        assert lhs <= rhs


def test_budget_split_basic_and_gaussian_dp():
    basic = share_budget("mvg-thm2", 1.0, 1e-5, 0.2)
    assert basic.composition == "basic"
    assert basic.step_epsilon + basic.release_epsilon == pytest.approx(1.0)
    assert basic.step_delta + basic.release_delta == pytest.approx(1e-5)
    exact = share_budget("exact", 1.0, 1e-5, 0.2)
    assert exact.composition == "gaussian-dp"
    # mu_1^2 + mu_2^2 = mu*^2: the composition is exactly (1, 1e-5)-DP
    mu = math.hypot(exact.step_mu, exact.release_mu)
    assert cal.analytic_gaussian_delta(1.0, mu) <= 1e-5
    assert cal.analytic_gaussian_delta(1.0, mu) == pytest.approx(1e-5, rel=1e-6)
    with pytest.raises(ValueError, match="budget_share"):
        share_budget("exact", 1.0, 1e-5, 1.0)


def test_dp_pca_directions_plan_end_to_end():
    rng = np.random.default_rng(1)
    m, N = 5, 4000
    # data with a dominant direction e_2
    X = np.clip(rng.normal(0, 0.05, (m, N)) + np.outer(np.eye(m)[2], rng.uniform(0, 1, N)), -1, 1)
    box = BoxDomain.create(-1, 1, m)
    split = share_budget("exact", 1.0, 1e-6, 0.2)
    dirs = dp_pca(
        X @ X.T,
        records=N,
        k=1,
        mu=split.step_mu,
        sensitivity=gram_sensitivity(box, "replace-one"),
        key=NoiseKey.from_seed(3),
    )
    assert abs(dirs.matrix[2, 0]) > 0.99  # found the dominant direction
    assert dirs.important == (0,)
    assert np.allclose(dirs.matrix.T @ dirs.matrix, np.eye(m), atol=1e-10)
    for strategy in ("binary", "max-pnr"):
        plan = build_noise_plan(
            IdentityQuery(m, N),
            box,
            epsilon=1.0,
            delta=1e-6,
            directions=dirs,
            allocation=Allocation(strategy=strategy),
            direction_share=0.2,
        )
        lhs, rhs = plan.theorem_check()
        assert lhs <= rhs
        assert plan.row_variances[0] < plan.row_variances[-1]
        d = plan.to_dict()
        assert d["composition"]["method"] == "gaussian-dp"
        json.dumps(d)


def test_plan_json_never_contains_a_key_and_has_the_contract_fields():
    plan = build_noise_plan(
        CovarianceQuery(3, 100),
        L2BallDomain(1.0, 3),
        epsilon=1,
        delta=1e-5,
        algorithm="equi-modal",
    )
    d = json.loads(plan.to_json())
    assert d["col_variances"] == d["row_variances"]
    assert "key" not in json.dumps(d).lower().replace("kind", "")
    assert plan._repr_html_().startswith("<pre>")
    assert "calibration exact" in repr(plan)
