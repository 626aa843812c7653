"""The release plan: a plain, serialisable value that says everything a release will do.

:func:`plan_release` is pure: from a validated spec and the input's metadata (read by the engine
without touching a chunk) it builds a :class:`ReleasePlan` — input and output references, the
record domain, the query, the budget shares, the ledger charge and either a complete
:class:`~mvg_dask.plan.noise_plan.NoisePlan` or, when DP-PCA chooses the directions, a pending
plan whose directions the engine fills in at run time (:meth:`ReleasePlan.resolve`). The engine
only executes a plan. A plan round-trips through :meth:`ReleasePlan.to_dict` /
:meth:`ReleasePlan.from_dict`; the output stores the public part, and resume and retry reload it.

Nothing in a plan depends on the data: it is byte-identical for neighbouring datasets (under
add-remove neighbours the record count is not part of the published form).
"""

from __future__ import annotations

import html
import secrets
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from mvg_dask.errors import DataError
from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, TILE_RECORDS, tile_records_for
from mvg_dask.plan.budget import Allocation, StepBudgets, share_budget
from mvg_dask.plan.directions import Directions, gram_sensitivity
from mvg_dask.plan.domain import (
    BoxDomain,
    DomainRangeError,
    L2BallDomain,
    Neighbours,
    RecordDomain,
)
from mvg_dask.plan.lattice import (
    LatticeContext,
    canonical_gram_depth,
    panel_depth,
)
from mvg_dask.plan.mean_first import (
    MeanStep,
    choose_route,
    plan_mean_step,
    second_step_noise,
    step_mus,
)
from mvg_dask.plan.noise_plan import (
    NoisePlan,
    build_noise_plan,
    gram_step_lattice,
)
from mvg_dask.plan.plan_json import plan_fields, violation_dict
from mvg_dask.plan.queries import DeclaredBoundError, MatrixQuery, make_query
from mvg_dask.plan.queries.cross import column_variances
from mvg_dask.plan.release_parts import DpPcaStep, LedgerCharge
from mvg_dask.plan.stages import release_stages
from mvg_dask.privacy import allocation
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import GaussianDP
from mvg_dask.privacy.registry import get_calibration
from mvg_dask.privacy.sensitivity import augmented_scale
from mvg_dask.spec import (
    MOMENT_QUERY_KINDS,
    ColumnsSpec,
    CrossCovarianceQuerySpec,
    CrossCovarianceSpec,
    ReleaseSpec,
    SpecError,
    spec_hash,
)

# plan fields that depend on the directions, unknown before DP-PCA has run
_DIRECTION_DEPENDENT = (
    "lattice",  # its float error and grid follow the directions' whitening
    "row_variances",
    "col_variances",
    "mahalanobis_sensitivity",
    "implied_epsilon",
    "symmetric_ratio",  # symmetric noise: chosen for the directions (best_symmetric_ratio)
)


#: Covariances with more features than this are computed blockwise by default ...
WIDE_FEATURES = 8192
#: ... in panels of this many features (a multiple of the noise grid's block).
WIDE_BLOCK = 2048
#: A Gram task holds at least this many records per feature (see ``canonical_ranges``).
GRAM_RECORDS_PER_FEATURE = 8
#: A task of a pass over the records holds at least this many elements (runs of whole chunks):
#: a Dask task has a fixed scheduling cost whatever its size, which with one 8 MiB chunk per
#: task dominated a release on two workers (see ``task_ranges``) ...
TASK_ELEMENTS = 2**22
#: ... while keeping at least this many tasks where there are that many chunks.
GRAM_MIN_TASKS = 8
#: The fan-in of the Gram pass's reduction tree: it sums its task partials in fixed groups of
#: this many consecutive nodes, level by level.
TREE_FAN_IN = 8
#: A panel task reads at least this many records at a time (wide inputs have short chunks,
#: and the panel product is a matrix product over the records read).
PANEL_RECORDS = 256
#: Every Gram pass sums canonical record blocks (see ``canonical_block``) of at most this many
#: elements: its bytes and float-error depth never depend on the input's chunk grid ...
CANONICAL_BLOCK_ELEMENTS = 2**20
#: ... and at most this many records: a block's inner products are the longest sums of the
#: pass, so the block length sets the float-error depth of a lattice release (at a declared
#: ``max_records = 2^32``, 4 features: an inflation of 0.8 % of the sensitivity at 2^13
#: records, 25 % at the 2^18 records the element cap alone would give).
CANONICAL_BLOCK_RECORDS = 2**13
#: The public bound on the record count of an add-remove lattice covariance, by default.
DEFAULT_MAX_RECORDS = 2**32


def chunk_runs(records: int, chunk: int, want: int) -> list[tuple[int, int]]:
    """A task grid over ``records`` stored in chunks of ``chunk``: runs of ``want`` whole chunks,
    fewer where that keeps ``GRAM_MIN_TASKS`` tasks.

    Parameters
    ----------
    records, chunk : int
        Records and records per stored chunk.
    want : int
        Chunks per task wanted.

    Returns
    -------
    list of tuple
        ``[start, stop)`` per task, covering every record once, in order.
    """
    spread = max(1, -(-records // chunk) // GRAM_MIN_TASKS)  # chunks per task for busy workers
    step = max(1, min(want, spread)) * chunk
    return [(a, min(a + step, records)) for a in range(0, records, step)]


@dataclass(frozen=True, kw_only=True)
class InputMetadata:
    """What a release knows about its input, from metadata only (no chunk is read).

    Attributes
    ----------
    store, variable : str
        Zarr store (path or URL) and variable name.
    record_dim, feature_dim : str
        Dimension names.
    dims : tuple of str
        The stored order of the two dims.
    shape : tuple of int
        The stored shape.
    dtype : str
        Stored dtype.
    record_chunk : int
        Records per stored chunk (the release's task size).
    feature_names : tuple or None
        Values of the feature coordinate, when the store has one.
    storage_options : dict or None
        fsspec options (never serialised: they may hold credentials).
    cols_input : InputMetadata or None
        The second variable ``Y`` of a two-variable cross-covariance (same store, same record
        dimension and count): the Gram pass stacks its records under the input's,
        ``[X_b; Y_b]`` (docs/concepts/queries.md, "Cross-covariance"); ``None``: one variable.
    """

    store: str
    variable: str
    record_dim: str
    feature_dim: str
    dims: tuple[str, str]
    shape: tuple[int, int]
    dtype: str
    record_chunk: int
    feature_names: tuple[Any, ...] | None = None
    storage_options: dict[str, Any] | None = field(default=None, compare=False)
    cols_input: InputMetadata | None = None

    @property
    def stacked_features(self) -> int:
        """The features of the Gram pass's record: ``M``, or ``M + M_Y`` with a second
        variable."""
        return self.features + (0 if self.cols_input is None else self.cols_input.features)

    @property
    def records_first(self) -> bool:
        """True when the stored array is ``records x features``."""
        return self.dims[0] == self.record_dim

    @property
    def features(self) -> int:
        """``M``."""
        return self.shape[self.dims.index(self.feature_dim)]

    @property
    def records(self) -> int:
        """``N``."""
        return self.shape[self.dims.index(self.record_dim)]

    @property
    def nbytes(self) -> int:
        """The stored array's size in bytes (uncompressed; with ``cols_input``'s)."""
        own = self.shape[0] * self.shape[1] * np.dtype(self.dtype).itemsize
        return own + (0 if self.cols_input is None else self.cols_input.nbytes)

    def record_ranges(self) -> list[tuple[int, int]]:
        """One ``[start, stop)`` record range per stored chunk: the release's task grid."""
        c, n = self.record_chunk, self.records
        return [(a, min(a + c, n)) for a in range(0, n, c)]

    def _runs(self, want: int) -> list[tuple[int, int]]:
        return chunk_runs(self.records, self.record_chunk, want)

    def task_ranges(self) -> list[tuple[int, int]]:
        """The identity pass's task grid: runs of whole chunks of at least ``TASK_ELEMENTS``
        elements (each chunk is still read, written and marked done on its own).

        Metadata only: the noise of a record never depends on it (it comes from the tile grid).
        """
        return self._runs(-(-TASK_ELEMENTS // (self.features * self.record_chunk)))

    def canonical_block(self) -> int:
        """Records per canonical block of the Gram pass: the largest power of two ``B`` with
        ``B m <= CANONICAL_BLOCK_ELEMENTS`` (``m`` the stacked features) and
        ``B <= CANONICAL_BLOCK_RECORDS``, at least 1. A function of the public feature count
        only."""
        per = min(
            CANONICAL_BLOCK_RECORDS, max(1, CANONICAL_BLOCK_ELEMENTS // self.stacked_features)
        )
        return 1 << (per.bit_length() - 1)

    def canonical_blocks_per_task(self) -> int:
        """The canonical blocks per Gram task wanted (it takes fewer to keep ``GRAM_MIN_TASKS``
        tasks): a partial Gram matrix costs ``M^2`` to allocate, move and add whatever its
        record count, against ``M^2 b`` to compute, so a task holds at least
        ``GRAM_RECORDS_PER_FEATURE * M`` records and ``TASK_ELEMENTS`` elements. A function of
        the feature count only."""
        b, m = self.canonical_block(), self.stacked_features
        return max(-(-GRAM_RECORDS_PER_FEATURE * m // b), -(-TASK_ELEMENTS // (m * b)))

    def canonical_ranges(self) -> list[tuple[int, int]]:
        """The Gram pass's task grid: runs of whole canonical
        blocks (:meth:`canonical_block`), a function of the record and feature counts only, never
        of the stored chunk grid or layout (docs/bounds.md Sec. 11)."""
        return chunk_runs(self.records, self.canonical_block(), self.canonical_blocks_per_task())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without storage options; ``cols_input`` only when there is one)."""
        out = {
            "store": self.store,
            "variable": self.variable,
            "record_dim": self.record_dim,
            "feature_dim": self.feature_dim,
            "dims": list(self.dims),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "features": self.features,
            "records": self.records,
            "records_first": self.records_first,
            "record_chunk": self.record_chunk,
            "feature_names": None if self.feature_names is None else list(self.feature_names),
        }
        if self.cols_input is not None:
            out["cols_input"] = self.cols_input.to_dict()
        return out

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], storage_options: dict[str, Any] | None = None
    ) -> InputMetadata:
        """Inverse of :meth:`to_dict`."""
        names = data.get("feature_names")
        second = data.get("cols_input")
        return cls(
            store=data["store"],
            variable=data["variable"],
            record_dim=data["record_dim"],
            feature_dim=data["feature_dim"],
            dims=(data["dims"][0], data["dims"][1]),
            shape=(int(data["shape"][0]), int(data["shape"][1])),
            dtype=data["dtype"],
            record_chunk=int(data["record_chunk"]),
            feature_names=None if names is None else tuple(names),
            storage_options=storage_options,
            cols_input=None if second is None else cls.from_dict(second, storage_options),
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class ReleasePlan:
    """A release, fully planned from its spec and the input's metadata.

    Attributes
    ----------
    release_id, name : str
        Identity of the release.
    created : str
        When the plan was made (ISO 8601, UTC): before any data is read.
    spec_hash : str
        Hash of the spec (recognises a resume).
    input : InputMetadata
        The input.
    output_store, output_storage_options : str, dict or None
        Where the release is written, and its fsspec options (not serialised).
    output_codec : {"none", "zstd", "lz4"}
        Compression of the released values.
    output_dtype : {"float64", "float32"}
        Stored dtype of an identity release's values (``auto`` resolved from the input's).
    matrix_chunk : int or None
        Features per chunk of a covariance computed blockwise on the workers (``None``: one).
    ledger : LedgerCharge or None
        The budget charge.
    query : MatrixQuery
        The query.
    domain : BoxDomain or L2BallDomain
        The declared record domain.
    on_violation, missing_fill : {"clip", "error"}, and float, tuple of float or None
        Values outside the domain; the public value(s) a NaN becomes (``None``: an error).
    epsilon, delta : float
        The total guarantee.
    neighbours : str
        Neighbouring relation.
    algorithm, calibration : str
        The mechanism.
    allocation : Allocation
        Precision allocation.
    budgets : StepBudgets
        The budget shares of the DP-PCA step, the noisy count and the release.
    dp_pca : DpPcaStep or None
        The direction step, when directions are chosen at run time.
    noise : NoisePlan or None
        The noise plan; ``None`` while DP-PCA's directions (or the mean-first centre) pend.
    tile_records : int
        Records per noise tile.
    noise_kind : {"lattice", "float"}
        How the noise is added (:mod:`mvg_dask.plan.lattice`).
    lattice_context : LatticeContext or None
        How the engine sums the query, for the float-error bound of a lattice release.
    stages : tuple of str
        The passes the engine runs, in order (:mod:`mvg_dask.plan.stages`), implied by the rest.
    mean_first : MeanStep or None
        The mean step of a centered covariance by the mean first (docs/bounds.md Sec. 14).
    """

    release_id: str
    name: str
    created: str
    spec_hash: str
    input: InputMetadata
    output_store: str
    output_storage_options: dict[str, Any] | None = None
    output_codec: str = "none"
    output_dtype: str = "float64"
    matrix_chunk: int | None = None
    ledger: LedgerCharge | None
    query: MatrixQuery
    domain: RecordDomain
    on_violation: str
    epsilon: float
    delta: float
    neighbours: str
    algorithm: str
    calibration: str
    allocation: Allocation
    budgets: StepBudgets
    dp_pca: DpPcaStep | None
    noise: NoisePlan | None
    tile_records: int = TILE_RECORDS
    noise_kind: str = "float"
    lattice_context: LatticeContext | None = None
    stages: tuple[str, ...] = ()
    mean_first: MeanStep | None = None
    missing_fill: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        implied = self.implied_stages()
        if not self.stages:
            object.__setattr__(self, "stages", implied)
        elif tuple(self.stages) != implied:
            raise ValueError(
                f"stages: this plan runs {', '.join(implied)}, not {', '.join(self.stages)}"
            )

    def implied_stages(self) -> tuple[str, ...]:
        """The stages the plan's fields imply (:func:`~mvg_dask.plan.stages.release_stages`)."""
        return release_stages(
            self.query.kind,
            noisy_count=self.releases_count,
            dp_pca=self.uses_dp_pca,
            panels=self.matrix_chunk is not None,
            lattice=self.noise_kind == "lattice",
            mean_first=self.mean_first is not None,
        )

    # -- state -------------------------------------------------------------------------------
    @property
    def uses_dp_pca(self) -> bool:
        """True when DP-PCA picks the directions at run time."""
        return self.dp_pca is not None

    @property
    def releases_count(self) -> bool:
        """True when the release adds a noisy record count (add-remove, no public ``N0``)."""
        return self.budgets.count_share > 0

    @property
    def is_resolved(self) -> bool:
        """True when the noise plan is complete."""
        return self.noise is not None

    def build(self, directions: Directions) -> NoisePlan:
        """The noise plan for DP-PCA's ``directions``."""
        if self.dp_pca is None:
            raise ValueError("this release has fixed directions; its noise plan is `noise`")
        return build_noise_plan(
            self.query,
            self.query.record_domain(self.domain),  # what one record contributes through
            epsilon=self.epsilon,
            delta=self.delta,
            algorithm=self.algorithm,  # type: ignore[arg-type]
            calibration=self.calibration,  # type: ignore[arg-type]
            directions=directions,
            allocation=self.allocation,
            neighbours=self.neighbours,  # type: ignore[arg-type]
            direction_share=self.budgets.share,
            count_share=self.budgets.count_share,
            noise=self.noise_kind,  # type: ignore[arg-type]
            lattice_context=self.lattice_context,
        )

    def resolve(self, directions: Directions) -> ReleasePlan:
        """This plan with DP-PCA's directions filled in."""
        return replace(self, noise=self.build(directions))

    def noise_plan(self) -> NoisePlan:
        """The complete noise plan (raises while it is pending)."""
        if self.noise is None:
            raise ValueError("the noise plan is pending until DP-PCA has chosen the directions")
        return self.noise

    # -- serialisation -----------------------------------------------------------------------
    def public_noise_dict(self) -> dict[str, Any]:
        """The noise plan as published: for DP-PCA (mean-first) releases the pending form, its
        direction- (centre-) dependent fields ``null`` (noisy data variables, not attributes)."""
        if self.mean_first is not None:
            return mean_first_public_dict(self)
        if self.dp_pca is None:
            return self.noise_plan().to_dict()
        m = self.query.shape[0]
        k = self.dp_pca.k
        if self.matrix_chunk is not None:  # a wide release keeps DP-PCA's top k: no m x m matrix
            stand_in = Directions.low_rank(np.eye(m, k), tuple(range(k)), np.linspace(2, 1, k))
        else:
            stand_in = Directions("dp-pca", np.eye(m), tuple(range(k)), np.linspace(2, 1, m))
        preview = self.build(stand_in).to_dict()
        for name in _DIRECTION_DEPENDENT:
            if name in preview:
                preview[name] = None
        preview["allocation"]["theta"] = None
        preview["directions"] = {
            "method": "dp-pca",
            "k": k,
            "matrix": None,
            "important": list(range(k)),
            "eigenvalues": None,
        }
        return preview

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (never a key, storage options or the ledger's location).

        ``plan`` is the noise plan as published (:meth:`public_noise_dict`); ``resolved`` is a
        DP-PCA release's complete one once its directions are known (curator side: data-dependent).
        """
        out: dict[str, Any] = {
            "release_id": self.release_id,
            "name": self.name,
            "created": self.created,
            "spec_hash": self.spec_hash,
            "input": self.input.to_dict(),
            "output": {
                "store": self.output_store,
                "codec": self.output_codec,
                "dtype": self.output_dtype,
                "matrix_chunk": self.matrix_chunk,
            },
            "ledger": None if self.ledger is None else self.ledger.to_dict(),
            **violation_dict(self.on_violation, self.missing_fill),
            "tile_records": self.tile_records,
            "stages": list(self.stages),
            "dp_pca": None if self.dp_pca is None else self.dp_pca.to_dict(),
            "plan": self.public_noise_dict(),
        } | ({} if self.mean_first is None else {"mean_first": self.mean_first.to_dict()})
        if (self.dp_pca is not None or self.mean_first is not None) and self.noise is not None:
            out["resolved"] = self.noise.to_dict()
        return out

    def public_dict(self) -> dict[str, Any]:
        """What the dry run prints and the output may carry: :meth:`to_dict` without anything
        that depends on the data. Under add-remove neighbours the record count, the input's shape
        and its record chunk size (which is the record count in a one-chunk store) are private."""
        out = self.to_dict()
        out.pop("resolved", None)
        if self.neighbours == "add-remove":  # N, the shape and the chunk grid tell N
            private = {"records": None, "shape": None, "record_chunk": None}
            out["input"] = {**out["input"], **private}
            if "cols_input" in out["input"]:
                out["input"]["cols_input"] |= private
        return out

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        input_storage_options: dict[str, Any] | None = None,
        output_storage_options: dict[str, Any] | None = None,
        ledger_location: str | None = None,
        ledger_password_file: str | None = None,
    ) -> ReleasePlan:
        """Rebuild a plan from :meth:`to_dict` (the noise plan is recomputed and checked; the
        stages are checked, and implied when a plan saved without them is read back).

        Parameters
        ----------
        data : dict
            A plan dictionary.
        input_storage_options, output_storage_options : dict, optional
            fsspec options (not part of the serialised plan).
        ledger_location : str, optional
            The ledger's path or URL (required when the plan charges a ledger).
        ledger_password_file : str, optional
            The ledger's PostgreSQL password file.

        Returns
        -------
        ReleasePlan
            The plan.
        """
        return cls(
            input=InputMetadata.from_dict(data["input"], input_storage_options),
            output_storage_options=output_storage_options,
            **plan_fields(
                data, ledger_location=ledger_location, ledger_password_file=ledger_password_file
            ),
        )

    def check_seed(self, seed: int | None) -> None:
        """Refuse a user seed for a release charged to a privacy ledger.

        A seeded release is not private: its noise is a function of the seed, and a search over
        seeds recovers it (and so the data) from the output. A ledger is the data owner's account
        of what has been disclosed about a dataset, so such a release can be neither charged (the
        budget would claim a guarantee that does not hold) nor left out of it (the disclosure
        would be invisible). Seeds are for test and demo data, released without a ledger.

        Parameters
        ----------
        seed : int or None
            The seed of :func:`mvg_dask.api.release` (``--seed``).

        Raises
        ------
        SpecError
            When ``seed`` is given and the spec has a ledger.
        """
        if seed is None or self.ledger is None:
            return
        raise SpecError(
            f"seed: a seeded release is not private (its noise follows from the seed, which a "
            f"search over seeds recovers from the output), so it cannot be charged to the "
            f"privacy ledger of dataset {self.ledger.dataset!r}; release without a seed, or "
            "remove ledger from the spec for test or demo data"
        )

    # -- presentation ------------------------------------------------------------------------
    def declared_bounds_text(self) -> str | None:
        """What declared bounds above the proved ones cost (:func:`declared_bounds_text`)."""
        return declared_bounds_text(self)

    def summary(self) -> str:
        """Human-readable lines: input, output and the noise plan (:func:`plan_summary`)."""
        return plan_summary(self)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(self.summary()) + "</pre>"


#: noise-plan fields of the mean-first route that depend on the released centre
_CENTRE_DEPENDENT = (*_DIRECTION_DEPENDENT, "sensitivity", "gamma", "precision_budget")


def mean_first_public_dict(rplan: ReleasePlan) -> dict[str, Any]:
    """The published noise plan of a mean-first release: step 2's plan with the box's centre
    standing in for the released one, every field that depends on the centre ``null`` (the
    centre is a noisy data variable of the output, never an attribute), the query the first
    pass sums and the declared box.

    Parameters
    ----------
    rplan : ReleasePlan
        A plan with a ``mean_first`` step.

    Returns
    -------
    dict
        The data-independent form.
    """
    step = rplan.mean_first
    assert step is not None
    stand_in = _about_mean_noise(rplan, np.asarray(step.centre)).to_dict()
    for name in _CENTRE_DEPENDENT:
        if name in stand_in:
            stand_in[name] = None
    return {**stand_in, "query": rplan.query.to_dict(), "domain": rplan.domain.to_dict()}


def _about_mean_noise(rplan: ReleasePlan, centre: np.ndarray) -> NoisePlan:
    """Step 2's noise plan about ``centre`` (:func:`~mvg_dask.plan.mean_first.
    second_step_noise`)."""
    step = rplan.mean_first
    assert step is not None and isinstance(rplan.domain, BoxDomain)
    return second_step_noise(
        rplan.domain,
        centre,
        rplan.input.records,
        epsilon=rplan.epsilon,
        delta=rplan.delta,
        share=step.share,
        algorithm=rplan.algorithm,
        allocation=rplan.allocation,
        noise=rplan.noise_kind,
        lattice_context=rplan.lattice_context,
    )


def resolve_about_mean(rplan: ReleasePlan, centre: np.ndarray) -> ReleasePlan:
    """A mean-first plan with step 2's noise plan about ``centre`` (the released mean clamped
    into the box: public), made after step 1 as DP-PCA's plan is after its step.

    Parameters
    ----------
    rplan : ReleasePlan
        A plan with a ``mean_first`` step.
    centre : ndarray
        :func:`~mvg_dask.plan.mean_first.centre_from_mean` of the released mean.

    Returns
    -------
    ReleasePlan
        The resolved plan.
    """
    return replace(rplan, noise=_about_mean_noise(rplan, centre))


def plan_summary(rplan: ReleasePlan) -> str:
    """Human-readable lines: input, output and the noise plan.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    str
        The lines (the first one names the release, its input and its output).
    """
    inp = rplan.input
    records = "?" if rplan.neighbours == "add-remove" else str(inp.records)
    second = inp.cols_input
    variables = (
        ""
        if second is None
        else f" variables {inp.variable!r} ({inp.features} features) and {second.variable!r} "
        f"({second.features} features),"
    )
    head = (
        f"release {rplan.release_id}: {rplan.query.kind} of {inp.store}{variables} "
        f"({inp.features} features x {records} records) -> {rplan.output_store}"
    )
    declared = rplan.declared_bounds_text()
    tail = "" if declared is None else f"\n  {declared}"
    if rplan.mean_first is not None and rplan.noise is None:
        step = rplan.mean_first
        return (
            f"{head}\n  route mean-first: the mean with noise std {step.std:.4g} "
            f"({step.share:.0%} of the squared Gaussian-DP budget), then the covariance about "
            f"it, its noise planned after the mean; calibration {rplan.calibration}{tail}"
        )
    if rplan.dp_pca is None:
        return f"{head}\n{rplan.noise_plan().summary()}{tail}"
    assert rplan.dp_pca is not None
    return (
        f"{head}\n  directions by DP-PCA at run time ({rplan.budgets.share:.0%} of the budget, "
        f"{rplan.budgets.composition} composition); calibration {rplan.calibration}{tail}"
    )


def declared_bounds_text(rplan: ReleasePlan) -> str | None:
    """What declared bounds above the proved ones cost, in one line (``None``: none).

    A declared ``sensitivity`` (``gamma``, ``entry_range``) of a built-in query is at least
    the bound the record domain proves (smaller ones are refused by :func:`plan_release`)
    and is used as declared. With ``exact`` the noise grows by exactly ``declared s2 /
    proved s2`` (``Delta_M`` is scaled by that factor); with a paper calibration the factor
    is measured against the plan the proved bounds give (for fixed directions). A function
    of the spec and public metadata only.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    str or None
        The line, or ``None`` when no bound is declared above the proved one.
    """
    q, nb = rplan.query, rplan.neighbours
    domain = q.record_domain(rplan.domain)
    neighbours: Neighbours = "add-remove" if nb == "add-remove" else "replace-one"
    parts: list[str] = []
    drop: dict[str, None] = {}
    s2 = q.joint_l2_sensitivity(domain, neighbours)  # a grouped release's joint bound
    if q.sensitivity is not None and s2 is not None:
        parts.append(f"s2 = {q.sensitivity:.4g} (proved bound {s2:.4g})")
        drop["sensitivity"] = None
    gamma = q.proved_sup_frobenius(domain)
    uses = get_calibration(rplan.calibration)
    if q.gamma is not None and gamma is not None:
        unused = "" if uses.uses_gamma else f", not used by {rplan.calibration}"
        parts.append(f"gamma = {q.gamma:.4g} (proved bound {gamma:.4g}{unused})")
        drop["gamma"] = None
    span = q.proved_entry_range(domain)
    if q.entry_range is not None and span is not None:
        a, b = q.entry_range
        unused = "" if uses.uses_entry_range else f", not used by {rplan.calibration}"
        parts.append(
            f"entry range [{a:.4g}, {b:.4g}] (proved [{span[0]:.4g}, {span[1]:.4g}]{unused})"
        )
        drop["entry_range"] = None
    if not parts:
        return None
    text = "declared " + ", ".join(parts)
    factor: float | None = None
    if rplan.calibration == "exact":
        factor = q.sensitivity_excess(domain, neighbours)
    elif rplan.noise is not None and rplan.dp_pca is None:
        base = build_noise_plan(
            replace(q, **drop),  # type: ignore[arg-type]
            domain,
            epsilon=rplan.epsilon,
            delta=rplan.delta,
            algorithm=rplan.algorithm,  # type: ignore[arg-type]
            calibration=rplan.calibration,  # type: ignore[arg-type]
            directions=rplan.noise.directions,
            allocation=rplan.allocation,
            neighbours=neighbours,
            direction_share=rplan.budgets.share,
            count_share=rplan.budgets.count_share,
        )
        factor = float(np.max(rplan.noise.entry_std()) / np.max(base.entry_std()))
    if factor is None:
        return f"{text}: used as declared by {rplan.calibration}"
    return f"{text}: noise x{factor:.3g} against the proved bounds"


def new_release_id(name: str) -> str:
    """``name`` plus a timestamp and a random suffix."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{name}-{stamp}-{secrets.token_hex(3)}"


def declared_domains(
    spec: ReleaseSpec, metadata: InputMetadata
) -> tuple[BoxDomain | L2BallDomain, BoxDomain | None]:
    """The declared record domains, validated as a release plans them (docs/guide/specs.md,
    "The record domain"): the input's (``domain``), and a second variable's box
    (``query.cross-covariance.cols.box``; ``None`` with one variable).

    Parameters
    ----------
    spec : ReleaseSpec
        The validated spec.
    metadata : InputMetadata
        The input's metadata (its feature counts).

    Returns
    -------
    tuple
        ``(domain of X, box of Y or None)``.

    Raises
    ------
    DataError
        A domain the plan cannot take, in one line naming its field.
    """
    m = metadata.features
    if spec.domain.box is None:
        assert spec.domain.l2_norm is not None
        try:
            x: BoxDomain | L2BallDomain = L2BallDomain.declared(spec.domain.l2_norm, m)
        except DomainRangeError as exc:
            raise DataError(f"domain.{exc}") from None
    else:
        try:
            x = BoxDomain.declared(spec.domain.box.lower, spec.domain.box.upper, m)
        except DomainRangeError as exc:  # names the bound: domain.box.upper: ...
            raise DataError(f"domain.box.{exc}") from None
        except ValueError as exc:
            raise DataError(f"domain.box: {exc}") from None
    if metadata.cols_input is None:
        return x, None
    cols = spec.query.cross_covariance.cols  # type: ignore[union-attr]
    assert isinstance(cols, ColumnsSpec)
    try:
        y = BoxDomain.declared(cols.box.lower, cols.box.upper, metadata.cols_input.features)
    except DomainRangeError as exc:
        raise DataError(f"query.cross-covariance.cols.box.{exc}") from None
    except ValueError as exc:
        raise DataError(f"query.cross-covariance.cols.box: {exc}") from None
    return x, y


def _domain(spec: ReleaseSpec, metadata: InputMetadata) -> RecordDomain:
    """The declared record domain; with a second variable ``Y``, the box of the stacked
    record ``[x; y]``: the input's box, then ``Y``'s (``query.cross-covariance.cols.box``)."""
    x, y = declared_domains(spec, metadata)
    if y is None:
        return x
    assert isinstance(x, BoxDomain)
    return BoxDomain(np.concatenate([x.lower, y.lower]), np.concatenate([x.upper, y.upper]))


def _missing_fill(
    spec: ReleaseSpec, m: int, domain: RecordDomain
) -> float | tuple[float, ...] | None:
    """The declared fill of ``domain.missing`` (``None``: ``error``), checked before anything
    is read: a per-feature list has one value per feature of the input, and under
    ``on_violation: error`` a fill lies in the box (else every NaN would abort the release)."""
    missing = spec.domain.missing
    if isinstance(missing, str):
        return None
    fill: float | tuple[float, ...]
    if isinstance(missing.fill, list):
        if len(missing.fill) != m:
            raise DataError(
                f"domain.missing.fill: {len(missing.fill)} values for {m} features; give one "
                "per feature, or one number for all"
            )
        fill = tuple(float(v) for v in missing.fill)
    else:
        fill = float(missing.fill)
    if spec.domain.on_violation == "error" and isinstance(domain, BoxDomain):
        values = np.broadcast_to(np.asarray(fill, dtype=np.float64), domain.lower.shape)
        bad = np.flatnonzero((values < domain.lower) | (values > domain.upper))
        if bad.size:
            i = int(bad[0])
            raise DataError(
                f"domain.missing.fill: feature {i}'s fill {values[i]:g} lies outside its box "
                f"[{domain.lower[i]:g}, {domain.upper[i]:g}], so with on_violation: error each "
                "NaN would abort the release; choose a fill inside the box, or on_violation: clip"
            )
    return fill


def _domain_field(spec: ReleaseSpec) -> str:
    """The spec field of the declared record domain."""
    return "domain.box" if spec.domain.box is not None else "domain.l2_norm"


def _fixed_directions(
    spec: ReleaseSpec, m: int, matrix: np.ndarray | None
) -> tuple[Directions | None, DpPcaStep | None]:
    d = spec.mechanism.directions
    important = tuple(spec.mechanism.allocation.important or ())
    if d.method == "standard":
        return Directions.standard(m, important), None
    if d.method == "matrix":
        if matrix is None:
            raise DataError("mechanism.directions.path: the direction matrix was not loaded")
        try:
            return Directions.from_matrix(matrix, important), None
        except ValueError as exc:
            raise DataError(f"mechanism.directions.path: {exc}") from None
    a = spec.mechanism.allocation
    k = d.k if d.k is not None else len(a.important or ()) or 1
    if not 1 <= k <= m:
        raise DataError(f"mechanism.directions.k: must lie in 1..{m}, got {k}")
    return None, DpPcaStep(k=k, budget_share=d.budget_share)


def _matrix_chunk(spec: ReleaseSpec, m: int) -> int | None:
    """The covariance output's chunk (``None``: one chunk); checks the blocked path's needs."""
    if spec.query_kind in MOMENT_QUERY_KINDS and spec.output.matrix_chunk is not None:
        if spec.output.matrix_chunk <= m:
            raise DataError(
                f"output.matrix_chunk: a {spec.query_kind} release is assembled whole on the "
                f"client ({m + 1} x {m + 1}); remove matrix_chunk"
            )
    if spec.query_kind != "covariance":
        return None
    chunk = spec.output.matrix_chunk
    if chunk is None:
        chunk = WIDE_BLOCK if m > WIDE_FEATURES else None
    elif chunk >= m:
        chunk = None
    elif chunk % NOISE_TILE_FEATURES:
        raise DataError(
            f"output.matrix_chunk must be a multiple of {NOISE_TILE_FEATURES} (the noise grid), "
            f"got {chunk}"
        )
    if chunk is None:
        return None
    d, a = spec.mechanism.directions, spec.mechanism.allocation
    blocked = f"a covariance of {m} features is computed blockwise (output.matrix_chunk = {chunk})"
    whole = f"or output.matrix_chunk >= {m} to assemble the whole matrix on the client"
    if d.method == "matrix":
        raise DataError(
            f"{blocked}, which holds no m x m matrix: use mechanism.directions.method: standard "
            f"or dp-pca (its top k are kept), {whole}"
        )
    if d.method == "dp-pca":
        if a.strategy not in ("uniform", "binary"):
            raise DataError(
                f"{blocked}: DP-PCA keeps only its top k directions, so allocation.strategy must "
                f"be uniform or binary (got {a.strategy}), {whole}"
            )
        k = d.k if d.k is not None else len(a.important or ()) or 1
        if k >= m:
            raise DataError(f"mechanism.directions.k: a blockwise DP-PCA needs k < {m}, got {k}")
        if a.important is not None and any(i >= k for i in a.important):
            raise DataError(
                f"allocation.important: {blocked}, whose DP-PCA keeps its top {k} directions; "
                f"important directions must lie in 0..{k - 1}"
            )
    return chunk


def _output_dtype(requested: str, input_dtype: str) -> str:
    """``auto``: float32 for a float32 input, float64 otherwise (input metadata only)."""
    if requested != "auto":
        return requested
    return "float32" if np.dtype(input_dtype) == np.float32 else "float64"


def _lattice_context(spec: ReleaseSpec, metadata: InputMetadata) -> LatticeContext | None:
    """How the engine will sum the query, from public values only: what the float-error bound
    of a lattice release needs (``None`` for float noise).

    The Gram pass sums canonical record blocks and the panel tasks canonical groups of
    ``PANEL_RECORDS`` records, so the depth is a function of the feature count and a record
    count, never of the stored chunk grid, the chunk count or the layout (docs/bounds.md
    Sec. 11). Under add-remove the record count is private too: the bound uses the declared
    ``privacy.max_records``, and an input with more records is refused (the one way the
    record count can decide whether a release is planned, documented as such)."""
    if spec.mechanism.noise != "lattice":
        return None
    records = metadata.records
    if spec.privacy.neighbours == "add-remove":
        bound = spec.privacy.max_records or DEFAULT_MAX_RECORDS
        if records > bound:
            raise DataError(
                f"privacy.max_records: the input has more records than the declared bound "
                f"{bound} of an add-remove lattice release; declare a larger bound"
            )
        records = bound
    depth = canonical_gram_depth(
        records,
        metadata.canonical_block(),
        metadata.canonical_blocks_per_task(),
        TREE_FAN_IN,
        GRAM_MIN_TASKS,
    )
    if spec.query_kind == "covariance":
        # the bound of both summations (the whole-matrix Gram pass and the blocked panels), so
        # that the plan, and the bytes of a release with standard directions, never depend on
        # output.matrix_chunk
        depth = max(depth, panel_depth(records, PANEL_RECORDS))
    return LatticeContext(records=records, depth=depth)


def plan_release(
    spec: ReleaseSpec,
    metadata: InputMetadata,
    *,
    release_id: str | None = None,
    directions_matrix: np.ndarray | None = None,
    created: str | None = None,
) -> ReleasePlan:
    """Plan a release from its spec and the input's metadata. Pure: reads nothing.

    Parameters
    ----------
    spec : ReleaseSpec
        The validated spec.
    metadata : InputMetadata
        The input's metadata (:func:`mvg_dask.engine.metadata.read_input_metadata`).
    release_id : str, optional
        Overrides ``spec.release_id``; a fresh id is made when neither is given.
    directions_matrix : ndarray, optional
        The matrix of ``directions: {method: matrix}`` (loaded by the caller).
    created : str, optional
        Plan time (ISO 8601); now by default.

    Returns
    -------
    ReleasePlan
        The plan.

    Raises
    ------
    DataError
        When the spec does not fit the data or a parameter is invalid.
    SpecError
        When a declared ``mechanism.sensitivity``, ``gamma`` or ``entry_range`` is below the
        bound the record domain proves for the query (before anything is read or charged).
    """
    rid = release_id or spec.release_id or new_release_id(spec.name)
    m = metadata.features
    matrix_chunk = _matrix_chunk(spec, m)  # checked before any noise planning
    domain = _domain(spec, metadata)
    mech, privacy = spec.mechanism, spec.privacy
    a = mech.allocation
    allocation = Allocation(
        strategy=a.strategy, important=a.important, share=a.share, theta=a.theta
    )
    try:  # the domain's range keeps this arithmetic finite (docs/guide/specs.md); a backstop
        query = _query(spec, metadata, domain)
        directions, step = _fixed_directions(spec, query.shape[0], directions_matrix)
        context = _lattice_context(spec, metadata)
        mean_step = _mean_first_step(spec, metadata, domain, query, context)
        if mean_step is None:
            budgets, step, noise = _budgets_and_noise(
                spec, query, domain, allocation, directions, step, context
            )
        else:  # the mean takes the direction step's place in the Gaussian-DP split
            budgets = share_budget("exact", privacy.epsilon, privacy.delta, mean_step.share)
            noise = None
    except ArithmeticError as exc:
        raise DataError(
            f"{_domain_field(spec)}: planning {domain.describe()} with privacy.epsilon="
            f"{privacy.epsilon:g}, privacy.delta={privacy.delta:g} and {metadata.records} records "
            f"leaves float64's range ({type(exc).__name__}: {exc}); rescale the data or the budget"
        ) from None
    plan = ReleasePlan(
        tile_records=tile_records_for(m),
        release_id=rid,
        name=spec.name,
        created=created or datetime.now(UTC).isoformat(timespec="seconds"),
        spec_hash=spec_hash(spec),
        input=metadata,
        output_store=spec.output.store,
        output_storage_options=spec.output.storage_options,
        output_codec=spec.output.codec,
        output_dtype=_output_dtype(spec.output.dtype, metadata.dtype),
        matrix_chunk=matrix_chunk,
        ledger=_ledger_charge(spec),
        query=query,
        domain=domain,
        on_violation=spec.domain.on_violation,
        missing_fill=_missing_fill(spec, m, domain),
        epsilon=privacy.epsilon,
        delta=privacy.delta,
        neighbours=privacy.neighbours,
        algorithm=mech.algorithm,
        calibration=mech.calibration,
        allocation=allocation,
        budgets=budgets,
        dp_pca=step,
        noise=noise,
        noise_kind=mech.noise,
        lattice_context=context,
        stages=release_stages(
            spec.query_kind,
            noisy_count=budgets.count_share > 0,
            dp_pca=step is not None,
            panels=matrix_chunk is not None,
            lattice=mech.noise == "lattice",
            mean_first=mean_step is not None,
        ),
        mean_first=mean_step,
    )
    if step is not None:
        try:  # the pending form must build (it checks the calibration against the query)
            plan.public_noise_dict()
        except ValueError as exc:
            raise DataError(f"mechanism: {exc}") from None
    return plan


def _mean_first_step(
    spec: ReleaseSpec,
    metadata: InputMetadata,
    domain: RecordDomain,
    query: MatrixQuery,
    context: LatticeContext | None,
) -> MeanStep | None:
    """The mean step of a centered covariance that takes the mean-first route (``None``: the
    moment route). ``auto`` takes the moment route wherever the mean-first route does not apply
    (an l2 ball, add-remove, a calibration other than ``exact``, DP-PCA or matrix directions,
    ``group_by``), else the route of :func:`~mvg_dask.plan.mean_first.choose_route`."""
    route, mech, privacy = spec.centered_route, spec.mechanism, spec.privacy
    if route in (None, "moment") or not isinstance(domain, BoxDomain):
        return None
    if (
        privacy.neighbours != "replace-one"
        or mech.calibration != "exact"
        or mech.directions.method != "standard"
        or spec.group_by is not None
    ):
        return None  # auto only: the spec refuses these with route: mean-first
    mu = cal.analytic_gaussian_mu(privacy.epsilon, privacy.delta)
    scale = float(getattr(query, "scale", 1.0))
    choice = choose_route(route, domain, metadata.records, mu, scale=scale, share=spec.mean_share)
    if choice.route != "mean-first":
        return None
    assert choice.share is not None
    mu_1, _ = step_mus(privacy.epsilon, privacy.delta, choice.share)
    try:
        return plan_mean_step(domain, metadata.records, mu_1, choice.share, context)
    except ValueError as exc:
        raise DataError(f"query.centered-covariance: {exc}") from None


def _count_share(spec: ReleaseSpec) -> float:
    """The budget share of the noisy record count. Add-remove: the record count is private;
    divide by a public N0, or release the sum and a noisy count (docs/guide/privacy.md,
    "Neighbours and the record count")."""
    privacy = spec.privacy
    private_count = privacy.neighbours == "add-remove"
    return privacy.count_share if private_count and privacy.records is None else 0.0


def _moment_scale(domain: RecordDomain) -> float:
    """The constant coordinate ``s`` of a moment query's ``z = [x - c; s]``, from the declared
    domain alone (:func:`~mvg_dask.privacy.sensitivity.augmented_scale`): ``A = sup ||x - c||^2``
    is the box's squared half-diagonal about its centre, or the ball's squared radius."""
    if isinstance(domain, BoxDomain):
        half = (domain.upper - domain.lower) / 2.0
        return augmented_scale(float(half @ half), domain.m)
    return augmented_scale(domain.radius**2, domain.m)


def _query(spec: ReleaseSpec, metadata: InputMetadata, domain: RecordDomain) -> MatrixQuery:
    """The query, its declared bounds checked against the ones the domain proves."""
    mech, privacy = spec.mechanism, spec.privacy
    private_count = privacy.neighbours == "add-remove"
    kind = spec.query_kind
    fields: dict[str, Any] = _query_features(spec, metadata)
    if kind in MOMENT_QUERY_KINDS:
        fields["features"] = metadata.features + 1  # the constant term
        fields["scale"] = _moment_scale(domain)
        if isinstance(domain, BoxDomain):  # shifted by the box's centre (docs/bounds.md Sec. 14)
            fields["centre"] = tuple(float(c) for c in (domain.lower + domain.upper) / 2)
    if spec.regression_target is not None:
        fields["target"] = _target_position(spec.regression_target, metadata)
        fields["target_label"] = spec.regression_target
    if spec.group_by is not None:  # the labels of the spec, never of the data
        fields["groups"] = tuple(spec.group_by.groups)
        fields["group_variable"] = spec.group_by.variable
    try:
        query = make_query(
            kind,
            **{
                "features": metadata.stacked_features,  # [x; y] with a second variable
                "records": (privacy.records or 1) if private_count else metadata.records,
                "sensitivity": mech.sensitivity,
                "gamma": mech.gamma,
                "entry_range": mech.entry_range,
                "records_known": not private_count,
                **fields,
            },
        )
    except ValueError as exc:
        raise DataError(f"mechanism: {exc}") from None
    try:  # a declared bound below the proved one would under-noise the release: refused here
        query.check_declared(query.record_domain(domain), privacy.neighbours)
    except DeclaredBoundError as exc:
        raise SpecError(str(exc)) from None
    return query


def _query_features(spec: ReleaseSpec, metadata: InputMetadata) -> dict[str, Any]:
    """The feature positions a query names (a cross-covariance's ``rows`` and ``cols``): labels
    of the input's feature coordinate, or positions when it has none (metadata only). The
    ``cols`` of a second variable ``Y`` are its labels, as positions of the stacked record
    ``[x; y]`` (after the input's ``M`` features)."""
    if not isinstance(spec.query, CrossCovarianceQuerySpec):
        return {}
    cross = spec.query.cross_covariance
    second = metadata.cols_input
    out: dict[str, Any] = {"rows": _positions("rows", cross.rows, metadata)}
    if second is None:
        out["cols"] = _positions("cols", cross.col_labels, metadata)
    else:
        found = _positions("cols.features", cross.col_labels, second)
        out["cols"] = tuple(metadata.features + i for i in found)
    out["col_variances"] = _col_variances(cross)
    return out


def _positions(side: str, labels: list[Any], metadata: InputMetadata) -> tuple[int, ...]:
    """The positions of ``labels`` among a variable's features (its coordinate's values, or
    positions when it has none), or a one-line error naming the query field."""
    names, field = metadata.feature_names, f"query.cross-covariance.{side}"
    positions = []
    for label in labels:
        if names is not None:
            found = [i for i, n in enumerate(names) if n == label]
            if not found:
                raise DataError(
                    f"{field}: {label!r} is not a value of the feature coordinate "
                    f"{metadata.feature_dim!r} of {metadata.variable!r}"
                )
            positions.append(found[0])
        elif isinstance(label, int) and 0 <= label < metadata.features:
            positions.append(label)
        else:
            raise DataError(
                f"{field}: {metadata.variable!r} has no feature coordinate, so a feature is "
                f"its position 0..{metadata.features - 1}, not {label!r}"
            )
    return tuple(positions)


def _col_variances(cross: CrossCovarianceSpec) -> tuple[float, ...] | None:
    """The diagonal of ``Psi`` from the spec's ``col_allocation`` (``None``: ``Psi = I``): its
    shares ``theta`` over the ``cols`` (binary: ``important`` labels of ``cols``), normalised
    to ``tr(Psi^-1) = m_b`` (:func:`~mvg_dask.plan.queries.cross.column_variances`)."""
    spec = cross.col_allocation
    if spec is None or spec.strategy == "uniform":
        return None
    m_b = len(cross.col_labels)
    if spec.strategy == "custom":
        assert spec.theta is not None
        return column_variances(np.asarray(spec.theta, dtype=np.float64))
    important = [cross.col_labels.index(label) for label in spec.important or ()]
    share = 0.8 if spec.share is None else spec.share
    return column_variances(allocation.binary(m_b, important, share))


def _target_position(target: str | int, metadata: InputMetadata) -> int:
    """The position of a regression's ``target`` among the input's features: a label of its
    feature coordinate, or a position when the input has none."""
    names, m = metadata.feature_names, metadata.features
    if names is not None:
        if target in names:
            return list(names).index(target)
        shown = ", ".join(map(str, names[:8])) + (", ..." if len(names) > 8 else "")
        raise DataError(f"query.regression.target: {target!r} is not a feature ({shown})")
    if isinstance(target, int) and 0 <= target < m:
        return target
    raise DataError(
        f"query.regression.target: the input has no feature names; give the target's "
        f"position 0..{m - 1}, got {target!r}"
    )


def _budgets_and_noise(
    spec: ReleaseSpec,
    query: MatrixQuery,
    domain: RecordDomain,
    allocation: Allocation,
    directions: Directions | None,
    step: DpPcaStep | None,
    context: LatticeContext | None,
) -> tuple[StepBudgets, DpPcaStep | None, NoisePlan | None]:
    """The budget shares, the direction step (with its lattice) and, for fixed directions, the
    noise plan."""
    mech, privacy = spec.mechanism, spec.privacy
    domain = query.record_domain(domain)  # what one record contributes through
    share = 0.0 if step is None else step.budget_share
    count_share = _count_share(spec)
    try:
        budgets = share_budget(mech.calibration, privacy.epsilon, privacy.delta, share, count_share)
        if step is not None and context is not None:
            assert budgets.step_mu is not None
            step = replace(
                step,
                lattice=gram_step_lattice(
                    domain, gram_sensitivity(domain, privacy.neighbours), budgets.step_mu, context
                ),
            )
        noise = None
        if directions is not None:
            noise = build_noise_plan(
                query,
                domain,
                epsilon=privacy.epsilon,
                delta=privacy.delta,
                algorithm=mech.algorithm,
                calibration=mech.calibration,
                directions=directions,
                allocation=allocation,
                neighbours=privacy.neighbours,
                count_share=count_share,
                noise=mech.noise,
                lattice_context=context,
            )
    except ValueError as exc:
        raise DataError(f"mechanism: {exc}") from None
    return budgets, step, noise


def _ledger_charge(spec: ReleaseSpec) -> LedgerCharge | None:
    """What the release charges to its dataset's budget (``None``: no ledger)."""
    mech, privacy = spec.mechanism, spec.privacy
    ledger = None
    if spec.ledger is not None:
        loss = get_calibration(mech.calibration).loss(privacy.epsilon, privacy.delta)
        mu = loss.mu if isinstance(loss, GaussianDP) else None
        ledger = LedgerCharge(
            location=spec.ledger.location,
            password_file=spec.ledger.password_file,
            dataset=spec.ledger.dataset,
            budget_epsilon=spec.ledger.budget.epsilon,
            budget_delta=spec.ledger.budget.delta,
            budget_neighbours=spec.ledger.budget.neighbours,
            convert_neighbours=spec.ledger.convert_neighbours,
            epsilon=privacy.epsilon,
            delta=privacy.delta,
            calibration=mech.calibration,
            mu=mu,
            neighbours=privacy.neighbours,
        )
    return ledger
