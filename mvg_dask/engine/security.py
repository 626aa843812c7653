"""Transport security: Dask TLS from certificate files, and the plaintext-transport check.

The release key travels from the client to the workers inside task arguments. Over plain
``tcp://`` anyone on the network path can read it, so :func:`check_transport` refuses to send an
unseeded (private) key to a scheduler that is not on loopback unless the caller accepts the risk
(``--insecure-transport``). :func:`make_security` builds the :class:`distributed.Security` of a
TLS client from certificate files or from a mounted Kubernetes Secret directory.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from distributed.comm.addressing import parse_address, parse_host_port
from distributed.security import Security

from mvg_dask.errors import MvgDaskError

__all__ = [
    "ENCRYPTED_SCHEMES",
    "TLS_DIR_FILES",
    "TransportError",
    "check_transport",
    "is_loopback",
    "make_security",
]

#: Comm schemes whose traffic is encrypted (``inproc`` never leaves the process).
ENCRYPTED_SCHEMES = frozenset({"tls", "wss", "inproc"})

#: File names read from a ``--tls-dir`` (the keys of the Secret in ``cluster/``).
TLS_DIR_FILES = {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"}


class TransportError(MvgDaskError, ValueError):
    """The connection to the scheduler would expose the release key, or TLS is misconfigured."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) names this machine's loopback.

    A host name other than ``localhost`` is not resolved: it counts as remote.
    """
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_transport(address: str | None, seeded: bool, insecure: bool = False) -> None:
    """Refuse to send a private release key to a remote scheduler in plaintext.

    Call it with the scheduler address before the ledger reserves anything (nothing is
    charged when it raises). It looks at the address only; no connection is made.

    Parameters
    ----------
    address : str or None
        The scheduler address (``tls://host:port``, ``tcp://host:port``, ``host:port``); None
        for the embedded LocalCluster, which is on loopback.
    seeded : bool
        The release uses a ``seed`` (its key is not secret, the release is not private).
    insecure : bool
        The curator accepts plaintext transport (``--insecure-transport``).

    Raises
    ------
    TransportError
        ``address`` is a plaintext scheme to a non-loopback host, the key is private and
        ``insecure`` is False.
    """
    if address is None or seeded or insecure:
        return
    scheme, location = parse_address(address)
    if scheme in ENCRYPTED_SCHEMES:
        return
    try:
        host, _ = parse_host_port(location)
    except ValueError:
        host = location
    if is_loopback(host):
        return
    raise TransportError(
        f"refusing to send the release key to {address} over plaintext {scheme}://: use a "
        "tls:// scheduler with --tls-ca-file/--tls-cert/--tls-key (or --tls-dir), or pass "
        "--insecure-transport if the network is trusted"
    )


def _readable(path: str | Path, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise TransportError(f"{what} {p} is not a readable file")
    return str(p)


def make_security(
    *,
    ca_file: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    tls_dir: str | Path | None = None,
) -> Security | None:
    """The client :class:`distributed.Security` for a TLS scheduler, or None without TLS.

    Either the three files, or a directory holding ``ca.crt``, ``tls.crt`` and ``tls.key``
    (a mounted Kubernetes Secret, see ``cluster/``); the key file may be omitted when the
    certificate file also holds the key. Encryption is then required on every connection.

    Parameters
    ----------
    ca_file, cert, key : str or Path, optional
        CA bundle, client certificate and its private key (PEM).
    tls_dir : str or Path, optional
        A directory with ``ca.crt``, ``tls.crt`` and ``tls.key``.

    Returns
    -------
    distributed.Security or None
        None when no option is given.

    Raises
    ------
    TransportError
        Both a directory and files, an incomplete set, or a missing file.
    """
    files = (ca_file, cert, key)
    if tls_dir is not None:
        if any(f is not None for f in files):
            raise TransportError("give either --tls-dir or --tls-ca-file/--tls-cert/--tls-key")
        d = Path(tls_dir)
        if not d.is_dir():
            raise TransportError(f"--tls-dir {d} is not a directory")
        ca_file, cert = d / TLS_DIR_FILES["ca"], d / TLS_DIR_FILES["cert"]
        key = d / TLS_DIR_FILES["key"] if (d / TLS_DIR_FILES["key"]).exists() else None
    elif all(f is None for f in files):
        return None
    if ca_file is None or cert is None:
        raise TransportError("TLS needs both --tls-ca-file and --tls-cert (and usually --tls-key)")
    kwargs = {
        "tls_ca_file": _readable(ca_file, "TLS CA file"),
        "tls_client_cert": _readable(cert, "TLS certificate"),
    }
    if key is not None:
        kwargs["tls_client_key"] = _readable(key, "TLS key")
    return Security(require_encryption=True, **kwargs)
