"""The ``mvg-dask`` command line (click).

One module per command family (:mod:`.calibrate`, :mod:`.release`, :mod:`.demo`,
:mod:`.dataset`, :mod:`.ledger`, :mod:`.experiments`); they are registered here, in one place.
Heavy libraries (dask, distributed, xarray, zarr) are imported inside the commands that need
them, so ``mvg-dask --help`` and ``mvg-dask calibrate`` import none of them.

Every mistake in the arguments ends with a one-line ``mvg-dask: error: ...`` on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import sys

import click

from mvg_dask._version import __version__
from mvg_dask.cli.calibrate import calibrate
from mvg_dask.cli.dataset import dataset
from mvg_dask.cli.demo import demo
from mvg_dask.cli.experiments import experiments
from mvg_dask.cli.ledger import ledger
from mvg_dask.cli.release import release

__all__ = ["app", "main"]


@click.group(
    name="mvg-dask",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(
    __version__, "--version", prog_name="mvg-dask", message="%(prog)s %(version)s"
)
def app() -> None:
    """Differentially private matrix-valued releases with the MVG mechanism."""


app.add_command(calibrate)
app.add_command(release)
app.add_command(demo)
app.add_command(dataset)
app.add_command(ledger)
app.add_command(experiments)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mvg-dask`` script.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit code: 0 on success, 2 for invalid input, 1 for a failed run.
    """
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
