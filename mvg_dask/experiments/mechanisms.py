"""Noise for the experiments: MVG plans, the iid baselines, and how private each really is.

Thin helpers over :mod:`mvg_dask.plan`, :mod:`mvg_dask.noise` and :mod:`mvg_dask.baselines`
that draw the noise of many trials at once (vectorised over a leading trial axis) from one keyed
generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mvg_dask.baselines import IidMechanism
from mvg_dask.noise import NoiseKey
from mvg_dask.plan import AllocationSpec, Directions, NoisePlan, build_noise_plan
from mvg_dask.plan.domain import RecordDomain
from mvg_dask.plan.query import QuerySpec
from mvg_dask.privacy import analytic_gaussian_epsilon
from mvg_dask.privacy.calibration import Algorithm, Calibration

__all__ = [
    "binary_plan",
    "iid_implied_epsilon",
    "iid_noise",
    "plan_implied_epsilon",
    "plan_noise",
    "plan_std_range",
]


def binary_plan(
    query: QuerySpec,
    domain: RecordDomain,
    *,
    epsilon: float,
    delta: float,
    algorithm: Algorithm,
    calibration: Calibration,
    important: Sequence[int],
    tau: float,
) -> NoisePlan:
    """MVG plan with standard-basis directions and the paper's binary allocation.

    Parameters
    ----------
    query : QuerySpec
        The query (with the paper's declared ``s_2``/``gamma`` where reproduced).
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    epsilon, delta : float
        Privacy parameters.
    algorithm : {"unimodal", "equi-modal"}
        Alg. 1 or Alg. 2.
    calibration : str
        Calibration name.
    important : sequence of int
        The domain-knowledge features.
    tau : float
        Share of the precision budget given (equally) to the important features.

    Returns
    -------
    NoisePlan
        The plan.
    """
    m = query.shape[0]
    imp = tuple(int(i) for i in important)
    return build_noise_plan(
        query,
        domain,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,
        calibration=calibration,
        directions=Directions.standard(m, imp),
        allocation=AllocationSpec(strategy="binary", important=imp, share=tau),
    )


def plan_noise(plan: NoisePlan, key: NoiseKey, trials: int) -> np.ndarray:
    """Draw ``trials`` MVG noise matrices of a plan, as a release draws them.

    Trial ``t`` is :meth:`NoisePlan.draw` under ``key.derive(f"trial/{t}")``: the canonical tile
    grid and the affine sampler (MVG Lemma 7) of the release engine, the one sampling path.

    Parameters
    ----------
    plan : NoisePlan
        The plan.
    key : NoiseKey
        Keyed generator of this set of trials.
    trials : int
        Number of independent draws.

    Returns
    -------
    numpy.ndarray
        Shape ``(trials, m, n)``: ``B_Sigma N`` (unimodal) or ``B_Sigma N B_Sigma^T``
        (equi-modal) per trial.
    """
    return np.stack([plan.draw(key.derive(f"trial/{t}")) for t in range(trials)])


def plan_std_range(plan: NoisePlan) -> tuple[float, float]:
    """Smallest and largest standard deviation of one noise entry of a plan."""
    std = plan.released_entry_std()
    return float(np.min(std)), float(np.max(std))


def plan_implied_epsilon(plan: NoisePlan) -> float:
    """Smallest ``epsilon`` the whole plan (direction step included) has at its ``delta``.

    Both a DP-PCA step (Analyze Gauss, ratio ``step_mu``) and the MVG release (whitened, ratio
    ``Delta_M``) are Gaussian mechanisms, so together they are ``mu``-GDP with
    ``mu = hypot(Delta_M, step_mu)``; the answer is that mechanism's analytic epsilon at ``delta``.

    Parameters
    ----------
    plan : NoisePlan
        The plan.

    Returns
    -------
    float
        The implied epsilon (for a paper calibration far below its nominal epsilon).
    """
    mu = plan.mahalanobis_sensitivity
    if plan.split.step_mu is not None:
        mu = math.hypot(mu, plan.split.step_mu)
    return analytic_gaussian_epsilon(mu, plan.delta)


def iid_noise(mech: IidMechanism, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Draw iid baseline noise of the given shape (trial axis included)."""
    return mech.sample(rng, shape)


def iid_implied_epsilon(mech: IidMechanism) -> float:
    """Smallest ``epsilon`` of an iid baseline at its own ``delta``.

    Gaussian (classic or analytic): the analytic epsilon of ratio ``s_2 / sigma``; Laplace: its
    ``epsilon`` (pure DP, tight for the L1 sensitivity).

    Parameters
    ----------
    mech : IidMechanism
        The baseline.

    Returns
    -------
    float
        Epsilon.
    """
    if mech.name == "laplace":
        return mech.epsilon
    return analytic_gaussian_epsilon(mech.sensitivity / mech.scale, mech.delta)
