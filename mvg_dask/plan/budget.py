"""How a release's budget is shared: between its steps, and over the noise directions.

:func:`share_budget` gives each step (an optional DP-PCA direction step, an optional noisy
record count, the release) its share of ``(epsilon, delta)`` as :class:`StepBudgets`;
:class:`Allocation` says how the release's precision is shared over the directions, resolved by
:func:`resolve_allocation`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mvg_dask.plan.directions import Directions
from mvg_dask.privacy import allocation as alloc
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP, PrivacyLoss
from mvg_dask.privacy.calibration import Calibration
from mvg_dask.privacy.registry import get_calibration

__all__ = ["Allocation", "Composition", "StepBudgets", "resolve_allocation", "share_budget"]

Composition = Literal["none", "basic", "gaussian-dp"]


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """How to split the precision budget over the directions.

    Parameters
    ----------
    strategy : {"uniform", "scale-aware", "binary", "custom", "max-pnr", "mgm-optimal"}
        Strategy name.
    important : sequence of int, optional
        Important directions (``binary``); defaults to the directions' own (DP-PCA top-k).
    share : float, optional
        ``tau`` of the binary strategy (default 0.8).
    theta : sequence of float, optional
        Explicit shares (``custom``).
    eigenvalues : sequence of float, optional
        Query variance along each direction (``max-pnr``); defaults to DP-PCA's noisy ones.
    utility : ndarray, optional
        ``W_1`` of a linear utility subspace (``mgm-optimal``).
    scales : sequence of float, optional
        The public scale of each direction (``scale-aware``): noise variances proportional to
        their squares (:func:`~mvg_dask.privacy.allocation.scale_aware`).
    reason : str, optional
        Why the plan took this strategy (the dry run's ``allocation`` line; not published).
    """

    strategy: alloc.AllocationStrategy = "uniform"
    important: Sequence[int] | None = None
    share: float | None = None
    theta: Sequence[float] | None = None
    eigenvalues: Sequence[float] | None = None
    utility: np.ndarray | None = None
    scales: Sequence[float] | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description."""
        out: dict[str, Any] = {"strategy": self.strategy}
        if self.important is not None:
            out["important"] = [int(i) for i in self.important]
        if self.share is not None:
            out["share"] = self.share
        return out


@dataclass(frozen=True, kw_only=True)
class StepBudgets:
    """How ``(epsilon, delta)`` is shared between the DP-PCA direction step and the release.

    Attributes
    ----------
    composition : {"none", "basic", "gaussian-dp"}
        ``basic``: ``(s eps, s delta)`` + ``((1-s) eps, (1-s) delta)``. ``gaussian-dp``: both steps
        are Gaussian mechanisms after whitening, so ``mu^2 = mu_1^2 + mu_2^2`` exactly, with
        ``mu = mu*(eps, delta)`` of the analytic Gaussian mechanism (``exact`` only).
    share : float
        Fraction given to the direction step.
    step_mu : float or None
        The step's Gaussian ratio ``Delta / sigma``.
    release_epsilon, release_delta : float
        What the paper calibration of the release is given.
    release_mu : float or None
        ``mu`` available to the release (``exact``).
    count_share : float
        Fraction given to a noisy record count (add-remove covariance without a public
        normaliser): a Gaussian mechanism of sensitivity 1 with ratio ``count_mu``, or the basic
        share ``(count_epsilon, count_delta)``.
    """

    composition: Composition
    share: float
    step_mu: float | None
    step_epsilon: float | None
    step_delta: float | None
    release_epsilon: float
    release_delta: float
    release_mu: float | None
    count_share: float = 0.0
    count_mu: float | None = None
    count_epsilon: float | None = None
    count_delta: float | None = None

    @property
    def release_privacy(self) -> tuple[float, float]:
        """``(release_epsilon, release_delta)``."""
        return self.release_epsilon, self.release_delta

    def losses(self) -> list[PrivacyLoss]:
        """The privacy loss of each step (direction step, count, release), as typed values.

        Splitting is the inverse of composition: the release's accountant
        (:class:`~mvg_dask.privacy.accounting.LedgerAccountant`) composes these back to the
        total ``(epsilon, delta)`` (``gaussian-dp``: exactly the total ``mu``; ``basic``: the
        sums).
        """
        if self.composition == "none":
            if self.release_mu is not None:
                return [GaussianDP(self.release_mu, self.release_epsilon, self.release_delta)]
            return [ApproxDP(self.release_epsilon, self.release_delta)]
        if self.composition == "gaussian-dp":
            mus = [m for m in (self.step_mu, self.count_mu, self.release_mu) if m is not None]
            # each share is a Gaussian mechanism; its point: epsilon at the release's delta
            return [
                GaussianDP(
                    m, cal.analytic_gaussian_epsilon(m, self.release_delta), self.release_delta
                )
                for m in mus
            ]
        steps = [
            (self.step_epsilon, self.step_delta),
            (self.count_epsilon, self.count_delta),
            (self.release_epsilon, self.release_delta),
        ]
        return [ApproxDP(e, d) for e, d in steps if e is not None and d is not None]

    def to_dict(self) -> dict[str, Any]:
        """The plan's ``composition`` entry."""
        return {
            "method": self.composition,
            "direction_share": self.share,
            "direction_step_mu": self.step_mu,
            "direction_step_epsilon": self.step_epsilon,
            "direction_step_delta": self.step_delta,
            "release_epsilon": self.release_epsilon,
            "release_delta": self.release_delta,
            "release_mu": self.release_mu,
            "count_share": self.count_share,
            "count_mu": self.count_mu,
            "count_epsilon": self.count_epsilon,
            "count_delta": self.count_delta,
        }


def share_budget(
    calibration: Calibration,
    epsilon: float,
    delta: float,
    share: float = 0.0,
    count_share: float = 0.0,
) -> StepBudgets:
    """Split the budget between an optional DP-PCA step, an optional noisy count and the release.

    Parameters
    ----------
    calibration : str
        Release calibration.
    epsilon, delta : float
        Total privacy parameters.
    share : float, default 0
        Fraction for the direction step, ``0 <= share < 1``.
    count_share : float, default 0
        Fraction for a noisy record count, ``0 <= count_share``, ``share + count_share < 1``.

    Returns
    -------
    StepBudgets
        The split. ``gaussian-dp`` (``exact``): each step is a Gaussian mechanism after whitening,
        so ``mu^2 = mu_step^2 + mu_count^2 + mu_release^2`` with each ``mu_i^2`` its share of
        ``mu*(epsilon, delta)^2``. ``basic``: each step gets its share of ``epsilon`` and
        ``delta``.
    """
    cal._check_privacy(epsilon, delta)
    if not 0 <= share < 1:
        raise ValueError(f"directions budget_share must lie in [0, 1), got {share!r}")
    if not 0 <= count_share < 1 or share + count_share >= 1:
        raise ValueError(
            f"the count's share ({count_share!r}) and the directions' share ({share!r}) must "
            "leave a positive share for the release"
        )
    total = get_calibration(calibration).loss(epsilon, delta)
    mu = total.mu if isinstance(total, GaussianDP) else None
    if share == 0 and count_share == 0:
        return StepBudgets(
            composition="none",
            share=0.0,
            step_mu=None,
            step_epsilon=None,
            step_delta=None,
            release_epsilon=epsilon,
            release_delta=delta,
            release_mu=mu,
        )
    rest = 1.0 - share - count_share
    if mu is not None:  # exact: every step is a Gaussian mechanism, mu^2 adds up
        return StepBudgets(
            composition="gaussian-dp",
            share=share,
            step_mu=math.sqrt(share) * mu if share else None,
            step_epsilon=None,
            step_delta=None,
            release_epsilon=epsilon,
            release_delta=delta,
            release_mu=math.sqrt(rest) * mu,
            count_share=count_share,
            count_mu=math.sqrt(count_share) * mu if count_share else None,
        )
    e1, d1 = share * epsilon, share * delta
    ec, dc = count_share * epsilon, count_share * delta
    return StepBudgets(
        composition="basic",
        share=share,
        step_mu=cal.analytic_gaussian_mu(e1, d1) if share else None,
        step_epsilon=e1 if share else None,
        step_delta=d1 if share else None,
        release_epsilon=rest * epsilon,
        release_delta=rest * delta,
        release_mu=None,
        count_share=count_share,
        count_mu=cal.analytic_gaussian_mu(ec, dc) if count_share else None,
        count_epsilon=ec if count_share else None,
        count_delta=dc if count_share else None,
    )


def resolve_allocation(
    spec: Allocation,
    directions: Directions,
    *,
    kind: str,
    total_precision: float,
    weights: np.ndarray | None,
) -> np.ndarray:
    m = directions.dim
    if directions.is_low_rank and spec.strategy in ("max-pnr", "mgm-optimal"):
        raise ValueError(
            f"allocation strategy {spec.strategy} needs every direction, but these directions "
            f"keep only the top {directions.matrix.shape[1]} (a wide release's DP-PCA): use "
            "strategy uniform or binary"
        )
    if spec.strategy == "uniform":
        return alloc.uniform(m)
    if spec.strategy == "scale-aware":
        if spec.scales is None or len(spec.scales) != m or not directions.is_standard:
            raise ValueError(
                "scale-aware allocation needs the standard directions and one public scale per "
                f"direction ({m})"
            )
        return alloc.scale_aware(spec.scales, kind)
    if spec.strategy == "binary":
        important = spec.important if spec.important is not None else directions.important
        if not important:
            raise ValueError(
                "binary allocation needs important directions: list them in allocation.important "
                "or use directions: dp-pca with k"
            )
        return alloc.binary(m, important, 0.8 if spec.share is None else spec.share)
    if spec.strategy == "custom":
        if spec.theta is None:
            raise ValueError("custom allocation needs allocation.theta (one share per direction)")
        return alloc.check_allocation(spec.theta, m)
    if spec.strategy == "max-pnr":
        eig = spec.eigenvalues if spec.eigenvalues is not None else directions.eigenvalues
        if eig is None:
            raise ValueError(
                "max-pnr needs the query's variance along each direction from a DP estimate: use "
                "directions: dp-pca (or give allocation.eigenvalues from a DP source)"
            )
        if len(eig) != m:
            raise ValueError(f"max-pnr got {len(eig)} eigenvalues for {m} directions")
        return alloc.max_pnr(eig, total_precision=total_precision, kind=kind)
    if spec.strategy == "mgm-optimal":
        if spec.utility is None:
            raise ValueError("mgm-optimal allocation needs the utility subspace W_1 (m' x m)")
        return alloc.mgm_optimal(spec.utility, directions.matrix, kind=kind, weights=weights)
    raise ValueError(
        f"allocation strategy must be one of {', '.join(alloc.ALLOCATIONS)}, got {spec.strategy!r}"
    )
