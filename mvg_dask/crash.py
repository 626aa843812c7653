"""Fault injection for the crash and fault tests: :func:`crash_point` (unset in production).

It lives below every layer (standard library only) so that the ledger's transactions and the
engine's release steps share one switch, ``MVG_DASK_CRASH_AT``.
"""

from __future__ import annotations

import os
import signal


def crash_point(name: str, index: int | None = None) -> None:
    """Fault injection for the crash tests; unset in production (does nothing).

    ``MVG_DASK_CRASH_AT=name[:index]`` SIGKILLs this process when the release reaches that point
    (``chunk:k``: once ``k`` tasks of the record pass have finished; the ``ledger-*`` points sit
    inside a ledger transaction). With ``MVG_DASK_CRASH_SIGNAL=SIGSTOP`` it stops there instead
    (until a SIGCONT: the fault tests break the scheduler meanwhile).

    Parameters
    ----------
    name : str
        The point (``reserved``, ``skeleton``, ``chunk``, ``before-commit``,
        ``before-ledger-commit``, ``ledger-reserve``, ``ledger-committed``, ...).
    index : int, optional
        How many tasks have finished (``chunk``).
    """
    target = os.environ.get("MVG_DASK_CRASH_AT")
    if not target:
        return
    want, _, at = target.partition(":")
    if want == name and (not at or (index is not None and index >= int(at))):
        if os.environ.get("MVG_DASK_CRASH_SIGNAL") != "SIGSTOP":
            os.kill(os.getpid(), signal.SIGKILL)
        elif target not in _STOPPED:  # once
            _STOPPED.add(target)
            os.kill(os.getpid(), signal.SIGSTOP)


#: the crash points this process has stopped at
_STOPPED: set[str] = set()
