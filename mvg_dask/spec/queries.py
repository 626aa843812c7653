"""The spec's query sections: the queries named by a word, cross-covariance (with a second
variable and a column allocation), regression, centered covariance and ``group_by``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from mvg_dask.spec.base import _Strict
from mvg_dask.spec.sections import BoxSpec

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
SimpleQuery = Literal["identity", "covariance", "centered-covariance", "mean"]


#: The route of a query named by a word whose mapping form has routes (``centered-covariance``
#: is ``{centered-covariance: {route: moment}}``).
WORD_ROUTES = {"centered-covariance": "moment"}
#: The queries with a square, symmetric PSD output (the second moment of the records, or of the
#: records with a constant term).
SQUARE_QUERIES = ("covariance", "centered-covariance", "regression")
#: The queries released as the second moment of the augmented record ``z = [x - c; s]``.
MOMENT_QUERY_KINDS = ("centered-covariance", "regression")


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
