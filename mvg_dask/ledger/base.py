"""The ledger protocol, written once for every backend.

A backend supplies a connection, a write transaction that serialises reservations per dataset
(:meth:`Ledger._run`), and how to detect its tables; everything else (budgets, reservations,
neighbour rules, composition, commit, abort, cancel, the schema versions) lives here.

Protocol (the README's "Ledger and what is charged when"): a release is *reserved* before any
data is read (refused if it would exceed the budget); the pending entry holds the release key so
that a crashed release can be resumed with the same noise; it is *committed* once the output is
complete, which erases the key. A release that fails after data was read is *aborted*: it stays
charged and its key is erased. A release that fails before any chunk is read is *cancelled*
(refunded). A crashed release stays pending, and charged.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from mvg_dask.crash import crash_point
from mvg_dask.errors import BudgetError, LedgerError, ReleaseError
from mvg_dask.ledger import schema
from mvg_dask.ledger.charging import (
    Executor,
    _charges,
    _check_fits,
    _insert_release,
    _read_budget,
)
from mvg_dask.ledger.composition import (
    NEIGHBOURS,
    Guarantee,
    Neighbours,
    Spending,
    charge_loss,
    spending,
)
from mvg_dask.ledger.composition import (
    convert_neighbours as _convert,
)
from mvg_dask.ledger.streams import StreamLedger, stream_summaries
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import GaussianDP, PrivacyLoss, loss_from_json

T = TypeVar("T")

# an arbitrary constant: the advisory lock that serialises schema creation and migration
SCHEMA_LOCK_ID = 0x6D76675F6C6467


class NoSchemaError(LedgerError):
    """The database holds no mvg_dask ledger yet (opened without ``create``): a release would
    create the ledger's tables in it."""


def check_registered_budget(
    dataset: str,
    registered: tuple[float, float, str],
    spec: tuple[float, float, str],
    *,
    where: str,
) -> None:
    """Refuse a spec whose budget differs from the one its dataset is registered with.

    Parameters
    ----------
    dataset : str
        The dataset.
    registered, spec : tuple of (float, float, str)
        ``(epsilon, delta, neighbours)`` in the ledger and in the spec.
    where : str
        The ledger, for the message (redacted).

    Raises
    ------
    BudgetError
        Naming both budgets.
    """
    eps0, delta0, nb0 = registered
    epsilon, delta, neighbours = spec
    if not (math.isclose(eps0, epsilon) and math.isclose(delta0, delta)):
        raise BudgetError(
            f"ledger.budget: dataset {dataset!r} is registered with epsilon={eps0:g}, "
            f"delta={delta0:g} in {where}; the spec says epsilon={epsilon:g}, "
            f"delta={delta:g}: use the registered budget"
        )
    if nb0 != neighbours:
        raise BudgetError(
            f"ledger.budget.neighbours: dataset {dataset!r} keeps its budget in "
            f"{nb0} neighbours in {where}; the spec says {neighbours}: use "
            f"{nb0} (a release of the other relation converts with "
            "ledger.convert_neighbours)"
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One release in the ledger (``noise_key`` only while pending).

    ``loss`` and ``neighbours`` are the release's own guarantee (its ``epsilon``, ``delta`` and
    ``mu`` are read from it); ``charge`` is what it counts against its budget (the same loss
    unless converted to the budget's neighbour relation; ``charge_epsilon``, ``charge_delta``,
    ``charge_mu``). ``reason`` (aborts) and ``clipped`` (the exact clipped count) are
    curator-side facts: they are shown by ``ledger show`` and never published.
    """

    release_id: str
    dataset: str
    status: str
    calibration: str
    loss: PrivacyLoss
    charge: PrivacyLoss
    spec_hash: str
    output: str
    noise_key: str | None
    seeded: bool
    created: float
    committed: float | None
    neighbours: str = "replace-one"
    aborted: float | None = None
    reason: str | None = None
    clipped: int | None = None

    @property
    def epsilon(self) -> float:
        """The release's own epsilon."""
        return self.loss.approx_dp().epsilon

    @property
    def delta(self) -> float:
        """The release's own delta."""
        return self.loss.approx_dp().delta

    @property
    def mu(self) -> float | None:
        """The release's own mu (Gaussian DP), else None."""
        return _mu(self.loss)

    @property
    def charge_epsilon(self) -> float:
        """The epsilon it counts against its budget."""
        return self.charge.approx_dp().epsilon

    @property
    def charge_delta(self) -> float:
        """The delta it counts against its budget."""
        return self.charge.approx_dp().delta

    @property
    def charge_mu(self) -> float | None:
        """The mu it counts against its budget (Gaussian DP), else None."""
        return _mu(self.charge)

    def public(self) -> dict[str, Any]:
        """The entry without its key (for ``ledger show`` and ``ledger export``)."""
        return {
            "release_id": self.release_id,
            "dataset": self.dataset,
            "status": self.status,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mu": self.mu,
            "loss": self.loss.to_json(),
            "neighbours": self.neighbours,
            "charged": {
                "epsilon": self.charge_epsilon,
                "delta": self.charge_delta,
                "mu": self.charge_mu,
                "loss": self.charge.to_json(),
            },
            "calibration": self.calibration,
            "spec_hash": self.spec_hash,
            "output": self.output,
            "seeded": self.seeded,
            "created": _iso(self.created),
            "committed": _iso(self.committed) if self.committed else None,
            "aborted": _iso(self.aborted) if self.aborted else None,
            "reason": self.reason,
            "clipped": self.clipped,
        }


def _mu(loss: PrivacyLoss) -> float | None:
    return loss.mu if isinstance(loss, GaussianDP) else None


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _entry(row: Sequence[Any]) -> LedgerEntry:
    return LedgerEntry(
        release_id=row[0],
        dataset=row[1],
        status=row[2],
        calibration=row[3],
        loss=loss_from_json(row[4]),
        neighbours=row[5],
        charge=loss_from_json(row[6]),
        spec_hash=row[7],
        output=row[8],
        noise_key=row[9],
        seeded=bool(row[10]),
        created=row[11],
        committed=row[12],
        aborted=row[13],
        reason=row[14],
        clipped=row[15],
    )


def _already_reserved(ex: Executor, release_id: str, own: tuple[str, str], retrying: bool) -> bool:
    """True when ``release_id`` is this very reservation, committed by an attempt whose
    connection was lost (``own``: its key and spec hash); refuses any other existing entry."""
    existing = ex.execute(
        "SELECT noise_key, spec_hash FROM releases WHERE release_id = ?", (release_id,)
    ).fetchone()
    if existing is None:
        return False
    if retrying and tuple(existing) == own:
        return True
    raise ReleaseError(
        f"release_id {release_id!r} is already in the ledger; resume it with the "
        "same spec, or choose another release_id"
    )


def _given_loss(
    loss: PrivacyLoss | None, legacy: tuple[float | None, float | None, str, float | None]
) -> PrivacyLoss:
    """The loss given to :meth:`Ledger.reserve`: ``loss``, or ``(epsilon, delta, calibration,
    mu)`` read by :func:`~mvg_dask.ledger.composition.charge_loss`."""
    epsilon, delta, calibration, mu = legacy
    if (loss is None) == (epsilon is None or delta is None):
        raise ValueError("reserve: give either loss, or epsilon and delta (and mu)")
    if loss is None:
        assert epsilon is not None and delta is not None
        return charge_loss(epsilon, delta, calibration, mu)
    return loss


def _schema_version(ex: Executor, table_exists: Callable[[Executor, str], bool], where: str) -> int:
    """The ledger's schema version (0: no ledger yet)."""
    if table_exists(ex, "schema_version"):
        (v,) = ex.execute("SELECT MAX(version) FROM schema_version").fetchone()
        if v is None:
            raise LedgerError(f"ledger {where}: its schema_version table is empty")
        return int(v)
    if table_exists(ex, "releases"):
        return 1  # the first SQLite format had no schema_version table
    return 0


def _create_or_upgrade(
    ex: Executor, backend: str, found: int, where: str, create: bool, migrate: bool
) -> None:
    """Create the schema (``found == 0``) or migrate it from version ``found`` to the current
    one, as allowed; refuse a schema newer than this mvg_dask understands."""
    if found == 0:
        if not create:
            raise NoSchemaError(f"ledger {where} holds no mvg_dask ledger")
        for statement in schema.CREATE[backend]:
            ex.execute(statement)
        ex.execute("INSERT INTO schema_version VALUES (?, ?)", (schema.CURRENT, time.time()))
        return
    if found > schema.CURRENT:
        raise LedgerError(
            f"ledger {where} is at schema version {found}, newer than this "
            f"mvg_dask understands ({schema.CURRENT}): upgrade mvg_dask"
        )
    if found < schema.CURRENT:
        if not migrate:
            raise LedgerError(
                f"ledger {where} is at schema version {found}; this mvg_dask "
                f"uses version {schema.CURRENT}: back it up, then run `mvg-dask ledger "
                f"migrate --ledger {where}`"
            )
        for step in range(found, schema.CURRENT):
            for change in schema.UPGRADE[backend][step]:
                if callable(change):
                    change(ex)
                else:
                    ex.execute(change)
            ex.execute("INSERT INTO schema_version VALUES (?, ?)", (step + 1, time.time()))


class Ledger(StreamLedger, ABC):
    """A privacy ledger: per-dataset budgets, reservations, commits and aborts.

    Open one with :func:`mvg_dask.ledger.open_ledger`. Every method is one transaction;
    reservations of one dataset are serialised, so two releases can never both pass a budget
    check that only one of them fits. A ledger is a context manager (closes on exit).
    """

    backend: ClassVar[str]
    #: the schema version found when opened, and the version now
    schema_change: tuple[int, int]
    #: appended to the budget read of :meth:`reserve` (a row lock where the backend has one)
    _lock_clause: ClassVar[str] = ""

    # -- what a backend provides ----------------------------------------------------------------
    @abstractmethod
    def display(self) -> str:
        """The ledger's location for messages (never a password)."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection."""

    @abstractmethod
    def _run(self, fn: Callable[[Executor, bool], T]) -> T:
        """Run ``fn(executor, retrying)`` in one write transaction and commit it.

        ``retrying`` is True when an earlier attempt may have committed (its connection was
        lost), so that ``fn`` can recognise its own effect instead of repeating it.
        """

    @abstractmethod
    def _table_exists(self, ex: Executor, name: str) -> bool:
        """Whether ``name`` is a table of the ledger's database."""

    def _schema_lock(self, ex: Executor) -> None:
        """Serialise schema creation and migration (the write transaction may already)."""

    def _erased(self) -> None:
        """Called after a key was erased (SQLite truncates its WAL)."""

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema -----------------------------------------------------------------------------------
    def _init_schema(self, *, create: bool, migrate: bool) -> tuple[int, int]:
        """Check (or create, or migrate) the schema; ``(version found, version now)``."""

        def fn(ex: Executor, retrying: bool) -> tuple[int, int]:
            self._schema_lock(ex)
            found = _schema_version(ex, self._table_exists, self.display())
            _create_or_upgrade(ex, self.backend, found, self.display(), create, migrate)
            return found, schema.CURRENT

        result = self._run(fn)
        if migrate:
            self._erased()  # a migration copies pending keys: leave no old copy behind
        return result

    # -- datasets ---------------------------------------------------------------------------------
    def ensure_dataset(
        self,
        dataset: str,
        epsilon: float,
        delta: float,
        neighbours: Neighbours = "replace-one",
    ) -> None:
        """Register a dataset's total budget, or check that it matches the registered one.

        Parameters
        ----------
        dataset : str
            The dataset's name.
        epsilon, delta : float
            Its total budget.
        neighbours : {"replace-one", "add-remove"}
            The neighbour relation the budget is kept in.

        Raises
        ------
        BudgetError
            When the dataset is registered with another budget or relation.
        """
        cal._check_privacy(epsilon, delta)
        if neighbours not in NEIGHBOURS:
            raise BudgetError(
                f"ledger.budget.neighbours: {neighbours!r} is not one of {NEIGHBOURS}"
            )

        def fn(ex: Executor, retrying: bool) -> None:
            ex.execute(
                "INSERT INTO datasets (dataset, epsilon, delta, neighbours, created) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (dataset) DO NOTHING",
                (dataset, epsilon, delta, neighbours, time.time()),
            )
            registered = ex.execute(
                "SELECT epsilon, delta, neighbours FROM datasets WHERE dataset = ?", (dataset,)
            ).fetchone()
            check_registered_budget(
                dataset, tuple(registered), (epsilon, delta, neighbours), where=self.display()
            )

        self._run(fn)

    # -- releases ---------------------------------------------------------------------------------
    def reserve(
        self,
        *,
        dataset: str,
        release_id: str,
        calibration: str,
        spec_hash: str,
        output: str,
        noise_key: str,
        seeded: bool,
        neighbours: Neighbours = "replace-one",
        convert_neighbours: bool = False,
        loss: PrivacyLoss | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        mu: float | None = None,
    ) -> Spending:
        """Reserve a release against its dataset's budget (atomic; nothing changes on refusal).

        Parameters
        ----------
        dataset, release_id : str
            Where it is charged, and its id (unique in the ledger).
        calibration : str
            The noise calibration (a label; the loss says how the release composes).
        spec_hash, output : str
            To recognise a resume, and where the output goes.
        noise_key : str
            The release key (hex), kept until commit or abort so that a crash can resume.
        seeded : bool
            Whether the key comes from a seed. Must be False: a seeded release is not private
            (its noise can be recovered from its output), so the ledger refuses to charge it.
            The column keeps the flag of seeded entries made by earlier versions.
        neighbours : {"replace-one", "add-remove"}
            The relation of the release's guarantee.
        convert_neighbours : bool
            Charge an add-remove release to a replace-one budget by group privacy
            (:func:`~mvg_dask.ledger.composition.convert_neighbours`).
        loss : PrivacyLoss, optional
            The release's privacy loss (its calibration's,
            :meth:`~mvg_dask.privacy.registry.CalibrationRule.loss`).
        epsilon, delta, mu : float, optional
            Instead of ``loss``: the guarantee as ``(epsilon, delta)`` and ``mu`` (Gaussian
            releases), read by :func:`~mvg_dask.ledger.composition.charge_loss`.

        Returns
        -------
        Spending
            The dataset's spending with this release.

        Raises
        ------
        BudgetError
            The budget would be exceeded, the dataset has no budget, or the neighbour
            relations do not match.
        ReleaseError
            The release id is already in the ledger.
        LedgerError
            ``seeded`` is true.
        """
        if seeded:
            raise LedgerError(
                f"release {release_id!r} is seeded, so not private: the ledger does not charge "
                "it; release without a seed, or without a ledger for test or demo data"
            )
        loss = _given_loss(loss, (epsilon, delta, calibration, mu))
        own = Guarantee(loss, neighbours)
        row = (release_id, dataset, calibration, loss, neighbours)
        recorded = (spec_hash, output, noise_key)

        def fn(ex: Executor, retrying: bool) -> Spending:
            b_eps, b_delta, b_neighbours = _read_budget(
                ex, dataset, self._lock_clause, self.display()
            )
            charges = _charges(ex, dataset)
            if _already_reserved(ex, release_id, (noise_key, spec_hash), retrying):
                # our reservation committed before the connection was lost
                return spending(charges, b_delta)
            charge = _convert(own, b_neighbours, allow=convert_neighbours)
            after = _check_fits(
                dataset, charges, charge, (b_eps, b_delta), converted=charge is not own
            )
            _insert_release(ex, row, charge, recorded)
            crash_point("ledger-reserve")
            return after

        return self._run(fn)

    def lookup(self, release_id: str) -> LedgerEntry | None:
        """The entry of ``release_id``, if any."""
        row = self._run(
            lambda ex, _: ex.execute(
                f"SELECT {schema.RELEASE_COLUMNS} FROM releases WHERE release_id = ?",
                (release_id,),
            ).fetchone()
        )
        return None if row is None else _entry(row)

    def _finish(self, release_id: str, status: str, sql: str, params: tuple[Any, ...]) -> None:
        def fn(ex: Executor, retrying: bool) -> None:
            cur = ex.execute(sql, params)
            crash_point(f"ledger-{status}")
            if cur.rowcount == 1:
                return
            row = ex.execute(
                "SELECT status FROM releases WHERE release_id = ?", (release_id,)
            ).fetchone()
            if retrying and row is not None and row[0] == status:
                return  # done by the attempt whose connection was lost
            now = "not in the ledger" if row is None else f"{row[0]}, not pending"
            raise ReleaseError(f"release {release_id!r} is {now} in {self.display()}")

        self._run(fn)
        self._erased()

    def commit(self, release_id: str, *, clipped: int | None = None) -> None:
        """Mark a pending release committed and erase its key.

        Parameters
        ----------
        release_id : str
            The release.
        clipped : int, optional
            The exact number of clipped records, kept curator-side in the ledger (never
            published; ``ledger show`` displays it).
        """
        if clipped is not None and (not isinstance(clipped, int) or clipped < 0):
            raise ValueError(f"clipped: a count >= 0, not {clipped!r}")
        self._finish(
            release_id,
            "committed",
            "UPDATE releases SET status = 'committed', noise_key = NULL, committed = ?, "
            "clipped = ? WHERE release_id = ? AND status = 'pending'",
            (time.time(), clipped, release_id),
        )

    def abort(self, release_id: str, reason: str) -> None:
        """Abort a pending release after data was read: it stays charged, its key is erased.

        Parameters
        ----------
        release_id : str
            The release.
        reason : str
            Why (curator-side: it may depend on the data, so it is never published).
        """
        self._finish(
            release_id,
            "aborted",
            "UPDATE releases SET status = 'aborted', noise_key = NULL, aborted = ?, reason = ? "
            "WHERE release_id = ? AND status = 'pending'",
            (time.time(), str(reason), release_id),
        )

    def cancel(self, release_id: str) -> None:
        """Drop a pending reservation: a release that failed before any chunk was read.

        This refunds it; after the first read use :meth:`abort`.
        """
        self._run(
            lambda ex, _: ex.execute(
                "DELETE FROM releases WHERE release_id = ? AND status = 'pending' AND "
                "release_id NOT IN (SELECT release_id FROM streams)",  # cancel_stream does
                (release_id,),
            )
        )
        self._erased()

    def releases(self, dataset: str | None = None) -> list[LedgerEntry]:
        """Every release (optionally of one dataset), oldest first."""
        where, params = ("", ()) if dataset is None else (" WHERE dataset = ?", (dataset,))
        sql = f"SELECT {schema.RELEASE_COLUMNS} FROM releases{where} ORDER BY created, release_id"
        rows = self._run(lambda ex, _: ex.execute(sql, params).fetchall())
        return [_entry(r) for r in rows]

    def summary(self) -> list[dict[str, Any]]:
        """Per dataset: budget, spending (pending and aborted releases included), what is left,
        its releases and (when it has any) its streams with their periods."""
        datasets, rows, streams = self._run(_summary_rows)
        entries = [_entry(r) for r in rows]
        return [
            _dataset_summary(tuple(d), [e for e in entries if e.dataset == d[0]], streams)
            for d in datasets
        ]


def _summary_rows(ex: Executor, retrying: bool) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The rows :meth:`Ledger.summary` reads, in one transaction."""
    datasets = ex.execute(
        "SELECT dataset, epsilon, delta, neighbours FROM datasets ORDER BY dataset"
    ).fetchall()
    rows = ex.execute(
        f"SELECT {schema.RELEASE_COLUMNS} FROM releases ORDER BY created, release_id"
    ).fetchall()
    return datasets, rows, stream_summaries(ex)


def _dataset_summary(
    dataset: tuple[Any, ...], mine: list[LedgerEntry], streams: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """One dataset's budget (``(name, epsilon, delta, neighbours)``), spending and what is
    left, with its releases and (only when it has any: older summaries are unchanged) its
    streams (``streams``: every dataset's)."""
    name, eps, delta, neighbours = dataset
    spent = spending([e.charge for e in mine], delta)
    out = {
        "dataset": name,
        "budget": {"epsilon": eps, "delta": delta, "neighbours": neighbours},
        "composition": spent.composition,
        "spent": {"epsilon": spent.epsilon, "delta": spent.delta, "mu": spent.mu},
        "left": {
            "epsilon": max(eps - spent.epsilon, 0.0),
            # under Gaussian-DP and PLD composition epsilon is reported at the budget's delta
            "delta": None if spent.composition != "basic" else max(delta - spent.delta, 0.0),
        },
        "releases": [e.public() for e in mine],
    }
    if streams.get(name):
        out["streams"] = streams[name]
    return out
