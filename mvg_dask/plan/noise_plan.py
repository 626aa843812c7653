"""The noise plan: everything about a release's privacy, built from metadata only.

A :class:`NoisePlan` is built from (query, record domain, privacy parameters, algorithm,
calibration, directions, allocation) without touching data. It carries the row/column noise
covariances, the precision budget (paper calibrations), ``s_2``, ``gamma``, the Mahalanobis
sensitivity ``Delta_M`` and the ``(epsilon, delta)`` it guarantees. Executing it is a separate step.
"""

from __future__ import annotations

import functools
import html
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import TILE_RECORDS, matrix_noise, record_noise, symmetric_query_noise
from mvg_dask.plan.budget import (
    Allocation,
    Composition,
    StepBudgets,
    resolve_allocation,
    share_budget,
)
from mvg_dask.plan.covariance import EntryLaw, NoiseCovariance, StdRanges, symmetric_entry_std
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.domain import NEIGHBOURS, Neighbours, RecordDomain, domain_from_dict
from mvg_dask.plan.lattice import Lattice, LatticeContext, NoiseKind
from mvg_dask.plan.noise_calibration import (
    CalibrationSetting,
    calibrate_lattice,
    check_plan_compatible,
    choose_symmetric_ratio,
    exact_variances,
    gram_step_lattice,
    paper_budget,
    plan_mahalanobis,
    release_float_error,
    release_terms,
)
from mvg_dask.plan.queries import MatrixQuery, query_from_dict
from mvg_dask.plan.symmetric_ratio import best_symmetric_ratio, symmetric_error_factors
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.privacy.registry import get_calibration

__all__ = [
    "Allocation",
    "Composition",
    "NoisePlan",
    "StepBudgets",
    "best_symmetric_ratio",
    "build_noise_plan",
    "gram_step_lattice",
    "noise_plan_from_dict",
    "paper_budget",
    "release_float_error",
    "share_budget",
    "symmetric_entry_std",
    "symmetric_error_factors",
]


@dataclass(frozen=True, kw_only=True, eq=False)
class NoisePlan:
    """A fully calibrated MVG noise plan (no data inside).

    Attributes
    ----------
    query : MatrixQuery
        The query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    epsilon, delta : float
        The total guarantee (direction step + release).
    algorithm : {"unimodal", "equi-modal", "symmetric"}
        Alg. 1 (``Psi = I``), Alg. 2 (``Psi = Sigma``) or symmetric noise ``A S A^T``
        (``A = W diag(sqrt(v))``, ``S_ii ~ N(0, 1)``, ``S_ij = S_ji ~ N(0, r)``).
    calibration : str
        Calibration name.
    directions : Directions
        Noise directions ``W``.
    theta : ndarray
        The allocation.
    row_variances : ndarray
        Variances of the row noise along each direction (eigenvalues of ``Sigma``).
    precision_budget : float or None
        The paper's ``P`` (``None`` for ``exact``).
    budget_kind : str or None
        ``"squared"`` or ``"linear"``.
    sensitivity : float
        ``s_2``.
    gamma : float or None
        ``sup ||f(X)||_F`` where the calibration uses it.
    mahalanobis_sensitivity : float
        ``Delta_M`` of the release step.
    budgets : StepBudgets
        How the budget was shared with the direction step.
    symmetric_ratio : float or None
        ``r = b^2 / a^2`` of symmetric noise (``None`` for the other noise types).
    noise : {"lattice", "float"}
        ``lattice``: the floating-point-safe release (:mod:`mvg_dask.plan.lattice`), whose
        effective sensitivity ``Delta_M + 2 E + 2^k sqrt(c)`` is calibrated; ``float``: the
        noise drawn and added in floating point (not floating-point safe).
    lattice : Lattice or None
        The release's lattice (``noise: lattice``).
    lattice_context : LatticeContext or None
        How the engine computes the query (what the float-error bound needs).
    """

    query: MatrixQuery
    domain: RecordDomain
    neighbours: Neighbours
    epsilon: float
    delta: float
    algorithm: Algorithm
    calibration: Calibration
    directions: Directions
    allocation: Allocation
    theta: np.ndarray
    row_variances: np.ndarray
    precision_budget: float | None
    budget_kind: str | None
    sensitivity: float
    gamma: float | None
    mahalanobis_sensitivity: float
    budgets: StepBudgets
    budget_detail: cal.PrecisionBudget | None = field(default=None, repr=False)
    symmetric_ratio: float | None = None
    noise: NoiseKind = "float"
    lattice: Lattice | None = None
    lattice_context: LatticeContext | None = None

    # -- derived quantities ------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """Output shape ``(m, n)``."""
        return self.query.shape

    @functools.cached_property
    def covariance(self) -> NoiseCovariance:
        """``Sigma`` typed by the directions' form (:mod:`mvg_dask.plan.covariance`): every
        matrix below comes from it, in O(m) for standard directions and without an ``m x m``
        matrix for low-rank ones until one is asked for."""
        return self.directions.covariance(self.row_variances)

    @property
    def col_variances(self) -> np.ndarray | None:
        """Column noise variances (equi-modal and symmetric: the row variances, ``A`` multiplies
        the noise on both sides; unimodal: ``None``, or a cross-covariance's fixed diagonal
        ``Psi``)."""
        if self.algorithm == "unimodal":
            return self.query.column_noise_variances
        return self.row_variances

    @property
    def row_cov(self) -> np.ndarray:
        """``Sigma = W diag(v) W^T`` as an ``m x m`` matrix."""
        return self.covariance.dense()

    @property
    def col_cov(self) -> np.ndarray | None:
        """``Psi`` (``None`` means ``I_n``); symmetric noise ``A S A^T``: ``A A^T`` as well."""
        if self.algorithm == "unimodal":
            psi = self.query.column_noise_variances
            return None if psi is None else np.diag(psi)
        return self.row_cov

    @property
    def output_symmetric_ratio(self) -> float | None:
        """``r`` of the noise a covariance release really adds: the plan's ratio for symmetric
        noise, ``1/2`` for equi-modal noise (the engine publishes ``(Z + Z^T) / 2``, which is
        ``A S A^T`` with ``S = (N + N^T) / 2``: ``S_ii ~ N(0, 1)``, ``S_ij ~ N(0, 1/2)``),
        ``None`` for unimodal noise or a non-symmetric query."""
        if self.algorithm == "symmetric":
            return self.symmetric_ratio
        if self.algorithm == "equi-modal" and self.query.is_symmetric:
            return 0.5
        return None

    @property
    def row_precision(self) -> np.ndarray:
        """``Sigma^-1 = W diag(1/v) W^T``."""
        return self.covariance.precision()

    @property
    def row_factor(self) -> np.ndarray:
        """``B_Sigma = W diag(sqrt(v))``, the affine sampler's factor (low-rank directions: the
        symmetric square root ``Sigma^(1/2) = a I + U diag(delta) U^T``, see
        :func:`~mvg_dask.plan.low_rank.low_rank_factor`)."""
        return self.covariance.factor()

    def entry_law(self, *, released: bool = False) -> EntryLaw:
        """How each noise entry's variance follows from ``Sigma``: unimodal noise on the rows,
        equi-modal noise on both sides, symmetric noise ``B S B^T`` with the plan's ratio. The
        noise a release publishes (``released``) differs for equi-modal noise on a symmetric
        query, which the engine symmetrises (``(Z + Z^T) / 2``: symmetric with ``r = 1/2``,
        :attr:`output_symmetric_ratio`)."""
        if self.algorithm == "symmetric":
            return EntryLaw("symmetric", self.symmetric_ratio)
        r = self.output_symmetric_ratio
        if self.algorithm == "equi-modal":
            return EntryLaw("symmetric", r) if released and r is not None else EntryLaw("outer")
        return EntryLaw("rows")

    def entry_std(self) -> np.ndarray:
        """Standard deviation of each noise entry of the ``m x n`` output (``m x n'`` view).

        Unimodal: ``sqrt(diag Sigma)`` per row (every column alike, shape ``(m, 1)``);
        equi-modal: ``sqrt(diag(Sigma) diag(Sigma)^T)``; symmetric noise ``B S B^T``
        (``B = W diag(sqrt(v))``): ``Var Z_kl = r (Sigma_kk Sigma_ll + Sigma_kl^2) +
        (1 - 2r) sum_i B_ki^2 B_li^2`` (docs/bounds.md, Sec. 1).
        """
        return _with_columns(self, self.covariance.entry_std(self.entry_law()))

    def draw(self, key: NoiseKey, *, tile: int = TILE_RECORDS) -> np.ndarray:
        """The whole noise matrix this plan adds under ``key``, from the canonical tile grid.

        The same function of the key as a release's (whose identity tasks draw the same tiles
        record range by record range): ``B_Sigma N`` (unimodal), and for a symmetric query the
        noise :func:`~mvg_dask.noise.tiles.symmetric_query_noise` publishes (symmetric noise,
        or equi-modal noise averaged with its transpose).

        Parameters
        ----------
        key : NoiseKey
            The key of this noise (a release uses its ``derive("release")`` sub-key).
        tile : int
            Records per tile (the release's ``tile_records``).

        Returns
        -------
        ndarray
            ``m x n`` noise.
        """
        B = self.row_factor
        m, n = self.shape
        diagonal = self.covariance.diagonal
        if self.algorithm == "unimodal" and (self.query.per_record_columns or m != n):
            Z = record_noise(key, B, 0, n, tile=tile, n_total=n, diagonal=diagonal)
        elif self.query.is_symmetric:
            return symmetric_query_noise(
                key, B, self.algorithm, self.symmetric_ratio, diagonal=diagonal
            )
        else:
            Z = matrix_noise(key, B, B if self.algorithm == "equi-modal" else None)
        return _with_columns(self, Z)

    def released_entry_std(self) -> np.ndarray:
        """Standard deviation of each entry of the noise a release publishes: the accuracy of a
        released entry, the one rule the dry run, the accessor and the results use
        (:meth:`released_std_ranges` is its range).

        Equal to :meth:`entry_std` except for equi-modal noise on a symmetric query, which the
        engine symmetrises (``(Z + Z^T) / 2``: :attr:`output_symmetric_ratio` ``= 1/2``).
        """
        return _with_columns(self, self.covariance.entry_std(self.entry_law(released=True)))

    def released_std_ranges(self) -> StdRanges:
        """``(min, max)`` of :meth:`released_entry_std` on the diagonal (every entry of a
        non-square output) and off it (``None`` for a non-square output); O(m) for standard
        directions (:meth:`~mvg_dask.plan.covariance.Diagonal.std_ranges`)."""
        m, n = self.shape
        square = not self.query.per_record_columns and m == n and m > 1
        if self.algorithm == "unimodal" and self.query.column_noise_variances is not None:
            values = self.released_entry_std()  # a cross-covariance's m_a x m_b; no diagonal
            return (float(values.min()), float(values.max())), None
        return self.covariance.std_ranges(self.entry_law(released=True), (m, n), square=square)

    @property
    def release_sensitivity(self) -> float:
        """The Gaussian-DP ``mu`` the release step really has: ``Delta_M``, or for a lattice
        release its effective sensitivity ``Delta_M + 2 E + 2^k sqrt(c)``."""
        if self.lattice is not None:
            return self.lattice.effective_sensitivity
        return self.mahalanobis_sensitivity

    def implied_epsilon(self) -> float:
        """Smallest ``epsilon`` the release step really has at its ``delta`` (analytic Gaussian).

        For a paper calibration this shows how conservative its sufficient condition is.
        """
        return cal.analytic_gaussian_epsilon(self.release_sensitivity, self.budgets.release_delta)

    def theorem_check(self) -> tuple[float, float]:
        """The calibration's own inequality evaluated on ``Sigma``/``Psi``: ``(lhs, rhs)``.

        Computed from the covariance matrices (eigenvalues of ``Sigma``), independently of the
        variances the plan was built with. ``lhs <= rhs`` must hold. For ``exact`` it is
        ``(delta_AG(eps, Delta_M), delta)``.
        """
        rule = get_calibration(self.calibration)
        if not rule.has_precision_budget:  # exact: the analytic Gaussian on Delta_M
            mu = math.hypot(
                self.release_sensitivity, self.budgets.step_mu or 0.0, self.budgets.count_mu or 0.0
            )
            return cal.analytic_gaussian_delta(self.epsilon, mu), self.delta
        budget = self.budget_detail
        assert budget is not None
        eig = self.covariance.eigenvalues()
        return rule.theorem_lhs(eig, n=self.shape[1], algorithm=self.algorithm), budget.bound

    # -- presentation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plan (the key is never part of a plan)."""
        col = self.col_variances
        return {
            "query": self.query.to_dict(),
            "domain": self.domain.to_dict(),
            "neighbours": self.neighbours,
            "calibration": self.calibration,
            "algorithm": self.algorithm,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "sensitivity": self.sensitivity,
            "gamma": self.gamma,
            "precision_budget": self.precision_budget,
            "budget_kind": self.budget_kind,
            "row_variances": self.row_variances.tolist(),
            "col_variances": None if col is None else col.tolist(),
            "mahalanobis_sensitivity": self.mahalanobis_sensitivity,
            "implied_epsilon": self.implied_epsilon(),
            **({} if self.symmetric_ratio is None else {"symmetric_ratio": self.symmetric_ratio}),
            "noise": self.noise,
            **self._lattice_dict(),
            "directions": self.directions.to_dict(),
            "allocation": {**self.allocation.to_dict(), "theta": self.theta.tolist()},
            "composition": self.budgets.to_dict(),
        }

    def _lattice_dict(self) -> dict[str, Any]:
        """The lattice and its summation context (lattice noise only)."""
        if self.lattice is None:
            return {}
        ctx = self.lattice_context
        return {
            "lattice": self.lattice.to_dict(),
            "lattice_context": None if ctx is None else ctx.to_dict(),
        }

    def to_json(self, **kwargs: Any) -> str:
        """The plan as JSON."""
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        """A few human-readable lines."""
        return "\n".join(_summary_lines(self))

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(self.summary()) + "</pre>"


def _with_columns(plan: NoisePlan, values: np.ndarray) -> np.ndarray:
    """Unimodal noise (or its entries' std, ``m x 1``) with a fixed diagonal ``Psi``: each
    column times ``sqrt(psi_j)``, i.e. ``B_Sigma N B_Psi^T`` with ``B_Psi = diag(sqrt(psi))``
    and ``Var Z_ij = Sigma_ii psi_j``; unchanged otherwise."""
    psi = plan.query.column_noise_variances
    if psi is None or plan.algorithm != "unimodal":
        return values
    return np.asarray(values * np.sqrt(psi)[None, :])


def _summary_lines(plan: NoisePlan) -> list[str]:
    """The lines of :meth:`NoisePlan.summary`."""
    m, n = plan.shape
    std = np.sqrt(plan.row_variances)
    lines = [
        f"MVG noise plan: {plan.query.kind} query {m}x{n}, {plan.algorithm} noise, "
        f"calibration {plan.calibration}",
        f"  privacy: epsilon={plan.epsilon:g}, delta={plan.delta:g} ({plan.neighbours}); "
        f"s2={plan.sensitivity:.6g}, Delta_M={plan.mahalanobis_sensitivity:.6g}",
        f"  noise std along directions: min {std.min():.4g}, max {std.max():.4g}",
    ]
    if plan.algorithm == "unimodal" and plan.col_variances is not None:
        psi = np.sqrt(plan.col_variances)
        lines.append(
            f"  column noise std (Psi, tr Psi^-1 = {psi.size}): min {psi.min():.4g}, "
            f"max {psi.max():.4g}"
        )
    if plan.precision_budget is not None:
        lines.append(f"  precision budget ({plan.budget_kind}): {plan.precision_budget:.6g}")
    if plan.symmetric_ratio is not None:
        lines.append(
            f"  symmetric noise A S A^T: off-diagonal / diagonal variance r = "
            f"{plan.symmetric_ratio:.6g}"
        )
    elif plan.output_symmetric_ratio is not None:
        lines.append("  published symmetrised: (Z + Z^T) / 2, i.e. A S A^T with r = 0.5")
    if plan.lattice is not None:
        lines.append("  " + plan.lattice.summary())
    else:
        lines.append("  float noise: drawn and added in floating point (not floating-point safe)")
    return lines


def build_noise_plan(
    query: MatrixQuery,
    domain: RecordDomain,
    *,
    epsilon: float,
    delta: float,
    algorithm: Algorithm = "unimodal",
    calibration: Calibration = "exact",
    directions: Directions | None = None,
    allocation: Allocation | None = None,
    neighbours: Neighbours = "replace-one",
    direction_share: float = 0.0,
    count_share: float = 0.0,
    symmetric_ratio: float | None = None,
    noise: NoiseKind = "float",
    lattice_context: LatticeContext | None = None,
) -> NoisePlan:
    """Build and check a noise plan from metadata only.

    Parameters
    ----------
    query : MatrixQuery
        The query.
    domain : BoxDomain or L2BallDomain
        Declared record domain (its dimension must equal ``query.features``).
    epsilon, delta : float
        Total privacy parameters (including a DP-PCA direction step, if any).
    algorithm : {"unimodal", "equi-modal", "symmetric"}
        Alg. 1, Alg. 2 or symmetric noise ``A S A^T`` (symmetric queries, ``exact``).
    calibration : str
        One of :data:`mvg_dask.privacy.CALIBRATIONS`.
    directions : Directions, optional
        Noise directions; the standard basis by default.
    allocation : Allocation, optional
        How the budget is allocated over the directions; uniform by default.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    direction_share : float, default 0
        Fraction of the budget already spent by a DP-PCA step that chose ``directions``.
    count_share : float, default 0
        Fraction of the budget spent on a noisy record count (add-remove covariance).
    symmetric_ratio : float, optional
        ``r = b^2 / a^2 >= 1/2`` of symmetric noise; by default the ``r`` that minimises the
        expected squared error of a uniform allocation (:func:`best_symmetric_ratio`).
    noise : {"float", "lattice"}, default "float"
        ``lattice``: calibrate the floating-point-safe release, whose effective sensitivity
        (``Delta_M`` plus twice the float error plus the grid's rounding) must meet the
        release's ``mu`` (:mod:`mvg_dask.plan.lattice`).
    lattice_context : LatticeContext, optional
        How the engine sums the query (required for a lattice covariance).

    Returns
    -------
    NoisePlan
        The plan. Its :meth:`NoisePlan.theorem_check` holds by construction.
    """
    cal._check_privacy(epsilon, delta)
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be one of {', '.join(NEIGHBOURS)}, got {neighbours!r}")
    if domain.m != query.features:
        raise ValueError(f"the domain has {domain.m} features but the data has {query.features}")
    directions = directions or Directions.standard(query.shape[0])
    allocation = allocation or Allocation()
    rule = check_plan_compatible(query, algorithm, calibration, directions)
    budgets = share_budget(calibration, epsilon, delta, direction_share, count_share)
    terms = release_terms(query, domain, neighbours, algorithm, calibration, budgets, rule)
    budget = terms.budget
    setting = CalibrationSetting(query, domain, neighbours, algorithm, directions, None)
    setting = setting._replace(
        ratio=choose_symmetric_ratio(setting, allocation, rule, symmetric_ratio)
    )
    if budget is None:  # exact: scale the precisions to Delta_M = mu*
        theta, row_variances = exact_variances(setting, allocation, rule, budgets)
    else:
        total = math.sqrt(budget.budget) if budget.kind == "squared" else budget.budget
        theta = resolve_allocation(
            allocation, directions, kind=budget.kind, total_precision=total, weights=None
        )
        row_variances = budget.variances(theta)
    d_m = plan_mahalanobis(setting, row_variances)
    lattice = None
    if noise == "lattice":
        # a paper calibration: the lattice's Gaussian must meet its (eps, delta)
        mu = budgets.release_mu or cal.analytic_gaussian_mu(*budgets.release_privacy)
        row_variances, d_m, lattice = calibrate_lattice(
            setting, np.asarray(row_variances), mu, lattice_context
        )
    elif noise != "float":
        raise ValueError(f"noise must be lattice or float, got {noise!r}")
    return NoisePlan(
        query=query,
        domain=domain,
        neighbours=neighbours,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,
        calibration=calibration,
        directions=directions,
        allocation=allocation,
        theta=theta,
        row_variances=np.asarray(row_variances),
        precision_budget=None if budget is None else budget.budget,
        budget_kind=terms.budget_kind,
        sensitivity=terms.sensitivity,
        gamma=terms.gamma,
        mahalanobis_sensitivity=d_m,
        budgets=budgets,
        budget_detail=budget,
        symmetric_ratio=setting.ratio,
        noise=noise,
        lattice=lattice,
        lattice_context=lattice_context,
    )


def lattice_context_from_dict(data: dict[str, Any]) -> LatticeContext | None:
    """The ``lattice_context`` of a plan as published (:meth:`NoisePlan.to_dict`), or ``None``
    (float noise, or a plan written before lattice releases)."""
    ctx = data.get("lattice_context")
    if ctx is None:
        return None
    return LatticeContext.from_dict(ctx)


def noise_plan_from_dict(data: dict[str, Any]) -> NoisePlan:
    """Rebuild a :class:`NoisePlan` from :meth:`NoisePlan.to_dict`.

    The plan is recomputed from what the dictionary records (query, domain, privacy, algorithm,
    calibration, directions and the resolved allocation ``theta``), and the recomputed noise
    variances must equal the recorded ones: a stored plan is never trusted blindly.

    Parameters
    ----------
    data : dict
        A plan dictionary.

    Returns
    -------
    NoisePlan
        The plan.

    Raises
    ------
    ValueError
        When the dictionary is a pending plan (directions chosen at run time) or does not
        reproduce its own noise variances.
    """
    d = data["directions"]
    if data.get("row_variances") is None:
        raise ValueError("this plan is pending: its directions are chosen by DP-PCA at run time")
    query = query_from_dict(data["query"])
    domain = domain_from_dict(data["domain"], query.features)
    m = query.shape[0]
    eig = d.get("eigenvalues")
    directions = Directions(
        d["method"],
        # None: the standard basis, not formed (Directions.matrix)
        None if d["matrix"] is None else np.asarray(d["matrix"], dtype=np.float64),
        tuple(int(i) for i in d["important"]),
        None if eig is None else np.asarray(eig, dtype=np.float64),
        m,
    )
    a = data["allocation"]
    described = Allocation(
        strategy=a["strategy"], important=a.get("important"), share=a.get("share")
    )
    comp = data["composition"]
    plan = build_noise_plan(
        query,
        domain,
        epsilon=float(data["epsilon"]),
        delta=float(data["delta"]),
        algorithm=data["algorithm"],
        calibration=data["calibration"],
        directions=directions,
        allocation=Allocation(strategy="custom", theta=[float(t) for t in a["theta"]]),
        neighbours=data["neighbours"],
        direction_share=float(comp["direction_share"]),
        count_share=float(comp.get("count_share", 0.0)),
        symmetric_ratio=data.get("symmetric_ratio"),
        noise=data.get("noise", "float"),
        lattice_context=lattice_context_from_dict(data),
    )
    stored = np.asarray(data["row_variances"], dtype=np.float64)
    if not np.allclose(plan.row_variances, stored, rtol=1e-12, atol=0.0):
        raise ValueError(
            "the stored plan does not reproduce its own noise variances (made by another "
            "version of mvg_dask?)"
        )
    return replace(plan, allocation=described)
