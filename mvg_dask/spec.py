"""Release specifications (YAML), validated before any data is read.

Unknown keys are errors, every field is checked, and every error message names the field (its
dotted path) and what to do. :func:`load_spec` turns any problem into a :class:`SpecError`.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mvg_dask.privacy.accounting import BasicAccountant, GaussianDP, GaussianDPAccountant
from mvg_dask.privacy.allocation import AllocationStrategy
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.privacy.registry import CompatibilityError, check_compatible, get_calibration

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_GLOB_CHARACTERS = "*?["  # what makes fsspec (glob.has_magic) treat a path as a pattern


#: the URL schemes of the local filesystem (a plain path has the first): a release is written to
#: a staging directory renamed into place; every other scheme is written in place under a claim.
#: The one list of them: the engine's store registry (:mod:`mvg_dask.engine.store`) gives each
#: its local entry and every other scheme an entry of its own (see docs/howto/object-storage.md)
LOCAL_SCHEMES = ("file",)


def url_scheme(store: str) -> str:
    """The scheme of a store's URL as written, parsed without fsspec: ``file`` for a plain path;
    for a chained URL its chain (``simplecache::s3``, ``simplecache::file`` for a chain ending in
    a plain path)."""
    if "://" in store:
        return store.split("://", 1)[0]
    if "::" in store:
        return f"{store.rsplit('::', 1)[0]}::{LOCAL_SCHEMES[0]}"
    return LOCAL_SCHEMES[0]


def is_local(store: str) -> bool:
    """True for a plain path or a ``file://`` URL (a scheme of :data:`LOCAL_SCHEMES`)."""
    return url_scheme(store) in LOCAL_SCHEMES


class SpecError(ValueError):
    """A release spec is invalid; the message names the field and the remedy."""


def _takes_a_number_only(annotation: object) -> bool:
    """True for a field whose values are numbers (or lists of numbers) and never strings."""
    seen: list[object] = []

    def walk(a: object) -> None:
        seen.append(a)
        for arg in typing.get_args(a):
            walk(arg)

    walk(annotation)
    numeric = any(a in (float, int) for a in seen)
    textual = any(a is str or typing.get_origin(a) is Literal for a in seen)
    return numeric and not textual


def _first_string(value: object) -> str | None:
    """``value`` if it is a string, else the first string of a list or tuple (or ``None``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return next((v for v in value if isinstance(v, str)), None)
    return None


def _reads_as_a_number(text: str) -> bool:
    """Whether ``text``, written unquoted in a spec, would be a number (so a string holding it
    was quoted)."""
    tag = SpecLoader("").resolve(yaml.ScalarNode, text.strip(), (True, False))
    return tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_number_written_as_a_string(cls, value: object, info: ValidationInfo) -> object:
        # pydantic's lax mode reads "1.0" as 1.0; a spec that quotes a number is a typo to show
        field = cls.model_fields.get(info.field_name or "")
        text = _first_string(value)
        if field is not None and text is not None and _takes_a_number_only(field.annotation):
            if _reads_as_a_number(text):
                written = text.strip()
                raise ValueError(
                    f"a number, not the quoted string {text!r}: write {written} without quotes"
                )
            raise ValueError(f"a number, not the string {text!r}")
        return value


Scalars = float | list[float]


class InputSpec(_Strict):
    """Where the data is: a Zarr store (path or fsspec URL) and the variable's dimensions."""

    store: str
    variable: str = "X"
    record_dim: str = "record"
    feature_dim: str = "feature"
    storage_options: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _dims_differ(self) -> InputSpec:
        if self.record_dim == self.feature_dim:
            raise ValueError("record_dim and feature_dim must be different dimension names")
        return self


class BoxSpec(_Strict):
    """A per-feature box (scalars apply to every feature)."""

    lower: Scalars
    upper: Scalars

    @model_validator(mode="after")
    def _finite(self) -> BoxSpec:
        for name in ("lower", "upper"):
            value = getattr(self, name)
            values = value if isinstance(value, list) else [value]
            if not values or not all(math.isfinite(v) for v in values):
                raise ValueError(f"box {name} must be finite numbers")
        if not isinstance(self.lower, list) and not isinstance(self.upper, list):
            if self.lower >= self.upper:
                raise ValueError(f"box lower ({self.lower:g}) must be < upper ({self.upper:g})")
        return self


class MissingSpec(_Strict):
    """``missing: {fill: v}``: each NaN of the input becomes the public value ``v`` (one number
    for every feature, or one per feature) before the domain check, so a fill outside the box
    is clipped like any value (docs/howto/own-data.md, "Missing values")."""

    fill: Scalars

    @field_validator("fill")
    @classmethod
    def _finite_fill(cls, value: float | list[float]) -> float | list[float]:
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("give one number, or one per feature")
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"fill values must be finite numbers (got {value!r})")
        return value


def _missing_kind(value: object) -> str:
    return "tag:error" if isinstance(value, str) else "tag:fill"


#: ``domain.missing``: ``error``, or ``{fill: ...}`` (an error names one branch only)
Missing = Annotated[
    Annotated[Literal["error"], Tag("tag:error")] | Annotated[MissingSpec, Tag("tag:fill")],
    Discriminator(_missing_kind),
]


class DomainSpec(_Strict):
    """The declared record domain and what to do with values outside it.

    ``missing``: what a NaN in the input does. ``error`` (the default) aborts the release when
    the NaN is read (after the reservation: the release stays charged); ``{fill: v}`` replaces
    each NaN by the public value ``v`` (a number, or one per feature) before the domain check
    and clip, so the release completes. Infinite values are not missing: they always abort.
    """

    box: BoxSpec | None = None
    l2_norm: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    on_violation: Literal["clip", "error"] = "clip"
    missing: Missing = "error"

    @field_validator("missing", mode="before")
    @classmethod
    def _missing_word(cls, value: object) -> object:
        if isinstance(value, str) and value.strip() != "error":
            raise ValueError(f"error or {{fill: <a number, or one per feature>}}, not {value!r}")
        return value

    @model_validator(mode="after")
    def _one_domain(self) -> DomainSpec:
        if (self.box is None) == (self.l2_norm is None):
            raise ValueError("give exactly one of box: {lower, upper} or l2_norm: C")
        return self


class DirectionsSpec(_Strict):
    """Noise directions."""

    method: Literal["standard", "matrix", "dp-pca"] = "standard"
    path: str | None = None
    budget_share: Annotated[float, Field(gt=0, lt=1)] = 0.2
    k: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _fields_match_method(self) -> DirectionsSpec:
        if self.method == "matrix" and not self.path:
            raise ValueError("method matrix needs path: a .npy file with the orthonormal matrix")
        if self.method != "matrix" and self.path is not None:
            raise ValueError("path is only used with method: matrix")
        return self


class AllocationSpecModel(_Strict):
    """Precision allocation."""

    strategy: AllocationStrategy = "uniform"
    important: list[Annotated[int, Field(ge=0)]] | None = None
    share: Annotated[float, Field(gt=0, le=1)] | None = None
    theta: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = None

    @model_validator(mode="after")
    def _fields_match_strategy(self) -> AllocationSpecModel:
        if self.strategy == "custom" and self.theta is None:
            raise ValueError("strategy custom needs theta: one share per direction")
        if self.theta is not None and self.strategy != "custom":
            raise ValueError("theta is only used with strategy: custom")
        if self.theta is not None and sum(self.theta) > 1 + 1e-9:
            raise ValueError(
                f"theta sums to {sum(self.theta):.6g} > 1: that would overspend the budget"
            )
        if self.important is not None and len(set(self.important)) != len(self.important):
            raise ValueError("important indices repeat")
        if self.strategy == "mgm-optimal":
            raise ValueError(
                "mgm-optimal needs a utility matrix and is available from the Python API only"
            )
        return self


class MechanismSpec(_Strict):
    """The MVG mechanism: algorithm, calibration, directions, allocation and noise kind.

    ``algorithm`` defaults to ``unimodal``, except for an ``exact`` covariance release, whose
    default is ``symmetric`` (noise ``A S A^T`` with ``S`` symmetric, docs/bounds.md); the
    paper's Alg. 2 stays available as ``equi-modal``.

    ``noise``: ``lattice`` (the default) is the floating-point-safe release: the whitened query
    is rounded to a public grid and exact integer noise is added, with the floating-point error
    of the computed query charged to the sensitivity (docs/lattice.md). ``float``
    draws the noise and adds it in floating point, as the papers do: its published low-order
    bits can reveal a record (the precision attack of Haney et al. 2022), so it is *not*
    floating-point safe; it stays for comparison and reproduction.
    """

    algorithm: Algorithm = "unimodal"
    calibration: Calibration = "exact"
    directions: DirectionsSpec = DirectionsSpec()
    allocation: AllocationSpecModel = AllocationSpecModel()
    sensitivity: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    gamma: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    entry_range: tuple[float, float] | None = None
    noise: Literal["lattice", "float"] = "lattice"


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


class OutputSpec(_Strict):
    """Where the release goes, and how its values are encoded.

    ``codec`` compresses the released values: ``none`` (the default) because noise does not
    compress (measured on noisy float64 chunks: zstd saves about 3 % of the bytes and costs four
    times the write time; see the sizing guide), ``zstd`` or ``lz4`` (Blosc, byte shuffle) when
    storage matters more than time. ``dtype`` of an identity release: ``auto`` keeps a float32
    input float32 (the noise's standard deviation is many orders of magnitude above float32's
    resolution; rounding the noisy value is post-processing) and writes float64 otherwise. A
    covariance output is always float64.

    ``matrix_chunk``: features per chunk (both axes) of a covariance output. By default the
    whole matrix is one chunk up to 8,192 features (assembled on the client) and blocks of 2,048
    beyond, computed, privatized and written panel by panel on the workers with bounded memory;
    a value below the number of features (a multiple of 256, the noise grid) chooses the
    blocked path explicitly. The blocked path needs standard directions.

    An fsspec URL ``store`` (object stores, ``memory://``) may not hold ``*``, ``?`` or ``[``:
    fsspec's ``rm`` expands a path as a glob pattern (s3fs also expands the deletes of Zarr's
    fsspec store), so an abort of ``s3://b/run*.zarr`` would remove ``run1.zarr`` and
    ``run2.zarr`` too. A local path (a plain path or a ``file://`` URL) may hold them: its
    removals never glob.
    """

    store: str
    storage_options: dict[str, Any] | None = None
    codec: Literal["none", "zstd", "lz4"] = "none"
    dtype: Literal["auto", "float64", "float32"] = "auto"
    matrix_chunk: Annotated[int, Field(gt=0)] | None = None

    @field_validator("store")
    @classmethod
    def _no_pattern_in_url(cls, value: str) -> str:
        if not is_local(value):
            magic = sorted(set(value.split("://", 1)[-1]) & set(_GLOB_CHARACTERS))
            if magic:
                raise ValueError(
                    f"{value!r} holds {' '.join(magic)}: fsspec deletes paths as glob patterns, "
                    "so an abort could remove other data that the pattern matches; choose a "
                    "name without * ? [ (a local path may hold them)"
                )
        return value


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


#: A feature's label in a query: a value of the input's feature coordinate, or its position
#: when the input has no feature coordinate.
FeatureLabel = Annotated[str, Field(min_length=1)] | int


def _feature_labels(value: object) -> object:
    """A list of feature labels as given (names or positions), refusing booleans and floats
    (which pydantic would coerce)."""
    if isinstance(value, list) and any(isinstance(v, bool | float) for v in value):
        raise ValueError("feature labels are names (strings) or positions (integers)")
    return value


class ColAllocationSpec(_Strict):
    """The column side's precision allocation of a cross-covariance: ``Psi^-1 = diag(theta) /
    mean(theta)`` on the column features (docs/bounds.md, Sec. 16; docs/concepts/queries.md).

    ``uniform`` is ``Psi = I``; ``binary`` gives the ``important`` column features (labels from
    ``cols``) the share ``share`` (default 0.8) of the precision and the others the rest;
    ``custom`` takes one positive ``theta`` per column feature, in the order of ``cols``.
    """

    strategy: Literal["uniform", "binary", "custom"] = "uniform"
    important: list[FeatureLabel] | None = None
    share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    theta: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = None

    @model_validator(mode="after")
    def _fields_match_strategy(self) -> ColAllocationSpec:
        if self.strategy == "binary" and not self.important:
            raise ValueError("strategy binary needs important: the column features to favour")
        if self.strategy != "binary" and (self.important is not None or self.share is not None):
            raise ValueError("important and share are only used with strategy: binary")
        if self.strategy == "custom" and self.theta is None:
            raise ValueError("strategy custom needs theta: one share per column feature")
        if self.strategy != "custom" and self.theta is not None:
            raise ValueError("theta is only used with strategy: custom")
        if self.important is not None and len(set(self.important)) != len(self.important):
            raise ValueError("important repeats a feature")
        return self

    @field_validator("important", mode="before")
    @classmethod
    def _labels(cls, value: object) -> object:
        return _feature_labels(value)


class ColumnsSpec(_Strict):
    """The column side of a two-variable cross-covariance ``X_rows Y_cols^T / N``: ``Y`` is
    ``variable``, another variable of the input store along the same record dimension (same
    name, same length); ``features`` are labels of its feature coordinate (positions when it
    has none); ``box`` is its declared domain (scalars or one value per feature of ``Y``),
    never computed from the data (docs/concepts/queries.md, "Cross-covariance")."""

    variable: Annotated[str, Field(min_length=1)]
    features: Annotated[list[FeatureLabel], Field(min_length=1)]
    box: BoxSpec

    @field_validator("features", mode="before")
    @classmethod
    def _labels(cls, value: object) -> object:
        return _feature_labels(value)


class CrossCovarianceSpec(_Strict):
    """The two groups of features of a cross-covariance ``X_rows X_cols^T / N``, and the
    column side's precision allocation (absent: ``Psi = I``). ``cols`` is a list of the input
    variable's features, or a :class:`ColumnsSpec` naming features of a second variable."""

    rows: Annotated[list[FeatureLabel], Field(min_length=1)]
    cols: Annotated[list[FeatureLabel], Field(min_length=1)] | ColumnsSpec
    col_allocation: ColAllocationSpec | None = None

    @property
    def col_labels(self) -> list[FeatureLabel]:
        """The column features' labels (of the input variable, or of ``cols.variable``)."""
        return self.cols.features if isinstance(self.cols, ColumnsSpec) else self.cols

    @property
    def col_variable(self) -> str | None:
        """The second variable of a two-variable cross-covariance (``None``: one variable)."""
        return self.cols.variable if isinstance(self.cols, ColumnsSpec) else None

    @field_validator("rows", "cols", mode="before")
    @classmethod
    def _labels(cls, value: object) -> object:
        return _feature_labels(value)

    @model_validator(mode="after")
    def _distinct(self) -> CrossCovarianceSpec:
        for name, labels in (("rows", self.rows), ("cols", self.col_labels)):
            if len(set(labels)) != len(labels):
                raise ValueError(f"{name} repeat a feature")
        self._col_allocation_fits()
        return self

    def _col_allocation_fits(self) -> None:
        """The column allocation names column features and has one share per column."""
        spec = self.col_allocation
        if spec is None:
            return
        cols = self.col_labels
        unknown = [label for label in spec.important or () if label not in cols]
        if unknown:
            raise ValueError(
                f"col_allocation.important: {unknown[0]!r} is not one of the cols "
                f"({', '.join(map(str, cols))})"
            )
        if spec.strategy == "binary" and spec.share == 1 and len(spec.important or ()) < len(cols):
            raise ValueError(
                "col_allocation.share: 1 leaves no precision for the other column features; "
                "use a share below 1"
            )
        if spec.theta is not None and len(spec.theta) != len(cols):
            raise ValueError(
                f"col_allocation.theta has {len(spec.theta)} shares for {len(cols)} cols"
            )


class CrossCovarianceQuerySpec(_Strict):
    """``{cross-covariance: {rows: [...], cols: [...], col_allocation: {...}}}``."""

    model_config = ConfigDict(populate_by_name=True)
    cross_covariance: CrossCovarianceSpec = Field(alias="cross-covariance")


class RegressionParams(_Strict):
    """A regression release's parameters: ``target`` names the response feature (a label of
    the input's feature coordinate, or its position when the input has no feature names)."""

    target: str | int


class RegressionSpec(_Strict):
    """``query: {regression: {target: f4}}``: the second moment of ``[x; y; 1]``, from which
    ``ds.mvg.regression`` fits the coefficients (docs/concepts/queries.md)."""

    regression: RegressionParams


#: The routes to a centered covariance (docs/concepts/queries.md, "Centered covariance").
CenteredRoute = Literal["auto", "moment", "mean-first"]


class CenteredParams(_Strict):
    """A centered covariance's route: ``moment`` (the second moment of ``[x - c; s]``, what
    ``query: centered-covariance`` releases), ``mean-first`` (a DP mean, then the covariance
    around it: docs/bounds.md, Sec. 14) or ``auto`` (the plan picks the route whose expected
    error is the smaller in the worst case over the data's mean). ``mean_share`` is the mean
    step's share ``mu_1^2 / mu^2`` of the Gaussian-DP budget (default: the plan's best split)."""

    route: CenteredRoute = "moment"
    mean_share: float | None = None

    @field_validator("mean_share")
    @classmethod
    def _share(cls, value: float | None) -> float | None:
        if value is not None and not 0.0 < value < 1.0:
            raise ValueError(f"mean_share must lie in (0, 1), got {value!r}")
        return value

    @model_validator(mode="after")
    def _share_needs_mean(self) -> CenteredParams:
        if self.mean_share is not None and self.route == "moment":
            raise ValueError(
                "mean_share: the moment route spends no budget on a mean; use route: "
                "mean-first or auto, or drop mean_share"
            )
        return self


class CenteredCovarianceSpec(_Strict):
    """``{centered-covariance: {route: auto | moment | mean-first, mean_share: f}}``."""

    model_config = ConfigDict(populate_by_name=True)
    centered_covariance: CenteredParams = Field(alias="centered-covariance")


#: The most groups a ``group_by`` may declare.
MAX_GROUPS = 10_000


class GroupBySpec(_Strict):
    """``group_by: {variable: site, groups: [0, 1, 2]}``: one release per declared group of
    records, in one pass, costing one release's budget (docs/concepts/queries.md, "Grouped
    releases"; docs/bounds.md, Sec. 15 and 17).

    ``variable`` is a 1-D variable of the input store along the record dimension; ``groups``
    are its declared labels, in the order of the output's ``group`` dimension. The labels come
    from the spec, never from the data: a record whose label is not declared is dropped (and
    counted curator-side only).
    """

    variable: str
    groups: list[str | int]

    @field_validator("groups")
    @classmethod
    def _declared_groups(cls, value: list[str | int]) -> list[str | int]:
        if not value:
            raise ValueError("declare at least one group label")
        if len(value) > MAX_GROUPS:
            raise ValueError(f"at most {MAX_GROUPS} groups, got {len(value)}")
        if any(isinstance(v, bool) for v in value):
            raise ValueError("group labels are strings or integers, not booleans")
        if len(set(value)) != len(value):
            raise ValueError("group labels repeat; declare each group once")
        if len({type(v) for v in value}) > 1:
            raise ValueError("group labels must be all strings or all integers")
        return value


#: The queries a spec names by a word alone.
SimpleQuery = Literal["identity", "covariance", "centered-covariance"]


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
        return "moment" if self.query == "centered-covariance" else None

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


#: The queries with a square, symmetric PSD output (the second moment of the records, or of the
#: records with a constant term).
SQUARE_QUERIES = ("covariance", "centered-covariance", "regression")
#: The queries released as the second moment of the augmented record ``z = [x - c; s]``.
MOMENT_QUERY_KINDS = ("centered-covariance", "regression")


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


def _query_kind(query: Any) -> str:
    """The kind of a spec's ``query`` (a word, a :class:`RegressionSpec` or its mapping)."""
    if isinstance(query, RegressionSpec):
        return "regression"
    if isinstance(query, CrossCovarianceQuerySpec):
        return "cross-covariance"
    if isinstance(query, CenteredCovarianceSpec):
        return "centered-covariance"
    if isinstance(query, dict) and len(query) == 1:
        return str(next(iter(query)))
    return str(query)


def spec_hash(spec: ReleaseSpec) -> str:
    """A stable hash of everything in the spec but its release id (to recognise a resume)."""
    import hashlib
    import json

    # a spec without group_by hashes as it did before group_by existed
    exclude = {"release_id"} if spec.group_by is not None else {"release_id", "group_by"}
    data = spec.model_dump(mode="json", exclude=exclude)
    if data["domain"].get("missing") == "error":
        data["domain"].pop("missing")  # missing: error hashes as it did before missing existed
    cross = data["query"].get("cross_covariance") if isinstance(data["query"], dict) else None
    if cross is not None and cross.get("col_allocation") is None:
        cross.pop("col_allocation", None)  # Psi = I hashes as it did before Psi existed
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _section_names() -> frozenset[str]:
    """The class names of every spec section."""
    names: set[str] = set()
    todo: list[type] = [_Strict]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(names)


def _union_member(part: str) -> bool:
    """Whether a location part is the tag pydantic gives a union member's errors: a spec
    section's class name (``ColumnsSpec``) or a type (``list[...]``, ``literal[...]``)."""
    return "[" in part or part in _section_names()


#: An error: its location (dotted path parts), message and pydantic error type.
_Error = tuple[tuple[str, ...], str, str]


def _furthest_member(errors: list[_Error]) -> list[_Error]:
    """Of a union's errors, only those of the member that matched furthest (an error deeper
    than every other member's), without its tag: ``query.cross-covariance.cols.box: ...``, not
    one error per member of ``query`` and of ``cols``. A word given where a union takes a
    word or a mapping (``query: covarience``) keeps the word's error alone. Where no member
    matched further than the others (a ``query`` of an unknown form), every member's errors
    stay, with their tags."""
    kept: list[_Error] = []
    unions: dict[tuple[str, ...], list[tuple[str, tuple[str, ...], str, str]]] = {}
    for loc, msg, kind in errors:
        at = next((i for i, part in enumerate(loc) if _union_member(part)), None)
        if at is None:
            kept.append((loc, msg, kind))
        else:
            unions.setdefault(loc[:at], []).append((loc[at], loc[at + 1 :], msg, kind))
    for field, members in unions.items():
        depth: dict[str, int] = {}
        for tag, rest, _, _ in members:
            depth[tag] = max(depth.get(tag, 0), len(rest))
        deepest = max(depth.values())
        best = [tag for tag, d in depth.items() if d == deepest]
        if deepest == 0 and any(kind == "literal_error" for *_, kind in members):
            if all(kind in ("literal_error", "model_type") for *_, kind in members):
                kept.extend((field, msg, kind) for *_, msg, kind in members if kind != "model_type")
                continue
        if deepest == 0 or len(best) > 1:
            kept.extend(((*field, tag, *rest), msg, kind) for tag, rest, msg, kind in members)
            continue
        inner = [(rest, msg, kind) for tag, rest, msg, kind in members if tag == best[0]]
        kept.extend((field + loc, msg, kind) for loc, msg, kind in _furthest_member(inner))
    return kept


def _annotations(annotation: object) -> list[object]:
    """``annotation`` and every type inside it (union members, ``Annotated`` and list items)."""
    found = [annotation]
    if typing.get_origin(annotation) is not Literal:
        for arg in typing.get_args(annotation):
            found.extend(_annotations(arg))
    return found


def _choices(root: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    """The words an enumerated (``Literal``) field at ``loc`` of ``root`` takes, in the order
    the code declares them (empty when ``loc`` is not such a field)."""
    annotations: list[object] = [root]
    for part in loc:
        if _union_member(part):
            continue
        inside: list[object] = []
        for a in annotations:
            for model in _annotations(a):
                if isinstance(model, type) and issubclass(model, BaseModel):
                    inside.extend(
                        f.annotation
                        for name, f in model.model_fields.items()
                        if part in (name, f.alias)
                    )
        if not inside and part.isdigit():
            continue  # an item of a list
        annotations = inside
    return [
        str(word)
        for a in annotations
        for t in _annotations(a)
        if typing.get_origin(t) is Literal
        for word in typing.get_args(t)
    ]


#: How an enumerated field's error names its values: ``field: (a value, the values)``.
_NOUNS = {
    "query": ("query", "queries"),
    "strategy": ("strategy", "strategies"),
    "neighbours": ("neighbour relation", "neighbour relations"),
    "on_violation": ("value", "values"),
    "noise": ("noise kind", "noise kinds"),
}


def _unknown_word(loc: tuple[str, ...], value: object, choices: list[str]) -> str:
    """``unknown query 'covarience'; did you mean 'covariance'? The queries are: ...``."""
    name = next((p for p in reversed(loc) if not _union_member(p) and not p.isdigit()), "value")
    one, many = _NOUNS.get(name, (name, f"{name}s"))
    close = difflib.get_close_matches(str(value), choices, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else "."
    return f"unknown {one} {value!r}{guess} The {many} are: {', '.join(choices)}"


def _format_error(exc: ValidationError, root: type[BaseModel]) -> str:
    errors: list[_Error] = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"] if not str(p).startswith(("function-", "tag:")))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling)"
        if err["type"] == "literal_error":
            choices = _choices(root, loc)
            if choices:
                msg = _unknown_word(loc, err["input"], choices)
        errors.append((loc, msg, err["type"]))
    kept = _furthest_member(errors)
    parts = [f"{'.'.join(loc)}: {msg}" if loc else msg for loc, msg, _ in kept]
    return "; ".join(parts)


def parse_spec(data: object, *, source: str = "spec") -> ReleaseSpec:
    """Validate a spec given as a mapping.

    Parameters
    ----------
    data : object
        The parsed YAML.
    source : str
        Name used in error messages.

    Returns
    -------
    ReleaseSpec
        The validated spec.

    Raises
    ------
    SpecError
        Naming every invalid field.
    """
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a release spec must be a mapping of keys to values")
    try:
        return ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_format_error(exc, ReleaseSpec)}") from None


def with_output_store(spec: ReleaseSpec, store: str) -> ReleaseSpec:
    """``spec`` with ``output.store`` replaced by ``store``, validated as a spec's own is.

    Parameters
    ----------
    spec : ReleaseSpec
        A validated spec.
    store : str
        The new output store (an absolute path or an fsspec URL).

    Returns
    -------
    ReleaseSpec
        The spec writing to ``store``.

    Raises
    ------
    SpecError
        When ``store`` is not a valid output store (``OutputSpec``'s checks).
    """
    try:
        output = OutputSpec.model_validate(
            {**spec.output.model_dump(exclude_unset=True), "store": store}
        )
    except ValidationError as exc:
        raise SpecError(f"output.{_format_error(exc, OutputSpec)}") from None
    return spec.model_copy(update={"output": output})


class SpecLoader(yaml.SafeLoader):
    """The YAML loader of specs and configuration files: PyYAML's safe loader, with two
    YAML 1.2 rules.

    A mapping that repeats a key is refused (YAML 1.2 forbids it; PyYAML would keep the last
    value silently). A number in scientific notation without a dot or an exponent sign
    (``1e-6``, ``1e6``, ``1E+3``, ``2.5e3``, ``.5e3``, ``-.5``) is the float YAML 1.2 reads, not
    the string YAML 1.1 reads. Every other resolution (integers, booleans, dates, ``.inf``,
    ``.nan``) is PyYAML's.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


#: YAML 1.2's float with a dot or an exponent (an exponent's sign optional); digits alone stay
#: YAML 1.1's integers (``010`` is 8), and ``.inf``/``.nan`` keep PyYAML's resolver.
_YAML12_FLOAT = re.compile(
    r"^(?=.*[.eE])[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$"
)
SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))


def parse_yaml(text: str, source: str) -> object:
    """Parse a YAML spec: duplicate keys refused, errors with their line and column.

    Parameters
    ----------
    text : str
        The YAML.
    source : str
        The file's name, for messages.

    Returns
    -------
    object
        The parsed document.

    Raises
    ------
    SpecError
        ``source:line:column: ...`` for invalid YAML or a repeated key.
    """
    try:
        return yaml.load(text, Loader=SpecLoader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        what = exc.problem or exc.context or "not valid YAML"
        raise SpecError(f"{where}: not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from None


def load_spec(path: str | Path) -> ReleaseSpec:
    """Read and validate a YAML release spec.

    Relative store paths are resolved against the spec file's directory.

    Parameters
    ----------
    path : str or Path
        The YAML file.

    Returns
    -------
    ReleaseSpec
        The validated spec.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read spec {p}: {exc.strerror}") from None
    data = parse_yaml(text, str(p))
    spec = parse_spec(data, source=str(p))
    return resolve_paths(spec, p.parent)


def _resolve(store: str, base: Path) -> str:
    if "://" in store or Path(store).is_absolute():
        return store
    return str((base / store).resolve())


def _resolve_sqlite_url(url: str, base: Path) -> str:
    """``sqlite:///relative`` against ``base`` (``sqlite:////absolute`` and other URLs as is)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not Path(url[len(prefix) :]).is_absolute():
        return prefix + _resolve(url[len(prefix) :], base)
    return url


def resolve_paths(spec: ReleaseSpec, base: Path) -> ReleaseSpec:
    """Resolve relative store and matrix paths against ``base``."""
    directions = spec.mechanism.directions
    if directions.path is not None:
        directions = directions.model_copy(update={"path": _resolve(directions.path, base)})
    ledger = spec.ledger
    if ledger is not None:
        ledger = ledger.model_copy(
            update={
                "path": None if ledger.path is None else _resolve(ledger.path, base),
                "url": None if ledger.url is None else _resolve_sqlite_url(ledger.url, base),
                "password_file": (
                    None if ledger.password_file is None else _resolve(ledger.password_file, base)
                ),
            }
        )
    return spec.model_copy(
        update={
            "ledger": ledger,
            "input": spec.input.model_copy(update={"store": _resolve(spec.input.store, base)}),
            "output": spec.output.model_copy(update={"store": _resolve(spec.output.store, base)}),
            "mechanism": spec.mechanism.model_copy(update={"directions": directions}),
        }
    )
