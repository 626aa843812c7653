"""Post-processing estimators computed from a release and its (public) noise plan.

Post-processing never costs privacy: these functions use only the released values and the
plan, never the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mvg_dask.plan.noise_plan import NoisePlan


def identity_noise_gram(plan: NoisePlan) -> np.ndarray:
    """``E[Z Z^T]`` of the noise of an identity release (an ``m x n`` matrix ``Z``).

    Unimodal noise ``Z = B N`` with ``N`` an ``m x n`` iid ``N(0, 1)`` matrix:
    ``E[Z Z^T] = B E[N N^T] B^T = n Sigma`` (``E[N N^T] = n I_m``). Equi-modal noise
    ``Z = B N B^T`` (square queries): ``E[Z Z^T] = B E[N Psi N^T] B^T = tr(Psi) Sigma``.

    Parameters
    ----------
    plan : NoisePlan
        The plan of an identity release.

    Returns
    -------
    ndarray
        ``m x m``.
    """
    if plan.query.kind != "identity":
        raise ValueError(f"this needs the plan of an identity release, got {plan.query.kind!r}")
    Sigma = plan.row_cov
    n = plan.shape[1]
    psi = plan.col_cov
    trace = float(n) if psi is None else float(np.trace(psi))
    return np.asarray(trace * Sigma)


def covariance_from_identity(Y: Any, plan: NoisePlan) -> Any:
    """Unbiased estimate of ``X X^T / N`` from an identity release ``Y = X + Z``.

    ``E[Y Y^T] = X X^T + E[Z Z^T]`` (``E[Z] = 0``, ``Z`` independent of ``X``), so
    ``(Y Y^T - E[Z Z^T]) / N`` is unbiased, with ``E[Z Z^T] = N Sigma`` for unimodal noise
    (:func:`identity_noise_gram`): the estimate is ``Y Y^T / N - Sigma``. It is symmetric but
    may be indefinite.

    Parameters
    ----------
    Y : array_like
        The released ``m x N`` matrix (features x records); numpy or dask (``Y @ Y.T`` must be
        defined; a dask array gives a lazy result).
    plan : NoisePlan
        Its noise plan.

    Returns
    -------
    array_like
        ``m x m`` unbiased estimate of ``X X^T / N``.
    """
    noise_gram = identity_noise_gram(plan)
    m, n = plan.shape
    if tuple(Y.shape) != (m, n):
        raise ValueError(
            f"the release is {tuple(Y.shape)} but its plan describes an {m} x {n} identity query"
        )
    return (Y @ Y.T) / n - noise_gram / n
