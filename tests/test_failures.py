"""Failures: a spec fuzzer, corrupt chunks, budget refusals, worker loss, keys in logs."""

from __future__ import annotations

import copy
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mvg_dask import api
from mvg_dask.engine.ledger import open_ledger
from mvg_dask.errors import BudgetError, DataError, MvgDaskError, ReleaseError
from mvg_dask.privacy import analytic_gaussian_mu
from mvg_dask.spec import SpecError
from tests.cluster_helpers import loopback_cluster
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

CLEAN_ERRORS = (SpecError, DataError, ReleaseError, BudgetError)


@pytest.fixture(scope="module")
def fuzz_input(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    return make_input(tmp / "in.zarr", data(3, 400, seed=1), chunk=100)


def _leaves(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, (*prefix, k))
        yield (*prefix, k)


def _get_parent(d, path):
    for k in path[:-1]:
        d = d[k]
    return d


VALUES = st.sampled_from(
    [
        -1,
        0,
        1,
        2,
        0.5,
        1e9,
        -1e-9,
        math.nan,
        math.inf,
        "x",
        "",
        None,
        [],
        {},
        [0, 1],
        [1, 0],
        [0.5, 0.6, 0.7],
        True,
        "exact",
        "mvg-thm3",
        "equi-modal",
        "dp-pca",
        "binary",
        "max-pnr",
        "error",
        "add-remove",
        {"lower": 1, "upper": 0},
        {"method": "matrix", "path": "nope.npy"},
    ]
)


@st.composite
def mutations(draw):
    ops = []
    for _ in range(draw(st.integers(1, 3))):
        ops.append(
            (
                draw(st.sampled_from(["set", "delete", "add"])),
                draw(st.integers(0, 10_000)),
                draw(VALUES),
            )
        )
    return ops


def _mutate(spec, ops):
    spec = copy.deepcopy(spec)
    for op, pick, value in ops:
        paths = list(_leaves(spec))
        if not paths:
            break
        path = paths[pick % len(paths)]
        parent = _get_parent(spec, path)
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue
        # a copy: the sampled values are shared objects, and a later op may add keys to one
        # (without the copy a value could end up containing itself)
        if op == "set":
            parent[path[-1]] = copy.deepcopy(value)
        elif op == "delete":
            del parent[path[-1]]
        else:
            parent[f"unknown_{pick % 7}"] = copy.deepcopy(value)
    return spec


@settings(max_examples=int(os.environ.get("MVG_FUZZ_EXAMPLES", "40")), deadline=None)
@given(ops=mutations())
@example(ops=[("set", 3679, "error")])  # on_violation: error on data outside the box: charged
def test_spec_fuzzer_no_traceback_no_partial_output_no_charge(client, fuzz_input, ops):
    """Any mutated spec either releases, or fails with one line, leaving no output behind; it is
    charged only if it failed after reading data (then as aborted)."""
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    old = os.getcwd()
    os.chdir(work)  # relative paths in mutated specs land here
    try:
        base = spec_dict(
            fuzz_input,
            str(work / "out.zarr"),
            ledger={
                "path": str(work / "ledger.sqlite"),
                "dataset": "fuzz",
                "budget": {"epsilon": 5.0, "delta": 1e-4},
            },
        )
        spec = _mutate(base, ops)
        before = sorted(p.relative_to(work) for p in work.rglob("*"))
        try:
            api.release(spec, client=client, progress=False)  # a ledger: no seed
            ok = True
        except CLEAN_ERRORS as caught:
            ok = False
            exc = caught
            assert "\n" not in str(exc).strip()
        if not ok:
            after = {p.relative_to(work) for p in work.rglob("*")}
            new = {p for p in after if not str(p).startswith("ledger.sqlite")} - set(before)
            assert not new, f"partial output after a failed release: {sorted(map(str, new))}"
            ledger = work / "ledger.sqlite"
            if ledger.exists():
                with open_ledger(ledger) as book:
                    entries = book.releases()
                # refunded unless data was read: a failure after the first read (a
                # value outside the domain with on_violation: error) stays charged, as aborted,
                # with its key erased; nothing is ever left pending
                assert all(e.status == "aborted" and e.noise_key is None for e in entries)
                if entries:
                    assert isinstance(exc, DataError) and "records" in str(exc), exc
    finally:
        os.chdir(old)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_corrupt_chunk_is_a_clean_error_and_stays_charged(tmp_path, client, query):
    """The read failed after other chunks were read: the error may depend on the data, so the
    release stays charged, marked aborted; nothing is written (a covariance release
    writes its output's skeleton while the Gram pass runs: it is removed)."""
    store = make_input(tmp_path / "in.zarr", data(3, 500, seed=2), chunk=100)
    chunk = Path(store) / "X" / "c" / "0" / "2"  # feature chunk 0, record chunk 2
    assert chunk.is_file()
    chunk.write_bytes(b"\x00garbage" * 10)
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        query=query,
        ledger={
            "path": str(tmp_path / "l.sqlite"),
            "dataset": "d",
            "budget": {"epsilon": 5.0, "delta": 1e-4},
        },
    )
    with pytest.raises(ReleaseError, match=r"records 200\.\.299 .* cannot be read"):
        api.release(spec, client=client, progress=False)
    assert not (tmp_path / "out.zarr").exists()
    assert not list(tmp_path.glob("out.zarr.staging-*"))
    with open_ledger(tmp_path / "l.sqlite") as book:
        (entry,) = book.releases()
        assert entry.status == "aborted" and entry.noise_key is None
        assert "records 200..299" in (entry.reason or "")
        (summary,) = book.summary()  # the release's mu is spent (Gaussian-DP composition)
        assert summary["spent"]["mu"] == pytest.approx(analytic_gaussian_mu(1.0, 1e-5))


def test_non_orthonormal_direction_matrix(tmp_path, client):
    store = make_input(tmp_path / "in.zarr", data(3, 100, seed=3), chunk=50)
    np.save(tmp_path / "W.npy", np.eye(3) * 1.1)
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        mechanism={"directions": {"method": "matrix", "path": str(tmp_path / "W.npy")}},
    )
    with pytest.raises(DataError, match="not orthonormal"):
        api.release(spec, client=client, seed=0, progress=False)
    assert not (tmp_path / "out.zarr").exists()


def test_budget_exceeded_reads_nothing_writes_nothing(tmp_path, client):
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=4), chunk=100)
    ledger = {
        "path": str(tmp_path / "l.sqlite"),
        "dataset": "d",
        "budget": {"epsilon": 1.0, "delta": 1e-4},
    }
    paper = {"calibration": "mvg-thm2"}  # basic composition: 0.6 + 0.6 > 1
    first = spec_dict(
        store,
        str(tmp_path / "a.zarr"),
        ledger=ledger,
        mechanism=paper,
        privacy={"epsilon": 0.6, "delta": 1e-5},
    )
    api.release(first, client=client, progress=False)
    shutil.move(str(Path(store) / "X" / "c"), tmp_path / "hidden")  # any read would now fail
    second = spec_dict(
        store,
        str(tmp_path / "b.zarr"),
        ledger=ledger,
        mechanism=paper,
        privacy={"epsilon": 0.6, "delta": 1e-5},
    )
    with pytest.raises(BudgetError, match=r"would be exceeded.*Nothing was read or charged"):
        api.release(second, client=client, progress=False)
    assert not (tmp_path / "b.zarr").exists()
    with open_ledger(tmp_path / "l.sqlite") as book:
        assert [r.status for r in book.releases()] == ["committed"]


def test_cli_budget_error_is_one_line(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(3, 100, seed=5), chunk=50)
    spec = spec_dict(
        store,
        str(tmp_path / "o.zarr"),
        ledger={
            "path": str(tmp_path / "l.sqlite"),
            "dataset": "d",
            "budget": {"epsilon": 0.5, "delta": 1e-4},
        },
    )
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(write_spec(tmp_path / "s.yaml", spec))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "privacy.epsilon (1) exceeds the dataset's whole ledger.budget.epsilon" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.cluster
def test_worker_killed_mid_release_completes_identically(tmp_path, client):
    X = data(16, 1_000_000, seed=6, low=0, high=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=20_000)  # 50 chunks
    with loopback_cluster(tmp_path) as address:
        from distributed import Client

        with Client(address, timeout="30s") as remote:
            pids = remote.run(os.getpid)
            spec = spec_dict(store, str(tmp_path / "remote.zarr"))
            box: dict[str, object] = {}

            def run() -> None:
                try:
                    box["result"] = api.release(spec, client=remote, seed=9, progress=False)
                except BaseException as exc:  # reported below
                    box["error"] = exc

            t = threading.Thread(target=run)
            t.start()
            markers = tmp_path / "remote.zarr.staging-"
            done: list[Path] = []
            deadline = time.time() + 60
            while time.time() < deadline:  # wait until some chunks are written
                done = list(tmp_path.glob("remote.zarr.staging-*/.mvg_dask_progress/[0-9]*.json"))
                if len(done) >= 5:
                    break
                time.sleep(0.02)
            victim = next(iter(pids.values()))
            os.kill(victim, signal.SIGKILL)
            assert 5 <= len(done) < 50  # killed mid-release
            t.join(timeout=300)
            assert "error" not in box, box.get("error")
            assert markers.parent.exists()
    remote_values = api.open_release(str(tmp_path / "remote.zarr"))["X"].values
    ref = api.release(
        spec_dict(store, str(tmp_path / "ref.zarr")), client=client, seed=9, progress=False
    )
    assert remote_values.tobytes() == api.open_release(ref.output)["X"].values.tobytes()


def test_unseeded_key_never_reaches_outputs_or_logs(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(3, 2000, seed=7), chunk=100)
    ledger = tmp_path / "l.sqlite"
    spec = write_spec(
        tmp_path / "s.yaml",
        spec_dict(
            store,
            str(tmp_path / "out.zarr"),
            release_id="secret-test",
            ledger={"path": str(ledger), "dataset": "d", "budget": {"epsilon": 5.0, "delta": 1e-4}},
        ),
    )
    env = {**os.environ, "MVG_DASK_CRASH_AT": "chunk:3"}
    first = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(spec)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert first.returncode == -signal.SIGKILL
    with open_ledger(ledger) as book:
        key = book.lookup("secret-test").noise_key
    assert key and len(key) == 32
    from mvg_dask.noise import NoiseKey

    k = NoiseKey.from_hex(key)
    secrets_ = [key, k.derive("release").to_hex(), str(int(key, 16))]
    env.pop("MVG_DASK_CRASH_AT")
    second = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(spec)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert second.returncode == 0, second.stderr
    logs = first.stdout + first.stderr + second.stdout + second.stderr
    assert not any(s in logs for s in secrets_)
    for p in [*(tmp_path / "out.zarr").rglob("*"), *tmp_path.glob("l.sqlite*")]:
        if p.is_file():
            assert not any(s.encode() in p.read_bytes() for s in secrets_), p
    assert isinstance(MvgDaskError("x"), Exception)


def test_missing_chunk_is_refused_not_read_as_fill_values(tmp_path, client):
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=8), chunk=100)
    (Path(store) / "X" / "c" / "0" / "1").unlink()
    with pytest.raises(DataError, match="1 of 3 chunks"):
        api.release(
            spec_dict(store, str(tmp_path / "o.zarr")), client=client, seed=0, progress=False
        )
    assert not (tmp_path / "o.zarr").exists()
