"""The mean-first route to a centered covariance: a DP mean, then the covariance around it
(docs/bounds.md, Sec. 14; docs/concepts/queries.md, "Centered covariance").

Step 1 releases the mean of the clipped records about the box's centre ``c``,
``f_1 = sum_r fl(x_r - c) / N``, with Gaussian noise ``N(0, sigma_1^2 I)``,
``sigma_1 = s_1 / mu_1`` (:class:`MeanStep`); the published mean is ``c`` plus it. Step 2 is a
covariance query of the records shifted by the public centre ``clip(mean, lower, upper)`` (a
DP output), calibrated on the shifted box (:func:`second_step_noise`) to ``mu_2``, with
``mu_1^2 + mu_2^2 = mu^2`` (Gaussian-DP composition, adaptive: the split of
:func:`~mvg_dask.plan.budget.share_budget`, the mean in the direction step's place). The plan
of step 2 is made after step 1, as DP-PCA's is.

:func:`choose_route` is the plan's choice between this route and the moment route by their
expected errors in the worst case over the data's mean, which the plan cannot see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mvg_dask.plan.budget import Allocation, share_budget
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.domain import BoxDomain
from mvg_dask.plan.lattice import GRID_SHARE, Lattice, LatticeContext, choose_log2_grid
from mvg_dask.plan.noise_plan import NoisePlan, build_noise_plan
from mvg_dask.plan.queries import make_query
from mvg_dask.privacy.float_error import mean_error
from mvg_dask.privacy.sensitivity import (
    centered_route_errors,
    mean_l2_sensitivity,
)

__all__ = [
    "MeanStep",
    "RouteChoice",
    "centre_from_mean",
    "choose_route",
    "plan_mean_step",
    "second_step_domain",
    "second_step_noise",
]

#: The routes a centered covariance may take.
ROUTES = ("auto", "moment", "mean-first")


def shifted_about(domain: BoxDomain, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[fl(lower - centre), fl(upper - centre)]``: exactly the range of the engine's computed
    ``fl(x - centre)`` (rounding is monotone; docs/bounds.md, Sec. 13)."""
    c = np.asarray(centre, dtype=np.float64)
    return domain.lower - c, domain.upper - c


@dataclass(frozen=True)
class MeanStep:
    """Step 1 of the mean-first route: the mean about the box's centre with Gaussian noise.

    Attributes
    ----------
    share : float
        ``mu_1^2 / mu^2``, the step's share of the squared Gaussian-DP budget.
    mu : float
        ``mu_1``.
    sensitivity : float
        ``s_1``: the L2 sensitivity of ``sum fl(x - c) / N`` (replace-one).
    std : float
        ``sigma_1``, the noise std of each coordinate of the released mean.
    centre : tuple of float
        ``c``, the box's centre the sums are taken about (public).
    lattice : Lattice or None
        The step's lattice (lattice noise), in units of ``sigma_1``.
    """

    share: float
    mu: float
    sensitivity: float
    std: float
    centre: tuple[float, ...]
    lattice: Lattice | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "share": self.share,
            "mu": self.mu,
            "sensitivity": self.sensitivity,
            "std": self.std,
            "centre": list(self.centre),
            "lattice": None if self.lattice is None else self.lattice.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeanStep:
        """Inverse of :meth:`to_dict`."""
        lattice = data.get("lattice")
        return cls(
            share=float(data["share"]),
            mu=float(data["mu"]),
            sensitivity=float(data["sensitivity"]),
            std=float(data["std"]),
            centre=tuple(float(c) for c in data["centre"]),
            lattice=None if lattice is None else Lattice.from_dict(lattice),
        )


def plan_mean_step(
    domain: BoxDomain,
    records: int,
    mu_1: float,
    share: float,
    context: LatticeContext | None = None,
) -> MeanStep:
    """Plan step 1: ``sigma_1 = s_1 / mu_1`` (float noise), or on the lattice the smallest
    ``sigma_1`` found whose effective sensitivity ``(s_1 + 2 E') / sigma_1 + 2^k sqrt(m)`` is
    at most ``mu_1`` (``E'`` the float error of the computed mean,
    :func:`~mvg_dask.privacy.float_error.mean_error`; docs/bounds.md, Sec. 14).

    Parameters
    ----------
    domain : BoxDomain
        The declared box of ``x``.
    records : int
        ``N`` (public under replace-one).
    mu_1 : float
        The step's Gaussian-DP ``mu``.
    share : float
        ``mu_1^2 / mu^2`` (recorded).
    context : LatticeContext, optional
        How the engine sums the records (lattice noise); ``None`` for float noise.

    Returns
    -------
    MeanStep
        The step.
    """
    if not mu_1 > 0:
        raise ValueError(f"the mean step's mu must be positive, got {mu_1!r}")
    centre = (domain.lower + domain.upper) / 2.0
    lo, hi = shifted_about(domain, centre)
    s1 = mean_l2_sensitivity(lo, hi, records)
    centre_t = tuple(float(c) for c in centre)
    if context is None:
        return MeanStep(share, mu_1, s1, s1 / mu_1, centre_t)
    m = domain.m
    err = mean_error(np.maximum(np.abs(lo), np.abs(hi)), context.records, context.depth, records)
    if not math.isfinite(err):
        raise ValueError("the mean's float error is unbounded (the sums could overflow)")
    # the grid takes GRID_SHARE of mu_1 at most; the rest covers s_1 + 2 E'
    sigma = (s1 + 2.0 * err) / (mu_1 * (1.0 - 2.0 * GRID_SHARE))
    for _ in range(64):
        k = choose_log2_grid(mu_1, m, err / sigma)
        lattice = Lattice(
            log2_grid=k, coordinates=m, float_error=err / sigma, sensitivity=s1 / sigma
        )
        if lattice.effective_sensitivity <= mu_1:
            return MeanStep(share, mu_1, s1, sigma, centre_t, lattice)
        sigma *= lattice.effective_sensitivity / mu_1 * (1.0 + 2.0**-40)
    raise ValueError("the mean step's lattice could not be calibrated")  # pragma: no cover


def centre_from_mean(mean: np.ndarray, domain: BoxDomain) -> np.ndarray:
    """Step 2's centre: the released mean clamped into the box (post-processing of a DP
    output, so public)."""
    return np.clip(np.asarray(mean, dtype=np.float64), domain.lower, domain.upper)


def second_step_domain(domain: BoxDomain, centre: np.ndarray) -> BoxDomain:
    """The box of the engine's ``fl(x - centre)`` for ``x`` in ``domain`` (every interval holds
    0; one end is 0 where the centre sits on a face, so the interval may be one-sided)."""
    lo, hi = shifted_about(domain, centre)
    return BoxDomain.create(lo, hi, domain.m, allow_equal=True)


def second_step_noise(
    domain: BoxDomain,
    centre: np.ndarray,
    records: int,
    *,
    epsilon: float,
    delta: float,
    share: float,
    algorithm: str = "symmetric",
    directions: Directions | None = None,
    allocation: Allocation | None = None,
    noise: str = "float",
    lattice_context: LatticeContext | None = None,
) -> NoisePlan:
    """Step 2's noise plan: the covariance query ``sum fl(x - centre) fl(x - centre)^T / N`` on
    the shifted box (:func:`second_step_domain`), exact calibration at the release's ``mu_2``
    (``share`` in the direction step's place of :func:`~mvg_dask.plan.budget.share_budget`:
    ``mu_2^2 = (1 - share) mu^2``).

    Parameters
    ----------
    domain : BoxDomain
        The declared box of ``x``.
    centre : ndarray
        :func:`centre_from_mean` of the released mean.
    records : int
        ``N``.
    epsilon, delta : float
        The release's total guarantee.
    share : float
        The mean step's ``mu_1^2 / mu^2``.
    algorithm : str, default "symmetric"
        The noise's form.
    directions : Directions, optional
        Fixed directions (standard by default).
    allocation : Allocation, optional
        The precision allocation over the directions (uniform by default).
    noise : {"float", "lattice"}
        How the noise is added.
    lattice_context : LatticeContext, optional
        How the engine sums (lattice noise).

    Returns
    -------
    NoisePlan
        The plan of step 2.
    """
    shifted = second_step_domain(domain, centre)
    query = make_query("covariance", features=domain.m, records=records)
    return build_noise_plan(
        query,
        shifted,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,  # type: ignore[arg-type]
        calibration="exact",
        directions=directions,
        allocation=allocation,
        direction_share=share,
        noise=noise,  # type: ignore[arg-type]
        lattice_context=lattice_context,
    )


def step_mus(epsilon: float, delta: float, share: float) -> tuple[float, float]:
    """``(mu_1, mu_2)``: the Gaussian-DP split of one release's ``mu(epsilon, delta)``."""
    budgets = share_budget("exact", epsilon, delta, share)
    assert budgets.step_mu is not None and budgets.release_mu is not None
    return budgets.step_mu, budgets.release_mu


@dataclass(frozen=True)
class RouteChoice:
    """The plan's route to a centered covariance and why.

    Attributes
    ----------
    route : {"moment", "mean-first"}
        The route taken.
    declared : {"auto", "moment", "mean-first"}
        The route the spec asked for.
    moment_worst, mean_first_worst : float
        Each route's expected squared error (covariance plus mean) in the worst case over the
        data's mean (``nan`` where not computed).
    share : float or None
        The mean step's ``mu_1^2 / mu^2`` (mean-first only).
    """

    route: str
    declared: str
    moment_worst: float
    mean_first_worst: float
    share: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "route": self.route,
            "declared": self.declared,
            "moment_worst": self.moment_worst,
            "mean_first_worst": self.mean_first_worst,
            "share": self.share,
        }


def choose_route(
    declared: str,
    domain: BoxDomain,
    records: int,
    mu: float,
    *,
    scale: float = 1.0,
    share: float | None = None,
) -> RouteChoice:
    """The route a centered covariance takes.

    ``moment`` and ``mean-first`` are taken as declared; ``auto`` compares both routes' expected
    squared error (covariance plus mean, uniform precisions, symmetric noise) in the worst case
    over the data's mean, which the plan cannot see: the moment route with the mean at a
    corner of the box, the mean-first route with its step-2 noise for the hull ``[-w, w]`` of
    every shifted box (:func:`~mvg_dask.privacy.sensitivity.centered_route_errors`, the numbers
    of the dry run's ``routes`` line), and takes the smaller; a tie keeps the moment route
    (one pass). The mean-first split is ``share`` when declared, else the split that minimises
    its error with the mean at the centre.

    Parameters
    ----------
    declared : {"auto", "moment", "mean-first"}
        The spec's route.
    domain : BoxDomain
        The declared box.
    records : int
        ``N``.
    mu : float
        The release's total Gaussian-DP ``mu``.
    scale : float, default 1
        The moment route's constant ``s``.
    share : float, optional
        A declared mean share.

    Returns
    -------
    RouteChoice
        The choice.
    """
    if declared not in ROUTES:
        raise ValueError(f"unknown route {declared!r}; use one of {', '.join(ROUTES)}")
    lo, hi = domain.lower, domain.upper
    shares = None if share is None else [share]
    centre = centered_route_errors(lo, hi, float(records), mu, scale=scale, shares=shares)
    corner = centered_route_errors(lo, hi, float(records), mu, mean=hi, scale=scale, shares=[0.5])
    moment = corner.centred_covariance + corner.centred_mean
    first = centre.mean_first_worst_covariance + centre.mean_first_mean
    f = centre.mean_first_share
    if declared == "auto":
        route = "mean-first" if first < moment else "moment"
    else:
        route = declared
    return RouteChoice(route, declared, moment, first, f if route == "mean-first" else None)
