"""Faults of the machinery a release runs on, as one-line errors that say what to do.

A release that fails once its budget is reserved stays pending in the ledger (charged); a re-run
with the same release id resumes it (chunks already written are skipped, the bytes are those of an
uninterrupted run). :func:`classify` turns the exception of such a failure into a
:class:`~mvg_dask.errors.ChargedFailure` naming what failed: the disk (full), the Dask scheduler
(lost) or the object store (unreachable, failing or refusing the credentials). The message never
quotes the original exception's text where it may hold a URL with credentials or a request
signature: only the kind of fault, the output store and an error code.

It is also the one home of fault injection: :func:`crash_point`, which the crash and fault tests
use to kill or stop a release (or a ledger transaction) at a named point.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
from collections.abc import Iterator
from typing import Any

from mvg_dask.crash import crash_point as crash_point  # the one switch (mvg_dask.crash)
from mvg_dask.errors import ChargedFailure

#: errno values of a full disk (space, or a quota)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: errno values of an unreachable or failing remote service (s3fs maps HTTP 500 to EREMOTEIO and
#: 503 / SlowDown to EBUSY)
UNREACHABLE = tuple(
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
#: S3 error codes of refused credentials
CREDENTIAL_CODES = (
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
)
#: exception class names (matched by name: distributed sends an exception that cannot be pickled
#: as its text) of a connection to an object store that could not be made or broke
UNREACHABLE_NAMES = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientOSError",
    "ServerTimeoutError",
)
CREDENTIAL_NAMES = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")
#: exception class names of a lost scheduler connection
SCHEDULER_NAMES = ("CommClosedError", "FuturesCancelledError", "FutureCancelledError")
OBJECT_STORE_MODULES = ("botocore", "aiobotocore", "s3fs", "aiohttp", "gcsfs", "adlfs")


class Fault(ChargedFailure):
    """A fault of the machinery (not of the data or the spec) after the budget was reserved.

    Attributes
    ----------
    release_id : str or None
        The release that failed (the CLI names it for the re-run).
    """

    release_id: str | None = None


class DiskFull(Fault):
    """The disk (or the quota) of a local output filled up during the release."""


class SchedulerLost(Fault):
    """The connection to the Dask scheduler was lost during the release."""


class ObjectStoreUnreachable(Fault):
    """The object store could not be reached, or failed, during the release."""


class CredentialsRefused(Fault):
    """The object store refused the credentials (or there were none)."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes and contexts, each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def _s3_code(exc: BaseException) -> str | None:
    """The error code of a botocore ``ClientError`` (``response["Error"]["Code"]``)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return None if code is None else str(code)
    return None


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def classify(
    exc: BaseException,
    *,
    release_id: str,
    store: str,
    charged: bool,
    remote: bool,
    scheduler_lost: bool = False,
) -> Fault | None:
    """The one-line error of a fault, or ``None`` when ``exc`` is not one of the known faults.

    Parameters
    ----------
    exc : BaseException
        What the release raised.
    release_id : str
        The release id (named in the error, for the re-run).
    store : str
        The output store (named in the error).
    remote : bool
        Whether the input or the output is in an object store (a ``PermissionError`` is then
        the store refusing the credentials).
    charged : bool
        Whether the release holds a reservation in a ledger (``False`` without a ledger: then
        nothing was charged and a re-run starts over).
    scheduler_lost : bool
        The client has lost its scheduler (its status is no longer ``running``): whatever the
        exception, the scheduler is the fault.

    Returns
    -------
    Fault or None
        A :class:`DiskFull`, :class:`SchedulerLost`, :class:`ObjectStoreUnreachable` or
        :class:`CredentialsRefused` whose ``charged`` is ``charged`` and ``release_id`` the
        release id.
    """
    fault = _classify(exc, store, remote, scheduler_lost)
    if fault is not None:
        fault.charged = charged
        fault.release_id = release_id or None
        if not charged:  # nothing to resume: a re-run starts afresh
            fault.args = (str(fault).replace("re-run the same release id to resume", "re-run"),)
    return fault


def _classify(exc: BaseException, store: str, remote: bool, scheduler_lost: bool) -> Fault | None:
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return DiskFull(
                f"disk full while writing the release to {store} ({errno.errorcode[e.errno]}): "
                "free space, then re-run the same release id to resume"
            )
    if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
        return DiskFull(
            f"disk full while writing the release to {store}: free space, then re-run the same "
            "release id to resume"
        )
    for e in chain:
        code = _s3_code(e)
        names = _names(e)
        text = str(e)
        if (
            (remote and isinstance(e, PermissionError))
            or code in CREDENTIAL_CODES
            or names & set(CREDENTIAL_NAMES)
            or any(c in text for c in (*CREDENTIAL_CODES, *CREDENTIAL_NAMES))
        ):
            what = code or next(
                (c for c in (*CREDENTIAL_CODES, *CREDENTIAL_NAMES) if c in text or c in names), ""
            )
            detail = f" ({what})" if what else ""
            return CredentialsRefused(
                f"the object store refused the credentials{detail} for {store}: check the "
                "credentials (environment or storage_options) and their permissions, then re-run "
                "the same release id to resume"
            )
    if scheduler_lost or any(
        _names(e) & set(SCHEDULER_NAMES)
        or (
            isinstance(e, asyncio.CancelledError | concurrent.futures.CancelledError)
            and "scheduler" in str(e)
        )
        for e in chain
    ):
        return SchedulerLost(
            "the Dask scheduler was lost during the release: check the cluster (or start a new "
            "scheduler and workers), then re-run the same release id to resume"
        )
    for e in chain:
        module = type(e).__module__.split(".")[0]
        names = _names(e)
        text = str(e)
        remote_errno = isinstance(e, OSError) and e.errno in UNREACHABLE
        if (
            module in OBJECT_STORE_MODULES
            or names & set(UNREACHABLE_NAMES)
            or any(n in text for n in UNREACHABLE_NAMES)
            or (remote and (remote_errno or isinstance(e, ConnectionError | TimeoutError)))
        ):
            codes = [c for c in map(_s3_code, chain) if c is not None]
            number = e.errno if isinstance(e, OSError) else None
            if number is not None and number in errno.errorcode:
                codes.append(errno.errorcode[number])
            detail = next(
                iter(codes),
                next((n for n in UNREACHABLE_NAMES if n in text or n in names), type(e).__name__),
            )
            return ObjectStoreUnreachable(
                f"the object store of {store} is unreachable or failing ({detail}): check the "
                "endpoint and the network, then re-run the same release id to resume"
            )
    return None


def scheduler_lost(client: Any) -> bool:
    """True when ``client`` (a :class:`distributed.Client`) is no longer connected to its
    scheduler."""
    status = getattr(client, "status", "running")
    return status not in ("running", "newly-created")
