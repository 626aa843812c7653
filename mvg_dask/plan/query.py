"""Query descriptions: shape, structure, L2 sensitivity ``s_2``, ``gamma`` and Mahalanobis bounds.

Records are the columns of ``X`` (``M`` features x ``N`` records), as in the MVG paper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mvg_dask.plan.domain import L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.low_rank import LowRankPrecision
from mvg_dask.privacy import sensitivity as sens
from mvg_dask.privacy.calibration import Algorithm

QueryKind = Literal["identity", "covariance", "custom"]
QUERIES: tuple[QueryKind, ...] = ("identity", "covariance", "custom")

#: A declared bound within this relative distance below the proved one counts as the proved one
#: (a value typed with fewer digits, or computed in another order); the larger is used.
DECLARED_RTOL = 1e-9


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


def _at_least(x: float, digits: int = 6) -> str:
    """``x`` rounded up to ``digits`` significant digits (a value one may declare)."""
    text = f"{x:.{digits}g}"
    step = 10.0 ** (math.floor(math.log10(abs(x))) - digits + 1)
    while float(text) < x:
        text = f"{float(text) + step:.{digits}g}"
    return text


@dataclass(frozen=True, kw_only=True)
class QuerySpec:
    """A matrix-valued query ``f(X)`` and what the calibrations need to know about it.

    Parameters
    ----------
    kind : {"identity", "covariance", "custom"}
        ``identity``: ``f(X) = X`` (``m x N``); ``covariance``: ``f(X) = X X^T / N`` (``m x m``,
        symmetric PSD, ``N`` public); ``custom``: a user query of declared ``shape`` and ``s_2``.
    features : int
        ``M``, the number of features (rows of ``X``).
    records : int
        ``N``, the number of records (columns of ``X``).
    shape : tuple of int, optional
        Output shape of a custom query.
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
    symmetric, psd : bool
        Structure of a custom query's output.
    records_known : bool, default True
        ``True``: ``records`` is the dataset's record count, public (replace-one neighbours).
        ``False`` (add-remove covariance): the record count is private and never used;
        ``records`` is a public normaliser ``N0`` (``1`` for the unnormalised ``X X^T``), so
        ``f(X) = X X^T / N0`` changes by exactly ``x x^T / N0`` when a record is added or
        removed, and ``gamma`` or an entry range (which grow with the private count) must be
        declared by calibrations that need them.
    """

    kind: QueryKind
    features: int
    records: int
    shape_: tuple[int, int] | None = None
    sensitivity: float | None = None
    gamma: float | None = None
    entry_range: tuple[float, float] | None = None
    symmetric: bool = False
    psd: bool = False
    records_known: bool = True

    def __post_init__(self) -> None:
        if self.kind not in QUERIES:
            raise ValueError(f"query must be one of {', '.join(QUERIES)}, got {self.kind!r}")
        if self.features < 1 or self.records < 1:
            raise ValueError(
                f"the data needs at least one feature and one record, got "
                f"{self.features} x {self.records}"
            )
        for name in ("sensitivity", "gamma"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"declared {name} must be a finite number > 0, got {value!r}")
        if self.kind == "custom":
            if self.shape_ is None or min(self.shape_) < 1:
                raise ValueError("a custom query needs its output shape (m, n)")
            if self.sensitivity is None:
                raise ValueError("a custom query needs its declared L2 sensitivity s2")
        if self.entry_range is not None:
            a, b = self.entry_range
            if not (math.isfinite(a) and math.isfinite(b) and a < b):
                raise ValueError(f"entry_range must be finite with lower < upper, got {a}, {b}")

    @classmethod
    def identity(cls, features: int, records: int, **overrides: object) -> QuerySpec:
        """The identity query ``f(X) = X``."""
        return cls(kind="identity", features=features, records=records, **overrides)  # type: ignore[arg-type]

    @classmethod
    def covariance(cls, features: int, records: int, **overrides: object) -> QuerySpec:
        """The covariance (second moment) query ``f(X) = X X^T / N``."""
        return cls(kind="covariance", features=features, records=records, **overrides)  # type: ignore[arg-type]

    @property
    def shape(self) -> tuple[int, int]:
        """Output shape ``(m, n)``."""
        if self.kind == "identity":
            return (self.features, self.records)
        if self.kind == "covariance":
            return (self.features, self.features)
        assert self.shape_ is not None
        return self.shape_

    @property
    def is_symmetric(self) -> bool:
        """True when every output is a symmetric matrix."""
        return self.kind == "covariance" or self.symmetric

    @property
    def is_psd(self) -> bool:
        """True when every output is symmetric positive semi-definite."""
        return self.kind == "covariance" or (self.symmetric and self.psd)

    def _check_neighbours(self, neighbours: Neighbours) -> None:
        if self.kind == "identity" and neighbours == "add-remove":
            raise ValueError(
                "the identity query has one output column per record, so add/remove neighbours "
                "change its shape; use neighbours: replace-one"
            )

    def l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``s_2(f) = sup ||f(X) - f(X')||_F`` over neighbouring datasets.

        Identity, replace-one: ``sup ||x - x'||`` (``||w||`` for a box, ``2C`` for a ball).
        Covariance: ``sqrt(2) R / N`` (replace-one; ``||xx^T - x'x'^T||_F^2 =
        ||x||^4 + ||x'||^4 - 2 (x^T x')^2``), ``R / N`` (add/remove), ``R = sup ||x||^2``.
        On a sign-definite box (every feature's interval on one side of 0, e.g. ``[0, 1]^m``)
        the replace-one value is ``R / N`` too (docs/bounds.md, Thm. 2 and Cor. 3; attained by
        ``x`` the far corner, ``x'`` the near one). The MVG paper used the looser ``2 R / N``;
        declare ``sensitivity`` to reproduce it.

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
            it and the proved bound).

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
                f"{_at_least(proved)}",
            )
        return max(self.sensitivity, proved)

    def proved_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """The ``s_2`` the record domain proves, ignoring any declared value.

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one", "add-remove"}
            Neighbouring relation.

        Returns
        -------
        float or None
            The bound of :meth:`l2_sensitivity`; ``None`` for a custom query (none is proved).
        """
        self._check_neighbours(neighbours)
        if self.kind == "custom":
            return None
        if self.kind == "identity":
            return domain.diff_norm()
        R = domain.sup_norm_sq()
        one_sided = neighbours == "add-remove" or domain.sign_definite
        return (1.0 if one_sided else math.sqrt(2.0)) * R / self.records

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

        Raises
        ------
        DeclaredBoundError
            A built-in query's declared value is below the proved bound.
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

        Identity: ``sup ||x - x'||_1``. Covariance: ``2 (sum_i a_i)^2 / N`` (replace-one) or
        ``(sum_i a_i)^2 / N`` (add/remove), since ``||x x^T||_1 = ||x||_1^2``.

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
        self._check_neighbours(neighbours)
        if self.kind == "identity":
            return domain.diff_l1()
        if self.kind == "covariance":
            if isinstance(domain, L2BallDomain):
                l1 = domain.radius**2 * domain.m  # ||x||_1^2 <= m ||x||_2^2
            else:
                l1 = float(np.sum(domain.abs_max)) ** 2
            return (2.0 if neighbours == "replace-one" else 1.0) * l1 / self.records
        m, n = self.shape
        assert self.sensitivity is not None
        return self.sensitivity * math.sqrt(m * n)

    def sup_frobenius(self, domain: RecordDomain) -> float:
        """``gamma = sup ||f(X)||_F`` over the domain.

        Identity: ``sqrt(N R)``; covariance: ``R`` (``||X X^T||_F / N <= sum ||x_j||^2 / N``).

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
                    f"{_at_least(proved)}",
                )
            return max(self.gamma, proved)
        R = domain.sup_norm_sq()
        if not self.records_known:
            raise ValueError(
                "sup ||X X^T / N0||_F grows with the private record count: declare "
                "mechanism.gamma (a bound that holds for every dataset, e.g. N_max R / N0) or "
                "use calibration: exact"
            )
        if self.kind == "identity":
            return math.sqrt(self.records * R)
        if self.kind == "covariance":
            return R
        raise ValueError(
            "this calibration needs gamma = sup ||f(X)||_F: declare it for a custom query"
        )

    def proved_sup_frobenius(self, domain: RecordDomain) -> float | None:
        """The ``gamma`` the record domain proves, ignoring any declared value.

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.

        Returns
        -------
        float or None
            ``sqrt(N R)`` (identity) or ``R`` (covariance); ``None`` for a custom query and
            when the record count is private (the bound grows with it).
        """
        if self.kind == "custom" or not self.records_known:
            return None
        R = domain.sup_norm_sq()
        return math.sqrt(self.records * R) if self.kind == "identity" else R

    def proved_entry_range(self, domain: RecordDomain) -> tuple[float, float] | None:
        """The range of every output entry the record domain proves (declared value ignored).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.

        Returns
        -------
        tuple of float or None
            ``(a, b)``; ``None`` for a custom query and for a covariance whose record count is
            private.
        """
        if self.kind == "identity":
            return domain.entry_range()
        if self.kind == "custom" or not self.records_known:
            return None
        if isinstance(domain, L2BallDomain):
            return -(domain.radius**2), domain.radius**2
        return sens.box_outer_entry_range(domain.lower, domain.upper)

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
        if self.entry_range is not None:
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
        if self.kind == "identity":
            return domain.entry_range()
        if not self.records_known:
            raise ValueError(
                "the entries of X X^T / N0 grow with the private record count: declare "
                "mechanism.entry_range or use calibration: exact"
            )
        if self.kind == "covariance":
            if isinstance(domain, L2BallDomain):
                return -(domain.radius**2), domain.radius**2
            return sens.box_outer_entry_range(domain.lower, domain.upper)
        raise ValueError(
            "mgm-idn needs the range of every output entry: declare entry_range for a custom query"
        )

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

        * any query: ``s_2 sqrt(lambda_max(Sigma^-1))`` (unimodal), ``s_2 lambda_max(Sigma^-1)``
          (equi-modal, symmetric);
        * identity, replace-one: ``sqrt(sup (x - x')^T Sigma^-1 (x - x'))``;
        * covariance, equi-modal: ``sqrt(2) S / N`` (replace-one), ``S / N`` (add/remove) with
          ``S = sup x^T Sigma^-1 x``, and docs/bounds.md Thm. 1/2 at ``r = 1/2``;
        * covariance, symmetric: ``sqrt(Q*(r) / r) / N``, ``Q*`` of docs/bounds.md Thm. 1/2;
        * covariance, unimodal: ``2 sqrt(S R) / N`` (replace-one), ``sqrt(S R) / N`` (add/remove).

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
        self._check_neighbours(neighbours)
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
        self._check_neighbours(neighbours)
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
        ratios: Sequence[float | None],
    ) -> list[float]:
        """The domain's bounds, times ``declared s_2 / proved s_2`` when a larger ``s_2`` is
        declared for a built-in query (docs/bounds.md, Sec. 12)."""
        excess = self.sensitivity_excess(domain, neighbours)
        bounds = self._mahalanobis_domain(
            domain, neighbours, precision, algorithm, directions, ratios
        )
        return [excess * b for b in bounds]

    def _base_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """The proved ``s_2`` of a built-in query, the declared one of a custom query."""
        proved = self.proved_l2_sensitivity(domain, neighbours)
        if proved is not None:
            return proved
        assert self.sensitivity is not None
        return self.sensitivity

    def _mahalanobis_domain(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        precision: np.ndarray | LowRankPrecision,
        algorithm: Algorithm,
        directions: np.ndarray | None,
        ratios: Sequence[float | None],
    ) -> list[float]:
        if isinstance(precision, LowRankPrecision):
            if np.all(precision.top == precision.rest):  # P = p I: the diagonal path, in O(m)
                precision = np.full(precision.m, precision.rest)
            else:
                return self._mahalanobis_low_rank(domain, neighbours, precision, algorithm, ratios)
        diagonal = np.ndim(precision) == 1
        if diagonal and directions is not None:
            raise ValueError("a precision vector means standard directions: pass directions=None")
        p_diag = np.maximum(np.asarray(precision, dtype=np.float64), 0.0) if diagonal else None
        lam = float(np.max(p_diag)) if p_diag is not None else sens.lambda_max(precision)
        s2 = self._base_l2_sensitivity(domain, neighbours)
        bounds = [s2 * (math.sqrt(lam) if algorithm == "unimodal" else lam)]
        if self.kind == "identity":
            diff = (
                domain.sup_quadratic_diff_diag(p_diag)
                if p_diag is not None
                else domain.sup_quadratic_diff(precision)
            )
            bounds.append(math.sqrt(diff))
        if self.kind != "covariance" or algorithm == "unimodal":
            if self.kind == "covariance":
                S = (
                    domain.sup_quadratic_diag(p_diag)
                    if p_diag is not None
                    else domain.sup_quadratic(precision)
                )
                factor = 2.0 if neighbours == "replace-one" else 1.0
                bounds.append(factor * math.sqrt(S * domain.sup_norm_sq()) / self.records)
            return [float(min(bounds)) for _ in ratios]
        S = (
            domain.sup_quadratic_diag(p_diag)
            if p_diag is not None
            else domain.sup_quadratic(precision)
        )
        N = self.records
        if p_diag is not None:
            p = p_diag
            T, sign_definite = domain.coordinate_sups_diag(p)
        else:
            if directions is None:
                _, directions = np.linalg.eigh(precision)
            W = np.asarray(directions, dtype=np.float64)
            p = np.maximum(np.einsum("ki,kl,li->i", W, precision, W), 0.0)
            scale = float(np.max(np.abs(precision)))
            if np.max(np.abs((W * p) @ W.T - precision)) > 1e-6 * scale:
                raise ValueError("the precision matrix is not diagonal in these directions")
            T, sign_definite = domain.coordinate_sups(W, p)
        top = np.sort(p)[::-1]
        # Lemma 3: ||y||^2 ||y'||^2 - (y.y')^2 <= lambda_1 lambda_2 ||x||^2 ||x'||^2
        area = float(top[0] * top[1]) * domain.sup_norm_sq() ** 2 if p.size > 1 else 0.0
        return _symmetric_bounds(
            bounds, T, S, sign_definite, area, algorithm, neighbours, N, ratios
        )

    def _mahalanobis_low_rank(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        precision: LowRankPrecision,
        algorithm: Algorithm,
        ratios: Sequence[float | None],
    ) -> list[float]:
        """The bounds of :meth:`_mahalanobis` for ``P = p_c I + U diag(p_U - p_c) U^T`` and the
        factor ``B = P^(-1/2)``: the whitened record is ``y = P^(1/2) x`` in the standard basis
        (docs/bounds.md, Sec. 10); no ``m x m`` matrix, O(m^2 k) at most."""
        lam = precision.lambda_max
        s2 = self._base_l2_sensitivity(domain, neighbours)
        bounds = [s2 * (math.sqrt(lam) if algorithm == "unimodal" else lam)]
        if self.kind == "identity":
            bounds.append(math.sqrt(precision.sup_quadratic_diff(domain)))
        if self.kind != "covariance":
            return [float(min(bounds)) for _ in ratios]
        S = precision.sup_quadratic(domain)
        N = self.records
        if algorithm == "unimodal":
            factor = 2.0 if neighbours == "replace-one" else 1.0
            bounds.append(factor * math.sqrt(S * domain.sup_norm_sq()) / N)
            return [float(min(bounds)) for _ in ratios]
        T, sign_definite = precision.coordinate_sups(domain)
        l1, l2 = precision.top_two()
        area = l1 * l2 * domain.sup_norm_sq() ** 2
        return _symmetric_bounds(
            bounds, T, S, sign_definite, area, algorithm, neighbours, N, ratios
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description."""
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
        if self.kind == "custom":
            out["symmetric"] = self.symmetric
            out["psd"] = self.psd
        if not self.records_known:
            out["records_known"] = False
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuerySpec:
        """Rebuild a query from :meth:`to_dict` (the inverse, checked by the tests)."""
        rng = data.get("declared_entry_range")
        return cls(
            kind=data["kind"],
            features=int(data["features"]),
            records=int(data["records"]),
            shape_=tuple(data["shape"]) if data["kind"] == "custom" else None,
            sensitivity=data.get("declared_sensitivity"),
            gamma=data.get("declared_gamma"),
            entry_range=None if rng is None else (float(rng[0]), float(rng[1])),
            symmetric=bool(data.get("symmetric", False)),
            psd=bool(data.get("psd", False)),
            records_known=bool(data.get("records_known", True)),
        )


def _symmetric_bounds(
    bounds: list[float],
    T: np.ndarray,
    S: float,
    sign_definite: bool,
    area: float,
    algorithm: Algorithm,
    neighbours: Neighbours,
    N: float,
    ratios: Sequence[float | None],
) -> list[float]:
    """The covariance bounds of equi-modal and symmetric noise from the whitened records'
    ``T``, ``S``, signs and area (dense, diagonal or low-rank precision alike): equi-modal's
    ``sqrt(2) S / N`` (``S / N`` add/remove) and Theorem 1/2 for every ratio, each the least of
    ``bounds`` and its own."""
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
