"""``mvg-dask experiments``: the paper's experiments and the covariance benchmark.

The command lives in the lab, a distribution of its own (:mod:`mvg_dask_lab`, the extra
``mvg-dask[experiments]``), in ``mvg_dask_lab.experiments.cli``. The core never imports the lab
(an import contract): this module finds it by name, only when the command is resolved. Without
the extra, ``mvg-dask experiments ...`` ends with one line naming it, exit code 2.
"""

from __future__ import annotations

import importlib

import click

__all__ = ["LAB_COMMAND", "MISSING_EXTRA", "experiments_command"]

#: Where the command lives: the lab's module (found by name, never imported statically).
LAB_COMMAND = "mvg_dask_lab.experiments.cli"

#: The one line ``mvg-dask experiments`` prints (after ``mvg-dask: error:``) without the lab.
MISSING_EXTRA = (
    "`mvg-dask experiments` needs the extra: pip install 'mvg-dask[experiments]' "
    "(from a checkout, make installs it: lab/)"
)


@click.command(
    name="experiments",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    help="Reproduce the MVG paper's experiments (Tables 3-5) with every calibration and "
    "baseline, or run the covariance benchmark against the modern DP covariance estimators.",
)
def _missing_extra() -> None:
    """Stands in for the command when the lab is not installed: one line naming the extra."""
    raise click.UsageError(MISSING_EXTRA)


def experiments_command() -> click.Command:
    """The ``mvg-dask experiments`` command: the lab's, or one naming the extra it needs.

    Returns
    -------
    click.Command
        ``mvg_dask_lab.experiments.cli.experiments`` if the lab is installed; otherwise a
        command that takes any arguments and fails with :data:`MISSING_EXTRA`.
    """
    try:
        module = importlib.import_module(LAB_COMMAND)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "mvg_dask_lab":
            raise  # the lab is there but broken: its own error, not "install the extra"
        return _missing_extra
    command = module.experiments
    assert isinstance(command, click.Command)
    return command


def __getattr__(name: str) -> click.Command:
    # ``mvg_dask.cli`` resolves a command as an attribute of its module, when it runs
    if name == "experiments":
        return experiments_command()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
