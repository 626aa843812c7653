"""Planning a release: :func:`plan_release` builds a
:class:`~mvg_dask.plan.release_plan.ReleasePlan` from a validated spec and the input's metadata,
purely (no chunk is read), with the record domain, the query, the budget shares, the lattice
context and the ledger charge it decides.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from mvg_dask.errors import DataError
from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, tile_records_for
from mvg_dask.plan.budget import Allocation, StepBudgets, share_budget
from mvg_dask.plan.directions import Directions, gram_sensitivity
from mvg_dask.plan.domain import BoxDomain, DomainRangeError, L2BallDomain, RecordDomain
from mvg_dask.plan.input_metadata import (
    DEFAULT_MAX_RECORDS,
    GRAM_MIN_TASKS,
    PANEL_RECORDS,
    TREE_FAN_IN,
    WIDE_BLOCK,
    WIDE_FEATURES,
    InputMetadata,
)
from mvg_dask.plan.lattice import LatticeContext, canonical_gram_depth, panel_depth
from mvg_dask.plan.mean_first import MeanStep, choose_route, plan_mean_step, step_mus
from mvg_dask.plan.noise_calibration import gram_step_lattice
from mvg_dask.plan.noise_plan import NoisePlan, build_noise_plan
from mvg_dask.plan.queries import DeclaredBoundError, MatrixQuery, make_query, query_type
from mvg_dask.plan.queries.cross import column_variances
from mvg_dask.plan.release_parts import DpPcaStep, LedgerCharge
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.plan.stages import release_stages
from mvg_dask.privacy import allocation
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import GaussianDP
from mvg_dask.privacy.registry import get_calibration
from mvg_dask.privacy.sensitivity import augmented_scale
from mvg_dask.spec import (
    ColumnsSpec,
    CrossCovarianceQuerySpec,
    CrossCovarianceSpec,
    ReleaseSpec,
    SpecError,
    spec_hash,
)
from mvg_dask.spec.allocation import choose_allocation


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
    qtype = query_type(spec.query_kind)
    if not qtype.blocked_output:
        try:
            qtype.check_matrix_chunk(spec.output.matrix_chunk, m)
        except ValueError as exc:
            raise DataError(str(exc)) from None
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
        if a.strategy not in (None, "uniform", "binary"):
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


def _lattice_context(
    spec: ReleaseSpec, metadata: InputMetadata, min_log2_grid: int | None = None
) -> LatticeContext | None:
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
    if query_type(spec.query_kind).blocked_output:
        # the bound of both summations (the whole-matrix Gram pass and the blocked panels), so
        # that the plan, and the bytes of a release with standard directions, never depend on
        # output.matrix_chunk
        depth = max(depth, panel_depth(records, PANEL_RECORDS))
    return LatticeContext(records=records, depth=depth, min_log2_grid=min_log2_grid)


def _stages(
    query: MatrixQuery,
    noisy_count: bool,
    step: DpPcaStep | None,
    matrix_chunk: int | None,
    noise: str,
    mean_step: MeanStep | None,
) -> tuple[str, ...]:
    """The query's own stages (:func:`~mvg_dask.plan.stages.release_stages`); a query refusing
    what its engine path cannot run is a one-line error."""
    try:
        return release_stages(
            query,
            noisy_count=noisy_count,
            dp_pca=step is not None,
            panels=matrix_chunk is not None,
            lattice=noise == "lattice",
            mean_first=mean_step is not None,
        )
    except ValueError as exc:
        raise DataError(f"mechanism: {exc}") from None


def plan_release(
    spec: ReleaseSpec,
    metadata: InputMetadata,
    *,
    release_id: str | None = None,
    directions_matrix: np.ndarray | None = None,
    created: str | None = None,
    min_log2_grid: int | None = None,
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
    min_log2_grid : int, optional
        A floor of the lattice's grid exponent (a stream's, :mod:`mvg_dask.plan.stream`).

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
    matrix_chunk = _matrix_chunk(spec, metadata.features)  # checked before any noise planning
    domain = _domain(spec, metadata)
    mech, privacy = spec.mechanism, spec.privacy
    allocation, scale = _spec_allocation(spec)
    try:  # the domain's range keeps this arithmetic finite (docs/guide/specs.md); a backstop
        query = _query(spec, metadata, domain)
        directions, step = _fixed_directions(spec, query.shape[0], directions_matrix)
        context = _lattice_context(spec, metadata, min_log2_grid)
        mean_step = _mean_first_step(spec, metadata, domain, query, context)
        allocation = _scaled(allocation, scale, query, domain, mean_step is not None)
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
    stages = _stages(query, budgets.count_share > 0, step, matrix_chunk, mech.noise, mean_step)
    plan = ReleasePlan(
        tile_records=tile_records_for(metadata.features),
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
        missing_fill=_missing_fill(spec, metadata.features, domain),
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
        stages=stages,
        mean_first=mean_step,
    )
    pending = plan.pending_noise()
    if step is not None and pending is not None:
        try:  # what DP-PCA's directions cannot change: the calibration, the allocation
            pending.check()
        except ValueError as exc:
            raise DataError(f"mechanism: {exc}") from None
    return plan


def _spec_allocation(spec: ReleaseSpec) -> tuple[Allocation, str | None]:
    """The allocation the spec declares or gets by default (:func:`choose_allocation`), with
    why, and what a scale-aware allocation's feature scale is."""
    a = spec.mechanism.allocation
    choice = choose_allocation(spec)
    allocation = Allocation(
        strategy=choice.strategy,  # type: ignore[arg-type]
        important=a.important,
        share=a.share,
        theta=a.theta,
        reason=choice.reason,
    )
    return allocation, choice.scale


def _scaled(
    allocation: Allocation,
    scale: str | None,
    query: MatrixQuery,
    domain: RecordDomain,
    mean_first: bool,
) -> Allocation:
    """A scale-aware allocation with each noise row's public scale (docs/bounds.md,
    "Scale-aware allocation"): the box's widths or largest absolute values; a moment query's
    constant coordinate ``s`` gets ``s / s'``, with ``s'`` the constant of the records rescaled
    to unit widths, so the noise is the uniform noise of the rescaled records' moment mapped
    back (the mean-first route's covariance step takes the widths)."""
    if allocation.strategy != "scale-aware":
        return allocation
    if not isinstance(domain, BoxDomain):
        raise DataError("mechanism.allocation: scale-aware needs a box domain (domain.box)")
    scales = domain.widths if scale == "width" else domain.abs_max
    if not np.all(scales > 0):
        raise DataError(
            "mechanism.allocation: scale-aware needs every feature's box to have a positive "
            "scale; use uniform"
        )
    rows = query.shape[0]
    if not mean_first and rows == domain.m + 1:  # a moment query's constant coordinate
        unit = augmented_scale(domain.m / 4.0, domain.m)
        scales = np.append(scales, float(getattr(query, "scale", 1.0)) / unit)
    if scales.size != rows and not mean_first:
        raise DataError(f"mechanism.allocation: scale-aware needs one scale per noise row ({rows})")
    return replace(allocation, scales=tuple(float(v) for v in scales))


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


def _query(spec: ReleaseSpec, metadata: InputMetadata, domain: RecordDomain) -> MatrixQuery:
    """The query, its declared bounds checked against the ones the domain proves."""
    mech, privacy = spec.mechanism, spec.privacy
    private_count = privacy.neighbours == "add-remove"
    kind = spec.query_kind
    fields: dict[str, Any] = _query_features(spec, metadata)
    fields |= query_type(kind).planned_fields(domain, metadata.features)
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
