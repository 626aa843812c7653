"""Streams in the ledger: continual releases charged once for their whole horizon.

A stream is one Gaussian mechanism released period by period (:mod:`mvg_dask.privacy.continual`).
The ledger charges it **once**, when it is opened: one entry in ``releases`` whose loss is the
whole horizon's, checked against its dataset's budget like any release (the same neighbour
rules and composition), and committed when the first period commits. Its periods charge nothing
more. The ledger keeps the stream's curator-side state: its key (until the horizon is reached),
its record watermark (how many records the committed periods consumed) and the factorization's
state written with each period. None of it is ever published, logged or shown by ``ledger show``
(which shows the watermark, never the key).

Protocol (every step is one transaction; two pods running the same step agree):

- :meth:`~StreamLedger.open_stream` creates the stream and its charge, or returns the stream
  that exists (the same spec): two concurrent first periods give one stream and one charge.
- :meth:`~StreamLedger.begin_period` claims the next period (in order; past the horizon it is
  refused and nothing is charged), or returns it when it is already pending (a crash, or another
  pod: resume it with the same key and the same bytes) or committed (nothing to do).
- :meth:`~StreamLedger.commit_period` writes the period's state, marks it committed and advances
  the stream's periods and watermark, in one transaction; at the horizon the stream is complete
  and its key erased. A retried or repeated commit of the same period is recognised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

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
from mvg_dask.ledger.composition import Guarantee, Neighbours
from mvg_dask.ledger.composition import convert_neighbours as _convert
from mvg_dask.privacy.accounting import PrivacyLoss

T = TypeVar("T")


@dataclass(frozen=True)
class StreamEntry:
    """One stream in the ledger (never its key).

    ``release_id`` is the entry in ``releases`` that is the stream's one charge; ``periods`` the
    number of committed periods; ``watermark`` the number of records they consumed (curator-side:
    never published); ``status`` is ``open`` or ``complete`` (the horizon is reached, the key
    erased).
    """

    stream_id: str
    dataset: str
    release_id: str
    horizon: int
    factorization: dict[str, Any]
    spec_hash: str
    output: str
    periods: int
    watermark: int
    status: str
    created: float

    def public(self) -> dict[str, Any]:
        """The entry for ``ledger show`` and ``ledger export`` (curator-side; no key)."""
        return {
            "stream_id": self.stream_id,
            "dataset": self.dataset,
            "release_id": self.release_id,
            "horizon": self.horizon,
            "factorization": self.factorization,
            "spec_hash": self.spec_hash,
            "output": self.output,
            "periods": self.periods,
            "watermark": self.watermark,
            "status": self.status,
            "created": _iso(self.created),
        }


@dataclass(frozen=True)
class PeriodEntry:
    """One period of a stream: ``pending`` from
    :meth:`~mvg_dask.ledger.streams.StreamLedger.begin_period` until
    :meth:`~mvg_dask.ledger.streams.StreamLedger.commit_period`, then ``committed``.

    ``watermark_before`` and ``watermark_after`` bound the records it consumed; ``clipped`` is
    its exact clipped count (curator-side).
    """

    stream_id: str
    period: int
    label: str
    status: str
    watermark_before: int
    watermark_after: int | None
    clipped: int | None
    created: float = 0.0
    committed: float | None = None

    def public(self) -> dict[str, Any]:
        """The period for ``ledger show`` and ``ledger export`` (curator-side)."""
        return {
            "period": self.period,
            "label": self.label,
            "status": self.status,
            "watermark_before": self.watermark_before,
            "watermark_after": self.watermark_after,
            "clipped": self.clipped,
            "created": _iso(self.created),
            "committed": _iso(self.committed) if self.committed else None,
        }


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _stream(row: Sequence[Any]) -> StreamEntry:
    return StreamEntry(
        stream_id=row[0],
        dataset=row[1],
        release_id=row[2],
        horizon=int(row[3]),
        factorization=json.loads(row[4]),
        spec_hash=row[5],
        output=row[6],
        periods=int(row[7]),
        watermark=int(row[8]),
        status=row[9],
        created=row[10],
    )


def _period(row: Sequence[Any]) -> PeriodEntry:
    return PeriodEntry(
        stream_id=row[0],
        period=int(row[1]),
        label=row[2],
        status=row[3],
        watermark_before=int(row[4]),
        watermark_after=None if row[5] is None else int(row[5]),
        clipped=None if row[6] is None else int(row[6]),
        created=row[7],
        committed=row[8],
    )


def _check_args(stream_id: str, horizon: int, factorization: dict[str, Any], key: str) -> str:
    """Refuse malformed arguments of :meth:`StreamLedger.open_stream` (before any transaction);
    the factorization as stored (JSON)."""
    if not isinstance(stream_id, str) or not stream_id:
        raise ValueError(f"stream_id: a non-empty string, not {stream_id!r}")
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"stream {stream_id!r}: horizon must be an integer >= 1, not {horizon!r}")
    try:
        int(key, 16)
    except (TypeError, ValueError):
        raise ValueError(f"stream {stream_id!r}: stream_key must be a hex string") from None
    if not isinstance(factorization, dict):
        raise ValueError(f"stream {stream_id!r}: factorization must be a dict")
    return json.dumps(factorization, sort_keys=True)


def _locked(ex: Executor, stream_id: str, lock: str, where: str) -> tuple[StreamEntry, Any]:
    """The stream and its key, its row locked (where the backend can) for this transaction."""
    row = ex.execute(
        f"SELECT {schema.STREAM_COLUMNS}, stream_key FROM streams WHERE stream_id = ?" + lock,
        (stream_id,),
    ).fetchone()
    if row is None:
        raise ReleaseError(f"stream {stream_id!r} is not in the ledger {where}")
    return _stream(row[:-1]), row[-1]


def _period_row(ex: Executor, stream_id: str, period: int) -> PeriodEntry | None:
    row = ex.execute(
        f"SELECT {schema.PERIOD_COLUMNS} FROM stream_periods WHERE stream_id = ? AND period = ?",
        (stream_id, period),
    ).fetchone()
    return None if row is None else _period(row)


def _past_horizon(s: StreamEntry, period: int) -> BudgetError:
    return BudgetError(
        f"stream {s.stream_id!r} has released all {s.horizon} periods of its horizon (its "
        f"budget covers periods 1..{s.horizon}); period {period} is refused and nothing was "
        "charged: start a new stream (a new stream id, which is charged anew)"
    )


def _open(
    ex: Executor, retrying: bool, lock: str, where: str, a: dict[str, Any]
) -> tuple[StreamEntry, bool]:
    """The transaction of :meth:`StreamLedger.open_stream` (``a``: its arguments)."""
    dataset, stream_id, release_id = a["dataset"], a["stream_id"], a["release_id"]
    b_eps, b_delta, b_neighbours = _read_budget(ex, dataset, lock, where)  # serialises
    row = ex.execute(
        f"SELECT {schema.STREAM_COLUMNS}, stream_key FROM streams WHERE stream_id = ?",
        (stream_id,),
    ).fetchone()
    if row is not None:
        entry = _stream(row[:-1])
        if entry.spec_hash != a["spec_hash"] or entry.dataset != dataset:
            raise ReleaseError(
                f"stream {stream_id!r} is already in the ledger with another spec; continue it "
                "with the same spec, or start a new stream (a new stream id, charged anew)"
            )
        return entry, retrying and row[-1] == a["stream_key"]  # ours, if the answer was lost
    if ex.execute("SELECT 1 FROM releases WHERE release_id = ?", (release_id,)).fetchone():
        raise ReleaseError(
            f"release_id {release_id!r} is already in the ledger; choose another for the stream"
        )
    own = Guarantee(a["loss"], a["neighbours"])
    charge = _convert(own, b_neighbours, allow=a["convert_neighbours"])
    charges = _charges(ex, dataset)
    _check_fits(dataset, charges, charge, (b_eps, b_delta), converted=charge is not own)
    row_ = (release_id, dataset, a["calibration"], a["loss"], a["neighbours"])
    _insert_release(ex, row_, charge, (a["spec_hash"], a["output"], None))
    now = time.time()
    head = (stream_id, dataset, release_id, a["horizon"], a["factorization"])
    ex.execute(
        "INSERT INTO streams (stream_id, dataset, release_id, horizon, factorization, "
        "spec_hash, output, stream_key, periods, watermark, created, status) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?, 'open')",
        (*head, a["spec_hash"], a["output"], a["stream_key"], now),
    )
    crash_point("ledger-open-stream")
    return _stream((*head, a["spec_hash"], a["output"], 0, 0, "open", now)), True


def _begin(
    ex: Executor,
    lock: str,
    where: str,
    stream_id: str,
    period: int,
    label: str,
    target: int | None,
) -> PeriodEntry:
    """The transaction of :meth:`StreamLedger.begin_period`."""
    s, _ = _locked(ex, stream_id, lock, where)
    existing = _period_row(ex, stream_id, period)
    if existing is not None:
        if existing.label != label:
            raise ReleaseError(
                f"stream {stream_id!r}: period {period} is already {existing.status} with "
                f"label {existing.label!r}, not {label!r}; re-run it with the same label"
            )
        return existing
    if period > s.horizon:
        raise _past_horizon(s, period)
    if period != s.periods + 1:
        raise ReleaseError(
            f"stream {stream_id!r}: periods run in order; {s.periods} committed, so the next "
            f"is period {s.periods + 1}, not {period}"
        )
    pending = ex.execute(
        "SELECT period FROM stream_periods WHERE stream_id = ? AND status = 'pending'",
        (stream_id,),
    ).fetchone()
    if pending is not None:  # cannot happen with in-order claims; a guard for hand edits
        raise ReleaseError(f"stream {stream_id!r}: period {pending[0]} is pending; resume it")
    if target is not None and target < s.watermark:
        raise ReleaseError(
            f"stream {stream_id!r}: the input holds fewer records than the stream has "
            "consumed (a stream's store only grows); nothing was changed"
        )
    entry = PeriodEntry(stream_id, period, label, "pending", s.watermark, target, None, time.time())
    ex.execute(
        "INSERT INTO stream_periods (stream_id, period, label, status, watermark_before, "
        "watermark_after, created) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
        (stream_id, period, label, s.watermark, target, entry.created),
    )
    crash_point("ledger-begin-period")
    return entry


def _commit(
    ex: Executor, lock: str, where: str, stream_id: str, period: int, a: dict[str, Any]
) -> bool:
    """The transaction of :meth:`StreamLedger.commit_period`; True when it completed the stream."""
    s, _ = _locked(ex, stream_id, lock, where)
    p = _period_row(ex, stream_id, period)
    if p is None:
        raise ReleaseError(f"stream {stream_id!r}: period {period} was not begun")
    watermark = a["watermark"]
    if p.status == "committed":
        if p.watermark_after == watermark:
            return False  # committed by a pod before us, or by our attempt whose answer was lost
        raise ReleaseError(
            f"stream {stream_id!r}: period {period} is already committed through another "
            "record count; nothing was changed"
        )
    if p.watermark_after is not None and watermark != p.watermark_after:
        raise ReleaseError(
            f"stream {stream_id!r}: period {period} was claimed through {p.watermark_after} "
            f"records, not {watermark}; nothing was changed"
        )
    if watermark < p.watermark_before:
        raise ReleaseError(
            f"stream {stream_id!r}: period {period}'s watermark cannot go back (the store "
            "shrank?); nothing was changed"
        )
    for part, data in sorted(a["state"].items()):
        ex.execute(
            "INSERT INTO stream_state (stream_id, period, part, data) VALUES (?, ?, ?, ?)",
            (stream_id, period, part, bytes(data)),
        )
    for old, part in a.get("drop", ()):
        ex.execute(
            "DELETE FROM stream_state WHERE stream_id = ? AND period = ? AND part = ?",
            (stream_id, int(old), str(part)),
        )
    now = time.time()
    ex.execute(
        "UPDATE stream_periods SET status = 'committed', watermark_after = ?, committed = ?, "
        "clipped = ? WHERE stream_id = ? AND period = ? AND status = 'pending'",
        (watermark, now, a["clipped"], stream_id, period),
    )
    complete = period == s.horizon
    ex.execute(
        "UPDATE streams SET periods = ?, watermark = ?, status = ?, stream_key = "
        "CASE WHEN ? THEN NULL ELSE stream_key END WHERE stream_id = ?",
        (period, watermark, "complete" if complete else "open", complete, stream_id),
    )
    ex.execute(  # the stream's one charge: committed with its first period
        "UPDATE releases SET status = 'committed', committed = ? "
        "WHERE release_id = ? AND status = 'pending'",
        (now, s.release_id),
    )
    crash_point("ledger-commit-period")
    return complete


def _cancel(ex: Executor, lock: str, where: str, stream_id: str) -> None:
    s, _ = _locked(ex, stream_id, lock, where)
    if s.periods > 0:
        raise ReleaseError(
            f"stream {stream_id!r} has committed periods: it stays charged (it cannot be cancelled)"
        )
    for table in ("stream_state", "stream_periods", "streams"):
        ex.execute(f"DELETE FROM {table} WHERE stream_id = ?", (stream_id,))
    ex.execute("DELETE FROM releases WHERE release_id = ? AND status = 'pending'", (s.release_id,))


def stream_summaries(ex: Executor) -> dict[str, list[dict[str, Any]]]:
    """Per dataset, its streams as ``ledger show`` lists them (each with its periods)."""
    streams = ex.execute(
        f"SELECT {schema.STREAM_COLUMNS} FROM streams ORDER BY created, stream_id"
    ).fetchall()
    periods = ex.execute(
        f"SELECT {schema.PERIOD_COLUMNS} FROM stream_periods ORDER BY stream_id, period"
    ).fetchall()
    by_stream: dict[str, list[dict[str, Any]]] = {}
    for row in periods:
        by_stream.setdefault(row[0], []).append(_period(row).public())
    out: dict[str, list[dict[str, Any]]] = {}
    for row in streams:
        s = _stream(row)
        out.setdefault(s.dataset, []).append(
            {**s.public(), "period_entries": by_stream.get(s.stream_id, [])}
        )
    return out


class StreamLedger:
    """The stream methods of :class:`~mvg_dask.ledger.base.Ledger` (every backend)."""

    if TYPE_CHECKING:
        _lock_clause: ClassVar[str]

        def _run(self, fn: Callable[[Executor, bool], T]) -> T: ...

        def display(self) -> str: ...

        def _erased(self) -> None: ...

    def open_stream(
        self,
        *,
        dataset: str,
        stream_id: str,
        release_id: str,
        horizon: int,
        factorization: dict[str, Any],
        spec_hash: str,
        output: str,
        stream_key: str,
        calibration: str,
        loss: PrivacyLoss,
        neighbours: Neighbours = "replace-one",
        convert_neighbours: bool = False,
    ) -> tuple[StreamEntry, bool]:
        """Create a stream and its single charge (one transaction), or return the stream.

        Parameters
        ----------
        dataset, stream_id, release_id : str
            Where it is charged, the stream's id, and the id of its charge in ``releases``.
        horizon : int
            Its number of periods (>= 1).
        factorization : dict
            The factorization's description (JSON; the engine's to read back).
        spec_hash, output : str
            To recognise the same stream, and where its output goes.
        stream_key : str
            The stream's key (hex), kept curator-side until the horizon is reached.
        calibration : str
            The noise calibration (a label).
        loss : PrivacyLoss
            The whole horizon's privacy loss: what the stream is charged, once.
        neighbours, convert_neighbours
            As for :meth:`~mvg_dask.ledger.base.Ledger.reserve`.

        Returns
        -------
        tuple of (StreamEntry, bool)
            The stream, and whether this call created it (and charged it). When it existed
            (another pod, or an earlier period), use :meth:`stream_key` for its key.

        Raises
        ------
        BudgetError
            The whole horizon's loss does not fit the budget (nothing changes), the dataset
            has no budget, or the neighbour relations do not match.
        ReleaseError
            The stream exists with another spec, or ``release_id`` is taken.
        """
        stored = _check_args(stream_id, horizon, factorization, stream_key)
        args = dict(
            dataset=dataset,
            stream_id=stream_id,
            release_id=release_id,
            horizon=horizon,
            factorization=stored,
            spec_hash=spec_hash,
            output=output,
            stream_key=stream_key,
            calibration=calibration,
            loss=loss,
            neighbours=neighbours,
            convert_neighbours=convert_neighbours,
        )
        lock, where = self._lock_clause, self.display()
        return self._run(lambda ex, retrying: _open(ex, retrying, lock, where, args))

    def stream(self, stream_id: str) -> StreamEntry | None:
        """The stream ``stream_id``, if any."""
        sql = f"SELECT {schema.STREAM_COLUMNS} FROM streams WHERE stream_id = ?"
        row = self._run(lambda ex, _: ex.execute(sql, (stream_id,)).fetchone())
        return None if row is None else _stream(row)

    def stream_key(self, stream_id: str) -> str:
        """The stream's key (hex, curator-side).

        Raises
        ------
        LedgerError
            No such stream, or it is complete (its key is erased).
        """
        sql = "SELECT stream_key FROM streams WHERE stream_id = ?"
        row = self._run(lambda ex, _: ex.execute(sql, (stream_id,)).fetchone())
        if row is None:
            raise LedgerError(f"stream {stream_id!r} is not in the ledger {self.display()}")
        if row[0] is None:
            raise LedgerError(f"stream {stream_id!r} is complete: its key is erased")
        return str(row[0])

    def begin_period(
        self, stream_id: str, period: int, label: str, *, target: int | None = None
    ) -> PeriodEntry:
        """Claim ``period`` of a stream (the next one), or find it pending or committed.

        Parameters
        ----------
        stream_id : str
            The stream.
        period : int
            The period (1-based; must be the number of committed periods + 1 unless it exists).
        label : str
            Its label (a date, or the index); the same on every attempt.
        target : int, optional
            The record count the period reads through (the store's length when it is claimed),
            kept with a new claim as its ``watermark_after``: a resumed period reads the same
            records, and so writes the same bytes, even if more were appended meanwhile. A
            pending or committed period keeps the target it was claimed with.

        Returns
        -------
        PeriodEntry
            ``pending`` (claimed now, or by a crashed run or another pod: resume it with the
            same key and bytes), or ``committed`` (nothing to do).

        Raises
        ------
        BudgetError
            Past the horizon (the remedy: a new stream, which is charged). Nothing changes.
        ReleaseError
            Out of order, another label, or no such stream.
        """
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"period: an integer >= 1, not {period!r}")
        if not isinstance(label, str) or not label:
            raise ValueError(f"period label: a non-empty string, not {label!r}")
        if target is not None and (isinstance(target, bool) or not isinstance(target, int)):
            raise ValueError(f"target: a record count, not {target!r}")
        lock, where = self._lock_clause, self.display()
        return self._run(lambda ex, _: _begin(ex, lock, where, stream_id, period, label, target))

    def commit_period(
        self,
        stream_id: str,
        period: int,
        *,
        watermark: int,
        state: dict[str, bytes],
        clipped: int | None = None,
        drop: Sequence[tuple[int, str]] = (),
    ) -> None:
        """Commit a pending period in one transaction.

        Writes its state parts, marks it committed through ``watermark``, advances the
        stream's periods and watermark and (first period) commits its charge; at the horizon
        the stream is complete and its key erased. A retried commit (a lost answer) or a second
        committer with the same watermark changes nothing and raises nothing.

        Parameters
        ----------
        stream_id : str
            The stream.
        period : int
            The pending period.
        watermark : int
            The records consumed through this period (curator-side).
        state : dict of str to bytes
            The factorization's curator-side state of this period (opaque to the ledger).
        clipped : int, optional
            The period's exact clipped count (curator-side).
        drop : sequence of (int, str), optional
            ``(period, part)`` state parts of earlier periods no later period uses: deleted in
            the same transaction.

        Raises
        ------
        ReleaseError
            The period was not begun, or is committed through another watermark.
        """
        if isinstance(watermark, bool) or not isinstance(watermark, int) or watermark < 0:
            raise ValueError(f"watermark: a record count >= 0, not {watermark!r}")
        if clipped is not None and (not isinstance(clipped, int) or clipped < 0):
            raise ValueError(f"clipped: a count >= 0, not {clipped!r}")
        args = {"watermark": watermark, "state": dict(state), "clipped": clipped, "drop": drop}
        lock, where = self._lock_clause, self.display()
        if self._run(lambda ex, _: _commit(ex, lock, where, stream_id, period, args)):
            self._erased()  # the key is erased: leave no copy behind

    def cancel_stream(self, stream_id: str) -> None:
        """Drop a stream none of whose periods committed, and refund its charge (a first
        period that failed before any record was read).

        Raises
        ------
        ReleaseError
            A period is committed: the stream stays charged.
        """
        lock, where = self._lock_clause, self.display()
        self._run(lambda ex, _: _cancel(ex, lock, where, stream_id))
        self._erased()

    def stream_state(
        self, stream_id: str, *, through: int | None = None
    ) -> dict[int, dict[str, bytes]]:
        """The committed periods' state parts, ``{period: {part: bytes}}`` (through
        ``through``, default all)."""
        sql = "SELECT period, part, data FROM stream_state WHERE stream_id = ?"
        params: tuple[Any, ...] = (stream_id,)
        if through is not None:
            sql, params = sql + " AND period <= ?", (stream_id, through)
        sql += " ORDER BY period, part"
        rows = self._run(lambda ex, _: ex.execute(sql, params).fetchall())
        out: dict[int, dict[str, bytes]] = {}
        for period, part, data in rows:
            out.setdefault(int(period), {})[part] = bytes(data)
        return out

    def stream_periods(self, stream_id: str) -> list[PeriodEntry]:
        """The stream's periods, in order."""
        sql = (
            f"SELECT {schema.PERIOD_COLUMNS} FROM stream_periods WHERE stream_id = ? "
            "ORDER BY period"
        )
        rows = self._run(lambda ex, _: ex.execute(sql, (stream_id,)).fetchall())
        return [_period(r) for r in rows]

    def streams(self, dataset: str | None = None) -> list[StreamEntry]:
        """Every stream (optionally of one dataset), oldest first."""
        where, params = ("", ()) if dataset is None else (" WHERE dataset = ?", (dataset,))
        sql = f"SELECT {schema.STREAM_COLUMNS} FROM streams{where} ORDER BY created, stream_id"
        return [_stream(r) for r in self._run(lambda ex, _: ex.execute(sql, params).fetchall())]
