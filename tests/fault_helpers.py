"""Real faults for the fault tests: a small tmpfs that fills up, a scheduler process to kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(path: Path, size_kib: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size_kib`` KiB on ``path`` (made here), unmounted on exit.

    Skips the test when this process may not mount (not root, or a container without
    ``CAP_SYS_ADMIN``): a full disk needs a real filesystem of its own.
    """
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a small tmpfs, and mounting one needs root")
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mount.stderr.strip() or mount.returncode})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(path: Path, leave_kib: int) -> Path:
    """Fill the filesystem of ``path`` with one file until ``leave_kib`` KiB are free."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    filler = path / "filler"
    filler.write_bytes(b"\0" * max(0, free - leave_kib * 1024))
    return filler


class Scheduler:
    """A ``dask scheduler`` process and its ``dask worker`` processes on loopback, killed or
    stopped by the test."""

    def __init__(self, tmp: Path, workers: int = 2) -> None:
        dask_bin = str(Path(sys.executable).parent / "dask")
        sched_file = tmp / f"scheduler-{time.monotonic_ns()}.json"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        cmd = [dask_bin, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
        self.scheduler = subprocess.Popen([*cmd, "--scheduler-file", str(sched_file)], **quiet)
        self.workers: list[subprocess.Popen[bytes]] = []
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.address = json.loads(sched_file.read_text())["address"]
        for _ in range(workers):
            worker = [dask_bin, "worker", self.address, "--nthreads", "1", "--host", "127.0.0.1"]
            # no nanny: a worker that loses its scheduler is not restarted
            worker += ["--no-dashboard", "--no-nanny"]
            self.workers.append(subprocess.Popen(worker, **quiet))
        from distributed import Client

        with Client(self.address, timeout="30s") as c:
            c.wait_for_workers(workers, timeout=60)

    def kill_scheduler(self) -> None:
        """SIGKILL the scheduler (its workers are left to notice)."""
        self.scheduler.kill()
        self.scheduler.wait()

    def close(self) -> None:
        """Stop the processes; the workers of a killed scheduler are killed (they have nothing
        left to finish and would wait for it to come back)."""
        from tests.cluster_helpers import stop

        if self.scheduler.poll() is not None:
            for w in self.workers:
                w.kill()
                w.wait()
        stop([self.scheduler, *self.workers])
