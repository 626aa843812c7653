"""The privacy ledger on both backends (a SQLite file, a real PostgreSQL server started by the
test suite): races, crashes, server restarts, keys at rest, composition, neighbour relations,
aborts, schema versions, and refusals that change nothing."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from scipy import stats
from scipy.optimize import brentq, linprog

from mvg_dask.errors import BudgetError, LedgerError, ReleaseError
from mvg_dask.ledger import (
    Guarantee,
    convert_neighbours,
    export_ledger,
    migrate_ledger,
    mixed_pld,
    open_ledger,
    spending,
    summary_text,
)
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP

KEY = "0123456789abcdef0123456789abcdef"
BACKENDS = ["sqlite", "postgresql"]
DATA = Path(__file__).parent / "data"


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path, monkeypatch):
    """A fresh, empty ledger location on each backend (the password from PGPASSWORD)."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    server = request.getfixturevalue("pg_server")
    monkeypatch.setenv("PGPASSWORD", server.ledger_password)
    return server.url(server.new_database())


def _reserve(
    book,
    rid: str,
    eps: float = 1.0,
    delta: float = 1e-7,
    calibration: str = "mvg-thm2",
    mu: float | None = None,
    neighbours: str = "replace-one",
    convert: bool = False,
    key: str = KEY,
):
    return book.reserve(
        dataset="d",
        release_id=rid,
        epsilon=eps,
        delta=delta,
        calibration=calibration,
        mu=mu,
        spec_hash="h",
        output=f"out/{rid}",
        noise_key=key,
        seeded=False,
        neighbours=neighbours,
        convert_neighbours=convert,
    )


# -- races and crashes ----------------------------------------------------------------------------
def _racer(location: str, worker: int, attempts: int, start, results: mp.Queue) -> None:
    book = open_ledger(location)
    start.wait(timeout=120)  # every process is connected: now they race
    t0 = time.perf_counter()
    outcome: dict[str, list[float] | int | float] = {"committed": 0, "refused": 0}
    latencies: list[float] = []
    for i in range(attempts):
        time.sleep(random.random() * 0.01)
        t = time.perf_counter()
        try:
            _reserve(book, f"w{worker}-r{i}")
        except BudgetError:
            outcome["refused"] += 1  # type: ignore[operator]
            continue
        finally:
            latencies.append(time.perf_counter() - t)
        time.sleep(random.random() * 0.01)  # "compute" between reserve and commit
        book.commit(f"w{worker}-r{i}")
        outcome["committed"] += 1  # type: ignore[operator]
    outcome["seconds"] = time.perf_counter() - t0
    outcome["reserve_s"] = latencies
    book.close()
    results.put(outcome)


def test_races_never_overspend(location):
    backend = "postgresql" if location.startswith("postgresql") else "sqlite"
    with open_ledger(location) as book:
        book.ensure_dataset("d", 12.0, 1e-5)  # admits exactly 12 releases of epsilon 1
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    start = ctx.Barrier(8)
    procs = [ctx.Process(target=_racer, args=(location, w, 5, start, results)) for w in range(8)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(o["committed"] for o in outcomes) == 12
    assert sum(o["refused"] for o in outcomes) == 40 - 12
    lat = sorted(s for o in outcomes for s in o["reserve_s"])
    print(
        f"\nrace on {backend}: 8 processes x 5 = 40 reservations -> 12 committed, 28 refused; "
        f"racing took {max(o['seconds'] for o in outcomes):.3f} s; reserve latency median "
        f"{1e3 * lat[len(lat) // 2]:.1f} ms, p90 {1e3 * lat[int(0.9 * len(lat))]:.1f} ms, "
        f"max {1e3 * lat[-1]:.1f} ms"
    )
    with open_ledger(location) as book:
        (summary,) = book.summary()
        assert summary["spent"]["epsilon"] <= 12.0
        assert len(book.releases("d")) == 12
        assert all(r.status == "committed" and r.noise_key is None for r in book.releases("d"))


_CRASHER = textwrap.dedent(
    """
    import sys
    from mvg_dask.ledger import open_ledger
    location, step = sys.argv[1], sys.argv[2]
    book = open_ledger(location)
    if step == "reserve":
        book.reserve(dataset="d", release_id="k", epsilon=1.0, delta=1e-7,
                     calibration="mvg-thm2", mu=None, spec_hash="h", output="o",
                     noise_key=sys.argv[3], seeded=False)
    else:
        book.commit("k")
    """
)


def _crash(location: str, step: str, point: str) -> None:
    env = {**os.environ, "MVG_DASK_CRASH_AT": point}
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHER, location, step, KEY],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_sigkill_during_reserve_and_during_commit(location):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 1.5, 1e-5)
    # killed inside the reservation's transaction (row written, not committed): nothing stays,
    # and the dataset's lock is free again (the next reservation goes through at once)
    _crash(location, "reserve", "ledger-reserve")
    with open_ledger(location, timeout=20) as book:
        assert book.releases() == []
        _reserve(book, "k")
    # killed inside the commit's transaction: still pending (charged), key kept for the resume
    _crash(location, "commit", "ledger-committed")
    with open_ledger(location, timeout=20) as book:
        (entry,) = book.releases()
        assert entry.status == "pending" and entry.noise_key == KEY
        with pytest.raises(BudgetError, match="would be exceeded"):
            _reserve(book, "other")  # the pending release is charged
        book.commit("k")
        (entry,) = book.releases()
        assert entry.status == "committed" and entry.noise_key is None


# -- PostgreSQL server restarts -------------------------------------------------------------------
@pytest.fixture
def pg_location(pg_server, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", pg_server.ledger_password)
    return pg_server.url(pg_server.new_database())


def test_server_restart_mid_release_charges_exactly_once(pg_server, pg_location, caplog):
    with open_ledger(pg_location) as book:
        book.ensure_dataset("d", 2.5, 1e-5)
        _reserve(book, "a")
        pg_server.restart("fast")  # drops every connection while "a" is computing
        book.commit("a")  # reconnects and commits once
        _reserve(book, "b")
        pg_server.restart("immediate")  # a crash of the server, then recovery
        book.commit("b")
        # the server is down when the release finishes; it comes back a second later
        _reserve(book, "c", eps=0.5)
        pg_server.stop("fast")
        threading.Timer(1.0, pg_server.start).start()
        book.abort("c", "NaN in the data")
        entries = {e.release_id: e for e in book.releases()}
    assert {k: e.status for k, e in entries.items()} == {
        "a": "committed",
        "b": "committed",
        "c": "aborted",
    }
    assert all(e.noise_key is None for e in entries.values())
    with open_ledger(pg_location) as book:
        (s,) = book.summary()
        assert s["spent"]["epsilon"] == pytest.approx(2.5)  # no lost and no double charge
        with pytest.raises(BudgetError):
            _reserve(book, "d", eps=0.01)
    assert "reconnecting" in caplog.text
    assert pg_server.ledger_password not in caplog.text


def test_a_commit_whose_answer_is_lost_takes_effect_exactly_once(pg_server, pg_location):
    """The server commits, the connection breaks before the client hears it: the retry must
    recognise the committed step (its own key, its own status), never repeat or refuse it."""
    from tests.pg_helpers import CommitDroppingProxy

    proxy = CommitDroppingProxy(pg_server.port)
    try:
        with open_ledger(proxy.url(pg_location.rsplit("/", 1)[1])) as book:
            book.ensure_dataset("d", 2.0, 1e-5)
            proxy.armed.set()
            after = _reserve(book, "r")  # committed; answer lost; retried
            assert proxy.dropped == 1 and after.epsilon == pytest.approx(1.0)
            proxy.armed.set()
            book.commit("r")
            proxy.armed.set()
            _reserve(book, "s", key=KEY[::-1])
            proxy.armed.set()
            book.abort("s", "failed after reading")
            assert proxy.dropped == 4
            entries = {e.release_id: e.status for e in book.releases()}
            (s,) = book.summary()
    finally:
        proxy.close()
    assert entries == {"r": "committed", "s": "aborted"}
    assert s["spent"]["epsilon"] == pytest.approx(2.0)  # each charged once


def test_reservations_serialise_per_dataset_only(pg_location):
    import psycopg

    with open_ledger(pg_location) as book:
        book.ensure_dataset("a", 5.0, 1e-5)
        book.ensure_dataset("d", 5.0, 1e-5)
    # another job holds dataset a's lock (inside its reservation)
    with psycopg.connect(pg_location) as other, other.transaction():
        other.execute("SELECT 1 FROM datasets WHERE dataset = 'a' FOR UPDATE")
        with open_ledger(pg_location, timeout=1.0) as book:
            _reserve(book, "free")  # dataset d: not blocked
            with pytest.raises(LedgerError, match="waited 1 s for another reservation"):
                book.reserve(
                    dataset="a",
                    release_id="blocked",
                    epsilon=0.1,
                    delta=1e-9,
                    calibration="exact",
                    mu=0.1,
                    spec_hash="h",
                    output="o",
                    noise_key=KEY,
                    seeded=False,
                )
    with open_ledger(pg_location) as book:
        assert [e.release_id for e in book.releases()] == ["free"]


# -- keys -----------------------------------------------------------------------------------------
def test_key_erased_on_commit_and_abort(location, request):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 10.0, 1e-5)
        _reserve(book, "r1")
        _reserve(book, "r2", key=KEY[::-1])
        assert book.lookup("r1").noise_key == KEY
        book.commit("r1")
        book.abort("r2", "on_violation: error")
        assert book.lookup("r1").noise_key is None and book.lookup("r2").noise_key is None
        text = json.dumps(export_ledger(book)) + summary_text(book.summary())
        assert KEY not in text and KEY[::-1] not in text
    if location.startswith("postgresql"):
        server = request.getfixturevalue("pg_server")
        db = location.rsplit("/", 1)[1]
        # PostgreSQL keeps the dead row version until VACUUM; VACUUM FULL rewrites the table
        # (the documented remedy) and a checkpoint removes the old file
        server.psql("VACUUM FULL releases", db=db)
        server.psql("CHECKPOINT", db=db)
        table = server.psql("SELECT pg_relation_filepath('releases')", db=db).strip()
        db_dir = server.data / Path(table).parent  # every file of this database
        files = [p for p in db_dir.iterdir() if p.is_file()]
        assert (server.data / table) in files
        for p in files:
            blob = p.read_bytes()
            assert KEY.encode() not in blob and KEY[::-1].encode() not in blob, p
    else:
        folder = Path(location).parent
        assert stat.S_IMODE(os.stat(location).st_mode) == 0o600
        for p in folder.iterdir():  # secure_delete and a truncated WAL: no copy anywhere
            assert stat.S_IMODE(os.stat(p).st_mode) & 0o077 == 0
            assert KEY.encode() not in p.read_bytes() and KEY[::-1].encode() not in p.read_bytes()


def test_pending_key_readable_only_by_the_ledger_role(pg_server, pg_location, monkeypatch):
    with open_ledger(pg_location) as book:
        book.ensure_dataset("d", 10.0, 1e-5)
        _reserve(book, "r1")
    import psycopg

    db = pg_location.rsplit("/", 1)[1]
    monkeypatch.setenv("PGPASSWORD", pg_server.analyst_password)
    with psycopg.connect(pg_server.url(db, user="analyst")) as conn:
        for table in ("releases", "datasets", "schema_version"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {table}")
            conn.rollback()
    # and as a ledger: the analyst role cannot open it
    with pytest.raises(LedgerError, match="permission denied"):
        open_ledger(pg_server.url(db, user="analyst"))


# -- composition ----------------------------------------------------------------------------------
def test_basic_composition_and_refusal_changes_nothing(location):
    with open_ledger(location) as book:
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
        with pytest.raises(BudgetError, match="has no budget"):
            book.reserve(
                dataset="nope",
                release_id="x",
                epsilon=0.1,
                delta=1e-9,
                calibration="exact",
                mu=0.1,
                spec_hash="h",
                output="o",
                noise_key=KEY,
                seeded=False,
            )
        book.cancel("a")  # a failure before any read is refunded
        assert [r.release_id for r in book.releases()] == ["c"]


def test_gaussian_dp_composition_when_every_release_is_exact(location):
    eps_total, delta_total = 3.0, 1e-5
    with open_ledger(location) as book:
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
        # a paper-calibrated release makes the set mixed: privacy-loss-distribution composition,
        # which admits it exactly when the closed form of the mix fits (basic composition of
        # the same set would be far over budget: n > 3 releases of epsilon 1)
        mu_n = math.sqrt(n) * mu1
        big = _gaussian_plus_approx_dp_delta(eps_total, mu_n, 0.5, 1e-9)
        assert big > delta_total
        with pytest.raises(BudgetError):
            _reserve(book, "paper-big", eps=0.5, delta=1e-9, calibration="mvg-thm2")
        small = _gaussian_plus_approx_dp_delta(eps_total, mu_n, 0.01, 1e-9)
        assert small <= 0.99 * delta_total
        _reserve(book, "paper", eps=0.01, delta=1e-9, calibration="mvg-thm2")
        (summary,) = book.summary()
        assert summary["composition"] == "pld"
        assert summary["spent"]["epsilon"] <= eps_total


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


def _gauss_delta(e: float, mu: float) -> float:
    """Hockey-stick divergence of N(mu, 1) from N(0, 1) at any real e (Balle & Wang, Thm. 8)."""
    return float(stats.norm.cdf(mu / 2 - e / mu) - math.exp(e) * stats.norm.cdf(-mu / 2 - e / mu))


def _gaussian_plus_approx_dp_delta(eps: float, mu: float, eps0: float, delta0: float) -> float:
    """Tight delta(eps) of a mu-GDP mechanism composed with a worst-case (eps0, delta0)-DP one.

    Independent of dp-accounting: every (eps0, delta0)-DP mechanism is a post-processing of the
    four-outcome mechanism of Kairouz, Oh & Viswanath (2015), whose privacy loss is +inf with
    probability delta0 and +-eps0 with probabilities (1 - delta0) e^eps0 / (1 + e^eps0) and
    (1 - delta0) / (1 + e^eps0); the Gaussian's loss is N(mu^2/2, mu^2), so
    delta(eps) = delta0 + (1 - delta0) (p+ delta_G(eps - eps0) + p- delta_G(eps + eps0)).
    """
    p_plus = math.exp(eps0) / (1 + math.exp(eps0))
    return delta0 + (1 - delta0) * (
        p_plus * _gauss_delta(eps - eps0, mu) + (1 - p_plus) * _gauss_delta(eps + eps0, mu)
    )


def _k_fold_approx_dp_delta(eps: float, k: int, eps0: float, delta0: float) -> float:
    """Tight delta(eps) of k worst-case (eps0, delta0)-DP mechanisms (binomial privacy loss)."""
    p_plus = math.exp(eps0) / (1 + math.exp(eps0))
    rr = math.fsum(
        math.comb(k, i)
        * p_plus ** (k - i)
        * (1 - p_plus) ** i
        * max(0.0, 1 - math.exp(eps - (k - 2 * i) * eps0))
        for i in range(k + 1)
    )
    return 1 - (1 - delta0) ** k * (1 - rr)


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize(("mu", "eps0", "delta0"), [(0.5, 0.3, 1e-6), (1.2, 1.0, 1e-8)])
def test_mixed_composition_matches_the_closed_form(eps, mu, eps0, delta0):
    """The ledger's PLD (dp-accounting) of a Gaussian release plus a paper-calibrated one against
    the closed form: an upper bound (pessimistic discretisation), within 1 %."""
    pld = mixed_pld([(1.0, 1e-6, "exact", mu), (eps0, delta0, "mvg-thm2", None)])
    oracle = _gaussian_plus_approx_dp_delta(eps, mu, eps0, delta0)
    ours = float(pld.get_delta_for_epsilon(eps))
    assert oracle * (1 - 1e-9) <= ours <= oracle * 1.01 + 1e-12


@pytest.mark.parametrize("k", [2, 10, 30])
def test_k_paper_releases_compose_as_the_binomial_closed_form(k):
    """k identical (eps0, delta0) releases: the PLD against the exact binomial formula."""
    eps0, delta0 = 0.05, 1e-8
    pld = mixed_pld([(eps0, delta0, "mvg-thm2", None)] * k)
    for eps in (0.2, 0.5, 1.0):
        oracle = _k_fold_approx_dp_delta(eps, k, eps0, delta0)
        ours = float(pld.get_delta_for_epsilon(eps))
        assert oracle * (1 - 1e-9) - 1e-15 <= ours <= oracle * 1.01 + 1e-12


def test_mixed_releases_compose_tighter_than_basic(location):
    """Basic composition stops at 20 releases of (0.05, 1e-8) in a (1, 1e-5) budget; the PLD
    admits them exactly while the binomial closed form fits, and a Gaussian release joins the
    same accounting."""
    eps_total, delta_total = 1.0, 1e-5
    eps0, delta0 = 0.05, 1e-8
    with open_ledger(location) as book:
        book.ensure_dataset("d", eps_total, delta_total)
        n = 0
        while True:
            try:
                _reserve(book, f"p{n}", eps=eps0, delta=delta0, calibration="mvg-thm2")
            except BudgetError:
                break
            n += 1
        assert n > 20
        assert _k_fold_approx_dp_delta(eps_total, n, eps0, delta0) <= delta_total
        assert _k_fold_approx_dp_delta(eps_total, n + 1, eps0, delta0) > delta_total * 0.99
        (summary,) = book.summary()
        assert summary["composition"] == "pld"
        assert summary["spent"]["epsilon"] <= eps_total
        assert summary["left"]["delta"] is None  # epsilon is reported at the budget's delta
        # the refusal changed nothing
        assert len(book.releases()) == n


# -- aborts ---------------------------------------------------------------------------------------
def test_abort_stays_charged_cancel_is_refunded(location):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 2.0, 1e-5)
        _reserve(book, "aborted", eps=1.0)
        book.abort("aborted", "NaN in records 200..299")
        book.cancel("aborted")  # a cancel after an abort refunds nothing
        _reserve(book, "committed", eps=0.5)
        book.commit("committed", clipped=7)
        _reserve(book, "cancelled", eps=0.5)
        book.cancel("cancelled")
        with pytest.raises(BudgetError, match="would be exceeded"):
            _reserve(book, "late", eps=0.6)  # 1.0 (aborted) + 0.5 + 0.6 > 2
        with pytest.raises(ReleaseError, match="aborted, not pending"):
            book.commit("aborted")
        with pytest.raises(ReleaseError, match="committed, not pending"):
            book.abort("committed", "late")
        with pytest.raises(ReleaseError, match="not in the ledger"):
            book.abort("cancelled", "gone")
        entries = {e.release_id: e for e in book.releases()}
        assert set(entries) == {"aborted", "committed"}
        assert entries["aborted"].status == "aborted"
        assert entries["aborted"].reason == "NaN in records 200..299"
        assert entries["committed"].clipped == 7
        (s,) = book.summary()
        assert s["spent"]["epsilon"] == pytest.approx(1.5)
        assert [r["status"] for r in s["releases"]] == ["aborted", "committed"]
        text = summary_text(book.summary())
        assert "reason: NaN in records 200..299" in text and "clipped=7" in text


# -- neighbour relations --------------------------------------------------------------------------
def test_neighbour_relations_are_stored_and_never_mixed_silently(location):
    eps, delta = 0.4, 1e-7
    with open_ledger(location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)  # replace-one by default
        with pytest.raises(BudgetError, match="convert_neighbours: true"):
            _reserve(book, "ar", eps=eps, delta=delta, neighbours="add-remove")
        assert book.releases() == []
        after = _reserve(book, "ar", eps=eps, delta=delta, neighbours="add-remove", convert=True)
        (e,) = book.releases()
        assert e.neighbours == "add-remove" and (e.epsilon, e.delta) == (eps, delta)
        assert e.charge_epsilon == pytest.approx(2 * eps)
        assert e.charge_delta == pytest.approx((1 + math.exp(eps)) * delta)
        assert after.epsilon == pytest.approx(2 * eps)
        with pytest.raises(BudgetError, match="keeps its budget in replace-one"):
            book.ensure_dataset("d", 3.0, 1e-5, "add-remove")
        # an add-remove budget never takes a replace-one release, converted or not
        book.ensure_dataset("n", 3.0, 1e-5, "add-remove")
        for convert in (False, True):
            with pytest.raises(BudgetError, match="no guarantee between datasets of different"):
                book.reserve(
                    dataset="n",
                    release_id="ro",
                    epsilon=0.1,
                    delta=1e-9,
                    calibration="exact",
                    mu=0.1,
                    spec_hash="h",
                    output="o",
                    noise_key=KEY,
                    seeded=False,
                    neighbours="replace-one",
                    convert_neighbours=convert,
                )
        (s,) = [x for x in book.summary() if x["dataset"] == "n"]
        assert s["releases"] == [] and s["budget"]["neighbours"] == "add-remove"


def test_converted_exact_releases_compose_as_2mu(location):
    mu = cal.analytic_gaussian_mu(0.5, 1e-7)
    with open_ledger(location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        _reserve(book, "a", 0.5, 1e-7, "exact", mu, neighbours="add-remove", convert=True)
        _reserve(book, "b", 0.5, 1e-7, "exact", mu)
        (s,) = book.summary()
    assert s["composition"] == "gaussian-dp"
    assert s["spent"]["mu"] == pytest.approx(math.sqrt((2 * mu) ** 2 + mu**2))


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0])
def test_group_privacy_of_the_gaussian_matches_dp_accounting(sigma):
    """Add-remove Gaussian of sensitivity 1: replace-one neighbours are two steps apart, so its
    replace-one sensitivity is 2, i.e. noise multiplier sigma / 2. dp-accounting's PLD
    accountant of that mechanism must agree with the converted 2 mu, and never exceed the
    converted (2 eps, (1 + e^eps) delta)."""
    mu = 1.0 / sigma
    for eps in (0.1, 0.5, 1.0, 2.0):
        delta = cal.analytic_gaussian_delta(eps, mu)
        if delta < 1e-9:
            continue  # below the PLD accountant's tail resolution
        own = Guarantee(GaussianDP(mu, eps, delta), "add-remove")
        g = convert_neighbours(own, "replace-one", allow=True)
        assert g.mu == pytest.approx(2 * mu)
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
        acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma / 2))
        true_delta = acc.get_delta(g.epsilon)
        assert cal.analytic_gaussian_delta(g.epsilon, g.mu) == pytest.approx(true_delta, rel=1e-2)
        assert true_delta <= g.delta * (1 + 1e-6)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-3), (0.5, 1e-2), (1.0, 0.05), (2.0, 1e-2)])
def test_group_privacy_bound_is_tight_by_brute_force(eps, delta):
    """The worst case over all output distributions on n points: maximise
    H_{e^{2 eps}}(P0 || P2) = sum_S (P0 - e^{2 eps} P2) subject to P0 ~ P1 and P1 ~ P2 being
    (eps, delta)-indistinguishable both ways (a linear program with slack variables for the
    hockey-stick divergences). The optimum is the group-size-2 delta: it must equal
    (1 + e^eps) delta."""
    n = 6
    a, a2 = math.exp(eps), math.exp(2 * eps)
    # variables: p0 (n), p1 (n), p2 (n), then slacks for 4 hockey-stick constraints (4n)
    nv = 3 * n + 4 * n
    c = np.zeros(nv)
    half = n // 2
    c[:half] = -1.0  # maximise sum_{i<half} p0_i - a2 p2_i
    c[2 * n : 2 * n + half] = a2
    a_ub, b_ub = [], []
    pairs = [(0, 1), (1, 0), (1, 2), (2, 1)]
    for k, (x, y) in enumerate(pairs):
        base = 3 * n + k * n
        for i in range(n):  # s_i >= p_x,i - a p_y,i
            row = np.zeros(nv)
            row[x * n + i] = 1.0
            row[y * n + i] = -a
            row[base + i] = -1.0
            a_ub.append(row)
            b_ub.append(0.0)
        row = np.zeros(nv)
        row[base : base + n] = 1.0  # sum s <= delta
        a_ub.append(row)
        b_ub.append(delta)
    a_eq = np.zeros((3, nv))
    for d in range(3):
        a_eq[d, d * n : (d + 1) * n] = 1.0
    res = linprog(c, A_ub=np.array(a_ub), b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(3), bounds=(0, 1))
    assert res.status == 0
    worst = -res.fun
    g = convert_neighbours(Guarantee(ApproxDP(eps, delta), "add-remove"), "replace-one", allow=True)
    assert g.epsilon == 2 * eps
    assert worst <= g.delta + 1e-9  # the conversion is a valid bound
    assert worst == pytest.approx(g.delta, rel=1e-6)  # and the tightest one


# -- schema versions ------------------------------------------------------------------------------
def test_a_version_1_file_migrates_in_place(tmp_path):
    """``tests/data/ledger_v1.sqlite`` was written by the version-1 ledger (mvg_dask before
    schema versions): dataset ``ctg`` (10, 1e-5), ``v1-committed`` (exact, committed) and
    ``v1-pending`` (mvg-thm2, pending, key ``0011..eeff`` upper-cased, seeded)."""
    path = tmp_path / "old.sqlite"
    shutil.copy(DATA / "ledger_v1.sqlite", path)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=r"schema version 1; .* ledger migrate --ledger"):
        open_ledger(path)
    assert path.read_bytes() == before  # refused: nothing changed
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "ledger", "migrate", "--ledger", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "migrated from schema version 1 to 4" in out.stdout
    assert "already at schema version 4" in migrate_ledger(path)
    with open_ledger(path) as book:
        entries = {e.release_id: e for e in book.releases()}
        assert set(entries) == {"v1-committed", "v1-pending"}
        c, p = entries["v1-committed"], entries["v1-pending"]
        assert (c.status, c.noise_key, c.calibration, c.neighbours) == (
            "committed",
            None,
            "exact",
            "replace-one",
        )
        assert c.charge_mu == pytest.approx(cal.analytic_gaussian_mu(1.0, 1e-6))
        assert p.status == "pending" and p.noise_key == "00112233445566778899AABBCCDDEEFF"
        assert p.seeded and p.charge_epsilon == 0.5
        (s,) = book.summary()
        # an exact and a paper release: privacy-loss-distribution composition, below the basic
        # sum 1.5 and within 1 % of the closed form of the mix at the budget's delta
        assert s["composition"] == "pld"
        mu = c.charge_mu
        eps = brentq(
            lambda e: _gaussian_plus_approx_dp_delta(e, mu, 0.5, p.charge_delta) - 1e-5, 0.0, 5.0
        )
        assert eps <= s["spent"]["epsilon"] <= eps * 1.01 < 1.5
        book.abort("v1-pending", "resumed after the upgrade and failed")  # a v2 status
        assert book.lookup("v1-pending").status == "aborted"


def _without_loss_fields(summary):
    """A summary as schema version 2 gave it (version 3 adds each release's serialised loss)."""
    out = json.loads(json.dumps(summary))
    for ds in out:
        for r in ds["releases"]:
            del r["loss"], r["charged"]["loss"]
    return out


def _check_migrated_v2(book):
    """Every entry's loss and every dataset's spending are those of the version-2 ledger
    (``tests/data/make_ledger_v2.py``)."""
    old = json.loads((DATA / "ledger_v2_summary.json").read_text())
    new = book.summary()
    assert _without_loss_fields(new) == old  # entries, spending, composition, what is left
    assert summary_text(new) == summary_text(old)  # `ledger show` unchanged
    by_id = {r["release_id"]: r for ds in old for r in ds["releases"]}
    for e in book.releases():
        r = by_id.pop(e.release_id)
        for own, key in ((e.loss, r), (e.charge, r["charged"])):
            want = ApproxDP(key["epsilon"], key["delta"])
            if key["mu"] is not None:  # the exact releases: Gaussian DP, mu as recorded
                want = GaussianDP(key["mu"], key["epsilon"], key["delta"])
            assert own == want
    assert not by_id
    # the budget decisions: what fits is what fitted
    book.reserve(
        dataset="gauss", release_id="fits", calibration="exact",
        loss=GaussianDP.calibrated(0.5, 1e-7), spec_hash="h", output="/o",
        noise_key="00" * 16, seeded=False,
    )  # fmt: skip
    with pytest.raises(BudgetError, match="would be exceeded"):
        book.reserve(
            dataset="addrem", release_id="too-much", calibration="mgm",
            loss=ApproxDP(1.6, 1e-6), spec_hash="h", output="/o", noise_key="00" * 16,
            seeded=False, neighbours="add-remove",
        )  # fmt: skip


def test_a_version_2_file_migrates_with_every_loss_preserved(tmp_path):
    """``tests/data/ledger_v2.sqlite`` was written by the version-2 ledger (the script beside it
    says how): the migration to version 3 keeps every entry's loss and every decision."""
    path = tmp_path / "v2.sqlite"
    shutil.copy(DATA / "ledger_v2.sqlite", path)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=r"schema version 2; .* ledger migrate --ledger"):
        open_ledger(path)
    assert path.read_bytes() == before  # refused: nothing changed
    assert "migrated from schema version 2 to 4" in migrate_ledger(path)
    with open_ledger(path) as book:
        _check_migrated_v2(book)
        assert book.lookup("m-pending").noise_key == "00" * 32  # a pending key is kept


def test_a_version_2_postgres_ledger_migrates(pg_location):
    """The same ledger, as version 2 made it on PostgreSQL (its tables and rows copied from the
    SQLite file), migrates alike."""
    import sqlite3

    import psycopg

    from mvg_dask.ledger import schema

    src = sqlite3.connect(DATA / "ledger_v2.sqlite")
    v2_columns = (
        "release_id, dataset, status, epsilon, delta, calibration, mu, neighbours, "
        "charge_epsilon, charge_delta, charge_mu, spec_hash, output, noise_key, seeded, "
        "created, committed, aborted, reason, clipped"
    )
    with psycopg.connect(pg_location, autocommit=True) as pg:
        types = ("DOUBLE PRECISION", "BOOLEAN", "BIGINT")
        for sql in [*schema._tables(*types)[:2], schema._releases_v2("releases", *types)]:
            pg.execute(sql)
        pg.execute("INSERT INTO schema_version VALUES (2, 0.0)")
        for row in src.execute("SELECT dataset, epsilon, delta, neighbours, created FROM datasets"):
            pg.execute("INSERT INTO datasets VALUES (%s, %s, %s, %s, %s)", row)
        for row in src.execute(f"SELECT {v2_columns} FROM releases"):
            row = (*row[:14], bool(row[14]), *row[15:])
            pg.execute(
                f"INSERT INTO releases ({v2_columns}) VALUES ({', '.join(['%s'] * 20)})", row
            )
    with pytest.raises(LedgerError, match="schema version 2;"):
        open_ledger(pg_location)
    assert "migrated from schema version 2 to 4" in migrate_ledger(pg_location)
    with open_ledger(pg_location) as book:
        _check_migrated_v2(book)


def test_a_newer_or_broken_schema_is_refused(location, tmp_path):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 1.0, 1e-5)
        book._run(lambda ex, _: ex.execute("INSERT INTO schema_version VALUES (?, ?)", (99, 0.0)))
    with pytest.raises(LedgerError, match="schema version 99, newer than this mvg_dask"):
        open_ledger(location)
    with pytest.raises(LedgerError, match="newer"):
        migrate_ledger(location)


def test_migrate_creates_an_empty_postgres_ledger(pg_server, pg_location):
    empty = pg_server.url(pg_server.new_database())
    with pytest.raises(LedgerError, match="holds no mvg_dask ledger"):
        open_ledger(empty, create=False)
    out = _cli("show", "--ledger", empty, check=False)
    assert out.returncode == 1 and "holds no mvg_dask ledger" in out.stderr
    assert "created at schema version 4" in migrate_ledger(pg_location)
    assert "already at schema version 4" in migrate_ledger(pg_location)


# -- CLI ------------------------------------------------------------------------------------------
def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mvg_dask", "ledger", *args],
        capture_output=True,
        text=True,
        check=check,
    )


def test_ledger_show_and_export_cli(location, tmp_path):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 5.0, 1e-5)
        _reserve(book, "r1")
        book.commit("r1", clipped=2)
        _reserve(book, "r2", eps=0.5)
    out = _cli("show", "--ledger", location, "--json")
    (ds,) = json.loads(out.stdout)
    assert ds["spent"]["epsilon"] == pytest.approx(1.5)
    assert ds["left"]["epsilon"] == pytest.approx(3.5)
    assert [r["status"] for r in ds["releases"]] == ["committed", "pending"]
    assert KEY not in out.stdout
    text = _cli("show", "--ledger", location).stdout
    assert "r1" in text and "pending" in text and "clipped=2" in text and KEY not in text
    target = tmp_path / "export.json"
    _cli("export", "--ledger", location, "--out", str(target))
    exported = json.loads(target.read_text())
    assert KEY not in target.read_text()
    assert [r["release_id"] for r in exported["releases"]] == ["r1", "r2"]
    assert exported["schema_version"] == 4 and exported["datasets"][0]["dataset"] == "d"
    assert all("noise_key" not in r for r in exported["releases"])
    out = _cli("abort", "--ledger", location, "r2", "--reason", "crashed; not resumed")
    assert "stays charged" in out.stdout
    with open_ledger(location) as book:
        entry = book.lookup("r2")
        assert entry.status == "aborted" and entry.noise_key is None
        assert entry.reason == "crashed; not resumed"
    again = _cli("abort", "--ledger", location, "r2", "--reason", "twice", check=False)
    assert again.returncode == 1 and "aborted, not pending" in again.stderr


def test_cli_on_a_missing_ledger_is_one_clean_line(tmp_path):
    out = _cli("show", "--ledger", str(tmp_path / "nope.sqlite"), check=False)
    assert out.returncode != 0 and "does not exist" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "nope.sqlite").exists()


# -- passwords ------------------------------------------------------------------------------------
def test_passwords_never_appear_in_messages(pg_server, pg_location, tmp_path, monkeypatch):
    secret = pg_server.ledger_password
    with_password = pg_location.replace("mvg_ledger@", f"mvg_ledger:{secret}@")
    for url in (with_password, f"{pg_location}?password={secret}"):
        with pytest.raises(LedgerError, match="carries a password") as info:
            open_ledger(url)
        assert secret not in str(info.value) and "***" in str(info.value)
        out = _cli("show", "--ledger", url, check=False)
        assert out.returncode != 0 and "carries a password" in out.stderr
        assert secret not in out.stdout + out.stderr
    # a wrong password: a clean error that names neither the right nor the wrong one
    wrong = tmp_path / "wrong"
    wrong.write_text("not-" + secret + "\n")
    monkeypatch.delenv("PGPASSWORD")
    with pytest.raises(LedgerError, match="password authentication failed") as info:
        open_ledger(pg_location, password_file=wrong)
    assert secret not in str(info.value) and "not-" not in str(info.value)
    # the password from a secret file, and over the unix socket
    right = tmp_path / "right"
    right.write_text(secret + "\n")
    db = pg_location.rsplit("/", 1)[1]
    with open_ledger(pg_server.url(db, host="socket"), password_file=right) as book:
        book.ensure_dataset("d", 1.0, 1e-5)
    # ... and from a libpq passfile named in the URL
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:mvg_ledger:{secret}\n")
    passfile.chmod(0o600)
    with open_ledger(f"{pg_location}?passfile={passfile}") as book:
        assert book.summary()[0]["dataset"] == "d"
    out = _cli("show", "--ledger", pg_location, "--password-file", str(right))
    assert "dataset d" in out.stdout and secret not in out.stdout + out.stderr


def test_redact():
    from mvg_dask.ledger import redact

    assert redact("postgresql://u:pw@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact("postgresql://u@h/db?sslmode=require&password=pw") == (
        "postgresql://u@h/db?sslmode=require&password=***"
    )
    assert redact("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert (
        redact("postgresql://u@/db?host=/run/postgresql")
        == "postgresql://u@/db?host=/run/postgresql"
    )


def test_unknown_scheme_and_both_locations_are_refused(tmp_path):
    from mvg_dask.spec import SpecError, parse_spec
    from tests.pipeline_helpers import spec_dict

    with pytest.raises(LedgerError, match="unknown scheme"):
        open_ledger("mysql://u@h/db")
    base = spec_dict("in.zarr", "out.zarr")
    budget = {"epsilon": 1.0, "delta": 1e-5}
    for ledger in (
        {"dataset": "d", "budget": budget},
        {"path": "l.sqlite", "url": "sqlite:///l.sqlite", "dataset": "d", "budget": budget},
        {"url": "postgresql://u:hunter2@h/db", "dataset": "d", "budget": budget},
        {"url": "sqlite:///l.sqlite", "password_file": "pw", "dataset": "d", "budget": budget},
    ):
        with pytest.raises(SpecError) as info:
            parse_spec({**base, "ledger": ledger})
        assert "hunter2" not in str(info.value)
    spec = parse_spec(
        {
            **base,
            "ledger": {
                "url": "postgresql://u@h/db",
                "dataset": "d",
                "budget": {**budget, "neighbours": "add-remove"},
            },
        }
    )
    assert spec.ledger.budget.neighbours == "add-remove"


def test_sqlite_url_resolves_against_the_spec(tmp_path):
    from mvg_dask.spec import load_spec
    from tests.pipeline_helpers import spec_dict, write_spec

    spec = spec_dict(
        "in.zarr",
        "out.zarr",
        ledger={
            "url": "sqlite:///books/l.sqlite",
            "dataset": "d",
            "budget": {"epsilon": 1.0, "delta": 1e-5},
        },
    )
    loaded = load_spec(write_spec(tmp_path / "s.yaml", spec))
    assert loaded.ledger.location == f"sqlite:///{tmp_path.resolve()}/books/l.sqlite"
    with open_ledger(loaded.ledger.location) as book:
        book.ensure_dataset("d", 1.0, 1e-5)
    assert (tmp_path / "books" / "l.sqlite").is_file()


def test_the_postgres_pipeline_spec_is_valid_and_holds_no_password():
    from mvg_dask.spec import load_spec

    path = Path(__file__).parent.parent / "pipelines" / "ctg-covariance-postgres.yaml"
    spec = load_spec(path)
    assert spec.ledger is not None and spec.ledger.url is not None
    assert spec.ledger.url.startswith("postgresql://") and spec.ledger.password_file is None


def test_a_release_aborted_in_the_ledger_is_never_rerun(tmp_path, client):
    from mvg_dask import api
    from mvg_dask.spec import parse_spec, spec_hash
    from tests.pipeline_helpers import data, make_input, spec_dict

    store = make_input(tmp_path / "in.zarr", data(3, 200, seed=1), chunk=100)
    ledger = {
        "path": str(tmp_path / "l.sqlite"),
        "dataset": "d",
        "budget": {"epsilon": 5.0, "delta": 1e-4},
    }
    spec = spec_dict(store, str(tmp_path / "out.zarr"), release_id="rel", ledger=ledger)
    with open_ledger(ledger["path"]) as book:
        book.ensure_dataset("d", 5.0, 1e-4)
        book.reserve(
            dataset="d",
            release_id="rel",
            epsilon=1.0,
            delta=1e-5,
            calibration="exact",
            mu=cal.analytic_gaussian_mu(1.0, 1e-5),
            spec_hash=spec_hash(parse_spec(spec)),
            output=str(tmp_path / "out.zarr"),
            noise_key=KEY,
            seeded=False,
        )
        book.abort("rel", "NaN in the data")
    with pytest.raises(ReleaseError, match="was aborted after reading data and stays charged"):
        api.release(spec, client=client, progress=False)
    assert not (tmp_path / "out.zarr").exists()
    with open_ledger(ledger["path"]) as book:
        (entry,) = book.releases()
        assert entry.status == "aborted"
