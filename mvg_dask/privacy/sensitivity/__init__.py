"""Sensitivity bounds from a declared record domain (never from the data).

Two record domains are supported: a per-feature box ``[lower_i, upper_i]`` and an L2 ball
``||x|| <= C``. ``P`` below is a precision matrix ``Sigma^-1`` (symmetric positive definite).
All bounds are valid *upper* bounds; the tests check each against a brute-force oracle.

The bounds over a domain (quadratic forms, entry ranges, the outer-product sups) are in
:mod:`~mvg_dask.privacy.sensitivity.bounds`; the centered covariance's (the mean step, the shifted
box, the two routes' errors, the augmented record's constant) in
:mod:`~mvg_dask.privacy.sensitivity.centered`. Both are importable from here.
"""

from mvg_dask.privacy.sensitivity.bounds import (
    TRACELESS_MAX_FEATURES,
    abs_quadratic_form,
    box_abs_max,
    box_entry_range,
    box_linear_range,
    box_outer_entry_range,
    lambda_max,
    outer_weighted_sup,
    outer_weighted_sups,
    sup_quadratic_box,
    sup_quadratic_interval_box,
    traceless_box_sup,
)
from mvg_dask.privacy.sensitivity.centered import (
    SCALE_EXPONENTS,
    CenteredRouteErrors,
    augmented_route_errors,
    augmented_scale,
    box_symmetric_noise,
    box_symmetric_unit_sensitivity,
    centered_route_errors,
    mean_first_route_errors,
    mean_l2_sensitivity,
    mean_l2_sensitivity_ball,
    shifted_box,
    symmetric_ratio_grid,
)

__all__ = [
    "SCALE_EXPONENTS",
    "TRACELESS_MAX_FEATURES",
    "CenteredRouteErrors",
    "abs_quadratic_form",
    "augmented_route_errors",
    "augmented_scale",
    "box_abs_max",
    "box_entry_range",
    "box_linear_range",
    "box_outer_entry_range",
    "box_symmetric_noise",
    "box_symmetric_unit_sensitivity",
    "centered_route_errors",
    "lambda_max",
    "mean_first_route_errors",
    "mean_l2_sensitivity",
    "mean_l2_sensitivity_ball",
    "outer_weighted_sup",
    "outer_weighted_sups",
    "shifted_box",
    "sup_quadratic_box",
    "sup_quadratic_interval_box",
    "symmetric_ratio_grid",
    "traceless_box_sup",
]
