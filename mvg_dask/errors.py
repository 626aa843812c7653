"""Exceptions of mvg_dask. Each subclasses a builtin, as diffprivlib does (``ValueError`` for bad
values), and carries a one-line message naming the field and the remedy."""

from __future__ import annotations


class MvgDaskError(Exception):
    """Base class of every error mvg_dask raises on purpose.

    Attributes
    ----------
    charged : bool
        Whether the ledger holds a charge for the release that failed: ``False`` for a refusal
        before any data was read, ``True`` for a failure after the budget was reserved (the
        release stays pending; re-running the same release id resumes it and charges nothing
        more). The CLI states it and picks its exit code from it.
    release_id : str or None
        The charged release, when known (set with ``charged``).
    pending : bool
        With ``charged``: whether the release stays pending (re-running its id resumes it) or
        was aborted after reading data (it stays charged and cannot be resumed).
    charge : str or None
        With ``charged``: what was charged and to which ledger dataset (``epsilon=0.5,
        delta=1e-06 to dataset 'patients'``), when known; the message then states it
        (:func:`charged_clause`).
    """

    charged: bool = False
    release_id: str | None = None
    pending: bool = True
    charge: str | None = None


def charged_clause(exc: MvgDaskError) -> str:
    """What a charged failure leaves in the ledger, and what to do about it.

    Parameters
    ----------
    exc : MvgDaskError
        A failure whose ``charged`` is set.

    Returns
    -------
    str
        ``(budget charged[: amount]; release ... pending: ...)`` or ``(... aborted after
        reading data: choose a new release id)``.

    Examples
    --------
    >>> exc = DataError("NaN in records 0..9")
    >>> exc.charged, exc.release_id, exc.pending = True, "r1", False
    >>> exc.charge = "epsilon=0.5, delta=1e-06 to dataset 'patients'"
    >>> charged_clause(exc)[:60]
    "(budget charged: epsilon=0.5, delta=1e-06 to dataset 'patie"
    """
    release = "release" if exc.release_id is None else f"release {exc.release_id}"
    charged = "budget charged" if exc.charge is None else f"budget charged: {exc.charge}"
    if exc.pending:
        return f"({charged}; {release} pending: re-run the same release id to resume)"
    return f"({charged}; {release} aborted after reading data: choose a new release id)"


class DataError(MvgDaskError, ValueError):
    """The input data does not fit the spec (missing variable, NaN, outside the domain, ...)."""


class ReleaseError(MvgDaskError, RuntimeError):
    """A release cannot proceed (output already holds another release, a chunk is unreadable)."""


class ChargedFailure(ReleaseError):
    """A release failed after its budget was charged (disk full, scheduler lost, object store
    unreachable). The release stays pending in the ledger; re-run the same release id to resume."""

    charged = True


class IncompleteReleaseError(ReleaseError):
    """An output store does not hold a complete release."""


class BudgetError(MvgDaskError, ValueError):
    """The dataset's privacy budget would be exceeded."""


class LedgerError(MvgDaskError, RuntimeError):
    """The privacy ledger cannot be opened or used (unreachable, unknown schema version)."""
