"""Compatibility names for the query types of :mod:`mvg_dask.plan.queries`.

``QuerySpec(kind=..., ...)`` builds the registered query type
(:func:`~mvg_dask.plan.queries.make_query`) and ``QuerySpec.from_dict`` rebuilds one
(:func:`~mvg_dask.plan.queries.query_from_dict`). New code uses those and
:class:`~mvg_dask.plan.queries.MatrixQuery` directly.
"""

from __future__ import annotations

from typing import Any, cast

from mvg_dask.plan.queries import (
    DECLARED_RTOL,
    QUERIES,
    DeclaredBoundError,
    MatrixQuery,
    make_query,
    query_from_dict,
)

__all__ = ["DECLARED_RTOL", "QUERIES", "DeclaredBoundError", "MatrixQuery", "QuerySpec"]


class QuerySpec(MatrixQuery):
    """Build the query type registered as ``kind`` (a compatibility constructor: no instance
    of this class is ever made)."""

    def __new__(cls, *, kind: str, **fields: Any) -> QuerySpec:
        return cast(QuerySpec, make_query(kind, **fields))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuerySpec:
        """:func:`~mvg_dask.plan.queries.query_from_dict`."""
        return cast(QuerySpec, query_from_dict(data))
