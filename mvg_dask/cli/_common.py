"""What the commands share: failures as one-line errors with exit codes that say whether budget
was spent, logging set-up."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from mvg_dask.errors import DataError, MvgDaskError, charged_clause

#: The exit codes of a release (``mvg-dask release --help`` shows this text).
EXIT_CODES = """\b
Exit codes:
  0  released, or already complete (a retried release id)
  1  refused, nothing read or charged (output exists, budget exhausted
     or not the registered one, ledger unreadable, scheduler unreachable)
  2  invalid arguments, spec or input metadata; nothing charged
  3  failed after the budget was charged; the message says whether the
     release is pending (re-run the same release id to resume it) or was
     aborted after reading data (it stays charged)
"""


class RunFailed(click.ClickException):
    """A run was refused or failed before anything was charged (exit code 1)."""

    exit_code = 1


class ChargedRunFailed(click.ClickException):
    """A run failed after its budget was charged (exit code 3)."""

    exit_code = 3


#: The loggers of dask's machinery (not this package's).
DASK_LOGGERS = ("distributed", "tornado", "asyncio")


def quiet_dask_logs(verbose: bool = False) -> None:
    """dask's own lines kept off the terminal, for the rest of this process (``verbose``: from
    warnings up).

    A failed task is reported by the command in one line (:func:`fail`), so distributed's own
    report of it (``Compute Failed`` with the worker's traceback, logged at ``ERROR``) and its
    closed-connection tracebacks (at ``INFO``) never reach the terminal by default; ``--verbose``
    or ``MVG_DASK_DEBUG=1`` shows them from warnings up. distributed sets its loggers' levels
    from dask's ``logging`` settings when it is imported: before that the setting is made (a
    command refused early never imports distributed), after it the levels, of every logger of
    the hierarchy that has its own.
    """
    verbose = verbose or bool(os.environ.get("MVG_DASK_DEBUG"))
    level = logging.WARNING if verbose else logging.CRITICAL
    if "distributed" not in sys.modules:
        from mvg_dask._startup import imports_without_gc

        with imports_without_gc():
            import dask

        dask.config.set({"logging.distributed": logging.getLevelName(level).lower()})
    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in DASK_LOGGERS and logging.getLogger(name).level != logging.NOTSET:
            logging.getLogger(name).setLevel(level)
    for name in DASK_LOGGERS:
        logging.getLogger(name).setLevel(level)


def setup_logging(verbose: bool = False) -> None:
    """Progress lines on stderr; dask's own lines only with ``verbose`` (from warnings up)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s mvg_dask %(message)s", stream=sys.stderr
    )
    quiet_dask_logs(verbose)


def fail(exc: BaseException) -> None:
    """Turn an expected failure into a one-line click error.

    Exit 3 for a failure after the budget was charged (``exc.charged``), 2 for bad input
    (spec, arguments, input metadata) and 1 for any other refusal or failure; see
    :data:`EXIT_CODES`. Set ``MVG_DASK_DEBUG=1`` to get the traceback instead.
    """
    from mvg_dask.spec import SpecError

    if os.environ.get("MVG_DASK_DEBUG"):
        raise exc
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, MvgDaskError) and exc.charged:
        # a failure whose charge is known states it in its own message (the Python error's)
        stated = exc.charge is not None
        raise ChargedRunFailed(message if stated else f"{message} {charged_clause(exc)}") from None
    if isinstance(exc, (SpecError, DataError)):
        raise click.UsageError(str(exc)) from None
    if not isinstance(exc, MvgDaskError):
        message = f"{type(exc).__name__}: {message}"
    raise RunFailed(message) from None


def cluster_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a command that runs on a cluster: ``--cluster``, ``--cluster-spec`` and
    the TLS files (:func:`security_from`)."""
    options = [
        click.option(
            "--cluster",
            type=click.Choice(["local", "kubernetes"]),
            default="local",
            show_default=True,
            help="kubernetes: an ephemeral dask-kubernetes cluster, deleted at the end.",
        ),
        click.option(
            "--cluster-spec", type=click.Path(dir_okay=False), help="Options YAML for it."
        ),
        click.option("--tls-ca-file", type=click.Path(dir_okay=False), help="TLS CA bundle (PEM)."),
        click.option("--tls-cert", type=click.Path(dir_okay=False), help="TLS client certificate."),
        click.option("--tls-key", type=click.Path(dir_okay=False), help="TLS client key."),
        click.option(
            "--tls-dir", type=click.Path(file_okay=False), help="Dir with ca.crt/tls.crt/tls.key."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def security_from(
    tls_ca_file: str | None, tls_cert: str | None, tls_key: str | None, tls_dir: str | None
) -> Any:
    """The ``distributed.Security`` of the TLS options (``None`` when none is given; imports
    distributed only then)."""
    if all(f is None for f in (tls_ca_file, tls_cert, tls_key, tls_dir)):
        return None
    from mvg_dask.engine.security import make_security  # imports distributed

    return make_security(ca_file=tls_ca_file, cert=tls_cert, key=tls_key, tls_dir=tls_dir)


def start_logging(quiet: bool, verbose: bool = False) -> None:
    """With progress (not ``quiet``), this package's INFO lines; dask's own lines only with
    ``verbose`` (from warnings up: a failed task's worker traceback, for instance)."""
    if quiet:
        quiet_dask_logs(verbose)
    else:
        setup_logging(verbose)
