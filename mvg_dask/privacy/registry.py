"""The calibration registry: one frozen, declarative blueprint per calibration.

Every calibration of :mod:`mvg_dask.privacy.calibration` is described once here by a
:class:`CalibrationRule` (in the style of flox's ``Aggregation``): the theorem it implements, the
kind of precision budget it bounds, what it requires of the query, the noise and the directions,
how its budget is computed, the left-hand side of its inequality and whether its releases
compose exactly as Gaussian DP. The plan, the spec validator and the command line ask the registry
(:func:`get_calibration`, :func:`check_compatible`) instead of testing calibration names.

numpy/scipy only (the math layer of the layout, docs/guide/architecture.md).

============  ==========================================  =======  ==============================
name          theorem                                     budget   requirements
============  ==========================================  =======  ==============================
``exact``     analytic Gaussian on the whitened query     none     none (also covers
                                                                   symmetric noise)
``mvg-thm2``  MVG Thm. 2 (budget: Alg. 1 Thm. 5, Alg. 2    squared  none
              Thm. 6)
``mvg-thm3``  MVG Thm. 3 (budget: Alg. 2 Thm. 6)          squared  symmetric PSD query,
                                                                   equi-modal noise
``mgm``       MGM Thm. 1                                  linear   none
``mgm-udn``   MGM Thm. 2                                  linear   unimodal noise
``mgm-idn``   MGM Thm. 3                                  linear   unimodal noise, standard
                                                                   directions
============  ==========================================  =======  ==============================

Examples
--------
>>> rule = get_calibration("mvg-thm3")
>>> rule.budget_kind, rule.requires.algorithms, rule.gaussian_dp
('squared', ('equi-modal',), False)
>>> get_calibration("mgm-idn").requires.standard_directions
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

import numpy as np

from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP, PrivacyLoss
from mvg_dask.privacy.calibration import (
    ALGORITHMS,
    EQUI_MODAL_NEEDS_SQUARE,
    PAPER_ALGORITHMS,
    Algorithm,
    Calibration,
    PrecisionBudget,
)

RuleBudgetKind = Literal["squared", "linear", "none"]
CompatibilityField = Literal["calibration", "algorithm", "directions"]

_MVG = "T. Chanyaswad, A. Dytso, H. V. Poor, P. Mittal, arXiv:1802.10077"
_MGM = "J. Yang, L. Xiang, et al., Matrix Gaussian Mechanisms, IEEE TMC"
_AG = "B. Balle, Y.-X. Wang, ICML 2018, Thm. 8 (analytic Gaussian), on the whitened query"


class CompatibilityError(ValueError):
    """A calibration, an algorithm, a query and directions that do not go together.

    Attributes
    ----------
    field : {"calibration", "algorithm", "directions"}
        The setting the remedy changes (the spec validator names it as ``mechanism.<field>``).
    """

    def __init__(self, field: CompatibilityField, message: str) -> None:
        super().__init__(message)
        self.field: CompatibilityField = field

    def __reduce__(self) -> tuple[type[CompatibilityError], tuple[CompatibilityField, str]]:
        return (type(self), (self.field, str(self)))


@dataclass(frozen=True, kw_only=True)
class Requirements:
    """What a calibration's theorem assumes about the query, the noise and the directions.

    Attributes
    ----------
    psd_query : bool
        The query's outputs must be symmetric positive semi-definite.
    square_query : bool
        The query's output must be square (``r = m``).
    algorithms : tuple of {"unimodal", "equi-modal"}
        The paper noise types (MVG Alg. 1, Alg. 2) the theorem covers.
    standard_directions : bool
        The row noise must be independent per row (``U_1`` diagonal: standard directions).
    symmetric_noise : bool
        The calibration also covers the ``symmetric`` noise ``A S A^T`` (``S`` from a symmetric
        Gaussian ensemble) of a symmetric query: only ``exact``, whose Mahalanobis bound is
        proved for it in docs/bounds.md.
    """

    psd_query: bool = False
    square_query: bool = False
    algorithms: tuple[Algorithm, ...] = PAPER_ALGORITHMS
    standard_directions: bool = False
    symmetric_noise: bool = False

    def covers(self, algorithm: str) -> bool:
        """True when the calibration covers this noise type."""
        return algorithm in self.algorithms or (algorithm == "symmetric" and self.symmetric_noise)


@dataclass(frozen=True, kw_only=True)
class BudgetInputs:
    """Everything a paper calibration's budget may need (``None`` where it is not used)."""

    m: int
    n: int
    epsilon: float
    delta: float
    algorithm: Algorithm
    sensitivity: float | None = None
    gamma: float | None = None
    entry_range: tuple[float, float] | None = None


LhsFunction = Callable[[np.ndarray, int, Algorithm], float]
BudgetFunction = Callable[[BudgetInputs], PrecisionBudget]


@dataclass(frozen=True, kw_only=True)
class CalibrationRule:
    """The blueprint of one calibration.

    Attributes
    ----------
    name : str
        The calibration's name in specs, plans and the ledger.
    paper : {"MVG", "MGM"} or None
        The paper whose theorem it implements (``None``: this project's ``exact``).
    theorem : str
        Short name of the theorem, e.g. ``"MVG Thm. 2"`` (error messages).
    reference : str
        Full reference (documentation).
    condition : str
        The inequality the plan must satisfy, in words.
    budget_kind : {"squared", "linear", "none"}
        ``squared``: the budget bounds ``sum 1/v_i**2`` (MVG); ``linear``: ``sum 1/v_i`` (MGM);
        ``none``: no precision budget (``exact`` scales the precisions to ``Delta_M = mu*``).
    allocation_kind : {"squared", "linear"}
        The precision kind an allocation strategy (max-pnr, mgm-optimal) optimises.
    requires : Requirements
        What the theorem assumes.
    uses_gamma : bool
        The budget needs ``gamma = sup ||f(X)||_F``.
    uses_sensitivity : bool
        The budget needs ``s_2``.
    uses_entry_range : bool
        The budget needs the range of every output entry.
    gaussian_dp : bool
        Releases are Gaussian mechanisms after whitening and compose exactly as Gaussian DP
        (``mu^2 = sum mu_i^2``); otherwise basic composition.
    """

    name: Calibration
    paper: Literal["MVG", "MGM"] | None
    theorem: str
    reference: str
    condition: str
    budget_kind: RuleBudgetKind
    allocation_kind: cal.BudgetKind
    requires: Requirements = Requirements()
    uses_gamma: bool = False
    uses_sensitivity: bool = False
    uses_entry_range: bool = False
    gaussian_dp: bool = False
    budget_function: BudgetFunction | None = field(default=None, repr=False, compare=False)
    lhs_function: LhsFunction | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``name (theorem)``, as error messages name the calibration."""
        return f"{self.name} ({self.theorem})"

    def loss(self, epsilon: float, delta: float, mu: float | None = None) -> PrivacyLoss:
        """The privacy loss of a release with this calibration at ``(epsilon, delta)``.

        Parameters
        ----------
        epsilon, delta : float
            The release's guarantee.
        mu : float, optional
            Its Gaussian-DP parameter when already computed (a share of a budget); else the
            analytic Gaussian ``mu*(epsilon, delta)``.

        Returns
        -------
        PrivacyLoss
            :class:`~mvg_dask.privacy.accounting.GaussianDP` for a Gaussian-DP calibration
            (``exact``), else :class:`~mvg_dask.privacy.accounting.ApproxDP`.
        """
        if self.gaussian_dp:
            if mu is None:
                return GaussianDP.calibrated(epsilon, delta)
            return GaussianDP(mu, epsilon, delta)
        return ApproxDP(epsilon, delta)

    @property
    def has_precision_budget(self) -> bool:
        """True for the paper calibrations (a budget ``P`` that an allocation splits)."""
        return self.budget_kind != "none"

    def budget(
        self,
        *,
        m: int,
        n: int,
        epsilon: float,
        delta: float,
        algorithm: Algorithm,
        sensitivity: float | None = None,
        gamma: float | None = None,
        entry_range: tuple[float, float] | None = None,
    ) -> PrecisionBudget:
        """The precision budget for an ``m x n`` query (inputs the theorem does not use: ignored).

        Parameters
        ----------
        m, n : int
            Query output shape.
        epsilon, delta : float
            Privacy parameters of the release step.
        algorithm : {"unimodal", "equi-modal"}
            Noise type.
        sensitivity : float, optional
            ``s_2`` (needed when :attr:`uses_sensitivity`).
        gamma : float, optional
            ``sup ||f(X)||_F`` (needed when :attr:`uses_gamma`).
        entry_range : tuple of float, optional
            Range of every output entry (needed when :attr:`uses_entry_range`).

        Returns
        -------
        PrecisionBudget
            The budget, from the theorem's function in :mod:`mvg_dask.privacy.calibration`.

        Raises
        ------
        ValueError
            For ``exact`` (no precision budget) or when a needed input is missing.
        """
        if self.budget_function is None:
            raise ValueError(
                f"{self.label} has no precision budget: it scales the precisions until "
                "Delta_M = mu*(epsilon, delta)"
            )
        for needed, name, value in (
            (self.uses_sensitivity, "the L2 sensitivity s2", sensitivity),
            (self.uses_gamma, "gamma = sup ||f(X)||_F", gamma),
            (self.uses_entry_range, "the range of every output entry", entry_range),
        ):
            if needed and value is None:
                raise ValueError(f"{self.label} needs {name}")
        return self.budget_function(
            BudgetInputs(
                m=m,
                n=n,
                epsilon=epsilon,
                delta=delta,
                algorithm=algorithm,
                sensitivity=sensitivity,
                gamma=gamma,
                entry_range=entry_range,
            )
        )

    def theorem_lhs(self, sigma_eigenvalues: np.ndarray, *, n: int, algorithm: Algorithm) -> float:
        """The left-hand side of the theorem's inequality for ``Sigma`` (and ``Psi``).

        ``Psi`` is ``I_n`` (unimodal) or ``Sigma`` (equi-modal), so the eigenvalues of ``Sigma``
        determine it. The plan is valid when this is at most the budget's ``bound``.

        Parameters
        ----------
        sigma_eigenvalues : ndarray
            Eigenvalues of the row covariance ``Sigma`` (all > 0).
        n : int
            Columns of the query output.
        algorithm : {"unimodal", "equi-modal"}
            Noise type.

        Returns
        -------
        float
            The left-hand side.

        Raises
        ------
        ValueError
            For ``exact``, whose condition is ``delta_AG(epsilon, Delta_M) <= delta``.
        """
        if self.lhs_function is None:
            raise ValueError(f"{self.label} has no eigenvalue condition: {self.condition}")
        return self.lhs_function(np.asarray(sigma_eigenvalues, dtype=np.float64), n, algorithm)


# -- budgets: the uniform signature over the theorem functions --------------------------------
def _need(value: float | None) -> float:
    assert value is not None  # CalibrationRule.budget checked it
    return value


def _mvg_thm2_budget(x: BudgetInputs) -> PrecisionBudget:
    return cal.mvg_thm2_budget(
        m=x.m,
        n=x.n,
        epsilon=x.epsilon,
        delta=x.delta,
        sensitivity=_need(x.sensitivity),
        gamma=_need(x.gamma),
        algorithm=x.algorithm,
    )


def _mvg_thm3_budget(x: BudgetInputs) -> PrecisionBudget:
    return cal.mvg_thm3_budget(
        m=x.m,
        epsilon=x.epsilon,
        delta=x.delta,
        sensitivity=_need(x.sensitivity),
        gamma=_need(x.gamma),
    )


def _mgm_budget(x: BudgetInputs) -> PrecisionBudget:
    return cal.mgm_budget(
        m=x.m,
        n=x.n,
        epsilon=x.epsilon,
        delta=x.delta,
        sensitivity=_need(x.sensitivity),
        algorithm=x.algorithm,
    )


def _mgm_udn_budget(x: BudgetInputs) -> PrecisionBudget:
    return cal.mgm_udn_budget(
        m=x.m, n=x.n, epsilon=x.epsilon, delta=x.delta, sensitivity=_need(x.sensitivity)
    )


def _mgm_idn_budget(x: BudgetInputs) -> PrecisionBudget:
    assert x.entry_range is not None  # CalibrationRule.budget checked it
    return cal.mgm_idn_budget(
        m=x.m, n=x.n, epsilon=x.epsilon, delta=x.delta, entry_range=x.entry_range
    )


# -- left-hand sides on the eigenvalues of Sigma (sig_inv = eigenvalues of Sigma^-1) ----------
def _mvg_thm2_lhs(eig: np.ndarray, n: int, algorithm: Algorithm) -> float:
    # ||sigma(Sigma^-1)||_2 ||sigma(Psi^-1)||_2, Psi = I_n (norm sqrt(n)) or Sigma
    sig_norm = float(np.linalg.norm(1.0 / eig))
    return sig_norm * (math.sqrt(n) if algorithm == "unimodal" else sig_norm)


def _mvg_thm3_lhs(eig: np.ndarray, n: int, algorithm: Algorithm) -> float:
    # ||sigma(Sigma^-1)||_2^2
    return float(np.sum((1.0 / eig) ** 2))


def _mgm_lhs(eig: np.ndarray, n: int, algorithm: Algorithm) -> float:
    # ||U_1^-1||_F^2 ||U_2^-1||_F^2 = tr(Sigma^-1) tr(Psi^-1)
    tr = float(np.sum(1.0 / eig))
    return tr * (float(n) if algorithm == "unimodal" else tr)


def _mgm_directional_lhs(eig: np.ndarray, n: int, algorithm: Algorithm) -> float:
    # ||U_1^-1||_F^2 = tr(Sigma^-1)
    return float(np.sum(1.0 / eig))


_RULES: tuple[CalibrationRule, ...] = (
    CalibrationRule(
        name="exact",
        paper=None,
        theorem="analytic Gaussian on the whitened query",
        reference=_AG,
        condition="delta_AG(epsilon, Delta_M) <= delta, Delta_M the Mahalanobis sensitivity",
        budget_kind="none",
        allocation_kind="linear",
        requires=Requirements(symmetric_noise=True),
        gaussian_dp=True,
    ),
    CalibrationRule(
        name="mvg-thm2",
        paper="MVG",
        theorem="MVG Thm. 2",
        reference=f"{_MVG}, Thm. 2; Alg. 1 budget Thm. 5, Alg. 2 budget Thm. 6",
        condition=(
            "||sigma(Sigma^-1)||_2 ||sigma(Psi^-1)||_2 <= (-b + sqrt(b^2 + 8 a eps))^2/(4a^2)"
        ),
        budget_kind="squared",
        allocation_kind="squared",
        uses_gamma=True,
        uses_sensitivity=True,
        budget_function=_mvg_thm2_budget,
        lhs_function=_mvg_thm2_lhs,
    ),
    CalibrationRule(
        name="mvg-thm3",
        paper="MVG",
        theorem="MVG Thm. 3",
        reference=f"{_MVG}, Thm. 3; Alg. 2 budget Thm. 6",
        condition="||sigma(Sigma^-1)||_2^2 <= (-b + sqrt(b^2 + 8 w eps))^2/(4w^2)",
        budget_kind="squared",
        allocation_kind="squared",
        requires=Requirements(psd_query=True, square_query=True, algorithms=("equi-modal",)),
        uses_gamma=True,
        uses_sensitivity=True,
        budget_function=_mvg_thm3_budget,
        lhs_function=_mvg_thm3_lhs,
    ),
    CalibrationRule(
        name="mgm",
        paper="MGM",
        theorem="MGM Thm. 1",
        reference=f"{_MGM}, Thm. 1, Eq. (11)",
        condition="||U_1^-1||_F^2 ||U_2^-1||_F^2 <= (-b + sqrt(b^2 + 8 a eps))^2/(4a^2)",
        budget_kind="linear",
        allocation_kind="linear",
        uses_sensitivity=True,
        budget_function=_mgm_budget,
        lhs_function=_mgm_lhs,
    ),
    CalibrationRule(
        name="mgm-udn",
        paper="MGM",
        theorem="MGM Thm. 2",
        reference=f"{_MGM}, Thm. 2 (UDN), Eq. (12)",
        condition="||U_1^-1||_F^2 <= (-b + sqrt(b^2 + 8 a eps))^2/(4a^2)",
        budget_kind="linear",
        allocation_kind="linear",
        requires=Requirements(algorithms=("unimodal",)),
        uses_sensitivity=True,
        budget_function=_mgm_udn_budget,
        lhs_function=_mgm_directional_lhs,
    ),
    CalibrationRule(
        name="mgm-idn",
        paper="MGM",
        theorem="MGM Thm. 3",
        reference=f"{_MGM}, Thm. 3 (IDN), Eq. (13)",
        condition="||U_1^-1||_F^2 <= m/s^2 (-zeta + sqrt(zeta^2 + 2 eps))^2, s = (b-a) sqrt(mn)",
        budget_kind="linear",
        allocation_kind="linear",
        requires=Requirements(algorithms=("unimodal",), standard_directions=True),
        uses_entry_range=True,
        budget_function=_mgm_idn_budget,
        lhs_function=_mgm_directional_lhs,
    ),
)

#: Every calibration by name, in the order of :data:`CALIBRATIONS`.
REGISTRY: Mapping[Calibration, CalibrationRule] = MappingProxyType({r.name: r for r in _RULES})
#: The calibration names, derived from the registry.
CALIBRATIONS: tuple[Calibration, ...] = tuple(REGISTRY)
if set(CALIBRATIONS) != set(get_args(Calibration)):  # pragma: no cover - import-time guard
    raise ImportError("the Calibration type and the calibration registry disagree")


def get_calibration(name: str) -> CalibrationRule:
    """The rule of calibration ``name``.

    Parameters
    ----------
    name : str
        A calibration name.

    Returns
    -------
    CalibrationRule
        Its blueprint.

    Raises
    ------
    CompatibilityError
        For an unknown name (a ``ValueError`` naming the valid ones).
    """
    rule = REGISTRY.get(name)  # type: ignore[call-overload]
    if rule is None:
        raise CompatibilityError(
            "calibration", f"calibration must be one of {', '.join(CALIBRATIONS)}, got {name!r}"
        )
    return rule


def _fits(
    rule: CalibrationRule,
    algorithm: Algorithm,
    *,
    psd: bool,
    square: bool,
    standard_directions: bool,
    symmetric: bool | None = None,
) -> bool:
    req = rule.requires
    sym = psd if symmetric is None else symmetric
    return (
        (square or algorithm == "unimodal")  # Psi = Sigma needs m == n, whatever the theorem
        and (algorithm != "symmetric" or (square and sym))
        and (psd or not req.psd_query)
        and (square or not req.square_query)
        and req.covers(algorithm)
        and (standard_directions or not req.standard_directions)
    )


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def compatible_calibrations(
    algorithm: Algorithm,
    *,
    psd: bool,
    square: bool,
    standard_directions: bool,
    symmetric: bool | None = None,
) -> tuple[Calibration, ...]:
    """The calibrations whose requirements this query, noise type and directions meet.

    Parameters
    ----------
    algorithm : {"unimodal", "equi-modal", "symmetric"}
        Noise type.
    psd, square : bool
        The query's outputs are symmetric PSD; its output is square.
    standard_directions : bool
        The directions are the standard basis.
    symmetric : bool, optional
        The query's outputs are symmetric (default: ``psd``).

    Returns
    -------
    tuple of str
        Calibration names, in registry order.
    """
    return tuple(
        r.name
        for r in _RULES
        if _fits(
            r,
            algorithm,
            psd=psd,
            square=square,
            standard_directions=standard_directions,
            symmetric=symmetric,
        )
    )


def _check_query(
    rule: CalibrationRule,
    alg: Algorithm,
    query_kind: str,
    *,
    psd: bool,
    square: bool,
    symmetric: bool,
    others: Callable[[], str],
) -> None:
    """:func:`check_compatible`'s rules on the query: PSD, square, symmetric."""
    req = rule.requires
    if req.psd_query and not psd:
        raise CompatibilityError(
            "calibration",
            f"{rule.label} holds only for symmetric PSD queries, and the {query_kind} query is "
            f"not one: use {others()}",
        )
    if req.square_query and not square:
        raise CompatibilityError(
            "calibration",
            f"{rule.label} needs a square query, and the {query_kind} query is not square: "
            f"use {others()}",
        )
    if alg == "symmetric" and not (square and symmetric):
        raise CompatibilityError(
            "algorithm",
            f"symmetric noise (A S A^T, S symmetric) needs a symmetric query, and the "
            f"{query_kind} query is not symmetric: use algorithm: unimodal",
        )


def _check_noise(
    rule: CalibrationRule,
    alg: Algorithm,
    query_kind: str,
    *,
    square: bool,
    standard_directions: bool,
    others: Callable[[], str],
) -> None:
    """:func:`check_compatible`'s rules on the noise: its algorithm and its directions."""
    req = rule.requires
    if alg == "symmetric" and not req.covers(alg):
        raise CompatibilityError(
            "algorithm",
            f"{rule.label} does not cover symmetric noise (A S A^T): use calibration exact, or "
            "algorithm: equi-modal",
        )
    if alg == "equi-modal" and not square:
        remedy = "use algorithm: unimodal"
        if "unimodal" not in req.algorithms:
            remedy += f" and {others()}"
        raise CompatibilityError(
            "algorithm",
            f"{EQUI_MODAL_NEEDS_SQUARE}, and the {query_kind} query is not square: {remedy}",
        )
    if not req.covers(alg):
        needed = req.algorithms[0]
        psi = "Psi = I" if needed == "unimodal" else "Psi = Sigma"
        raise CompatibilityError(
            "algorithm",
            f"{rule.label} is for {needed} noise only ({psi}): use algorithm: {needed}, "
            f"or {others()}",
        )
    if req.standard_directions and not standard_directions:
        raise CompatibilityError(
            "directions",
            f"{rule.label} needs independent noise per row (diagonal U_1): use directions: "
            f"standard, or {others()}",
        )


def check_compatible(
    calibration: str,
    algorithm: str,
    *,
    query_kind: str,
    psd: bool,
    square: bool,
    standard_directions: bool,
    symmetric: bool | None = None,
) -> CalibrationRule:
    """Check that a calibration, a noise type, a query and directions go together.

    The one place the compatibility rules live; the spec validator, the noise plan and the
    command line call it. Each rule has one wording, which names the remedy.

    Parameters
    ----------
    calibration : str
        Calibration name.
    algorithm : str
        ``"unimodal"`` (Alg. 1, ``Psi = I``), ``"equi-modal"`` (Alg. 2, ``Psi = Sigma``) or
        ``"symmetric"`` (``A S A^T``, ``S`` symmetric: symmetric queries, ``exact`` only).
    query_kind : str
        The query's name, for the messages (``"identity"``, ``"covariance"``, ``"custom"``).
    psd : bool
        Every output of the query is symmetric positive semi-definite.
    square : bool
        The query's output is square.
    standard_directions : bool
        The noise directions are the standard basis.
    symmetric : bool, optional
        Every output of the query is symmetric (default: ``psd``).

    Returns
    -------
    CalibrationRule
        The calibration's rule.

    Raises
    ------
    CompatibilityError
        A ``ValueError`` whose ``field`` names the setting to change.
    """
    rule = get_calibration(calibration)
    if algorithm not in ALGORITHMS:
        raise CompatibilityError(
            "algorithm", f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}"
        )
    alg: Algorithm = algorithm
    # with a non-square query only unimodal noise is possible: remedies are named for it
    feasible: Algorithm = alg if square else "unimodal"

    sym = psd if symmetric is None else symmetric

    def others() -> str:
        names = compatible_calibrations(
            feasible,
            psd=psd,
            square=square,
            standard_directions=standard_directions,
            symmetric=sym,
        )
        alternatives = f"calibration {_join([n for n in names if n != rule.name])}"
        return alternatives if feasible == alg else f"{alternatives} with algorithm: {feasible}"

    _check_query(rule, alg, query_kind, psd=psd, square=square, symmetric=sym, others=others)
    _check_noise(
        rule,
        alg,
        query_kind,
        square=square,
        standard_directions=standard_directions,
        others=others,
    )
    return rule
