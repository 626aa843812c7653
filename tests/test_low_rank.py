"""Identity-plus-low-rank noise covariances and the top-k DP-PCA of wide releases.

``Sigma = v_c I + U diag(v_U - v_c) U^T`` is all a wide release holds of DP-PCA's directions
(``U`` is ``m x k``); its factor is ``B = Sigma^(1/2)`` and a record is whitened by
``P^(1/2)``. Checked here against independent computations:

* every bound over a record domain against the dense formulas (``P`` formed as a matrix) and
  against brute force over the box's vertices (the suprema of convex functions);
* the Mahalanobis sensitivity against its definition, maximised by brute force over vertex pairs;
* the blockwise noise against the dense product ``B M B`` (and ``B N``), and its law against the
  closed-form entry variances by Monte Carlo;
* the subspace iteration against ``numpy.linalg.eigh``;
* the engine's blockwise DP-PCA release against the whole-matrix one, its refusals, the bytes
  whatever the blocking, and neighbouring datasets.
"""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.errors import DataError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import feature_blocks, low_rank_noise_block, low_rank_projection_block
from mvg_dask.plan import BoxDomain, build_noise_plan
from mvg_dask.plan.directions import Directions, top_k_directions
from mvg_dask.plan.domain import L2BallDomain
from mvg_dask.plan.low_rank import LowRankPrecision, low_rank_factor
from mvg_dask.plan.noise_plan import Allocation
from mvg_dask.plan.queries import CovarianceQuery
from mvg_dask.privacy import sensitivity as sens
from tests.pipeline_helpers import make_input

SEED = 11


def _precision(m: int, k: int, seed: int) -> LowRankPrecision:
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.normal(size=(m, k)))[0]
    return LowRankPrecision(U, rng.uniform(0.5, 6.0, k), float(rng.uniform(0.2, 1.0)))


def _boxes(m: int) -> list[BoxDomain]:
    rng = np.random.default_rng(3)
    lo = rng.uniform(-1.0, 0.5, m)
    return [
        BoxDomain.create(0.0, 1.0, m),
        BoxDomain.create(-1.0, 1.0, m),
        BoxDomain.create(lo, lo + rng.uniform(0.2, 1.5, m), m),
    ]


def _vertices(domain: BoxDomain) -> np.ndarray:
    return np.array(list(itertools.product(*zip(domain.lower, domain.upper, strict=True))))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bounds_equal_the_dense_formulas_and_dominate_brute_force(seed) -> None:
    """m = 8, k = 2 (``ROW_BLOCK`` forced to 3, so the row loop runs): ``T`` equals the dense
    ``coordinate_sups`` of ``P^(1/2)``; ``sup x^T P x`` and ``sup (x - x')^T P (x - x')`` are at
    most the dense Lemma-5 bounds and at least their exact value over the 256 vertices."""
    import mvg_dask.plan.low_rank as lr

    m = 8
    P = _precision(m, 2, seed)
    Pd = P.dense()
    vals, vecs = np.linalg.eigh(Pd)
    root = (vecs * np.sqrt(vals)) @ vecs.T
    old = lr.ROW_BLOCK
    lr.ROW_BLOCK = 3
    lr._CACHE.clear()
    try:
        for domain in _boxes(m):
            T, definite = P.coordinate_sups(domain)
            Td, definite_d = domain.coordinate_sups(root, np.ones(m))
            np.testing.assert_allclose(T, Td, rtol=1e-12, atol=1e-14)
            assert definite == definite_d
            V = _vertices(domain)
            exact = float(np.max(np.einsum("vi,ij,vj->v", V, Pd, V)))
            S = P.sup_quadratic(domain)
            assert exact * (1 - 1e-12) <= S <= domain.sup_quadratic(Pd) * (1 + 1e-12)
            D = _vertices(BoxDomain.create(-domain.widths, domain.widths, m))
            exact_diff = float(np.max(np.einsum("vi,ij,vj->v", D, Pd, D)))
            diff = P.sup_quadratic_diff(domain)
            assert exact_diff * (1 - 1e-12) <= diff <= domain.sup_quadratic_diff(Pd) * (1 + 1e-12)
    finally:
        lr.ROW_BLOCK = old
        lr._CACHE.clear()
    ball = L2BallDomain(1.5, m)
    T, definite = P.coordinate_sups(ball)
    np.testing.assert_allclose(T, 1.5**2 * np.diag(Pd), rtol=1e-12)
    assert not definite
    assert P.sup_quadratic(ball) == pytest.approx(1.5**2 * vals.max(), rel=1e-12)


@pytest.mark.parametrize("algorithm", ["symmetric", "equi-modal", "unimodal"])
@pytest.mark.parametrize("neighbours", ["replace-one", "add-remove"])
def test_mahalanobis_sensitivity_dominates_its_definition(algorithm, neighbours) -> None:
    """The definition ``sup ||vech_r(P^(1/2) D P^(1/2))|| / sqrt(r)`` (symmetric; ``r = 1/2``
    for equi-modal: ``||.||_F``) or ``||P^(1/2) D||_F`` (unimodal), ``D = (x x^T - x' x'^T) /
    N``, maximised by brute force over all pairs of the 64 vertices of three boxes in 6
    dimensions, never exceeds the bound."""
    m, N = 6, 10
    P = _precision(m, 2, 7)
    vals, vecs = np.linalg.eigh(P.dense())
    root = (vecs * np.sqrt(vals)) @ vecs.T
    query = CovarianceQuery(m, N)
    r = 2.5 if algorithm == "symmetric" else 0.5
    iu = np.triu_indices(m, 1)
    for domain in _boxes(m):
        bound = query.mahalanobis_sensitivity(
            domain, neighbours, P, algorithm, ratio=r if algorithm == "symmetric" else None
        )
        V = _vertices(domain)
        Y = V @ root  # whitened records (root is symmetric)
        outer = np.einsum("vi,vj->vij", Y, Y)
        pairs = outer[:, None] - outer[None, :] if neighbours == "replace-one" else outer[:, None]
        if algorithm == "unimodal":
            X = np.einsum("vi,vj->vij", V, V)
            D = X[:, None] - X[None, :] if neighbours == "replace-one" else X[:, None]
            worst = float(np.max(np.linalg.norm(np.einsum("ij,abjk->abik", root, D), axis=(2, 3))))
        else:
            off = pairs[..., iu[0], iu[1]]
            diag = np.diagonal(pairs, axis1=-2, axis2=-1)
            q = np.sum(off**2, axis=-1) + r * np.sum(diag**2, axis=-1)
            worst = float(np.sqrt(np.max(q) / r))
        assert worst / N <= bound * (1 + 1e-12), (domain, worst / N, bound)
        assert bound <= 30 * worst / N  # and not absurdly loose


def test_plans_with_low_rank_directions_match_the_dense_plan_where_the_law_is_the_same() -> None:
    """Equi-modal and unimodal noise have laws that depend on ``Sigma`` only: the low-rank plan
    of ``U`` and the dense plan of ``W = [U, U_perp]`` get the same variances on a [0, 1] box
    (the same Lemma-5 bound); their ``theorem_check`` holds; the plan round-trips through its
    dictionary with the ``m x k`` matrix."""
    from mvg_dask.plan.noise_plan import noise_plan_from_dict

    m, k, N = 60, 3, 500
    rng = np.random.default_rng(1)
    U = np.linalg.qr(rng.normal(size=(m, k)))[0]
    W = np.linalg.qr(np.hstack([U, rng.normal(size=(m, m - k))]))[0]
    W[:, :k] = U
    domain = BoxDomain.create(0.0, 1.0, m)
    query = CovarianceQuery(m, N)
    for algorithm in ("equi-modal", "unimodal", "symmetric"):
        plans = [
            build_noise_plan(
                query,
                domain,
                epsilon=1.0,
                delta=1e-6,
                algorithm=algorithm,
                directions=d,
                allocation=Allocation(strategy="binary"),
            )
            for d in (Directions("dp-pca", W, tuple(range(k))), Directions.low_rank(U, (0, 1, 2)))
        ]
        dense, low = plans
        if algorithm != "symmetric":  # symmetric noise's law depends on the factor's basis
            np.testing.assert_allclose(low.row_variances, dense.row_variances, rtol=1e-10)
        lhs, rhs = low.theorem_check()
        assert lhs <= rhs * (1 + 1e-9)
        np.testing.assert_allclose(
            low.row_cov,
            dense.row_cov if algorithm != "symmetric" else low.row_factor @ low.row_factor,
            rtol=1e-10,
            atol=1e-12,
        )
        again = noise_plan_from_dict(json.loads(json.dumps(low.to_dict())))
        assert again.directions.is_low_rank
        np.testing.assert_array_equal(again.row_variances, low.row_variances)


def test_refusals_of_low_rank_directions() -> None:
    """Allocations that need every direction, and unequal complement variances, are refused."""
    m = 20
    U = np.linalg.qr(np.random.default_rng(0).normal(size=(m, 2)))[0]
    low = Directions.low_rank(U, (0, 1))
    query = CovarianceQuery(m, 100)
    domain = BoxDomain.create(0.0, 1.0, m)
    with pytest.raises(ValueError, match="needs every direction"):
        build_noise_plan(
            query,
            domain,
            epsilon=1.0,
            delta=1e-6,
            directions=low,
            allocation=Allocation(strategy="max-pnr"),
        )
    with pytest.raises(ValueError, match="one noise variance"):
        build_noise_plan(
            query,
            domain,
            epsilon=1.0,
            delta=1e-6,
            directions=low,
            allocation=Allocation(strategy="binary", important=[0, 5]),
        )
    with pytest.raises(ValueError, match="not orthonormal"):
        Directions.low_rank(U * 2.0)
    with pytest.raises(ValueError, match="1 <= k < m"):
        Directions.low_rank(np.eye(4))


@pytest.mark.parametrize("algorithm", ["symmetric", "equi-modal", "unimodal"])
def test_blockwise_noise_is_the_dense_product(algorithm) -> None:
    """600 features (three grid blocks): the blocks of :func:`low_rank_noise_block` assemble to
    the plan's own dense draw (``B M B`` or ``B N`` with ``B = Sigma^(1/2)``) to rounding, and the
    symmetric kinds are exactly symmetric."""
    m, k = 600, 4
    U = np.linalg.qr(np.random.default_rng(2).normal(size=(m, k)))[0]
    plan = build_noise_plan(
        CovarianceQuery(m, 5000),
        BoxDomain.create(-1.0, 1.0, m),
        epsilon=1.0,
        delta=1e-6,
        algorithm=algorithm,
        directions=Directions.low_rank(U, tuple(range(k))),
        allocation=Allocation(strategy="binary", share=0.6),
    )
    key = NoiseKey.from_seed(4)
    dense = plan.draw(key)
    a, delta = low_rank_factor(U, plan.row_variances)
    nb = len(feature_blocks(m))
    ratio = plan.symmetric_ratio
    proj = np.vstack([low_rank_projection_block(key, U, algorithm, ratio, i) for i in range(nb)])
    core = None if algorithm == "unimodal" else (U.T @ proj + (U.T @ proj).T) / 2.0
    out = np.block(
        [
            [
                low_rank_noise_block(key, U, a, delta, algorithm, ratio, proj, core, i, j)
                for j in range(nb)
            ]
            for i in range(nb)
        ]
    )
    np.testing.assert_allclose(out, dense, rtol=0, atol=1e-12 * np.max(np.abs(dense)))
    if algorithm != "unimodal":
        assert np.array_equal(out, out.T)


def test_blockwise_noise_has_the_planned_entry_variances() -> None:
    """Monte Carlo (seeds 0..299, alpha ~ 6e-7 per statistic, normal approximation): 300 draws
    of the blockwise symmetric noise of 300 features. Per draw, the mean of ``Z_ij^2 / Var Z_ij``
    (``Var`` from the closed form of ``symmetric_entry_std`` of ``B``) over the diagonal and over
    the upper triangle; over the draws each is 1 within 5 standard errors. The top direction's
    ``u^T Z u`` has the variance of an independent closed form."""
    m, k, draws = 300, 2, 300
    U = np.linalg.qr(np.random.default_rng(9).normal(size=(m, k)))[0]
    plan = build_noise_plan(
        CovarianceQuery(m, 2000),
        BoxDomain.create(0.0, 1.0, m),
        epsilon=1.0,
        delta=1e-6,
        algorithm="symmetric",
        directions=Directions.low_rank(U, (0, 1)),
        allocation=Allocation(strategy="binary", share=0.9),
    )
    var = plan.released_entry_std() ** 2
    a, delta = low_rank_factor(U, plan.row_variances)
    r = plan.symmetric_ratio
    nb = len(feature_blocks(m))
    iu = np.triu_indices(m, 1)
    diag, off, along = np.zeros(draws), np.zeros(draws), np.zeros(draws)
    for t in range(draws):
        key = NoiseKey.from_seed(t)
        proj = np.vstack([low_rank_projection_block(key, U, "symmetric", r, i) for i in range(nb)])
        core = (U.T @ proj + (U.T @ proj).T) / 2.0
        Z = np.block(
            [
                [
                    low_rank_noise_block(key, U, a, delta, "symmetric", r, proj, core, i, j)
                    for j in range(nb)
                ]
                for i in range(nb)
            ]
        )
        ratio = Z**2 / var
        diag[t], off[t] = np.mean(np.diag(ratio)), np.mean(ratio[iu])
        along[t] = U[:, 0] @ Z @ U[:, 0]
    # the draws are independent: each statistic's mean is 1 within 5 of its standard errors
    for stat in (diag, off):
        assert abs(stat.mean() - 1.0) < 5 * stat.std(ddof=1) / np.sqrt(draws)
    # u^T Z u = v_1 u^T S u for u = U[:, 0] (B u = sqrt(v_1) u): Var(u^T S u) = 2r + (1 - 2r)
    # sum u_i^4, a closed form independent of the one entry_std uses
    u = U[:, 0]
    expected = plan.row_variances[0] ** 2 * (2 * r + (1 - 2 * r) * np.sum(u**4))
    assert abs(np.mean(along**2) - expected) < 5 * expected * np.sqrt(2 / draws)


def test_top_k_directions_are_the_top_eigenvectors() -> None:
    """A noisy Gram matrix with a spectral gap (eigenvalues 100, 60, 30 over noise of norm ~ 4):
    the subspace iteration finds the top three eigenvectors of ``numpy.linalg.eigh`` (principal
    cosines > 1 - 1e-9) and their eigenvalues (to 1e-9), in decreasing order, through products
    only."""
    m, k = 300, 3
    rng = np.random.default_rng(6)
    V = np.linalg.qr(rng.normal(size=(m, k)))[0]
    E = rng.normal(size=(m, m)) * 0.1
    G = (V * [100.0, 60.0, 30.0]) @ V.T + (E + E.T) / 2
    calls = []

    def apply(Q: np.ndarray) -> np.ndarray:
        calls.append(Q.shape)
        return G @ Q

    d = top_k_directions(apply, m, k, start=NoiseKey.from_seed(1), records=10.0)
    vals, vecs = np.linalg.eigh(G)
    top = vecs[:, ::-1][:, :k]
    assert d.is_low_rank and d.important == (0, 1, 2)
    np.testing.assert_allclose(np.linalg.svd(d.matrix.T @ top)[1], 1.0, atol=1e-9)
    np.testing.assert_allclose(d.eigenvalues, vals[::-1][:k] / 10.0, rtol=1e-9)
    assert all(shape == (m, k + 10) for shape in calls)


# -- the engine ----------------------------------------------------------------------------------
M = 600
N = 1500


def _spec(store: str, out: str, **kw: Any) -> dict[str, Any]:
    chunk = kw.pop("matrix_chunk", 256)
    mechanism = {
        "algorithm": kw.pop("algorithm", "symmetric"),
        "directions": {"method": "dp-pca", "k": 3, "budget_share": 0.3},
        "allocation": {"strategy": "binary"},
        "noise": kw.pop("noise", "lattice"),
    }
    mechanism |= kw.pop("mechanism", {})
    return {
        "name": "wide-pca",
        "release_id": kw.pop("release_id", "wide-pca-1"),
        "input": {"store": store},
        "domain": {
            **kw.pop("domain", {"box": {"lower": 0.0, "upper": 1.0}}),
            "on_violation": "clip",
        },
        "query": "covariance",
        "mechanism": mechanism,
        "privacy": {"epsilon": 1.0, "delta": 1e-6, **kw.pop("privacy", {})},
        "output": {"store": out, **({"matrix_chunk": chunk} if chunk else {})},
    }


@pytest.fixture(scope="module")
def structured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Records with three strong directions: Gram eigenvalues about ``N s^2`` = 54,000, 30,000 and
    13,500 above the mean's, against DP-PCA noise of spectral norm about 6,000 at epsilon = 20
    (at epsilon = 1 no direction but the mean's stands out of the noise, and the top k of any
    method are noise)."""
    root = tmp_path_factory.mktemp("lowrank")
    rng = np.random.default_rng(5)
    A = np.linalg.qr(rng.normal(size=(M, 3)))[0]
    X = np.clip(0.5 + (A * [6.0, 4.5, 3.0]) @ rng.normal(size=(3, N)), 0.0, 1.0)
    return {
        "X": X,
        "data": make_input(root / "data.zarr", X, chunk=500),
        "zero": make_input(root / "zero.zarr", np.zeros((M, N)), chunk=500),
    }


def _release(spec: dict[str, Any], client: Any) -> Any:
    api.release(spec, client=client, seed=SEED, progress=False)
    return api.open_release(spec["output"]["store"])


@pytest.mark.parametrize("noise", ["lattice", "float"])
@pytest.mark.parametrize("algorithm", ["symmetric", "equi-modal", "unimodal"])
def test_blockwise_dp_pca_release(structured, tmp_path, client, algorithm, noise) -> None:
    """A blockwise DP-PCA covariance: the published ``m x k`` directions span the whole-matrix
    release's top three (the same noisy Gram matrix up to rounding; principal cosines > 0.999),
    the eigenvalues agree, the published ``row_cov`` is the plan's ``Sigma``, the output is
    exactly symmetric (symmetric kinds), and its error is that of the whole-matrix release
    within 10 %; no scratch array is left behind."""
    X = structured["X"]
    privacy = {"epsilon": 20.0}
    blocked = _release(
        _spec(
            structured["data"],
            str(tmp_path / "b.zarr"),
            algorithm=algorithm,
            privacy=privacy,
            noise=noise,
        ),
        client,
    )
    whole = _release(
        _spec(
            structured["data"],
            str(tmp_path / "w.zarr"),
            algorithm=algorithm,
            matrix_chunk=None,
            privacy=privacy,
            noise=noise,
        ),
        client,
    )
    Ub = blocked["directions"].values
    assert Ub.shape == (M, 3) and blocked["directions"].dims[1] == "component"
    Uw = whole["directions"].values[:, :3]
    assert np.all(np.linalg.svd(Ub.T @ Uw)[1] > 0.999)
    np.testing.assert_allclose(
        blocked["dp_pca_eigenvalues"].values, whole["dp_pca_eigenvalues"].values[:3], rtol=1e-6
    )
    v = blocked["noise_variances"].values
    sigma = v[3] * np.eye(M) + (Ub * (v[:3] - v[3])) @ Ub.T
    np.testing.assert_allclose(blocked["row_cov"].values, sigma, rtol=1e-12, atol=1e-12 * v.max())
    cov = blocked["covariance"].values
    if algorithm != "unimodal":
        assert np.array_equal(cov, cov.T)
    truth = X @ X.T / N
    err_b = np.linalg.norm(cov - truth)
    err_w = np.linalg.norm(whole["covariance"].values - truth)
    assert 0.9 * err_w < err_b < 1.1 * err_w
    assert not any(p.name.endswith("dp-pca") for p in (tmp_path / "b.zarr").rglob("*"))


@pytest.mark.parametrize(
    ("noise", "data"),
    # float panels sum the Gram matrix in panel-sized BLAS calls: bytes equal on zero data only
    [("lattice", "zero"), ("float", "zero"), ("lattice", "data")],
)
def test_blockwise_dp_pca_bytes_do_not_depend_on_the_blocking(
    structured, tmp_path, client, noise, data
) -> None:
    """Panels of 256 and of 512 publish the same bytes in every variable, the DP-PCA directions
    included: on all-zero data (the noisy Gram matrix is the grid's noise) with either noise,
    and on the structured data with lattice noise (every product grid block by grid block)."""
    outs = [
        _release(
            _spec(structured[data], str(tmp_path / f"z{c}.zarr"), matrix_chunk=c, noise=noise),
            client,
        )
        for c in (256, 512)
    ]
    for name in outs[0].data_vars:
        assert outs[0][name].values.tobytes() == outs[1][name].values.tobytes(), name


def test_blockwise_dp_pca_refusals(structured, tmp_path) -> None:
    """Refused at planning (nothing read): user matrices, allocations needing every direction,
    ``k >= m`` and important directions beyond ``k``."""
    base = _spec(structured["data"], str(tmp_path / "x.zarr"))
    np.save(tmp_path / "w.npy", np.eye(M))
    cases = [
        ({"allocation": {"strategy": "max-pnr"}}, "uniform or binary"),
        ({"directions": {"method": "dp-pca", "k": M}}, "needs k < 600"),
        ({"allocation": {"strategy": "binary", "important": [0, 5]}}, "must lie in 0..2"),
        ({"directions": {"method": "matrix", "path": str(tmp_path / "w.npy")}}, "no m x m matrix"),
    ]
    for mech, message in cases:
        raw = {**base, "mechanism": {**base["mechanism"], **mech}}
        with pytest.raises(DataError, match=message):
            api.dry_run(raw)
    plan = api.dry_run(base)
    published = plan.public_dict()["plan"]
    assert published["directions"]["matrix"] is None and published["row_variances"] is None


def test_low_rank_bound_sanity_against_the_whitened_vertices() -> None:
    """``outer_weighted_sup`` with the low-rank ``T`` and ``S`` bounds ``Q_r`` of whitened vertex
    pairs (the ingredients of the symmetric bound, checked directly)."""
    m = 6
    P = _precision(m, 2, 11)
    vals, vecs = np.linalg.eigh(P.dense())
    root = (vecs * np.sqrt(vals)) @ vecs.T
    domain = BoxDomain.create(-0.5, 1.0, m)
    T, definite = P.coordinate_sups(domain)
    S = P.sup_quadratic(domain)
    Y = _vertices(domain) @ root
    assert np.all(Y**2 <= T * (1 + 1e-12))
    assert np.max(np.sum(Y**2, axis=1)) <= S * (1 + 1e-12)
    q = sens.outer_weighted_sup(T, S, ratio=1.0, replace_one=True, sign_definite=definite)
    outer = np.einsum("vi,vj->vij", Y, Y)
    D = outer[:, None] - outer[None, :]
    iu = np.triu_indices(m, 1)
    worst = np.max(np.sum(D[..., iu[0], iu[1]] ** 2, -1) + np.sum(np.diagonal(D, 0, 2, 3) ** 2, -1))
    assert worst <= q * (1 + 1e-12)


def test_bad_data_in_the_dp_pca_pass_is_a_clear_error_and_nothing_is_published(
    tmp_path, client
) -> None:
    """A NaN met by the DP-PCA pass: one clean DataError, no output, no staging or scratch."""
    X = np.random.default_rng(2).random((M, 700))
    X[400, 650] = np.nan
    store = make_input(tmp_path / "nan.zarr", X, chunk=350)
    out = tmp_path / "nan-out.zarr"
    with pytest.raises(DataError, match="NaN or infinite"):
        api.release(_spec(store, str(out)), client=client, progress=False)
    assert not out.exists()
    assert not list(tmp_path.glob("nan-out.zarr.staging-*"))


@pytest.mark.parametrize("algorithm", ["symmetric", "equi-modal", "unimodal"])
def test_blockwise_lattice_release_is_the_whole_matrix_sequence(
    structured, tmp_path, client, algorithm
) -> None:
    """A wide lattice release with DP-PCA directions publishes ``A T A^T`` (``A T`` unimodal;
    the two-sided noises symmetrised), ``T = 2^k (rint(g / 2^k) + K)`` with ``g`` the low-rank
    whitening sequence of docs/bounds.md Lemma 11.5 (``tests/test_float_error.py``'s reference,
    ``engine_whiten``) applied to the whole ``X X^T / N`` and ``K`` the noise grid's integers:
    computed here on whole matrices from the published directions, the plan rebuilt from the
    release and the key. Agreement within ``1e-9`` relative and a few grid steps (an entry of
    ``g`` on a rounding boundary may round the other way between the engine's blocked sums and
    numpy's). The DP-PCA step ran on the lattice too: its directions span the top 3 of
    :func:`mvg_dask.engine.lattice.gram_step` on the whole Gram matrix."""
    from mvg_dask.engine.lattice import from_lattice, symmetric_values, to_lattice
    from mvg_dask.engine.lattice import gram_step as lattice_gram_step
    from mvg_dask.noise.tiles import square_lattice_block
    from mvg_dask.plan.low_rank import dense_low_rank
    from mvg_dask.privacy.float_error import Whitening
    from tests.test_float_error import engine_whiten

    X = structured["X"]
    spec = _spec(
        structured["data"], str(tmp_path / "b.zarr"), algorithm=algorithm, privacy={"epsilon": 20.0}
    )
    ds = _release(spec, client)
    assert ds.attrs["mvg_dask_noise"] == "lattice"
    plan = ds.mvg.noise_plan()
    assert plan.lattice is not None and plan.directions.is_low_rank
    U = ds["directions"].values
    a, delta = low_rank_factor(U, plan.row_variances)
    k, s = plan.lattice.log2_grid, plan.lattice.scale
    f = X @ X.T / N
    g = engine_whiten(f, Whitening.low_rank(U, a, delta), algorithm != "unimodal")
    key = NoiseKey.from_seed(SEED).derive("release")
    blocks = feature_blocks(M)
    T = np.zeros((M, M))
    for i, (p, q) in enumerate(blocks):
        for j, (c, d) in enumerate(blocks):
            gb = np.ascontiguousarray(g[p:q, c:d])
            if algorithm == "symmetric":
                if i <= j:
                    grid_of = SimpleNamespace(log2_grid=k, scale=s)
                    T[p:q, c:d] = symmetric_values(
                        gb, i == j, plan.symmetric_ratio, key, M, i, j, grid_of
                    )
                    T[c:d, p:q] = T[p:q, c:d].T
            else:
                t = to_lattice(gb, k) + square_lattice_block(key, M, i, j, s)
                T[p:q, c:d] = from_lattice(t, k)
    A = dense_low_rank(U, a + delta, a)
    want = A @ T if algorithm == "unimodal" else A @ T @ A.T
    if algorithm != "unimodal":
        want = (want + want.T) / 2
    got = ds["covariance"].values
    grid = np.ldexp(1.0, k) * float(np.abs(A).max()) ** 2 * M
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=4 * grid)
    # DP-PCA's step on the lattice
    rplan = api.dry_run(spec)
    step = rplan.dp_pca
    assert step is not None and step.lattice is not None
    sigma = step.noise_std(rplan.domain, rplan.neighbours, rplan.budgets.step_mu)
    noisy = lattice_gram_step(
        X @ X.T, step.lattice, sigma, NoiseKey.from_seed(SEED).derive("dp-pca")
    )
    top = np.linalg.eigh(noisy)[1][:, -3:]
    assert np.all(np.linalg.svd(U.T @ top)[1] > 0.999)


def test_lattice_refuses_a_float_error_it_cannot_absorb(structured, tmp_path) -> None:
    """Add-remove with the default ``max_records = 2^32``: the low-rank whitening's float error
    bound over sums of 2^32 records exceeds the release's mu, so the plan refuses (nothing
    read), naming the remedies; a declared bound of 10^5 records plans."""
    spec = _spec(structured["data"], str(tmp_path / "x.zarr"))
    spec["privacy"] |= {"neighbours": "add-remove", "epsilon": 1.0}
    with pytest.raises(DataError, match=r"cannot absorb.*max_records"):
        api.dry_run(spec)
    assert not (tmp_path / "x.zarr").exists()
    spec["privacy"]["max_records"] = 100_000
    lattice = api.dry_run(spec).dp_pca.lattice
    assert lattice is not None and lattice.relative_inflation < 1e-3
