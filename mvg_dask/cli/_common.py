"""What the commands share: failures as one-line errors, logging set-up."""

from __future__ import annotations

import logging
import os
import sys

import click

from mvg_dask.errors import DataError, MvgDaskError


class RunFailed(click.ClickException):
    """A run failed for a reason other than bad input (exit code 1)."""

    exit_code = 1


class ChargedRunFailed(RunFailed):
    """A release failed after its budget was charged: it is pending (exit code 3)."""

    exit_code = 3


def setup_logging() -> None:
    """Progress lines on stderr; dask's own chatter only from warnings up."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s mvg_dask %(message)s", stream=sys.stderr
    )
    for noisy in ("distributed", "tornado", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(exc: BaseException) -> None:
    """Turn an expected failure into a one-line click error: exit 2 for bad input, 3 for a
    failure after the budget was charged (the release is pending; the message says so and how to
    resume), 1 else.

    Set ``MVG_DASK_DEBUG=1`` to get the traceback instead.
    """
    from mvg_dask.spec import SpecError

    if os.environ.get("MVG_DASK_DEBUG"):
        raise exc
    if isinstance(exc, (SpecError, DataError)):
        raise click.UsageError(str(exc)) from None
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not isinstance(exc, MvgDaskError):
        message = f"{type(exc).__name__}: {message}"
    if getattr(exc, "charged", False):
        rid = getattr(exc, "release_id", None)
        release = f"release {rid} pending" if rid else "release pending"
        message += f" (budget charged; {release}: re-run the same release id to resume)"
        raise ChargedRunFailed(message) from None
    raise RunFailed(message) from None
