"""Composition of releases against a budget, and the neighbour-relation conversion.

Three rules, the tightest that applies:

* ``gaussian-dp``: every release is a Gaussian mechanism after whitening (the ``exact``
  calibration); they compose exactly, ``mu^2 = sum mu_i^2``, and the budget admits them while
  ``delta_AG(eps_total, mu) <= delta_total``. Which releases may compose as Gaussian DP is
  decided in one place, :func:`gaussian_dp_composable`.
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

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mvg_dask.errors import BudgetError
from mvg_dask.privacy import calibration as cal

Neighbours = Literal["replace-one", "add-remove"]
NEIGHBOURS: tuple[Neighbours, ...] = ("replace-one", "add-remove")
_TOL = 1e-12


@dataclass(frozen=True)
class Guarantee:
    """A release's privacy guarantee under one neighbour relation.

    Attributes
    ----------
    epsilon, delta : float
        The (epsilon, delta)-DP guarantee.
    mu : float or None
        The mu-GDP guarantee of a Gaussian mechanism (``exact`` calibration), else None.
    neighbours : {"replace-one", "add-remove"}
        The neighbour relation the guarantee holds for.
    """

    epsilon: float
    delta: float
    mu: float | None
    neighbours: Neighbours


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
    if not allow:
        e2, d2 = 2 * g.epsilon, (1 + math.exp(g.epsilon)) * g.delta
        raise BudgetError(
            "privacy.neighbours: this add-remove release does not match the dataset's "
            "replace-one budget; set ledger.convert_neighbours: true to charge it by group "
            f"privacy as epsilon={e2:g}, delta={d2:.3g} (replace-one = remove + add), or use "
            "privacy.neighbours: replace-one"
        )
    return Guarantee(
        epsilon=2 * g.epsilon,
        delta=(1 + math.exp(g.epsilon)) * g.delta,
        mu=None if g.mu is None else 2 * g.mu,
        neighbours=budget,
    )


#: Grid of the privacy-loss distributions (dp-accounting's default).
PLD_DISCRETISATION = 1e-4
#: The privacy-loss-distribution total is reported when it is below the basic sum by more than
#: this fraction (otherwise the basic sum, which a person can check; admission uses both).
PLD_REPORT_GAIN = 1e-3


@dataclass(frozen=True)
class Spending:
    """What a set of releases spends under the dataset's composition rule.

    Attributes
    ----------
    composition : {"basic", "gaussian-dp", "pld"}
        The rule whose numbers are reported.
    epsilon, delta : float
        The spent guarantee (for ``gaussian-dp`` and ``pld``: epsilon at the budget's delta).
    mu : float or None
        The Gaussian-DP total (``gaussian-dp`` only).
    basic : tuple of float or None
        ``(sum eps, sum delta)`` where basic composition also applies (not ``gaussian-dp``).
    """

    composition: str
    epsilon: float
    delta: float
    mu: float | None
    basic: tuple[float, float] | None = None
    pld: Any = field(default=None, repr=False, compare=False)

    def fits(self, budget_epsilon: float, budget_delta: float) -> bool:
        """True when the spending is within the budget."""
        if self.composition == "gaussian-dp":
            assert self.mu is not None
            return cal.analytic_gaussian_delta(budget_epsilon, self.mu) <= budget_delta
        if self.basic is not None and _basic_fits(self.basic, budget_epsilon, budget_delta):
            return True
        if self.pld is not None:
            return float(self.pld.get_delta_for_epsilon(budget_epsilon)) <= budget_delta
        return False


def _basic_fits(basic: tuple[float, float], budget_epsilon: float, budget_delta: float) -> bool:
    eps, delta = basic
    return eps <= budget_epsilon * (1 + _TOL) and delta <= budget_delta * (1 + _TOL)


Charge = tuple[float, float, str, float | None]


def gaussian_dp_composable(entries: Sequence[Charge]) -> bool:
    """Whether every charge is a Gaussian mechanism with a mu (they compose as Gaussian DP).

    The one place that decides it: today a release is Gaussian when its calibration is
    ``exact``.
    """
    return bool(entries) and all(_is_gaussian(c) for c in entries)


def _is_gaussian(charge: Charge) -> bool:
    _, _, calibration, mu = charge
    return calibration == "exact" and mu is not None


@functools.lru_cache(maxsize=256)
def _gaussian_pld(mu: float) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(
        1.0 / mu, sensitivity=1.0, value_discretization_interval=PLD_DISCRETISATION
    )


@functools.lru_cache(maxsize=256)
def _approx_dp_pld(epsilon: float, delta: float, count: int) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld
    from dp_accounting.pld.common import DifferentialPrivacyParameters

    one = pld.from_privacy_parameters(
        DifferentialPrivacyParameters(epsilon, delta),
        value_discretization_interval=PLD_DISCRETISATION,
    )
    return one if count == 1 else one.self_compose(count)


def mixed_pld(entries: Sequence[Charge]) -> Any:
    """dp-accounting's privacy-loss distribution of a set of releases (see the module text).

    Parameters
    ----------
    entries : sequence of tuple
        ``(epsilon, delta, calibration, mu)`` charges, at least one.

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        The composition: ``get_delta_for_epsilon`` is an upper bound of the true delta.
    """
    gauss = [float(c[3] or 0.0) for c in entries if _is_gaussian(c)]
    others: dict[tuple[float, float], int] = {}
    for c in entries:
        if not _is_gaussian(c):
            key = (float(c[0]), float(c[1]))
            others[key] = others.get(key, 0) + 1
    parts = [_approx_dp_pld(e, d, k) for (e, d), k in sorted(others.items())]
    mu = math.sqrt(math.fsum(m * m for m in gauss))
    if mu > 0:
        parts.append(_gaussian_pld(mu))
    if not parts:
        raise ValueError("mixed_pld needs at least one release")
    out = parts[0]
    for part in parts[1:]:
        out = out.compose(part)
    return out


def spending(entries: Sequence[Charge], budget_delta: float) -> Spending:
    """Compose ``(epsilon, delta, calibration, mu)`` charges of releases.

    Parameters
    ----------
    entries : sequence of tuple
        One charge per release (pending, committed and aborted releases all count).
    budget_delta : float
        The dataset's delta (the epsilon of a Gaussian-DP or PLD total is reported at it).

    Returns
    -------
    Spending
        Exact Gaussian-DP composition when :func:`gaussian_dp_composable`; otherwise basic
        composition, and for two or more releases also the privacy-loss-distribution
        composition (:func:`mixed_pld`), whose epsilon is reported when it is the smaller one.
    """
    if gaussian_dp_composable(entries):
        mu = math.sqrt(math.fsum(float(m or 0.0) ** 2 for _, _, _, m in entries))
        return Spending(
            "gaussian-dp", cal.analytic_gaussian_epsilon(mu, budget_delta), budget_delta, mu
        )
    basic = (math.fsum(e for e, _, _, _ in entries), math.fsum(d for _, d, _, _ in entries))
    if len(entries) < 2:
        return Spending("basic", basic[0], basic[1], None, basic=basic)
    composed = mixed_pld(entries)
    eps = float(composed.get_epsilon_for_delta(budget_delta))
    if basic[1] <= budget_delta * (1 + _TOL) and eps >= basic[0] * (1 - PLD_REPORT_GAIN):
        # within PLD_REPORT_GAIN of the basic sum: report the sum a person can check
        return Spending("basic", basic[0], basic[1], None, basic=basic, pld=composed)
    return Spending("pld", eps, budget_delta, None, basic=basic, pld=composed)
