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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.low_rank import LowRankPrecision
from mvg_dask.plan.queries.bounds import check_grouped_neighbours
from mvg_dask.privacy import sensitivity as sens
from mvg_dask.privacy.calibration import Algorithm

__all__ = ["Whitened", "WhitenedBounds", "symmetric_bounds", "whitened"]


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


class WhitenedBounds:
    """``Delta_M``, the query's sensitivity after whitening by the noise (a mixin of
    :class:`~mvg_dask.plan.queries.base.MatrixQuery`; the query type adds its own bounds
    through :meth:`whitened_bounds`)."""

    def check_neighbours(self, neighbours: Neighbours) -> None:
        """Refuse a neighbouring relation the query cannot take (a hook)."""

    def sensitivity_excess(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``declared s_2 / proved s_2`` (:class:`~mvg_dask.plan.queries.bounds.DeclaredBounds`)."""
        raise NotImplementedError

    def proved_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """The proved ``s_2`` (see :class:`~mvg_dask.plan.queries.bounds.DeclaredBounds`)."""
        raise NotImplementedError

    sensitivity: float | None
    groups: tuple[str | int, ...] | None

    def ungrouped(self) -> WhitenedBounds:
        """The query of one group (a hook of :class:`~mvg_dask.plan.queries.base.MatrixQuery`)."""
        return self

    # -- whitened sensitivity ---------------------------------------------------------------
    def mahalanobis_sensitivity(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        precision: np.ndarray | LowRankPrecision,
        algorithm: Algorithm,
        *,
        directions: np.ndarray | None = None,
        ratio: float | None = None,
    ) -> float:
        """Upper bound of ``Delta_M = sup ||A^-1 (f(X) - f(X')) B^-T||_F`` (docs/bounds.md).

        ``precision`` is ``Sigma^-1``; ``Psi = I`` (unimodal) or ``Psi = Sigma`` (equi-modal).
        For ``symmetric`` noise ``A S A^T`` (``A = W diag(sqrt(v))``, ``S_ii ~ N(0, 1)``,
        ``S_ij = S_ji ~ N(0, r)``) it bounds ``sup ||vech_r(A^-1 (f(X) - f(X')) A^-T)||``, the
        whitened half-vectorisation with off-diagonal entries counted once and divided by
        ``sqrt(r)`` (docs/bounds.md, Sec. 1). The minimum of every valid bound is returned:
        any query's ``s_2 sqrt(lambda_max(Sigma^-1))`` (unimodal) or ``s_2 lambda_max(Sigma^-1)``
        (equi-modal, symmetric), and the query type's own (:meth:`whitened_bounds`).

        A built-in query with a declared ``s_2`` above the proved one gets that minimum times
        ``declared / proved`` (:meth:`sensitivity_excess`; docs/bounds.md, Sec. 12); a custom
        query's declared ``s_2`` enters the first bound only.

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one", "add-remove"}
            Neighbouring relation.
        precision : ndarray or LowRankPrecision
            ``Sigma^-1`` (``m x m``), or the vector ``p`` of a diagonal ``Sigma^-1 = diag(p)``
            (standard directions; then ``directions`` must be ``None``): the same bounds in
            O(m), with no ``m x m`` matrix; or an identity-plus-low-rank ``Sigma^-1``
            (:class:`~mvg_dask.plan.low_rank.LowRankPrecision`, factor ``B = Sigma^(1/2)``,
            ``directions=None``), in O(m^2 k) with no ``m x m`` matrix.
        algorithm : {"unimodal", "equi-modal", "symmetric"}
            Noise type.
        directions : ndarray, optional
            ``W`` with ``Sigma^-1 = W diag(p) W^T``: the basis of ``A`` (required for
            ``symmetric`` noise, whose law depends on it; for equi-modal noise any basis is
            valid and the eigenvectors of ``precision`` are used by default).
        ratio : float, optional
            ``r = b^2 / a^2 >= 1/2`` of symmetric noise.

        Returns
        -------
        float
            ``Delta_M``.
        """
        self.check_neighbours(neighbours)
        dense = not isinstance(precision, LowRankPrecision) and np.ndim(precision) != 1
        if algorithm == "symmetric" and (ratio is None or (directions is None and dense)):
            raise ValueError("symmetric noise needs its directions and its ratio r")
        r = None if algorithm != "symmetric" else float(ratio)  # type: ignore[arg-type]
        return self._mahalanobis(domain, neighbours, precision, algorithm, directions, [r])[0]

    def mahalanobis_sensitivities(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        precision: np.ndarray | LowRankPrecision,
        *,
        directions: np.ndarray | None,
        ratios: Sequence[float],
    ) -> list[float]:
        """:meth:`mahalanobis_sensitivity` of symmetric noise for many ratios ``r`` at once.

        Everything but the last step (Theorem 1/2's maximisation, O(m)) is computed once: the
        ratio search of a plan with dense directions costs one eigendecomposition, not one per
        candidate ``r``.
        """
        self.check_neighbours(neighbours)
        dense = not isinstance(precision, LowRankPrecision) and np.ndim(precision) != 1
        if directions is None and dense:
            raise ValueError("symmetric noise needs its directions and its ratio r")
        rs: list[float | None] = [float(r) for r in ratios]
        return self._mahalanobis(domain, neighbours, precision, "symmetric", directions, rs)

    def _mahalanobis(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        precision: np.ndarray | LowRankPrecision,
        algorithm: Algorithm,
        directions: np.ndarray | None,
        ratios: list[float | None],
    ) -> list[float]:
        """The domain's bounds, times ``declared s_2 / proved s_2`` when a larger ``s_2`` is
        declared for a built-in query (docs/bounds.md, Sec. 12)."""
        excess = self.sensitivity_excess(domain, neighbours)
        found = self._proved_mahalanobis(
            domain, neighbours, precision, algorithm, directions, ratios
        )
        return [excess * b for b in found]

    def _proved_mahalanobis(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        precision: np.ndarray | LowRankPrecision,
        algorithm: Algorithm,
        directions: np.ndarray | None,
        ratios: list[float | None],
    ) -> list[float]:
        """The domain's bounds (no declared excess). A grouped release's are the joint ones,
        ``max(Delta_replace-one, sqrt(2) Delta_add-remove)`` of one group's query, ratio by
        ratio (every group's noise has the same law; docs/bounds.md, Sec. 15 and 17)."""
        if self.groups is not None:
            check_grouped_neighbours(neighbours)
            one = self.ungrouped()
            args = (precision, algorithm, directions, ratios)
            within = one._proved_mahalanobis(domain, "replace-one", *args)
            moved = one._proved_mahalanobis(domain, "add-remove", *args)
            return [max(a, math.sqrt(2.0) * b) for a, b in zip(within, moved, strict=True)]
        white = whitened(precision, directions)
        lam = white.lambda_max
        s2 = self._base_l2_sensitivity(domain, neighbours)
        bounds = [s2 * (math.sqrt(lam) if algorithm == "unimodal" else lam)]
        return self.whitened_bounds(domain, neighbours, white, algorithm, bounds, ratios)

    def _base_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """The proved ``s_2`` of a built-in query, the declared one of a custom query."""
        proved = self.proved_l2_sensitivity(domain, neighbours)
        if proved is not None:
            return proved
        assert self.sensitivity is not None
        return self.sensitivity

    def whitened_bounds(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        white: Whitened,
        algorithm: Algorithm,
        bounds: list[float],
        ratios: list[float | None],
    ) -> list[float]:
        """The least of ``bounds`` (the generic ``s_2`` bound) and the query type's own
        whitened bounds, for each ratio (a hook: here, none of its own)."""
        return [float(min(bounds)) for _ in ratios]
