"""The Store: one scheme entry per fsspec scheme, local staging and rename, the claim of an
object store, and each entry's fault table classifying its library's real exceptions (built from
the library where it is installed; S3 itself is tested against a real server in
test_object_store.py and test_faults.py)."""

from __future__ import annotations

import errno
import importlib.util

import numpy as np
import pytest
import xarray as xr

from mvg_dask.engine import faults
from mvg_dask.engine.store import LOCAL, OTHER, SCHEMES, Store, scheme_entry
from mvg_dask.spec import LOCAL_SCHEMES, is_local

GCS_OUT = "gcs://bucket/out.zarr"
AZURE_OUT = "abfs://container/out.zarr"


def _classify(exc: BaseException, store: str, *inputs: str) -> faults.Fault | None:
    return faults.classify(exc, release_id="rel-x", store=store, charged=True, inputs=inputs)


def _needs(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed: its exceptions cannot be built")


# -- the registry --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "name", "staged"),
    [
        ("/data/x.zarr", "local filesystem", True),
        ("x.zarr", "local filesystem", True),
        ("file:///data/x.zarr", "local filesystem", True),
        ("s3://b/x.zarr", "S3", False),
        ("s3a://b/x.zarr", "S3", False),
        ("gcs://b/x.zarr", "Google Cloud Storage", False),
        ("gs://b/x.zarr", "Google Cloud Storage", False),
        ("abfs://c/x.zarr", "Azure Blob Storage", False),
        ("abfss://c/x.zarr", "Azure Blob Storage", False),
        ("az://c/x.zarr", "Azure Blob Storage", False),
        ("memory://x.zarr", "in-memory filesystem", False),
        ("simplecache::s3://b/x.zarr", "S3", False),
        ("simplecache::file:///data/x.zarr", "fsspec filesystem", False),
        ("simplecache::/data/x.zarr", "fsspec filesystem", False),
        ("webdav://host/x.zarr", "fsspec filesystem", False),
    ],
)
def test_each_scheme_has_its_entry(url: str, name: str, staged: bool) -> None:
    store = Store(url)
    assert (store.entry.name, store.local) == (name, staged)
    assert is_local(url) == staged  # the spec's string check says the same, without fsspec


def test_the_local_schemes_are_listed_once() -> None:
    """spec.LOCAL_SCHEMES is the one list: the registry's staged entries are exactly those."""
    assert {s for s, e in SCHEMES.items() if e.staged} == set(LOCAL_SCHEMES)
    assert all(SCHEMES[s] is LOCAL for s in LOCAL_SCHEMES)
    assert scheme_entry("ftp://host/x") is OTHER and not OTHER.staged


# -- local: staging directory and rename --------------------------------------------------------


def test_a_local_release_is_staged_beside_the_target_and_renamed_into_place(tmp_path) -> None:
    from mvg_dask.engine.output import OutputTarget
    from mvg_dask.engine.zarr_io.skeleton import write_skeleton
    from mvg_dask.release_format import COMPLETE, PROGRESS_DIR, RELEASE_ID_ATTR, STATUS_ATTR

    final = tmp_path / "out.zarr"
    target = OutputTarget(f"file://{final}", "rel-1")
    assert target.local and target.writing.path == tmp_path / "out.zarr.staging-rel-1"
    target.claim()  # a local output is never claimed: nothing is written
    assert list(tmp_path.iterdir()) == []
    write_skeleton(xr.Dataset({"v": ("n", np.arange(3.0))}), target.write_store)
    target.make_progress_dir()
    assert (target.writing.path / PROGRESS_DIR).is_dir() and not final.exists()
    assert target.has_skeleton() is False  # no saved plan yet: a resume starts over
    target.commit({RELEASE_ID_ATTR: "rel-1"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]
    assert not (final / PROGRESS_DIR).exists()
    opened = xr.open_zarr(final)
    assert opened.attrs[STATUS_ATTR] == COMPLETE
    np.testing.assert_array_equal(opened["v"].values, [0.0, 1.0, 2.0])


def test_an_object_store_is_written_in_place_under_a_claim() -> None:
    import uuid

    store = Store(f"memory://claims-{uuid.uuid4().hex}/out.zarr")
    assert store.staging("rel-a") is store
    assert store.claim_owner() is None
    assert store.claim("rel-a") == "rel-a"
    assert store.claim("rel-b") == "rel-a"  # the second job is refused
    store.unclaim("rel-b")  # not its claim: kept
    assert store.claim_owner() == "rel-a"
    store.unclaim("rel-a")
    assert store.claim_owner() is None and store.claim("rel-b") == "rel-b"
    assert store.exists(store.progress().claim_file.removeprefix(f"{store.root}/"))


# -- the fault tables ---------------------------------------------------------------------------


def test_the_local_table_knows_a_full_disk_and_nothing_of_object_stores(tmp_path) -> None:
    out = str(tmp_path / "out.zarr")
    assert isinstance(_classify(OSError(errno.ENOSPC, "full"), out), faults.DiskFull)
    assert _classify(PermissionError("read-only"), out) is None
    assert _classify(ConnectionResetError(errno.ECONNRESET, "reset"), out) is None


def test_s3_table() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    out = "s3://bucket/out.zarr"

    def client_error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")

    refused = _classify(client_error("AccessDenied"), out)
    assert isinstance(refused, faults.CredentialsRefused) and "(AccessDenied)" in str(refused)
    assert isinstance(_classify(NoCredentialsError(), out), faults.CredentialsRefused)
    slow = _classify(client_error("SlowDown"), out)
    assert isinstance(slow, faults.ObjectStoreUnreachable) and "(SlowDown)" in str(slow)
    gone = _classify(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), out)
    assert isinstance(gone, faults.ObjectStoreUnreachable)
    # an S3 input of a local output: the input's table is asked too
    assert isinstance(
        _classify(client_error("InvalidAccessKeyId"), "/data/out.zarr", "s3://b/in.zarr"),
        faults.CredentialsRefused,
    )
    # botocore's exceptions mean nothing to a release that uses no S3 store
    assert _classify(client_error("AccessDenied"), "/data/out.zarr") is None


def test_gcs_table_google_auth_and_api_core() -> None:
    _needs("google.api_core")
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    for exc, code in (
        (api.Forbidden("no access"), "403"),
        (api.Unauthorized("bad token"), "401"),
        (auth.DefaultCredentialsError("no credentials found"), "DefaultCredentialsError"),
        (auth.RefreshError("token expired"), "RefreshError"),
    ):
        refused = _classify(exc, GCS_OUT)
        assert isinstance(refused, faults.CredentialsRefused), exc
        assert f"({code})" in str(refused) and GCS_OUT in str(refused)
    for exc, code in (
        (api.ServiceUnavailable("down"), "503"),
        (api.TooManyRequests("slow down"), "429"),
        (api.from_http_status(500, "internal"), "500"),
        (auth.TransportError("connection refused"), "TransportError"),
    ):
        gone = _classify(exc, GCS_OUT)
        assert isinstance(gone, faults.ObjectStoreUnreachable), exc
        assert f"({code})" in str(gone)
    assert _classify(api.NotFound("no such object"), GCS_OUT) is None  # raised as it is
    assert _classify(api.Forbidden("no access"), "/data/out.zarr") is None


def test_gcs_table_gcsfs_responses() -> None:
    """gcsfs's validate_response raises ``OSError("Forbidden: ...")`` for a 403 and its
    ``HttpError`` (status as ``code``) for the others."""
    refused = _classify(OSError("Forbidden: https://storage/b/o/x\nno access"), GCS_OUT)
    assert isinstance(refused, faults.CredentialsRefused) and "(Forbidden)" in str(refused)
    _needs("gcsfs")
    from gcsfs.retry import HttpError

    denied = _classify(HttpError({"code": 401, "message": "Invalid Credentials"}), GCS_OUT)
    assert isinstance(denied, faults.CredentialsRefused) and "(401)" in str(denied)
    busy = _classify(HttpError({"code": 503, "message": "backend error"}), GCS_OUT)
    assert isinstance(busy, faults.ObjectStoreUnreachable) and "(503)" in str(busy)


def test_azure_table() -> None:
    _needs("azure.core")
    from azure.core import exceptions as az

    refused = _classify(
        az.ClientAuthenticationError(message="Server failed to authenticate"), AZURE_OUT
    )
    assert isinstance(refused, faults.CredentialsRefused)
    mismatch = az.HttpResponseError(message="This request is not authorized")
    mismatch.error_code = "AuthorizationPermissionMismatch"  # as azure-storage sets it
    refused = _classify(mismatch, AZURE_OUT)
    assert isinstance(refused, faults.CredentialsRefused)
    assert "(AuthorizationPermissionMismatch)" in str(refused)
    for exc in (
        az.ServiceRequestError("Cannot connect to host"),
        az.ServiceResponseError("Connection aborted"),
        az.ServiceResponseTimeoutError("read timeout"),
    ):
        assert isinstance(_classify(exc, AZURE_OUT), faults.ObjectStoreUnreachable), exc
    busy = az.HttpResponseError(message="Operation could not be completed")
    busy.error_code = "ServerBusy"
    gone = _classify(busy, AZURE_OUT)
    assert isinstance(gone, faults.ObjectStoreUnreachable) and "(ServerBusy)" in str(gone)
    missing = az.ResourceNotFoundError(message="The specified blob does not exist")
    assert _classify(missing, AZURE_OUT) is None  # not a fault: raised as it is
    assert _classify(az.ServiceRequestError("no host"), "/data/out.zarr") is None


def test_a_scheme_without_a_table_still_knows_the_network(tmp_path) -> None:
    """memory:// (and a scheme without an entry) is remote: a refused permission is the
    credentials, a broken connection the store."""
    out = "memory://bucket/out.zarr"
    assert isinstance(_classify(PermissionError("denied"), out), faults.CredentialsRefused)
    gone = _classify(ConnectionResetError(errno.ECONNRESET, "reset"), "webdav://h/out.zarr")
    assert isinstance(gone, faults.ObjectStoreUnreachable) and "ECONNRESET" in str(gone)


def test_storage_is_decided_by_the_store_alone() -> None:
    """No ``url_to_fs`` or ``is_local`` decision outside the Store (and the spec's string check
    of a URL, which the Store's registry extends)."""
    from pathlib import Path

    import mvg_dask

    root = Path(mvg_dask.__file__).parent
    hits = [
        f"{path.relative_to(root)}:{n}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).as_posix() != "engine/store.py"
        and path.relative_to(root).parts[0] != "spec"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "url_to_fs" in line or "is_local" in line
    ]
    assert hits == []
