"""The ledger's versioned schema: the SQL that creates the current version on each backend and
the small set of upgrades between versions.

Versions
--------
1. The first SQLite format (no ``schema_version`` table): datasets and releases, statuses
   ``pending`` and ``committed``.
2. ``schema_version``; the neighbour relation of each budget and release; the charge of each
   release in its budget's relation (after an explicit group-privacy conversion); status
   ``aborted`` with its reason; the curator-side clipped count; a check that only a pending
   release holds a key. Version-1 releases did not record their relation: the upgrade records
   them, and their budgets, as ``replace-one``.
3. Each release's privacy loss is one serialised value (:func:`mvg_dask.privacy.accounting.
   loss_to_json`, a JSON object with a ``type`` tag): ``loss``, its own, and ``charge``, what it
   counts against its budget. They replace the columns ``epsilon``, ``delta``, ``mu``,
   ``charge_epsilon``, ``charge_delta`` and ``charge_mu``; the upgrade computes them from those
   columns (:func:`mvg_dask.ledger.composition.charge_loss`: Gaussian DP for an ``exact``
   release with a ``mu``, approximate DP otherwise), so every entry's loss and every budget
   decision are preserved.

A database with no ledger tables is created at :data:`CURRENT`. A ledger at an older version is
refused until ``mvg-dask ledger migrate`` upgrades it; one at a newer version is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mvg_dask.ledger.composition import charge_loss
from mvg_dask.privacy.accounting import loss_to_json

CURRENT = 4

_NEIGHBOURS_CHECK = "CHECK (neighbours IN ('replace-one', 'add-remove'))"


def _tables(real: str, boolean: str, integer: str) -> list[str]:
    return [
        f"""CREATE TABLE schema_version (
            version INTEGER PRIMARY KEY,
            applied {real} NOT NULL
        )""",
        f"""CREATE TABLE datasets (
            dataset TEXT PRIMARY KEY,
            epsilon {real} NOT NULL,
            delta {real} NOT NULL,
            neighbours TEXT NOT NULL DEFAULT 'replace-one' {_NEIGHBOURS_CHECK},
            created {real} NOT NULL
        )""",
        _releases("releases", real, boolean, integer),
        "CREATE INDEX releases_by_dataset ON releases(dataset)",
    ]


def _stream_tables(real: str, integer: str, blob: str) -> list[str]:
    """The tables of version 4: streams, their periods and their curator-side state."""
    return [
        f"""CREATE TABLE streams (
            stream_id TEXT PRIMARY KEY,
            dataset TEXT NOT NULL REFERENCES datasets(dataset),
            release_id TEXT NOT NULL UNIQUE REFERENCES releases(release_id),
            horizon {integer} NOT NULL CHECK (horizon >= 1),
            factorization TEXT NOT NULL,
            spec_hash TEXT NOT NULL,
            output TEXT NOT NULL,
            stream_key TEXT,
            periods {integer} NOT NULL CHECK (periods >= 0 AND periods <= horizon),
            watermark {integer} NOT NULL CHECK (watermark >= 0),
            created {real} NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('open', 'complete')),
            CHECK (status = 'open' OR stream_key IS NULL)
        )""",
        "CREATE INDEX streams_by_dataset ON streams(dataset)",
        f"""CREATE TABLE stream_periods (
            stream_id TEXT NOT NULL REFERENCES streams(stream_id),
            period {integer} NOT NULL CHECK (period >= 1),
            label TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending', 'committed')),
            watermark_before {integer} NOT NULL,
            watermark_after {integer},
            created {real} NOT NULL,
            committed {real},
            clipped {integer},
            PRIMARY KEY (stream_id, period)
        )""",
        f"""CREATE TABLE stream_state (
            stream_id TEXT NOT NULL REFERENCES streams(stream_id),
            period {integer} NOT NULL,
            part TEXT NOT NULL,
            data {blob} NOT NULL,
            PRIMARY KEY (stream_id, period, part)
        )""",
    ]


_SQLITE_STREAMS = _stream_tables("REAL", "INTEGER", "BLOB")
_PG_STREAMS = [
    *_stream_tables("DOUBLE PRECISION", "BIGINT", "BYTEA"),
    "REVOKE ALL ON streams, stream_periods, stream_state FROM PUBLIC",
]


def _releases(name: str, real: str, boolean: str, integer: str) -> str:
    return f"""CREATE TABLE {name} (
        release_id TEXT PRIMARY KEY,
        dataset TEXT NOT NULL REFERENCES datasets(dataset),
        status TEXT NOT NULL CHECK (status IN ('pending', 'committed', 'aborted')),
        calibration TEXT NOT NULL,
        loss TEXT NOT NULL,
        neighbours TEXT NOT NULL {_NEIGHBOURS_CHECK},
        charge TEXT NOT NULL,
        spec_hash TEXT NOT NULL,
        output TEXT NOT NULL,
        noise_key TEXT,
        seeded {boolean} NOT NULL,
        created {real} NOT NULL,
        committed {real},
        aborted {real},
        reason TEXT,
        clipped {integer},
        CHECK (status = 'pending' OR noise_key IS NULL)
    )"""


def _releases_v2(name: str, real: str, boolean: str, integer: str) -> str:
    return f"""CREATE TABLE {name} (
        release_id TEXT PRIMARY KEY,
        dataset TEXT NOT NULL REFERENCES datasets(dataset),
        status TEXT NOT NULL CHECK (status IN ('pending', 'committed', 'aborted')),
        epsilon {real} NOT NULL,
        delta {real} NOT NULL,
        calibration TEXT NOT NULL,
        mu {real},
        neighbours TEXT NOT NULL {_NEIGHBOURS_CHECK},
        charge_epsilon {real} NOT NULL,
        charge_delta {real} NOT NULL,
        charge_mu {real},
        spec_hash TEXT NOT NULL,
        output TEXT NOT NULL,
        noise_key TEXT,
        seeded {boolean} NOT NULL,
        created {real} NOT NULL,
        committed {real},
        aborted {real},
        reason TEXT,
        clipped {integer},
        CHECK (status = 'pending' OR noise_key IS NULL)
    )"""


#: Statements creating the current schema, per backend (the caller inserts the version row).
CREATE: dict[str, list[str]] = {
    "sqlite": [*_tables("REAL", "INTEGER", "INTEGER"), *_SQLITE_STREAMS],
    "postgresql": [
        *_tables("DOUBLE PRECISION", "BOOLEAN", "BIGINT"),
        # explicit, although PostgreSQL grants nothing on new tables to PUBLIC: only the
        # ledger's role (the owner) reads the keys
        "REVOKE ALL ON schema_version, datasets, releases FROM PUBLIC",
        *_PG_STREAMS,
    ],
}
CREATE["memory"] = CREATE["sqlite"]

_V1_TO_V2_COPY = """INSERT INTO releases_v2 (
        release_id, dataset, status, epsilon, delta, calibration, mu, neighbours,
        charge_epsilon, charge_delta, charge_mu, spec_hash, output, noise_key, seeded,
        created, committed)
    SELECT release_id, dataset, status, epsilon, delta, calibration, mu, 'replace-one',
        epsilon, delta, mu, spec_hash, output, noise_key, seeded, created, committed
    FROM releases"""


def _losses_from_columns(ex: Any) -> None:
    """Version 2 to 3: each release's ``loss`` and ``charge`` from its recorded columns."""
    rows = ex.execute(
        "SELECT release_id, epsilon, delta, calibration, mu, charge_epsilon, charge_delta, "
        "charge_mu FROM releases"
    ).fetchall()
    for release_id, eps, delta, calibration, mu, c_eps, c_delta, c_mu in rows:
        ex.execute(
            "UPDATE releases SET loss = ?, charge = ? WHERE release_id = ?",
            (
                loss_to_json(charge_loss(eps, delta, calibration, mu)),
                loss_to_json(charge_loss(c_eps, c_delta, calibration, c_mu)),
                release_id,
            ),
        )


_V2_TO_V3_COPY = """INSERT INTO releases_v3 (
        release_id, dataset, status, calibration, loss, neighbours, charge, spec_hash, output,
        noise_key, seeded, created, committed, aborted, reason, clipped)
    SELECT release_id, dataset, status, calibration, loss, neighbours, charge, spec_hash, output,
        noise_key, seeded, created, committed, aborted, reason, clipped
    FROM releases"""
_V2_TO_V3_DROPPED = ("epsilon", "delta", "mu", "charge_epsilon", "charge_delta", "charge_mu")

#: One step of an upgrade: an SQL statement, or a function of the transaction.
Step = str | Callable[[Any], None]

#: ``UPGRADE[backend][v]`` takes a ledger from version ``v`` to ``v + 1`` (one transaction).
UPGRADE: dict[str, dict[int, list[Step]]] = {
    "sqlite": {
        1: [
            "ALTER TABLE datasets ADD COLUMN neighbours TEXT NOT NULL DEFAULT 'replace-one' "
            + _NEIGHBOURS_CHECK,
            _releases_v2("releases_v2", "REAL", "INTEGER", "INTEGER"),
            _V1_TO_V2_COPY,
            "DROP TABLE releases",
            "ALTER TABLE releases_v2 RENAME TO releases",
            "CREATE INDEX releases_by_dataset ON releases(dataset)",
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied REAL NOT NULL)",
        ],
        2: [
            "ALTER TABLE releases ADD COLUMN loss TEXT",
            "ALTER TABLE releases ADD COLUMN charge TEXT",
            _losses_from_columns,
            _releases("releases_v3", "REAL", "INTEGER", "INTEGER"),
            _V2_TO_V3_COPY,
            "DROP TABLE releases",
            "ALTER TABLE releases_v3 RENAME TO releases",
            "CREATE INDEX releases_by_dataset ON releases(dataset)",
        ],
        3: list(_SQLITE_STREAMS),
    },
    # PostgreSQL ledgers start at version 2
    "postgresql": {
        2: [
            "ALTER TABLE releases ADD COLUMN loss TEXT",
            "ALTER TABLE releases ADD COLUMN charge TEXT",
            _losses_from_columns,
            "ALTER TABLE releases ALTER COLUMN loss SET NOT NULL",
            "ALTER TABLE releases ALTER COLUMN charge SET NOT NULL",
            *(f"ALTER TABLE releases DROP COLUMN {c}" for c in _V2_TO_V3_DROPPED),
        ],
        3: list(_PG_STREAMS),
    },
    # in-memory ledgers start at the current version
    "memory": {},
}

#: The columns of ``releases`` in the order :class:`LedgerEntry` takes them.
RELEASE_COLUMNS = (
    "release_id, dataset, status, calibration, loss, neighbours, charge, spec_hash, output, "
    "noise_key, seeded, created, committed, aborted, reason, clipped"
)

#: The columns of ``streams`` in the order :class:`~mvg_dask.ledger.streams.StreamEntry` takes
#: them (never the key).
STREAM_COLUMNS = (
    "stream_id, dataset, release_id, horizon, factorization, spec_hash, output, periods, "
    "watermark, status, created"
)

#: The columns of ``stream_periods`` in the order :class:`~mvg_dask.ledger.streams.PeriodEntry`
#: takes them.
PERIOD_COLUMNS = (
    "stream_id, period, label, status, watermark_before, watermark_after, clipped, created, "
    "committed"
)
