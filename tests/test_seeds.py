"""A seeded release is not private: refused for a spec with a ledger (API, CLI, accessor,
engine, ledger), before anything is read, written or charged; without a ledger it runs and is
marked seeded; ``ledger show`` flags seeded entries an earlier version charged."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from mvg_dask import api
from mvg_dask.engine.ledger import open_ledger
from mvg_dask.errors import LedgerError
from mvg_dask.privacy import calibration as cal
from mvg_dask.spec import SpecError
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

ROOT = Path(__file__).resolve().parents[1]
REFUSAL = (
    "seed: a seeded release is not private (its noise follows from the seed, which a search "
    "over seeds recovers from the output), so it cannot be charged to the privacy ledger of "
    "dataset 'd'; release without a seed, or remove ledger from the spec for test or demo data"
)


def _setup(tmp_path: Path, *, readable: bool = False) -> tuple[dict, Path, Path]:
    """A spec with a ledger; unless ``readable``, its input has no chunks (a read would fail
    with another error)."""
    store = make_input(tmp_path / "in.zarr", data(3, 200, seed=1), chunk=100)
    if not readable:
        shutil.rmtree(Path(store) / "X" / "c")
    ledger = tmp_path / "ledger.sqlite"
    out = tmp_path / "out.zarr"
    spec = spec_dict(
        store,
        str(out),
        ledger={"path": str(ledger), "dataset": "d", "budget": {"epsilon": 5.0, "delta": 1e-4}},
    )
    return spec, out, ledger


def test_the_api_refuses_a_seed_with_a_ledger(tmp_path):
    spec, out, ledger = _setup(tmp_path)
    with pytest.raises(SpecError) as err:
        api.release(spec, seed=7)  # refused before a cluster is started
    assert str(err.value) == REFUSAL
    assert not out.exists() and not ledger.exists()


def test_the_engine_refuses_it_too(tmp_path):
    from mvg_dask.engine.release import execute_release

    spec, out, ledger = _setup(tmp_path)
    rplan = api.dry_run(spec)
    with pytest.raises(SpecError, match=r"^seed: a seeded release is not private"):
        execute_release(rplan, None, seed=7)  # type: ignore[arg-type]  # checked first
    assert not out.exists() and not ledger.exists()


def test_the_accessor_refuses_it_before_writing_the_input_copy(tmp_path):
    from tests.test_accessor import BOX, PRIVACY, dataarray

    ledger = {"path": str(tmp_path / "l.sqlite"), "dataset": "d",
              "budget": {"epsilon": 5.0, "delta": 1e-4}}  # fmt: skip
    with pytest.raises(SpecError, match=r"^seed: a seeded release is not private"):
        dataarray(3, 100).mvg.release(
            tmp_path / "rel", query="identity", domain=BOX, privacy=PRIVACY, ledger=ledger, seed=3
        )
    assert not (tmp_path / "rel").exists() and not (tmp_path / "l.sqlite").exists()


def test_the_cli_refuses_it_in_one_line(tmp_path):
    spec, out, ledger = _setup(tmp_path)
    path = write_spec(tmp_path / "spec.yaml", spec)
    run = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path), "--seed", "7"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr
    (line,) = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert line == f"mvg-dask: error: {REFUSAL}"
    assert not out.exists() and not ledger.exists()


def test_the_ledger_refuses_to_charge_a_seeded_key(tmp_path):
    with open_ledger(tmp_path / "l.sqlite") as book:
        book.ensure_dataset("d", 5.0, 1e-4)
        with pytest.raises(LedgerError, match="is seeded, so not private"):
            book.reserve(
                dataset="d",
                release_id="r",
                epsilon=1.0,
                delta=1e-5,
                calibration="exact",
                mu=cal.analytic_gaussian_mu(1.0, 1e-5),
                spec_hash="h",
                output="o",
                noise_key="00" * 16,
                seeded=True,
            )
        assert book.releases() == []


def test_a_seeded_release_without_a_ledger_runs_and_is_marked(tmp_path, client):
    spec, out, _ = _setup(tmp_path, readable=True)
    del spec["ledger"]
    a = api.release(spec, client=client, seed=7, progress=False)
    assert a.seeded and api.open_release(str(out)).attrs["mvg_dask_seeded"] is True


def test_ledger_show_flags_a_seeded_entry_of_an_earlier_version(tmp_path):
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as book:
        book.ensure_dataset("d", 5.0, 1e-4)
        book.reserve(
            dataset="d",
            release_id="old-seeded",
            epsilon=1.0,
            delta=1e-5,
            calibration="exact",
            mu=cal.analytic_gaussian_mu(1.0, 1e-5),
            spec_hash="h",
            output="o",
            noise_key="00" * 16,
            seeded=False,
        )
        book.commit("old-seeded")
    with sqlite3.connect(path) as db:  # as an earlier version recorded a seeded release
        db.execute("UPDATE releases SET seeded = 1")
    run = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "ledger", "show", "--ledger", str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert "[seeded: NOT private]" in run.stdout
    assert "warning: 1 seeded release(s) from an earlier version: not private" in run.stdout
