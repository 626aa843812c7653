"""The complete release spec, the checks across its sections, and its hash."""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    field_validator,
    model_validator,
)

from mvg_dask.privacy.accounting import BasicAccountant, GaussianDP, GaussianDPAccountant
from mvg_dask.privacy.registry import CompatibilityError, check_compatible, get_calibration
from mvg_dask.spec.allocation import check_scale_aware, choose_allocation
from mvg_dask.spec.base import _Strict
from mvg_dask.spec.privacy import LedgerSpec, PrivacySpec
from mvg_dask.spec.queries import (
    MOMENT_QUERY_KINDS,
    SQUARE_QUERIES,
    WORD_ROUTES,
    CenteredCovarianceSpec,
    CrossCovarianceQuerySpec,
    GroupBySpec,
    RegressionSpec,
    SimpleQuery,
    _query_kind,
)
from mvg_dask.spec.sections import (
    STREAM_QUERIES,
    DomainSpec,
    InputSpec,
    MechanismSpec,
    OutputSpec,
    StreamSpec,
)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ReleaseSpec(_Strict):
    """A complete release specification."""

    name: str
    release_id: str | None = None
    input: InputSpec
    domain: DomainSpec
    query: SimpleQuery | RegressionSpec | CrossCovarianceQuerySpec | CenteredCovarianceSpec
    mechanism: MechanismSpec = MechanismSpec()
    privacy: PrivacySpec
    output: OutputSpec
    ledger: LedgerSpec | None = None
    group_by: GroupBySpec | None = None
    stream: StreamSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain_centered(cls, data: Any) -> Any:
        """``{centered-covariance: {route: moment}}`` (or ``{}``) is ``centered-covariance``:
        the same release, bytes and spec hash."""
        if not isinstance(data, dict):
            return data
        query = data.get("query")
        if isinstance(query, dict) and set(query) == {"centered-covariance"}:
            params = query["centered-covariance"]
            if params is None or params == {} or params == {"route": "moment"}:
                return {**data, "query": "centered-covariance"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_algorithm(cls, data: Any) -> Any:
        """An exact covariance (or moment) release without an algorithm gets symmetric noise."""
        if not isinstance(data, dict) or _query_kind(data.get("query")) not in SQUARE_QUERIES:
            return data
        mech = data.get("mechanism", {})
        if (
            isinstance(mech, dict)
            and "algorithm" not in mech
            and mech.get("calibration", "exact") == "exact"
        ):
            return {**data, "mechanism": {**mech, "algorithm": "symmetric"}}
        return data

    @field_validator("name", "release_id")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not _ID_RE.match(value):
            raise ValueError(
                "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return value

    @property
    def query_kind(self) -> str:
        """The query's name: ``identity``, ``covariance``, ``centered-covariance``,
        ``regression`` or ``cross-covariance``."""
        return _query_kind(self.query)

    @property
    def centered_route(self) -> str | None:
        """A centered covariance's declared route (``moment`` for ``query:
        centered-covariance``; ``None`` for the other queries)."""
        if isinstance(self.query, CenteredCovarianceSpec):
            return self.query.centered_covariance.route
        return WORD_ROUTES.get(self.query_kind)

    @property
    def mean_share(self) -> float | None:
        """The declared budget share of a mean-first route's mean step (``None``: the plan's)."""
        if isinstance(self.query, CenteredCovarianceSpec):
            return self.query.centered_covariance.mean_share
        return None

    @property
    def cols_variable(self) -> str | None:
        """The second variable of a two-variable cross-covariance (``None`` otherwise)."""
        if not isinstance(self.query, CrossCovarianceQuerySpec):
            return None
        return self.query.cross_covariance.col_variable

    @property
    def regression_target(self) -> str | int | None:
        """The response feature of a regression release (``None`` for the other queries)."""
        return self.query.regression.target if isinstance(self.query, RegressionSpec) else None

    @model_validator(mode="after")
    def _mechanism_fits_query(self) -> ReleaseSpec:
        self._cross_covariance_fits()
        self._mean_first_fits()
        mech = self.mechanism
        kind = self.query_kind
        square = kind in SQUARE_QUERIES
        try:
            # the identity query is m x N with N unknown here: treated as not square
            check_compatible(
                mech.calibration,
                mech.algorithm,
                query_kind=kind,
                psd=square,
                square=square,
                standard_directions=mech.directions.method == "standard",
            )
        except CompatibilityError as exc:
            raise ValueError(f"mechanism.{exc.field}: {exc}") from None
        if kind == "identity" and self.privacy.neighbours == "add-remove":
            raise ValueError(
                "privacy.neighbours: the identity query has one column per record, so "
                "add-remove changes its shape; use replace-one"
            )
        if kind in MOMENT_QUERY_KINDS and self.privacy.neighbours == "add-remove":
            raise ValueError(
                f"privacy.neighbours: a {kind} release divides by the public record count "
                "(replace-one); under add-remove release query: covariance of the records "
                "with a constant feature, or use replace-one"
            )
        if self.ledger is not None and self.privacy.epsilon > self.ledger.budget.epsilon:
            raise ValueError(
                f"privacy.epsilon ({self.privacy.epsilon:g}) exceeds the dataset's whole "
                f"ledger.budget.epsilon ({self.ledger.budget.epsilon:g})"
            )
        if self.ledger is not None:
            _check_fits_alone(self)
        if self.group_by is not None:
            _check_group_by(self)
        if self.stream is not None:
            _check_stream(self)
        check_scale_aware(self)
        if mech.allocation.strategy == "max-pnr" and mech.directions.method != "dp-pca":
            raise ValueError(
                "mechanism.allocation: max-pnr needs DP eigenvalues: use directions: "
                "{method: dp-pca}"
            )
        return self

    def _cross_covariance_fits(self) -> None:
        """What a cross-covariance release offers: unimodal noise, fixed directions,
        replace-one neighbours or add-remove ones with a public normaliser ``N0``."""
        if not isinstance(self.query, CrossCovarianceQuerySpec):
            return
        mech = self.mechanism
        if mech.algorithm != "unimodal":
            raise ValueError(
                f"mechanism.algorithm: a cross-covariance is not symmetric and its columns are "
                f"other features than its rows; its noise is Sigma on the row features and "
                f"Psi (query.cross-covariance.col_allocation, default I) on the column features: "
                f"use unimodal, not {mech.algorithm}"
            )
        if mech.directions.method == "dp-pca":
            raise ValueError(
                "mechanism.directions: DP-PCA directions are not offered for a cross-covariance "
                "(they would be the row features' principal directions); use standard or matrix"
            )
        if self.query.cross_covariance.col_allocation is not None and mech.calibration != "exact":
            raise ValueError(
                "query.cross-covariance.col_allocation: a column covariance Psi is calibrated "
                f"exactly on A^-1 f B^-T; use mechanism.calibration: exact, not {mech.calibration}"
            )
        second = self.query.cross_covariance.col_variable
        if second is not None and self.domain.box is None:
            raise ValueError(
                "domain: a two-variable cross-covariance takes a box for each variable "
                "(domain.box for the input variable, query.cross-covariance.cols.box for "
                f"{second!r}); an l2 ball over the stacked record is not offered"
            )
        missing = self.domain.missing
        if second is not None and not isinstance(missing, str) and isinstance(missing.fill, list):
            raise ValueError(
                "domain.missing.fill: a two-variable cross-covariance fills the NaN of both "
                f"variables (the input's and {second!r}'s) with one value; give one number "
                "(a fill outside a variable's box is clipped into it)"
            )
        if second is not None and second == self.input.variable:
            raise ValueError(
                f"query.cross-covariance.cols.variable: {second!r} is the input variable; "
                "give its column features as a list, cols: [...]"
            )
        if self.privacy.neighbours == "add-remove" and self.privacy.records is None:
            raise ValueError(
                "privacy.records: an add-remove cross-covariance divides by a declared public "
                "normaliser N0 (privacy.records); the release of the sum with a noisy record "
                "count is not offered for it"
            )

    def _mean_first_fits(self) -> None:
        """What the mean-first route offers (docs/bounds.md, Sec. 14): a box domain,
        replace-one neighbours, the exact calibration, fixed directions, no ``group_by``.
        ``auto`` takes the moment route wherever these do not hold."""
        if self.centered_route != "mean-first":
            return
        mech = self.mechanism
        where = "query.centered-covariance.route: mean-first"
        if self.domain.box is None:
            raise ValueError(
                f"{where} centres the records' box on the released mean; declare a box domain "
                "(domain.box), or use route: moment for an l2 ball"
            )
        if self.privacy.neighbours != "replace-one":
            raise ValueError(
                f"{where} divides by the public record count: use privacy.neighbours: "
                "replace-one, or route: moment"
            )
        if mech.calibration != "exact":
            raise ValueError(
                f"{where} composes two Gaussian mechanisms exactly (Gaussian DP); use "
                f"mechanism.calibration: exact, not {mech.calibration}"
            )
        if mech.directions.method != "standard":
            raise ValueError(
                f"{where} takes the standard directions (the covariance's noise is planned on "
                "the shifted box after the mean); use mechanism.directions: {method: standard}"
            )
        if self.group_by is not None:
            raise ValueError(f"{where} is not offered with group_by; use route: moment")


def _check_fits_alone(spec: ReleaseSpec) -> None:
    """Refuse a release that alone exceeds its dataset's budget, by the composition the ledger
    would use for it (its calibration's privacy loss), before anything is read or charged."""
    assert spec.ledger is not None
    p, b = spec.privacy, spec.ledger.budget
    loss = get_calibration(spec.mechanism.calibration).loss(p.epsilon, p.delta)
    if p.neighbours != b.neighbours and spec.ledger.convert_neighbours:
        loss = loss.group2()  # charged by group privacy
    gaussian = isinstance(loss, GaussianDP)
    spent = (GaussianDPAccountant() if gaussian else BasicAccountant()).total([loss], b.delta)
    if spent.fits(b.epsilon, b.delta):
        return
    if isinstance(loss, GaussianDP):
        raise ValueError(
            f"privacy: this release alone exceeds the dataset's budget: a Gaussian mechanism "
            f"(mu = {loss.mu:.4g}) at epsilon = {p.epsilon:g}, delta = {p.delta:g} spends "
            f"epsilon = {spent.epsilon:.4g} at the budget's delta = {b.delta:g}, more than "
            f"ledger.budget.epsilon = {b.epsilon:g}; lower privacy.delta or privacy.epsilon"
        )
    raise ValueError(
        f"privacy.delta ({loss.approx_dp().delta:g}) exceeds the dataset's whole "
        f"ledger.budget.delta ({b.delta:g}): basic composition ({spec.mechanism.calibration} "
        "calibration) adds deltas, so no sequence of releases can fit it"
    )


def _check_group_by(spec: ReleaseSpec) -> None:
    """Refuse a ``group_by`` the grouped release cannot take (docs/bounds.md, "Grouped
    releases": replace-one neighbours, exact calibration, fixed directions)."""
    kind, mech = spec.query_kind, spec.mechanism
    if kind not in MOMENT_QUERY_KINDS:
        raise ValueError(
            f"group_by: a {kind} query cannot be grouped; use query: centered-covariance "
            "(its moment carries each group's count) or query: {regression: {target: ...}}"
        )
    if spec.privacy.neighbours != "replace-one":
        raise ValueError(
            "group_by: a grouped release divides by the public record count: use "
            "privacy.neighbours: replace-one"
        )
    if mech.calibration != "exact":
        raise ValueError(
            f"group_by: a grouped release is calibrated exactly (its joint sensitivity "
            f"across groups); use mechanism.calibration: exact, not {mech.calibration}"
        )
    if mech.directions.method == "dp-pca":
        raise ValueError(
            "group_by: DP-PCA directions are not available for a grouped release; use "
            "mechanism.directions: {method: standard} or {method: matrix}"
        )


def _check_stream(spec: ReleaseSpec) -> None:
    """Refuse a ``stream`` the period release cannot take (docs/guide/streams.md): a query that
    is not a sum over records, or a mechanism that is not one exactly calibrated Gaussian
    mechanism on the lattice with fixed standard directions."""
    kind, mech = spec.query_kind, spec.mechanism
    if kind not in STREAM_QUERIES:
        what = (
            "has one column per record, not a sum over records"
            if kind == "identity"
            else "is not offered in a stream"
        )
        raise ValueError(
            f"stream: the {kind} query {what}; a stream releases a sum-decomposable query: "
            f"{', '.join(STREAM_QUERIES)} (also with group_by)"
        )
    if spec.centered_route not in (None, "moment"):
        raise ValueError(
            "stream: a stream releases the centered covariance by its moment (a sum over "
            "records); use query: centered-covariance (route: moment)"
        )
    if mech.noise != "lattice":
        raise ValueError(
            "stream: a stream adds its periods exactly in integers on the lattice; use "
            f"mechanism.noise: lattice, not {mech.noise}"
        )
    if mech.calibration != "exact":
        raise ValueError(
            "stream: the whole stream is one Gaussian mechanism calibrated exactly; use "
            f"mechanism.calibration: exact, not {mech.calibration}"
        )
    if mech.directions.method != "standard":
        raise ValueError(
            "stream: a stream whitens every period alike with the standard directions; use "
            f"mechanism.directions: {{method: standard}}, not {mech.directions.method}"
        )
    cross = (
        spec.query.cross_covariance if isinstance(spec.query, CrossCovarianceQuerySpec) else None
    )
    if cross is not None and cross.col_allocation is not None:
        raise ValueError(
            "stream: a stream whitens the rows only (Psi = I); remove "
            "query.cross-covariance.col_allocation"
        )
    if mech.algorithm not in ("symmetric", "unimodal"):
        raise ValueError(
            f"stream: a stream adds symmetric or unimodal noise, not {mech.algorithm}; use "
            "mechanism.algorithm: symmetric"
        )


def spec_hash(spec: ReleaseSpec) -> str:
    """A stable hash of everything in the spec but its release id (to recognise a resume)."""
    import hashlib
    import json

    # a spec without group_by hashes as it did before group_by existed
    exclude = {"release_id"} if spec.group_by is not None else {"release_id", "group_by"}
    if spec.stream is None:
        exclude.add("stream")  # a spec without a stream hashes as it did before streams
    data = spec.model_dump(mode="json", exclude=exclude)
    if data["domain"].get("missing") == "error":
        data["domain"].pop("missing")  # missing: error hashes as it did before missing existed
    allocation = data["mechanism"]["allocation"]
    if allocation["strategy"] is None:  # the default hashes as the strategy it resolves to
        allocation["strategy"] = choose_allocation(spec).strategy
    cross = data["query"].get("cross_covariance") if isinstance(data["query"], dict) else None
    if cross is not None and cross.get("col_allocation") is None:
        cross.pop("col_allocation", None)  # Psi = I hashes as it did before Psi existed
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
