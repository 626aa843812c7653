"""Precision allocation strategies ``theta`` (``theta_i > 0``, ``sum theta <= 1``).

An allocation says which share of a calibration's precision budget each noise direction gets
(MVG Alg. 1/2 step 3: ``p_i = theta_i P``). ``kind`` tells what the budget bounds: ``"squared"``
(MVG: ``sum 1/v_i^2``) or ``"linear"`` (MGM and ``exact``: ``sum 1/v_i``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

AllocationStrategy = Literal["uniform", "scale-aware", "binary", "custom", "max-pnr", "mgm-optimal"]
ALLOCATIONS: tuple[AllocationStrategy, ...] = (
    "uniform",
    "scale-aware",
    "binary",
    "custom",
    "max-pnr",
    "mgm-optimal",
)
_SUM_TOL = 1e-9


def check_allocation(theta: Sequence[float] | np.ndarray, m: int) -> np.ndarray:
    """Validate an allocation and return it as a float array.

    Parameters
    ----------
    theta : array_like
        One positive share per direction.
    m : int
        Number of directions.

    Returns
    -------
    ndarray
        ``theta`` as float64.

    Raises
    ------
    ValueError
        Wrong length, a share that is not finite and positive, or a sum above 1.
    """
    t = np.asarray(theta, dtype=np.float64).reshape(-1)
    if t.shape != (m,):
        raise ValueError(f"allocation has {t.size} shares but the query has {m} directions")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError(
            "every allocation share must be finite and > 0 (a direction with no precision "
            "would need infinite noise)"
        )
    total = float(t.sum())
    if total > 1.0 + _SUM_TOL:
        raise ValueError(
            f"allocation shares sum to {total:.6g} > 1: that would overspend the precision budget"
        )
    return t


def uniform(m: int) -> np.ndarray:
    """The uniform allocation ``theta_i = 1/m``.

    Parameters
    ----------
    m : int
        Number of directions.

    Returns
    -------
    ndarray
        ``theta``.
    """
    if m < 1:
        raise ValueError(f"need at least one direction, got m={m}")
    return np.full(m, 1.0 / m)


def scale_aware(scales: Sequence[float] | np.ndarray, kind: str) -> np.ndarray:
    """The allocation whose noise variances are proportional to ``scales**2``.

    With the standard directions this is ``Sigma`` proportional to ``diag(a^2)``: the noise of
    the query of the rescaled records ``x_i / a_i`` with one precision for every direction,
    mapped back to the records' units. Two-sided noise (equi-modal, symmetric) on entry
    ``(i, j)`` then has a standard deviation proportional to ``a_i a_j``, one-sided noise
    (unimodal) on row ``i`` to ``a_i`` (docs/bounds.md, "Scale-aware allocation").

    Parameters
    ----------
    scales : array_like
        ``a_i > 0``: the public scale of each direction (a feature's largest absolute value, or
        half its width about the box's centre).
    kind : {"squared", "linear"}
        What the calibration's budget bounds.

    Returns
    -------
    ndarray
        ``theta``, summing to 1.
    """
    a = np.asarray(scales, dtype=np.float64).reshape(-1)
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError("scale-aware allocation needs one finite, positive scale per direction")
    # precisions 1 / a^2, scaled by the largest scale first so that no square under- or overflows
    q = (float(np.max(a)) / a) ** 2
    return _shape_to_theta(q, kind)


def binary(m: int, important: Sequence[int], share: float) -> np.ndarray:
    """Binary allocation: ``tau`` split over the important directions, the rest over the others.

    Parameters
    ----------
    m : int
        Number of directions.
    important : sequence of int
        Indices (0-based) of the important directions.
    share : float
        ``tau`` in (0, 1); the MVG paper sweeps ``{0.55, ..., 0.95}``.

    Returns
    -------
    ndarray
        ``theta``.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Sec. 7 and 8 (binary allocation strategy).
    """
    idx = sorted({int(i) for i in important})
    if not idx:
        raise ValueError("binary allocation needs at least one important direction")
    bad = [i for i in idx if not 0 <= i < m]
    if bad:
        raise ValueError(
            f"important index {bad[0]} is out of range for {m} directions (0..{m - 1})"
        )
    if len(idx) != len(list(important)):
        raise ValueError(f"important indices repeat: {list(important)}")
    if not 0 < share <= 1:
        raise ValueError(f"binary share must lie in (0, 1], got {share!r}")
    k = len(idx)
    if k == m:
        return np.full(m, share / m)
    if share == 1:
        raise ValueError(
            "binary share 1 leaves no precision for the other directions; use a share below 1"
        )
    theta = np.full(m, (1.0 - share) / (m - k))
    theta[idx] = share / k
    return theta


def _shape_to_theta(inverse_variances: np.ndarray, kind: str) -> np.ndarray:
    """Allocation whose variances are proportional to ``1/inverse_variances`` under ``kind``."""
    q = np.asarray(inverse_variances, dtype=np.float64)
    p = q**2 if kind == "squared" else q
    return np.asarray(p / p.sum())


def max_pnr(
    eigenvalues: Sequence[float] | np.ndarray,
    *,
    total_precision: float,
    kind: str,
    floor: float = 0.1,
) -> np.ndarray:
    """Allocation that maximises the power-to-noise ratio (water filling).

    Solves ``max prod_i (q_i + 1/lambda_i)`` subject to ``sum_i q_i = T`` with ``q_i >= 0`` the
    inverse noise variances (the paper's Problem 2, the L1 relaxation of the budget):
    ``q_i = (c - 1/lambda_i)^+``. Thm. 7 gives a direction the water level does not reach no
    precision at all, i.e. infinite noise; a release cannot add infinite noise, and with the
    small budgets of strong privacy the water often reaches only the top direction. So every
    direction keeps at least ``floor`` times its uniform share ``T/m`` (0.1 by default; 0 gives
    the pure water-filling shape up to a 1e-9 guard). The resulting shape is then expressed as an
    allocation of the calibration's own budget (so the whole budget, not its L1 relaxation, is
    used: a uniform rescaling of ``q`` that keeps the shape).

    Parameters
    ----------
    eigenvalues : array_like
        ``lambda_i``: the (differentially private) variance of the query along each direction.
    total_precision : float
        ``T``, the linear precision the water level is computed for.
    kind : {"squared", "linear"}
        What the calibration's budget bounds.
    floor : float, default 0.1
        Minimum precision of a direction, as a fraction of its uniform share ``T/m``.

    Returns
    -------
    ndarray
        ``theta``, summing to 1.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Sec. 7.2, Theorem 7 (water filling, Eq. 25).
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    if lam.ndim != 1 or lam.size == 0:
        raise ValueError("max-pnr needs one eigenvalue per direction")
    if not np.all(np.isfinite(lam)):
        raise ValueError("max-pnr eigenvalues must be finite")
    if not total_precision > 0:
        raise ValueError(f"total_precision must be > 0, got {total_precision!r}")
    # non-positive (noisy) eigenvalues carry no power: treat as tiny
    inv = 1.0 / np.maximum(lam, np.finfo(float).tiny ** 0.5)
    order = np.argsort(inv)
    s = np.sort(inv)
    q = np.zeros_like(lam)
    for k in range(s.size, 0, -1):
        c = (total_precision + s[:k].sum()) / k
        if c > s[k - 1]:
            q[order[:k]] = c - s[:k]
            break
    q = np.maximum(q, max(floor, 1e-9) * total_precision / lam.size)
    return _shape_to_theta(q, kind)


def mgm_optimal(
    utility: np.ndarray,
    directions: np.ndarray,
    *,
    kind: str,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Closed-form allocation minimising ``E||W_1 Z||_F^2`` for a linear utility subspace.

    With ``P_i = ||W_1 w_i||^2`` (``w_i`` the i-th noise direction), MGM's KKT solution gives
    inverse variances ``q_i`` proportional to ``sqrt(P_i)`` for a linear budget
    ``sum q_i <= B``. The same KKT conditions for MVG's squared budget ``sum q_i^2 <= P`` give
    ``q_i`` proportional to ``P_i^{1/3}``; for a weighted linear budget ``sum q_i c_i <= B``
    (``exact`` with the standard basis, ``c_i = w_i^2``) they give ``sqrt(P_i / c_i)``.

    Note: MGM's Eq. (25) prints ``sqrt(P_1k P_2l B)`` in the denominator; the KKT solution has
    ``B`` there (with ``sqrt(B)`` the product of traces equals ``sqrt(B)``, which exceeds ``B``
    whenever ``B < 1`` and would break the privacy constraint). We use the derivation.

    Parameters
    ----------
    utility : ndarray
        ``W_1``, shape ``(m', m)``: the utility subspace ``Y = W_1 f(X)``.
    directions : ndarray
        Noise directions, ``m x m`` with orthonormal columns.
    kind : {"squared", "linear"}
        What the calibration's budget bounds.
    weights : ndarray, optional
        ``c_i`` of a weighted linear budget.

    Returns
    -------
    ndarray
        ``theta`` summing to 1.

    References
    ----------
    .. [1] Yang et al., "Matrix Gaussian Mechanisms for Differentially-Private Learning",
       Sec. 6, Eq. (22)-(26), Algorithm 1.
    """
    W1 = np.atleast_2d(np.asarray(utility, dtype=np.float64))
    W = np.asarray(directions, dtype=np.float64)
    if W1.shape[1] != W.shape[0]:
        raise ValueError(
            f"utility matrix has {W1.shape[1]} columns but the query has {W.shape[0]} rows"
        )
    P = np.sum((W1 @ W) ** 2, axis=0)
    if np.any(P <= 0):
        # a direction the utility never sees still needs finite noise: give it a tiny weight
        P = np.maximum(P, 1e-12 * float(P.max()) if P.max() > 0 else 1.0)
    if weights is not None:
        c = np.asarray(weights, dtype=np.float64)
        q = np.sqrt(P / c)
        return np.asarray(q / float(np.sum(q)))
    q = P ** (1.0 / 3.0) if kind == "squared" else np.sqrt(P)
    return _shape_to_theta(q, kind)
