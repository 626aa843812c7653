"""The sensitivities a query proves over a record domain, and the declared ones it checks.

:class:`DeclaredBounds` holds the rules every query shares: a declared ``s_2``, ``gamma`` or
entry range is used as declared for a custom query, and for a built-in one only when it is at
least the bound the domain proves (:class:`DeclaredBoundError` otherwise; docs/bounds.md,
Sec. 12). A query type gives its proved bounds through the hooks.
"""

from __future__ import annotations

import math
from typing import ClassVar

from mvg_dask.plan.domain import Neighbours, RecordDomain

__all__ = [
    "DECLARED_RTOL",
    "DeclaredBoundError",
    "DeclaredBounds",
    "at_least",
    "check_grouped_neighbours",
]

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


def check_grouped_neighbours(neighbours: Neighbours) -> None:
    """Refuse a neighbouring relation other than replace-one for a grouped release."""
    if neighbours != "replace-one":
        raise ValueError(
            "a grouped release divides by the public record count: it takes replace-one "
            f"neighbours, not {neighbours}"
        )


def at_least(x: float, digits: int = 6) -> str:
    """``x`` rounded up to ``digits`` significant digits (a value one may declare)."""
    text = f"{x:.{digits}g}"
    step = 10.0 ** (math.floor(math.log10(abs(x))) - digits + 1)
    while float(text) < x:
        text = f"{float(text) + step:.{digits}g}"
    return text


class DeclaredBounds:
    """The proved and declared ``s_2``, ``gamma`` and entry range of a query (a mixin of
    :class:`~mvg_dask.plan.queries.base.MatrixQuery`, which holds the fields)."""

    kind: ClassVar[str]
    records: int
    sensitivity: float | None
    gamma: float | None
    entry_range: tuple[float, float] | None
    records_known: bool
    groups: tuple[str | int, ...] | None

    def ungrouped(self) -> DeclaredBounds:
        """The query of one group (a hook of :class:`~mvg_dask.plan.queries.base.MatrixQuery`)."""
        return self

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
        proved = self.joint_l2_sensitivity(domain, neighbours)
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

    def joint_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """:meth:`proved_l2_sensitivity` of the released value: for a grouped release (the
        concatenation of every group's query, each with the public ``N``) the joint bound
        ``max(s_replace-one, sqrt(2) s_add-remove)`` of one group's query (docs/bounds.md,
        Sec. 15 and 17: a neighbour replaces a record within its group, or moves it to
        another group, or out of the declared ones).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            Declared record domain.
        neighbours : {"replace-one"}
            Neighbouring relation (a grouped release takes replace-one only).

        Returns
        -------
        float or None
            The bound.
        """
        if self.groups is None:
            return self.proved_l2_sensitivity(domain, neighbours)
        check_grouped_neighbours(neighbours)
        one = self.ungrouped()
        within = one.proved_l2_sensitivity(domain, "replace-one")
        moved = one.proved_l2_sensitivity(domain, "add-remove")
        assert within is not None and moved is not None
        return max(within, math.sqrt(2.0) * moved)

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
        proved = self.joint_l2_sensitivity(domain, neighbours)
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
