"""The spec sections of privacy: the release's parameters, the ledger and its budget."""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import (
    Field,
    model_validator,
)

from mvg_dask.spec.base import _Strict


class PrivacySpec(_Strict):
    """The privacy parameters of the whole release (direction step included).

    Under add-remove neighbours the record count is private: a covariance release divides by a
    declared public normaliser ``records`` (``N0``), or, without one, releases the sum
    ``X X^T`` and a noisy record count that spends ``count_share`` of the budget.

    ``max_records``: a public upper bound on the record count of an add-remove covariance with
    lattice noise (the floating-point error of a sum grows with its length, and the private
    count may not set it); ``2**32`` by default. An input with more records is refused before
    anything is read.
    """

    epsilon: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    delta: Annotated[float, Field(gt=0, lt=1)]
    neighbours: Literal["replace-one", "add-remove"] = "replace-one"
    records: Annotated[int, Field(ge=1)] | None = None
    count_share: Annotated[float, Field(gt=0, lt=0.5)] = 0.05
    max_records: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _records_is_for_add_remove(self) -> PrivacySpec:
        if self.records is not None and self.neighbours != "add-remove":
            raise ValueError(
                "records is a public normaliser for add-remove neighbours; under replace-one "
                "the record count is public and used as it is: remove privacy.records"
            )
        if self.max_records is not None and self.neighbours != "add-remove":
            raise ValueError(
                "max_records bounds a private record count (add-remove neighbours); under "
                "replace-one the record count is public: remove privacy.max_records"
            )
        return self


class BudgetSpec(_Strict):
    """A dataset's total privacy budget, kept in one neighbour relation."""

    epsilon: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    delta: Annotated[float, Field(gt=0, lt=1)]
    neighbours: Literal["replace-one", "add-remove"] = "replace-one"


def _url_has_password(url: str) -> bool:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    query = parse_qsl(parts.query, keep_blank_values=True)
    return ":" in userinfo or any(k.lower() == "password" for k, _ in query)


_LEDGER_SCHEMES = ("sqlite:///", "memory://")


class LedgerSpec(_Strict):
    """The privacy ledger this release is charged to.

    Exactly one of ``url`` (``postgresql://...`` or ``sqlite:///...``) and ``path`` (a SQLite
    file, the embedded default). A PostgreSQL password comes from ``PGPASSWORD``, a libpq
    passfile or ``password_file``, never from the URL. ``convert_neighbours`` charges an
    add-remove release to a replace-one budget by group privacy (2 epsilon, (1 + e^epsilon)
    delta, 2 mu).
    """

    url: str | None = None
    path: str | None = None
    password_file: str | None = None
    dataset: str
    budget: BudgetSpec
    convert_neighbours: bool = False

    @model_validator(mode="after")
    def _one_location(self) -> LedgerSpec:
        if (self.url is None) == (self.path is None):
            raise ValueError(
                "give exactly one of ledger.url (postgresql://... or sqlite:///...) and "
                "ledger.path (a SQLite file)"
            )
        postgres = self.url is not None and self.url.startswith(("postgresql://", "postgres://"))
        if self.url is not None and not postgres and not self.url.startswith(_LEDGER_SCHEMES):
            raise ValueError("ledger.url: use postgresql://..., sqlite:///path or memory://name")
        if postgres and _url_has_password(self.url or ""):
            # the URL is not repeated here: it holds a secret
            raise ValueError(
                "ledger.url carries a password; remove it and set PGPASSWORD, use a libpq "
                "passfile (PGPASSFILE, ~/.pgpass or ?passfile=...) or ledger.password_file"
            )
        if self.password_file is not None and not postgres:
            raise ValueError("ledger.password_file: only for a postgresql:// ledger.url")
        return self

    @property
    def location(self) -> str:
        """The ledger's URL or path (for :func:`mvg_dask.ledger.open_ledger`)."""
        loc = self.url if self.url is not None else self.path
        assert loc is not None
        return loc
