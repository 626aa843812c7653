"""Crash safety: SIGKILL at many points of a release, then a re-run with the same release id.

The re-run resumes with the key stored in the ledger's pending entry and must produce output
byte-identical to an uninterrupted run with the same key, charged exactly once; no file of the
output and no log line may contain the key. The releases are unseeded (a seed is refused with a
ledger): the harness pins the fresh key of every run (``pinned_key_cli``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.engine.ledger import open_ledger
from mvg_dask.errors import IncompleteReleaseError
from mvg_dask.noise import NoiseKey
from tests.cluster_helpers import loopback_cluster
from tests.pipeline_helpers import (
    PINNED_KEY,
    add_group_variable,
    data,
    make_input,
    pinned_key_cli,
    spec_dict,
    write_spec,
)

KILL_POINTS = [
    "reserved",
    "skeleton",
    # after k of the 8 tasks (5 chunks each: ``task_ranges``) of the 40-chunk input finished
    "chunk:1",
    "chunk:3",
    "chunk:5",
    "chunk:7",
    "before-commit",
    "before-ledger-commit",
]


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    with loopback_cluster(tmp_path_factory.mktemp("cluster")) as address:
        yield address


def _key_strings() -> list[str]:
    key = NoiseKey.from_hex(PINNED_KEY)
    return [k.to_hex() for k in (key, key.derive("release"), key.derive("dp-pca"))]


def _run(spec_path: Path, address: str, crash_at: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "MVG_DASK_CRASH_AT"}
    if crash_at:
        env["MVG_DASK_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [*pinned_key_cli(), "release", str(spec_path), "--scheduler", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish_after_a_kill(spec_path: Path, address: str, ledger: str, crash: str | None) -> None:
    """Run the release of ``spec_path`` on the scheduler at ``address`` to its end, after a
    first run killed (SIGKILL) at the crash point ``crash`` when given; the ledger then holds
    the release once, committed, without its noise key."""
    if crash:
        proc = _run(spec_path, address, crash_at=crash)
        proc.communicate(timeout=300)
        assert proc.returncode == -signal.SIGKILL
    proc = _run(spec_path, address)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    with open_ledger(ledger) as book:
        (entry,) = book.releases()
        assert entry.status == "committed" and entry.noise_key is None


def _setup(tmp: Path, store: str, name: str) -> tuple[Path, Path, Path]:
    out = tmp / f"{name}.zarr"
    ledger = tmp / f"{name}.sqlite"
    spec = spec_dict(
        store,
        str(out),
        release_id=f"rel-{name}",
        ledger={
            "path": str(ledger),
            "dataset": "crashy",
            "budget": {"epsilon": 10.0, "delta": 1e-4},
        },
    )
    return write_spec(tmp / f"{name}.yaml", spec), out, ledger


@pytest.mark.slow
def test_sigkill_at_many_points_then_resume(tmp_path, loopback):
    X = data(4, 20_000, seed=3)
    store = make_input(tmp_path / "in.zarr", X, chunk=500)  # 40 chunks, 8 tasks
    ref_spec, ref_out, _ = _setup(tmp_path, store, "reference")
    proc = _run(ref_spec, loopback)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    reference = api.open_release(str(ref_out))["X"].values.tobytes()
    secrets_ = _key_strings()
    rng = random.Random(7)
    from mvg_dask.engine.metadata import read_input_metadata
    from mvg_dask.spec import InputSpec

    assert len(read_input_metadata(InputSpec(store=store)).task_ranges()) == 8
    points = KILL_POINTS + [f"random:{rng.uniform(1.5, 4.0):.2f}" for _ in range(3)]
    assert len(points) >= 10
    for i, point in enumerate(points):
        spec_path, out, ledger = _setup(tmp_path, store, f"k{i}")
        if point.startswith("random:"):
            proc = _run(spec_path, loopback)
            time.sleep(float(point.split(":")[1]))
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
        else:
            proc = _run(spec_path, loopback, crash_at=point)
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == -signal.SIGKILL, (point, err)
            if point != "before-ledger-commit":
                with pytest.raises(IncompleteReleaseError):
                    api.open_release(str(out))
        with open_ledger(ledger) as book:  # a crashed release stays charged (or was committed)
            entries = book.releases()
            # a random kill may land before the reservation (then nothing was charged)
            assert len(entries) == 1 or (point.startswith("random:") and not entries)
            assert all(e.status in ("pending", "committed") for e in entries)
        proc = _run(spec_path, loopback)
        out_text, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (point, err)
        ds = api.open_release(str(out))
        assert ds["X"].values.tobytes() == reference, point
        with open_ledger(ledger) as book:
            (entry,) = book.releases()  # charged once
            assert entry.status == "committed" and entry.noise_key is None
        for path in [*out.rglob("*"), ledger]:
            if path.is_file():
                blob = path.read_bytes()
                assert not any(s.encode() in blob for s in secrets_), (point, path)
        assert not any(s in out_text + err for s in secrets_)
        assert not list(tmp_path.glob(f"k{i}.zarr.staging-*"))
        assert not list(out.rglob("*.partial")) and not (out / ".mvg_dask_progress").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend,point",
    [
        ("sqlite", "reserved"),
        ("sqlite", "before-commit"),
        ("sqlite", "before-ledger-commit"),
        ("postgresql", "reserved"),
        ("postgresql", "before-ledger-commit"),
    ],
)
def test_covariance_dp_pca_release_resumes_identically(
    tmp_path, loopback, backend, point, request, monkeypatch
):
    X = data(5, 6000, seed=4)
    store = make_input(tmp_path / "in.zarr", X, chunk=500)
    mech = {
        "algorithm": "equi-modal",
        "directions": {"method": "dp-pca", "k": 2},
        "allocation": {"strategy": "binary", "share": 0.8},
    }
    outs = []
    for name, crash in (("ref", None), ("crashed", point)):
        out, ledger = tmp_path / f"{name}.zarr", str(tmp_path / f"{name}.sqlite")
        where = {"path": ledger}
        if backend == "postgresql":  # a postgresql:// ledger, the password from the environment
            server = request.getfixturevalue("pg_server")
            monkeypatch.setenv("PGPASSWORD", server.ledger_password)
            ledger = server.url(server.new_database())
            where = {"url": ledger}
        spec_path = write_spec(
            tmp_path / f"{name}.yaml",
            spec_dict(
                store,
                str(out),
                query="covariance",
                release_id=f"cov-{name}",
                mechanism=mech,
                ledger={
                    **where,
                    "dataset": "d",
                    "budget": {"epsilon": 5.0, "delta": 1e-4},
                },
            ),
        )
        finish_after_a_kill(spec_path, loopback, ledger, crash)
        outs.append(api.open_release(str(out))["covariance"].values.tobytes())
    assert outs[0] == outs[1]


@pytest.mark.slow
def test_killed_after_the_skeleton_a_wide_identity_resumes_its_noise_matrices(tmp_path, loopback):
    """300 features: the noise matrices are written block by block after the skeleton, while the
    tasks run. Killed right after the skeleton (before any of their blocks), the resumed run
    writes them: every published file equals that of an uninterrupted run."""
    store = make_input(tmp_path / "in.zarr", data(300, 2000, seed=6), chunk=250)
    ref_spec, ref_out, _ = _setup(tmp_path, store, "reference")
    proc = _run(ref_spec, loopback)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    spec_path, out, _ = _setup(tmp_path, store, "killed")
    proc = _run(spec_path, loopback, crash_at="skeleton")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err
    assert not list((out.parent / f"{out.name}.staging-rel-killed" / "row_cov").rglob("c/*/*"))
    proc = _run(spec_path, loopback)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err

    def files(root: Path) -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix() != "zarr.json"  # ids differ
        }

    got, want = files(out), files(ref_out)
    assert {"row_cov/c/0/0", "row_cov/c/1/1", "directions/c/1/1"} <= set(got)
    assert got == want


def _moment_bytes_after_a_kill(
    tmp_path: Path,
    loopback: str,
    store: str,
    extra: dict,
    point: str,
    tag: str,
    names: tuple[str, ...] = ("moment", "mean", "covariance"),
) -> list[bytes]:
    """A moment release (``extra``: its query and grouping) run uninterrupted, and killed at
    ``point`` then re-run: each run's ``moment``, ``mean`` and ``covariance`` bytes, after
    checking that it exits cleanly and is charged once."""
    outs = []
    for name, crash in (("ref", None), ("crashed", point)):
        out, ledger = tmp_path / f"{name}.zarr", str(tmp_path / f"{name}.sqlite")
        spec = spec_dict(
            store,
            str(out),
            query="covariance",
            release_id=f"{tag}-{name}",
            mechanism={"algorithm": "symmetric"},
            ledger={"path": ledger, "dataset": "d", "budget": {"epsilon": 5.0, "delta": 1e-4}},
        )
        spec_path = write_spec(tmp_path / f"{name}.yaml", spec | extra)
        finish_after_a_kill(spec_path, loopback, ledger, crash)
        ds = api.open_release(str(out))
        outs.append(b"".join(ds[v].values.tobytes() for v in names))
    return outs


@pytest.mark.slow
@pytest.mark.parametrize(
    "query,point",
    [
        ("centered-covariance", "skeleton"),
        ("centered-covariance", "before-commit"),
        ({"regression": {"target": "f1"}}, "before-ledger-commit"),
    ],
)
def test_moment_release_resumes_identically(tmp_path, loopback, query, point):
    """A centered-covariance or regression release killed at ``point`` resumes with its stored
    key: the same ``moment``, ``mean`` and ``covariance`` bytes as an uninterrupted run,
    charged once."""
    store = make_input(tmp_path / "in.zarr", data(4, 6000, seed=6), chunk=500)
    outs = _moment_bytes_after_a_kill(tmp_path, loopback, store, {"query": query}, point, "mom")
    assert outs[0] == outs[1]


@pytest.mark.slow
def test_grouped_release_resumes_identically(tmp_path, loopback):
    """A grouped centered-covariance release (``group_by``, three declared groups and an
    undeclared label) killed after writing its skeleton resumes with its stored key: the same
    ``moment``, ``mean`` and ``covariance`` bytes (every group's) as an uninterrupted run,
    charged once."""
    store = make_input(tmp_path / "in.zarr", data(3, 5000, seed=6), chunk=500)
    add_group_variable(store, np.random.default_rng(1).integers(0, 4, 5000))
    extra = {
        "query": "centered-covariance",
        "group_by": {"variable": "site", "groups": [0, 1, 2]},
    }
    outs = _moment_bytes_after_a_kill(tmp_path, loopback, store, extra, "skeleton", "grp")
    assert len(outs[0]) == 8 * (3 * 4 * 4 + 3 * 3 + 3 * 3 * 3)  # every group's three variables
    assert outs[0] == outs[1]


@pytest.mark.slow
@pytest.mark.parametrize("point", ["mean"])
def test_mean_first_release_resumes_identically(tmp_path, loopback, point):
    """A mean-first centered covariance killed between its steps (``mean``: the mean released,
    nothing written; a kill after step 2's skeleton, ``skeleton``, passes too, and resumes as a
    moment release does) resumes with its stored key: the same ``mean``, ``centre`` and
    ``covariance`` bytes as an uninterrupted run, charged once."""
    store = make_input(tmp_path / "in.zarr", data(4, 6000, seed=6), chunk=500)
    extra = {"query": {"centered-covariance": {"route": "mean-first"}}}
    names = ("mean", "centre", "covariance")
    outs = _moment_bytes_after_a_kill(tmp_path, loopback, store, extra, point, "mf", names)
    assert len(outs[0]) == 8 * (4 + 4 + 16)
    assert outs[0] == outs[1]
