"""Plan layer: record domain, query specs, directions and the noise plan (metadata only)."""

from mvg_dask.plan.directions import Directions, dp_pca, gram_sensitivity
from mvg_dask.plan.domain import NEIGHBOURS, BoxDomain, L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.noise_plan import (
    AllocationSpec,
    BudgetSplit,
    NoisePlan,
    build_noise_plan,
    split_budget,
)
from mvg_dask.plan.query import QUERIES, QuerySpec

__all__ = [
    "NEIGHBOURS",
    "QUERIES",
    "AllocationSpec",
    "BoxDomain",
    "BudgetSplit",
    "Directions",
    "L2BallDomain",
    "Neighbours",
    "NoisePlan",
    "QuerySpec",
    "RecordDomain",
    "build_noise_plan",
    "dp_pca",
    "gram_sensitivity",
    "split_budget",
]
