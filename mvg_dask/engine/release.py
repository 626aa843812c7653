"""The release pipeline: Zarr -> Dask -> MVG noise blockwise -> Zarr.

``plan_release`` reads metadata only and builds the whole privacy story; ``execute_release`` runs
it on a Dask client: (optional DP-PCA pass) -> query -> noise -> staged write -> atomic commit.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import xarray as xr
from distributed import Client

from mvg_dask._version import __version__
from mvg_dask.engine.blocks import Clipper, ZarrMatrix, combine_grams, gram_task, identity_task
from mvg_dask.engine.cluster import Progress, gather_with_progress
from mvg_dask.engine.ledger import Ledger, open_ledger
from mvg_dask.engine.store import (
    RELEASE_ID_ATTR,
    STATUS_ATTR,
    InputInfo,
    OutputTarget,
    check_chunks_present,
    open_input,
    open_release,
    small_coords,
)
from mvg_dask.errors import BudgetError, DataError, ReleaseError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.samplers import affine_sample
from mvg_dask.plan import (
    AllocationSpec,
    BoxDomain,
    BudgetSplit,
    Directions,
    L2BallDomain,
    NoisePlan,
    QuerySpec,
    RecordDomain,
    build_noise_plan,
    dp_pca,
    gram_sensitivity,
    split_budget,
)
from mvg_dask.privacy import calibration as cal
from mvg_dask.spec import ReleaseSpec, spec_hash

log = logging.getLogger("mvg_dask")

TILE_RECORDS = 1024
SPLIT_EVERY = 8
# plan fields that depend on the directions, unknown before DP-PCA has run
_DIRECTION_DEPENDENT = (
    "row_variances",
    "col_variances",
    "mahalanobis_sensitivity",
    "implied_epsilon",
)


@dataclass(frozen=True, eq=False)
class ReleasePlan:
    """A release, fully planned from the spec and the input's metadata (no data read).

    Attributes
    ----------
    spec : ReleaseSpec
        The validated spec.
    release_id : str
        The release id.
    info : InputInfo
        Input metadata.
    query : QuerySpec
        The query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    split : BudgetSplit
        Budget split between the DP-PCA step and the release.
    noise_plan : NoisePlan or None
        The noise plan; ``None`` when DP-PCA chooses the directions at run time.
    directions : Directions or None
        Fixed directions (``None`` with DP-PCA).
    allocation : AllocationSpec
        Allocation.
    tile_records : int
        Records per noise tile.
    """

    spec: ReleaseSpec
    release_id: str
    info: InputInfo
    query: QuerySpec
    domain: RecordDomain
    split: BudgetSplit
    noise_plan: NoisePlan | None
    directions: Directions | None
    allocation: AllocationSpec
    tile_records: int = TILE_RECORDS
    _preview: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def uses_dp_pca(self) -> bool:
        """True when DP-PCA picks the directions at run time."""
        return self.noise_plan is None

    def build(self, directions: Directions | None = None) -> NoisePlan:
        """The noise plan, given DP-PCA's directions when those are chosen at run time."""
        if self.noise_plan is not None:
            return self.noise_plan
        if directions is None:
            raise ValueError("this release chooses its directions by DP-PCA: pass them")
        return _noise_plan(
            self.spec, self.query, self.domain, self.allocation, directions, self.split.share
        )

    def summary(self) -> str:
        """Human-readable lines: input, output and the noise plan."""
        head = (
            f"release {self.release_id}: {self.spec.query} of {self.spec.input.store} "
            f"({self.info.features} features x {self.info.records} records) -> "
            f"{self.spec.output.store}"
        )
        if self.noise_plan is not None:
            return f"{head}\n{self.noise_plan.summary()}"
        return (
            f"{head}\n  directions by DP-PCA at run time ({self.split.share:.0%} of the budget, "
            f"{self.split.composition} composition); calibration {self.spec.mechanism.calibration}"
        )

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(self.summary()) + "</pre>"

    def to_dict(self) -> dict[str, Any]:
        """The dry-run view: release, input and noise plan (direction-dependent fields are
        ``null`` when DP-PCA chooses the directions at run time). Never the key."""
        plan = self.noise_plan.to_dict() if self.noise_plan is not None else dict(self._preview)
        return {
            "release_id": self.release_id,
            "name": self.spec.name,
            "input": {
                "store": self.spec.input.store,
                "variable": self.spec.input.variable,
                "features": self.info.features,
                "records": self.info.records,
                "records_first": self.info.records_first,
                "record_chunk": self.info.record_chunk,
            },
            "output": {"store": self.spec.output.store},
            "on_violation": self.spec.domain.on_violation,
            "tile_records": self.tile_records,
            "plan": plan,
        }


@dataclass(frozen=True)
class ReleaseResult:
    """What a finished release reports."""

    release_id: str
    output: str
    plan: NoisePlan
    clipped_count: int
    seconds: float
    seeded: bool


def new_release_id(name: str) -> str:
    """``name`` plus a timestamp and a random suffix."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{name}-{stamp}-{secrets.token_hex(3)}"


def _domain(spec: ReleaseSpec, m: int) -> RecordDomain:
    try:
        if spec.domain.box is not None:
            return BoxDomain.create(spec.domain.box.lower, spec.domain.box.upper, m)
        assert spec.domain.l2_norm is not None
        return L2BallDomain(spec.domain.l2_norm, m)
    except ValueError as exc:
        raise DataError(f"domain: {exc}") from None


def _directions(spec: ReleaseSpec, m: int) -> Directions | None:
    d = spec.mechanism.directions
    important = tuple(spec.mechanism.allocation.important or ())
    if d.method == "standard":
        return Directions.standard(m, important)
    if d.method == "matrix":
        assert d.path is not None
        try:
            W = np.load(d.path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"mechanism.directions.path: cannot load {d.path} ({exc})") from None
        try:
            return Directions.from_matrix(W, important)
        except ValueError as exc:
            raise DataError(f"mechanism.directions.path: {exc}") from None
    k = _dp_pca_k(spec)
    if not 1 <= k <= m:
        raise DataError(f"mechanism.directions.k: must lie in 1..{m}, got {k}")
    return None


def _dp_pca_k(spec: ReleaseSpec) -> int:
    """Number of important DP-PCA directions (``k``, else the allocation's count, else 1)."""
    d, a = spec.mechanism.directions, spec.mechanism.allocation
    return d.k if d.k is not None else len(a.important or ()) or 1


def _noise_plan(
    spec: ReleaseSpec,
    query: QuerySpec,
    domain: RecordDomain,
    allocation: AllocationSpec,
    directions: Directions,
    share: float,
) -> NoisePlan:
    mech = spec.mechanism
    return build_noise_plan(
        query,
        domain,
        epsilon=spec.privacy.epsilon,
        delta=spec.privacy.delta,
        algorithm=mech.algorithm,
        calibration=mech.calibration,
        directions=directions,
        allocation=allocation,
        neighbours=spec.privacy.neighbours,
        direction_share=share,
    )


def plan_release(spec: ReleaseSpec, *, release_id: str | None = None) -> ReleasePlan:
    """Plan a release from its spec and the input's metadata; no chunk is read.

    Parameters
    ----------
    spec : ReleaseSpec
        Validated spec.
    release_id : str, optional
        Overrides ``spec.release_id``; a fresh id is made when neither is given.

    Returns
    -------
    ReleasePlan
        The plan.

    Raises
    ------
    DataError
        When the spec does not fit the data or a parameter is invalid.
    """
    rid = release_id or spec.release_id or new_release_id(spec.name)
    inp = spec.input
    info = open_input(inp.store, inp.variable, inp.record_dim, inp.feature_dim, inp.storage_options)
    m = info.features
    domain = _domain(spec, m)
    mech = spec.mechanism
    try:
        query = QuerySpec(
            kind=spec.query,
            features=m,
            records=info.records,
            sensitivity=mech.sensitivity,
            gamma=mech.gamma,
            entry_range=mech.entry_range,
        )
    except ValueError as exc:
        raise DataError(f"mechanism: {exc}") from None
    a = mech.allocation
    allocation = AllocationSpec(
        strategy=a.strategy, important=a.important, share=a.share, theta=a.theta
    )
    directions = _directions(spec, m)
    share = mech.directions.budget_share if directions is None else 0.0
    try:
        split = split_budget(mech.calibration, spec.privacy.epsilon, spec.privacy.delta, share)
        if directions is not None:
            plan: NoisePlan | None = _noise_plan(spec, query, domain, allocation, directions, 0.0)
            preview: dict[str, Any] = {}
        else:
            plan = None
            k = _dp_pca_k(spec)
            stand_in = Directions("dp-pca", np.eye(m), tuple(range(k)), np.linspace(2, 1, m))
            preview = _noise_plan(spec, query, domain, allocation, stand_in, share).to_dict()
            for name in _DIRECTION_DEPENDENT:
                preview[name] = None
            preview["allocation"]["theta"] = None
            preview["directions"] = {
                "method": "dp-pca",
                "k": k,
                "matrix": None,
                "important": list(range(k)),
            }
    except ValueError as exc:
        raise DataError(f"mechanism: {exc}") from None
    return ReleasePlan(
        spec=spec,
        release_id=rid,
        info=info,
        query=query,
        domain=domain,
        split=split,
        noise_plan=plan,
        directions=directions,
        allocation=allocation,
        _preview=preview,
    )


def _clipper(rplan: ReleasePlan) -> Clipper:
    d = rplan.domain
    on_violation = rplan.spec.domain.on_violation
    if isinstance(d, BoxDomain):
        return Clipper("box", d.lower[:, None], d.upper[:, None], None, on_violation)
    return Clipper("l2", None, None, d.radius, on_violation)


def _record_ranges(info: InputInfo) -> list[tuple[int, int]]:
    """One ``[start, stop)`` record range per stored chunk: the release's task grid."""
    c = info.record_chunk
    return [(a, min(a + c, info.records)) for a in range(0, info.records, c)]


def _source(rplan: ReleasePlan) -> ZarrMatrix:
    inp = rplan.spec.input
    return ZarrMatrix(inp.store, inp.variable, rplan.info.records_first, inp.storage_options)


def _compute_gram(
    client: Client, rplan: ReleasePlan, clipper: Clipper, progress: bool
) -> tuple[np.ndarray, int]:
    """``X X^T`` of the clipped records: per-chunk partials, then a fixed-order tree reduction
    (groups of ``SPLIT_EVERY`` consecutive chunks), so the sum is the same on every run."""
    source = _source(rplan)
    ranges = _record_ranges(rplan.info)
    leaves = [
        client.submit(gram_task, a, b, source=source, clipper=clipper, pure=False)
        for a, b in ranges
    ]
    level = leaves
    while len(level) > 1:
        level = [
            client.submit(combine_grams, level[i : i + SPLIT_EVERY], pure=False)
            for i in range(0, len(level), SPLIT_EVERY)
        ]
    gather_with_progress(
        client, leaves, Progress(len(leaves), "gram", enabled=progress), keep=False
    )
    gram, clipped = level[0].result()
    return np.asarray(gram), int(clipped)


def _provenance(rplan: ReleasePlan, plan: NoisePlan, key: NoiseKey, clipped: int) -> dict[str, Any]:
    s = rplan.spec
    return {
        "mvg_dask_release_id": rplan.release_id,
        "mvg_dask_name": s.name,
        "mvg_dask_version": __version__,
        "mvg_dask_created": datetime.now(UTC).isoformat(timespec="seconds"),
        "mvg_dask_query": s.query,
        "mvg_dask_algorithm": plan.algorithm,
        "mvg_dask_calibration": plan.calibration,
        "mvg_dask_epsilon": plan.epsilon,
        "mvg_dask_delta": plan.delta,
        "mvg_dask_neighbours": plan.neighbours,
        "mvg_dask_sensitivity": plan.sensitivity,
        "mvg_dask_gamma": plan.gamma,
        "mvg_dask_mahalanobis_sensitivity": plan.mahalanobis_sensitivity,
        "mvg_dask_precision_budget": plan.precision_budget,
        "mvg_dask_composition": plan.split.composition,
        "mvg_dask_record_domain": json.dumps(plan.domain.to_dict()),
        "mvg_dask_on_violation": s.domain.on_violation,
        "mvg_dask_clipped_count": clipped,
        "mvg_dask_seeded": key.seeded,
        "mvg_dask_seeded_note": (
            "noise derived from a user seed: reproducible, NOT private" if key.seeded else ""
        ),
        "mvg_dask_tile_records": rplan.tile_records,
        "mvg_dask_input_store": s.input.store,
        "mvg_dask_input_variable": s.input.variable,
        "mvg_dask_plan": json.dumps(plan.to_dict()),
    }


def _noise_variables(plan: NoisePlan, fd: str, coord: Any) -> dict[str, Any]:
    rows, cols = f"{fd}_row", f"{fd}_col"
    out: dict[str, Any] = {
        "row_cov": xr.DataArray(plan.row_cov, dims=(rows, cols)),
        "directions": xr.DataArray(plan.directions.matrix, dims=(rows, "direction")),
        "noise_variances": xr.DataArray(plan.row_variances, dims=("direction",)),
    }
    if plan.algorithm == "equi-modal":
        out["col_cov"] = xr.DataArray(plan.row_cov, dims=(rows, cols))
    return out


def _feature_coord(info: InputInfo) -> Any:
    v = info.variable
    return v.coords[info.feature_dim].values if info.feature_dim in v.coords else None


def execute_release(
    rplan: ReleasePlan,
    client: Client,
    *,
    seed: int | None = None,
    progress: bool = True,
) -> ReleaseResult:
    """Run a planned release on ``client``: reserve, compute, write, commit.

    With a ledger in the spec the release is reserved before any data is read and committed
    after the output is complete. A release id that is pending in the ledger (a crashed run) is
    resumed with its stored key: chunks already written are skipped and the output is the same
    as that of an uninterrupted run; it is charged once.

    Parameters
    ----------
    rplan : ReleasePlan
        From :func:`plan_release`.
    client : distributed.Client
        Where to compute.
    seed : int, optional
        Reproducible noise (tests, demos), recorded as NOT private.
    progress : bool
        Show progress.

    Returns
    -------
    ReleaseResult
        Summary of the complete release.
    """
    t0 = time.perf_counter()
    spec = rplan.spec
    target = OutputTarget(spec.output.store, rplan.release_id, spec.output.storage_options)
    ledger = (
        open_ledger(spec.ledger.location, password_file=spec.ledger.password_file)
        if spec.ledger is not None
        else None
    )
    log.info(
        "release %s: %s query of %s (%d x %d) -> %s",
        rplan.release_id,
        spec.query,
        spec.input.store,
        rplan.info.features,
        rplan.info.records,
        spec.output.store,
    )
    try:
        key, resumed = _reserve(rplan, ledger, target, seed)
        if resumed and target.is_complete():
            # the previous run finished writing (and may have stopped before the ledger commit)
            assert ledger is not None
            entry = ledger.lookup(rplan.release_id)
            if entry is not None and entry.status == "pending":
                ledger.commit(rplan.release_id)
            log.info("release %s is already complete: nothing to do", rplan.release_id)
            return _result_from_store(rplan, target, t0)
        crash_point("reserved")
        try:
            plan, clipped = _run(rplan, client, key, target, resume=resumed, progress=progress)
            crash_point("before-commit")
            target.commit(_provenance(rplan, plan, key, clipped))
        except (DataError, ReleaseError, BudgetError):
            # a clean failure before anything was published: remove it, refund it
            target.abort()
            if ledger is not None and not resumed:
                ledger.cancel(rplan.release_id)
            raise
        crash_point("before-ledger-commit")
        if ledger is not None:
            ledger.commit(rplan.release_id, clipped=clipped)
    finally:
        if ledger is not None:
            ledger.close()
    return ReleaseResult(
        release_id=rplan.release_id,
        output=spec.output.store,
        plan=plan,
        clipped_count=clipped,
        seconds=time.perf_counter() - t0,
        seeded=key.seeded,
    )


def _reserve(
    rplan: ReleasePlan, ledger: Ledger | None, target: OutputTarget, seed: int | None
) -> tuple[NoiseKey, bool]:
    """The release key and whether this run resumes a pending release."""
    spec = rplan.spec
    fresh = NoiseKey.from_seed(seed) if seed is not None else NoiseKey.fresh()
    if ledger is None:
        log.warning(
            "release %s has no ledger in its spec: it is not charged to any privacy budget "
            "and cannot be resumed after a crash",
            rplan.release_id,
        )
        target.check_free()
        target.clear_staging()
        return fresh, False
    assert spec.ledger is not None
    budget = spec.ledger.budget
    ledger.ensure_dataset(spec.ledger.dataset, budget.epsilon, budget.delta, budget.neighbours)
    entry = ledger.lookup(rplan.release_id)
    digest = spec_hash(spec)
    if entry is not None:
        if entry.spec_hash != digest or entry.dataset != spec.ledger.dataset:
            raise ReleaseError(
                f"release_id {rplan.release_id!r} is already in the ledger with a different "
                "spec; a resume must use the same spec, otherwise choose a new release_id"
            )
        if entry.status == "committed":
            if target.is_complete():
                return fresh, True  # idempotent: a retried job finds its release done
            raise ReleaseError(
                f"release {rplan.release_id!r} is committed in the ledger but its output "
                f"{entry.output} is missing or incomplete; it was charged: choose a new release_id"
            )
        if entry.status == "aborted":
            raise ReleaseError(
                f"release {rplan.release_id!r} was aborted after reading data and stays "
                "charged; choose a new release_id"
            )
        assert entry.noise_key is not None
        log.info("resuming pending release %s", rplan.release_id)
        return NoiseKey.from_hex(entry.noise_key, seeded=entry.seeded), True
    target.check_free()
    target.clear_staging()
    mu = (
        cal.analytic_gaussian_mu(spec.privacy.epsilon, spec.privacy.delta)
        if spec.mechanism.calibration == "exact"
        else None
    )
    ledger.reserve(
        dataset=spec.ledger.dataset,
        release_id=rplan.release_id,
        epsilon=spec.privacy.epsilon,
        delta=spec.privacy.delta,
        calibration=spec.mechanism.calibration,
        mu=mu,
        spec_hash=digest,
        output=spec.output.store,
        noise_key=fresh.to_hex(),
        seeded=fresh.seeded,
        neighbours=spec.privacy.neighbours,
        convert_neighbours=spec.ledger.convert_neighbours,
    )
    return fresh, False


def _run(
    rplan: ReleasePlan,
    client: Client,
    key: NoiseKey,
    target: OutputTarget,
    *,
    resume: bool,
    progress: bool,
) -> tuple[NoisePlan, int]:
    spec = rplan.spec
    check_chunks_present(spec.input.store, spec.input.variable, spec.input.storage_options)
    clipper = _clipper(rplan)
    info = rplan.info
    gram: np.ndarray | None = None
    clipped = 0
    if rplan.uses_dp_pca:
        # one pass gives the Gram matrix for DP-PCA (and, for covariance, the query itself)
        gram, clipped = _compute_gram(client, rplan, clipper, progress)
        k = _dp_pca_k(spec)
        assert rplan.split.step_mu is not None
        directions = dp_pca(
            gram,
            records=info.records,
            k=k,
            mu=rplan.split.step_mu,
            sensitivity=gram_sensitivity(rplan.domain, spec.privacy.neighbours),
            key=key.derive("dp-pca"),
        )
        plan = rplan.build(directions)
    else:
        plan = rplan.build()
    release_key = key.derive("release")
    if spec.query == "covariance":
        if gram is None:
            gram, clipped = _compute_gram(client, rplan, clipper, progress)
        fd = info.feature_dim
        coord = _feature_coord(info)
        value = _privatize_covariance(gram / info.records, plan, release_key)
        coords = {f"{fd}_row": coord, f"{fd}_col": coord} if coord is not None else {}
        ds = xr.Dataset(
            {
                "covariance": xr.DataArray(value, dims=(f"{fd}_row", f"{fd}_col")),
                **_noise_variables(plan, fd, coord),
            },
            coords=coords,
        )
        ds.attrs[STATUS_ATTR] = "incomplete"
        target.clear_staging()
        ds.to_zarr(
            target.write_store,
            mode="w-",
            zarr_format=3,
            consolidated=False,
            storage_options=spec.output.storage_options,
        )
    else:
        clipped = _identity_pass(
            client, rplan, plan, clipper, release_key, target, resume=resume, progress=progress
        )
    return plan, clipped


def _result_from_store(rplan: ReleasePlan, target: OutputTarget, t0: float) -> ReleaseResult:
    ds = open_release(rplan.spec.output.store, storage_options=rplan.spec.output.storage_options)
    plan = rplan.noise_plan
    if plan is None:
        d = np.asarray(ds["directions"].values)
        k = _dp_pca_k(rplan.spec)
        plan = rplan.build(Directions("dp-pca", d, tuple(range(k))))
    return ReleaseResult(
        release_id=rplan.release_id,
        output=rplan.spec.output.store,
        plan=plan,
        clipped_count=int(ds.attrs["mvg_dask_clipped_count"]),
        seconds=time.perf_counter() - t0,
        seeded=bool(ds.attrs["mvg_dask_seeded"]),
    )


def _privatize_covariance(value: np.ndarray, plan: NoisePlan, key: NoiseKey) -> np.ndarray:
    m = value.shape[0]
    B = plan.row_factor
    N = key.tile_normals(0, (m, m))
    Z = affine_sample(N, B, B if plan.algorithm == "equi-modal" else None)
    return np.asarray(value + Z)


def _identity_pass(
    client: Client,
    rplan: ReleasePlan,
    plan: NoisePlan,
    clipper: Clipper,
    key: NoiseKey,
    target: OutputTarget,
    *,
    resume: bool,
    progress: bool,
) -> int:
    import dask.array as da

    info = rplan.info
    spec = rplan.spec
    var = info.variable
    name = spec.input.variable
    ranges = _record_ranges(info)
    if not (resume and target.has_skeleton()):
        # the output skeleton: same name, dims and (small) coords as the input; chunk = task
        target.clear_staging()
        rec = info.record_chunk
        chunks = (rec, info.features) if info.records_first else (info.features, rec)
        placeholder = da.zeros(var.shape, chunks=chunks, dtype=np.float64)
        coord = _feature_coord(info)
        out = xr.Dataset(
            {
                name: xr.DataArray(placeholder, dims=var.dims),
                **_noise_variables(plan, info.feature_dim, coord),
            },
            coords={**small_coords(var)},
        )
        if coord is not None:
            out = out.assign_coords(
                {f"{info.feature_dim}_row": coord, f"{info.feature_dim}_col": coord}
            )
        out.attrs[STATUS_ATTR] = "incomplete"
        out.attrs[RELEASE_ID_ATTR] = rplan.release_id
        out.to_zarr(
            target.write_store,
            mode="w-",
            compute=False,
            zarr_format=3,
            consolidated=False,
            encoding={name: {"chunks": chunks}},
            storage_options=spec.output.storage_options,
        )
        target.make_progress_dir()
    crash_point("skeleton")
    sink = ZarrMatrix(target.write_store, name, info.records_first, spec.output.storage_options)
    source = _source(rplan)
    futures = [
        client.submit(
            identity_task,
            a,
            b,
            source=source,
            sink=sink,
            clipper=clipper,
            noise_key=key,
            factor=plan.row_factor,
            tile=rplan.tile_records,
            n_total=info.records,
            diagonal=plan.directions.is_standard,
            pure=False,
        )
        for a, b in ranges
    ]
    results = gather_with_progress(
        client,
        futures,
        Progress(len(futures), "release", enabled=progress),
        on_result=lambda i: crash_point("chunk", i),
    )
    counts = np.sum(results, axis=0)
    if int(counts[1]) != info.records:  # pragma: no cover - a bookkeeping invariant
        raise ReleaseError(f"wrote {counts[1]} records, expected {info.records}")
    return int(counts[0])


def crash_point(name: str, index: int | None = None) -> None:
    """Fault injection for the crash tests: ``MVG_DASK_CRASH_AT=name[:index]`` SIGKILLs this
    process when the release reaches that point. Unset in production (does nothing)."""
    target = os.environ.get("MVG_DASK_CRASH_AT")
    if not target:
        return
    want, _, at = target.partition(":")
    if want == name and (not at or (index is not None and index >= int(at))):
        os.kill(os.getpid(), signal.SIGKILL)
