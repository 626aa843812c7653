"""Plan layer: record domain, query types, directions, noise covariances and the noise plan
(metadata only)."""

from mvg_dask.plan.budget import Allocation, StepBudgets, share_budget
from mvg_dask.plan.covariance import Dense, Diagonal, LowRank, NoiseCovariance
from mvg_dask.plan.directions import Directions, dp_pca, gram_sensitivity, vech_sensitivity
from mvg_dask.plan.domain import NEIGHBOURS, BoxDomain, L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.estimators import covariance_from_identity, identity_noise_gram
from mvg_dask.plan.noise_plan import NoisePlan, build_noise_plan
from mvg_dask.plan.queries import (
    QUERIES,
    QUERY_TYPES,
    CovarianceQuery,
    CrossCovarianceQuery,
    CustomQuery,
    DeclaredBoundError,
    IdentityQuery,
    MatrixQuery,
    Query,
    make_query,
    query_from_dict,
)
from mvg_dask.plan.symmetric_ratio import best_symmetric_ratio

__all__ = [
    "NEIGHBOURS",
    "QUERIES",
    "QUERY_TYPES",
    "Allocation",
    "BoxDomain",
    "CovarianceQuery",
    "CrossCovarianceQuery",
    "CustomQuery",
    "DeclaredBoundError",
    "Dense",
    "Diagonal",
    "Directions",
    "IdentityQuery",
    "L2BallDomain",
    "LowRank",
    "MatrixQuery",
    "Neighbours",
    "NoiseCovariance",
    "NoisePlan",
    "Query",
    "RecordDomain",
    "StepBudgets",
    "best_symmetric_ratio",
    "build_noise_plan",
    "covariance_from_identity",
    "dp_pca",
    "gram_sensitivity",
    "identity_noise_gram",
    "make_query",
    "query_from_dict",
    "share_budget",
    "vech_sensitivity",
]
