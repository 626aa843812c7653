"""The dry run as a person reads it: the plan plus what the ledger would have left afterwards.

:func:`budget_after` reads the ledger without reserving anything (a missing SQLite ledger is
read as empty and is not created) and composes this release's charge with the dataset's
existing charges by the ledger's own rule (:func:`~mvg_dask.ledger.spending`,
:func:`~mvg_dask.ledger.convert_neighbours`). :class:`PlanPreview` is what
``mvg-dask release --dry-run`` prints and ``ds.mvg.dry_run(...)`` shows in a notebook.

Everything here is a function of the spec, public metadata and the ledger's charges, never of
the data (the ledger's charges are (epsilon, delta) values, which do not depend on the data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mvg_dask.errors import BudgetError, LedgerError
from mvg_dask.ledger import Guarantee, convert_neighbours, open_ledger, spending
from mvg_dask.ledger.base import check_registered_budget
from mvg_dask.ledger.location import parse_location
from mvg_dask.plan.presentation import Row, plan_rows, render_html, render_text
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.privacy.accounting import PrivacyLoss, loss_from_json

__all__ = ["BudgetPreview", "PlanPreview", "budget_after", "preview"]


@dataclass(frozen=True, kw_only=True)
class BudgetPreview:
    """A dataset's budget before and after one more release (nothing reserved).

    Attributes
    ----------
    dataset : str
        The ledger's dataset.
    budget_epsilon, budget_delta : float
        Its total budget (the ledger's, or the spec's for a dataset not yet in the ledger).
    neighbours : str
        The budget's neighbour relation.
    composition : str
        ``basic``, ``gaussian-dp`` or ``pld`` after this release.
    spent_epsilon, spent_delta : float
        Spent before this release.
    charge_epsilon, charge_delta : float
        This release's charge in the budget's relation (after a neighbour conversion).
    after_epsilon, after_delta : float
        Spent after it.
    fits : bool
        Whether the release fits (the reservation would succeed).
    refused : str or None
        Why the ledger would refuse it (neighbour relations that do not match).
    """

    dataset: str
    budget_epsilon: float
    budget_delta: float
    neighbours: str
    composition: str
    spent_epsilon: float
    spent_delta: float
    charge_epsilon: float
    charge_delta: float
    after_epsilon: float
    after_delta: float
    fits: bool
    refused: str | None = None

    @property
    def left_epsilon(self) -> float:
        """Epsilon left after this release (0 when it does not fit)."""
        return max(self.budget_epsilon - self.after_epsilon, 0.0)

    def text(self) -> str:
        """One line for the plan table."""
        head = f"dataset {self.dataset} ({self.neighbours})"
        if self.refused is not None:
            return f"{head}: refused: {self.refused}"
        spent = f"spent epsilon = {self.spent_epsilon:.4g} of {self.budget_epsilon:g}"
        if not self.fits:
            return (
                f"{head}: refused: this release (epsilon = {self.charge_epsilon:.4g}) would "
                f"exceed the budget ({spent}, {self.composition} composition)"
            )
        if self.composition in _AT_BUDGET_DELTA:
            how = _AT_BUDGET_DELTA[self.composition]
            delta = f"delta = {self.budget_delta:.3g} ({how} composition)"
        else:
            delta = f"delta = {max(self.budget_delta - self.after_delta, 0.0):.3g} left"
        left = f"left after this release: epsilon = {self.left_epsilon:.4g}, {delta}"
        return f"{head}: {spent}; {left}"


#: Compositions whose epsilon is reported at the budget's delta, and how the text names them.
_AT_BUDGET_DELTA = {"gaussian-dp": "Gaussian-DP", "pld": "privacy-loss-distribution"}


def empty_or_missing(location: str) -> bool:
    """True for a SQLite ledger that does not exist yet, or an empty file (a release creates
    the ledger in it).

    Raises
    ------
    LedgerError
        When the path is a directory.
    """
    loc = parse_location(location)
    if loc.backend != "sqlite":
        return False
    from pathlib import Path

    path = Path(loc.target)
    if path.is_dir():
        raise LedgerError(f"ledger {loc.display()} is a directory, not a SQLite file")
    return not path.is_file() or path.stat().st_size == 0


def _read_summary(location: str, password_file: str | None) -> list[dict[str, Any]]:
    if empty_or_missing(location):
        return []
    with open_ledger(location, password_file=password_file, create=False) as book:
        return book.summary()


def budget_after(
    rplan: ReleasePlan, *, summary: list[dict[str, Any]] | None = None
) -> BudgetPreview | None:
    """What the ledger would have spent and left after this release, without reserving.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan (``None`` is returned when it charges no ledger).
    summary : list of dict, optional
        The ledger's :meth:`~mvg_dask.ledger.Ledger.summary`, when already read (else
        the ledger is read here).

    Returns
    -------
    BudgetPreview or None
        The preview.

    Raises
    ------
    LedgerError
        When the ledger exists but cannot be read.
    """
    charge = rplan.ledger
    if charge is None:
        return None
    if summary is None:
        summary = _read_summary(charge.location, charge.password_file)
    mine = next((d for d in summary if d["dataset"] == charge.dataset), None)
    if mine is None:  # reserve() creates it with the spec's budget
        b_eps, b_delta, b_nb = charge.budget_epsilon, charge.budget_delta, charge.budget_neighbours
        existing: list[PrivacyLoss] = []
    else:
        b = mine["budget"]
        b_eps, b_delta, b_nb = float(b["epsilon"]), float(b["delta"]), b["neighbours"]
        existing = [loss_from_json(r["charged"]["loss"]) for r in mine["releases"]]
    before = spending(existing, b_delta) if existing else None
    own = Guarantee(charge.loss, charge.neighbours)
    refused = None if mine is None else _registered_refusal(charge, mine["budget"])
    try:
        g = convert_neighbours(own, b_nb, allow=charge.convert_neighbours)
    except BudgetError as exc:
        refused, g = refused or str(exc), own
    after = spending([*existing, g.loss], b_delta)
    return BudgetPreview(
        dataset=charge.dataset,
        budget_epsilon=b_eps,
        budget_delta=b_delta,
        neighbours=b_nb,
        composition=after.composition,
        spent_epsilon=0.0 if before is None else before.epsilon,
        spent_delta=0.0 if before is None else before.delta,
        charge_epsilon=g.epsilon,
        charge_delta=g.delta,
        after_epsilon=after.epsilon,
        after_delta=after.delta,
        fits=refused is None and after.fits(b_eps, b_delta),
        refused=refused,
    )


def _registered_refusal(charge: Any, registered: dict[str, Any]) -> str | None:
    """Why the ledger refuses a spec whose budget is not the one its dataset is registered
    with (what the release itself would say), or ``None``."""
    try:
        check_registered_budget(
            charge.dataset,
            (
                float(registered["epsilon"]),
                float(registered["delta"]),
                str(registered["neighbours"]),
            ),
            (charge.budget_epsilon, charge.budget_delta, charge.budget_neighbours),
            where=parse_location(charge.location).display(),
        )
    except BudgetError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class PlanPreview:
    """A dry run to read: the plan and the budget it leaves (text in a terminal, a table in a
    notebook).

    Attributes
    ----------
    plan : ReleasePlan
        The plan (``.public_dict()`` is the dry run's JSON).
    budget : BudgetPreview or None
        The ledger's budget after this release; ``None`` without a ledger.
    budget_note : str or None
        Why the budget could not be read, when it could not.
    """

    plan: ReleasePlan
    budget: BudgetPreview | None
    budget_note: str | None = None

    def rows(self) -> list[Row]:
        """The plan's lines and the budget line."""
        rows = plan_rows(self.plan)
        if self.budget is not None:
            rows.append(("budget", self.budget.text()))
        elif self.budget_note is not None:
            rows.append(("budget", self.budget_note))
        else:
            rows.append(("budget", "no ledger in the spec: not charged to any privacy budget"))
        return rows

    @property
    def title(self) -> str:
        """The first line."""
        return f"release plan {self.plan.release_id} (dry run: no data read, nothing charged)"

    def text(self) -> str:
        """The terminal summary."""
        return render_text(self.title, self.rows())

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return render_html(self.title, self.rows())


def preview(rplan: ReleasePlan) -> PlanPreview:
    """The plan and its budget preview; a ledger that cannot be read becomes a note."""
    try:
        return PlanPreview(rplan, budget_after(rplan))
    except LedgerError as exc:
        return PlanPreview(rplan, None, f"cannot read the ledger: {exc}")
