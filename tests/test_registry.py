"""The calibration registry: requirements, budgets, theorem left-hand sides, the one checker."""

from __future__ import annotations

import itertools
import math
import pickle
import re
from typing import get_args

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvg_dask.plan import (
    Allocation,
    BoxDomain,
    Directions,
    build_noise_plan,
    share_budget,
)
from mvg_dask.plan.queries import IdentityQuery, make_query
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.registry import (
    CALIBRATIONS,
    REGISTRY,
    CompatibilityError,
    check_compatible,
    compatible_calibrations,
    get_calibration,
)
from mvg_dask.spec import SpecError, parse_spec
from tests.strategies import allocations, deltas, epsilons, orthonormal

#: The papers' assumptions, typed in from the theorems (independent of the registry's table):
#: (symmetric PSD query, square query, algorithms, standard directions).
ASSUMPTIONS = {
    "exact": (False, False, ("unimodal", "equi-modal"), False),
    "mvg-thm2": (False, False, ("unimodal", "equi-modal"), False),
    "mvg-thm3": (True, True, ("equi-modal",), False),  # MVG Thm. 3: f symmetric PSD, Psi = Sigma
    "mgm": (False, False, ("unimodal", "equi-modal"), False),
    "mgm-udn": (False, False, ("unimodal",), False),  # MGM Thm. 2: U_2 = I
    "mgm-idn": (False, False, ("unimodal",), True),  # MGM Thm. 3: U_2 = I, U_1 diagonal
}


def test_names_agree_with_the_type_and_the_table():
    assert CALIBRATIONS == tuple(REGISTRY) == get_args(cal.Calibration)
    assert set(ASSUMPTIONS) == set(CALIBRATIONS)
    for name, rule in REGISTRY.items():
        assert rule.name == name
        assert name in rule.label and rule.theorem in rule.label
        assert (rule.paper is None) == (name == "exact")
        assert rule.paper is None or rule.theorem.startswith(f"{rule.paper} Thm. ")


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="bogus") as info:
        get_calibration("bogus")
    for name in CALIBRATIONS:
        assert name in str(info.value)
    assert isinstance(info.value, CompatibilityError) and info.value.field == "calibration"
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value) and again.field == "calibration"


@pytest.mark.parametrize("name", list(ASSUMPTIONS))
def test_requirements_kinds_and_composition(name):
    rule = get_calibration(name)
    psd, square, algorithms, standard = ASSUMPTIONS[name]
    req = rule.requires
    assert (req.psd_query, req.square_query, req.algorithms, req.standard_directions) == (
        psd,
        square,
        algorithms,
        standard,
    )
    expected_kind = {"exact": "none", "mvg-thm2": "squared", "mvg-thm3": "squared"}
    assert rule.budget_kind == expected_kind.get(name, "linear")
    assert rule.has_precision_budget == (name != "exact")
    assert rule.gaussian_dp == (name == "exact")
    assert rule.uses_gamma == (name in ("mvg-thm2", "mvg-thm3"))
    assert rule.uses_entry_range == (name == "mgm-idn")


def _direct_budget(name, m, n, eps, delta, s2, gamma, rng_ab, algorithm):
    """The theorem functions called by hand, as paper_budget did before the registry."""
    if name == "mvg-thm2":
        return cal.mvg_thm2_budget(
            m=m, n=n, epsilon=eps, delta=delta, sensitivity=s2, gamma=gamma, algorithm=algorithm
        )
    if name == "mvg-thm3":
        return cal.mvg_thm3_budget(m=m, epsilon=eps, delta=delta, sensitivity=s2, gamma=gamma)
    if name == "mgm":
        return cal.mgm_budget(
            m=m, n=n, epsilon=eps, delta=delta, sensitivity=s2, algorithm=algorithm
        )
    if name == "mgm-udn":
        return cal.mgm_udn_budget(m=m, n=n, epsilon=eps, delta=delta, sensitivity=s2)
    assert name == "mgm-idn"
    return cal.mgm_idn_budget(m=m, n=n, epsilon=eps, delta=delta, entry_range=rng_ab)


@given(
    st.sampled_from([n for n in CALIBRATIONS if n != "exact"]),
    st.integers(1, 40),
    st.integers(1, 400),
    epsilons,
    deltas,
    st.floats(1e-4, 10.0),
    st.floats(0.1, 1e3),
    st.data(),
)
def test_budget_agrees_with_the_theorem_functions(name, m, n, eps, delta, s2, gamma, data):
    rule = get_calibration(name)
    algorithm = data.draw(st.sampled_from(rule.requires.algorithms))
    if algorithm == "equi-modal" or rule.requires.square_query:
        n = m
    entry_range = (-1.0, 2.0)
    got = rule.budget(
        m=m,
        n=n,
        epsilon=eps,
        delta=delta,
        algorithm=algorithm,
        sensitivity=s2,
        gamma=gamma,
        entry_range=entry_range,
    )
    assert got == _direct_budget(name, m, n, eps, delta, s2, gamma, entry_range, algorithm)
    assert got.kind == rule.budget_kind


def test_exact_has_no_budget_and_missing_inputs_are_named():
    exact = get_calibration("exact")
    with pytest.raises(ValueError, match="no precision budget"):
        exact.budget(m=2, n=2, epsilon=1, delta=1e-5, algorithm="unimodal", sensitivity=1.0)
    with pytest.raises(ValueError, match="no eigenvalue condition"):
        exact.theorem_lhs(np.ones(2), n=2, algorithm="unimodal")
    with pytest.raises(ValueError, match="gamma"):
        get_calibration("mvg-thm2").budget(
            m=2, n=3, epsilon=1, delta=1e-5, algorithm="unimodal", sensitivity=1.0
        )
    with pytest.raises(ValueError, match="range of every output entry"):
        get_calibration("mgm-idn").budget(m=2, n=3, epsilon=1, delta=1e-5, algorithm="unimodal")


def _lhs_from_matrices(name, plan):
    """The theorems' left-hand sides from the covariance matrices (not their eigenvalues)."""
    sig_inv = np.linalg.inv(plan.row_cov)
    n = plan.shape[1]
    equi = plan.algorithm == "equi-modal"
    psi_inv = sig_inv if equi else np.eye(n)
    fro = np.linalg.norm  # ||sigma(A)||_2 = ||A||_F
    if name == "mvg-thm2":
        return fro(sig_inv, "fro") * fro(psi_inv, "fro")
    if name == "mvg-thm3":
        return fro(sig_inv, "fro") ** 2
    if name == "mgm":  # ||U^-1||_F^2 = tr(Sigma^-1)
        return np.trace(sig_inv) * np.trace(psi_inv)
    return np.trace(sig_inv)  # mgm-udn, mgm-idn


@given(st.integers(1, 5), st.integers(2, 500), epsilons, deltas, st.data())
def test_theorem_lhs_agrees_with_the_matrices_of_built_plans(m, records, eps, delta, data):
    kind = data.draw(st.sampled_from(["identity", "covariance"]))
    query = make_query(kind, features=m, records=records)
    algorithm = data.draw(
        st.sampled_from(["unimodal", "equi-modal"] if kind == "covariance" else ["unimodal"])
    )
    standard = data.draw(st.booleans())
    name = data.draw(
        st.sampled_from(
            compatible_calibrations(
                algorithm,
                psd=query.is_psd,
                square=query.shape[0] == query.shape[1],
                standard_directions=standard,
            )
        )
    )
    directions = (
        Directions.standard(m) if standard else Directions.from_matrix(data.draw(orthonormal(m)))
    )
    plan = build_noise_plan(
        query,
        BoxDomain.create(-1.0, 2.0, m),
        epsilon=eps,
        delta=delta,
        algorithm=algorithm,
        calibration=name,
        directions=directions,
        allocation=Allocation(strategy="custom", theta=data.draw(allocations(m))),
    )
    lhs, rhs = plan.theorem_check()
    assert lhs <= rhs
    if name == "exact":
        return
    assert lhs == pytest.approx(_lhs_from_matrices(name, plan), rel=1e-8)
    assert rhs == plan.budget_detail.bound


# -- the one checker ---------------------------------------------------------------------------
def _fits(name, algorithm, psd, square, standard):
    need_psd, need_square, algorithms, need_standard = ASSUMPTIONS[name]
    return (
        (psd or not need_psd)
        and (square or not need_square)
        and algorithm in algorithms
        and (standard or not need_standard)
        and (square or algorithm == "unimodal")
    )


@pytest.mark.parametrize(
    ("name", "algorithm", "psd", "square", "standard"),
    [
        c
        for c in itertools.product(
            CALIBRATIONS, ("unimodal", "equi-modal"), (False, True), (False, True), (False, True)
        )
        if not (c[2] and not c[3])  # a PSD output is square
    ],
)
def test_checker_brute_force_and_every_named_remedy_works(name, algorithm, psd, square, standard):
    kw = dict(query_kind="q", psd=psd, square=square, standard_directions=standard)
    if _fits(name, algorithm, psd, square, standard):
        assert check_compatible(name, algorithm, **kw) is REGISTRY[name]
        return
    with pytest.raises(CompatibilityError) as info:
        check_compatible(name, algorithm, **kw)
    message = str(info.value)
    assert "use " in message and "\n" not in message
    # every remedy the message names really fits: a calibration list (with the algorithm it
    # names, if any), or the same calibration with another algorithm or standard directions
    remedy = message.split("use ", 1)[1]
    if "calibration " in remedy:
        tail = remedy.rsplit("calibration ", 1)[1]
        fixed = algorithm
        if " with algorithm: " in tail:
            tail, fixed = tail.split(" with algorithm: ")
        elif remedy.startswith("algorithm: ") and " and calibration " in remedy:
            fixed = remedy.removeprefix("algorithm: ").split(" ")[0]
        proposed = re.split(r", | or ", tail)
        assert proposed and set(proposed) <= set(CALIBRATIONS) - {name}
        for other in proposed:
            assert _fits(other, fixed, psd, square, standard), (message, other)
    # a setting the remedy changes fixes this rule (another, independent one may remain)
    if remedy.startswith("algorithm: ") and " and calibration " not in remedy:
        fixed = remedy.removeprefix("algorithm: ").split(",")[0]
        _assert_fixed(info.value, name, fixed, kw)
    if remedy.startswith("directions: standard"):
        _assert_fixed(info.value, name, algorithm, {**kw, "standard_directions": True})


def _assert_fixed(error, name, algorithm, kw):
    try:
        check_compatible(name, algorithm, **kw)
    except CompatibilityError as again:
        assert again.field != error.field, (str(error), str(again))


@pytest.mark.parametrize(
    ("name", "algorithm", "query", "field", "needle"),
    [
        ("exact", "equi-modal", "identity", "algorithm", "use algorithm: unimodal"),
        ("mvg-thm3", "unimodal", "identity", "calibration", "symmetric PSD"),
        ("mvg-thm3", "unimodal", "covariance", "algorithm", "use algorithm: equi-modal"),
        ("mgm-udn", "equi-modal", "covariance", "algorithm", "use algorithm: unimodal"),
        ("mgm-idn", "equi-modal", "covariance", "algorithm", "use algorithm: unimodal"),
    ],
)
def test_spec_plan_and_checker_share_one_wording(name, algorithm, query, field, needle):
    cov = query == "covariance"
    with pytest.raises(CompatibilityError) as info:
        check_compatible(
            name, algorithm, query_kind=query, psd=cov, square=cov, standard_directions=True
        )
    assert info.value.field == field and needle in str(info.value)
    with pytest.raises(ValueError) as plan_error:
        build_noise_plan(
            make_query(query, features=3, records=10),
            BoxDomain.create(0, 1, 3),
            epsilon=1,
            delta=1e-5,
            algorithm=algorithm,
            calibration=name,
        )
    assert str(plan_error.value) == str(info.value)
    spec = {
        "name": "x",
        "input": {"store": "a.zarr"},
        "domain": {"box": {"lower": 0, "upper": 1}},
        "query": query,
        "mechanism": {"algorithm": algorithm, "calibration": name},
        "privacy": {"epsilon": 1, "delta": 1e-5},
        "output": {"store": "o.zarr"},
    }
    with pytest.raises(SpecError) as spec_error:
        parse_spec(spec)
    assert str(spec_error.value) == f"spec: mechanism.{field}: {info.value}"


def test_directions_rule_in_spec_and_plan():
    W = np.linalg.qr(np.random.default_rng(0).standard_normal((3, 3)))[0]
    with pytest.raises(ValueError, match="use directions: standard") as plan_error:
        build_noise_plan(
            IdentityQuery(3, 10),
            BoxDomain.create(0, 1, 3),
            epsilon=1,
            delta=1e-5,
            calibration="mgm-idn",
            directions=Directions.from_matrix(W),
        )
    spec = {
        "name": "x",
        "input": {"store": "a.zarr"},
        "domain": {"box": {"lower": 0, "upper": 1}},
        "query": "identity",
        "mechanism": {"calibration": "mgm-idn", "directions": {"method": "dp-pca"}},
        "privacy": {"epsilon": 1, "delta": 1e-5},
        "output": {"store": "o.zarr"},
    }
    with pytest.raises(SpecError) as spec_error:
        parse_spec(spec)
    assert str(spec_error.value) == f"spec: mechanism.directions: {plan_error.value}"


def test_theorem_functions_use_the_same_square_wording():
    with pytest.raises(ValueError, match=re.escape(cal.EQUI_MODAL_NEEDS_SQUARE)) as info:
        cal.mgm_budget(m=2, n=3, epsilon=1, delta=1e-5, sensitivity=1, algorithm="equi-modal")
    assert "use algorithm: unimodal" in str(info.value)
    with pytest.raises(ValueError, match=re.escape(cal.EQUI_MODAL_NEEDS_SQUARE)):
        check_compatible(
            "exact",
            "equi-modal",
            query_kind="custom",
            psd=False,
            square=False,
            standard_directions=True,
        )


def test_split_budget_composes_exactly_only_for_gaussian_dp_rules():
    for name, rule in REGISTRY.items():
        split = share_budget(name, 1.0, 1e-5, 0.2)
        assert (split.composition == "gaussian-dp") == rule.gaussian_dp
        if rule.gaussian_dp:
            mu = math.hypot(split.step_mu, split.release_mu)
            assert cal.analytic_gaussian_delta(1.0, mu) <= 1e-5
