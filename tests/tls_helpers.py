"""Temporary TLS certificates and a real TLS `dask scheduler` + `dask worker` on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def make_certs(directory: Path) -> Path:
    """A test CA and one certificate for 127.0.0.1, written as a Kubernetes TLS Secret would
    mount them: ``ca.crt``, ``tls.crt``, ``tls.key``. Returns the directory."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost", common_name="mvg-dask-test")
    ca.cert_pem.write_to_path(str(directory / "ca.crt"))
    leaf.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
    leaf.private_key_pem.write_to_path(str(directory / "tls.key"))
    return directory


@contextmanager
def tls_loopback_cluster(tmp: Path, certs: Path, workers: int = 2) -> Iterator[str]:
    """Start a TLS-only scheduler and ``workers`` single-threaded TLS workers; yield the
    scheduler's ``tls://`` address."""
    sched_file = tmp / "tls-scheduler.json"
    dask_bin = str(Path(sys.executable).parent / "dask")
    tls = [
        "--tls-ca-file",
        str(certs / "ca.crt"),
        "--tls-cert",
        str(certs / "tls.crt"),
        "--tls-key",
        str(certs / "tls.key"),
    ]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    scheduler = [dask_bin, "scheduler", "--protocol", "tls", "--host", "127.0.0.1"]
    scheduler += ["--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file), *tls]
    procs = [subprocess.Popen(scheduler, **quiet)]
    try:
        deadline = time.time() + 60
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(workers):
            worker = [dask_bin, "worker", address, "--nthreads", "1", "--host", "127.0.0.1"]
            worker += ["--no-dashboard", *tls]
            procs.append(subprocess.Popen(worker, **quiet))
        from distributed import Client

        from mvg_dask.engine.security import make_security

        with Client(address, security=make_security(tls_dir=certs), timeout="30s") as c:
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
