"""The ledger in one SQLite file: the embedded default.

Many processes share the file. Every state change runs in a ``BEGIN IMMEDIATE`` transaction (WAL
mode), which serialises all writers, so reservations of a dataset are serialised. The file, its
WAL and its shared-memory file are created mode 0600. An erased key is overwritten in place
(``secure_delete``) and the WAL is truncated after every commit, abort or cancel, so no copy of
it stays in any file of the ledger.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mvg_dask.errors import LedgerError
from mvg_dask.ledger.base import Executor, Ledger, T


class SQLiteLedger(Ledger):
    """A privacy ledger in a SQLite file (created with mode 0600).

    Parameters
    ----------
    path : str or Path
        The SQLite file.
    timeout : float
        Seconds to wait for another process's transaction.
    create : bool
        Create the file and the schema if missing (else a missing file is an error).
    migrate : bool
        Upgrade an older schema version in place (``mvg-dask ledger migrate``).
    """

    backend = "sqlite"

    def __init__(
        self,
        path: str | Path,
        *,
        timeout: float = 120.0,
        create: bool = True,
        migrate: bool = False,
    ) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise LedgerError(f"ledger {self.path} does not exist")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        old = os.umask(0o077)  # the WAL and shared-memory files are created 0600 too
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"ledger {self.path} cannot be opened: {exc}") from None
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._conn.execute("PRAGMA secure_delete=ON")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
        try:
            self.schema_change = self._init_schema(create=create, migrate=migrate)
        except BaseException:
            self._conn.close()
            raise

    def display(self) -> str:
        """The file's path."""
        return str(self.path)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

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

    def _run(self, fn: Callable[[Executor, bool], T]) -> T:
        try:
            with self._transaction() as c:
                return fn(c, False)
        except sqlite3.OperationalError as exc:
            raise LedgerError(f"ledger {self.path}: {exc}") from None

    def _table_exists(self, ex: Executor, name: str) -> bool:
        return (
            ex.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).fetchone()
            is not None
        )

    def _erased(self) -> None:
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
