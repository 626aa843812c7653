"""Refusals decided from metadata alone: before a cluster starts, before anything is charged.

Each refusal runs ``mvg-dask release`` in a fresh process that reports, after the command, whether
``distributed`` was ever imported: no cluster, local or remote, can start without it, so its
absence shows that the refusal came before any cluster. The ledger's entries and the files
beside it are compared before and after (nothing charged, nothing written), and the dry run
must refuse the same way (exit 1).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mvg_dask.engine.ledger import open_ledger
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

ROOT = Path(__file__).resolve().parents[1]

_CLI = (
    "import json, sys\n"
    "from mvg_dask.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "print(json.dumps({'rc': rc, 'distributed': 'distributed' in sys.modules}))\n"
)


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, bool, str]:
    """Exit code, whether distributed was imported, and stderr of ``mvg-dask ARGS``."""
    out = subprocess.run(
        [sys.executable, "-c", _CLI, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    if out.returncode < 0:
        return out.returncode, True, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return report["rc"], report["distributed"], out.stderr


def _state(root: Path) -> dict[str, Any]:
    """The ledger's entries and every file but the ledger's (SQLite rewrites its own pages)."""
    files = {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith("ledger.sqlite")
    }
    ledger = root / "ledger.sqlite"
    entries = []
    if ledger.exists():
        with open_ledger(ledger, create=False) as book:
            entries = [(e.release_id, e.status, e.charge_epsilon) for e in book.releases()]
    return {"files": files, "entries": entries}


def _spec(root: Path, name: str, **overrides: Any) -> Path:
    spec = spec_dict(
        "in.zarr",
        "out.zarr",
        release_id="r1",
        ledger={
            "path": "ledger.sqlite",
            "dataset": "d",
            "budget": {"epsilon": 1.1, "delta": 1e-4},
        },
    )
    for key, value in overrides.items():
        spec[key] = {**spec[key], **value} if isinstance(spec.get(key), dict) else value
    return write_spec(root / name, spec)


@pytest.fixture
def released(tmp_path: Path) -> Path:
    """A directory with an input, a spec and its complete release ``r1`` charged to the ledger
    (budget epsilon 1.1: room for one release of epsilon 1, not for two)."""
    make_input(tmp_path / "in.zarr", data(3, 300, seed=3), chunk=100)
    _spec(tmp_path, "spec.yaml")
    rc, imported, err = _cli(tmp_path, "release", "spec.yaml", "--quiet")
    assert rc == 0 and imported, err
    return tmp_path


def _refused(root: Path, args: list[str], message: str, **kw: Any) -> None:
    """The release and its dry run exit 1 with ``message``, start no cluster and change nothing."""
    before = _state(root)
    for extra in ([], ["--dry-run"]):
        rc, imported, err = _cli(root, "release", *args, *extra, **kw)
        assert rc == 1, (extra, err)
        lines = err.strip().splitlines()
        assert lines[-1].startswith("mvg-dask: error: ") and message in lines[-1], (extra, err)
        assert "Traceback" not in err
        assert not imported, f"{extra}: distributed was imported, so a cluster could have started"
        assert _state(root) == before, extra


def test_existing_output_is_refused_before_a_cluster(released: Path) -> None:
    _refused(released, ["spec.yaml", "--release-id", "r2"], "out.zarr already exists")


def test_exhausted_budget_is_refused_before_a_cluster(released: Path) -> None:
    _refused(
        released,
        ["spec.yaml", "--release-id", "r2", "--output", "other.zarr"],
        "privacy budget of dataset 'd' would be exceeded",
    )


def test_budget_that_is_not_the_registered_one_is_refused_before_a_cluster(
    released: Path,
) -> None:
    _spec(
        released, "other.yaml", release_id="r2", ledger={"budget": {"epsilon": 3.0, "delta": 1e-4}}
    )
    _refused(
        released,
        ["other.yaml", "--output", "other.zarr"],
        "ledger.budget: dataset 'd' is registered with epsilon=1.1",
    )


def test_a_file_that_is_not_sqlite_as_ledger_is_refused_before_a_cluster(tmp_path: Path) -> None:
    make_input(tmp_path / "in.zarr", data(3, 300, seed=3), chunk=100)
    (tmp_path / "notes.txt").write_text("not a database\n" * 100)
    _spec(tmp_path, "spec.yaml", ledger={"path": "notes.txt"})
    _refused(tmp_path, ["spec.yaml"], "notes.txt cannot be opened: file is not a database")


def test_unreachable_scheduler_is_refused_naming_its_address(tmp_path: Path) -> None:
    make_input(tmp_path / "in.zarr", data(3, 300, seed=3), chunk=100)
    _spec(tmp_path, "spec.yaml")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    message = f"cannot reach the Dask scheduler at {address} (from --scheduler)"
    _refused(tmp_path, ["spec.yaml", "--scheduler", address], message)
    env_message = f"cannot reach the Dask scheduler at {address} (from DASK_SCHEDULER_ADDRESS)"
    _refused(tmp_path, ["spec.yaml"], env_message, env={"DASK_SCHEDULER_ADDRESS": address})


def test_the_same_release_id_is_resumed_or_found_complete_not_refused(released: Path) -> None:
    # complete: an idempotent retry, for the release and for its dry run
    for extra in ([], ["--dry-run"]):
        rc, _, err = _cli(released, "release", "spec.yaml", "--quiet", *extra)
        assert rc == 0, err
    # pending (the process killed after its reservation): resumed, charged once
    budget = {"epsilon": 4.0, "delta": 1e-4}
    _spec(
        released,
        "p.yaml",
        release_id="p1",
        output={"store": "p.zarr"},
        ledger={"dataset": "e", "budget": budget},
    )
    rc, _, _ = _cli(released, "release", "p.yaml", env={"MVG_DASK_CRASH_AT": "reserved"})
    assert rc == -signal.SIGKILL
    for extra in (["--dry-run"], []):
        rc, _, err = _cli(released, "release", "p.yaml", "--quiet", *extra)
        assert rc == 0, (extra, err)
    with open_ledger(released / "ledger.sqlite", create=False) as book:
        assert [(e.release_id, e.status) for e in book.releases()] == [
            ("r1", "committed"),
            ("p1", "committed"),
        ]


def test_a_database_without_the_ledgers_tables_is_not_refused(tmp_path: Path) -> None:
    """As the release itself, which creates the ledger's tables in it (a new PostgreSQL
    database, or an SQLite file without them)."""
    import sqlite3

    from mvg_dask import api

    make_input(tmp_path / "in.zarr", data(3, 300, seed=3), chunk=100)
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        db.execute("CREATE TABLE other (a INTEGER)")
    spec = _spec(tmp_path, "spec.yaml")
    assert api.preflight(spec).release_id == "r1"
