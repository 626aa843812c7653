"""Sensitivity bounds from a declared record domain (never from the data).

Two record domains are supported: a per-feature box ``[lower_i, upper_i]`` and an L2 ball
``||x|| <= C``. ``P`` below is a precision matrix ``Sigma^-1`` (symmetric positive definite).
All bounds are valid *upper* bounds; the tests check each against a brute-force oracle.
"""

from __future__ import annotations

import numpy as np


def lambda_max(P: np.ndarray) -> float:
    """Largest eigenvalue of a symmetric matrix.

    Parameters
    ----------
    P : ndarray
        Symmetric ``m x m`` matrix.

    Returns
    -------
    float
        ``lambda_max(P)``.
    """
    return float(np.linalg.eigvalsh(P)[-1])


def abs_quadratic_form(P: np.ndarray, v: np.ndarray) -> float:
    """``sum_ij |P_ij| v_i v_j`` for a non-negative vector ``v``.

    Parameters
    ----------
    P : ndarray
        ``m x m`` matrix.
    v : ndarray
        Non-negative vector of length ``m``.

    Returns
    -------
    float
        An upper bound of ``x^T P x`` over all ``|x_i| <= v_i``.
    """
    v = np.asarray(v, dtype=np.float64)
    return float(v @ np.abs(P) @ v)


def sup_quadratic_box(P: np.ndarray, half_widths: np.ndarray) -> float:
    """Upper bound of ``x^T P x`` over ``|x_i| <= h_i``.

    ``min(sum_ij |P_ij| h_i h_j, lambda_max(P) ||h||^2)``; exact when ``P`` is diagonal.

    Parameters
    ----------
    P : ndarray
        Symmetric positive semi-definite ``m x m`` matrix.
    half_widths : ndarray
        ``h``, non-negative.

    Returns
    -------
    float
        The bound.
    """
    h = np.asarray(half_widths, dtype=np.float64)
    return min(abs_quadratic_form(P, h), lambda_max(P) * float(h @ h))


def box_abs_max(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``a_i = max(|lower_i|, |upper_i|)``: the largest magnitude of feature ``i`` in the box.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.

    Returns
    -------
    ndarray
        ``a``.
    """
    return np.maximum(np.abs(np.asarray(lower, float)), np.abs(np.asarray(upper, float)))


def box_entry_range(lower: np.ndarray, upper: np.ndarray) -> tuple[float, float]:
    """Range of one entry of a record in a box: ``[min lower, max upper]``.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.

    Returns
    -------
    tuple of float
        ``(a, b)``.
    """
    return float(np.min(lower)), float(np.max(upper))


def box_outer_entry_range(lower: np.ndarray, upper: np.ndarray) -> tuple[float, float]:
    """Range of an entry of ``x x^T`` (hence of ``X X^T / N``) for ``x`` in a box.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.

    Returns
    -------
    tuple of float
        ``(a, b)`` with ``a <= x_i x_j <= b`` for all ``i, j`` and all ``x`` in the box.
    """
    lo = np.asarray(lower, float)
    hi = np.asarray(upper, float)
    corners = np.stack(
        [np.outer(lo, lo), np.outer(lo, hi), np.outer(hi, lo), np.outer(hi, hi)], axis=0
    )
    low = float(corners.min())
    # the diagonal x_i^2 is >= 0 even when the corner products are negative
    return low, float(corners.max())
