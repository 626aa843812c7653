"""The ratio ``r = b^2 / a^2`` of symmetric noise ``A S A^T`` that minimises the expected
squared error (docs/bounds.md, Sec. 4 and 10), chosen from metadata alone."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mvg_dask.plan.covariance import LowRank
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.queries import MatrixQuery
from mvg_dask.privacy import allocation as alloc

__all__ = ["best_symmetric_ratio", "symmetric_error_factors"]


def symmetric_error_factors(theta: np.ndarray, ratios: Sequence[float]) -> list[float]:
    """``E ||B S B^T||_F^2`` for precisions ``theta`` (``v = 1 / theta``) and each ratio ``r``:
    ``sum v_i^2 + r sum_{i != j} v_i v_j`` (as ``||B S B^T||_F = ||diag(sqrt v) S diag(sqrt
    v)||_F``)."""
    v = 1.0 / np.asarray(theta, dtype=np.float64)
    sq = float(v @ v)
    cross = float(v.sum()) ** 2 - sq
    return [sq + float(r) * cross for r in ratios]


def best_symmetric_ratio(
    query: MatrixQuery,
    domain: RecordDomain,
    neighbours: Neighbours,
    directions: Directions | np.ndarray,
    *,
    theta: np.ndarray | None = None,
) -> float:
    """The ratio ``r = b^2 / a^2`` that minimises the expected squared error of symmetric noise.

    With a uniform allocation (precisions ``c``), ``Delta_M(r) = c Delta_1(r)`` and the noise's
    expected squared Frobenius norm is ``(m + r m (m - 1)) / c^2``; calibrated to
    ``Delta_M = mu`` it is ``Delta_1(r)^2 (m + r m (m - 1)) / mu^2``. This is minimised over a
    fixed grid of ``r`` in ``[1/2, 2 (m + 1)]`` (log-spaced, plus the closed-form optima
    ``1/2``, ``1/sqrt(2)`` and ``(m + 1)/2`` of docs/bounds.md Sec. 4). Metadata only.

    Parameters
    ----------
    query : MatrixQuery
        A symmetric query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    directions : Directions or ndarray
        Directions (a matrix ``W`` is wrapped as given).
    theta : ndarray, optional
        The allocation (low-rank directions: their uniform or binary one), for which the error
        ``r ((tr Sigma)^2 + tr Sigma^2) + (1 - 2r) sum_i Sigma_ii^2`` of ``B S B``, ``B =
        Sigma^(1/2)``, is minimised (docs/bounds.md, Sec. 10); uniform by default.

    Returns
    -------
    float
        ``r``.
    """
    dirs = directions if isinstance(directions, Directions) else Directions("matrix", directions)
    m = dirs.dim
    uniform = alloc.uniform(m)
    cov = dirs.covariance(1.0 / uniform)
    if theta is not None and isinstance(cov, LowRank):
        shares = np.asarray(theta, float)
        return _best_low_rank_ratio(query, domain, neighbours, LowRank(cov.basis, 1.0 / shares))
    grid = _ratio_grid(m)
    # uniform precisions: Sigma^-1 = c I whatever the directions unless they are dense, and
    # B = Sigma^(1/2) of a low-rank set is diagonal too
    precision, basis = cov.shares_precision(uniform)
    d1s = query.mahalanobis_sensitivities(
        domain, neighbours, precision, directions=basis, ratios=list(grid)
    )
    best_r, best_err = 0.5, math.inf
    factors = symmetric_error_factors(uniform, list(grid))
    for r, d1, factor in zip(grid, d1s, factors, strict=True):
        err = d1 * d1 * factor
        if err < best_err * (1.0 - 1e-12):
            best_r, best_err = float(r), err
    return best_r


def _ratio_grid(m: int) -> np.ndarray:
    """The candidate ratios of :func:`best_symmetric_ratio`."""
    return np.unique(
        np.concatenate(
            [np.geomspace(0.5, 2.0 * (m + 1), 241), [0.5, 1.0 / math.sqrt(2.0), (m + 1) / 2.0]]
        )
    )


def _best_low_rank_ratio(
    query: MatrixQuery,
    domain: RecordDomain,
    neighbours: Neighbours,
    cov: LowRank,
) -> float:
    """:func:`best_symmetric_ratio` for low-rank directions and their allocation (``cov``'s
    variances ``v = 1 / theta``): ``Delta_1(r)^2`` times the expected squared error of ``B S
    B`` at precisions ``theta``."""
    v = cov.variances
    precision, _ = cov.precision_form()
    grid = _ratio_grid(cov.dim)
    d1s = query.mahalanobis_sensitivities(
        domain, neighbours, precision, directions=None, ratios=list(grid)
    )
    trace, trace_sq = float(v.sum()), float(v @ v)
    diag = cov.diag()
    diag_sq = float(diag @ diag)
    best_r, best_err = 0.5, math.inf
    for r, d1 in zip(grid, d1s, strict=True):
        err = d1 * d1 * (r * (trace**2 + trace_sq) + (1.0 - 2.0 * r) * diag_sq)
        if err < best_err * (1.0 - 1e-12):
            best_r, best_err = float(r), err
    return best_r
