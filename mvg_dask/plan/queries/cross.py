"""The cross-covariance query ``f(X) = X_a X_b^T / N`` (``m_a x m_b``, not square).

``X_a`` holds the rows ``rows`` of ``X`` and ``X_b`` the rows ``cols`` (positions of the input's
feature coordinate; they may overlap). Per record: ``a b^T`` with ``a = x[rows]``, ``b =
x[cols]``. Per task: the block's Gram ``X_b X_b^T`` of every feature, summed along the fixed tree
of the covariance's Gram pass; finalize: the ``rows x cols`` sub-block divided by ``N``. Its
entries are entries of that Gram, computed by the same float sequence.

Sensitivity (docs/bounds.md, Sec. 16), with ``R_a = sup ||a||^2``, ``R_b = sup ||b||^2``:
``2 sqrt(R_a R_b) / N`` (replace-one), ``sqrt(2) sqrt(R_a R_b) / N`` when both sides are
sign-definite boxes, ``sqrt(R_a R_b) / N`` (add-remove); whitened on the row side by ``Sigma^-1``
the same with ``R_a`` replaced by ``S_a = sup a^T Sigma^-1 a`` (the sign-definite factor only for
a diagonal ``Sigma^-1``). Noise: rectangular ``m_a x m_b``, ``Sigma`` on the row features and
``Psi = I`` (unimodal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan.domain import BoxDomain, L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.low_rank import LowRankPrecision
from mvg_dask.plan.queries.base import MatrixQuery
from mvg_dask.plan.queries.whitened import Whitened
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm

__all__ = ["CrossCovarianceQuery", "cross_factor", "sub_domain"]


def sub_domain(domain: RecordDomain, positions: tuple[int, ...]) -> RecordDomain:
    """The domain of the sub-record ``x[positions]``: the box's own intervals, or a ball of the
    same radius (``||x[positions]|| <= ||x||``).

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        The record domain.
    positions : tuple of int
        Feature positions.

    Returns
    -------
    BoxDomain or L2BallDomain
        The sub-record's domain.
    """
    idx = np.asarray(positions, dtype=np.intp)
    if isinstance(domain, BoxDomain):
        return BoxDomain(np.asarray(domain.lower)[idx], np.asarray(domain.upper)[idx])
    assert isinstance(domain, L2BallDomain)
    return L2BallDomain(domain.radius, len(positions))


def cross_factor(neighbours: Neighbours, sign_definite: bool) -> float:
    """The factor of ``sqrt(S_a S_b)`` in the sensitivity of ``a b^T`` (docs/bounds.md,
    Sec. 16): ``1`` (add-remove), ``sqrt(2)`` (replace-one, inner products ``>= 0`` on both
    sides), ``2`` (replace-one).

    Parameters
    ----------
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    sign_definite : bool
        Every pair's ``u^T u'`` and ``v^T v'`` is ``>= 0``.

    Returns
    -------
    float
        The factor.
    """
    if neighbours == "add-remove":
        return 1.0
    return math.sqrt(2.0) if sign_definite else 2.0


@dataclass(frozen=True)
class CrossCovarianceQuery(MatrixQuery):
    """The cross-covariance query ``f(X) = X_a X_b^T / N`` (parameters of
    :class:`MatrixQuery`, plus the feature positions).

    Parameters
    ----------
    rows : tuple of int
        Positions of the row features ``a`` (``m_a``, distinct).
    cols : tuple of int
        Positions of the column features ``b`` (``m_b``, distinct; may share features with
        ``rows``).
    """

    kind: ClassVar[str] = "cross-covariance"

    rows: tuple[int, ...] = ()
    cols: tuple[int, ...] = ()

    def _check_fields(self) -> None:
        for name in ("rows", "cols"):
            pos = tuple(getattr(self, name))
            if not pos:
                raise ValueError(f"cross-covariance {name} must name at least one feature")
            if len(set(pos)) != len(pos):
                raise ValueError(f"cross-covariance {name} repeat a feature")
            bad = [p for p in pos if not 0 <= int(p) < self.features]
            if bad:
                raise ValueError(
                    f"cross-covariance {name}: position {bad[0]} is not one of the "
                    f"{self.features} features"
                )
            object.__setattr__(self, name, tuple(int(p) for p in pos))

    # -- what the query is -------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """``(m_a, m_b)``."""
        return (len(self.rows), len(self.cols))

    def contribution(self, x: np.ndarray) -> np.ndarray:
        """One record's term ``a b^T`` (``N f(X)`` is their sum)."""
        x = np.asarray(x)
        return np.asarray(np.outer(x[list(self.rows)], x[list(self.cols)]))

    def partial(self, block: np.ndarray) -> np.ndarray:
        """``X_b X_b^T`` of every feature (``M x M``): the covariance's Gram partial."""
        return np.asarray(block @ block.T)

    def combine(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """The sum."""
        return np.asarray(left + right)

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """The ``rows x cols`` block of the Gram, divided by ``N``."""
        block = np.asarray(total)[np.ix_(self.rows, self.cols)]
        return np.asarray(block / self.records)

    def sides(self, domain: RecordDomain) -> tuple[RecordDomain, RecordDomain]:
        """The domains of ``a`` and ``b``."""
        return sub_domain(domain, self.rows), sub_domain(domain, self.cols)

    # -- sensitivities -----------------------------------------------------------------------
    def proved_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """``c sqrt(R_a R_b) / N`` with ``c`` of
        ``cross_factor`` (``||a b^T - a' b'^T||_F^2
        = ||a||^2 ||b||^2 + ||a'||^2 ||b'||^2 - 2 (a^T a') (b^T b')``; docs/bounds.md,
        Sec. 16)."""
        self.check_neighbours(neighbours)
        da, db = self.sides(domain)
        definite = da.sign_definite and db.sign_definite
        c = cross_factor(neighbours, definite)
        return c * math.sqrt(da.sup_norm_sq() * db.sup_norm_sq()) / self.records

    def l1_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``2 sup ||a||_1 sup ||b||_1 / N`` (replace-one; add/remove without the 2), since
        ``||a b^T||_1 = ||a||_1 ||b||_1``."""
        self.check_neighbours(neighbours)
        da, db = self.sides(domain)
        l1 = _sup_l1(da) * _sup_l1(db)
        return (2.0 if neighbours == "replace-one" else 1.0) * l1 / self.records

    def _undeclared_sup_frobenius(self, domain: RecordDomain) -> float:
        da, db = self.sides(domain)
        return math.sqrt(da.sup_norm_sq() * db.sup_norm_sq())

    def proved_sup_frobenius(self, domain: RecordDomain) -> float | None:
        """``sqrt(R_a R_b)`` (``||X_a X_b^T||_F / N <= sum_j ||a_j|| ||b_j|| / N``; ``None``
        when the record count is private)."""
        if not self.records_known:
            return None
        return self._undeclared_sup_frobenius(domain)

    def proved_entry_range(self, domain: RecordDomain) -> tuple[float, float] | None:
        """The range of ``x_i x_j`` (``i`` a row feature, ``j`` a column feature); ``None``
        when the record count is private."""
        if not self.records_known:
            return None
        return self._product_range(domain)

    def _product_range(self, domain: RecordDomain) -> tuple[float, float]:
        da, db = self.sides(domain)
        if isinstance(da, L2BallDomain):
            return -(da.radius**2), da.radius**2
        assert isinstance(db, BoxDomain)
        ends = np.stack(
            [np.multiply.outer(p, q) for p in (da.lower, da.upper) for q in (db.lower, db.upper)]
        )
        return float(ends.min()), float(ends.max())

    def _undeclared_entry_range(self, domain: RecordDomain) -> tuple[float, float]:
        if not self.records_known:
            raise ValueError(
                "the entries of X_a X_b^T / N0 grow with the private record count: declare "
                "mechanism.entry_range or use calibration: exact"
            )
        return self._product_range(domain)

    def whitened_bounds(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        white: Whitened,
        algorithm: Algorithm,
        bounds: list[float],
        ratios: list[float | None],
    ) -> list[float]:
        """Unimodal (``Psi = I``): ``c sqrt(S_a R_b) / N``, ``S_a = sup a^T Sigma^-1 a``; the
        sign-definite ``c = sqrt(2)`` needs ``a^T Sigma^-1 a' >= 0``, proved for a diagonal
        ``Sigma^-1`` on a sign-definite box (docs/bounds.md, Sec. 16)."""
        if algorithm != "unimodal":
            raise ValueError(unimodal_only(algorithm))
        da, db = self.sides(domain)
        S_a = white.sup_quadratic(da)
        p = white.precision
        diagonal = not isinstance(p, LowRankPrecision) and np.ndim(p) == 1
        definite = diagonal and da.sign_definite and db.sign_definite
        own = cross_factor(neighbours, definite) * math.sqrt(S_a * db.sup_norm_sq())
        least = float(min([*bounds, own / self.records]))
        return [least for _ in ratios]

    # -- lattice noise ----------------------------------------------------------------------
    def float_error(
        self,
        abs_max: np.ndarray,
        whitening: ferr.Whitening,
        *,
        norm_max: float | None,
        algorithm: Algorithm,
        ratio: float | None,
        context: Any,
    ) -> float:
        """``E`` of the row-whitened block (docs/bounds.md, Sec. 16): the Gram lemma
        (:func:`~mvg_dask.privacy.float_error.gram_error`) entrywise on the ``rows x cols``
        block, the one-sided whitening (:func:`~mvg_dask.privacy.float_error.whitened_error`)
        and the Frobenius norm of the entries' errors."""
        if algorithm != "unimodal":
            raise ValueError(unimodal_only(algorithm))
        if context is None:
            raise ValueError("a lattice cross-covariance needs its summation context")
        a = np.abs(np.asarray(abs_max, dtype=np.float64))
        rows, cols = list(self.rows), list(self.cols)
        ab = np.concatenate([a[rows], a[cols]])
        err, mag = ferr.gram_error(ab, context.records, context.depth, float(self.records))
        m_a = len(rows)
        block = (slice(0, m_a), slice(m_a, None))
        err_g, mag_g = ferr.whitened_error(
            err[block], mag[block], whitening=whitening, two_sided=False
        )
        return ferr.lattice_coordinates_error(err_g, mag_g, algorithm="unimodal", ratio=None)

    # -- description ------------------------------------------------------------------------
    def _extra_dict(self) -> dict[str, object]:
        return {"rows": list(self.rows), "cols": list(self.cols)}

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments from :meth:`~mvg_dask.plan.MatrixQuery.to_dict`."""
        fields = super().fields_from_dict(data)
        fields["rows"] = tuple(int(i) for i in data["rows"])
        fields["cols"] = tuple(int(i) for i in data["cols"])
        return fields


def unimodal_only(algorithm: str) -> str:
    """The refusal of a noise other than unimodal for a cross-covariance."""
    return (
        f"the cross-covariance query is not symmetric and its columns are other features than "
        f"its rows: its noise is Sigma on the row features and Psi = I (algorithm: unimodal), "
        f"not {algorithm}"
    )


def _sup_l1(domain: RecordDomain) -> float:
    if isinstance(domain, L2BallDomain):
        return domain.radius * math.sqrt(domain.m)
    assert isinstance(domain, BoxDomain)
    return float(np.sum(domain.abs_max))
