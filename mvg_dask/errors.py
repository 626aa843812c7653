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
    """

    charged: bool = False
    release_id: str | None = None
    pending: bool = True


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
