"""What a query is: the :class:`Query` protocol and the shared :class:`MatrixQuery` base.

Records are the columns of ``X`` (``M`` features x ``N`` records), as in the MVG paper. A query
type states (docs/concepts/queries.md): its per-record contribution, the per-task partial and
the fixed-tree combine the engine sums, the finalize step, its sensitivity bounds (L2 and
whitened, for a box or an L2 ball, under replace-one or add-remove neighbours), the shape of
its noise (a symmetric ``m x m`` matrix or a rectangular ``m x n`` one with ``Sigma (x) Psi``)
and its output. :class:`MatrixQuery` holds what every query shares (declared bounds, checked
against the proved ones) and the hooks of its release (:class:`ReleasedQuery`: stages, output
layout, dry-run line); a new query subclasses it and registers its name in
:data:`mvg_dask.plan.queries.QUERY_TYPES`.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.low_rank import LowRankPrecision
from mvg_dask.plan.queries.bounds import DECLARED_RTOL, DeclaredBoundError, DeclaredBounds
from mvg_dask.plan.queries.release import ReleasedQuery
from mvg_dask.plan.queries.whitened import WhitenedBounds
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm

__all__ = [
    "DECLARED_RTOL",
    "DeclaredBoundError",
    "MatrixQuery",
    "NoiseShape",
    "Query",
    "summed",
]

#: ``symmetric``: an ``m x m`` symmetric output (noise ``A S A^T`` or symmetrised);
#: ``rectangular``: an ``m x n`` output with noise ``Sigma (x) Psi``.
NoiseShape = Literal["symmetric", "rectangular"]


def summed(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left + right``, formed in whichever operand is writeable: the combine of a query that
    sums its partials. The engine passes partials it owns and never reads again (a transferred
    one may be a read-only view of a network frame), and a fresh ``M x M`` array per step
    costs its page faults, several times the addition's own cost at thousands of features;
    ``a + b`` and ``b + a`` are the same IEEE sum, so the bytes do not depend on which.

    Parameters
    ----------
    left, right : ndarray
        Two partials of one shape.

    Returns
    -------
    ndarray
        Their sum (possibly ``left`` or ``right`` itself).
    """
    out = left if left.flags.writeable else right if right.flags.writeable else None
    return np.add(left, right, out=out)


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

    def check_neighbours(self, neighbours: Neighbours) -> None:
        """Refuse a neighbouring relation the query cannot take."""

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

    def lattice_coordinates(self, algorithm: Algorithm) -> int:
        """How many lattice coordinates one record can move."""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description."""


@dataclass(frozen=True)
class MatrixQuery(DeclaredBounds, WhitenedBounds, ReleasedQuery):
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
    groups : tuple of (str or int), optional
        A grouped release (``group_by``): the declared labels, one released value per group,
        each the query of that group's records with the global, public ``N``. Its
        sensitivities are the joint ones of the concatenated groups, ``max(s_replace-one,
        sqrt(2) s_add-remove)`` (docs/bounds.md, Sec. 15 and 17).
    group_variable : str, optional
        The input variable holding each record's group label (given with ``groups``).
    """

    kind: ClassVar[str] = ""
    #: Whether the output has one column per record (the identity): the noise is drawn record
    #: range by record range and the release has no diagonal.
    per_record_columns: ClassVar[bool] = False
    #: Whether the query sums the augmented records ``[x - c; s]`` (the moment queries): its
    #: ``features`` then count the constant term too.
    augmented: ClassVar[bool] = False

    features: int
    records: int
    _: KW_ONLY
    sensitivity: float | None = None
    gamma: float | None = None
    entry_range: tuple[float, float] | None = None
    records_known: bool = True
    groups: tuple[str | int, ...] | None = None
    group_variable: str | None = None

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
        if self.groups is not None:
            self._check_groups()
        if self.entry_range is not None:
            a, b = self.entry_range
            if not (math.isfinite(a) and math.isfinite(b) and a < b):
                raise ValueError(f"entry_range must be finite with lower < upper, got {a}, {b}")

    def _check_fields(self) -> None:
        """Refuse fields the query type cannot take (a hook)."""

    def _check_groups(self) -> None:
        if not self.augmented:
            raise ValueError(
                f"a {self.kind} query cannot be grouped: group a centered-covariance or a "
                "regression query (its moment carries each group's count)"
            )
        if not self.groups or self.group_variable is None:
            raise ValueError("a grouped query needs its group labels and their variable")
        if not self.records_known:
            raise ValueError("a grouped query divides by the public record count (replace-one)")

    # -- grouped releases (docs/bounds.md, Sec. 15 and 17) ------------------------------
    @property
    def group_count(self) -> int:
        """``G``: the number of released groups (``1`` for an ungrouped query)."""
        return 1 if self.groups is None else len(self.groups)

    def ungrouped(self) -> MatrixQuery:
        """The query of one group (this query without its groups)."""
        return self if self.groups is None else replace(self, groups=None, group_variable=None)

    def released_float_error(
        self,
        abs_max: np.ndarray,
        whitening: ferr.Whitening,
        *,
        norm_max: float | None,
        algorithm: Algorithm,
        ratio: float | None,
        context: Any,
    ) -> float:
        """:meth:`float_error` as the lattice charges it: times ``sqrt(2)`` for a grouped
        release (two groups' computed values differ between neighbours; docs/bounds.md,
        Sec. 17)."""
        err = self.float_error(
            abs_max, whitening, norm_max=norm_max, algorithm=algorithm, ratio=ratio, context=context
        )
        return err if self.groups is None else math.sqrt(2.0) * err

    def released_lattice_coordinates(self, algorithm: Algorithm) -> int:
        """:meth:`lattice_coordinates` as the lattice charges them: twice as many for a
        grouped release (the two changed groups' coordinates; ``grid sqrt(2 c)``)."""
        c = self.lattice_coordinates(algorithm)
        return c if self.groups is None else 2 * c

    def record_domain(self, domain: RecordDomain) -> RecordDomain:
        """The domain of what one record contributes through, given the records' declared
        ``domain``: ``domain`` itself, or (the moment queries) the augmented records'. Every
        bound of the query is taken over it.

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            The declared record domain.

        Returns
        -------
        BoxDomain or L2BallDomain
            The query's record domain.
        """
        return domain

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
    def column_noise_variances(self) -> np.ndarray | None:
        """The diagonal of a fixed column covariance ``Psi`` of unimodal noise (a
        cross-covariance's column allocation); ``None``: ``Psi = I``."""
        return None

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
        """Two partials combined (one node of the fixed tree; it may reuse an operand's
        memory: the engine never reads a combined partial again)."""
        raise NotImplementedError(f"the {self.kind} query is not computed by the engine")

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """The query's value from the combined partials."""
        raise NotImplementedError(f"the {self.kind} query is not computed by the engine")

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
        if self.groups is not None:  # only when set: an ungrouped plan keeps its bytes
            out["groups"] = list(self.groups)
            out["group_variable"] = self.group_variable
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
            "groups": None if data.get("groups") is None else tuple(data["groups"]),
            "group_variable": data.get("group_variable"),
        }
