"""Reproduction of the MVG paper's three experiments (Sec. 8-9, Tables 3-5).

=================  ==========================================  ==============================
name               experiment                                  module
=================  ==========================================  ==============================
``regression``     Exp. I: Liver, identity query, KRR, RMSE    :mod:`.regression`
``first-pc``       Exp. II: Movement, covariance query, Δρ     :mod:`.first_pc`
``covariance``     Exp. III: CTG, identity query, RSS          :mod:`.covariance`
=================  ==========================================  ==============================

Each experiment runs every method (non-private, random guess, MVG with the paper's
calibrations, MGM, MVG with ``exact``, and the paper's four basic mechanisms: iid Gaussian and
Laplace, the JL transform and the exponential mechanism, :mod:`.literature`) over
``epsilon in {0.1, 0.3, 1, 3}`` at ``delta = 1/N`` (:func:`run_experiment`); :mod:`.report` writes
the CSV files, Markdown tables and plots, :mod:`.document` the results document from
``templates/``; :mod:`.cli` is the ``mvg-dask experiments`` command.

Examples
--------
>>> from mvg_dask_lab.experiments import EXPERIMENTS, run_experiment
>>> result = run_experiment(EXPERIMENTS["first-pc"](), trials=2, seed=0, epsilons=(1.0,))
>>> result.row("non-private").mean
0.0
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Protocol

from mvg_dask.plan.lattice import NoiseKind
from mvg_dask_lab.experiments.covariance import CovarianceExperiment
from mvg_dask_lab.experiments.first_pc import FirstPCExperiment
from mvg_dask_lab.experiments.methods import Evaluation, Method
from mvg_dask_lab.experiments.regression import RegressionExperiment
from mvg_dask_lab.experiments.runner import (
    EPSILONS,
    TAUS,
    Experiment,
    ExperimentResult,
    Row,
    run_experiment,
)

__all__ = [
    "EPSILONS",
    "EXPERIMENTS",
    "TAUS",
    "CovarianceExperiment",
    "Evaluation",
    "Experiment",
    "ExperimentFactory",
    "ExperimentResult",
    "FirstPCExperiment",
    "Method",
    "RegressionExperiment",
    "Row",
    "run_experiment",
]


class ExperimentFactory(Protocol):
    """Makes an experiment with its default data set; ``noise`` is the MVG rows' noise."""

    def __call__(self, *, noise: NoiseKind = "float") -> Experiment:
        """The experiment."""
        ...


#: Experiment factories by name, in the paper's order.
EXPERIMENTS: Final[Mapping[str, ExperimentFactory]] = MappingProxyType(
    {
        "regression": RegressionExperiment,
        "first-pc": FirstPCExperiment,
        "covariance": CovarianceExperiment,
    }
)
