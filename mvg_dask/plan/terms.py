"""The terms of a noise plan that its directions do not change: the calibration's rule checked
against the query, ``s_2``, ``gamma`` and a paper calibration's precision budget.

:func:`~mvg_dask.plan.noise_plan.build_noise_plan` computes them for a complete plan, and a
pending plan (:mod:`mvg_dask.plan.pending`) publishes them before DP-PCA has chosen the
directions: one computation for both.
"""

from __future__ import annotations

from typing import NamedTuple

from mvg_dask.plan.budget import StepBudgets
from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.queries import MatrixQuery
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.privacy.registry import CalibrationRule, check_compatible, get_calibration

__all__ = ["ReleaseTerms", "calibration_rule", "paper_budget", "release_terms"]


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
    *,
    standard_directions: bool,
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
    standard_directions : bool
        The noise directions are the standard basis (DP-PCA's, not yet chosen, are not).

    Returns
    -------
    ReleaseTerms
        The terms.
    """
    rule = calibration_rule(query, algorithm, calibration, standard_directions=standard_directions)
    sensitivity = query.l2_sensitivity(domain, neighbours)
    if not rule.has_precision_budget:
        return ReleaseTerms(rule, sensitivity, None, None)
    budget = paper_budget(
        query, domain, neighbours, algorithm, calibration, *budgets.release_privacy
    )
    gamma = query.sup_frobenius(domain) if rule.uses_gamma else None
    return ReleaseTerms(rule, sensitivity, gamma, budget)
