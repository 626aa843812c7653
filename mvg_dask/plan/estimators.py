"""Unbiased estimators from released values (post-processing: no privacy cost).

An identity release publishes ``Y = X + Z`` with ``Z = B_Sigma N`` (Alg. 1, unimodal noise):
the ``n`` columns of ``Z`` are independent ``N(0, Sigma)``. Hence ``E[Z Z^T] = n Sigma`` and
``E[Y Y^T] = X X^T + n Sigma`` (the cross terms have mean zero): the plug-in covariance
``Y Y^T / n`` is biased by ``Sigma``, which the plan knows exactly.
"""

from __future__ import annotations

import numpy as np

from mvg_dask.plan.noise_plan import NoisePlan

__all__ = ["covariance_from_identity"]


def covariance_from_identity(Y: np.ndarray, plan: NoisePlan) -> np.ndarray:
    """Unbiased estimate of ``X X^T / n`` from an identity release ``Y`` (``m x n``).

    Parameters
    ----------
    Y : numpy.ndarray
        The released ``m x n`` matrix (features x records).
    plan : NoisePlan
        The noise plan the release was made with (unimodal noise).

    Returns
    -------
    numpy.ndarray
        ``(Y Y^T - n Sigma) / n`` with ``Sigma = plan.row_cov``: symmetric, ``m x m``; it is
        not necessarily positive semi-definite (an unbiased estimator cannot be).

    Raises
    ------
    ValueError
        If the plan is not a unimodal identity plan or ``Y`` does not have its shape.

    References
    ----------
    .. [MVG] T. Chanyaswad, A. Dytso, H. V. Poor, P. Mittal. MVG mechanism: differential
       privacy under matrix-valued query. CCS 2018, Alg. 1 (unimodal directional noise).
    """
    if plan.query.kind != "identity" or plan.algorithm != "unimodal":
        raise ValueError(
            "covariance_from_identity needs an identity release with unimodal noise, got a "
            f"{plan.query.kind} query with {plan.algorithm} noise"
        )
    Y = np.asarray(Y, dtype=np.float64)
    m = plan.row_cov.shape[0]
    if Y.ndim != 2 or Y.shape[0] != m:
        raise ValueError(f"Y must have shape ({m}, n) (features x records), got {Y.shape}")
    n = Y.shape[1]
    return np.asarray((Y @ Y.T - n * plan.row_cov) / n)
