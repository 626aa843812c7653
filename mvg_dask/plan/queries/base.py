"""What a query is: the :class:`Query` protocol and the shared :class:`MatrixQuery` base.

Records are the columns of ``X`` (``M`` features x ``N`` records), as in the MVG paper. A query
type states (docs/concepts/queries.md): its per-record contribution, the per-task partial and
the fixed-tree combine the engine sums, the finalize step, its sensitivity bounds (L2 and
whitened, for a box or an L2 ball, under replace-one or add-remove neighbours), the shape of
its noise (a symmetric ``m x m`` matrix or a rectangular ``m x n`` one with ``Sigma (x) Psi``)
and its output. :class:`MatrixQuery` holds what every query shares (declared bounds, checked
against the proved ones); a new query subclasses it and registers its name in
:data:`mvg_dask.plan.queries.QUERY_TYPES`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.low_rank import LowRankPrecision
from mvg_dask.plan.queries.whitened import Whitened, whitened
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm

__all__ = [
    "DECLARED_RTOL",
    "DeclaredBoundError",
    "MatrixQuery",
    "NoiseShape",
    "Query",
]

#: A declared bound within this relative distance below the proved one counts as the proved one
#: (a value typed with fewer digits, or computed in another order); the larger is used.
DECLARED_RTOL = 1e-9

#: ``symmetric``: an ``m x m`` symmetric output (noise ``A S A^T`` or symmetrised);
#: ``rectangular``: an ``m x n`` output with noise ``Sigma (x) Psi``.
NoiseShape = Literal["symmetric", "rectangular"]


class DeclaredBoundError(ValueError):
    """A declared ``sensitivity``, ``gamma`` or ``entry_range`` of a built-in query is smaller
    than the bound its record domain proves: calibrating to it would under-noise the release.

    Parameters
    ----------
    field : str
        The spec field (``sensitivity``, ``gamma`` or ``entry_range``).
    message : str
        One line naming both values and the remedy.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def at_least(x: float, digits: int = 6) -> str:
    """``x`` rounded up to ``digits`` significant digits (a value one may declare)."""
    text = f"{x:.{digits}g}"
    step = 10.0 ** (math.floor(math.log10(abs(x))) - digits + 1)
    while float(text) < x:
        text = f"{float(text) + step:.{digits}g}"
    return text


@runtime_checkable
class Query(Protocol):
    """A matrix-valued query ``f(X)`` as the plan and the engine see it."""

    #: The registered name (the spec's ``query``).
    kind: ClassVar[str]
    features: int
    records: int

    @property
    def shape(self) -> tuple[int, int]:
        """Output shape ``(m, n)``."""

    @property
    def noise_shape(self) -> NoiseShape:
        """``symmetric`` or ``rectangular`` noise."""

    def partial(self, block: np.ndarray) -> np.ndarray:
        """One task's partial of a block of records (``m x b``)."""

    def combine(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Two partials combined (one node of the fixed tree)."""

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """The query's value from the combined partials."""

    def l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``s_2``."""

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
        """``Delta_M``."""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description."""


@dataclass(frozen=True)
class MatrixQuery:
    """What every query shares: its data's size and the bounds one may declare.

    Parameters
    ----------
    features : int
        ``M``, the number of features (rows of ``X``).
    records : int
        ``N``, the number of records (columns of ``X``).
    sensitivity : float, optional
        Declared ``s_2``. Required for ``custom``, whose declared value is the source of truth
        (nothing proves a bound for it). For the built-in queries it may only be at least the
        bound the record domain proves (a smaller one raises :class:`DeclaredBoundError` when
        the value is used); a larger one is used as declared by every calibration, and
        ``exact`` scales ``Delta_M`` by ``declared / proved`` (docs/bounds.md, Sec. 12).
    gamma : float, optional
        Declared ``sup ||f(X)||_F``: at least the proved bound for a built-in query with a
        public record count, used as declared.
    entry_range : tuple of float, optional
        Declared range of every output entry (MGM Thm. 3): for a built-in query with a public
        record count it must contain the range the domain proves, and is used as declared.
    records_known : bool, default True
        ``True``: ``records`` is the dataset's record count, public (replace-one neighbours).
        ``False`` (add-remove covariance): the record count is private and never used;
        ``records`` is a public normaliser ``N0`` (``1`` for the unnormalised ``X X^T``), so
        ``f(X) = X X^T / N0`` changes by exactly ``x x^T / N0`` when a record is added or
        removed, and ``gamma`` or an entry range (which grow with the private count) must be
        declared by calibrations that need them.
    """

    kind: ClassVar[str] = ""
    #: Whether the output has one column per record (the identity): the noise is drawn record
    #: range by record range and the release has no diagonal.
    per_record_columns: ClassVar[bool] = False

    features: int
    records: int
    _: KW_ONLY
    sensitivity: float | None = None
    gamma: float | None = None
    entry_range: tuple[float, float] | None = None
    records_known: bool = True

    def __post_init__(self) -> None:
        if self.features < 1 or self.records < 1:
            raise ValueError(
                f"the data needs at least one feature and one record, got "
                f"{self.features} x {self.records}"
            )
        for name in ("sensitivity", "gamma"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"declared {name} must be a finite number > 0, got {value!r}")
        self._check_fields()
        if self.entry_range is not None:
            a, b = self.entry_range
            if not (math.isfinite(a) and math.isfinite(b) and a < b):
                raise ValueError(f"entry_range must be finite with lower < upper, got {a}, {b}")

    def _check_fields(self) -> None:
        """Refuse fields the query type cannot take (a hook)."""

    # -- what the query is -------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """Output shape ``(m, n)``."""
        raise NotImplementedError

    @property
    def is_symmetric(self) -> bool:
        """True when every output is a symmetric matrix."""
        return False

    @property
    def is_psd(self) -> bool:
        """True when every output is symmetric positive semi-definite."""
        return False

    @property
    def noise_shape(self) -> NoiseShape:
        """``symmetric`` for a symmetric output, else ``rectangular``."""
        return "symmetric" if self.is_symmetric else "rectangular"

    def partial(self, block: np.ndarray) -> np.ndarray:
        """One task's partial of the records ``block`` (``m x b``)."""
        raise NotImplementedError(f"the {self.kind} query is not computed by the engine")

    def combine(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Two partials combined (one node of the fixed tree)."""
        raise NotImplementedError(f"the {self.kind} query is not computed by the engine")

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """The query's value from the combined partials."""
        raise NotImplementedError(f"the {self.kind} query is not computed by the engine")

    def check_neighbours(self, neighbours: Neighbours) -> None:
        """Refuse a neighbouring relation the query cannot take (a hook)."""

    # -- sensitivities ----------------------------------------------------------------------
    def l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``s_2(f) = sup ||f(X) - f(X')||_F`` over neighbouring datasets.

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one", "add-remove"}
            Neighbouring relation.

        Returns
        -------
        float
            ``s_2``: the declared value if one was given (for a built-in query, the larger of
            it and the proved bound, :meth:`proved_l2_sensitivity`).

        Raises
        ------
        DeclaredBoundError
            A built-in query's declared value is below the proved bound.
        """
        proved = self.proved_l2_sensitivity(domain, neighbours)
        if self.sensitivity is None:
            assert proved is not None  # a custom query declares its sensitivity
            return proved
        if proved is None:
            return self.sensitivity
        if self.sensitivity < proved * (1.0 - DECLARED_RTOL):
            raise DeclaredBoundError(
                "sensitivity",
                f"mechanism.sensitivity: declared {self.sensitivity:.6g} is below the bound "
                f"{proved:.6g} that the record domain {domain.describe()} proves for the "
                f"{self.kind} query ({neighbours}); remove it or declare at least "
                f"{at_least(proved)}",
            )
        return max(self.sensitivity, proved)

    def proved_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """The ``s_2`` the record domain proves, ignoring any declared value (``None``: none
        is proved).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one", "add-remove"}
            Neighbouring relation.

        Returns
        -------
        float or None
            The bound.
        """
        self.check_neighbours(neighbours)
        return None

    def sensitivity_excess(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``declared s_2 / proved s_2`` (``>= 1``): the factor ``exact`` scales ``Delta_M`` by.

        ``1`` without a declared value and for a custom query (whose declared ``s_2`` is its
        only bound). The noise of an ``exact`` plan scales by the same factor (its entries'
        standard deviations; docs/bounds.md, Sec. 12).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one", "add-remove"}
            Neighbouring relation.

        Returns
        -------
        float
            The factor.
        """
        proved = self.proved_l2_sensitivity(domain, neighbours)
        if proved is None or self.sensitivity is None:
            return 1.0
        return self.l2_sensitivity(domain, neighbours) / proved

    def check_declared(self, domain: RecordDomain, neighbours: Neighbours) -> None:
        """Refuse a declared bound below the one the record domain proves (built-in queries).

        Checks ``sensitivity``, ``gamma`` and ``entry_range``, each where the domain proves a
        bound (not for a custom query; ``gamma`` and the entry range not when the record count
        is private, since they grow with it).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one", "add-remove"}
            Neighbouring relation.

        Raises
        ------
        DeclaredBoundError
            Naming the field, the declared and the proved values, and the remedy.
        """
        self.l2_sensitivity(domain, neighbours)
        if self.gamma is not None and self.proved_sup_frobenius(domain) is not None:
            self.sup_frobenius(domain)
        if self.entry_range is not None and self.proved_entry_range(domain) is not None:
            self.output_entry_range(domain)

    def l1_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``s_1(f)``, the L1 (entrywise) sensitivity, for the Laplace baseline.

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one", "add-remove"}
            Neighbouring relation.

        Returns
        -------
        float
            ``s_1``.
        """
        raise NotImplementedError

    def sup_frobenius(self, domain: RecordDomain) -> float:
        """``gamma = sup ||f(X)||_F`` over the domain.

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.

        Returns
        -------
        float
            ``gamma``: the declared value if one was given (for a built-in query with a public
            record count, the larger of it and the proved bound).

        Raises
        ------
        DeclaredBoundError
            The declared value is below the proved bound.
        """
        if self.gamma is not None:
            proved = self.proved_sup_frobenius(domain)
            if proved is None:
                return self.gamma
            if self.gamma < proved * (1.0 - DECLARED_RTOL):
                raise DeclaredBoundError(
                    "gamma",
                    f"mechanism.gamma: declared {self.gamma:.6g} is below the bound "
                    f"{proved:.6g} on sup ||f(X)||_F that the record domain {domain.describe()} "
                    f"proves for the {self.kind} query; remove it or declare at least "
                    f"{at_least(proved)}",
                )
            return max(self.gamma, proved)
        if not self.records_known:
            raise ValueError(
                "sup ||X X^T / N0||_F grows with the private record count: declare "
                "mechanism.gamma (a bound that holds for every dataset, e.g. N_max R / N0) or "
                "use calibration: exact"
            )
        return self._undeclared_sup_frobenius(domain)

    def _undeclared_sup_frobenius(self, domain: RecordDomain) -> float:
        raise ValueError(
            "this calibration needs gamma = sup ||f(X)||_F: declare it for a custom query"
        )

    def proved_sup_frobenius(self, domain: RecordDomain) -> float | None:
        """The ``gamma`` the record domain proves, ignoring any declared value (``None``: none
        is proved, e.g. when the record count is private and the bound grows with it).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.

        Returns
        -------
        float or None
            The bound.
        """
        return None

    def proved_entry_range(self, domain: RecordDomain) -> tuple[float, float] | None:
        """The range of every output entry the record domain proves (declared value ignored;
        ``None``: none is proved).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.

        Returns
        -------
        tuple of float or None
            ``(a, b)``.
        """
        return None

    def output_entry_range(self, domain: RecordDomain) -> tuple[float, float]:
        """Range ``[a, b]`` of every output entry (MGM Thm. 3).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.

        Returns
        -------
        tuple of float
            ``(a, b)``: the declared range if one was given (for a built-in query with a public
            record count, the hull of it and the proved range).

        Raises
        ------
        DeclaredBoundError
            The declared range does not contain the proved one.
        """
        if self.entry_range is None:
            return self._undeclared_entry_range(domain)
        proved = self.proved_entry_range(domain)
        if proved is None:
            return self.entry_range
        (a, b), (pa, pb) = self.entry_range, proved
        slack = DECLARED_RTOL * (pb - pa)
        if a > pa + slack or b < pb - slack:
            raise DeclaredBoundError(
                "entry_range",
                f"mechanism.entry_range: declared [{a:.6g}, {b:.6g}] does not contain the "
                f"range [{pa:.6g}, {pb:.6g}] that the record domain {domain.describe()} "
                f"proves for the entries of the {self.kind} query; remove it or declare a "
                "range that contains it",
            )
        return min(a, pa), max(b, pb)

    def _undeclared_entry_range(self, domain: RecordDomain) -> tuple[float, float]:
        if not self.records_known:
            raise ValueError(
                "the entries of X X^T / N0 grow with the private record count: declare "
                "mechanism.entry_range or use calibration: exact"
            )
        raise ValueError(
            "mgm-idn needs the range of every output entry: declare entry_range for a custom query"
        )

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
        white = whitened(precision, directions)
        lam = white.lambda_max
        s2 = self._base_l2_sensitivity(domain, neighbours)
        bounds = [s2 * (math.sqrt(lam) if algorithm == "unimodal" else lam)]
        found = self.whitened_bounds(domain, neighbours, white, algorithm, bounds, ratios)
        return [excess * b for b in found]

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

    # -- lattice noise ----------------------------------------------------------------------
    def lattice_coordinates(self, algorithm: Algorithm) -> int:
        """``c``: how many lattice coordinates one record can move (symmetric noise: ``vech``;
        the other noises: every entry)."""
        m, n = self.shape
        if algorithm == "symmetric":
            return m * (m + 1) // 2
        return m * n

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
        """``E``: the worst-case floating-point error of the computed whitened query over the
        domain (docs/bounds.md, Sec. 11).

        Parameters
        ----------
        abs_max : ndarray
            ``sup |x_i|`` per feature.
        whitening : Whitening
            ``A^-1``.
        norm_max : float or None
            ``sup ||x||`` of an L2 ball.
        algorithm : str
            Noise type.
        ratio : float or None
            ``r`` of symmetric noise.
        context : LatticeContext or None
            How the engine sums the query.

        Returns
        -------
        float
            ``E``.
        """
        raise ValueError(f"lattice noise is not available for a {self.kind} query")

    # -- description ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        """JSON-ready description (:func:`mvg_dask.plan.queries.query_from_dict` inverts it)."""
        out: dict[str, object] = {
            "kind": self.kind,
            "features": self.features,
            "records": self.records,
            "shape": list(self.shape),
        }
        for name in ("sensitivity", "gamma"):
            if getattr(self, name) is not None:
                out[f"declared_{name}"] = getattr(self, name)
        if self.entry_range is not None:
            out["declared_entry_range"] = list(self.entry_range)
        out.update(self._extra_dict())
        if not self.records_known:
            out["records_known"] = False
        return out

    def _extra_dict(self) -> dict[str, object]:
        return {}

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments from :meth:`to_dict`."""
        rng = data.get("declared_entry_range")
        return {
            "features": int(data["features"]),
            "records": int(data["records"]),
            "sensitivity": data.get("declared_sensitivity"),
            "gamma": data.get("declared_gamma"),
            "entry_range": None if rng is None else (float(rng[0]), float(rng[1])),
            "records_known": bool(data.get("records_known", True)),
        }
