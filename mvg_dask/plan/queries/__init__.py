"""Query types: each query a :class:`~mvg_dask.plan.queries.base.MatrixQuery` subclass in its own
module, registered by the name a spec gives (docs/concepts/queries.md).

:data:`QUERY_TYPES` maps the spec's ``query`` to its type; :func:`make_query` and
:func:`query_from_dict` build one by name. A new query (a centered covariance, a
cross-covariance, regression sufficient statistics, a grouped release) is a new module here and
one line in :data:`QUERY_TYPES`.
"""

from __future__ import annotations

from typing import Any

from mvg_dask.plan.queries.base import DECLARED_RTOL, DeclaredBoundError, MatrixQuery, Query
from mvg_dask.plan.queries.covariance import CovarianceQuery
from mvg_dask.plan.queries.cross import CrossCovarianceQuery
from mvg_dask.plan.queries.custom import CustomQuery
from mvg_dask.plan.queries.identity import IdentityQuery
from mvg_dask.plan.queries.mean import MeanQuery
from mvg_dask.plan.queries.moment import CenteredCovarianceQuery, RegressionQuery

__all__ = [
    "DECLARED_RTOL",
    "QUERIES",
    "QUERY_TYPES",
    "CenteredCovarianceQuery",
    "CovarianceQuery",
    "CrossCovarianceQuery",
    "CustomQuery",
    "DeclaredBoundError",
    "IdentityQuery",
    "MatrixQuery",
    "Query",
    "RegressionQuery",
    "make_query",
    "query_from_dict",
    "query_type",
]

#: The query types by the name a spec gives.
QUERY_TYPES: dict[str, type[MatrixQuery]] = {
    IdentityQuery.kind: IdentityQuery,
    CovarianceQuery.kind: CovarianceQuery,
    CustomQuery.kind: CustomQuery,
    CenteredCovarianceQuery.kind: CenteredCovarianceQuery,
    RegressionQuery.kind: RegressionQuery,
    CrossCovarianceQuery.kind: CrossCovarianceQuery,
    MeanQuery.kind: MeanQuery,
}
#: The registered names.
QUERIES: tuple[str, ...] = tuple(QUERY_TYPES)


def query_type(kind: str) -> type[MatrixQuery]:
    """The type registered as ``kind``.

    Parameters
    ----------
    kind : str
        A name of ``QUERIES``.

    Returns
    -------
    type
        The query type.
    """
    try:
        return QUERY_TYPES[kind]
    except (KeyError, TypeError):
        raise ValueError(f"query must be one of {', '.join(QUERIES)}, got {kind!r}") from None


def make_query(kind: str, **fields: Any) -> MatrixQuery:
    """The query registered as ``kind``, built from its fields.

    Parameters
    ----------
    kind : str
        A name of ``QUERIES``.
    **fields
        The type's constructor arguments (``features``, ``records``, declared bounds...).

    Returns
    -------
    MatrixQuery
        The query.
    """
    return query_type(kind)(**fields)


def query_from_dict(data: dict[str, Any]) -> MatrixQuery:
    """Rebuild a query from :meth:`MatrixQuery.to_dict` (the inverse, checked by the tests).

    Parameters
    ----------
    data : dict
        A query dictionary.

    Returns
    -------
    MatrixQuery
        The query.
    """
    cls = query_type(data["kind"])
    return cls(**cls.fields_from_dict(data))
