"""Noise covariances and queries as types.

The three covariance forms (:mod:`mvg_dask.plan.covariance`) against the dense formulas of
``Sigma = W diag(v) W^T``, and the query registry (:mod:`mvg_dask.plan.queries`): names, JSON
round trips, the blueprint's partial / combine / finalize against the query's definition, and
the compatibility constructor the release plan still uses.
"""

from __future__ import annotations

import numpy as np
import pytest

from mvg_dask.plan import (
    QUERIES,
    QUERY_TYPES,
    BoxDomain,
    CovarianceQuery,
    CustomQuery,
    Dense,
    Diagonal,
    Directions,
    IdentityQuery,
    LowRank,
    Query,
    build_noise_plan,
    make_query,
    query_from_dict,
)
from mvg_dask.plan.covariance import EntryLaw, NoiseCovariance, symmetric_entry_std
from mvg_dask.plan.queries import CrossCovarianceQuery

M, K = 7, 2


def _forms() -> list[tuple[NoiseCovariance, np.ndarray, np.ndarray]]:
    """Each form with its dense ``Sigma`` and a factor ``B`` (``B B^T = Sigma``)."""
    rng = np.random.default_rng(5)
    v = rng.uniform(0.5, 3.0, M)
    W = np.linalg.qr(rng.normal(size=(M, M)))[0]
    U = W[:, :K]
    v_low = np.concatenate([v[:K], np.full(M - K, v[K])])
    low = U @ np.diag(v_low[:K] - v_low[K]) @ U.T + v_low[K] * np.eye(M)
    return [
        (Directions.standard(M).covariance(v), np.diag(v), np.diag(np.sqrt(v))),
        (Directions.from_matrix(W).covariance(v), W @ np.diag(v) @ W.T, W * np.sqrt(v)),
        (Directions.low_rank(U).covariance(v_low), low, np.linalg.cholesky(low)),
    ]


@pytest.mark.parametrize("index", range(3))
def test_forms_agree_with_the_dense_covariance(index: int) -> None:
    cov, Sigma, _ = _forms()[index]
    assert type(cov) is (Diagonal, Dense, LowRank)[index]
    np.testing.assert_allclose(cov.dense(), Sigma, atol=1e-12)
    np.testing.assert_allclose(cov.diag(), np.diag(Sigma), atol=1e-12)
    np.testing.assert_allclose(cov.precision(), np.linalg.inv(Sigma), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cov.factor() @ cov.factor().T, Sigma, atol=1e-12)
    np.testing.assert_allclose(cov.eigenvalues(), np.linalg.eigvalsh(Sigma), rtol=1e-9)
    for rows, cols in [((0, 3), (0, 3)), ((0, 3), (3, 7)), ((2, 5), (1, 6))]:
        np.testing.assert_allclose(
            cov.block(rows, cols), Sigma[rows[0] : rows[1], cols[0] : cols[1]], atol=1e-12
        )


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("ratio", [0.5, 0.8])
def test_entry_stds_follow_their_law(index: int, ratio: float) -> None:
    cov, Sigma, _ = _forms()[index]
    d = np.diag(Sigma)
    np.testing.assert_allclose(cov.entry_std(EntryLaw("rows")), np.sqrt(d)[:, None])
    np.testing.assert_allclose(cov.entry_std(EntryLaw("outer")), np.sqrt(np.outer(d, d)))
    law = EntryLaw("symmetric", ratio)
    expected = symmetric_entry_std(cov.factor(), ratio)
    np.testing.assert_allclose(cov.entry_std(law), expected, rtol=1e-9)
    # the closed-form ranges of the diagonal form are those of the stds themselves
    for law in (EntryLaw("rows"), EntryLaw("outer"), EntryLaw("symmetric", ratio)):
        std = np.broadcast_to(cov.entry_std(law), (M, M))
        on, off = cov.std_ranges(law, (M, M), square=True)
        assert off is not None
        np.testing.assert_allclose(on, (np.diag(std).min(), np.diag(std).max()), rtol=1e-12)
        rest = std[~np.eye(M, dtype=bool)]
        np.testing.assert_allclose(off, (rest.min(), rest.max()), rtol=1e-12)


def test_the_plan_takes_its_matrices_from_its_covariance() -> None:
    plan = build_noise_plan(
        CovarianceQuery(M, 100),
        BoxDomain.create(0, 1, M),
        epsilon=1.0,
        delta=1e-6,
        algorithm="equi-modal",
    )
    assert isinstance(plan.covariance, Diagonal)
    np.testing.assert_array_equal(plan.row_cov, np.diag(plan.row_variances))
    # the released noise of a symmetric query is the symmetrised one (r = 1/2)
    assert plan.entry_law(released=True) == EntryLaw("symmetric", 0.5)
    assert plan.entry_law() == EntryLaw("outer")


def test_registry_names_every_query_type() -> None:
    assert QUERIES == (
        "identity",
        "covariance",
        "custom",
        "centered-covariance",
        "regression",
        "cross-covariance",
        "mean",
    )
    assert {name: t.kind for name, t in QUERY_TYPES.items()} == {q: q for q in QUERIES}
    with pytest.raises(
        ValueError, match="query must be one of identity, covariance, custom, centered"
    ):
        make_query("median", features=2, records=3)


@pytest.mark.parametrize(
    "query",
    [
        IdentityQuery(3, 10),
        CovarianceQuery(3, 10, sensitivity=0.5, gamma=4.0),
        CovarianceQuery(3, 1, records_known=False, entry_range=(-1.0, 2.0)),
        CustomQuery(3, 10, shape_=(2, 2), sensitivity=1.0, symmetric=True, psd=True),
        CrossCovarianceQuery(3, 10, rows=(2,), cols=(0, 2), gamma=4.0),
    ],
)
def test_queries_round_trip_through_json(query: object) -> None:
    data = query.to_dict()  # type: ignore[attr-defined]
    assert query_from_dict(data) == query
    # the registry's constructor builds the registered type from the same fields
    fields = type(query).fields_from_dict(data)  # type: ignore[attr-defined]
    assert make_query(data["kind"], **fields) == query


def test_blueprints_compute_their_query() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(3, 10))
    cov = CovarianceQuery(3, 10)
    parts = [cov.partial(X[:, :4]), cov.partial(X[:, 4:])]
    np.testing.assert_allclose(cov.finalize(cov.combine(*parts)), X @ X.T / 10)
    ident = IdentityQuery(3, 10)
    joined = ident.combine(ident.partial(X[:, :4]), ident.partial(X[:, 4:]))
    np.testing.assert_array_equal(ident.finalize(joined), X)
    assert isinstance(cov, Query) and isinstance(ident, Query)
    assert cov.noise_shape == "symmetric" and ident.noise_shape == "rectangular"
    assert ident.lattice_coordinates("unimodal") == 3
    assert cov.lattice_coordinates("symmetric") == 6
