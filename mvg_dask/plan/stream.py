"""A stream's plan: its factorization, the noise of every period, calibrated once.

A stream (``stream: {horizon, factorization}``, docs/guide/streams.md) releases, period after
period, the query over every record appended so far. The whole stream is one Gaussian mechanism
``y = C g + Z`` (docs/bounds.md, "Continual releases"): ``g_s`` is period ``s``'s lattice
increment (the whitened, rounded sum of the query's partials over the period's new records),
``C`` the factorization's encoder, and one record moves one ``g_s`` by at most the lattice's
effective sensitivity ``Δ`` (docs/lattice.md, Lemma 2). Its sensitivity is
``max_s ‖C[:, s]‖₂ Δ``, so the stream is ``μ``-GDP when every output ``y_r`` carries the noise of
a one-shot release planned for ``μ / max_s ‖C[:, s]‖₂``: :func:`plan_stream` plans that one-shot
release (:func:`~mvg_dask.plan.planning.plan_release`, the same query, domain, allocation and
lattice) and keeps it as the stream's *period plan*. Period ``t`` publishes
``x̂_t = B[t] y`` (post-processing), whose noise std is the period plan's times
``‖B[t]‖₂`` (:meth:`StreamPlan.std_factor`).

Every number here is public: the plan never depends on the store's current size (it is planned
for ``max_records`` records, the query normalised by that bound).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mvg_dask.errors import DataError
from mvg_dask.plan.input_metadata import DEFAULT_MAX_RECORDS, InputMetadata
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.continual import (
    INT64_MAX,
    Factorization,
    compare_at_budget,
    make_factorization,
)
from mvg_dask.spec import ReleaseSpec

#: The exact integer outputs stay below this (a quarter of int64's range is left for the noise).
OUTPUT_RANGE = 1 << 61
#: The coarsest grid a stream takes: ``2^k sqrt(c) <= GRID_LIMIT μ`` (at most 0.4 % of
#: the sensitivity, charged like the one-shot grid's share).
GRID_LIMIT = 2.0**-8
#: ``μ`` of the period plan is planned this much below ``μ / sensitivity`` (the planner's inverse
#: of the analytic Gaussian is exact to about 1e-13; the stream must never be under-noised).
MU_MARGIN = 1e-9


def stream_factorization(spec: ReleaseSpec) -> Factorization:
    """The factorization a spec's ``stream`` section names (the tree with Honaker's estimator).

    Parameters
    ----------
    spec : ReleaseSpec
        A spec with a ``stream`` section.

    Returns
    -------
    Factorization
        The frozen factorization.
    """
    assert spec.stream is not None
    return make_factorization(spec.stream.factorization, spec.stream.horizon)


def stream_id_of(spec: ReleaseSpec, release_id: str | None = None) -> str:
    """The stream's id: the release id given, the spec's ``release_id``, else its ``name``
    (stable across runs: every run of the spec advances the same stream)."""
    return release_id or spec.release_id or spec.name


def period_release_id(stream_id: str, period: int) -> str:
    """The release id of a stream's period: ``<stream id>.p<period, 4 digits>``."""
    return f"{stream_id}.p{period:04d}"


def max_records(spec: ReleaseSpec) -> int:
    """The public bound on the stream's records (``stream.max_records``, else
    ``privacy.max_records``, else ``2**32``): the period plan's record count and float-error
    bound."""
    assert spec.stream is not None
    return spec.stream.max_records or spec.privacy.max_records or DEFAULT_MAX_RECORDS


def planning_metadata(metadata: InputMetadata, records: int) -> InputMetadata:
    """The input's metadata with its record count replaced by the public bound ``records``."""
    m = metadata.features
    rows_first = metadata.dims[0] == metadata.record_dim
    shape = (records, m) if rows_first else (m, records)
    return replace(metadata, shape=shape)


def _period_spec(spec: ReleaseSpec, sensitivity: float) -> ReleaseSpec:
    """The one-shot spec whose Gaussian ``μ`` is the stream's over ``sensitivity`` (by its
    ``ε`` at the same ``δ``), without the ``stream`` and ``ledger`` sections."""
    p = spec.privacy
    mu = cal.analytic_gaussian_mu(p.epsilon, p.delta) / sensitivity * (1.0 - MU_MARGIN)
    epsilon = cal.analytic_gaussian_epsilon(mu, p.delta)
    data = spec.model_dump(mode="python", exclude={"stream", "ledger", "release_id"})
    data["privacy"] = {**data["privacy"], "epsilon": epsilon}
    if p.neighbours == "add-remove":  # the float-error bound of the stream's own bound
        data["privacy"]["max_records"] = max_records(spec)
    return ReleaseSpec.model_validate(data)


@dataclass(frozen=True, eq=False)
class StreamPlan:
    """A stream, planned: its factorization, its period plan and its public integer bounds.

    Attributes
    ----------
    stream_id : str
        The stream's id (the spec's ``release_id`` or ``name``).
    spec_hash : str
        The hash of the spec (recognises the same stream).
    factorization : Factorization
        ``A = B C``.
    plan : ReleasePlan
        The period plan: a one-shot release of the query at ``μ / ‖C‖_{1→2}``, planned for
        ``max_records`` records (its query normalised by that bound).
    epsilon, delta, mu : float
        The whole stream's guarantee (``μ``-GDP, all periods together).
    max_records : int
        The public bound on the stream's records.
    increment_bound : int
        A public bound on every lattice coordinate of one period's increment.
    """

    stream_id: str
    spec_hash: str
    factorization: Factorization
    plan: ReleasePlan
    epsilon: float
    delta: float
    mu: float
    max_records: int
    increment_bound: int

    @property
    def horizon(self) -> int:
        """``T``."""
        return self.factorization.horizon

    @property
    def sensitivity(self) -> float:
        """``max_s ‖C[:, s]‖₂`` (rounded up): the stream's sensitivity per unit ``Δ``."""
        return self.factorization.sensitivity()

    def std_factor(self, period: int) -> float:
        """``‖B[t]‖₂``: period ``t``'s noise std over the period plan's.

        Parameters
        ----------
        period : int
            ``t``, 1-based.

        Returns
        -------
        float
            The factor.
        """
        return self.factorization.period_std_factor(period)

    def period_mu(self) -> float:
        """The period plan's total ``μ`` (release and noisy count together)."""
        budgets = self.plan.budgets
        mus = [m for m in (budgets.count_mu, budgets.release_mu) if m is not None]
        return math.sqrt(math.fsum(m * m for m in mus))

    def to_dict(self) -> dict[str, Any]:
        """The stream's public description (published with every period)."""
        return {
            "stream_id": self.stream_id,
            "horizon": self.horizon,
            "factorization": self.factorization.to_dict(),
            "sensitivity": self.sensitivity,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "mu": self.mu,
            "period_mu": self.period_mu(),
            "max_records": self.max_records,
        }


def coordinate_bound(plan: ReleasePlan, records: int) -> float:
    """A public bound on every whitened lattice coordinate of the query over at most ``records``
    records of the domain (before rounding, float error included). With ``A`` the (augmented,
    stacked) records' largest entry, one record adds at most ``A`` to an entry of a vector query
    (the mean) and ``A^2`` to an entry of a matrix one (products of two entries); the query
    divides the sum by its normaliser ``n``; whitening multiplies by at most ``max w`` (unimodal
    noise) or ``max w^2`` (two-sided), symmetric noise's off-diagonals by ``1 / sqrt(r)``; plus
    ``E``.

    Parameters
    ----------
    plan : ReleasePlan
        The period plan (standard directions).
    records : int
        The public bound on the records summed.

    Returns
    -------
    float
        The bound, in whitened units.
    """
    from mvg_dask.plan.noise_calibration import domain_abs_max

    noise = plan.noise_plan()
    assert noise.lattice is not None, "a stream adds lattice noise"
    top = float(np.max(domain_abs_max(plan.query.record_domain(plan.domain))))
    w = float(np.max(1.0 / np.sqrt(np.asarray(noise.row_variances, dtype=np.float64))))
    peak = top if plan.query.output_vector else top * top
    peak *= w if noise.algorithm == "unimodal" else w * w
    if noise.algorithm == "symmetric" and noise.symmetric_ratio is not None:
        peak *= max(1.0, 1.0 / math.sqrt(noise.symmetric_ratio))
    return peak * records / plan.query.records * (1.0 + 1e-6) + noise.lattice.float_error


def increment_bound(plan: ReleasePlan, records: int) -> int:
    """A public bound on ``|h|``, every lattice coordinate of one period's increment
    (:func:`coordinate_bound` in grid units, plus the rounding's half).

    Parameters
    ----------
    plan : ReleasePlan
        The period plan.
    records : int
        The public bound on the records summed.

    Returns
    -------
    int
        The bound.
    """
    lattice = plan.noise_plan().lattice
    assert lattice is not None, "a stream adds lattice noise"
    return math.floor(coordinate_bound(plan, records) / lattice.grid) + 1


def stream_mu(spec: ReleaseSpec) -> float:
    """The whole stream's ``μ``."""
    return cal.analytic_gaussian_mu(spec.privacy.epsilon, spec.privacy.delta)


def refuse_headroom(factorization: Factorization, records: int) -> None:
    """Refuse a horizon whose integers need a grid so coarse it would dominate the noise.

    Raises
    ------
    DataError
        With the remedy.
    """
    raise DataError(
        f"stream.horizon: {factorization.horizon} periods of the {factorization.name} "
        f"factorization exceed the lattice's int64 headroom for {records:.3g} records (the "
        "weighted sums of the periods' integers would need a grid coarser than the noise); "
        "use a shorter horizon, the tree factorization, or a smaller stream.max_records"
    )


def check_headroom(factorization: Factorization, bound: int, records: int) -> None:
    """Refuse a horizon whose exact integer outputs could leave ``OUTPUT_RANGE``.

    Raises
    ------
    DataError
        With the remedy (a shorter horizon, the tree, or a smaller ``privacy.max_records``).
    """
    rows = factorization.max_row_sum_int()
    if max(bound, records) * rows <= OUTPUT_RANGE:
        return
    fit = [
        t
        for t in (365, 180, 90, 30, 16)
        if max(bound, records) * make_factorization(factorization.name, t).max_row_sum_int()
        <= OUTPUT_RANGE
    ]
    hint = f"a horizon of at most {fit[0]}" if fit else "the tree factorization"
    raise DataError(
        f"stream.horizon: {factorization.horizon} periods of the {factorization.name} "
        f"factorization can exceed the lattice's int64 headroom (a period's coordinates reach "
        f"{max(bound, records):.3g}, summed with weights up to {rows}); use {hint}, or "
        "a smaller stream.max_records"
    )


def plan_stream(
    spec: ReleaseSpec, metadata: InputMetadata, *, release_id: str | None = None
) -> StreamPlan:
    """Plan a stream from its spec and the input's metadata. Pure: reads nothing.

    Parameters
    ----------
    spec : ReleaseSpec
        A validated spec with a ``stream`` section.
    metadata : InputMetadata
        The input's metadata; only its features, dims and chunking are used (the plan is for
        ``max_records`` records, whatever the store holds now).
    release_id : str, optional
        Overrides the stream's id.

    Returns
    -------
    StreamPlan
        The plan.

    Raises
    ------
    DataError
        The store holds more than ``max_records`` records, or the horizon exceeds the lattice's
        headroom.
    """
    from mvg_dask.plan.planning import plan_release
    from mvg_dask.spec import spec_hash

    if spec.stream is None:
        raise ValueError("plan_stream needs a spec with a stream section")
    factorization = stream_factorization(spec)
    bound_records = max_records(spec)
    if metadata.records > bound_records:
        raise DataError(
            f"stream.max_records: the input has more records than the stream's bound "
            f"{bound_records}; declare a larger bound (a new stream)"
        )
    sid = stream_id_of(spec, release_id)
    period_spec = _period_spec(spec, factorization.sensitivity())
    planned = planning_metadata(metadata, bound_records)
    options: dict[str, Any] = {
        "release_id": period_release_id(sid, 0),
        "created": "1970-01-01T00:00:00+00:00",  # a stream's periods publish no clock time
    }
    plan = plan_release(period_spec, planned, **options)
    # the grid coarse enough that every output's weighted sum of increments stays in range,
    # max_r sum_s |C_int[r, s]| |h| <= OUTPUT_RANGE / 2 (the coordinates only shrink as the
    # calibration raises the variances for the coarser grid: checked again below)
    lattice = plan.noise_plan().lattice
    assert lattice is not None
    rows = factorization.max_row_sum_int()
    need = coordinate_bound(plan, bound_records) * rows / (OUTPUT_RANGE // 2)
    floor = math.ceil(math.log2(need))
    if floor > lattice.log2_grid:
        mu = plan.budgets.release_mu or stream_mu(spec)
        if math.ldexp(math.sqrt(lattice.coordinates), floor) > GRID_LIMIT * mu:
            refuse_headroom(factorization, bound_records)
        plan = plan_release(period_spec, planned, min_log2_grid=floor, **options)
    bound = increment_bound(plan, bound_records)
    check_headroom(factorization, bound, bound_records)
    p = spec.privacy
    stream = StreamPlan(
        stream_id=sid,
        spec_hash=spec_hash(spec),
        factorization=factorization,
        plan=plan,
        epsilon=p.epsilon,
        delta=p.delta,
        mu=cal.analytic_gaussian_mu(p.epsilon, p.delta),
        max_records=bound_records,
        increment_bound=bound,
    )
    if stream.period_mu() * stream.sensitivity > stream.mu:
        raise AssertionError("the period plan is under-noised")  # pragma: no cover
    return stream


@dataclass(frozen=True)
class StreamPreview:
    """The dry run of a stream: its plan and the same-budget comparison, computed.

    Attributes
    ----------
    stream : StreamPlan
        The plan.
    period : int
        The period the next run releases.
    period_std : float
        That period's largest entry std.
    one_shot_std : float
        The largest entry std of a one-shot release of the query at the stream's budget.
    worst_ratio : float
        The worst period's std over ``one_shot_std``.
    text : str
        What ``mvg-dask release --dry-run`` prints for the stream.
    """

    stream: StreamPlan
    period: int
    period_std: float
    one_shot_std: float
    worst_ratio: float
    text: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``mvg-dask release --dry-run --json``)."""
        rows = compare_at_budget(self.stream.horizon, self.stream.epsilon, self.stream.delta)
        return {
            "stream": self.stream.to_dict(),
            "period": self.period,
            "period_std": self.period_std,
            "one_shot_std": self.one_shot_std,
            "worst_ratio": self.worst_ratio,
            "comparison": [{"method": r.method, "ratio": r.ratio} for r in rows],
        }


def one_shot_plan(spec: ReleaseSpec, metadata: InputMetadata) -> ReleasePlan:
    """A one-shot release of the stream's query at the stream's whole budget, planned for the
    same public record bound (the comparison's baseline)."""
    from mvg_dask.plan.planning import plan_release

    data = spec.model_dump(mode="python", exclude={"stream", "ledger", "release_id"})
    if spec.privacy.neighbours == "add-remove":
        data["privacy"]["max_records"] = max_records(spec)
    return plan_release(
        ReleaseSpec.model_validate(data),
        planning_metadata(metadata, max_records(spec)),
        release_id="one-shot",
        created="1970-01-01T00:00:00+00:00",
    )


def preview_stream(stream: StreamPlan, one_shot: ReleasePlan, period: int) -> StreamPreview:
    """The stream's dry run (:class:`StreamPreview`).

    Parameters
    ----------
    stream : StreamPlan
        The plan.
    one_shot : ReleasePlan
        :func:`one_shot_plan`.
    period : int
        The period the next run releases (``horizon + 1``: the stream is complete).

    Returns
    -------
    StreamPreview
        The numbers and their text.
    """
    std = float(np.max(stream.plan.noise_plan().released_entry_std()))
    one = float(np.max(one_shot.noise_plan().released_entry_std()))
    f = stream.factorization
    t = min(period, stream.horizon)
    worst = std * f.worst_std_factor()
    lines = [
        f"stream {stream.stream_id}: horizon {stream.horizon} periods, "
        f"{json.dumps(f.to_dict())}, one Gaussian mechanism mu = {stream.mu:.4g} "
        f"(epsilon = {stream.epsilon:g}, delta = {stream.delta:g}) for all periods, charged once",
        f"  sensitivity max_s ||C[:, s]|| = {stream.sensitivity:.4f}: each output's noise is a "
        f"one-shot release's at mu = {stream.period_mu():.4g}",
    ]
    if period > stream.horizon:
        lines.append(f"  the stream is complete ({stream.horizon} periods): a new run is refused")
    else:
        lines.append(
            f"  period {t}: noise std {std * f.period_std_factor(t):.4g} (largest entry, in "
            f"the plan's units: x max_records / N_t under replace-one)"
        )
    lines += [
        f"  worst period: std {worst:.4g} = {worst / one:.2f}x a one-shot release's "
        f"({one:.4g}) at the same budget",
        "  same total budget, worst-period std over a one-shot release's:",
    ]
    for row in compare_at_budget(stream.horizon, stream.epsilon, stream.delta):
        lines.append(f"    {row.method:<34} {row.ratio:8.2f}x")
    return StreamPreview(
        stream, period, std * f.period_std_factor(t), one, worst / one, "\n".join(lines)
    )


__all__ = [
    "INT64_MAX",
    "StreamPlan",
    "StreamPreview",
    "check_headroom",
    "coordinate_bound",
    "increment_bound",
    "max_records",
    "one_shot_plan",
    "period_release_id",
    "plan_stream",
    "planning_metadata",
    "preview_stream",
    "stream_factorization",
    "stream_id_of",
]
