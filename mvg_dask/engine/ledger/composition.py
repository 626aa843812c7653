"""Composition of releases against a budget, and the neighbour-relation conversion.

Composition is basic (``sum eps``, ``sum delta``) by default. When every release of a dataset is
a Gaussian mechanism after whitening (the ``exact`` calibration), the releases compose exactly as
Gaussian DP, ``mu^2 = sum mu_i^2``, and the budget admits them while
``delta_AG(eps_total, mu) <= delta_total``. Which releases may compose as Gaussian DP is decided
in one place, :func:`gaussian_dp_composable`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class Spending:
    """What a set of releases spends under the dataset's composition rule."""

    composition: str
    epsilon: float
    delta: float
    mu: float | None

    def fits(self, budget_epsilon: float, budget_delta: float) -> bool:
        """True when the spending is within the budget."""
        if self.composition == "gaussian-dp":
            assert self.mu is not None
            return cal.analytic_gaussian_delta(budget_epsilon, self.mu) <= budget_delta
        return self.epsilon <= budget_epsilon * (1 + _TOL) and self.delta <= budget_delta * (
            1 + _TOL
        )


Charge = tuple[float, float, str, float | None]


def gaussian_dp_composable(entries: Sequence[Charge]) -> bool:
    """Whether every charge is a Gaussian mechanism with a mu (they compose as Gaussian DP).

    The one place that decides it: today a release is Gaussian when its calibration is
    ``exact``.
    """
    return bool(entries) and all(c == "exact" and mu is not None for _, _, c, mu in entries)


def spending(entries: Sequence[Charge], budget_delta: float) -> Spending:
    """Compose ``(epsilon, delta, calibration, mu)`` charges of releases.

    Parameters
    ----------
    entries : sequence of tuple
        One charge per release (pending, committed and aborted releases all count).
    budget_delta : float
        The dataset's delta (the epsilon of a Gaussian-DP total is reported at it).

    Returns
    -------
    Spending
        Basic composition, or exact Gaussian-DP composition when
        :func:`gaussian_dp_composable`.
    """
    if gaussian_dp_composable(entries):
        mu = math.sqrt(math.fsum(float(m or 0.0) ** 2 for _, _, _, m in entries))
        return Spending(
            "gaussian-dp", cal.analytic_gaussian_epsilon(mu, budget_delta), budget_delta, mu
        )
    return Spending(
        "basic",
        math.fsum(e for e, _, _, _ in entries),
        math.fsum(d for _, d, _, _ in entries),
        None,
    )
