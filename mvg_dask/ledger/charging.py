"""The transaction-level steps of a charge, shared by releases (:mod:`mvg_dask.ledger.base`) and
streams (:mod:`mvg_dask.ledger.streams`): read (and lock) a dataset's budget, read what it has
spent, check that a new charge fits, and write the pending entry that holds it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from mvg_dask.errors import BudgetError
from mvg_dask.ledger.composition import Guarantee, Neighbours, Spending, spending
from mvg_dask.privacy.accounting import PrivacyLoss, loss_from_json, loss_to_json


class Executor(Protocol):
    """What the protocol needs of a transaction: ``execute`` with ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any:  # pragma: no cover
        """Run one statement; the result has ``fetchone``, ``fetchall`` and ``rowcount``."""
        ...


def _charges(ex: Executor, dataset: str) -> list[PrivacyLoss]:
    """What every release of ``dataset`` counts against its budget."""
    rows = ex.execute("SELECT charge FROM releases WHERE dataset = ?", (dataset,)).fetchall()
    return [loss_from_json(r[0]) for r in rows]


def _check_fits(
    dataset: str,
    charges: list[PrivacyLoss],
    charge: Guarantee,
    budget: tuple[float, float],
    *,
    converted: bool,
) -> Spending:
    """The dataset's spending with the new charge (``converted``: to the budget's neighbour
    relation); refused when it exceeds the budget."""
    b_eps, b_delta = budget
    before = spending(charges, b_delta)
    after = spending([*charges, charge.loss], b_delta)
    if not after.fits(b_eps, b_delta):
        how = " after conversion to replace-one" if converted else ""
        raise BudgetError(
            f"privacy budget of dataset {dataset!r} would be exceeded: spent "
            f"epsilon={before.epsilon:.6g}, delta={before.delta:.3g} ({before.composition})"
            f" of epsilon={b_eps:g}, delta={b_delta:g}; this release needs "
            f"epsilon={charge.epsilon:g}, delta={charge.delta:.3g}{how}. Nothing "
            "was read or charged"
        )
    return after


def _insert_release(
    ex: Executor,
    row: tuple[Any, ...],
    charge: Guarantee,
    recorded: tuple[str, str, str | None],
) -> None:
    """The pending entry: the release's own guarantee (``row``), its charge, and its spec hash,
    output and key (``recorded``)."""
    release_id, dataset, calibration, loss, neighbours = row
    spec_hash, output, noise_key = recorded
    ex.execute(
        "INSERT INTO releases (release_id, dataset, status, calibration, loss, neighbours, "
        "charge, spec_hash, output, noise_key, seeded, created) "
        "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            release_id,
            dataset,
            calibration,
            loss_to_json(loss),
            neighbours,
            loss_to_json(charge.loss),
            spec_hash,
            output,
            noise_key,
            False,
            time.time(),
        ),
    )


def _read_budget(
    ex: Executor, dataset: str, lock_clause: str, where: str
) -> tuple[float, float, Neighbours]:
    """The dataset's budget, read (and locked by ``lock_clause``, where the backend can) for a
    reservation."""
    budget = ex.execute(
        "SELECT epsilon, delta, neighbours FROM datasets WHERE dataset = ?" + lock_clause,
        (dataset,),
    ).fetchone()
    if budget is None:
        raise BudgetError(f"ledger.dataset: {dataset!r} has no budget in {where}")
    return tuple(budget)
