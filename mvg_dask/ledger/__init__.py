"""The privacy ledger: per-dataset budgets, reservations, commits and aborts.

Three backends share one protocol (:mod:`mvg_dask.ledger.base`): a SQLite file (the embedded
default, :mod:`mvg_dask.ledger.sqlite`), a PostgreSQL database shared by many jobs
(:mod:`mvg_dask.ledger.postgres`) and an in-memory ledger for notebooks and tests
(:mod:`mvg_dask.ledger.memory`). Streams (continual releases charged once for their horizon) are
:mod:`mvg_dask.ledger.streams`. They store each release's privacy loss as one typed value; the
accounting (how losses compose against a budget) is :mod:`mvg_dask.privacy.accounting`, applied by
:mod:`mvg_dask.ledger.composition`. Open a ledger with :func:`open_ledger`; the CLI's ``ledger
show/export/migrate`` use :func:`summary_text`, :func:`export_ledger` and :func:`migrate_ledger`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mvg_dask.errors import LedgerError
from mvg_dask.ledger import schema
from mvg_dask.ledger.base import Ledger, LedgerEntry
from mvg_dask.ledger.composition import (
    Guarantee,
    Neighbours,
    Spending,
    convert_neighbours,
    gaussian_dp_composable,
    mixed_pld,
    spending,
)
from mvg_dask.ledger.location import parse_location, redact
from mvg_dask.ledger.streams import PeriodEntry, StreamEntry

__all__ = [
    "Guarantee",
    "Ledger",
    "LedgerEntry",
    "Neighbours",
    "PeriodEntry",
    "Spending",
    "StreamEntry",
    "convert_neighbours",
    "export_ledger",
    "gaussian_dp_composable",
    "migrate_ledger",
    "mixed_pld",
    "open_ledger",
    "redact",
    "spending",
    "summary_text",
]


def open_ledger(
    location: str | Path,
    *,
    password_file: str | Path | None = None,
    timeout: float = 120.0,
    create: bool = True,
    migrate: bool = False,
) -> Ledger:
    """Open (or create) a ledger.

    Parameters
    ----------
    location : str or Path
        ``postgresql://user@host/db`` (libpq URI, no password), ``sqlite:///path``, a file path,
        or ``memory://name`` (in this process's memory, :mod:`.memory`).
    password_file : str or Path, optional
        PostgreSQL only: a file holding the password (else ``PGPASSWORD`` or a passfile).
    timeout : float
        Seconds to wait for another process's transaction or lock.
    create : bool
        Create a missing ledger (a missing SQLite file is an error otherwise).
    migrate : bool
        Upgrade an older schema version in place.

    Returns
    -------
    Ledger
        A context manager; close it when done.

    Raises
    ------
    LedgerError
        Unknown scheme, a password in the URL, unreachable server, missing ledger, or a schema
        version this mvg_dask does not use.
    """
    loc = parse_location(location)
    if loc.backend != "postgresql" and password_file is not None:
        raise LedgerError("ledger.password_file is for postgresql:// ledgers only")
    if loc.backend == "memory":
        from mvg_dask.ledger.memory import MemoryLedger

        return MemoryLedger(loc.target, timeout=timeout, create=create, migrate=migrate)
    if loc.backend == "sqlite":
        from mvg_dask.ledger.sqlite import SQLiteLedger

        return SQLiteLedger(loc.target, timeout=timeout, create=create, migrate=migrate)
    from mvg_dask.ledger.postgres import PostgresLedger

    return PostgresLedger(
        loc.target, password_file=password_file, timeout=timeout, create=create, migrate=migrate
    )


def migrate_ledger(location: str | Path, *, password_file: str | Path | None = None) -> str:
    """Create or upgrade a ledger's schema to the current version.

    Returns
    -------
    str
        One line saying what was done.
    """
    with open_ledger(location, password_file=password_file, migrate=True) as book:
        found, now = book.schema_change
        where = book.display()
    if found == 0:
        return f"ledger {where}: created at schema version {now}"
    if found == now:
        return f"ledger {where}: already at schema version {now}"
    return f"ledger {where}: migrated from schema version {found} to {now}"


def export_ledger(book: Ledger) -> dict[str, Any]:
    """Every budget and every entry of a ledger, without keys (for ``ledger export``)."""
    summary = book.summary()
    return {
        "format": "mvg_dask ledger export",
        "schema_version": schema.CURRENT,
        "backend": book.backend,
        "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "datasets": [{k: v for k, v in ds.items() if k != "releases"} for ds in summary],
        "releases": [e.public() for e in book.releases()],
        "streams": [s for ds in summary for s in ds.get("streams", [])],
    }


def summary_text(summary: list[dict[str, Any]]) -> str:
    """``ledger show``'s text: one line per dataset, one per release, and each stream with its
    periods (curator-side)."""
    lines = []
    for ds in summary:
        b, s, left = ds["budget"], ds["spent"], ds["left"]
        mu = f", mu={s['mu']:.4g}" if s["mu"] is not None else ""
        if left["delta"] is None:  # epsilon stated at the budget's delta: delta is not spent
            spent = f"spent epsilon={s['epsilon']:.4g} at the budget's delta"
            rest = f"left epsilon={left['epsilon']:.4g} at the budget's delta"
        else:
            spent = f"spent epsilon={s['epsilon']:.4g} delta={s['delta']:.3g}"
            rest = f"left epsilon={left['epsilon']:.4g} delta={left['delta']:.3g}"
        lines.append(
            f"dataset {ds['dataset']} ({b['neighbours']}): budget epsilon={b['epsilon']:g} "
            f"delta={b['delta']:.3g}; {spent} ({ds['composition']}{mu}); {rest}"
        )
        seeded = sum(1 for r in ds["releases"] if r["seeded"])
        if seeded:
            lines.append(
                f"  warning: {seeded} seeded release(s) from an earlier version: not private "
                "(their noise can be recovered from their outputs), whatever the budget says"
            )
        charges = {s["release_id"]: s["stream_id"] for s in ds.get("streams", [])}
        for r in ds["releases"]:
            extra = []
            if r["release_id"] in charges:
                extra.append(f"the one charge of stream {charges[r['release_id']]}")
            if r["neighbours"] != b["neighbours"]:
                c = r["charged"]
                extra.append(f"{r['neighbours']}, charged eps={c['epsilon']:g}")
            if r["clipped"] is not None:
                extra.append(f"clipped={r['clipped']}")
            if r["status"] == "pending" and r["release_id"] not in charges:
                extra.append("charged; re-run the same release id to resume")
            if r["reason"]:
                extra.append(f"reason: {r['reason']}")
            if r["seeded"]:
                extra.append("seeded: NOT private")
            tail = f"  [{'; '.join(extra)}]" if extra else ""
            lines.append(
                f"  {r['release_id']:<48} {r['status']:<9} eps={r['epsilon']:<8g} "
                f"delta={r['delta']:<9.3g} {r['calibration']:<9} {r['created']}{tail}"
            )
        lines.extend(_stream_lines(ds.get("streams", [])))
    if not summary:
        lines.append("(empty ledger)")
    return "\n".join(lines)


def _stream_lines(streams: list[dict[str, Any]]) -> list[str]:
    """``ledger show``'s lines of a dataset's streams: each with its periods (never a key)."""
    lines = []
    for s in streams:
        kind = s["factorization"].get("factorization", "?")
        lines.append(
            f"  stream {s['stream_id']}: {kind}, {s['periods']}/{s['horizon']} periods, "
            f"{s['status']}; charged once as {s['release_id']}; records consumed "
            f"{s['watermark']}; {s['created']}"
        )
        for p in s["period_entries"]:
            records = (
                f"records {p['watermark_before']}..{p['watermark_after']}"
                if p["watermark_after"] is not None
                else f"records from {p['watermark_before']}; re-run to resume"
            )
            clipped = f"; clipped={p['clipped']}" if p["clipped"] is not None else ""
            lines.append(
                f"    period {p['period']:>4} {p['label']:<24} {p['status']:<9} {records}{clipped}"
            )
    return lines
