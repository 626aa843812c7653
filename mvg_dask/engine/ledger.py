"""The privacy ledger: per-dataset budgets, reservations and commits in one SQLite file.

Many processes share the file. Every state change runs in a ``BEGIN IMMEDIATE`` transaction
(WAL mode), so two releases can never both pass a budget check that only one of them fits.

Protocol (DESIGN.md §5): a release is *reserved* before any data is read (refused if it would
exceed the budget); the pending entry holds the release key (the file is mode 0600) so that a
crashed release can be resumed with the same noise; it is *committed* once the output is
complete, which erases the key (``secure_delete`` overwrites it, the WAL is truncated). A crashed
release stays charged. A release that fails cleanly before publishing anything is cancelled.

Composition: basic (``sum eps``, ``sum delta``) by default; when every release of the dataset uses
the ``exact`` calibration each is a Gaussian mechanism after whitening, so the releases compose
exactly as Gaussian DP, ``mu^2 = sum mu_i^2``, and the budget admits them while
``delta_AG(eps_total, mu) <= delta_total``.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mvg_dask.errors import BudgetError, ReleaseError
from mvg_dask.privacy import calibration as cal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    dataset TEXT PRIMARY KEY,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (
    release_id TEXT PRIMARY KEY,
    dataset TEXT NOT NULL REFERENCES datasets(dataset),
    status TEXT NOT NULL CHECK (status IN ('pending', 'committed')),
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    calibration TEXT NOT NULL,
    mu REAL,
    spec_hash TEXT NOT NULL,
    output TEXT NOT NULL,
    noise_key TEXT,
    seeded INTEGER NOT NULL,
    created REAL NOT NULL,
    committed REAL
);
CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases(dataset);
"""
_TOL = 1e-12


@dataclass(frozen=True)
class LedgerEntry:
    """One release in the ledger (``noise_key`` only while pending)."""

    release_id: str
    dataset: str
    status: str
    epsilon: float
    delta: float
    calibration: str
    mu: float | None
    spec_hash: str
    output: str
    noise_key: str | None
    seeded: bool
    created: float
    committed: float | None

    def public(self) -> dict[str, Any]:
        """The entry without its key (for display)."""
        return {
            "release_id": self.release_id,
            "dataset": self.dataset,
            "status": self.status,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "calibration": self.calibration,
            "mu": self.mu,
            "output": self.output,
            "seeded": self.seeded,
            "created": _iso(self.created),
            "committed": _iso(self.committed) if self.committed else None,
        }


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


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


def spending(
    entries: list[tuple[float, float, str, float | None]], budget_delta: float
) -> Spending:
    """Compose ``(epsilon, delta, calibration, mu)`` of releases.

    Parameters
    ----------
    entries : list of tuple
        One tuple per release.
    budget_delta : float
        The dataset's delta (the epsilon of a Gaussian-DP total is reported at it).

    Returns
    -------
    Spending
        Basic composition, or exact Gaussian-DP composition when every release is ``exact``.
    """
    if entries and all(c == "exact" and mu is not None for _, _, c, mu in entries):
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


class Ledger:
    """A privacy ledger in a SQLite file (created with mode 0600).

    Parameters
    ----------
    path : str or Path
        The SQLite file; created if missing.
    timeout : float
        Seconds to wait for another process's transaction.
    """

    def __init__(self, path: str | Path, *, timeout: float = 120.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        old = os.umask(0o077)  # the WAL and shared-memory files are created 0600 too
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._conn.execute("PRAGMA secure_delete=ON")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        with self._transaction() as c:
            for statement in _SCHEMA.strip().split(";"):
                if statement.strip():
                    c.execute(statement)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    # -- datasets ---------------------------------------------------------------------------
    def ensure_dataset(self, dataset: str, epsilon: float, delta: float) -> None:
        """Register a dataset's total budget, or check that it matches the registered one."""
        cal._check_privacy(epsilon, delta)
        with self._transaction() as c:
            row = c.execute(
                "SELECT epsilon, delta FROM datasets WHERE dataset = ?", (dataset,)
            ).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO datasets VALUES (?, ?, ?, ?)",
                    (dataset, epsilon, delta, time.time()),
                )
            elif not (math.isclose(row[0], epsilon) and math.isclose(row[1], delta)):
                raise BudgetError(
                    f"ledger.budget: dataset {dataset!r} is registered with epsilon={row[0]:g}, "
                    f"delta={row[1]:g} in {self.path}; the spec says epsilon={epsilon:g}, "
                    f"delta={delta:g}: use the registered budget"
                )

    # -- releases ---------------------------------------------------------------------------
    def reserve(
        self,
        *,
        dataset: str,
        release_id: str,
        epsilon: float,
        delta: float,
        calibration: str,
        mu: float | None,
        spec_hash: str,
        output: str,
        noise_key: str,
        seeded: bool,
    ) -> Spending:
        """Reserve a release against the dataset's budget (atomic; raises BudgetError)."""
        with self._transaction() as c:
            budget = c.execute(
                "SELECT epsilon, delta FROM datasets WHERE dataset = ?", (dataset,)
            ).fetchone()
            if budget is None:
                raise BudgetError(f"ledger.dataset: {dataset!r} has no budget in {self.path}")
            if c.execute("SELECT 1 FROM releases WHERE release_id = ?", (release_id,)).fetchone():
                raise ReleaseError(
                    f"release_id {release_id!r} is already in the ledger; resume it with the "
                    "same spec, or choose another release_id"
                )
            rows = c.execute(
                "SELECT epsilon, delta, calibration, mu FROM releases WHERE dataset = ?",
                (dataset,),
            ).fetchall()
            before = spending(rows, budget[1])
            after = spending([*rows, (epsilon, delta, calibration, mu)], budget[1])
            if not after.fits(budget[0], budget[1]):
                raise BudgetError(
                    f"privacy budget of dataset {dataset!r} would be exceeded: spent "
                    f"epsilon={before.epsilon:.6g}, delta={before.delta:.3g} ({before.composition})"
                    f" of epsilon={budget[0]:g}, delta={budget[1]:g}; this release needs "
                    f"epsilon={epsilon:g}, delta={delta:g}. Nothing was read or charged"
                )
            c.execute(
                "INSERT INTO releases VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                (
                    release_id,
                    dataset,
                    epsilon,
                    delta,
                    calibration,
                    mu,
                    spec_hash,
                    output,
                    noise_key,
                    int(seeded),
                    time.time(),
                ),
            )
            return after

    def lookup(self, release_id: str) -> LedgerEntry | None:
        """The entry of ``release_id``, if any."""
        row = self._conn.execute(
            "SELECT * FROM releases WHERE release_id = ?", (release_id,)
        ).fetchone()
        return None if row is None else _entry(row)

    def commit(self, release_id: str) -> None:
        """Mark a release committed and erase its key."""
        with self._transaction() as c:
            cur = c.execute(
                "UPDATE releases SET status = 'committed', noise_key = NULL, committed = ? "
                "WHERE release_id = ? AND status = 'pending'",
                (time.time(), release_id),
            )
            if cur.rowcount != 1:
                raise ReleaseError(f"release {release_id!r} is not pending in {self.path}")
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def cancel(self, release_id: str) -> None:
        """Drop a pending reservation (a release that failed before publishing anything)."""
        with self._transaction() as c:
            c.execute(
                "DELETE FROM releases WHERE release_id = ? AND status = 'pending'", (release_id,)
            )
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def releases(self, dataset: str | None = None) -> list[LedgerEntry]:
        """Every release (optionally of one dataset), oldest first."""
        if dataset is None:
            rows = self._conn.execute("SELECT * FROM releases ORDER BY created").fetchall()
        else:
            rows = self._conn.execute(
                "SELECT * FROM releases WHERE dataset = ? ORDER BY created", (dataset,)
            ).fetchall()
        return [_entry(r) for r in rows]

    def summary(self) -> list[dict[str, Any]]:
        """Per dataset: budget, spending (pending releases included) and what is left."""
        out = []
        datasets = self._conn.execute(
            "SELECT dataset, epsilon, delta FROM datasets ORDER BY dataset"
        ).fetchall()
        for name, eps, delta in datasets:
            entries = self.releases(name)
            spent = spending([(e.epsilon, e.delta, e.calibration, e.mu) for e in entries], delta)
            out.append(
                {
                    "dataset": name,
                    "budget": {"epsilon": eps, "delta": delta},
                    "composition": spent.composition,
                    "spent": {"epsilon": spent.epsilon, "delta": spent.delta, "mu": spent.mu},
                    "left": {
                        "epsilon": max(eps - spent.epsilon, 0.0),
                        # under Gaussian-DP composition epsilon is reported at the budget's delta
                        "delta": None if spent.mu is not None else max(delta - spent.delta, 0.0),
                    },
                    "releases": [e.public() for e in entries],
                }
            )
        return out


def _entry(row: tuple[Any, ...]) -> LedgerEntry:
    return LedgerEntry(
        release_id=row[0],
        dataset=row[1],
        status=row[2],
        epsilon=row[3],
        delta=row[4],
        calibration=row[5],
        mu=row[6],
        spec_hash=row[7],
        output=row[8],
        noise_key=row[9],
        seeded=bool(row[10]),
        created=row[11],
        committed=row[12],
    )
