"""The ledger in memory: for notebooks and tests (``memory://name``).

A named in-memory SQLite database (shared cache), kept for the life of the process: every
:func:`~mvg_dask.ledger.open_ledger` of ``memory://name`` in the process sees the same budgets and
releases, and nothing is written to disk. It runs the same protocol and schema as the SQLite file
(:mod:`mvg_dask.ledger.sqlite`), so a notebook's budget decisions are those a file ledger would
make; it is not shared between processes and is lost when the process ends, so it is no place for a
production budget.
"""

from __future__ import annotations

import sqlite3
import threading

from mvg_dask.ledger.sqlite import SQLiteLedger

#: one open connection per name keeps its database alive for the process
_KEEP: dict[str, sqlite3.Connection] = {}
_LOCK = threading.Lock()


def _uri(name: str) -> str:
    return f"file:mvg_dask-ledger-{name}?mode=memory&cache=shared"


class MemoryLedger(SQLiteLedger):
    """A privacy ledger in this process's memory, shared by every handle of its name.

    Parameters
    ----------
    name : str
        The ledger's name (``memory://name``).
    timeout : float
        Seconds to wait for another handle's transaction.
    create, migrate : bool
        Accepted for the common signature: an in-memory ledger is always created at the
        current schema version.
    """

    backend = "memory"

    def __init__(
        self, name: str, *, timeout: float = 120.0, create: bool = True, migrate: bool = False
    ) -> None:
        self.name = name
        with _LOCK:
            if name not in _KEEP:
                _KEEP[name] = sqlite3.connect(_uri(name), uri=True, check_same_thread=False)
        self._conn = sqlite3.connect(
            _uri(name), uri=True, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        try:
            self.schema_change = self._init_schema(create=True, migrate=migrate)
        except BaseException:
            self._conn.close()
            raise

    def display(self) -> str:
        """``memory://name``."""
        return f"memory://{self.name}"

    def _erased(self) -> None:
        """Nothing to truncate: no file holds a key."""


def forget(name: str) -> None:
    """Drop the in-memory ledger ``name`` once its last handle is closed (tests)."""
    with _LOCK:
        conn = _KEEP.pop(name, None)
    if conn is not None:
        conn.close()
