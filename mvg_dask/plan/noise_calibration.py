"""How a noise plan's variances are calibrated, from metadata only: the calibration's
compatibility with the query, a paper calibration's precision budget, ``exact``'s scaling of the
allocation to the release's ``mu``, the ratio of symmetric noise, and a lattice release's grid
and floating-point error (:mod:`mvg_dask.plan.lattice`).
:func:`~mvg_dask.plan.noise_plan.build_noise_plan` composes them into a
:class:`~mvg_dask.plan.noise_plan.NoisePlan`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from mvg_dask.plan.budget import Allocation, StepBudgets, resolve_allocation
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.domain import BoxDomain, Neighbours, RecordDomain
from mvg_dask.plan.lattice import Lattice, LatticeContext, choose_log2_grid
from mvg_dask.plan.queries import MatrixQuery
from mvg_dask.plan.symmetric_ratio import best_symmetric_ratio
from mvg_dask.privacy import allocation as alloc
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.privacy.registry import CalibrationRule, check_compatible, get_calibration


class CalibrationSetting(NamedTuple):
    """What the noise's sensitivity depends on besides its variances."""

    query: MatrixQuery
    domain: RecordDomain
    neighbours: Neighbours
    algorithm: Algorithm
    directions: Directions
    ratio: float | None


def check_plan_compatible(
    query: MatrixQuery, algorithm: Algorithm, calibration: Calibration, directions: Directions
) -> CalibrationRule:
    """The calibration's rule, once the query, noise and directions are checked compatible with
    it (a ``ValueError`` otherwise)."""
    rule = calibration_rule(
        query, algorithm, calibration, standard_directions=directions.is_standard
    )
    m = query.shape[0]
    if directions.dim != m:
        raise ValueError(f"directions are {directions.dim}-dimensional but the query has {m} rows")
    return rule


def calibration_rule(
    query: MatrixQuery,
    algorithm: Algorithm,
    calibration: Calibration,
    *,
    standard_directions: bool,
) -> CalibrationRule:
    """The calibration's rule, checked against the query, the noise type and whether the
    directions are the standard basis (directions not yet chosen, DP-PCA's, are not).

    Parameters
    ----------
    query : MatrixQuery
        The query.
    algorithm, calibration : str
        The noise type and the calibration.
    standard_directions : bool
        The noise directions are the standard basis.

    Returns
    -------
    CalibrationRule
        The rule (:func:`mvg_dask.privacy.registry.check_compatible`).
    """
    m, n = query.shape
    rule = check_compatible(
        calibration,
        algorithm,
        query_kind=query.kind,
        psd=query.is_psd,
        square=m == n,
        standard_directions=standard_directions,
        symmetric=query.is_symmetric,
    )
    if query.column_noise_variances is not None and rule.has_precision_budget:
        raise ValueError(
            f"a cross-covariance with a column allocation (Psi != I) is calibrated exactly "
            f"on A^-1 f B^-T: use calibration exact, not {calibration}"
        )
    return rule


def paper_budget(
    query: MatrixQuery,
    domain: RecordDomain,
    neighbours: Neighbours,
    algorithm: Algorithm,
    calibration: Calibration,
    epsilon: float,
    delta: float,
) -> cal.PrecisionBudget:
    """The precision budget of a paper calibration for this query and domain.

    Parameters
    ----------
    query : MatrixQuery
        The query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    algorithm : {"unimodal", "equi-modal"}
        Noise type.
    calibration : str
        One of the paper calibrations (not ``exact``).
    epsilon, delta : float
        Privacy parameters of the release step.

    Returns
    -------
    PrecisionBudget
        The budget.
    """
    rule = get_calibration(calibration)
    if not rule.has_precision_budget:
        raise ValueError(f"{rule.label} is not a paper calibration: it has no precision budget")
    m, n = query.shape
    return rule.budget(
        m=m,
        n=n,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,
        sensitivity=query.l2_sensitivity(domain, neighbours),
        gamma=query.sup_frobenius(domain) if rule.uses_gamma else None,
        entry_range=query.output_entry_range(domain) if rule.uses_entry_range else None,
    )


class ReleaseTerms(NamedTuple):
    """What a noise plan states before its directions are known: the calibration's rule,
    ``s_2``, ``gamma`` and a paper calibration's precision budget."""

    rule: CalibrationRule
    sensitivity: float
    gamma: float | None
    budget: cal.PrecisionBudget | None

    @property
    def budget_kind(self) -> str | None:
        """What the allocation's precisions sum: the budget's kind, or the rule's."""
        return self.rule.allocation_kind if self.budget is None else self.budget.kind


def release_terms(
    query: MatrixQuery,
    domain: RecordDomain,
    neighbours: Neighbours,
    algorithm: Algorithm,
    calibration: Calibration,
    budgets: StepBudgets,
    rule: CalibrationRule,
) -> ReleaseTerms:
    """The direction-free terms of a noise plan.

    Parameters
    ----------
    query : MatrixQuery
        The query.
    domain : BoxDomain or L2BallDomain
        What one record contributes through.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    algorithm, calibration : str
        The noise type and the calibration.
    budgets : StepBudgets
        The budget shares (:func:`~mvg_dask.plan.budget.share_budget`).
    rule : CalibrationRule
        The calibration's rule, checked against the query and the directions
        (:func:`calibration_rule`).

    Returns
    -------
    ReleaseTerms
        The terms.
    """
    sensitivity = query.l2_sensitivity(domain, neighbours)
    if not rule.has_precision_budget:
        return ReleaseTerms(rule, sensitivity, None, None)
    budget = paper_budget(
        query, domain, neighbours, algorithm, calibration, *budgets.release_privacy
    )
    gamma = query.sup_frobenius(domain) if rule.uses_gamma else None
    return ReleaseTerms(rule, sensitivity, gamma, budget)


def choose_symmetric_ratio(
    setting: CalibrationSetting,
    allocation: Allocation,
    rule: CalibrationRule,
    symmetric_ratio: float | None,
) -> float | None:
    """The ratio ``r`` of symmetric noise: as given (checked), or :func:`best_symmetric_ratio`;
    ``None`` for the other noises."""
    query, domain, neighbours, algorithm, directions, _ = setting
    if algorithm != "symmetric":
        if symmetric_ratio is not None:
            raise ValueError("symmetric_ratio is only used with algorithm: symmetric")
        return None
    if symmetric_ratio is None:
        # low-rank directions take uniform or binary allocations, which do not depend on the
        # ratio: the ratio is chosen for the allocation the plan will have
        theta0 = (
            resolve_allocation(
                allocation,
                directions,
                kind=rule.allocation_kind,
                total_precision=1.0,
                weights=None,
            )
            if directions.is_low_rank
            else None
        )
        return best_symmetric_ratio(query, domain, neighbours, directions, theta=theta0)
    ratio = float(symmetric_ratio)
    if not (math.isfinite(ratio) and ratio >= 0.5):
        raise ValueError(f"symmetric_ratio must be a finite number >= 0.5, got {symmetric_ratio!r}")
    return ratio


def exact_variances(
    setting: CalibrationSetting, allocation: Allocation, rule: CalibrationRule, budgets: StepBudgets
) -> tuple[np.ndarray, np.ndarray]:
    """``exact``: the allocation ``theta`` and the variances ``1 / (c theta)`` whose
    ``Delta_M`` meets the release's ``mu``, rounded toward more privacy."""
    mu = budgets.release_mu
    assert mu is not None
    query, domain, _, _, directions, _ = setting
    weights = None
    if query.per_record_columns and directions.is_standard and isinstance(domain, BoxDomain):
        weights = domain.widths**2
    # the linear precision a uniform plan would get: the water level for max-pnr
    uniform_total = _exact_scale(setting, alloc.uniform(directions.dim), mu)
    theta = resolve_allocation(
        allocation,
        directions,
        kind=rule.allocation_kind,
        total_precision=uniform_total,
        weights=weights,
    )
    c = _exact_scale(setting, theta, mu)
    # round toward more privacy on the matrices the release really uses
    for _ in range(200):
        row_variances = 1.0 / (c * theta)
        if plan_mahalanobis(setting, row_variances) <= mu:
            break
        c *= 1.0 - 1e-13
    return theta, row_variances


def lattice_coordinates(query: MatrixQuery, algorithm: Algorithm) -> int:
    """``c``: how many lattice coordinates one record can move
    (:meth:`~mvg_dask.plan.queries.MatrixQuery.released_lattice_coordinates`: both changed
    groups' of a grouped release)."""
    return query.released_lattice_coordinates(algorithm)


def domain_abs_max(domain: RecordDomain) -> np.ndarray:
    """``sup |x_i|`` over the domain, per feature."""
    if isinstance(domain, BoxDomain):
        return np.asarray(domain.abs_max, dtype=np.float64)
    return np.full(domain.m, float(domain.radius))


def domain_norm_max(domain: RecordDomain) -> float | None:
    """``sup ||x||`` of an L2-ball domain (``None`` for a box: the bound uses ``||a||``)."""
    return None if isinstance(domain, BoxDomain) else float(domain.radius)


def gram_step_lattice(
    domain: RecordDomain,
    sensitivity: float,
    mu: float,
    context: LatticeContext,
) -> Lattice:
    """The lattice of a Gaussian step on ``vech(X X^T)`` (Analyze Gauss, iid noise on the
    upper triangle): whitened by ``1 / sigma``, with ``sigma`` the smallest for which the
    effective sensitivity ``(Delta + 2 E_G) / sigma + 2^k sqrt(c)`` meets ``mu``. The noise's
    standard deviation is ``sensitivity / lattice.sensitivity``.

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        The record domain.
    sensitivity : float
        ``Delta``: the L2 sensitivity of ``vech(X X^T)``.
    mu : float
        The step's Gaussian-DP ``mu``.
    context : LatticeContext
        How the Gram matrix is summed.

    Returns
    -------
    Lattice
        In whitened units (``sensitivity`` is ``Delta / sigma``).
    """
    m = domain.m
    c = m * (m + 1) // 2
    abs_max = domain_abs_max(domain)

    def error(sigma: float) -> float:
        # noise sigma S on X X^T: whitened by 1 / sqrt(sigma) on both sides (variances sigma)
        white = ferr.Whitening.diagonal(np.full(m, sigma))
        return ferr.covariance_error_bound(
            abs_max,
            context.records,
            context.depth,
            1.0,
            white,
            "symmetric",
            1.0,
            norm_max=domain_norm_max(domain),
        )

    sigma = sensitivity / mu
    err = error(sigma)
    k = choose_log2_grid(mu, c, err)
    room = mu - math.ldexp(math.sqrt(c), k)
    for _ in range(60):
        if sensitivity / sigma + 2.0 * err <= room:
            break
        sigma *= (sensitivity / sigma + 2.0 * err) / room * (1.0 + 1e-12)
        err = error(sigma)
    else:  # pragma: no cover - the scaling is exact up to rounding
        raise ValueError("could not calibrate the lattice of the DP-PCA step")
    return Lattice(log2_grid=k, coordinates=c, float_error=err, sensitivity=sensitivity / sigma)


def release_float_error(
    query: MatrixQuery,
    domain: RecordDomain,
    algorithm: Algorithm,
    directions: Directions,
    variances: np.ndarray,
    ratio: float | None,
    context: LatticeContext | None,
) -> float:
    """``E``: the worst-case floating-point error of the computed whitened query, over the
    domain (docs/bounds.md, Sec. 11; :meth:`~mvg_dask.plan.queries.MatrixQuery.float_error`),
    as charged (:meth:`~mvg_dask.plan.queries.MatrixQuery.released_float_error`: times
    ``sqrt(2)`` for a grouped release, docs/bounds.md, Sec. 15 and 17)."""
    return query.released_float_error(
        domain_abs_max(domain),
        directions.covariance(variances).whitening(),
        norm_max=domain_norm_max(domain),
        algorithm=algorithm,
        ratio=ratio,
        context=context,
    )


def calibrate_lattice(
    setting: CalibrationSetting,
    variances: np.ndarray,
    mu: float,
    context: LatticeContext | None,
) -> tuple[np.ndarray, float, Lattice]:
    """Scale the variances until the lattice's effective sensitivity meets ``mu``.

    ``Delta_M`` and ``E`` are both linear in the whitening, so scaling every variance by ``t``
    scales them by ``t^(-1/2)`` (unimodal noise) or ``t^(-1)`` (two-sided noise); the grid is
    chosen once, from ``mu`` and the first ``E``, and its term is fixed.
    """
    query, domain, _, algorithm, directions, ratio = setting
    c = query.released_lattice_coordinates(algorithm)
    degree = 0.5 if algorithm == "unimodal" else 1.0

    def measure(v: np.ndarray) -> tuple[float, float]:
        d_m = plan_mahalanobis(setting, v)
        return d_m, release_float_error(query, domain, algorithm, directions, v, ratio, context)

    d_m, err = measure(variances)
    k = choose_log2_grid(mu, c, err)
    if context is not None and context.min_log2_grid is not None:
        k = max(k, context.min_log2_grid)  # a stream's floor (docs/guide/streams.md)
    room = mu - math.ldexp(math.sqrt(c), k)
    if not room > 0:
        # the grid's floor (a share of E, which keeps the integers in range) alone exceeds mu
        raise ValueError(
            f"lattice noise cannot absorb this release's floating-point error (E <= {err:.3g} "
            f"in whitened units over {c} coordinates, against mu = {mu:.3g}): declare a "
            "domain.box whose widths are not tiny against its bounds' size, a smaller "
            "privacy.max_records (add-remove), use standard directions, or "
            "mechanism.noise: float (not floating-point safe)"
        )
    for _ in range(60):
        if d_m + 2.0 * err <= room:
            break
        # variances * t scale (d_m + 2 err) by t^-degree: aim just below the room
        t = ((d_m + 2.0 * err) / room) ** (1.0 / degree) * (1.0 + 1e-12)
        variances = variances * t
        d_m, err = measure(variances)
    else:  # pragma: no cover - the scaling is exact up to rounding
        raise ValueError("could not calibrate the lattice release")
    return variances, d_m, Lattice(log2_grid=k, coordinates=c, float_error=err, sensitivity=d_m)


def plan_mahalanobis(setting: CalibrationSetting, variances: np.ndarray) -> float:
    """``Delta_M`` of noise with ``Sigma = W diag(variances) W^T``, from the precision in its
    covariance's own form (:meth:`~mvg_dask.plan.covariance.NoiseCovariance.precision_form`:
    a vector for standard directions, no ``m x m`` matrix for low-rank ones)."""
    query, domain, neighbours, algorithm, directions, ratio = setting
    precision, basis = directions.covariance(variances).precision_form()
    return query.mahalanobis_sensitivity(
        domain, neighbours, precision, algorithm, directions=basis, ratio=ratio
    )


def _exact_scale(setting: CalibrationSetting, theta: np.ndarray, mu: float) -> float:
    """The scale ``c`` with precisions ``c theta`` whose ``Delta_M`` equals ``mu``.

    ``Delta_M`` is homogeneous in the precision scale: degree 1/2 for unimodal noise (only
    ``A^-1`` scales) and 1 for equi-modal and symmetric noise (``A^-1`` and ``A^-T`` both
    scale).
    """
    d1 = plan_mahalanobis(setting, 1.0 / theta)
    degree = 0.5 if setting.algorithm == "unimodal" else 1.0
    return float((mu / d1) ** (1.0 / degree))
