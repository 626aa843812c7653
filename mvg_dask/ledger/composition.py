"""The ledger's composition of releases against a budget, and the neighbour-relation conversion.

Each release's charge is a typed privacy loss (:mod:`mvg_dask.privacy.accounting`: its
calibration produces it, :meth:`~mvg_dask.privacy.registry.CalibrationRule.loss`), and the
ledger composes the charges of a dataset with
:class:`~mvg_dask.privacy.accounting.LedgerAccountant`, the tightest rule that applies:

* ``gaussian-dp``: every release is a Gaussian mechanism after whitening (the ``exact``
  calibration); they compose exactly, ``mu^2 = sum mu_i^2``, and the budget admits them while
  ``delta_AG(eps_total, mu) <= delta_total``.
* ``pld``: a mix (or several releases with a paper calibration, whose guarantee is a bare
  ``(epsilon_i, delta_i)``). The Gaussian releases merge into one ``mu``; each other release
  contributes the worst-case privacy-loss distribution of an ``(epsilon_i, delta_i)``-DP
  mechanism; dp-accounting's privacy-loss-distribution accountant composes them (pessimistic
  discretisation, so its ``delta(epsilon)`` is an upper bound). The budget admits the set when
  ``delta(eps_total) <= delta_total`` by this accounting *or* by basic composition (both are
  sound, so either suffices).
* ``basic`` (``sum eps``, ``sum delta``): a single non-Gaussian release, or when the PLD total
  is not smaller by more than ``PLD_REPORT_GAIN`` (0.1 %): the sum is then what is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mvg_dask.errors import BudgetError
from mvg_dask.privacy.accounting import (
    PLD_DISCRETISATION,
    PLD_REPORT_GAIN,
    ApproxDP,
    GaussianDP,
    GaussianDPAccountant,
    LedgerAccountant,
    PrivacyLoss,
    compose_plds,
)
from mvg_dask.privacy.accounting import Spent as Spending
from mvg_dask.privacy.registry import CALIBRATIONS, get_calibration

Neighbours = Literal["replace-one", "add-remove"]
NEIGHBOURS: tuple[Neighbours, ...] = ("replace-one", "add-remove")
__all__ = [
    "NEIGHBOURS",
    "PLD_DISCRETISATION",
    "PLD_REPORT_GAIN",
    "Guarantee",
    "Neighbours",
    "Spending",
    "charge_loss",
    "convert_neighbours",
    "gaussian_dp_composable",
    "mixed_pld",
    "spending",
]


@dataclass(frozen=True)
class Guarantee:
    """A release's privacy guarantee under one neighbour relation.

    Attributes
    ----------
    loss : PrivacyLoss
        The release's privacy loss (its calibration's).
    neighbours : {"replace-one", "add-remove"}
        The neighbour relation the guarantee holds for.
    """

    loss: PrivacyLoss
    neighbours: Neighbours

    @property
    def epsilon(self) -> float:
        """epsilon of the loss's ``(epsilon, delta)`` statement."""
        return self.loss.approx_dp().epsilon

    @property
    def delta(self) -> float:
        """delta of the loss's ``(epsilon, delta)`` statement."""
        return self.loss.approx_dp().delta

    @property
    def mu(self) -> float | None:
        """mu of a Gaussian-DP loss, else None."""
        return self.loss.mu if isinstance(self.loss, GaussianDP) else None


def convert_neighbours(g: Guarantee, budget: Neighbours, *, allow: bool) -> Guarantee:
    """The guarantee ``g`` charged against a budget kept under the relation ``budget``.

    Rule. Replace-one neighbours (same size, one record changed) are two add-remove steps
    apart: remove the record, then add its replacement. So an add-remove guarantee counts,
    by group privacy at group size 2, in a replace-one budget as::

        (epsilon, delta)-DP  ->  (2 epsilon, (1 + e^epsilon) delta)-DP
        mu-GDP               ->  2 mu-GDP

    Proof (one line each): for D ~ D' ~ D'' and any event S,
    P[M(D) in S] <= e^eps (e^eps P[M(D'') in S] + delta) + delta
    = e^(2 eps) P[M(D'') in S] + (1 + e^eps) delta; for mu-GDP, the trade-off functions
    compose along the path (Dong, Roth & Su 2022, Thm 2.14) and two unit-variance Gaussian
    shifts by mu add to one shift by 2 mu.

    A replace-one guarantee gives no add-remove guarantee: it says nothing about datasets of
    different sizes (a replace-one mechanism may publish the record count exactly), so it is
    always refused in an add-remove budget.

    Parameters
    ----------
    g : Guarantee
        The release's guarantee.
    budget : {"replace-one", "add-remove"}
        The budget's neighbour relation.
    allow : bool
        Whether the spec converts explicitly (``ledger.convert_neighbours: true``).

    Returns
    -------
    Guarantee
        ``g`` itself when the relations agree, else the converted guarantee.

    Raises
    ------
    BudgetError
        When the relations differ and the conversion is not allowed or does not exist.

    References
    ----------
    .. [DRS22] J. Dong, A. Roth, W. J. Su. Gaussian differential privacy. JRSS B 84(1), 2022.
    .. [DR14] C. Dwork, A. Roth. The algorithmic foundations of differential privacy, 2014.
    """
    if g.neighbours == budget:
        return g
    if g.neighbours == "replace-one":
        raise BudgetError(
            "privacy.neighbours: a replace-one release cannot be charged to an add-remove "
            "budget: replace-one gives no guarantee between datasets of different sizes (it may "
            "publish the record count exactly); release with privacy.neighbours: add-remove"
        )
    converted = Guarantee(g.loss.group2(), budget)
    if not allow:
        e2, d2 = converted.epsilon, converted.delta
        raise BudgetError(
            "privacy.neighbours: this add-remove release does not match the dataset's "
            "replace-one budget; set ledger.convert_neighbours: true to charge it by group "
            f"privacy as epsilon={e2:g}, delta={d2:.3g} (replace-one = remove + add), or use "
            "privacy.neighbours: replace-one"
        )
    return converted


Charge = tuple[float, float, str, float | None]


def charge_loss(epsilon: float, delta: float, calibration: str, mu: float | None) -> PrivacyLoss:
    """The loss of a charge recorded as ``(epsilon, delta, calibration, mu)`` (the ledger's
    schema before version 3, and the plan's ``LedgerCharge``).

    Gaussian DP when the calibration produces it
    (:meth:`~mvg_dask.privacy.registry.CalibrationRule.loss`) and ``mu`` was recorded; otherwise
    approximate DP (also for a calibration this mvg_dask does not know).
    """
    if calibration in CALIBRATIONS and mu is not None:
        return get_calibration(calibration).loss(epsilon, delta, mu)
    return ApproxDP(epsilon, delta)


def _losses(entries: Sequence[PrivacyLoss | Charge]) -> list[PrivacyLoss]:
    return [c if isinstance(c, PrivacyLoss) else charge_loss(*c) for c in entries]


def gaussian_dp_composable(entries: Sequence[PrivacyLoss | Charge]) -> bool:
    """Whether every charge is a Gaussian mechanism (they compose as Gaussian DP)."""
    return GaussianDPAccountant().applies(_losses(entries))


def mixed_pld(entries: Sequence[PrivacyLoss | Charge]) -> Any:
    """dp-accounting's privacy-loss distribution of a set of releases (see the module text).

    Parameters
    ----------
    entries : sequence of PrivacyLoss or tuple
        Losses, or ``(epsilon, delta, calibration, mu)`` charges, at least one.

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        The composition: ``get_delta_for_epsilon`` is an upper bound of the true delta.
    """
    return compose_plds(_losses(entries))


def spending(entries: Sequence[PrivacyLoss | Charge], budget_delta: float) -> Spending:
    """Compose the charges of releases by the ledger's rule
    (:class:`~mvg_dask.privacy.accounting.LedgerAccountant`).

    Parameters
    ----------
    entries : sequence of PrivacyLoss or tuple
        One charge per release (pending, committed and aborted releases all count), as a loss
        or as ``(epsilon, delta, calibration, mu)``
        (:func:`~mvg_dask.ledger.composition.charge_loss`).
    budget_delta : float
        The dataset's delta (the epsilon of a Gaussian-DP or PLD total is reported at it).

    Returns
    -------
    Spending
        Exact Gaussian-DP composition when every charge is Gaussian; otherwise basic
        composition, and for two or more releases also the privacy-loss-distribution
        composition (:func:`mixed_pld`), whose epsilon is reported when it is the smaller one.
    """
    return LedgerAccountant().total(_losses(entries), budget_delta)
