"""Faults of the machinery a release runs on, each on a real component started by the test: a
disk that fills up (a small tmpfs), a ``dask scheduler`` process killed mid-release, a corrupt or
half-written marker, plan or chunk. Each gives one clear line (no traceback) that says what
failed, what to do and that the release is charged and pending (exit code 3); then a re-run with
the same release id resumes to the bytes of an uninterrupted run, charged once.

(The object-store faults are in ``tests/test_object_store.py``, against an S3 API server.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from mvg_dask import api
from mvg_dask.engine.ledger import open_ledger
from tests.cluster_helpers import loopback_cluster
from tests.fault_helpers import Scheduler, fill, small_tmpfs
from tests.pipeline_helpers import data, make_input, pinned_key_cli, spec_dict, write_spec

pytestmark = pytest.mark.cluster

RECORDS, CHUNK = 20_000, 500  # 40 chunks of 4 x 500 float64 (16 KiB each), 8 tasks


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    with loopback_cluster(tmp_path_factory.mktemp("cluster")) as address:
        yield address


@pytest.fixture(scope="module")
def reference(tmp_path_factory, loopback):
    """The input and the bytes of an uninterrupted release of it (the pinned key)."""
    tmp = tmp_path_factory.mktemp("reference")
    store = make_input(tmp / "in.zarr", data(4, RECORDS, seed=11), chunk=CHUNK)
    spec = _spec(tmp, store, tmp / "ref.zarr", "reference")
    run = _cli(["release", str(spec), "--scheduler", loopback])
    assert run.returncode == 0, run.stderr
    return store, _published(tmp / "ref.zarr")


def _spec(tmp: Path, store: str, out: Path, name: str) -> Path:
    spec = spec_dict(
        store,
        str(out),
        release_id=f"rel-{name}",
        ledger={
            "path": str(tmp / f"{name}.sqlite"),
            "dataset": "faults",
            "budget": {"epsilon": 10.0, "delta": 1e-4},
        },
    )
    return write_spec(tmp / f"{name}.yaml", spec)


def _cli(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MVG_DASK_CRASH")}
    return subprocess.run(
        [*pinned_key_cli(), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**env, **kwargs.pop("env", {})},
        **kwargs,
    )


def _published(out: Path) -> dict[str, bytes]:
    """Every file of a release but the root ``zarr.json`` (it holds the release id)."""
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.relative_to(out).as_posix() != "zarr.json"
    }


def assert_charged_failure(run: subprocess.CompletedProcess[str], release_id: str, *what: str):
    """Exit code 3 and one line naming the fault, the remedy and the pending charge."""
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, run.stderr
    for text in (*what, f"budget charged; release {release_id} pending"):
        assert text in errors[0], errors[0]


def assert_pending(tmp: Path, name: str) -> None:
    """The ledger holds the release pending (charged), and ``ledger show`` says so."""
    with open_ledger(tmp / f"{name}.sqlite") as book:
        (entry,) = book.releases()
        assert entry.status == "pending"
    show = _cli(["ledger", "show", "--ledger", str(tmp / f"{name}.sqlite")])
    line = next(x for x in show.stdout.splitlines() if f"rel-{name}" in x)
    assert "pending" in line and "charged; re-run the same release id to resume" in line


def assert_resumed(tmp: Path, name: str, out: Path, want: dict[str, bytes]) -> None:
    """The release is complete with the reference's bytes, committed once, no leftovers."""
    assert _published(out) == want
    assert api.open_release(str(out)).attrs["mvg_dask_status"] == "complete"
    with open_ledger(tmp / f"{name}.sqlite") as book:
        (entry,) = book.releases()  # charged once
        assert entry.status == "committed" and entry.noise_key is None
    assert not list(out.parent.glob(f"{out.name}.staging-*"))
    assert not (out / ".mvg_dask_progress").exists()


def test_disk_full_mid_write_then_resume(tmp_path, loopback, reference):
    store, want = reference
    with small_tmpfs(tmp_path / "small", 2048) as disk:
        out = disk / "out.zarr"
        spec = _spec(tmp_path, store, out, "full")
        filler = fill(disk, leave_kib=320)  # the skeleton and some 15 of the 40 chunks
        run = _cli(["release", str(spec), "--scheduler", loopback])
        assert_charged_failure(
            run,
            "rel-full",
            "disk full while writing the release to",
            "free space, then re-run the same release id to resume",
        )
        assert_pending(tmp_path, "full")
        staged = disk / "out.zarr.staging-rel-full" / ".mvg_dask_progress"
        assert 0 < len(list(staged.glob("[0-9]*.json"))) < RECORDS // CHUNK  # mid-write
        filler.unlink()  # space freed
        run = _cli(["release", str(spec), "--scheduler", loopback])
        assert run.returncode == 0, run.stderr
        assert_resumed(tmp_path, "full", out, want)


@pytest.mark.parametrize(
    "verbose", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["default", "verbose"]
)
def test_disk_full_on_the_embedded_cluster_prints_one_line(tmp_path, reference, verbose):
    """The CLI's own cluster (its workers log in this process): distributed's ``Compute Failed``
    report with the worker's traceback stays off the terminal unless ``--verbose``."""
    store, _ = reference
    with small_tmpfs(tmp_path / "small", 2048) as disk:
        spec = _spec(tmp_path, store, disk / "out.zarr", "embedded")
        fill(disk, leave_kib=320)
        run = _cli(["release", str(spec), *(["--verbose"] if verbose else [])])
    if verbose:
        assert run.returncode == 3, run.stderr
        assert "Compute Failed" in run.stderr and "Traceback" in run.stderr
    else:
        assert_charged_failure(run, "rel-embedded", "disk full while writing the release to")
        assert "Compute Failed" not in run.stderr


def test_scheduler_killed_mid_release_then_resume_on_a_new_scheduler(tmp_path, reference):
    """The releasing process is stopped after 3 of its 8 tasks (so the kill lands mid-release
    whatever the machine's speed), the scheduler process is SIGKILLed, the process continues."""
    store, want = reference
    out = tmp_path / "out.zarr"
    spec = _spec(tmp_path, store, out, "lost")
    first = Scheduler(tmp_path)
    try:
        env = {**os.environ, "MVG_DASK_CRASH_AT": "chunk:3", "MVG_DASK_CRASH_SIGNAL": "SIGSTOP"}
        proc = subprocess.Popen(
            [*pinned_key_cli(), "release", str(spec), "--scheduler", first.address],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        _, status = os.waitpid(proc.pid, os.WUNTRACED)  # until it stops itself
        assert os.WIFSTOPPED(status), status
        first.kill_scheduler()
        os.kill(proc.pid, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=300)
        run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        assert_charged_failure(run, "rel-lost", "the Dask scheduler was lost during the release")
        assert_pending(tmp_path, "lost")
    finally:
        first.close()
    second = Scheduler(tmp_path)
    try:
        run = _cli(["release", str(spec), "--scheduler", second.address])
        assert run.returncode == 0, run.stderr
    finally:
        second.close()
    assert_resumed(tmp_path, "lost", out, want)


@pytest.mark.parametrize(
    "damage", ["truncated-marker", "garbage-marker", "half-written-chunk", "half-written-plan"]
)
def test_corrupt_or_half_written_progress_then_resume(tmp_path, loopback, reference, damage):
    """A run killed mid-release, then its progress damaged as a crash or a full disk leaves it:
    the resumed run rewrites what it cannot trust and publishes the reference's bytes."""
    store, want = reference
    out = tmp_path / "out.zarr"
    spec = _spec(tmp_path, store, out, "damaged")
    run = _cli(
        ["release", str(spec), "--scheduler", loopback], env={"MVG_DASK_CRASH_AT": "chunk:3"}
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    staging = tmp_path / "out.zarr.staging-rel-damaged"
    progress = staging / ".mvg_dask_progress"
    markers = sorted(progress.glob("[0-9]*.json"), key=lambda p: int(p.stem))
    assert markers
    marker = markers[0]
    chunk = staging / "X" / "c" / "0" / str(int(marker.stem) // CHUNK)
    if damage == "truncated-marker":
        marker.write_bytes(marker.read_bytes()[:7])
    elif damage == "garbage-marker":
        marker.write_bytes(b"\x00\xff[1, 2")
    elif damage == "half-written-chunk":  # the crash came between the chunk and its marker
        chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
        marker.unlink()
    else:
        plan = progress / "plan.json"
        plan.write_bytes(plan.read_bytes()[:40])
    (progress / "ABORT").write_bytes(b"")  # as a failed run leaves it
    run = _cli(["release", str(spec), "--scheduler", loopback])
    assert run.returncode == 0, run.stderr
    assert_resumed(tmp_path, "damaged", out, want)


def test_the_api_states_the_charge(tmp_path, loopback, reference):
    """The fault's exception carries ``charged`` and the release id (the API's statement)."""
    from distributed import Client

    from mvg_dask.engine.faults import DiskFull
    from mvg_dask.errors import ChargedFailure

    store, _ = reference
    with small_tmpfs(tmp_path / "small", 1024) as disk:
        out = disk / "out.zarr"
        spec = _spec(tmp_path, store, out, "api")
        filler = fill(disk, leave_kib=200)
        with Client(loopback, timeout="30s") as client:
            with pytest.raises(ChargedFailure, match="free space") as info:
                api.release(str(spec), client=client, progress=False)
            assert isinstance(info.value, DiskFull)
            assert info.value.charged and info.value.release_id == "rel-api"
            filler.unlink()
            api.release(str(spec), client=client, progress=False)
        with open_ledger(tmp_path / "api.sqlite") as book:
            (entry,) = book.releases()
            assert entry.status == "committed"


# -- the classification itself (no cluster) ---------------------------------------------------


def _classify(exc, *, remote=False, lost=False, charged=True):
    from mvg_dask.engine.faults import classify

    return classify(
        exc,
        release_id="rel-x",
        store="s3://bucket/out.zarr" if remote else "/data/out.zarr",
        charged=charged,
        scheduler_lost=lost,
    )


def test_each_fault_is_classified_with_what_to_do():
    import errno

    from distributed.comm.core import CommClosedError

    from mvg_dask.engine import faults

    full = _classify(OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(full, faults.DiskFull) and full.charged and full.release_id == "rel-x"
    assert "free space, then re-run the same release id to resume" in str(full)
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert isinstance(_classify(wrapped), faults.DiskFull)
    assert isinstance(
        _classify(CommClosedError("in <TCP>: Stream is closed")), faults.SchedulerLost
    )
    assert isinstance(_classify(ValueError("anything"), lost=True), faults.SchedulerLost)
    refused = _classify(
        PermissionError("The AWS Access Key Id you provided does not exist"), remote=True
    )
    assert isinstance(refused, faults.CredentialsRefused)
    assert _classify(PermissionError("/data/out.zarr: read-only"), remote=False) is None
    failing = _classify(OSError(errno.EREMOTEIO, "We encountered an internal error"), remote=True)
    assert isinstance(failing, faults.ObjectStoreUnreachable) and "(EREMOTEIO)" in str(failing)
    from botocore.exceptions import EndpointConnectionError

    gone = _classify(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), remote=True)
    assert isinstance(gone, faults.ObjectStoreUnreachable) and "EndpointConnectionError" in str(
        gone
    )
    assert _classify(ValueError("a bug")) is None  # not a fault: raised as it is
    assert not _classify(OSError(errno.ENOSPC, "full"), charged=False).charged


def test_a_fault_message_never_quotes_the_original_text():
    """The original text may hold a signed URL or a key: the message names the fault only."""
    import errno

    secret = "AKIASECRETSECRET1234"
    exc = OSError(errno.EREMOTEIO, f"PUT https://s3/x?X-Amz-Credential={secret}/..: 500")
    assert secret not in str(_classify(exc, remote=True))
    exc = PermissionError(f"Credential={secret} refused")
    assert secret not in str(_classify(exc, remote=True))


def test_the_cli_exit_code_and_line_state_the_charge():
    import click

    from mvg_dask.cli._common import fail
    from mvg_dask.engine.faults import SchedulerLost
    from mvg_dask.errors import ReleaseError

    charged = SchedulerLost("the Dask scheduler was lost during the release: check the cluster")
    charged.release_id = "rel-7"
    with pytest.raises(click.ClickException) as info:
        fail(charged)
    assert info.value.exit_code == 3
    assert info.value.message.endswith(
        "(budget charged; release rel-7 pending: re-run the same release id to resume)"
    )
    with pytest.raises(click.ClickException) as info:
        fail(ReleaseError("output.store: taken; choose another"))
    assert info.value.exit_code == 1 and "budget charged" not in info.value.message
