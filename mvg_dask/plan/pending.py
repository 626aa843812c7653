"""Noise plans that wait for a value the release computes: their published (pending) form.

A release publishes its noise plan (:meth:`NoisePlan.to_dict
<mvg_dask.plan.noise_plan.NoisePlan.to_dict>`) as an attribute. Two routes compute part of their
noise from the data first, with its own share of the budget:

* DP-PCA chooses the noise directions (:class:`PendingDirections`);
* a centered covariance by the mean first releases the mean, and the covariance's noise is
  planned about that centre (:class:`PendingCentre`, docs/bounds.md Sec. 14).

Their published plan is *pending*: every field that depends on the run-time value is ``null``
(the value itself is a noisy data variable of the release, never an attribute), every other
field is what the complete plan states. A pending plan holds what is known before any data is
read, writes that form (:meth:`~PendingDirections.to_dict`) without building a plan for a
stand-in value, reads it back (:meth:`~PendingDirections.from_dict`) and resolves to the complete
plan once the value is known (:meth:`~PendingDirections.resolve`): the release's writer, its
resume and its readers all go through these (:class:`mvg_dask.release_codec.ReleaseCodec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mvg_dask.plan.budget import Allocation, StepBudgets, resolve_allocation, share_budget
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.domain import BoxDomain, Neighbours, RecordDomain, domain_from_dict
from mvg_dask.plan.lattice import LatticeContext, NoiseKind
from mvg_dask.plan.mean_first import second_step_noise
from mvg_dask.plan.noise_calibration import calibration_rule, release_terms
from mvg_dask.plan.noise_plan import (
    NoisePlan,
    build_noise_plan,
    lattice_context_from_dict,
    noise_plan_from_dict,
)
from mvg_dask.plan.queries import MatrixQuery, query_from_dict
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.privacy.registry import get_calibration

__all__ = [
    "CENTRE_DEPENDENT",
    "DIRECTION_DEPENDENT",
    "PendingCentre",
    "PendingDirections",
    "PendingNoise",
    "published_noise_plan",
]

#: Noise-plan fields that depend on the directions, unknown before DP-PCA has run.
DIRECTION_DEPENDENT = (
    "lattice",  # its float error and grid follow the directions' whitening
    "row_variances",
    "col_variances",
    "mahalanobis_sensitivity",
    "implied_epsilon",
    "symmetric_ratio",  # symmetric noise: chosen for the directions (best_symmetric_ratio)
)
#: Noise-plan fields of the mean-first route that depend on the released centre (the shifted
#: box's bounds set the sensitivity too).
CENTRE_DEPENDENT = (*DIRECTION_DEPENDENT, "sensitivity", "gamma", "precision_budget")


def _published(
    known: Mapping[str, Any], dependent: tuple[str, ...], *, symmetric: bool, lattice: bool
) -> dict[str, Any]:
    """A pending plan's dictionary: the keys of :meth:`NoisePlan.to_dict
    <mvg_dask.plan.noise_plan.NoisePlan.to_dict>` in its order (``symmetric_ratio`` for
    symmetric noise, ``lattice`` and ``lattice_context`` for lattice noise), the ``dependent``
    ones ``null`` and the others from ``known``."""
    keys = (
        "query",
        "domain",
        "neighbours",
        "calibration",
        "algorithm",
        "epsilon",
        "delta",
        "sensitivity",
        "gamma",
        "precision_budget",
        "budget_kind",
        "row_variances",
        "col_variances",
        "mahalanobis_sensitivity",
        "implied_epsilon",
        *(("symmetric_ratio",) if symmetric else ()),
        "noise",
        *(("lattice", "lattice_context") if lattice else ()),
        "directions",
        "allocation",
        "composition",
    )
    return {key: None if key in dependent else known[key] for key in keys}


def _context_dict(ctx: LatticeContext | None) -> dict[str, int] | None:
    return None if ctx is None else {"records": ctx.records, "depth": ctx.depth}


def _allocation(a: Mapping[str, Any]) -> Allocation:
    """A published plan's allocation (a custom one with its shares)."""
    theta = a.get("theta") if a["strategy"] == "custom" else None
    return Allocation(
        strategy=a["strategy"], important=a.get("important"), share=a.get("share"), theta=theta
    )


@dataclass(frozen=True, kw_only=True)
class PendingDirections:
    """The noise plan of a DP-PCA release before DP-PCA has chosen its top ``k`` directions.

    Attributes
    ----------
    query : MatrixQuery
        The query.
    domain : BoxDomain or L2BallDomain
        What one record contributes through (:meth:`MatrixQuery.record_domain
        <mvg_dask.plan.queries.MatrixQuery.record_domain>` of the declared domain).
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    epsilon, delta : float
        The total guarantee.
    algorithm, calibration : str
        The mechanism.
    allocation : Allocation
        The precision allocation over the directions.
    direction_share, count_share : float
        The budget shares of the DP-PCA step and of a noisy record count.
    noise : {"lattice", "float"}
        How the noise is added.
    lattice_context : LatticeContext or None
        How the engine sums the query (lattice noise).
    k : int
        DP-PCA's important directions (the first ``k``).
    low_rank : bool
        A wide release keeps DP-PCA's top ``k`` only (no ``m x m`` matrix); for :meth:`check`.
    """

    query: MatrixQuery
    domain: RecordDomain
    neighbours: Neighbours
    epsilon: float
    delta: float
    algorithm: Algorithm
    calibration: Calibration
    allocation: Allocation
    direction_share: float
    count_share: float = 0.0
    noise: NoiseKind = "float"
    lattice_context: LatticeContext | None = None
    k: int
    low_rank: bool = False

    #: the fields of the published form that are ``null``
    dependent = DIRECTION_DEPENDENT

    @property
    def budgets(self) -> StepBudgets:
        """The budget shares of the DP-PCA step, the noisy count and the release."""
        return share_budget(
            self.calibration, self.epsilon, self.delta, self.direction_share, self.count_share
        )

    def check(self) -> None:
        """Refuse at planning, before any data is read, what the release would refuse once
        DP-PCA has chosen its directions, as far as the plan can tell: the calibration against
        the query and non-standard directions, and a trial calibration for directions of
        DP-PCA's shape (the first ``k`` or all ``m`` standard axes, eigenvalues ``2 .. 1``):
        an allocation that does not fit them, a lattice that cannot absorb the float error
        (:exc:`ValueError`). The trial plan is for the check only: the published form
        (:meth:`to_dict`) does not depend on it."""
        self.to_dict()
        m, k = self.query.shape[0], self.k
        if self.low_rank:
            trial = Directions.low_rank(np.eye(m, k), tuple(range(k)), np.linspace(2, 1, k))
        else:
            trial = Directions("dp-pca", np.eye(m), tuple(range(k)), np.linspace(2, 1, m))
        self.resolve(trial)

    def to_dict(self) -> dict[str, Any]:
        """The published form: the direction-free terms
        (:func:`~mvg_dask.plan.noise_calibration.release_terms`), the directions ``dp-pca``
        with ``k``, the rest ``null``."""
        # DP-PCA's directions are not the standard basis
        rule = calibration_rule(
            self.query, self.algorithm, self.calibration, standard_directions=False
        )
        terms = release_terms(
            self.query,
            self.domain,
            self.neighbours,
            self.algorithm,
            self.calibration,
            self.budgets,
            rule,
        )
        known = {
            "query": self.query.to_dict(),
            "domain": self.domain.to_dict(),
            "neighbours": self.neighbours,
            "calibration": self.calibration,
            "algorithm": self.algorithm,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "sensitivity": terms.sensitivity,
            "gamma": terms.gamma,
            "precision_budget": None if terms.budget is None else terms.budget.budget,
            "budget_kind": terms.budget_kind,
            "noise": self.noise,
            "lattice_context": _context_dict(self.lattice_context),
            "directions": {
                "method": "dp-pca",
                "k": self.k,
                "matrix": None,
                "important": list(range(self.k)),
                "eigenvalues": None,
            },
            "allocation": {**self.allocation.to_dict(), "theta": None},
            "composition": self.budgets.to_dict(),
        }
        return _published(
            known,
            self.dependent,
            symmetric=self.algorithm == "symmetric",
            lattice=self.noise == "lattice",
        )

    def resolve(self, directions: Directions) -> NoisePlan:
        """The complete plan for DP-PCA's ``directions``."""
        return build_noise_plan(
            self.query,
            self.domain,
            epsilon=self.epsilon,
            delta=self.delta,
            algorithm=self.algorithm,
            calibration=self.calibration,
            directions=directions,
            allocation=self.allocation,
            neighbours=self.neighbours,
            direction_share=self.direction_share,
            count_share=self.count_share,
            noise=self.noise,
            lattice_context=self.lattice_context,
        )

    @classmethod
    def from_dict(cls, public: Mapping[str, Any]) -> PendingDirections:
        """Inverse of :meth:`to_dict`."""
        query = query_from_dict(public["query"])
        comp = public["composition"]
        return cls(
            query=query,
            domain=domain_from_dict(public["domain"], query.features),
            neighbours=public["neighbours"],
            epsilon=float(public["epsilon"]),
            delta=float(public["delta"]),
            algorithm=public["algorithm"],
            calibration=public["calibration"],
            allocation=_allocation(public["allocation"]),
            direction_share=float(comp.get("direction_share") or 0.0),
            count_share=float(comp.get("count_share") or 0.0),
            noise=public.get("noise", "float"),
            lattice_context=lattice_context_from_dict(dict(public)),
            k=len(public["directions"]["important"]),
        )


@dataclass(frozen=True, kw_only=True)
class PendingCentre:
    """The covariance step's noise plan of a mean-first release before the mean is released:
    exact calibration about the centre (:func:`~mvg_dask.plan.mean_first.second_step_noise`).

    Attributes
    ----------
    query : MatrixQuery
        What the first pass sums (the published query).
    box : BoxDomain
        The declared box.
    records : int
        ``N``.
    epsilon, delta : float
        The release's total guarantee.
    share : float
        The mean step's share (in the direction step's place of the composition).
    algorithm : str
        The noise's form.
    allocation : Allocation
        The precision allocation over the standard directions.
    noise : {"lattice", "float"}
        How the noise is added.
    lattice_context : LatticeContext or None
        How the engine sums (lattice noise).
    """

    query: MatrixQuery
    box: BoxDomain
    records: int
    epsilon: float
    delta: float
    share: float
    algorithm: Algorithm
    allocation: Allocation
    noise: NoiseKind = "float"
    lattice_context: LatticeContext | None = None

    #: the fields of the published form that are ``null``
    dependent = CENTRE_DEPENDENT

    def __post_init__(self) -> None:
        # a scale-aware allocation's scales are the box's widths (they do not depend on the
        # centre), also when the plan is read back from its published form
        if self.allocation.strategy == "scale-aware" and self.allocation.scales is None:
            widths = tuple(float(w) for w in self.box.widths)
            object.__setattr__(self, "allocation", replace(self.allocation, scales=widths))

    @property
    def budgets(self) -> StepBudgets:
        """The budget shares of the mean step (in the direction step's place) and the
        release."""
        return share_budget("exact", self.epsilon, self.delta, self.share)

    def check(self) -> None:
        """Refuse what the centre cannot change (:exc:`ValueError`)."""
        self.to_dict()

    def _theta(self, kind: str | None) -> np.ndarray:
        """The allocation over the standard directions: uniform, scale-aware (the box's
        widths), binary and custom shares do not depend on the centre (max-pnr's and
        mgm-optimal's would)."""
        if self.allocation.strategy not in ("uniform", "scale-aware", "binary", "custom"):
            raise ValueError(
                f"a mean-first release allocates uniform, scale-aware, binary or custom shares, "
                f"not {self.allocation.strategy}"
            )
        standard = Directions.standard(self.box.m)
        return resolve_allocation(
            self.allocation, standard, kind=str(kind), total_precision=1.0, weights=None
        )

    def to_dict(self) -> dict[str, Any]:
        """The published form: the query the first pass sums, the declared box, the terms that
        do not depend on the centre, the rest ``null``."""
        kind = get_calibration("exact").allocation_kind
        known = {
            "query": self.query.to_dict(),
            "domain": self.box.to_dict(),
            "neighbours": "replace-one",
            "calibration": "exact",
            "algorithm": self.algorithm,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "budget_kind": kind,
            "noise": self.noise,
            "lattice_context": _context_dict(self.lattice_context),
            "directions": Directions.standard(self.box.m).to_dict(),
            "allocation": {**self.allocation.to_dict(), "theta": self._theta(kind).tolist()},
            "composition": self.budgets.to_dict(),
        }
        return _published(
            known,
            self.dependent,
            symmetric=self.algorithm == "symmetric",
            lattice=self.noise == "lattice",
        )

    def resolve(self, centre: np.ndarray) -> NoisePlan:
        """The complete plan about ``centre`` (the released mean clamped into the box)."""
        return second_step_noise(
            self.box,
            np.asarray(centre, dtype=np.float64),
            self.records,
            epsilon=self.epsilon,
            delta=self.delta,
            share=self.share,
            algorithm=self.algorithm,
            allocation=self.allocation,
            noise=self.noise,
            lattice_context=self.lattice_context,
        )

    @classmethod
    def from_dict(cls, public: Mapping[str, Any]) -> PendingCentre:
        """Inverse of :meth:`to_dict`."""
        query = query_from_dict(public["query"])
        box = domain_from_dict(public["domain"], query.features - 1)
        if not isinstance(box, BoxDomain):
            raise ValueError("a mean-first plan's domain is a box")
        return cls(
            query=query,
            box=box,
            records=int(query.records),
            epsilon=float(public["epsilon"]),
            delta=float(public["delta"]),
            share=float(public["composition"]["direction_share"]),
            algorithm=public["algorithm"],
            allocation=_allocation(public["allocation"]),
            noise=public.get("noise", "float"),
            lattice_context=lattice_context_from_dict(dict(public)),
        )


#: A noise plan waiting for its directions or its centre.
PendingNoise = PendingDirections | PendingCentre


def published_noise_plan(
    public: Mapping[str, Any], *, mean_first: bool = False
) -> NoisePlan | PendingNoise:
    """A published noise plan read back: complete (recomputed and checked,
    :func:`~mvg_dask.plan.noise_plan.noise_plan_from_dict`) or pending.

    Parameters
    ----------
    public : mapping
        The plan as published.
    mean_first : bool
        The release takes the mean-first route (its plan waits for the centre).

    Returns
    -------
    NoisePlan, PendingDirections or PendingCentre
        The plan.
    """
    if mean_first:
        return PendingCentre.from_dict(public)
    if public.get("row_variances") is None:
        return PendingDirections.from_dict(public)
    return noise_plan_from_dict(dict(public))
