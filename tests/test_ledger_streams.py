"""Streams in the ledger (continual releases charged once for their horizon) on every backend:
the one charge and its composition with other releases, periods in order, resumes and retries,
races between processes, crashes inside a transaction, the horizon, the schema upgrade 3 -> 4,
and the curator-side key that never reaches a log or ``ledger show``."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mvg_dask.errors import BudgetError, LedgerError, ReleaseError
from mvg_dask.ledger import (
    PeriodEntry,
    StreamEntry,
    export_ledger,
    migrate_ledger,
    open_ledger,
    summary_text,
)
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP

SKEY = "5eC7e7" * 10 + "abcd"  # a stream key (hex); mixed case so that a copy is recognisable
OTHER_KEY = "0f" * 32
DATA = Path(__file__).parent / "data"
FACT = {"factorization": "square-root", "horizon": 10, "bits": 24}


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def location(request, tmp_path, monkeypatch):
    """A fresh, empty ledger on each backend (the password from PGPASSWORD)."""
    if request.param == "memory":
        from mvg_dask.ledger.memory import forget

        name = f"streams-{request.node.originalname}"
        yield f"memory://{name}"
        forget(name)
        return
    if request.param == "sqlite":
        yield str(tmp_path / "ledger.sqlite")
        return
    server = request.getfixturevalue("pg_server")
    monkeypatch.setenv("PGPASSWORD", server.ledger_password)
    yield server.url(server.new_database())


@pytest.fixture(params=["sqlite", "postgresql"])
def shared(request, tmp_path, monkeypatch):
    """A ledger that several processes share: a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    server = request.getfixturevalue("pg_server")
    monkeypatch.setenv("PGPASSWORD", server.ledger_password)
    return server.url(server.new_database())


@pytest.fixture
def pg_location(pg_server, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", pg_server.ledger_password)
    return pg_server.url(pg_server.new_database())


def _open(book, sid="s", *, loss=None, key=SKEY, spec_hash="h", horizon=10, **kw):
    return book.open_stream(
        dataset=kw.pop("dataset", "d"),
        stream_id=sid,
        release_id=kw.pop("release_id", f"{sid}.charge"),
        horizon=horizon,
        factorization={**FACT, "horizon": horizon},
        spec_hash=spec_hash,
        output=f"out/{sid}.zarr",
        stream_key=key,
        calibration="exact",
        loss=GaussianDP.calibrated(1.0, 1e-6) if loss is None else loss,
        **kw,
    )


def _period(book, sid, t, watermark):
    book.begin_period(sid, t, f"day-{t}")
    book.commit_period(sid, t, watermark=watermark, state={"inc": bytes([t]) * 3}, clipped=t)


def _snapshot(book):
    return (
        book.summary(),
        [(r.release_id, r.status) for r in book.releases()],
        book.streams(),
        {s.stream_id: book.stream_periods(s.stream_id) for s in book.streams()},
    )


# -- the protocol -------------------------------------------------------------------------------
def test_a_stream_is_charged_once_and_runs_to_its_horizon(location):
    loss = GaussianDP.calibrated(1.0, 1e-6)
    with open_ledger(location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        entry, created = _open(book, loss=loss)
        assert created and isinstance(entry, StreamEntry)
        assert (entry.periods, entry.watermark, entry.status, entry.horizon) == (0, 0, "open", 10)
        assert entry.factorization == FACT and book.stream("s") == entry
        assert book.stream_key("s") == SKEY
        (charge,) = book.releases()
        assert (charge.release_id, charge.status, charge.noise_key) == ("s.charge", "pending", None)
        assert charge.loss == loss and charge.charge == loss
        for t in range(1, 11):
            p = book.begin_period("s", t, f"day-{t}")
            assert isinstance(p, PeriodEntry) and p.status == "pending"
            assert p.watermark_before == (300 if t == 5 else 100 * (t - 1))  # the last commit's
            if t == 4:  # a period with no new records is still a period
                book.commit_period("s", t, watermark=300, state={}, clipped=0)
                continue
            book.commit_period("s", t, watermark=100 * t, state={"inc": bytes([t]) * 3, "n": b"x"})
            if t == 1:  # the charge is committed with the first period
                assert book.lookup("s.charge").status == "committed"
            if t < 10:
                assert book.stream_key("s") == SKEY
        # one charge, whatever the number of periods: the spending of one release of this loss
        (ds,) = book.summary()
        assert len(book.releases()) == 1
        assert ds["composition"] == "gaussian-dp" and ds["spent"]["mu"] == pytest.approx(loss.mu)
        assert ds["spent"]["epsilon"] == pytest.approx(
            _eps_at(loss.mu, 1e-5), rel=1e-6
        )  # independent: the analytic Gaussian's epsilon at the budget's delta
        s = book.stream("s")
        assert (s.periods, s.watermark, s.status) == (10, 1000, "complete")
        with pytest.raises(LedgerError, match="complete: its key is erased"):
            book.stream_key("s")
        periods = book.stream_periods("s")
        assert [p.period for p in periods] == list(range(1, 11))
        assert all(p.status == "committed" for p in periods)
        assert [(p.watermark_before, p.watermark_after) for p in periods[2:5]] == [
            (200, 300),
            (300, 300),
            (300, 500),
        ]
        state = book.stream_state("s")
        assert sorted(state) == [1, 2, 3, 5, 6, 7, 8, 9, 10]  # period 4 wrote no part
        assert state[7] == {"inc": b"\x07" * 3, "n": b"x"}
        assert sorted(book.stream_state("s", through=3)) == [1, 2, 3]
        # past the horizon: refused with the remedy, nothing charged or changed
        before = _snapshot(book)
        with pytest.raises(BudgetError, match=r"all 10 periods .* start a new stream .* charged"):
            book.begin_period("s", 11, "day-11")
        assert _snapshot(book) == before
        assert book.begin_period("s", 10, "day-10").status == "committed"  # a late pod: done


def _eps_at(mu: float, delta: float) -> float:
    """The epsilon of mu-GDP at ``delta``, by bisection on the analytic Gaussian's delta."""
    lo, hi = 0.0, 50.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cal.analytic_gaussian_delta(mid, mu) <= delta else (mid, hi)
    return hi


def test_open_stream_finds_the_stream_and_refuses_another_spec(location):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        first, created = _open(book)
        # a second pod (its own fresh key): the same stream, not created, no second charge
        again, created2 = _open(book, key=OTHER_KEY)
        assert created and not created2 and again == first
        assert book.stream_key("s") == SKEY and len(book.releases()) == 1
        before = _snapshot(book)
        with pytest.raises(ReleaseError, match=r"another spec.*new stream"):
            _open(book, spec_hash="other")
        book.reserve(
            dataset="d", release_id="taken", calibration="exact", loss=ApproxDP(0.1, 1e-9),
            spec_hash="h", output="o", noise_key=OTHER_KEY, seeded=False,
        )  # fmt: skip
        with pytest.raises(ReleaseError, match="'taken' is already in the ledger"):
            _open(book, "s2", release_id="taken")
        assert book.stream("s2") is None
        with pytest.raises(ReleaseError, match="not in the ledger"):
            book.begin_period("nope", 1, "x")
        with pytest.raises(LedgerError, match="not in the ledger"):
            book.stream_key("nope")
        for bad in (dict(horizon=0), dict(horizon=2.5), dict(key="not hex")):
            with pytest.raises(ValueError):
                _open(book, "bad", **bad)
        book.cancel("taken")
        assert [r.release_id for r in book.releases()] == [r for r, _ in before[1]]
        assert book.stream("bad") is None


def test_periods_run_in_order_and_a_retry_finds_its_period(location):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        _open(book, horizon=3)
        with pytest.raises(ReleaseError, match="periods run in order; 0 committed"):
            book.begin_period("s", 2, "b")
        p1 = book.begin_period("s", 1, "a")
        assert book.begin_period("s", 1, "a") == p1  # a crashed run or a second pod resumes
        with pytest.raises(ReleaseError, match="with label 'a', not 'b'"):
            book.begin_period("s", 1, "b")
        with pytest.raises(ReleaseError, match="period 2 was not begun"):
            book.commit_period("s", 2, watermark=5, state={})
        for bad in (dict(period=0, label="a"), dict(period=1, label="")):
            with pytest.raises(ValueError):
                book.begin_period("s", **bad)
        with pytest.raises(ValueError):
            book.commit_period("s", 1, watermark=-1, state={})
        book.commit_period("s", 1, watermark=50, state={"inc": b"1"})
        # a second committer, or a retry whose answer was lost: no second row, no error
        book.commit_period("s", 1, watermark=50, state={"inc": b"1"})
        assert book.stream_state("s") == {1: {"inc": b"1"}}
        assert book.stream("s").periods == 1
        with pytest.raises(ReleaseError, match="committed through another record count"):
            book.commit_period("s", 1, watermark=51, state={"inc": b"1"})
        book.begin_period("s", 2, "b")
        with pytest.raises(ReleaseError, match="cannot go back"):
            book.commit_period("s", 2, watermark=49, state={})
        assert book.stream("s").watermark == 50
        assert book.stream_periods("s")[1].status == "pending"


def test_cancel_refunds_a_stream_only_before_its_first_commit(location):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        _open(book)
        book.begin_period("s", 1, "a")
        book.cancel("s.charge")  # a release's cancel leaves a stream's charge alone
        assert book.lookup("s.charge").status == "pending"
        book.cancel_stream("s")  # the first period failed before any read: refunded
        assert book.streams() == [] and book.releases() == []
        assert book.stream_periods("s") == []
        _open(book)
        _period(book, "s", 1, 10)
        with pytest.raises(ReleaseError, match="stays charged"):
            book.cancel_stream("s")
        assert len(book.releases()) == 1 and book.stream("s").periods == 1


# -- budget ---------------------------------------------------------------------------------------
def _one_shots(book):
    book.reserve(
        dataset="d", release_id="paper", calibration="mvg-thm2", loss=ApproxDP(0.3, 1e-7),
        spec_hash="h", output="o", noise_key=OTHER_KEY, seeded=False,
    )  # fmt: skip
    book.reserve(
        dataset="d", release_id="exact", calibration="exact",
        loss=GaussianDP.calibrated(0.5, 1e-7), spec_hash="h", output="o",
        noise_key=OTHER_KEY, seeded=False,
    )  # fmt: skip


def test_a_stream_charge_composes_with_releases_like_a_release(location):
    """The stream's charge against the same loss reserved as a one-shot release: the same
    spending under each accountant (Gaussian DP, then PLD with a paper release); and the
    Gaussian-DP total checked independently: mu = sqrt(mu_stream^2 + mu_release^2)."""
    stream_loss = GaussianDP.calibrated(1.0, 1e-6)
    with open_ledger(location) as book, open_ledger("memory://streams-twin") as twin:
        for b in (book, twin):
            b.ensure_dataset("d", 4.0, 1e-5)
        _open(book, loss=stream_loss)
        _period(book, "s", 1, 10)
        twin.reserve(
            dataset="d", release_id="s.charge", calibration="exact", loss=stream_loss,
            spec_hash="h", output="o", noise_key=OTHER_KEY, seeded=False,
        )  # fmt: skip
        book.reserve(
            dataset="d", release_id="exact", calibration="exact",
            loss=GaussianDP.calibrated(0.5, 1e-7), spec_hash="h", output="o",
            noise_key=OTHER_KEY, seeded=False,
        )  # fmt: skip
        (ds,) = book.summary()
        mu = math.hypot(stream_loss.mu, GaussianDP.calibrated(0.5, 1e-7).mu)
        assert ds["composition"] == "gaussian-dp" and ds["spent"]["mu"] == pytest.approx(mu)
        assert ds["spent"]["epsilon"] == pytest.approx(_eps_at(mu, 1e-5), rel=1e-6)
        book.reserve(
            dataset="d", release_id="paper", calibration="mvg-thm2", loss=ApproxDP(0.3, 1e-7),
            spec_hash="h", output="o", noise_key=OTHER_KEY, seeded=False,
        )  # fmt: skip
        _one_shots(twin)
        (ds,), (tw,) = book.summary(), twin.summary()
        assert ds["composition"] == tw["composition"] == "pld"
        assert ds["spent"] == tw["spent"] and ds["left"] == tw["left"]
    from mvg_dask.ledger.memory import forget

    forget("streams-twin")


def test_a_stream_that_does_not_fit_is_refused_with_nothing_changed(location):
    with open_ledger(location) as book:
        book.ensure_dataset("d", 2.0, 1e-5)
        _one_shots(book)
        before = _snapshot(book)
        with pytest.raises(BudgetError, match=r"would be exceeded.*Nothing was read or charged"):
            _open(book, loss=GaussianDP.calibrated(3.0, 1e-6))
        assert _snapshot(book) == before and book.stream("s") is None
        # the other relation: refused unless converted (group privacy: 2 mu)
        with pytest.raises(BudgetError, match="neighbours"):
            _open(book, neighbours="add-remove")
        assert _snapshot(book) == before
        loss = GaussianDP.calibrated(0.3, 1e-7)
        _open(book, loss=loss, neighbours="add-remove", convert_neighbours=True)
        charge = book.lookup("s.charge")
        assert charge.neighbours == "add-remove" and charge.charge_mu == pytest.approx(2 * loss.mu)


# -- races, crashes, lost answers -----------------------------------------------------------------
def _pod(location: str, worker: int, start, results) -> None:
    """One pod of the CronJob: open the stream (its own fresh key), then run periods 1 and 2."""
    book = open_ledger(location, timeout=60)
    start.wait(timeout=120)
    key = f"{worker:02x}" * 32
    out = []
    for t in (1, 2):
        _, created = _open(book, key=key, horizon=3)
        used = book.stream_key("s")
        p = book.begin_period("s", t, f"day-{t}")
        book.commit_period("s", t, watermark=p.watermark_before + 7, state={"inc": bytes([t])})
        out.append((created, used))
        start.wait(timeout=120)  # every pod finished period t: race on the next
    book.close()
    results.put(out)


def test_concurrent_pods_make_one_stream_one_charge_and_one_period_each(shared):
    with open_ledger(shared) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start = ctx.Barrier(3)
    procs = [ctx.Process(target=_pod, args=(shared, w, start, results)) for w in range(3)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    created = [c for o in outcomes for c, _ in o]
    keys = {k for o in outcomes for _, k in o}
    assert sum(created) == 1 and len(keys) == 1  # one creator; every pod used its key
    with open_ledger(shared) as book:
        assert [r.release_id for r in book.releases()] == ["s.charge"]
        (s,) = book.streams()
        assert (s.periods, s.watermark) == (2, 14)  # each period once: 7 records each
        assert [(p.period, p.status) for p in book.stream_periods("s")] == [
            (1, "committed"),
            (2, "committed"),
        ]
        assert book.stream_state("s") == {1: {"inc": b"\x01"}, 2: {"inc": b"\x02"}}


_CRASHER = textwrap.dedent(
    """
    import sys
    from mvg_dask.ledger import open_ledger
    from mvg_dask.privacy.accounting import GaussianDP
    location, step, key = sys.argv[1], sys.argv[2], sys.argv[3]
    book = open_ledger(location)
    if step == "open":
        book.open_stream(dataset="d", stream_id="s", release_id="s.charge", horizon=2,
                         factorization={"factorization": "tree", "horizon": 2},
                         spec_hash="h", output="o", stream_key=key, calibration="exact",
                         loss=GaussianDP.calibrated(1.0, 1e-6))
    elif step == "begin":
        book.begin_period("s", 1, "a")
    else:
        book.commit_period("s", 1, watermark=9, state={"inc": b"state"})
    """
)


def _crash(location: str, step: str, point: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHER, location, step, SKEY],
        capture_output=True,
        text=True,
        env={**os.environ, "MVG_DASK_CRASH_AT": point},
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_sigkill_inside_a_stream_transaction_changes_nothing(shared):
    with open_ledger(shared) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
    _crash(shared, "open", "ledger-open-stream")  # killed before its transaction committed
    with open_ledger(shared, timeout=20) as book:
        assert book.streams() == [] and book.releases() == []
        _open(book, horizon=2)
    _crash(shared, "begin", "ledger-begin-period")
    with open_ledger(shared, timeout=20) as book:
        assert book.stream_periods("s") == []
        book.begin_period("s", 1, "a")
    # killed inside the commit: state, watermark, status and charge all unchanged (atomic)
    _crash(shared, "commit", "ledger-commit-period")
    with open_ledger(shared, timeout=20) as book:
        (p,) = book.stream_periods("s")
        assert p.status == "pending" and p.watermark_after is None
        assert book.stream_state("s") == {}
        s = book.stream("s")
        assert (s.periods, s.watermark, s.status) == (0, 0, "open")
        assert book.lookup("s.charge").status == "pending"
        assert book.stream_key("s") == SKEY  # the resume re-derives the same noise
        book.commit_period("s", 1, watermark=9, state={"inc": b"state"})
        assert book.stream("s").periods == 1 and book.stream_state("s") == {1: {"inc": b"state"}}


def test_stream_steps_whose_answer_is_lost_take_effect_exactly_once(pg_server, pg_location):
    """The server commits, the connection breaks before the client hears it: each retried
    stream step recognises its own effect."""
    from tests.pg_helpers import CommitDroppingProxy

    proxy = CommitDroppingProxy(pg_server.port)
    try:
        with open_ledger(proxy.url(pg_location.rsplit("/", 1)[1])) as book:
            book.ensure_dataset("d", 3.0, 1e-5)
            proxy.armed.set()
            _, created = _open(book, horizon=2)
            assert created  # our own stream, recognised by its key
            proxy.armed.set()
            book.begin_period("s", 1, "a")
            proxy.armed.set()
            book.commit_period("s", 1, watermark=5, state={"inc": b"1"})
            proxy.armed.set()
            _period(book, "s", 2, 8)  # the horizon: complete, key erased
            assert proxy.dropped == 4
            assert len(book.releases()) == 1 and book.lookup("s.charge").status == "committed"
            s = book.stream("s")
            assert (s.periods, s.watermark, s.status) == (2, 8, "complete")
            assert sorted(book.stream_state("s")) == [1, 2]
    finally:
        proxy.close()


# -- the key stays curator-side ------------------------------------------------------------------
def _cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "ledger", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout + out.stderr


def test_the_stream_key_never_reaches_a_log_or_ledger_show(shared, caplog):
    caplog.set_level(logging.DEBUG)
    with open_ledger(shared) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        _open(book, horizon=3)
        _period(book, "s", 1, 40)
        book.begin_period("s", 2, "2026-01-02")  # pending: the key is still held
        texts = [
            _cli("show", "--ledger", shared),
            _cli("show", "--ledger", shared, "--json"),
            _cli("export", "--ledger", shared),
            json.dumps(export_ledger(book)),
            summary_text(book.summary()),
            repr(book.streams()) + repr(book.stream_periods("s")),
        ]
    show = texts[0]
    assert "stream s: square-root, 1/3 periods, open; charged once as s.charge" in show
    assert "period    1 day-1" in show and "records 0..40; clipped=1" in show
    assert "period    2 2026-01-02" in show and "pending" in show
    assert "the one charge of stream s" in show
    (ds,) = json.loads(texts[1])
    (s,) = ds["streams"]
    assert [p["period"] for p in s["period_entries"]] == [1, 2] and s["watermark"] == 40
    assert json.loads(texts[2])["streams"][0]["stream_id"] == "s"
    for text in [*texts, caplog.text]:
        assert SKEY not in text and SKEY.lower() not in text
    if shared.startswith("postgresql"):
        return
    with open_ledger(shared) as book:  # complete: the key erased, no copy left in any file
        book.commit_period("s", 2, watermark=41, state={})
        _period(book, "s", 3, 42)
    for p in Path(shared).parent.iterdir():
        assert SKEY.encode() not in p.read_bytes(), p


# -- schema version 4 ----------------------------------------------------------------------------
def test_a_version_3_file_migrates_to_4_with_every_entry_kept(tmp_path):
    """``tests/data/ledger_v3.sqlite`` was written by the version-3 ledger (the script beside
    it says how): refused until migrated, then the same entries and spending, and streams."""
    path = tmp_path / "v3.sqlite"
    shutil.copy(DATA / "ledger_v3.sqlite", path)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match=r"schema version 3; .* ledger migrate --ledger"):
        open_ledger(path)
    assert path.read_bytes() == before  # refused: nothing changed
    out = _cli("migrate", "--ledger", str(path))
    assert "migrated from schema version 3 to 4" in out
    assert "already at schema version 4" in migrate_ledger(path)
    old = json.loads((DATA / "ledger_v3_summary.json").read_text())
    with open_ledger(path) as book:
        assert book.summary() == old  # every entry, the spending, what is left
        assert summary_text(book.summary()) == summary_text(old)  # `ledger show` unchanged
        assert book.lookup("g-pending").noise_key == "ab" * 32  # a pending key is kept
        _open(book, dataset="nightly", loss=GaussianDP.calibrated(0.5, 1e-7))
        _period(book, "s", 1, 3)
        (ds,) = [d for d in book.summary() if d["dataset"] == "nightly"]
        assert ds["streams"][0]["periods"] == 1
        with pytest.raises(BudgetError, match="would be exceeded"):
            _open(book, "s2", dataset="nightly", loss=GaussianDP.calibrated(3.0, 1e-6))


def test_a_version_3_postgres_ledger_migrates_and_the_stream_tables_are_private(
    pg_server, pg_location, monkeypatch
):
    """A version-3 ledger on PostgreSQL (version 4 less its stream tables: the upgrade only
    adds them) migrates; only the ledger's role reads the new tables."""
    import psycopg

    with open_ledger(pg_location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        _one_shots(book)
        old = book.summary()
    with psycopg.connect(pg_location, autocommit=True) as pg:
        pg.execute("DROP TABLE stream_state, stream_periods, streams")
        pg.execute("UPDATE schema_version SET version = 3")  # as a ledger created at 3
    with pytest.raises(LedgerError, match="schema version 3;"):
        open_ledger(pg_location)
    assert "migrated from schema version 3 to 4" in migrate_ledger(pg_location)
    with open_ledger(pg_location) as book:
        assert book.summary() == old
        _open(book, loss=GaussianDP.calibrated(0.5, 1e-7))
        _period(book, "s", 1, 3)
    db = pg_location.rsplit("/", 1)[1]
    monkeypatch.setenv("PGPASSWORD", pg_server.analyst_password)
    with psycopg.connect(pg_server.url(db, user="analyst")) as conn:
        for table in ("streams", "stream_periods", "stream_state"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {table}")
            conn.rollback()


def test_a_claim_keeps_the_records_it_reads_through(location):
    """``begin_period(target=...)`` keeps the claimed record count: a retry gets it back (it
    reads the same records), a commit through another count is refused, and a target below
    the watermark (a store that shrank) is refused with nothing changed."""
    with open_ledger(location) as book:
        book.ensure_dataset("d", 3.0, 1e-5)
        _open(book, horizon=3)
        assert book.begin_period("s", 1, "a", target=40).watermark_after == 40
        again = book.begin_period("s", 1, "a", target=55)  # the next night's records arrived
        assert (again.status, again.watermark_before, again.watermark_after) == (
            "pending",
            0,
            40,
        )
        with pytest.raises(ReleaseError, match="claimed through 40"):
            book.commit_period("s", 1, watermark=55, state={})
        book.commit_period("s", 1, watermark=40, state={})
        assert book.stream("s").watermark == 40
        with pytest.raises(ReleaseError, match="only grows"):
            book.begin_period("s", 2, "b", target=39)
        assert [p.period for p in book.stream_periods("s")] == [1]
