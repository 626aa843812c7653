"""The iid additive-noise baselines, on the same query and ``(epsilon, delta)`` as MVG.

* iid Gaussian, classic calibration ``sigma = sqrt(2 ln(1.25/delta)) s_2 / eps`` (Dwork & Roth
  Thm. A.1; a proof exists only for ``eps < 1``, so :attr:`IidMechanism.valid` is False above),
* iid Gaussian, analytic calibration ``sigma = s_2 / mu*(eps, delta)`` (Balle & Wang 2018),
* iid Laplace, ``b = s_1 / eps`` (pure ``eps``-DP).

Noise comes from an explicit generator (in production the keyed CSPRNG).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.queries import MatrixQuery
from mvg_dask.privacy import calibration as cal

Baseline = Literal["gaussian-classic", "gaussian-analytic", "laplace"]
BASELINES: tuple[Baseline, ...] = ("gaussian-classic", "gaussian-analytic", "laplace")


@dataclass(frozen=True, kw_only=True)
class IidMechanism:
    """An iid additive-noise baseline.

    Attributes
    ----------
    name : str
        Baseline name.
    scale : float
        Standard deviation (Gaussian) or Laplace scale ``b``.
    sensitivity : float
        ``s_2`` (Gaussian) or ``s_1`` (Laplace).
    epsilon, delta : float
        Privacy parameters (``delta = 0`` for Laplace).
    valid : bool
        False for the classic Gaussian calibration at ``epsilon >= 1``.
    """

    name: Baseline
    scale: float
    sensitivity: float
    epsilon: float
    delta: float
    valid: bool = True

    @property
    def entry_std(self) -> float:
        """Standard deviation of one noise entry."""
        return self.scale * (np.sqrt(2.0) if self.name == "laplace" else 1.0)

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Draw the noise.

        Parameters
        ----------
        rng : numpy.random.Generator
            Explicit generator.
        shape : tuple of int
            Output shape.

        Returns
        -------
        ndarray
            Noise.
        """
        if self.name == "laplace":
            return rng.laplace(0.0, self.scale, size=shape)
        return rng.standard_normal(shape) * self.scale


def iid_baseline(
    name: Baseline,
    query: MatrixQuery,
    domain: RecordDomain,
    *,
    epsilon: float,
    delta: float,
    neighbours: Neighbours = "replace-one",
) -> IidMechanism:
    """Calibrate an iid baseline for a query.

    Parameters
    ----------
    name : {"gaussian-classic", "gaussian-analytic", "laplace"}
        Baseline.
    query : MatrixQuery
        Query (its ``s_2``/``s_1`` come from the domain unless declared).
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    epsilon, delta : float
        Privacy parameters (``delta`` unused by Laplace).
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.

    Returns
    -------
    IidMechanism
        The calibrated baseline.
    """
    cal._check_privacy(epsilon, delta)
    if name == "gaussian-classic":
        s2 = query.l2_sensitivity(domain, neighbours)
        return IidMechanism(
            name=name,
            scale=cal.classic_gaussian_sigma(epsilon, delta, s2),
            sensitivity=s2,
            epsilon=epsilon,
            delta=delta,
            valid=epsilon < 1,
        )
    if name == "gaussian-analytic":
        s2 = query.l2_sensitivity(domain, neighbours)
        return IidMechanism(
            name=name,
            scale=s2 / cal.analytic_gaussian_mu(epsilon, delta),
            sensitivity=s2,
            epsilon=epsilon,
            delta=delta,
        )
    if name == "laplace":
        s1 = query.l1_sensitivity(domain, neighbours)
        return IidMechanism(
            name=name, scale=s1 / epsilon, sensitivity=s1, epsilon=epsilon, delta=0.0
        )
    raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {name!r}")
