"""The spec sections of the data and the mechanism: input, domain (box, missing values),
mechanism (directions, allocation) and output."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from mvg_dask.privacy.allocation import AllocationStrategy
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.spec.base import Scalars, _Strict, is_local

_GLOB_CHARACTERS = "*?["  # what makes fsspec (glob.has_magic) treat a path as a pattern


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
    """Precision allocation. ``strategy`` left out: ``scale-aware`` where the declared box gives
    the features different scales, else ``uniform`` (docs/howto/feature-scales.md)."""

    strategy: AllocationStrategy | None = None
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


#: The queries a stream can release: sums over records (docs/guide/streams.md).
STREAM_QUERIES = ("covariance", "centered-covariance", "regression", "cross-covariance", "mean")


class StreamSpec(_Strict):
    """``stream: {horizon, factorization}``: a continual release of the query over a growing
    store, one period per run (docs/guide/streams.md).

    ``horizon`` is the number of periods the stream's one charge covers; ``factorization`` the
    factorization ``A = B C`` of the prefix sums (docs/bounds.md, "Continual releases"):
    ``square-root`` (about 2.9x the std of one release at ``T = 365``) or ``tree`` (the binary
    tree with Honaker's estimator). ``max_records`` is a public bound on the records the
    stream will ever hold (default ``privacy.max_records``, else ``2**32``): the float-error
    bound of every period and the integers' headroom are planned for it, and a store that
    outgrows it is refused.
    """

    horizon: Annotated[int, Field(ge=1, le=10_000)]
    factorization: Literal["square-root", "tree"] = "square-root"
    max_records: Annotated[int, Field(ge=1)] | None = None
