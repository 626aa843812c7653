"""Plan layer: record domain, query specs, directions and the noise plan (metadata only)."""

from mvg_dask.plan.directions import Directions, dp_pca, gram_sensitivity, vech_sensitivity
from mvg_dask.plan.domain import NEIGHBOURS, BoxDomain, L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.estimators import covariance_from_identity, identity_noise_gram
from mvg_dask.plan.noise_plan import (
    AllocationSpec,
    BudgetSplit,
    NoisePlan,
    build_noise_plan,
    split_budget,
)
from mvg_dask.plan.query import QUERIES, DeclaredBoundError, QuerySpec

__all__ = [
    "NEIGHBOURS",
    "QUERIES",
    "AllocationSpec",
    "BoxDomain",
    "BudgetSplit",
    "DeclaredBoundError",
    "Directions",
    "L2BallDomain",
    "Neighbours",
    "NoisePlan",
    "QuerySpec",
    "RecordDomain",
    "build_noise_plan",
    "covariance_from_identity",
    "dp_pca",
    "gram_sensitivity",
    "identity_noise_gram",
    "split_budget",
    "vech_sensitivity",
]
