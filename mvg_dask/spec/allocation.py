"""The precision allocation a release takes by default, from its spec alone.

A spec that names no ``mechanism.allocation.strategy`` gets ``scale-aware`` where its declared
box gives the features different public scales and the query has one noise row per feature,
and ``uniform`` otherwise (docs/howto/feature-scales.md). The choice reads the declared domain,
the query and the mechanism only, never the data, so it is free: the noise it plans is
calibrated on the same proved bounds as any other allocation (docs/bounds.md, "Scale-aware
allocation").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mvg_dask.spec.queries import MOMENT_QUERY_KINDS

#: A :class:`~mvg_dask.spec.release.ReleaseSpec` (which imports this module: not named here).
ReleaseSpec = Any

__all__ = ["AllocationChoice", "choose_allocation", "feature_scales"]

#: What a feature's public scale is for a query: its box's width (the identity and the mean
#: under replace-one, whose sensitivities take differences ``x - x'``; the moment queries, whose
#: records are shifted by the box's centre), or its largest absolute value (the uncentred
#: covariance, the mean under add-remove).
ScaleKind = Literal["width", "abs-max"]


@dataclass(frozen=True)
class AllocationChoice:
    """The allocation a release takes, and why (the dry run's ``allocation`` line).

    Attributes
    ----------
    strategy : str
        The strategy.
    reason : str
        Why, in one line (a function of the spec only).
    scale : {"width", "abs-max"} or None
        What a feature's scale is (``scale-aware`` only).
    """

    strategy: str
    reason: str
    scale: ScaleKind | None = None


def scale_kind(spec: ReleaseSpec) -> ScaleKind | None:
    """What a feature's public scale is for the spec's query (``None``: the allocation does
    not apply to it)."""
    kind = spec.query_kind
    if kind in MOMENT_QUERY_KINDS or kind == "identity":
        return "width"
    if kind == "mean":
        return "width" if spec.privacy.neighbours == "replace-one" else "abs-max"
    if kind == "covariance":
        return "abs-max"
    return None


def feature_scales(spec: ReleaseSpec, kind: ScaleKind) -> np.ndarray | None:
    """Each feature's public scale from the declared box (``None``: one box for every feature,
    given as two numbers, or no box)."""
    box = spec.domain.box
    if box is None or (not isinstance(box.lower, list) and not isinstance(box.upper, list)):
        return None
    lower = np.asarray(box.lower, dtype=np.float64)
    upper = np.asarray(box.upper, dtype=np.float64)
    lower, upper = np.broadcast_arrays(lower, upper)
    if kind == "width":
        return np.asarray(upper - lower)
    return np.asarray(np.maximum(np.abs(lower), np.abs(upper)))


def _uniform_reason(spec: ReleaseSpec) -> str | None:
    """Why the scale-aware allocation does not apply to the spec (``None``: it does)."""
    kind = spec.query_kind
    if kind == "cross-covariance":
        return (
            "a cross-covariance allocates its column side separately "
            "(query.cross-covariance.col_allocation)"
        )
    if scale_kind(spec) is None:
        return f"a {kind} query has no per-feature scale"
    if spec.domain.box is None:
        return "an l2-ball domain gives every feature one scale"
    if spec.mechanism.directions.method != "standard":
        return (
            f"{spec.mechanism.directions.method} directions mix the features, so a per-feature "
            "scale does not apply"
        )
    return None


def choose_allocation(spec: ReleaseSpec) -> AllocationChoice:
    """The allocation a release takes: the declared one, else ``scale-aware`` where the declared
    box gives the features different scales (:func:`feature_scales`), else ``uniform``.

    Parameters
    ----------
    spec : ReleaseSpec
        The validated spec.

    Returns
    -------
    AllocationChoice
        The strategy and why.
    """
    declared = spec.mechanism.allocation.strategy
    if declared is not None:
        scale = scale_kind(spec) if declared == "scale-aware" else None
        return AllocationChoice(declared, "declared in mechanism.allocation", scale)
    default = "default"
    refused = _uniform_reason(spec)
    if refused is not None:
        return AllocationChoice("uniform", f"{default}: {refused}")
    kind = scale_kind(spec)
    assert kind is not None
    scales = feature_scales(spec, kind)
    what = "box widths" if kind == "width" else "largest absolute values in the box"
    if scales is None:
        return AllocationChoice("uniform", f"{default}: one box for every feature")
    low, high = float(np.min(scales)), float(np.max(scales))
    if not low > 0:
        return AllocationChoice("uniform", f"{default}: a feature's scale is 0 ({what})")
    if low == high:
        return AllocationChoice("uniform", f"{default}: the features' {what} are equal")
    return AllocationChoice(
        "scale-aware",
        f"{default}: the features' {what} differ, {low:.3g} to {high:.3g}; each "
        "feature's noise is sized by its own",
        kind,
    )


def check_scale_aware(spec: ReleaseSpec) -> None:
    """Refuse a declared ``scale-aware`` allocation where it does not apply (a one-line
    ``ValueError`` naming why)."""
    if spec.mechanism.allocation.strategy != "scale-aware":
        return
    refused = _uniform_reason(spec)
    if refused is not None:
        raise ValueError(
            f"mechanism.allocation: scale-aware does not apply here: {refused}; use uniform"
        )
