"""Temporary TLS certificates and a real TLS `dask scheduler` + `dask worker` on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.cluster_helpers import loopback_cluster


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
    with loopback_cluster(tmp, workers, certs=certs) as address:
        yield address
