"""A real S3 API server for the object-store tests, and a proxy in front of it that injects faults.

The server is moto's server mode (``ThreadedMotoServer``) on loopback, as s3fs's and zarr's own
suites use it. The proxy forwards every request to it unchanged, except those its ``rule`` picks:
it answers them with an S3 error (``500`` InternalError, ``503`` SlowDown, ``403``
InvalidAccessKeyId) or drops the connection without an answer. It also refuses (403) any request
signed with another access key than the one it expects, as S3 does.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: a fake key pair, distinctive enough to be searched for in every published byte
ACCESS_KEY = "AKIAMVGDASKTEST7Q2ZX"
SECRET_KEY = "mvgDaskTestSecret/q7Zr+PxW3kLmN9vBt2YcHsJ4"
REGION = "eu-west-1"

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


@dataclass
class Fault:
    """What the proxy does to the requests ``match`` picks, from the ``after``-th on (those
    before it pass), until :meth:`FaultProxy.heal`."""

    action: str  # "500", "503", "403" or "drop"
    match: Callable[[str, str, bytes], bool]
    after: int = 0
    seen: int = 0
    injected: int = 0


@dataclass
class FaultProxy:
    """An HTTP proxy in front of the S3 API server (see the module docstring)."""

    upstream: tuple[str, int]
    access_key: str | None = ACCESS_KEY
    fault: Fault | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def inject(self, fault: Fault) -> None:
        with self.lock:
            self.fault = fault

    def heal(self) -> None:
        with self.lock:
            self.fault = None

    def decide(self, method: str, path: str, headers: Any, body: bytes) -> str | None:
        """``None`` (forward) or the fault to answer with."""
        with self.lock:
            self.requests.append((method, path))
            auth = headers.get("Authorization", "")
            found = _CREDENTIAL.search(auth)
            if self.access_key is not None and (found is None or found[1] != self.access_key):
                return "403"
            fault = self.fault
            if fault is None or not fault.match(method, path, body):
                return None
            fault.seen += 1
            if fault.seen <= fault.after:
                return None
            fault.injected += 1
            return fault.action


_ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "403": (403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist."),
}


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _handle(self) -> None:
            body = self._body()
            action = proxy.decide(self.command, self.path, self.headers, body)
            if action == "drop":
                self.close_connection = True
                return  # no answer: the client sees the connection closed
            if action is not None:
                status, code, message = _ERRORS[action]
                payload = (
                    f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                    f"<Message>{message}</Message><RequestId>mvg</RequestId></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("transfer-encoding", "connection", "expect")
                }
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


@contextmanager
def s3_server() -> Iterator[tuple[str, FaultProxy]]:
    """Start moto's S3 API server and the fault proxy in front of it, both on loopback (random
    free ports); yield the proxy's endpoint URL and the proxy."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = FaultProxy(server.get_host_and_port())
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", proxy
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
        server.stop()


def storage_options(endpoint: str, *, key: str = ACCESS_KEY, fast_fail: bool = True) -> dict:
    """s3fs options for the test server: endpoint, credentials, region; ``fast_fail``: one
    attempt per request (botocore retries a failing request for seconds otherwise)."""
    options: dict[str, Any] = {
        "key": key,
        "secret": SECRET_KEY,
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": REGION},
    }
    if fast_fail:
        options["config_kwargs"] = {"retries": {"max_attempts": 1, "mode": "standard"}}
    return options


def chunk_puts(variable: str = "X") -> Callable[[str, str, bytes], bool]:
    """Match the PUTs of a release's data chunks (``.../<variable>/c/...``)."""
    return lambda method, path, body: method == "PUT" and f"/{variable}/c/" in path


def final_commit(store_path: str) -> Callable[[str, str, bytes], bool]:
    """Match the commit's last write: the root ``zarr.json`` with ``status: complete``."""
    return lambda method, path, body: (
        method == "PUT"
        and path.split("?")[0].endswith(f"{store_path}/zarr.json")
        and b'"mvg_dask_status": "complete"' in body
    )


def direct_fs(proxy: FaultProxy) -> Any:
    """An s3fs filesystem on the S3 API server itself (not through the proxy), uncached."""
    import s3fs

    host, port = proxy.upstream
    return s3fs.S3FileSystem(
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        endpoint_url=f"http://{host}:{port}",
        client_kwargs={"region_name": REGION},
        skip_instance_cache=True,
        use_listings_cache=False,
    )


def objects(fs: Any, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` (a bucket or ``bucket/key``), by key relative to it."""
    fs.invalidate_cache()
    if not fs.exists(prefix):
        return {}
    return {p[len(prefix) + 1 :]: fs.cat_file(p) for p in sorted(fs.find(prefix))}
