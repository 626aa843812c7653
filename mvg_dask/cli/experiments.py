"""``mvg-dask experiments``: the paper's experiments.

The command itself lives with the experiments, in :mod:`mvg_dask.experiments.cli`; this module
only hands it to the command line's registration in :mod:`mvg_dask.cli`.
"""

from __future__ import annotations

from mvg_dask.experiments.cli import experiments

__all__ = ["experiments"]
