"""A real `dask scheduler` + `dask worker` processes on loopback, for the failure tests."""

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
    tmp: Path, workers: int = 2, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Start a scheduler and ``workers`` single-threaded workers (each under a nanny), with
    ``env`` as their environment (default: this process's)."""
    sched_file = tmp / "scheduler.json"
    dask_bin = str(Path(sys.executable).parent / "dask")
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    procs = [
        subprocess.Popen(
            [
                dask_bin,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(sched_file),
            ],
            **quiet,
        )
    ]
    try:
        deadline = time.time() + 60
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(workers):
            procs.append(
                subprocess.Popen(
                    [
                        dask_bin,
                        "worker",
                        address,
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                    ],
                    **quiet,
                )
            )
        from distributed import Client

        with Client(address, timeout="30s") as c:
            c.wait_for_workers(workers, timeout=60)
        yield address
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
