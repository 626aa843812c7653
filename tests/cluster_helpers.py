"""A real `dask scheduler` + `dask worker` processes on loopback, for the failure and TLS tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def loopback_cluster(
    tmp: Path,
    workers: int = 2,
    env: dict[str, str] | None = None,
    *,
    certs: Path | None = None,
) -> Iterator[str]:
    """Start a scheduler and ``workers`` single-threaded workers (each under a nanny) and yield
    the scheduler's address.

    Parameters
    ----------
    tmp : Path
        Where the scheduler file goes.
    workers : int
        Number of workers.
    env : dict, optional
        The processes' environment (default: this process's).
    certs : Path, optional
        A directory with ``ca.crt``, ``tls.crt`` and ``tls.key``: the scheduler and the workers
        then speak TLS only (``tls://`` address).
    """
    sched_file = tmp / ("tls-scheduler.json" if certs else "scheduler.json")
    dask_bin = str(Path(sys.executable).parent / "dask")
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    tls: list[str] = []
    if certs is not None:
        tls = ["--tls-ca-file", str(certs / "ca.crt"), "--tls-cert", str(certs / "tls.crt")]
        tls += ["--tls-key", str(certs / "tls.key")]
    scheduler = [dask_bin, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
    scheduler += ["--scheduler-file", str(sched_file), *tls]
    if certs is not None:
        scheduler += ["--protocol", "tls"]
    procs = [subprocess.Popen(scheduler, **quiet)]
    try:
        deadline = time.time() + 60
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(workers):
            worker = [dask_bin, "worker", address, "--nthreads", "1", "--host", "127.0.0.1"]
            procs.append(subprocess.Popen([*worker, "--no-dashboard", *tls], **quiet))
        from distributed import Client

        security = None
        if certs is not None:
            from mvg_dask.engine.security import make_security

            security = make_security(tls_dir=certs)
        with Client(address, security=security, timeout="30s") as c:
            c.wait_for_workers(workers, timeout=60)
        yield address
    finally:
        stop(procs)


def stop(procs: list[subprocess.Popen[bytes]], grace: float = 30.0) -> None:
    """Terminate ``procs`` (last started first) and reap every one of them.

    A process still alive after ``grace`` seconds (a nanny under load can take that long to
    close its worker) is killed and then waited for, so no ``Popen`` is collected while its
    process runs (which Python reports as a ``ResourceWarning``: found by the stress loop).
    """
    for p in procs[::-1]:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
