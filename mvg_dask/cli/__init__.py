"""The ``mvg-dask`` command line (click).

One module per command family (:mod:`.calibrate`, :mod:`.release`, :mod:`.check`,
:mod:`.demo`, :mod:`.dataset`, :mod:`.ledger`, :mod:`.experiments`); they are registered here,
in one place, by name: a command's module is imported only when that command runs (or shows its
own help), so ``mvg-dask --help`` imports click alone. Heavy libraries (dask, distributed,
xarray, zarr) are imported inside the commands that need them, so ``mvg-dask calibrate`` imports
none of them. ``mvg-dask experiments`` is the lab's command (the extra ``[experiments]``):
:mod:`.experiments` finds it by name, or names the extra when it is missing.

Every mistake in the arguments ends with a one-line ``mvg-dask: error: ...`` on stderr and exit
code 2, never a traceback. The exit codes of a release are in ``mvg-dask release --help``.
"""

from __future__ import annotations

import importlib
import sys

import click

from mvg_dask._version import __version__

__all__ = ["COMMANDS", "app", "main"]

#: Every command: its module and its one-line help (what ``mvg-dask --help`` lists without
#: importing the module; a test checks it is the first sentence of the command's own help).
COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": (
        "mvg_dask.cli.calibrate",
        "Calibrate an MVG noise plan from metadata only (no data is read).",
    ),
    "check": (
        "mvg_dask.cli.check",
        "Count the NaN, infinite and out-of-domain values of the input of the YAML file SPEC.",
    ),
    "dataset": (
        "mvg_dask.cli.dataset",
        "Write a shipped paper dataset (scaled to its declared domain) to a Zarr store.",
    ),
    "demo": (
        "mvg_dask.cli.demo",
        "End-to-end releases of the shipped CTG data on the embedded LocalCluster.",
    ),
    "experiments": (
        "mvg_dask.cli.experiments",
        "Reproduce the MVG paper's experiments (Tables 3-5) with every calibration and baseline, "
        "or run the covariance benchmark against the modern DP covariance estimators.",
    ),
    "ledger": (
        "mvg_dask.cli.ledger",
        "Inspect, export and migrate a privacy ledger (SQLite file or PostgreSQL URL).",
    ),
    "release": ("mvg_dask.cli.release", "Run the release described by the YAML file SPEC."),
}


class _LazyGroup(click.Group):
    """A group whose commands are imported when they are resolved, not when listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        command = getattr(importlib.import_module(COMMANDS[cmd_name][0]), cmd_name)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    name="mvg-dask",
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(
    __version__, "--version", prog_name="mvg-dask", message="%(prog)s %(version)s"
)
def app() -> None:
    """Differentially private matrix-valued releases with the MVG mechanism."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mvg-dask`` script.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``, as the ``mvg-dask`` script: the process then
        runs this one command, and the objects its imports leave are frozen for the garbage
        collector, :data:`mvg_dask._startup.FREEZE_AFTER_IMPORTS`).

    Returns
    -------
    int
        Exit code: 0 on success (a release: released, or already complete); 1 refused, nothing
        charged; 2 invalid input or spec, nothing charged; 3 failed after the release's budget
        was charged.
    """
    if argv is None:  # the script (``mvg-dask``, ``python -m mvg_dask``): one command, then exit
        from mvg_dask import _startup

        _startup.FREEZE_AFTER_IMPORTS = True
    try:
        result = app.main(
            args=argv if argv is not None else sys.argv[1:],
            prog_name="mvg-dask",
            standalone_mode=False,
        )
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        message = " ".join(exc.format_message().split())
        click.echo(f"mvg-dask: error: {message}", err=True)
        return exc.exit_code if exc.exit_code else 2
    except click.exceptions.Abort:
        click.echo("mvg-dask: aborted", err=True)
        return 130
    return int(result) if isinstance(result, int) else 0
