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
from collections.abc import Iterator, Sequence
from typing import Any

from mvg_dask.crash import crash_point as crash_point  # the one switch (mvg_dask.crash)
from mvg_dask.engine.store import UNREACHABLE_ERRNOS, FaultTable, Store
from mvg_dask.errors import ChargedFailure

#: errno values of a full disk (space, or a quota)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: exception class names of a lost scheduler connection
SCHEDULER_NAMES = ("CommClosedError", "FuturesCancelledError", "FutureCancelledError")


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


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def classify(
    exc: BaseException,
    *,
    release_id: str,
    store: Store | str,
    charged: bool,
    inputs: Sequence[Store | str] = (),
    scheduler_lost: bool = False,
) -> Fault | None:
    """The one-line error of a fault, or ``None`` when ``exc`` is not one of the known faults.

    What an exception of a store's filesystem library means is the store's
    :class:`~mvg_dask.engine.store.FaultTable` (one per scheme,
    :data:`~mvg_dask.engine.store.SCHEMES`): the tables of the output and input stores are
    asked.

    Parameters
    ----------
    exc : BaseException
        What the release raised.
    release_id : str
        The release id (named in the error, for the re-run).
    store : Store or str
        The output store (named in the error).
    charged : bool
        Whether the release holds a reservation in a ledger (``False`` without a ledger: then
        nothing was charged and a re-run starts over).
    inputs : sequence of Store or str
        The stores the release reads.
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
    stores = [s if isinstance(s, Store) else Store(s) for s in (store, *inputs)]
    table = FaultTable()
    for s in stores:
        table += s.faults
    remote = not all(s.local for s in stores)
    fault = _classify(exc, stores[0].url, table, remote, scheduler_lost)
    if fault is not None:
        fault.charged = charged
        fault.release_id = release_id or None
        if not charged:  # nothing to resume: a re-run starts afresh
            fault.args = (str(fault).replace("re-run the same release id to resume", "re-run"),)
    return fault


def _classify(
    exc: BaseException, store: str, table: FaultTable, remote: bool, scheduler_lost: bool
) -> Fault | None:
    chain = list(_chain(exc))
    full = _disk_full(exc, chain, store)
    if full is not None:
        return full
    refused = _credentials_refused(chain, table, store, remote)
    if refused is not None:
        return refused
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
    return _unreachable(chain, table, store, remote)


def _disk_full(exc: BaseException, chain: list[BaseException], store: str) -> DiskFull | None:
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
    return None


def _credentials_refused(
    chain: list[BaseException], table: FaultTable, store: str, remote: bool
) -> CredentialsRefused | None:
    # a code or name in the text: distributed sends an exception it cannot pickle as its text
    # (an HTTP status in a text is too common to mean anything)
    marks = [c for c in (*table.credential_codes, *table.credential_names) if not c.isdigit()]
    for e in chain:
        code = table.code(e)
        names = _names(e)
        text = str(e)
        if (
            (remote and isinstance(e, PermissionError))
            or code in table.credential_codes
            or names & set(table.credential_names)
            or any(c in text for c in marks)
        ):
            known = code if code in table.credential_codes else None
            what = known or next((c for c in marks if c in text or c in names), "")
            detail = f" ({what})" if what else ""
            return CredentialsRefused(
                f"the object store refused the credentials{detail} for {store}: check the "
                "credentials (environment or storage_options) and their permissions, then re-run "
                "the same release id to resume"
            )
    return None


def _unreachable(
    chain: list[BaseException], table: FaultTable, store: str, remote: bool
) -> ObjectStoreUnreachable | None:
    for e in chain:
        module = type(e).__module__.split(".")[0]
        names = _names(e)
        text = str(e)
        remote_errno = isinstance(e, OSError) and e.errno in UNREACHABLE_ERRNOS
        if (
            module in table.modules
            or table.code(e) in table.unreachable_codes
            or names & set(table.unreachable_names)
            or any(n in text for n in table.unreachable_names)
            or (remote and (remote_errno or isinstance(e, ConnectionError | TimeoutError)))
        ):
            codes = [c for c in map(table.code, chain) if c is not None]
            number = e.errno if isinstance(e, OSError) else None
            if number is not None and number in errno.errorcode:
                codes.append(errno.errorcode[number])
            named = (n for n in table.unreachable_names if n in text or n in names)
            detail = next(iter(codes), next(named, type(e).__name__))
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
