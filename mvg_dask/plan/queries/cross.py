"""The cross-covariance query ``f(X) = X_a X_b^T / N`` (``m_a x m_b``, not square).

``X_a`` holds the rows ``rows`` of ``X`` and ``X_b`` the rows ``cols`` (positions of the input's
feature coordinate; they may overlap). Per record: ``a b^T`` with ``a = x[rows]``, ``b =
x[cols]``. Per task: the block's Gram ``X_b X_b^T`` of every feature, summed along the fixed tree
of the covariance's Gram pass; finalize: the ``rows x cols`` sub-block divided by ``N``. Its
entries are entries of that Gram, computed by the same float sequence.

Sensitivity (docs/bounds.md, Sec. 16), with ``R_a = sup ||a||^2``, ``R_b = sup ||b||^2``:
``2 sqrt(R_a R_b) / N`` (replace-one), ``sqrt(2) sqrt(R_a R_b) / N`` when both sides are
sign-definite boxes, ``sqrt(R_a R_b) / N`` (add-remove); whitened, ``A^-1 f B^-T`` with
``Sigma = A A^T`` and ``Psi = B B^T``, the same with ``R_a`` replaced by ``S_a = sup a^T
Sigma^-1 a`` and ``R_b`` by ``S_b = sup b^T Psi^-1 b`` (the sign-definite factor only for a
diagonal ``Sigma^-1``). Noise: rectangular ``m_a x m_b``, ``Sigma`` on the row features (scaled
by the calibration) and a fixed diagonal ``Psi`` on the column features, normalised to
``tr(Psi^-1) = m_b`` (``column_variances``; ``Psi = I`` by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan import stages as st
from mvg_dask.plan.domain import BoxDomain, L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.low_rank import LowRankPrecision
from mvg_dask.plan.queries.base import MatrixQuery, summed
from mvg_dask.plan.queries.whitened import Whitened
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm

__all__ = ["CrossCovarianceQuery", "column_variances", "cross_factor", "sub_domain"]


def column_variances(theta: np.ndarray) -> tuple[float, ...] | None:
    """The column noise variances ``psi_j = mean(theta) / theta_j`` of a column allocation:
    ``Psi^-1 = diag(theta) / mean(theta)``, normalised to ``tr(Psi^-1) = m_b`` (the scale of
    ``Sigma (x) Psi`` is fixed on ``Psi``, the calibration scales ``Sigma``; docs/bounds.md,
    Sec. 16). ``None`` (``Psi = I``) when every share is equal.

    Parameters
    ----------
    theta : ndarray
        One positive share per column feature.

    Returns
    -------
    tuple of float or None
        ``psi`` (one variance per column feature), or ``None`` for ``Psi = I``.
    """
    t = np.asarray(theta, dtype=np.float64).reshape(-1)
    if t.size == 0 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("a column allocation needs one finite share > 0 per column feature")
    if np.all(t == t[0]):
        return None
    return tuple(float(v) for v in float(np.mean(t)) / t)


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
    col_variances : tuple of float, optional
        The diagonal of the column covariance ``Psi`` (``m_b`` positive variances, from
        ``column_variances``); ``None`` for ``Psi = I``.
    """

    kind: ClassVar[str] = "cross-covariance"
    output_variable: ClassVar[str | None] = "cross_covariance"

    rows: tuple[int, ...] = ()
    cols: tuple[int, ...] = ()
    col_variances: tuple[float, ...] | None = None

    def _check_fields(self) -> None:
        self._check_positions()
        psi = self.col_variances
        if psi is None:
            return
        values = tuple(float(v) for v in psi)
        if len(values) != len(self.cols):
            raise ValueError(
                f"cross-covariance col_variances has {len(values)} values for {len(self.cols)} cols"
            )
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError("cross-covariance col_variances must be finite and > 0")
        object.__setattr__(self, "col_variances", values)

    @property
    def column_noise_variances(self) -> np.ndarray | None:
        """The diagonal of ``Psi`` (``None``: ``Psi = I``)."""
        psi = self.col_variances
        return None if psi is None else np.asarray(psi, dtype=np.float64)

    def _column_precision(self) -> np.ndarray | None:
        psi = self.column_noise_variances
        return None if psi is None else 1.0 / psi

    def _check_positions(self) -> None:
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
        """The sum (:func:`~mvg_dask.plan.queries.base.summed`: in a writeable operand)."""
        return summed(left, right)

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """The ``rows x cols`` block of the Gram, divided by ``N``."""
        block = np.asarray(total)[np.ix_(self.rows, self.cols)]
        return np.asarray(block / self.records)

    def release_stages(
        self, *, noisy_count: bool, dp_pca: bool, panels: bool, lattice: bool
    ) -> tuple[str, ...]:
        """``[noisy-count,] gram, cross-covariance``: fixed directions, the whole matrix (the
        plan refuses DP-PCA and panels)."""
        return self.gram_stages(st.CROSS_COVARIANCE, noisy_count=noisy_count, dp_pca=False)

    @property
    def feature_sides(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """``(rows, cols)``: the output's rows and columns are these features."""
        return self.rows, self.cols

    def dry_run_text(self, rplan: Any) -> str:
        """``X_rows X_cols^T / N`` (or ``X_rows Y_cols^T``), its normaliser and its ``Psi``."""
        m = rplan.input.features
        m_a, m_b = self.shape
        if rplan.neighbours == "add-remove":
            norm = f"N0 = {self.records} declared public"
        else:
            norm = f"N = {rplan.input.records} (public)"
        text = f"cross-covariance X_rows X_cols^T / N ({m_a} x {m_b} of {m} features), {norm}"
        second = rplan.input.cols_input
        if second is not None:
            text = (
                f"cross-covariance X_rows Y_cols^T / N ({m_a} x {m_b}): rows of "
                f"{rplan.input.variable!r} ({m} features), cols of {second.variable!r} "
                f"({second.features} features, read beside it by record range), {norm}"
            )
        psi = self.column_noise_variances
        if psi is None:
            return text
        return (
            f"{text}; column noise Psi = diag({', '.join(f'{v:.4g}' for v in psi)}) "
            f"(col_allocation, tr Psi^-1 = {m_b})"
        )

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
        """``Sigma`` on the rows, the fixed diagonal ``Psi`` on the columns:
        ``c sqrt(S_a S_b) / N``, ``S_a = sup a^T Sigma^-1 a``, ``S_b = sup b^T Psi^-1 b``
        (``= R_b`` for ``Psi = I``); the sign-definite ``c = sqrt(2)`` needs ``a^T Sigma^-1 a'
        >= 0`` and ``b^T Psi^-1 b' >= 0``, proved for diagonal precisions on sign-definite boxes
        (docs/bounds.md, Sec. 16). The generic ``s_2 sqrt(lambda_max(Sigma^-1))`` of ``bounds``
        gains the factor ``sqrt(lambda_max(Psi^-1))``."""
        if algorithm != "unimodal":
            raise ValueError(unimodal_only(algorithm))
        da, db = self.sides(domain)
        S_a = white.sup_quadratic(da)
        q = self._column_precision()
        if q is None:
            S_b = db.sup_norm_sq()
        else:
            S_b = Whitened(q).sup_quadratic(db)
            bounds = [b * math.sqrt(float(np.max(q))) for b in bounds]
        p = white.precision
        diagonal = not isinstance(p, LowRankPrecision) and np.ndim(p) == 1
        definite = diagonal and da.sign_definite and db.sign_definite
        own = cross_factor(neighbours, definite) * math.sqrt(S_a * S_b)
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
        """``E`` of the whitened block (docs/bounds.md, Sec. 16): the Gram lemma
        (:func:`~mvg_dask.privacy.float_error.gram_error`) entrywise on the ``rows x cols``
        block, the column whitening ``fl(f_ij u_j)`` (``u = fl(1 / fl(sqrt(psi)))``, a diagonal
        whitening of the transpose) when ``Psi != I``, then the row whitening
        (:func:`~mvg_dask.privacy.float_error.whitened_error`, one-sided) and the Frobenius norm
        of the entries' errors."""
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
        err_b, mag_b = err[block], mag[block]
        psi = self.column_noise_variances
        if psi is not None:  # the engine whitens the columns first (engine/stages/cross.py)
            col_white = ferr.Whitening.diagonal(psi)
            err_t, mag_t = ferr.whitened_error(
                err_b.T, mag_b.T, whitening=col_white, two_sided=False
            )
            err_b, mag_b = err_t.T, mag_t.T
        err_g, mag_g = ferr.whitened_error(err_b, mag_b, whitening=whitening, two_sided=False)
        return ferr.lattice_coordinates_error(err_g, mag_g, algorithm="unimodal", ratio=None)

    # -- description ------------------------------------------------------------------------
    def _extra_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"rows": list(self.rows), "cols": list(self.cols)}
        if self.col_variances is not None:  # Psi = I: the plan keeps its bytes
            out["col_variances"] = list(self.col_variances)
        return out

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments from :meth:`~mvg_dask.plan.MatrixQuery.to_dict`."""
        fields = super().fields_from_dict(data)
        fields["rows"] = tuple(int(i) for i in data["rows"])
        fields["cols"] = tuple(int(i) for i in data["cols"])
        psi = data.get("col_variances")
        fields["col_variances"] = None if psi is None else tuple(float(v) for v in psi)
        return fields


def unimodal_only(algorithm: str) -> str:
    """The refusal of a noise other than unimodal for a cross-covariance."""
    return (
        f"the cross-covariance query is not symmetric and its columns are other features than "
        f"its rows: its noise is Sigma on the row features and a fixed Psi on the column "
        f"features (algorithm: unimodal), not {algorithm}"
    )


def _sup_l1(domain: RecordDomain) -> float:
    if isinstance(domain, L2BallDomain):
        return domain.radius * math.sqrt(domain.m)
    assert isinstance(domain, BoxDomain)
    return float(np.sum(domain.abs_max))
