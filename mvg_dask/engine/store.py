"""Where a release reads and writes: one :class:`Store` for local paths and object stores.

A store is a URL (or a plain path) and its fsspec ``storage_options``. Its scheme picks one
:class:`SchemeEntry` of :data:`SCHEMES`, which says everything that differs between backends:

* how a release is committed there: a local filesystem (``staged``) writes a staging directory
  beside the target and renames it into place; an object store (S3, GCS, Azure, ``memory://``)
  has no atomic rename of a directory, so a release is written in place under a claim object
  made by a conditional write (:meth:`Store.claim`);
* how an exception raised by its filesystem library is classified (:class:`FaultTable`): an
  unreachable or failing service, or refused credentials (:mod:`mvg_dask.engine.faults` asks
  the tables of the stores a release uses).

A new fsspec scheme is one entry of :data:`SCHEMES` (its fault table, when its library raises
exceptions of its own). A scheme without an entry is written in place, as an object store, with
the network faults only. Which schemes are local is said once, by
:data:`mvg_dask.spec.LOCAL_SCHEMES` (the spec checks it without fsspec); their entry here is
:data:`LOCAL`. See ``docs/howto/object-storage.md``.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from mvg_dask.release_format import ProgressLog
from mvg_dask.spec import LOCAL_SCHEMES, url_scheme

#: errno values of an unreachable or failing remote service (s3fs maps HTTP 500 to EREMOTEIO and
#: 503 / SlowDown to EBUSY)
UNREACHABLE_ERRNOS = tuple(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED",
        "ECONNRESET",
        "ECONNABORTED",
        "EHOSTUNREACH",
        "ENETUNREACH",
        "ETIMEDOUT",
        "EREMOTEIO",
        "EBUSY",
        "EPIPE",
    )
    if hasattr(errno, name)
)


def _no_code(exc: BaseException) -> str | None:
    return None


@dataclass(frozen=True)
class FaultTable:
    """How the exceptions of one backend's filesystem library are classified.

    Exception classes are matched by name (of the class or one of its bases), never imported:
    the library may be absent, and distributed sends an exception that cannot be pickled as its
    text, which is searched for the names and the credential codes too.

    Parameters
    ----------
    credential_codes : tuple of str
        Error codes (as :attr:`code` reads them) of refused credentials.
    credential_names : tuple of str
        Exception class names of refused or missing credentials.
    unreachable_codes : tuple of str
        Error codes of a service that failed or could not be reached (a 5xx, throttling).
    unreachable_names : tuple of str
        Exception class names of a connection that could not be made or broke.
    modules : tuple of str
        Top-level modules whose every other exception is the service failing.
    code : callable
        The error code an exception carries (``None`` for none).
    """

    credential_codes: tuple[str, ...] = ()
    credential_names: tuple[str, ...] = ()
    unreachable_codes: tuple[str, ...] = ()
    unreachable_names: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    code: Callable[[BaseException], str | None] = _no_code

    def __add__(self, other: FaultTable) -> FaultTable:
        """Both tables' codes, names and modules (``self``'s code reader first)."""

        def code(exc: BaseException) -> str | None:
            found = self.code(exc)
            return found if found is not None else other.code(exc)

        def both(field: str) -> tuple[str, ...]:
            return tuple(dict.fromkeys(getattr(self, field) + getattr(other, field)))

        names = (f.name for f in dataclasses.fields(self) if f.name != "code")
        return FaultTable(**{name: both(name) for name in names}, code=code)


#: what any remote filesystem built on aiohttp (s3fs, gcsfs, adlfs) or requests raises when the
#: connection could not be made or broke
NETWORK_FAULTS = FaultTable(
    unreachable_names=(
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ClientOSError",
        "ServerTimeoutError",
        "ConnectTimeout",
        "ReadTimeout",
        "ChunkedEncodingError",
        "ProxyError",
    ),
    modules=("aiohttp",),
)


def _s3_code(exc: BaseException) -> str | None:
    """The error code of a botocore ``ClientError`` (``response["Error"]["Code"]``)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return None if code is None else str(code)
    return None


#: S3 (botocore, s3fs): error codes of refused credentials, and botocore's exceptions
S3_FAULTS = FaultTable(
    credential_codes=(
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
    ),
    credential_names=("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"),
    unreachable_codes=("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"),
    unreachable_names=(
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
    ),
    modules=("botocore", "aiobotocore", "s3fs"),
    code=_s3_code,
)


def _http_code(exc: BaseException) -> str | None:
    """The HTTP status of a gcsfs ``HttpError`` or a ``google.api_core`` exception (``code``)."""
    code = getattr(exc, "code", None)
    return str(int(code)) if isinstance(code, int) else None


#: Google Cloud Storage (gcsfs; google-auth; google-api-core). gcsfs raises ``HttpError`` with
#: the HTTP status as ``code`` (401 for invalid credentials; 408, 429 and 5xx are retried and
#: then raised), an ``OSError("Forbidden: ...")`` for a 403, and google-auth's
#: ``DefaultCredentialsError`` / ``RefreshError`` when no usable credentials are found
GCS_FAULTS = FaultTable(
    credential_codes=("401", "403"),
    credential_names=(
        "DefaultCredentialsError",
        "RefreshError",
        "Unauthorized",
        "Forbidden",
        "PermissionDenied",
        "Unauthenticated",
    ),
    unreachable_codes=("408", "429", "500", "502", "503", "504"),
    unreachable_names=(
        "TransportError",
        "ServiceUnavailable",
        "InternalServerError",
        "BadGateway",
        "GatewayTimeout",
        "TooManyRequests",
        "DeadlineExceeded",
        "RetryError",
        "ChecksumError",
    ),
    modules=("gcsfs",),
    code=_http_code,
)


def _azure_code(exc: BaseException) -> str | None:
    """The Azure Storage error code of an ``azure.core`` ``HttpResponseError`` (``error_code``,
    from the ``x-ms-error-code`` header), else its HTTP status."""
    code = getattr(exc, "error_code", None)
    if code:  # azure-storage sets its StorageErrorCode (a str enum) or the header's text
        return str(getattr(code, "value", code))
    status = getattr(exc, "status_code", None)
    return str(status) if isinstance(status, int) else None


#: Azure Blob Storage and Data Lake Gen2 (adlfs; azure-core, azure-identity). azure-core raises
#: ``ClientAuthenticationError`` (401/403) and azure-identity ``CredentialUnavailableError``;
#: ``ServiceRequestError`` when no request could be sent, ``ServiceResponseError`` when the
#: response broke (and their ``...TimeoutError`` subclasses); Azure Storage names the refusal in
#: ``error_code`` (``AuthenticationFailed``, ``AuthorizationPermissionMismatch``, ...)
AZURE_FAULTS = FaultTable(
    credential_codes=(
        "AuthenticationFailed",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "AuthorizationProtocolMismatch",
        "InsufficientAccountPermissions",
        "InvalidAuthenticationInfo",
        "NoAuthenticationInformation",
        "401",
        "403",
    ),
    credential_names=("ClientAuthenticationError", "CredentialUnavailableError"),
    unreachable_codes=("ServerBusy", "InternalError", "OperationTimedOut", "500", "503"),
    unreachable_names=(
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
    ),
    modules=("adlfs",),
    code=_azure_code,
)


@dataclass(frozen=True)
class SchemeEntry:
    """What a store's scheme decides.

    Parameters
    ----------
    name : str
        The backend, as messages and docs name it.
    staged : bool
        True for a local filesystem: a release is written to a staging directory and renamed
        into place (no claim). False: written in place under a claim (object stores).
    faults : FaultTable
        How its library's exceptions are classified (:mod:`mvg_dask.engine.faults`).
    """

    name: str
    staged: bool
    faults: FaultTable = FaultTable()


#: the local filesystem (the schemes of :data:`mvg_dask.spec.LOCAL_SCHEMES`, and plain paths)
LOCAL = SchemeEntry("local filesystem", staged=True)
#: a scheme without an entry: written in place, with the network faults only
OTHER = SchemeEntry("fsspec filesystem", staged=False, faults=NETWORK_FAULTS)
_S3 = SchemeEntry("S3", staged=False, faults=S3_FAULTS + NETWORK_FAULTS)
_GCS = SchemeEntry("Google Cloud Storage", staged=False, faults=GCS_FAULTS + NETWORK_FAULTS)
_AZURE = SchemeEntry("Azure Blob Storage", staged=False, faults=AZURE_FAULTS + NETWORK_FAULTS)

#: one entry per fsspec scheme (a new scheme is one line here)
SCHEMES: dict[str, SchemeEntry] = {
    **dict.fromkeys(LOCAL_SCHEMES, LOCAL),
    "s3": _S3,
    "s3a": _S3,
    "gcs": _GCS,
    "gs": _GCS,
    "abfs": _AZURE,
    "abfss": _AZURE,
    "az": _AZURE,
    "memory": SchemeEntry("in-memory filesystem", staged=False),
}


def scheme_entry(url: str) -> SchemeEntry:
    """The entry of ``url``'s scheme: :data:`LOCAL` for a plain path or a scheme of
    :data:`~mvg_dask.spec.LOCAL_SCHEMES`, :data:`OTHER` for a scheme without an entry. A chained
    URL (``simplecache::s3://...``) has the entry of its last filesystem, but is never staged
    (its files are not plain local files): a local last filesystem makes it :data:`OTHER`."""
    scheme = url_scheme(url)
    if scheme in LOCAL_SCHEMES:
        return LOCAL
    entry = SCHEMES.get(scheme.rsplit("::", 1)[-1].lower(), OTHER)
    return OTHER if entry.staged else entry


class Store:
    """A store a release reads or writes: its URL, its fsspec options and its scheme's entry.

    Parameters
    ----------
    url : str
        A plain path, a ``file://`` URL or an fsspec URL.
    storage_options : dict, optional
        fsspec options of the store.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options = storage_options
        self.entry = scheme_entry(url)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def local(self) -> bool:
        """True for a local filesystem (staging directory and rename; no claim)."""
        return self.entry.staged

    @property
    def faults(self) -> FaultTable:
        """How this store's exceptions are classified."""
        return self.entry.faults

    @property
    def path(self) -> Path:
        """The filesystem path of a local store."""
        if not self.local:
            raise ValueError(f"{self.url} is not a local path")
        return local_path(self.url)

    @cached_property
    def _fs_root(self) -> tuple[Any, str]:
        import fsspec

        url = str(self.path) if self.local else self.url
        fs, root = fsspec.core.url_to_fs(url, **(self.storage_options or {}))
        return fs, str(root).rstrip("/")

    @property
    def fs(self) -> Any:
        """The fsspec filesystem."""
        return self._fs_root[0]

    @property
    def root(self) -> str:
        """The store's location as :attr:`fs` names it (no trailing ``/``)."""
        return self._fs_root[1]

    def key(self, name: str) -> str:
        """The path of ``name`` (relative to the store) as :attr:`fs` names it."""
        return f"{self.root}/{name}"

    def exists(self, name: str = "") -> bool:
        """Whether the store (or its entry ``name``) exists."""
        if self.local and not name:
            return self.path.exists()
        return bool(self.fs.exists(self.key(name) if name else self.root))

    def staging(self, release_id: str) -> Store:
        """Where a release with id ``release_id`` writes: beside a local target, its staging
        directory ``{name}.staging-{release_id}`` (renamed into place by the commit); the store
        itself for an object store."""
        if not self.local:
            return self
        final = self.path
        return Store(
            str(final.with_name(f"{final.name}.staging-{release_id}")), self.storage_options
        )

    def progress(self) -> ProgressLog:
        """The progress directory of a release written here (markers, saved plan, claim)."""
        return ProgressLog(self.root, self.fs, local=self.local)

    def chunk_marker(self, start: int) -> str:
        """The marker (as :attr:`fs` names it) that says the chunk starting at ``start`` is
        written."""
        return self.progress().chunk_marker(start)

    @property
    def abort_marker(self) -> str:
        """The marker (as :attr:`fs` names it) that tells a failed release's tasks to stop."""
        return self.progress().abort_marker

    def claim(self, release_id: str) -> str | None:
        """Claim the store for ``release_id`` (a conditional write) and return the owner:
        ``release_id`` when the claim is ours, another id, or ``None`` when the claim was
        removed meanwhile. A local store is never claimed (each release writes its own staging
        directory; the final rename refuses a taken name): ``release_id``."""
        if self.local:
            return release_id
        return self.progress().claim(release_id)

    def claim_owner(self) -> str | None:
        """The release that claimed the store, if any (never one for a local store)."""
        return None if self.local else self.progress().claim_owner()

    def unclaim(self, release_id: str) -> None:
        """Remove ``release_id``'s claim, if it holds one."""
        if not self.local:
            self.progress().unclaim(release_id)


def local_path(store: str) -> Path:
    """The filesystem path of a local store (a plain path or a ``file://`` URL)."""
    return Path(store.removeprefix("file://"))
