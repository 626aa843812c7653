"""The cross-covariance query ``X_rows X_cols^T / N``: its bounds (docs/bounds.md, Sec. 16)
against optimisation from many starts and brute force over box corners, the spec form, and
releases on a real LocalCluster (huge epsilon equals numpy, chunking-invariant bytes, the dry
run, the accessor's noise std and a Monte Carlo check of it)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.engine.stages.cross import cross_covariance_release
from mvg_dask.errors import DataError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan import BoxDomain, L2BallDomain
from mvg_dask.plan.queries import CrossCovarianceQuery, query_from_dict
from mvg_dask.plan.queries.cross import column_variances
from mvg_dask.spec import SpecError, parse_spec, spec_hash
from tests.pipeline_helpers import data, make_input, write_spec
from tests.test_bounds import maximise as bounds_maximise

REL = 1e-9
M = 5
OVERLAP = ((0, 2), (1, 2, 3, 4))  # feature 2 on both sides
DISJOINT = ((0, 3), (1, 2, 4))
#: spec_hash of ``_spec("in.zarr", "out.zarr")``, computed before col_allocation existed
CROSS_SPEC_HASH = "61f97c3ed6a1def49210d1d1a9dd4b68bd31040f5f34402e66e6867abe6eb4d7"


def _domain(name: str):
    if name == "sym-box":
        return BoxDomain.create(-1, 1, M)
    if name == "unit-box":
        return BoxDomain.create(0, 1, M)
    if name == "mixed-box":
        return BoxDomain.create(np.linspace(-2, 0.5, M), np.linspace(1, 3, M), M)
    if name == "sign-definite-box":
        lo = np.array([-3.0, 0.0, 0.5, -2.0, 1.0])
        hi = np.array([-1.0, 2.0, 1.5, -0.5, 4.0])
        return BoxDomain.create(lo, hi, M)
    return L2BallDomain(1.5, M)


DOMAINS = ["sym-box", "unit-box", "mixed-box", "sign-definite-box", "ball"]


def whitened_norm(
    q: CrossCovarianceQuery,
    P: np.ndarray,
    x: np.ndarray,
    xp: np.ndarray,
    Q: np.ndarray | None = None,
) -> float:
    """``||A^-1 (a b^T - a' b'^T) B^-T||_F`` with ``A A^T = P^-1`` and ``B B^T = diag(Q)^-1``:
    ``sqrt(tr(D^T P D diag(Q)))`` (``Q = None``: ``Psi = I``)."""
    D = q.contribution(x) - q.contribution(xp)
    col = np.ones(D.shape[1]) if Q is None else Q
    return math.sqrt(max(float(np.sum(D * (P @ D) * col[None, :])), 0.0))


def maximise(objective, domain, pairs: bool, rng: np.random.Generator) -> float:
    """Largest ``objective(x, x')`` (``x' = 0`` unless ``pairs``) from 20 random starts
    (tests/test_bounds.py's search over ``M`` features)."""
    return bounds_maximise(objective, domain, M, pairs, rng)


def corners(domain: BoxDomain, objective, pairs: bool) -> float:
    """Brute force over the box's corners (and pairs of corners)."""
    pts = [
        np.where(np.array(c), domain.upper, domain.lower)
        for c in itertools.product((0, 1), repeat=M)
    ]
    if not pairs:
        return max(objective(x, np.zeros(M)) for x in pts)
    return max(objective(x, xp) for x in pts for xp in pts)


def _precision(kind: str, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """``(precision as the bounds take it, dense P)``."""
    if kind == "identity":
        return np.ones(m), np.eye(m)
    if kind == "diagonal":
        p = rng.uniform(0.2, 3.0, m)
        return p, np.diag(p)
    W = np.linalg.qr(rng.standard_normal((m, m)))[0]
    p = rng.uniform(0.2, 3.0, m)
    P = (W * p) @ W.T
    return P, P


# -- bounds ----------------------------------------------------------------------------------
@pytest.mark.parametrize("domain_name", DOMAINS)
@pytest.mark.parametrize("precision", ["identity", "diagonal", "dense"])
@pytest.mark.parametrize("sides", [OVERLAP, DISJOINT], ids=["overlap", "disjoint"])
def test_whitened_replace_one_bound_dominates_optimisation_and_corners(
    domain_name, precision, sides
):
    """``c sqrt(S_a R_b) / N`` against 20 local optimisations and every pair of corners (seed
    from the case; a bound below any value found fails)."""
    rows, cols = sides
    N = 7
    q = CrossCovarianceQuery(M, N, rows=rows, cols=cols)
    domain = _domain(domain_name)
    rng = np.random.default_rng(abs(hash((domain_name, precision, rows))) % 2**32)
    prec, P = _precision(precision, len(rows), rng)
    bound = q.mahalanobis_sensitivity(domain, "replace-one", prec, "unimodal") * N
    obj = lambda x, xp: whitened_norm(q, P, x, xp)  # noqa: E731
    found = maximise(obj, domain, True, rng)
    if isinstance(domain, BoxDomain):
        found = max(found, corners(domain, obj, True))
    assert found <= bound * (1 + REL), (found, bound)
    if precision == "identity":  # the L2 bound is the same quantity
        assert found <= q.l2_sensitivity(domain, "replace-one") * N * (1 + REL)


@pytest.mark.parametrize("domain_name", DOMAINS)
def test_add_remove_bound_dominates_and_is_attained_on_boxes(domain_name):
    """``sqrt(R_a R_b) / N``: ``||a b^T||_F = ||a|| ||b||`` is largest at the far corner."""
    rows, cols = OVERLAP
    q = CrossCovarianceQuery(M, 3, rows=rows, cols=cols)
    domain = _domain(domain_name)
    rng = np.random.default_rng(5)
    obj = lambda x, xp: whitened_norm(q, np.eye(len(rows)), x, xp)  # noqa: E731
    bound = q.l2_sensitivity(domain, "add-remove") * 3
    assert bound == pytest.approx(
        q.mahalanobis_sensitivity(domain, "add-remove", np.ones(2), "unimodal") * 3
    )
    found = maximise(obj, domain, False, rng)
    if isinstance(domain, BoxDomain):
        top = corners(domain, obj, False)
        assert top == pytest.approx(bound, rel=1e-12)  # tight
        found = max(found, top)
    assert found <= bound * (1 + REL)


def test_replace_one_bound_is_tight_on_a_symmetric_box_and_sqrt2_on_a_sign_definite_one():
    """Symmetric box, disjoint sides: ``a' = -a, b' = b`` attains ``2 sqrt(R_a R_b)``. On
    ``[0, 1]^m`` the bound is ``sqrt(2) sqrt(R_a R_b)`` and holds at every pair of corners."""
    rows, cols = DISJOINT
    q = CrossCovarianceQuery(M, 1, rows=rows, cols=cols)
    sym = _domain("sym-box")
    obj = lambda x, xp: whitened_norm(q, np.eye(2), x, xp)  # noqa: E731
    R_a, R_b = 2.0, 3.0
    assert q.l2_sensitivity(sym, "replace-one") == pytest.approx(2 * math.sqrt(R_a * R_b))
    assert corners(sym, obj, True) == pytest.approx(2 * math.sqrt(R_a * R_b), rel=1e-12)
    unit = _domain("unit-box")
    assert q.l2_sensitivity(unit, "replace-one") == pytest.approx(math.sqrt(2 * R_a * R_b))
    assert corners(unit, obj, True) <= math.sqrt(2 * R_a * R_b) * (1 + REL)


def test_sign_definite_factor_needs_a_diagonal_precision():
    """On ``[0, 1]^2`` a precision with a negative off-diagonal makes ``a^T P a' < 0``: the pair
    ``a = e1, a' = e2, b = b'`` exceeds ``sqrt(2 S_a R_b)``, so a dense precision keeps the
    factor 2 (and its bound holds there)."""
    q = CrossCovarianceQuery(4, 1, rows=(0, 1), cols=(2, 3))
    box = BoxDomain.create(0.0, 1.0, 4)
    P = np.array([[1.0, -0.9], [-0.9, 1.0]])
    x = np.array([1.0, 0.0, 1.0, 1.0])
    xp = np.array([0.0, 1.0, 1.0, 1.0])
    value = whitened_norm(q, P, x, xp)  # sqrt(3.8 * 2)
    S_a, R_b = 1.0, 2.0  # sup a^T P a over [0, 1]^2: max(1, 1, 0.2)
    assert value > math.sqrt(2 * S_a * R_b)
    W = np.linalg.eigh(P)[1]
    bound = q.mahalanobis_sensitivity(box, "replace-one", P, "unimodal", directions=W)
    assert value <= bound * (1 + REL)


def test_other_noises_and_a_bad_query_are_refused():
    q = CrossCovarianceQuery(4, 10, rows=(0,), cols=(1, 2))
    box = BoxDomain.create(0.0, 1.0, 4)
    with pytest.raises(ValueError, match="unimodal"):
        q.mahalanobis_sensitivity(box, "replace-one", np.ones(1), "equi-modal")
    with pytest.raises(ValueError, match="repeat"):
        CrossCovarianceQuery(4, 10, rows=(0, 0), cols=(1,))
    with pytest.raises(ValueError, match="not one of"):
        CrossCovarianceQuery(4, 10, rows=(0,), cols=(4,))
    with pytest.raises(ValueError, match="at least one"):
        CrossCovarianceQuery(4, 10, rows=(), cols=(1,))


def test_blueprint_values_and_round_trip():
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (M, 40))
    q = CrossCovarianceQuery(M, 40, rows=(4, 0), cols=(2, 3, 0))
    total = q.combine(q.partial(X[:, :15]), q.partial(X[:, 15:]))
    assert np.allclose(q.finalize(total), X[[4, 0]] @ X[[2, 3, 0]].T / 40)
    assert np.allclose(sum(q.contribution(X[:, j]) for j in range(40)), X[[4, 0]] @ X[[2, 3, 0]].T)
    assert q.shape == (2, 3) and q.noise_shape == "rectangular"
    back = query_from_dict(json.loads(json.dumps(q.to_dict())))
    assert back == q and back.to_dict() == q.to_dict()
    box = BoxDomain.create(-1.0, 2.0, M)
    lo, hi = q.output_entry_range(box)
    assert (lo, hi) == (-2.0, 4.0)
    assert q.sup_frobenius(box) == pytest.approx(math.sqrt(8.0 * 12.0))


@pytest.mark.parametrize("psi", [None, (0.7, 2.5, 1.0, 0.2)])
def test_float_error_bound_dominates_the_engines_error(psi):
    """The lattice's ``E`` (Gram lemma on the block, the column whitening when ``Psi != I``,
    then the one-sided row whitening) against the measured error of the engine's float
    sequence on uniform data, many records (reference in ``longdouble``). The engine's canonical
    partition of 5 features is one block of up to 2^17 records here, one product; several
    blocks, tasks and tree levels: tests/test_canonical_blocks.py."""
    from mvg_dask.plan.lattice import LatticeContext, canonical_gram_depth
    from mvg_dask.privacy import float_error as ferr

    rng = np.random.default_rng(3)
    N, block = 3000, 2**17
    X = rng.uniform(0.0, 1.0, (M, N))
    q = CrossCovarianceQuery(M, N, rows=(0, 2), cols=(1, 2, 3, 4), col_variances=psi)
    depth = canonical_gram_depth(N, block, 1, 8, 8)
    assert depth == N
    v = np.array([0.3, 1.7])
    white = ferr.Whitening.diagonal(v)
    E = q.float_error(
        np.ones(M),
        white,
        norm_max=None,
        algorithm="unimodal",
        ratio=None,
        context=LatticeContext(records=N, depth=depth),
    )
    # the engine's sequence: the block's product, the rows x cols block divided, then whitened
    G = X @ X.T
    cols = np.ones(4) if psi is None else np.array(psi)
    f_hat = q.finalize(G) if psi is None else q.finalize(G) * (1.0 / np.sqrt(cols))[None, :]
    g_hat = f_hat * (1.0 / np.sqrt(v))[:, None]
    exact = (X[[0, 2]].astype(np.longdouble) @ X[[1, 2, 3, 4]].T.astype(np.longdouble)) / N
    g = exact / np.sqrt(v.astype(np.longdouble))[:, None]
    g = g / np.sqrt(cols.astype(np.longdouble))[None, :]
    measured = float(np.sqrt(np.sum((g_hat - g) ** 2)))
    assert 0 < measured <= E
    assert E < 1e-9  # and it is small against any useful noise


# -- the column covariance Psi ---------------------------------------------------------------
def _psi_query(sides, N: int, rng: np.random.Generator) -> tuple[CrossCovarianceQuery, np.ndarray]:
    """A query with a random column allocation and its column precision ``Q = Psi^-1``."""
    rows, cols = sides
    psi = column_variances(rng.uniform(0.1, 1.0, len(cols)))
    assert psi is not None
    return CrossCovarianceQuery(M, N, rows=rows, cols=cols, col_variances=psi), 1.0 / np.array(psi)


@pytest.mark.parametrize("domain_name", DOMAINS)
@pytest.mark.parametrize("precision", ["identity", "diagonal", "dense"])
def test_psi_bounds_dominate_optimisation_and_corners(domain_name, precision):
    """Theorem 16.1 and 16.2 with a column precision ``Q = Psi^-1`` (random, normalised):
    ``c sqrt(S_a S_b) / N`` (replace-one, ``c = sqrt(2)`` on the sign-definite box with a
    diagonal ``P``) and ``sqrt(S_a S_b) / N`` (add-remove, attained at the far corner with a
    diagonal ``P``) against 20 local optimisations and every (pair of) corner(s) (seed from the
    case; a bound below any value found fails)."""
    N = 7
    domain = _domain(domain_name)
    rng = np.random.default_rng(abs(hash(("psi", domain_name, precision))) % 2**32)
    q, Q = _psi_query(OVERLAP if precision == "dense" else DISJOINT, N, rng)
    assert np.mean(Q) == pytest.approx(1.0, rel=1e-12)  # tr(Psi^-1) = m_b
    prec, P = _precision(precision, len(q.rows), rng)
    W = None if precision != "dense" else np.linalg.eigh(P)[1]
    for nb, pairs in (("replace-one", True), ("add-remove", False)):
        bound = q.mahalanobis_sensitivity(domain, nb, prec, "unimodal", directions=W) * N
        obj = lambda x, xp: whitened_norm(q, P, x, xp, Q)  # noqa: E731
        found = maximise(obj, domain, pairs, rng)
        if isinstance(domain, BoxDomain):
            top = corners(domain, obj, pairs)
            if nb == "add-remove" and precision != "dense":
                assert top == pytest.approx(bound, rel=1e-12)  # tight: sqrt(S_a S_b)
            found = max(found, top)
        assert found <= bound * (1 + REL), (nb, found, bound)


def test_psi_factor_sqrt2_and_the_generic_bound():
    """On the sign-definite box with diagonal precisions on both sides the bound is
    ``sqrt(2 S_a S_b) / N``, with ``S_b = sum_j q_j max(l_j^2, u_j^2)``; on a ball the generic
    ``s_2 sqrt(lambda_max(P) lambda_max(Q))`` is the least when it is smaller."""
    rows, cols = DISJOINT
    psi = (0.5, 2.0, 1.0)
    q = CrossCovarianceQuery(M, 1, rows=rows, cols=cols, col_variances=psi)
    box = _domain("sign-definite-box")
    p = np.array([1.5, 0.25])
    a = box.abs_max
    S_a = float(p @ a[list(rows)] ** 2)
    S_b = float((1.0 / np.array(psi)) @ a[list(cols)] ** 2)
    got = q.mahalanobis_sensitivity(box, "replace-one", p, "unimodal")
    assert got == pytest.approx(math.sqrt(2.0 * S_a * S_b), rel=1e-12)
    ball = L2BallDomain(1.0, M)
    generic = q.l2_sensitivity(ball, "replace-one") * math.sqrt(1.5 * 2.0)
    own = 2.0 * math.sqrt(1.5 * 2.0)  # S_a = C^2 max p, S_b = C^2 max q
    got = q.mahalanobis_sensitivity(ball, "replace-one", p, "unimodal")
    assert got == pytest.approx(min(generic, own), rel=1e-12)


def test_column_variances_normalisation_and_refusals():
    """``psi_j = mean(theta) / theta_j`` (``tr Psi^-1 = m_b``), ``None`` for equal shares; a
    bad ``col_variances`` or a paper calibration with ``Psi != I`` is refused."""
    psi = column_variances(np.array([0.6, 0.2, 0.2]))
    assert psi is not None and np.sum(1.0 / np.array(psi)) == pytest.approx(3.0, rel=1e-14)
    assert psi[0] == pytest.approx(1 / 1.8) and psi[1] == pytest.approx(1 / 0.6)
    assert column_variances(np.full(4, 0.25)) is None
    with pytest.raises(ValueError, match="share"):
        column_variances(np.array([0.5, 0.0]))
    with pytest.raises(ValueError, match="col_variances has"):
        CrossCovarianceQuery(M, 9, rows=(0,), cols=(1, 2), col_variances=(1.0,))
    with pytest.raises(ValueError, match="finite"):
        CrossCovarianceQuery(M, 9, rows=(0,), cols=(1, 2), col_variances=(1.0, -1.0))
    q = CrossCovarianceQuery(M, 9, rows=(0,), cols=(1, 2), col_variances=(0.5, 1.5))
    back = query_from_dict(json.loads(json.dumps(q.to_dict())))
    assert back == q and back.to_dict()["col_variances"] == [0.5, 1.5]
    assert "col_variances" not in CrossCovarianceQuery(M, 9, rows=(0,), cols=(1,)).to_dict()
    from mvg_dask.plan.noise_plan import build_noise_plan

    box = BoxDomain.create(0.0, 1.0, M)
    with pytest.raises(ValueError, match="calibration exact"):
        build_noise_plan(q, box, epsilon=1.0, delta=1e-5, calibration="mvg-thm2")


# -- the spec --------------------------------------------------------------------------------
def _spec(store: str, out: str, **overrides) -> dict:
    spec = {
        "name": "cross",
        "input": {"store": store, "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": {"cross-covariance": {"rows": ["f0", "f3"], "cols": ["f1", "f2", "f4"]}},
        "privacy": {"epsilon": 1.0, "delta": 1e-5},
        "output": {"store": out},
    }
    spec.update(overrides)
    return spec


def _col(allocation: dict) -> dict:
    """The default cross query with a ``col_allocation``."""
    return {
        "cross-covariance": {
            "rows": ["f0", "f3"],
            "cols": ["f1", "f2", "f4"],
            "col_allocation": allocation,
        }
    }


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"mechanism": {"algorithm": "equi-modal"}}, "use unimodal"),
        ({"mechanism": {"algorithm": "symmetric"}}, "use unimodal"),
        ({"mechanism": {"directions": {"method": "dp-pca"}}}, "DP-PCA"),
        ({"privacy": {"epsilon": 1.0, "delta": 1e-5, "neighbours": "add-remove"}}, "N0"),
        ({"query": {"cross-covariance": {"rows": ["f0", "f0"], "cols": ["f1"]}}}, "repeat"),
        ({"query": {"cross-covariance": {"rows": [], "cols": ["f1"]}}}, "rows"),
        ({"query": {"cross-covariance": {"rows": ["f0"], "col": ["f1"]}}}, "unknown key"),
        ({"query": {"cross-covariance": {"rows": [True], "cols": ["f1"]}}}, "labels"),
        ({"query": _col({"strategy": "binary", "important": ["f0"]})}, "'f0' is not one of"),
        ({"query": _col({"strategy": "binary", "important": ["f9"]})}, "'f9' is not one of"),
        ({"query": _col({"strategy": "binary", "important": ["f1"], "share": 1.5})}, "share"),
        ({"query": _col({"strategy": "binary", "important": ["f1"], "share": 0})}, "share"),
        ({"query": _col({"strategy": "binary", "important": ["f1"], "share": 1})}, "below 1"),
        ({"query": _col({"strategy": "binary", "important": ["f1"], "share": "0.5"})}, "string"),
        ({"query": _col({"strategy": "binary"})}, "needs important"),
        ({"query": _col({"strategy": "binary", "important": ["f1", "f1"]})}, "repeats"),
        ({"query": _col({"strategy": "uniform", "share": 0.5})}, "only used with"),
        ({"query": _col({"strategy": "custom", "theta": [0.5, 0.5]})}, "2 shares for 3"),
        ({"query": _col({"strategy": "custom", "theta": [0.5, -0.1, 1]})}, "greater than 0"),
        ({"query": _col({"strategy": "max-pnr"})}, "custom"),
        (
            {
                "query": _col({"strategy": "binary", "important": ["f1"]}),
                "mechanism": {"calibration": "mvg-thm2"},
            },
            "calibration: exact",
        ),
    ],
)
def test_the_spec_refuses_what_a_cross_covariance_does_not_offer(change, match):
    with pytest.raises(SpecError, match=match):
        parse_spec(_spec("in.zarr", "out.zarr", **change))


def test_a_bad_col_allocation_is_refused_before_anything_is_written(tmp_path):
    """The release (and the ledger) refuse an unknown column label before any file exists."""
    store = make_input(tmp_path / "in.zarr", data(5, 200), chunk=100)
    spec = _spec(
        store, str(tmp_path / "o.zarr"), query=_col({"strategy": "binary", "important": ["f3"]})
    )
    spec["ledger"] = {
        "path": str(tmp_path / "l.sqlite"),
        "dataset": "d",
        "budget": {"epsilon": 5.0, "delta": 1e-4},
    }
    with pytest.raises(SpecError, match=r"col_allocation\.important: 'f3'"):
        api.release(spec, seed=1, progress=False)
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "l.sqlite").exists()


def test_the_spec_hash_without_a_col_allocation_is_unchanged():
    """A spec without ``col_allocation`` hashes as before the field existed (the digest below
    was computed by the code before it); with one it hashes differently."""
    spec = parse_spec(_spec("in.zarr", "out.zarr"))
    assert spec_hash(spec) == CROSS_SPEC_HASH
    other = parse_spec(_spec("in.zarr", "out.zarr", query=_col({"strategy": "uniform"})))
    assert spec_hash(other) != CROSS_SPEC_HASH


def test_the_spec_form_and_its_kind():
    spec = parse_spec(_spec("in.zarr", "out.zarr"))
    assert spec.query_kind == "cross-covariance"
    assert spec.query.cross_covariance.rows == ["f0", "f3"]
    assert spec.mechanism.algorithm == "unimodal" and spec.mechanism.noise == "lattice"
    assert parse_spec({**_spec("in.zarr", "out.zarr"), "query": "covariance"}).query_kind == (
        "covariance"
    )


def test_labels_are_checked_against_the_input(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(5, 200), chunk=100)
    bad = _spec(store, str(tmp_path / "o.zarr"))
    bad["query"] = {"cross-covariance": {"rows": ["f0"], "cols": ["nope"]}}
    with pytest.raises(DataError, match="nope"):
        api.dry_run(bad)
    store2 = make_input(tmp_path / "in2.zarr", data(5, 200), chunk=100, names=[10, 11, 12, 13, 14])
    spec = _spec(store2, str(tmp_path / "o2.zarr"))
    spec["query"] = {"cross-covariance": {"rows": [14], "cols": [10, 12]}}
    assert api.dry_run(spec).query.rows == (4,)


# -- releases --------------------------------------------------------------------------------
@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_huge_epsilon_is_the_clipped_cross_moment(tmp_path, client, noise):
    X = data(5, 3000, seed=3)
    store = make_input(tmp_path / "in.zarr", X, chunk=512)
    spec = _spec(
        store,
        str(tmp_path / "out.zarr"),
        privacy={"epsilon": 1e9, "delta": 1e-5},
        mechanism={"noise": noise},
    )
    res = api.release(spec, client=client, seed=1, progress=False)
    ds = api.open_release(res.output)
    Xc = np.clip(X, 0, 1)
    want = Xc[[0, 3]] @ Xc[[1, 2, 4]].T / 3000
    got = ds["cross_covariance"]
    assert got.dims == ("feature_row", "feature_col")
    assert list(got["feature_row"].values) == ["f0", "f3"]
    assert list(got["feature_col"].values) == ["f1", "f2", "f4"]
    assert np.allclose(got.values, want, rtol=1e-6, atol=1e-9)
    assert ds["row_cov"].dims == ("feature_row", "feature_row2")
    assert ds.attrs["mvg_dask_query"] == "cross-covariance"
    assert ds.mvg.variable == "cross_covariance"
    std = ds.mvg.noise_std()
    assert std.dims == got.dims and std.shape == (2, 3)
    assert np.allclose(std.values, np.sqrt(np.diag(ds["row_cov"].values))[:, None])


@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_huge_epsilon_with_a_column_allocation(tmp_path, client, noise):
    """``Psi != I``: huge epsilon still gives numpy's ``X_a X_b^T / N`` of the clipped data; the
    published ``col_cov`` is ``diag(psi)`` over the column features, the plan records
    ``col_variances``, and ``noise_std`` is ``sqrt(Sigma_ii psi_j)``."""
    X = data(5, 3000, seed=13)
    store = make_input(tmp_path / "in.zarr", X, chunk=512)
    spec = _spec(
        store,
        str(tmp_path / "out.zarr"),
        privacy={"epsilon": 1e9, "delta": 1e-5},
        mechanism={"noise": noise},
        query=_col({"strategy": "binary", "important": ["f4"], "share": 0.6}),
    )
    res = api.release(spec, client=client, seed=1, progress=False)
    ds = api.open_release(res.output)
    Xc = np.clip(X, 0, 1)
    assert np.allclose(
        ds["cross_covariance"].values, Xc[[0, 3]] @ Xc[[1, 2, 4]].T / 3000, rtol=1e-6, atol=1e-9
    )
    psi = np.array([1 / 0.6, 1 / 0.6, 1 / 1.8])  # theta = (0.2, 0.2, 0.6), mean 1/3
    col = ds["col_cov"]
    assert col.dims == ("feature_col", "feature_col2")
    assert list(col["feature_col2"].values) == ["f1", "f2", "f4"]
    assert np.allclose(col.values, np.diag(psi), rtol=1e-14)
    assert np.allclose(ds.mvg.plan["col_variances"], psi, rtol=1e-14)
    assert np.allclose(ds.mvg.plan["query"]["col_variances"], psi, rtol=1e-14)
    std = ds.mvg.noise_std().values
    want = np.sqrt(np.diag(ds["row_cov"].values))[:, None] * np.sqrt(psi)[None, :]
    assert np.allclose(std, want, rtol=1e-12)


def test_the_plan_with_psi_meets_its_mu_by_brute_force(tmp_path):
    """The resolved plan (``Sigma = diag(row_variances)``, ``Psi = diag(psi)``): the largest
    whitened change ``||A^-1 D B^-T||_F`` over every pair of corners of ``[0, 1]^5`` and 20
    local optimisations is at most the plan's ``Delta_M``, which the exact calibration set to
    the release's ``mu`` (float noise), and the important column gets the smaller noise."""
    from mvg_dask.privacy import calibration as cal

    store = make_input(tmp_path / "in.zarr", data(5, 400), chunk=100)
    spec = _spec(
        store,
        str(tmp_path / "o.zarr"),
        mechanism={"noise": "float"},
        query=_col({"strategy": "binary", "important": ["f2"], "share": 0.8}),
    )
    rplan = api.dry_run(spec)
    plan, q = rplan.noise_plan(), rplan.query
    P = np.diag(1.0 / plan.row_variances)
    Q = 1.0 / q.column_noise_variances
    obj = lambda x, xp: whitened_norm(q, P, x, xp, Q) / q.records  # noqa: E731
    found = max(
        corners(rplan.domain, obj, True),
        maximise(obj, rplan.domain, True, np.random.default_rng(21)),
    )
    mu = cal.analytic_gaussian_mu(1.0, 1e-5)
    assert plan.mahalanobis_sensitivity <= mu * (1 + 1e-12)
    assert found <= plan.mahalanobis_sensitivity * (1 + REL)
    assert found >= 0.5 * plan.mahalanobis_sensitivity  # sqrt(2) bound, factor 1/sqrt(2) room
    std = plan.released_entry_std()
    assert np.all(std[:, 1] < std[:, 0]) and np.allclose(std[:, 0], std[:, 2])


def test_add_remove_with_a_public_normaliser(tmp_path, client):
    """Add-remove neighbours, ``N0`` declared: huge epsilon gives ``X_a X_b^T / N0`` of the
    clipped data, the record count stays out of the public plan."""
    X = data(5, 1000, seed=6)
    store = make_input(tmp_path / "in.zarr", X, chunk=256)
    privacy = {"epsilon": 1e9, "delta": 1e-5, "neighbours": "add-remove", "records": 800}
    spec = _spec(store, str(tmp_path / "out.zarr"), privacy=privacy)
    assert api.dry_run(spec).public_dict()["input"]["records"] is None
    res = api.release(spec, client=client, seed=2, progress=False)
    ds = api.open_release(res.output)
    Xc = np.clip(X, 0, 1)
    assert np.allclose(ds["cross_covariance"].values, Xc[[0, 3]] @ Xc[[1, 2, 4]].T / 800, atol=1e-9)
    plan = ds.mvg.plan
    assert plan["query"]["records_known"] is False
    assert plan["sensitivity"] == pytest.approx(math.sqrt(2.0 * 3.0) / 800)


@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_bytes_do_not_depend_on_the_input_chunking(tmp_path, client, noise):
    """Dyadic data (multiples of 1/4, so every partial Gram sum is exact) in two chunkings, one
    records-first; same seed: the same bytes (any data: tests/test_canonical_blocks.py)."""
    rng = np.random.default_rng(4)
    N = 2000
    X = rng.integers(0, 5, (5, N)) / 4.0
    chunks = (250, 333)
    outs = []
    for i, chunk in enumerate(chunks):
        store = make_input(tmp_path / f"in{i}.zarr", X, chunk=chunk, records_first=i == 1)
        spec = _spec(store, str(tmp_path / f"out{i}.zarr"), mechanism={"noise": noise})
        res = api.release(spec, client=client, seed=5, progress=False)
        outs.append(api.open_release(res.output)["cross_covariance"].values)
    assert chunks[0] != chunks[1]
    assert outs[0].tobytes() == outs[1].tobytes()
    assert not np.allclose(outs[0], X[[0, 3]] @ X[[1, 2, 4]].T / N, atol=1e-6)  # noisy


PSI_COLS = {"strategy": "binary", "important": ["f2"], "share": 0.7}


@pytest.mark.parametrize(
    ("noise", "cols", "col_allocation"),
    [
        ("lattice", ["f1", "f2", "f4"], None),
        ("float", ["f1", "f2", "f4"], None),
        ("float", ["f1", "f2"], None),
        ("lattice", ["f1", "f2", "f4"], PSI_COLS),
        ("float", ["f1", "f2", "f4"], {"strategy": "custom", "theta": [0.1, 0.3, 0.6]}),
        ("float", ["f1", "f2"], PSI_COLS),
    ],
)
def test_noise_std_per_entry_matches_the_plan(tmp_path, noise, cols, col_allocation):
    """The noise of 3,000 independent keys (zero data): each entry's sample variance against
    ``released_entry_std``, a two-sided chi-square test per entry at alpha = 1e-3 / 6
    (Bonferroni), keys from seed 0..2999; a binary allocation, so the rows' stds differ. The
    square case (2 x 2) draws float noise as a matrix, not column tiles. With a column
    allocation the columns' stds differ too (``sqrt(Sigma_ii psi_j)``), and the published
    ``Psi`` has ``tr(Psi^-1) = m_b``."""
    store = make_input(tmp_path / "in.zarr", data(5, 500), chunk=100)
    mech = {
        "noise": noise,
        "allocation": {"strategy": "binary", "important": [1], "share": 0.8},
    }
    spec = _spec(store, str(tmp_path / "o.zarr"), mechanism=mech)
    spec["query"] = {"cross-covariance": {"rows": ["f0", "f3"], "cols": cols}}
    if col_allocation is not None:
        spec["query"]["cross-covariance"]["col_allocation"] = col_allocation
    rplan = api.dry_run(spec)
    psi = rplan.query.column_noise_variances
    assert (psi is None) == (col_allocation is None)
    if psi is not None:
        assert np.sum(1.0 / psi) == pytest.approx(len(cols), rel=1e-14)
    gram = np.zeros((5, 5))
    n = 3000
    draws = np.stack(
        [
            cross_covariance_release(rplan, NoiseKey.from_seed(s).derive("release"), gram)
            for s in range(n)
        ]
    )
    std = rplan.noise_plan().released_entry_std()
    assert std[0, 0] != std[1, 0]
    if psi is not None:  # Var Z_ij = Sigma_ii psi_j
        assert std.shape == (2, len(cols)) and std[0, 0] != std[0, 1]
        rows = np.sqrt(rplan.noise_plan().row_variances)
        assert np.allclose(std, rows[:, None] * np.sqrt(psi)[None, :], rtol=1e-14)
    ratio = draws.var(axis=0, ddof=1) / np.broadcast_to(std**2, draws.shape[1:])
    alpha = 1e-3 / 6
    lo = stats.chi2.ppf(alpha / 2, n - 1) / (n - 1)
    hi = stats.chi2.ppf(1 - alpha / 2, n - 1) / (n - 1)
    assert np.all((lo < ratio) & (ratio < hi)), ratio
    assert np.all(np.abs(draws.mean(axis=0)) < 5 * std / math.sqrt(n))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_dry_run_shows_the_query(tmp_path: Path) -> None:
    store = make_input(tmp_path / "in.zarr", data(5, 500), chunk=100)
    path = write_spec(tmp_path / "spec.yaml", _spec(store, str(tmp_path / "out.zarr")))
    text = _cli(str(path), "--dry-run")
    assert text.returncode == 0, text.stderr
    assert "cross-covariance X_rows X_cols^T / N (2 x 3 of 5 features), N = 500" in text.stdout
    assert "gram -> cross-covariance" in text.stdout
    out = _cli(str(path), "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["plan"]["query"]["kind"] == "cross-covariance"
    assert plan["plan"]["query"]["rows"] == [0, 3] and plan["plan"]["query"]["cols"] == [1, 2, 4]
    assert plan["plan"]["query"]["shape"] == [2, 3]
    assert plan["stages"] == ["gram", "cross-covariance"]
    assert not (tmp_path / "out.zarr").exists()


def test_the_dry_run_shows_psi(tmp_path: Path) -> None:
    """The dry run's query and noise-std lines and its JSON plan carry the column covariance;
    nothing is written."""
    from mvg_dask.plan.presentation import plan_rows, render_text

    store = make_input(tmp_path / "in.zarr", data(5, 500), chunk=100)
    spec = _spec(store, str(tmp_path / "out.zarr"), query=_col(PSI_COLS))
    rplan = api.dry_run(spec)
    text = render_text("plan", plan_rows(rplan))
    psi = rplan.query.column_noise_variances
    assert psi is not None
    assert f"column noise Psi = diag({psi[0]:.4g}, {psi[1]:.4g}, {psi[2]:.4g})" in text
    std = rplan.noise_plan().released_entry_std()
    assert f"{std.min():.4g} .. {std.max():.4g} on each released entry" in text
    plan = rplan.public_dict()["plan"]
    assert plan["query"]["col_variances"] == list(psi) == plan["col_variances"]
    assert not (tmp_path / "out.zarr").exists()


def test_the_accessor_releases_a_cross_covariance(tmp_path: Path, client) -> None:
    """``arr.mvg.release(..., query={"cross-covariance": ...})``: the release, its coordinates
    and ``noise_std`` aligned with it; confidence intervals from the same rule."""
    import xarray as xr

    X = np.random.default_rng(0).uniform(0.05, 0.95, (4, 300))
    arr = xr.DataArray(
        X, dims=("feature", "record"), coords={"feature": ["a", "b", "c", "d"]}, name="X"
    )
    rel = arr.mvg.release(
        tmp_path,
        query={"cross-covariance": {"rows": ["d", "a"], "cols": ["b", "c"]}},
        domain={"box": {"lower": 0.0, "upper": 1.0}},
        privacy={"epsilon": 1.0, "delta": 1e-5},
        release_id="acc",
        client=client,
        seed=3,
        progress=False,
    )
    out = rel["cross_covariance"]
    assert list(out["feature_row"].values) == ["d", "a"]
    assert list(out["feature_col"].values) == ["b", "c"]
    std = rel.mvg.noise_std()
    assert std.dims == out.dims and list(std["feature_row"].values) == ["d", "a"]
    want = X[[3, 0]] @ X[[1, 2]].T / 300
    z = (out.values - want) / std.values
    assert np.all(np.abs(z) < 5)  # 4 entries, |z| < 5 has probability 1 - 2e-6 (seed 3)
    ci = rel.mvg.confidence_intervals(0.95)
    assert ci["lower"].shape == (2, 2)


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    from tests.cluster_helpers import loopback_cluster

    with loopback_cluster(tmp_path_factory.mktemp("cluster")) as address:
        yield address


@pytest.mark.slow
@pytest.mark.parametrize("point", ["reserved", "skeleton", "before-commit", "before-ledger-commit"])
def test_a_killed_release_resumes_identically(tmp_path, loopback, point):
    """SIGKILL at ``point``, then the same command: the bytes of an uninterrupted run with the
    same (pinned) key, charged once."""

    from tests.test_crash import finish_after_a_kill

    store = make_input(tmp_path / "in.zarr", data(5, 3000, seed=4), chunk=500)
    outs = []
    for name, crash in (("ref", None), ("crashed", point)):
        out, ledger = tmp_path / f"{name}.zarr", str(tmp_path / f"{name}.sqlite")
        spec = _spec(store, str(out), release_id=f"cross-{name}")
        spec["ledger"] = {"path": ledger, "dataset": "d", "budget": {"epsilon": 5.0, "delta": 1e-4}}
        spec_path = write_spec(tmp_path / f"{name}.yaml", spec)
        finish_after_a_kill(spec_path, loopback, ledger, crash)
        outs.append(api.open_release(str(out))["cross_covariance"].values.tobytes())
    assert outs[0] == outs[1]


def test_matrix_directions_on_the_row_features(tmp_path, client) -> None:
    """An ``m_a x m_a`` direction matrix (dense whitening; the factor 2, not sqrt(2), on the
    unit box): huge epsilon equals numpy, and a matrix of the input's width is refused."""
    X = data(5, 2000, seed=8)
    store = make_input(tmp_path / "in.zarr", X, chunk=400)
    W = np.linalg.qr(np.random.default_rng(1).standard_normal((2, 2)))[0]
    np.save(tmp_path / "W.npy", W)
    mech = {"directions": {"method": "matrix", "path": str(tmp_path / "W.npy")}}
    spec = _spec(
        store, str(tmp_path / "out.zarr"), mechanism=mech, privacy={"epsilon": 1e9, "delta": 1e-5}
    )
    rplan = api.dry_run(spec)
    q, plan = rplan.query, rplan.noise_plan()
    P = plan.row_precision
    S_a = q.sides(rplan.domain)[0].sup_quadratic(P)
    generic = q.l2_sensitivity(rplan.domain, "replace-one") * math.sqrt(np.linalg.eigvalsh(P)[-1])
    own = 2 * math.sqrt(S_a * 3.0) / 2000  # R_b = 3 on [0, 1]^3; factor 2 (dense P)
    got = q.mahalanobis_sensitivity(rplan.domain, "replace-one", P, "unimodal", directions=W)
    assert got == pytest.approx(min(generic, own), rel=1e-9)
    res = api.release(spec, client=client, seed=4, progress=False)
    out = api.open_release(res.output)["cross_covariance"].values
    Xc = np.clip(X, 0, 1)
    assert np.allclose(out, Xc[[0, 3]] @ Xc[[1, 2, 4]].T / 2000, rtol=1e-6, atol=1e-9)
    np.save(tmp_path / "W.npy", np.eye(5))
    with pytest.raises(DataError, match="directions"):
        api.dry_run(spec)


@pytest.mark.slow
@pytest.mark.parametrize(
    "col_allocation",
    [None, {"strategy": "binary", "important": ["f3"], "share": 0.8}],
    ids=["identity", "psi"],
)
def test_empirical_audit_of_a_worst_case_pair(tmp_path: Path, client, col_allocation) -> None:
    """Clopper-Pearson lower bound on epsilon (tests/audit_helpers.py, alpha = 0.01) from
    30,000 releases of each dataset of a worst-case pair: the corner ``(1, 1, 1, 1)`` of
    ``[-1, 1]^4`` against a record clipped to ``(-1, -1, 1, 1)`` (``a' = -a``, ``b' = b``: the
    whitened shift ``A^-1 D B^-T`` is the plan's ``Delta_M``, tight, with ``Psi = I`` or a
    binary column allocation). The Gram matrices come from the engine's own pass, each trial is
    the stage's :func:`cross_covariance_release` (lattice noise, the default) with the key
    ``--seed s`` gives; seeds 8,000,000 + t. ``eps_lb <= epsilon``."""
    from mvg_dask.engine.stages.context import RunContext
    from mvg_dask.engine.stages.gram import finish_gram, submit_gram
    from mvg_dask.privacy import calibration as cal
    from tests.audit_helpers import (
        CapturedOutput,
        epsilon_lower_bound,
        gaussian_log_lr,
        standardise,
        whiten,
    )

    eps, delta, n, trials, seed = 1.0, 1e-2, 40, 30_000, 8_000_000
    mu = cal.analytic_gaussian_mu(eps, delta)
    X = np.random.default_rng(11).uniform(-1, 1, (4, n))
    X[:, 0] = 1.0
    Y = X.copy()
    Y[:, 0] = [-3.0, -3.0, 3.0, 3.0]  # clipped to (-1, -1, 1, 1)
    plans, grams = [], []
    for tag, data_ in (("d", X), ("d2", Y)):
        store = make_input(tmp_path / f"{tag}.zarr", data_, chunk=16)
        spec = _spec(
            store, str(tmp_path / f"{tag}-out.zarr"), privacy={"epsilon": eps, "delta": delta}
        )
        spec["domain"] = {"box": {"lower": -1.0, "upper": 1.0}, "on_violation": "clip"}
        spec["query"] = {"cross-covariance": {"rows": ["f0", "f1"], "cols": ["f2", "f3"]}}
        if col_allocation is not None:
            spec["query"]["cross-covariance"]["col_allocation"] = col_allocation
        rplan = api.dry_run(spec)
        ctx = RunContext(client, NoiseKey.from_seed(0), CapturedOutput(), progress=False)  # type: ignore[arg-type]
        plans.append(rplan)
        grams.append(finish_gram(ctx, rplan, submit_gram(ctx, rplan)))
    plan = plans[0].noise_plan()
    B = plan.row_factor
    psi = plan.query.column_noise_variances
    col = np.ones(2) if psi is None else np.sqrt(psi)  # B_Psi = diag(sqrt(psi))
    assert (psi is None) == (col_allocation is None)
    f_d, f_d2 = (plans[0].query.finalize(g) for g in grams)
    shift = whiten(f_d2 - f_d, B, False) / col
    assert float(np.linalg.norm(shift)) == pytest.approx(plan.mahalanobis_sensitivity, rel=1e-9)
    assert plan.release_sensitivity == pytest.approx(mu, rel=1e-9)

    def statistic(rplan, gram, first: int) -> np.ndarray:
        runs = np.stack(
            [
                cross_covariance_release(
                    rplan, NoiseKey.from_seed(first + t).derive("release"), gram
                )
                for t in range(trials)
            ]
        )
        return standardise(gaussian_log_lr(whiten(runs - f_d, B, False) / col, shift), mu)

    t0 = statistic(plans[0], grams[0], seed)
    t1 = statistic(plans[1], grams[1], seed + trials)
    result = epsilon_lower_bound(t0, t1, delta)
    print(
        f"\naudit cross-covariance replace-one (unimodal, exact, lattice, "
        f"{'Psi = I' if psi is None else 'Psi from col_allocation'}): {result.describe(eps)}"
    )
    assert 0.5 * eps < result.epsilon_lower <= eps


@pytest.mark.parametrize("col_allocation", [None, PSI_COLS], ids=["identity", "psi"])
def test_the_stage_function_is_the_release(tmp_path: Path, client, col_allocation) -> None:
    """A release with ``--seed s`` publishes ``cross_covariance_release(plan, key(s), gram)``
    bit for bit (what the audit and the Monte Carlo sample), the Gram of the engine's pass."""
    from mvg_dask.engine.stages.context import RunContext
    from mvg_dask.engine.stages.gram import finish_gram, submit_gram
    from tests.audit_helpers import CapturedOutput

    store = make_input(tmp_path / "in.zarr", data(5, 700, seed=9), chunk=128)
    spec = _spec(store, str(tmp_path / "out.zarr"))
    if col_allocation is not None:
        spec["query"] = _col(col_allocation)
    rplan = api.dry_run(spec)
    ctx = RunContext(client, NoiseKey.from_seed(0), CapturedOutput(), progress=False)  # type: ignore[arg-type]
    gram = finish_gram(ctx, rplan, submit_gram(ctx, rplan))
    trial = cross_covariance_release(rplan, NoiseKey.from_seed(77).derive("release"), gram)
    res = api.release(spec, client=client, seed=77, progress=False)
    published = api.open_release(res.output)["cross_covariance"].values
    assert published.tobytes() == trial.tobytes()
