"""Compare two runs of an experiment row by row: is the difference within the trials' error?

Used to check that lattice noise (``noise="lattice"``, docs/lattice.md) leaves the experiments'
utility unchanged: the same experiment run with float and with lattice noise, the same seed, and
every summary row (method x epsilon) compared by the difference of its means against the
combined half-width ``hypot(h_a, h_b)`` of the two rows' confidence intervals (the half-width of
the difference's interval for independent rows of equal size, up to the Student quantile's
degrees of freedom).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mvg_dask_lab.experiments.runner import CONFIDENCE, ExperimentResult, confidence_half_width

__all__ = ["RowComparison", "compare_results"]


@dataclass(frozen=True, kw_only=True)
class RowComparison:
    """One row (method x epsilon) of two runs.

    Attributes
    ----------
    method : str
        Method key.
    epsilon : float or None
        Privacy parameter (``None`` for the reference rows).
    mean_a, mean_b : float
        Mean error of the row in each run.
    half_width_a, half_width_b : float
        Half-widths of the rows' confidence intervals of the mean.
    """

    method: str
    epsilon: float | None
    mean_a: float
    mean_b: float
    half_width_a: float
    half_width_b: float

    @property
    def difference(self) -> float:
        """``mean_b - mean_a``."""
        return self.mean_b - self.mean_a

    @property
    def half_width(self) -> float:
        """The combined half-width ``hypot(h_a, h_b)``."""
        return math.hypot(self.half_width_a, self.half_width_b)

    @property
    def ratio(self) -> float:
        """``|difference| / half_width`` (0 for equal means, ``inf`` for a difference with no
        spread)."""
        if self.difference == 0.0:
            return 0.0
        return abs(self.difference) / self.half_width if self.half_width > 0 else math.inf

    @property
    def agrees(self) -> bool:
        """True when the means differ by at most the combined half-width."""
        return self.ratio <= 1.0


def compare_results(
    a: ExperimentResult, b: ExperimentResult, *, confidence: float = CONFIDENCE
) -> tuple[RowComparison, ...]:
    """Compare every summary row of two runs of the same experiment.

    Parameters
    ----------
    a, b : ExperimentResult
        The runs (same experiment, methods and epsilon grid; e.g. float and lattice noise).
    confidence : float, default 0.95
        Confidence level of the rows' intervals (a smaller ``1 - confidence`` for a test that
        corrects for the number of rows).

    Returns
    -------
    tuple of RowComparison
        In ``a``'s row order.

    Raises
    ------
    ValueError
        If the runs are not of the same experiment and rows.
    """
    if a.name != b.name or len(a.rows) != len(b.rows):
        raise ValueError(f"cannot compare runs of {a.name!r} and {b.name!r}")
    out = []
    for ra in a.rows:
        rb = b.row(ra.method.key, ra.epsilon)
        out.append(
            RowComparison(
                method=ra.method.key,
                epsilon=ra.epsilon,
                mean_a=float(np.mean(ra.errors)),
                mean_b=float(np.mean(rb.errors)),
                half_width_a=confidence_half_width(ra.errors, confidence),
                half_width_b=confidence_half_width(rb.errors, confidence),
            )
        )
    return tuple(out)
