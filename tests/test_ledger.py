"""The privacy ledger: races, composition, keys at rest, refusals that change nothing."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import random
import stat
import subprocess
import sys
import time

import dp_accounting
import pytest

from mvg_dask.engine.ledger import Ledger, spending
from mvg_dask.errors import BudgetError, ReleaseError
from mvg_dask.privacy import calibration as cal

KEY = "0123456789abcdef0123456789abcdef"


def _reserve(
    book: Ledger,
    rid: str,
    eps: float = 1.0,
    delta: float = 1e-7,
    calibration: str = "mvg-thm2",
    mu: float | None = None,
) -> None:
    book.reserve(
        dataset="d",
        release_id=rid,
        epsilon=eps,
        delta=delta,
        calibration=calibration,
        mu=mu,
        spec_hash="h",
        output=f"out/{rid}",
        noise_key=KEY,
        seeded=False,
    )


def _racer(path: str, worker: int, attempts: int, results: mp.Queue) -> None:
    book = Ledger(path)
    outcome = {"committed": 0, "refused": 0}
    for i in range(attempts):
        time.sleep(random.random() * 0.01)
        try:
            _reserve(book, f"w{worker}-r{i}")
        except BudgetError:
            outcome["refused"] += 1
            continue
        time.sleep(random.random() * 0.01)  # "compute" between reserve and commit
        book.commit(f"w{worker}-r{i}")
        outcome["committed"] += 1
    book.close()
    results.put(outcome)


def test_races_never_overspend(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    with Ledger(path) as book:
        book.ensure_dataset("d", 12.0, 1e-5)  # admits exactly 12 releases of epsilon 1
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(path, w, 5, results)) for w in range(8)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(o["committed"] for o in outcomes) == 12
    assert sum(o["refused"] for o in outcomes) == 40 - 12
    with Ledger(path) as book:
        (summary,) = book.summary()
        assert summary["spent"]["epsilon"] <= 12.0
        assert len(book.releases("d")) == 12
        assert all(r.status == "committed" and r.noise_key is None for r in book.releases("d"))


def test_file_mode_and_key_erased_on_commit(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as book:
        book.ensure_dataset("d", 10.0, 1e-5)
        _reserve(book, "r1")
        assert book.lookup("r1").noise_key == KEY
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for extra in ("-wal", "-shm"):
        p = tmp_path / f"ledger.sqlite{extra}"
        if p.exists():
            assert stat.S_IMODE(os.stat(p).st_mode) & 0o077 == 0
    with Ledger(path) as book:
        book.commit("r1")
        assert book.lookup("r1").noise_key is None
    # the key's bytes are gone from every file of the ledger (secure_delete, WAL truncated)
    for p in tmp_path.iterdir():
        assert KEY.encode() not in p.read_bytes(), p


def test_basic_composition_and_refusal_changes_nothing(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as book:
        book.ensure_dataset("d", 2.0, 1e-5)
        _reserve(book, "a", eps=1.5)
        with pytest.raises(BudgetError, match="would be exceeded"):
            _reserve(book, "b", eps=0.6)
        assert [r.release_id for r in book.releases()] == ["a"]
        _reserve(book, "c", eps=0.5)  # exactly fills the budget
        with pytest.raises(ReleaseError, match="already in the ledger"):
            _reserve(book, "c", eps=0.0001)
        with pytest.raises(BudgetError, match="registered with"):
            book.ensure_dataset("d", 3.0, 1e-5)
        book.cancel("a")  # a clean failure is refunded
        assert [r.release_id for r in book.releases()] == ["c"]


def test_gaussian_dp_composition_when_every_release_is_exact(tmp_path):
    eps_total, delta_total = 3.0, 1e-5
    with Ledger(tmp_path / "l.sqlite") as book:
        book.ensure_dataset("d", eps_total, delta_total)
        mu1 = cal.analytic_gaussian_mu(1.0, 1e-6)
        n = 0
        while True:
            try:
                _reserve(book, f"r{n}", eps=1.0, delta=1e-6, calibration="exact", mu=mu1)
            except BudgetError:
                break
            n += 1
        # basic composition would stop at 3; Gaussian DP admits more, exactly while
        # delta_AG(3, sqrt(n) mu1) <= 1e-5
        assert n > 3
        assert cal.analytic_gaussian_delta(eps_total, math.sqrt(n) * mu1) <= delta_total
        assert cal.analytic_gaussian_delta(eps_total, math.sqrt(n + 1) * mu1) > delta_total
        (summary,) = book.summary()
        assert summary["composition"] == "gaussian-dp"
        # a paper-calibrated release switches the dataset to basic composition: now over budget
        with pytest.raises(BudgetError):
            _reserve(book, "paper", eps=0.01, delta=1e-9, calibration="mvg-thm2")


def test_gaussian_dp_total_agrees_with_dp_accounting_pld():
    mus = [0.3, 0.5, 0.2, 0.4]
    s = spending([(1.0, 1e-6, "exact", m) for m in mus], 1e-5)
    # dp-accounting's PLD accountant on the same Gaussian mechanisms (sigma = 1/mu)
    acc = dp_accounting.pld.PLDAccountant()
    for m in mus:
        acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / m))
    eps_pld = acc.get_epsilon(1e-5)
    assert s.epsilon == pytest.approx(eps_pld, rel=2e-2)
    assert s.epsilon <= eps_pld * (1 + 1e-9) + 1e-9  # PLD is pessimistic, never below exact


def test_ledger_show_cli(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as book:
        book.ensure_dataset("d", 5.0, 1e-5)
        _reserve(book, "r1")
        book.commit("r1")
        _reserve(book, "r2", eps=0.5)
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "ledger", "show", "--ledger", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    (ds,) = json.loads(out.stdout)
    assert ds["spent"]["epsilon"] == pytest.approx(1.5)
    assert ds["left"]["epsilon"] == pytest.approx(3.5)
    assert [r["status"] for r in ds["releases"]] == ["committed", "pending"]
    assert KEY not in out.stdout
    text = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "ledger", "show", "--ledger", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "r1" in text and "pending" in text and KEY not in text
