"""The ledger on a PostgreSQL server (psycopg 3): one ledger shared by many jobs and pods.

Reservations of a dataset serialise on a row lock, ``SELECT ... FROM datasets ... FOR UPDATE``,
taken at the start of the reservation's transaction (READ COMMITTED: every later statement of
it sees every reservation committed before the lock was granted). Reservations of different
datasets run in parallel. Serialisation failures and deadlocks are retried; a lost connection
(server restart, failover, network) is re-established for up to ``reconnect_timeout`` seconds
and the interrupted step is retried so that it takes effect exactly once: a retried reservation
recognises its own row by its key, a retried commit or abort its own status.

Secrets. The URL carries no password (refused): libpq takes it from ``PGPASSWORD``, a passfile
(``PGPASSFILE``, ``~/.pgpass`` or ``?passfile=``) or, here, ``password_file``. Messages name the
server with the password redacted. Only the ledger's role (the owner of its tables; nothing is
granted to PUBLIC) and superusers can read a pending key. The key is set to NULL on commit and
abort, but PostgreSQL keeps older row versions: until VACUUM reclaims the page space the old
tuple stays in the table file, the WAL holds it until its segments are recycled, and WAL
archives, base backups and streaming replicas keep it for as long as they are kept. To limit
that: keep the ledger in its own database with no WAL archiving or short retention, on
encrypted storage, with backups under the same access control as the keys;
``VACUUM (FULL) releases`` rewrites the table without dead rows; a pending key only protects
a release that is still running or crashed, so abort or commit crashed releases promptly.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pgerrors

from mvg_dask.errors import LedgerError
from mvg_dask.ledger.base import SCHEMA_LOCK_ID, Executor, Ledger, T
from mvg_dask.ledger.location import check_no_password, redact

log = logging.getLogger(__name__)


class _Exec:
    """``?`` placeholders on a psycopg connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(sql.replace("?", "%s"), tuple(params))


class PostgresLedger(Ledger):
    """A privacy ledger in a PostgreSQL database.

    Parameters
    ----------
    url : str
        A libpq URI, ``postgresql://user@host:port/dbname?sslmode=...`` (a unix-socket directory
        as host: ``postgresql:///ledger?host=/run/postgresql`` or percent-encoded
        ``postgresql://%2Frun%2Fpostgresql/ledger``); no password.
    password_file : str or Path, optional
        A file holding the password (a mounted secret), used when given.
    timeout : float
        Seconds to wait for another reservation's lock (``lock_timeout``).
    reconnect_timeout : float
        Seconds to keep trying to reconnect after a lost connection.
    create : bool
        Create the schema in an empty database.
    migrate : bool
        Upgrade an older schema version (``mvg-dask ledger migrate``).
    """

    backend = "postgresql"
    _lock_clause = " FOR UPDATE"

    def __init__(
        self,
        url: str,
        *,
        password_file: str | Path | None = None,
        timeout: float = 120.0,
        reconnect_timeout: float = 60.0,
        create: bool = True,
        migrate: bool = False,
    ) -> None:
        check_no_password(url)
        self._url = url
        self._timeout = timeout
        self.reconnect_timeout = reconnect_timeout
        self._password: str | None = None
        if password_file is not None:
            try:
                self._password = Path(password_file).read_text().rstrip("\r\n")
            except OSError as exc:
                raise LedgerError(
                    f"ledger.password_file {password_file}: cannot read it ({exc.strerror})"
                ) from None
        self._conn: psycopg.Connection[Any] | None = None
        try:
            self._conn = self._connect()
        except psycopg.Error as exc:
            raise LedgerError(
                f"ledger {self.display()}: cannot connect: {self._clean(exc)}"
            ) from None
        try:
            self.schema_change = self._init_schema(create=create, migrate=migrate)
        except BaseException:
            self.close()
            raise

    def display(self) -> str:
        """The URL, its password (if any) redacted."""
        return redact(self._url)

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _clean(self, exc: BaseException) -> str:
        """The first line of a driver message, with no password in it."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if self._password:
            text = text.replace(self._password, "***")
        return redact(text)

    def _connect(self) -> psycopg.Connection[Any]:
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": 10,
            "application_name": "mvg_dask-ledger",
        }
        if self._password is not None:
            kwargs["password"] = self._password
        conn = psycopg.connect(self._url, **kwargs)
        conn.execute(f"SET lock_timeout = {int(self._timeout * 1000)}")
        return conn

    def _run(self, fn: Callable[[Executor, bool], T]) -> T:
        retrying = False
        deadline: float | None = None
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                with self._conn.transaction():
                    return fn(_Exec(self._conn), retrying)
            except (pgerrors.SerializationFailure, pgerrors.DeadlockDetected):
                time.sleep(random.uniform(0.01, 0.1))  # rolled back: simply run it again
            except pgerrors.LockNotAvailable:
                raise LedgerError(
                    f"ledger {self.display()}: waited {self._timeout:g} s for another "
                    "reservation of this dataset; try again"
                ) from None
            except psycopg.OperationalError as exc:
                conn = self._conn
                if conn is not None and not conn.closed and not conn.broken:
                    raise LedgerError(f"ledger {self.display()}: {self._clean(exc)}") from None
                # the connection is gone: whether the transaction committed is unknown
                retrying = True
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.reconnect_timeout
                if now >= deadline:
                    raise LedgerError(
                        f"ledger {self.display()}: connection lost and not re-established "
                        f"within {self.reconnect_timeout:g} s ({self._clean(exc)})"
                    ) from None
                log.warning("ledger %s: connection lost; reconnecting", self.display())
                if conn is not None:
                    conn.close()
                self._conn = None
                time.sleep(0.25)
            except psycopg.Error as exc:
                raise LedgerError(f"ledger {self.display()}: {self._clean(exc)}") from None

    def _table_exists(self, ex: Executor, name: str) -> bool:
        (oid,) = ex.execute("SELECT to_regclass(?)::oid", (name,)).fetchone()
        return oid is not None

    def _schema_lock(self, ex: Executor) -> None:
        ex.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK_ID,))
