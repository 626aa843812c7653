"""The rows of a results table and what evaluating one gives: :class:`Method`, :class:`Evaluation`.

A :class:`Method` names one row family (a calibration, a baseline, a reference);
:func:`mvg_dask_lab.experiments.runner.run_experiment` evaluates it at every ``epsilon`` into an
:class:`Evaluation`. The literature's mechanisms (:mod:`mvg_dask_lab.experiments.literature`) see an
experiment only through :class:`RecordsExperiment`, so they depend on this module and not on the
runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import numpy as np

from mvg_dask.datasets import PaperDataset
from mvg_dask.noise import NoiseKey
from mvg_dask.privacy.calibration import Calibration

__all__ = [
    "Evaluation",
    "LiteratureEvaluator",
    "Method",
    "MethodKind",
    "RecordsExperiment",
    "baseline_methods",
    "binary_method",
    "reference_methods",
]

MethodKind = Literal["reference", "paper-mvg", "mgm", "exact", "baseline"]


@dataclass(frozen=True, kw_only=True)
class Method:
    """One row family of a results table.

    Attributes
    ----------
    key : str
        Stable identifier used in CSV files (e.g. ``"mvg-thm2"``, ``"gaussian-analytic"``).
    label : str
        Human-readable row label.
    kind : {"reference", "paper-mvg", "mgm", "exact", "baseline"}
        ``reference``: non-private and random guess (no epsilon); ``paper-mvg``: MVG with a
        calibration of the MVG paper; ``mgm``: MVG noise with a calibration of the MGM paper;
        ``exact``: MVG noise with this project's exact calibration; ``baseline``: a mechanism
        from the literature at the same ``(epsilon, delta)``.
    privacy : str
        The guarantee, e.g. ``"(ε, δ)"`` or ``"ε (δ = 0)"``; ``"-"`` for references.
    sweep_tau : bool
        True when the row uses the binary allocation and the best ``tau`` is reported.
    primary : bool
        True for the rows with the paper's primary design (binary allocation on the
        domain-knowledge directions); the targets compare these.
    calibration : str or None
        Calibration of the MVG noise (:mod:`mvg_dask.privacy.calibration`); ``None`` for
        references and baselines.
    description : str
        How the row is computed (calibration, noise type, sensitivity, directions).
    """

    key: str
    label: str
    kind: MethodKind
    privacy: str = "(ε, δ)"
    sweep_tau: bool = False
    primary: bool = False
    calibration: Calibration | None = None
    description: str = ""


def reference_methods(non_private: str, random_guess: str) -> tuple[Method, Method]:
    """The two reference rows (``non-private``, ``random-guess``) with their descriptions."""
    return (
        Method(
            key="non-private",
            label="Non-private",
            kind="reference",
            privacy="-",
            description=non_private,
        ),
        Method(
            key="random-guess",
            label="Random guess",
            kind="reference",
            privacy="-",
            description=random_guess,
        ),
    )


#: Label, kind and ``primary`` of the binary-allocation MVG row of each calibration.
_BINARY: Final[Mapping[Calibration, tuple[str, MethodKind, bool]]] = {
    "mvg-thm2": ("MVG, Thm. 2", "paper-mvg", True),
    "mvg-thm3": ("MVG, Thm. 3", "paper-mvg", True),
    "mgm-udn": ("MGM UDN", "mgm", False),
    "mgm-idn": ("MGM IDN", "mgm", False),
    "exact": ("MVG, exact", "exact", True),
}


def binary_method(calibration: Calibration, important: str, description: str) -> Method:
    """The MVG row of ``calibration`` with the binary allocation (best ``tau`` of the sweep).

    Parameters
    ----------
    calibration : str
        Calibration, also the row's key.
    important : str
        The domain-knowledge features, as printed in the label (e.g. ``"ALT, Y"``).
    description : str
        How the row is computed.

    Returns
    -------
    Method
        The row.
    """
    label, kind, primary = _BINARY[calibration]
    return Method(
        key=calibration,
        label=f"{label} (binary: {important})",
        kind=kind,
        sweep_tau=True,
        primary=primary,
        calibration=calibration,
        description=description,
    )


_CLASSIC = "sigma = sqrt(2 ln(1.25/δ)) s2 / ε (proof only for ε < 1)"
_ANALYTIC = "sigma = s2 / mu*(ε, δ) (Balle & Wang 2018)"


def baseline_methods(
    laplace: str, *, classic: str = _CLASSIC, analytic: str = _ANALYTIC
) -> tuple[Method, Method, Method]:
    """The three iid baseline rows (classic and analytic Gaussian, Laplace).

    Parameters
    ----------
    laplace : str
        Description of the Laplace row (its L1 sensitivity).
    classic, analytic : str, optional
        Descriptions of the Gaussian rows (by default the identity query's).

    Returns
    -------
    tuple of Method
        ``gaussian-classic``, ``gaussian-analytic``, ``laplace``.
    """
    return (
        Method(
            key="gaussian-classic",
            label="iid Gaussian, classic",
            kind="baseline",
            description=classic,
        ),
        Method(
            key="gaussian-analytic",
            label="iid Gaussian, analytic",
            kind="baseline",
            description=analytic,
        ),
        Method(
            key="laplace",
            label="iid Laplace",
            kind="baseline",
            privacy="ε (δ = 0)",
            description=laplace,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """Errors of one method at one setting over all trials.

    Attributes
    ----------
    errors : numpy.ndarray
        One error per trial, shape ``(trials,)``.
    noise_std : tuple of float or None
        Smallest and largest standard deviation of one noise entry on the query output (the
        median over trials when the plan differs per trial).
    implied_epsilon : float or None
        Smallest ``epsilon`` the whole release really has at the same ``delta`` (analytic
        Gaussian accounting of the whitened mechanism), or ``None`` where not applicable.
    valid : bool
        False when the calibration has no proof at this ``epsilon`` (classic Gaussian, eps >= 1).
    details : Mapping of str to float
        Extra method-specific numbers for the report (e.g. how many directions max-PNR starves).
    """

    errors: np.ndarray
    noise_std: tuple[float, float] | None = None
    implied_epsilon: float | None = None
    valid: bool = True
    details: Mapping[str, float] = field(default_factory=dict)


class RecordsExperiment(Protocol):
    """What a literature mechanism needs of an experiment: its data set and how its metric sees
    synthetic records and released vectors
    (:class:`~mvg_dask_lab.experiments.runner.PaperExperiment` provides it)."""

    name: str
    dataset: PaperDataset

    def _synthetic_errors(self, records: np.ndarray) -> np.ndarray:
        """The errors of synthetic record sets ``(T, m, d)`` (one record per row) as releases."""
        ...

    def _vector_errors(self, vectors: np.ndarray) -> np.ndarray:
        """The errors of released first principal components ``(T, d)``."""
        ...


class LiteratureEvaluator(Protocol):
    """Runs one literature row of an experiment at ``(epsilon, delta)`` for ``trials`` trials."""

    def __call__(
        self, exp: RecordsExperiment, epsilon: float, delta: float, trials: int, key: NoiseKey
    ) -> Evaluation:
        """The row's errors and the numbers the report explains them with."""
        ...
