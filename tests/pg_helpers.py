"""A real PostgreSQL server for the tests, from the binaries of the ``pgserver`` wheel.

The server runs as the current user, or as ``nobody`` when the tests run as root (PostgreSQL
refuses to run as root). It listens on a loopback port and a unix socket, with password
(SCRAM) authentication everywhere: the ledger's role ``mvg_ledger`` owns one fresh database per
test; the role ``analyst`` may connect but owns nothing.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def _bindir() -> tuple[Path, bool]:
    """The PostgreSQL server binaries: the ``pgserver`` wheel's (``True``), or, where the wheel
    has no build (Python 3.13), a system installation's (``initdb`` beside ``pg_ctl``:
    Debian's ``postgresql`` package, ``/usr/lib/postgresql/*/bin``, or ``PATH``)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin", True
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir, False
    raise RuntimeError(
        "no PostgreSQL server binaries: pip install -e '.[dev]' (the pgserver wheel, Python "
        "3.11-3.12) or install PostgreSQL (e.g. apt-get install postgresql)"
    )


def _reachable_copy(bindir: Path, dest: Path) -> Path:
    """The PostgreSQL binaries where ``nobody`` can reach them (the virtualenv may sit under a
    directory only root may enter, such as /root): hard links where possible, else copies, in
    the wheel's layout (the binaries find ``pgserver.libs`` through a relative rpath). Returns
    the new ``bin`` directory."""

    def link_or_copy(src: str, dst: str) -> object:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    package = bindir.parent.parent  # .../site-packages/pgserver
    ignore = shutil.ignore_patterns("include", "__pycache__", "*.py")
    for src in (package, package.parent / "pgserver.libs"):
        if src.is_dir():
            shutil.copytree(
                src, dest / src.name, symlinks=True, copy_function=link_or_copy, ignore=ignore
            )
    for d in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    return dest / package.name / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """initdb + pg_ctl on a temporary directory; :meth:`stop` removes it."""

    def __init__(self) -> None:
        t0 = time.perf_counter()
        self.bin, wheel = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="mvg-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.superuser_password = secrets.token_hex(16)
        self.ledger_password = secrets.token_hex(16)
        self.analyst_password = secrets.token_hex(16)
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            self._as = {"user": 65534, "group": 65534}
            os.chown(self.root, 65534, 65534)
            if wheel:  # a system installation is reachable where it is
                self.bin = _reachable_copy(self.bin, self.root / "pg")
        pwfile = self.root / "pw"
        pwfile.write_text(self.superuser_password + "\n")
        if self._as:
            os.chown(pwfile, 65534, 65534)
        self._pg(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--pwfile",
            str(pwfile),
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pwfile.unlink()
        self.start()
        self.psql(
            f"CREATE ROLE mvg_ledger LOGIN PASSWORD '{self.ledger_password}';"
            f"CREATE ROLE analyst LOGIN PASSWORD '{self.analyst_password}';"
        )
        self.start_seconds = time.perf_counter() - t0
        self._n = 0

    def _pg(self, exe: str, *args: str, timeout: float = 60) -> str:
        out = subprocess.run(
            [str(self.bin / exe), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
            **self._as,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{exe} failed: {out.stderr.strip()}")
        return out.stdout

    def start(self) -> None:
        """Start the server (waits until it accepts connections)."""
        self._pg(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.socket_dir} -c fsync=off",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast`` terminates sessions; ``immediate`` is a crash)."""
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again (every connection is dropped)."""
        self.stop(mode)
        self.start()

    def psql(self, sql: str, *, db: str = "postgres") -> str:
        """Run SQL as the superuser."""
        env = {**os.environ, "PGPASSWORD": self.superuser_password}
        out = subprocess.run(
            [
                str(self.bin / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.strip()}")
        return out.stdout

    def new_database(self) -> str:
        """A fresh database owned by ``mvg_ledger``; its name."""
        self._n += 1
        name = f"ledger_{self._n}"
        self.psql(f"CREATE DATABASE {name} OWNER mvg_ledger")
        return name

    def url(self, db: str, *, user: str = "mvg_ledger", host: str | None = None) -> str:
        """A libpq URI without a password (TCP on loopback, or the unix socket)."""
        if host == "socket":
            return f"postgresql://{user}@/{db}?host={self.socket_dir}&port={self.port}"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    def data_files(self) -> list[Path]:
        """Every file of the server's data directory (for key-erasure checks)."""
        return [p for p in self.data.rglob("*") if p.is_file()]

    def close(self) -> None:
        """Stop the server and remove its directory."""
        try:
            self.stop("immediate")
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


# PostgreSQL's CommandComplete message for COMMIT: 'C', length 11, "COMMIT\0"
_COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"


class CommitDroppingProxy:
    """A loopback TCP proxy in front of the server that, when armed, cuts the connection right
    after the server has committed a transaction and before the client hears it: the one
    outcome a client cannot tell from a failed commit (a network failure, made on purpose)."""

    def __init__(self, port: int) -> None:
        import threading

        self._target = ("127.0.0.1", port)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.armed = threading.Event()
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            for src, dst, from_server in ((client, server, False), (server, client, True)):
                threading.Thread(
                    target=self._pump, args=(src, dst, from_server), daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_server and self.armed.is_set() and _COMMIT_DONE in data:
                    self.armed.clear()
                    self.dropped += 1
                    break  # committed on the server; the client never hears it
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def url(self, db: str) -> str:
        """The ledger URL through the proxy (plain TCP, so that the proxy can read it)."""
        return f"postgresql://mvg_ledger@127.0.0.1:{self.port}/{db}?sslmode=disable"

    def close(self) -> None:
        """Stop accepting connections."""
        self._sock.close()
