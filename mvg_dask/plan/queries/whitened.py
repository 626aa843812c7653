"""The precision ``Sigma^-1`` as the Mahalanobis bounds of a query see it.

A query's whitened bounds need a few suprema of the whitened record ``y = Sigma^(-1/2) x`` over
the record domain: ``lambda_max(Sigma^-1)``, ``sup x^T Sigma^-1 x``, ``sup (x - x')^T Sigma^-1
(x - x')``, the coordinate suprema ``T_i = sup y_i^2`` (with their signs) and the area bound of
docs/bounds.md Lemma 3. :func:`whitened` wraps a precision vector (diagonal), an
identity-plus-low-rank precision or a dense matrix in one interface, so the queries never branch
on its form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mvg_dask.plan.domain import RecordDomain
from mvg_dask.plan.low_rank import LowRankPrecision
from mvg_dask.privacy import sensitivity as sens

__all__ = ["Whitened", "whitened"]


@dataclass(frozen=True, eq=False)
class Whitened:
    """A precision ``P = Sigma^-1`` and the suprema the Mahalanobis bounds take from it.

    Attributes
    ----------
    precision : ndarray or LowRankPrecision
        ``p`` (diagonal ``P = diag(p)``, clipped at 0), an ``m x m`` matrix, or a
        :class:`~mvg_dask.plan.low_rank.LowRankPrecision`.
    directions : ndarray or None
        A basis ``W`` the dense ``P`` is diagonal in (``None``: its eigenvectors).
    """

    precision: np.ndarray | LowRankPrecision
    directions: np.ndarray | None = None

    @property
    def lambda_max(self) -> float:
        """``lambda_max(P)``."""
        p = self.precision
        if isinstance(p, LowRankPrecision):
            return p.lambda_max
        return float(np.max(p)) if np.ndim(p) == 1 else sens.lambda_max(p)

    def sup_quadratic(self, domain: RecordDomain) -> float:
        """``sup x^T P x`` over the domain."""
        p = self.precision
        if isinstance(p, LowRankPrecision):
            return p.sup_quadratic(domain)
        return domain.sup_quadratic_diag(p) if np.ndim(p) == 1 else domain.sup_quadratic(p)

    def sup_quadratic_diff(self, domain: RecordDomain) -> float:
        """``sup (x - x')^T P (x - x')`` over pairs of records."""
        p = self.precision
        if isinstance(p, LowRankPrecision):
            return p.sup_quadratic_diff(domain)
        if np.ndim(p) == 1:
            return domain.sup_quadratic_diff_diag(p)
        return domain.sup_quadratic_diff(p)

    def symmetric_inputs(self, domain: RecordDomain) -> tuple[np.ndarray, bool, float]:
        """``T_i = sup y_i^2``, whether every ``y_i`` keeps one sign, and the area bound
        ``lambda_1 lambda_2 sup ||x||^4`` (Lemma 3) of the covariance's Theorems 1 and 2."""
        P = self.precision
        R2 = domain.sup_norm_sq() ** 2
        if isinstance(P, LowRankPrecision):
            T, sign_definite = P.coordinate_sups(domain)
            l1, l2 = P.top_two()
            return T, sign_definite, l1 * l2 * R2
        if np.ndim(P) == 1:
            p = np.asarray(P)
            T, sign_definite = domain.coordinate_sups_diag(p)
        else:
            W = self.directions
            if W is None:
                _, W = np.linalg.eigh(P)
            W = np.asarray(W, dtype=np.float64)
            p = np.maximum(np.einsum("ki,kl,li->i", W, P, W), 0.0)
            scale = float(np.max(np.abs(P)))
            if np.max(np.abs((W * p) @ W.T - P)) > 1e-6 * scale:
                raise ValueError("the precision matrix is not diagonal in these directions")
            T, sign_definite = domain.coordinate_sups(W, p)
        top = np.sort(p)[::-1]
        area = float(top[0] * top[1]) * R2 if p.size > 1 else 0.0
        return T, sign_definite, area


def whitened(precision: np.ndarray | LowRankPrecision, directions: np.ndarray | None) -> Whitened:
    """Wrap a precision as the bounds take it.

    An identity-plus-low-rank precision with ``p_U = p_c`` is ``p_c I``: the diagonal path,
    in O(m). A precision vector is clipped at 0 and takes no ``directions``.

    Parameters
    ----------
    precision : ndarray or LowRankPrecision
        ``Sigma^-1``: a vector ``p`` (``diag(p)``), an ``m x m`` matrix or a low-rank form.
    directions : ndarray or None
        ``W`` with ``Sigma^-1 = W diag(p) W^T`` (dense precision only).

    Returns
    -------
    Whitened
        The wrapped precision.
    """
    if isinstance(precision, LowRankPrecision):
        if not np.all(precision.top == precision.rest):
            return Whitened(precision)
        precision = np.full(precision.m, precision.rest)
    if np.ndim(precision) == 1:
        if directions is not None:
            raise ValueError("a precision vector means standard directions: pass directions=None")
        return Whitened(np.maximum(np.asarray(precision, dtype=np.float64), 0.0))
    return Whitened(precision, directions)


def symmetric_bounds(
    bounds: list[float],
    inputs: tuple[np.ndarray, bool, float],
    S: float,
    algorithm: str,
    neighbours: str,
    N: float,
    ratios: list[float | None],
) -> list[float]:
    """The covariance bounds of equi-modal and symmetric noise from the whitened records'
    ``T``, signs and area and ``S``: equi-modal's ``sqrt(2) S / N`` (``S / N`` add/remove) and
    Theorem 1/2 for every ratio, each the least of ``bounds`` and its own."""
    T, sign_definite, area = inputs
    bounds = list(bounds)
    if algorithm == "equi-modal":
        factor = math.sqrt(2.0) if neighbours == "replace-one" else 1.0
        bounds.append(factor * S / N)
    rs = [0.5 if algorithm == "equi-modal" else float(r) for r in ratios]  # type: ignore[arg-type]
    qs = sens.outer_weighted_sups(
        T,
        S,
        ratios=rs,
        replace_one=neighbours == "replace-one",
        sign_definite=sign_definite,
        area_sup=area,
    )
    # Delta^2 = Q / r: for r = 1/2, Q = ||D||_F^2 / 2
    return [float(min([*bounds, math.sqrt(q / r) / N])) for q, r in zip(qs, rs, strict=True)]
