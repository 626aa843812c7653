"""Continual releases: factorizations ``A = B C`` of a stream's prefix sums, their exact integer
encoders and their calibration (docs/bounds.md, "Continual releases"). numpy/scipy only."""

from mvg_dask.privacy.continual.calibrate import (
    ComparisonRow,
    compare_at_budget,
    comparison_table,
    one_shot_std,
    period_std,
    state_table,
    stream_std,
)
from mvg_dask.privacy.continual.exact import (
    INT64_MAX,
    StreamOverflowError,
    TreeState,
    combine_exact,
    encode_period,
    increment_headroom,
    tree_advance,
)
from mvg_dask.privacy.continual.factorizations import (
    DEFAULT_BITS,
    FACTORIZATIONS,
    MAX_HORIZON,
    Factorization,
    NaiveFactorization,
    ToeplitzFactorization,
    TreeFactorization,
    factorization_from_dict,
    make_factorization,
    sqrt_coefficients,
    toeplitz_decoder,
)

__all__ = [
    "DEFAULT_BITS",
    "FACTORIZATIONS",
    "INT64_MAX",
    "MAX_HORIZON",
    "ComparisonRow",
    "Factorization",
    "NaiveFactorization",
    "StreamOverflowError",
    "ToeplitzFactorization",
    "TreeFactorization",
    "TreeState",
    "combine_exact",
    "compare_at_budget",
    "comparison_table",
    "encode_period",
    "factorization_from_dict",
    "increment_headroom",
    "make_factorization",
    "one_shot_std",
    "period_std",
    "sqrt_coefficients",
    "state_table",
    "stream_std",
    "toeplitz_decoder",
    "tree_advance",
]
