"""Releasing the next period of a stream (docs/guide/streams.md).

:func:`release_period` runs one period: open the stream (its one charge, at its first period),
claim the next period, read only the records appended since the watermark, add their exact
integer increment to the factorization with noise keyed by (stream key, period, output)
(:mod:`mvg_dask.engine.stream_noise`), decode, write the period into the stream's store
(:mod:`mvg_dask.engine.stream_store`) and commit it with its curator-side state. A crash
mid-period resumes with the same key, so the same bytes; the stream advances only on commit.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from distributed import Client

from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.output import OutputTarget
from mvg_dask.engine.provenance import provenance
from mvg_dask.engine.release import ReleaseResult
from mvg_dask.engine.stages.context import clipper_for, gram_source_of, labels_of
from mvg_dask.engine.stream_book import FileStreamBook, past_horizon
from mvg_dask.engine.stream_carry import Carry, commit_parts, decode, encode, load_carry
from mvg_dask.engine.stream_noise import (
    add_noise,
    decode_count,
    decode_period,
    lattice_increment,
    period_outputs,
    published_matrix,
)
from mvg_dask.engine.stream_store import period_store, stream_attrs, write_stream_root
from mvg_dask.engine.tasks.gram import combine_grams, gram_task
from mvg_dask.errors import ReleaseError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.input_metadata import TREE_FAN_IN, InputMetadata, chunk_runs
from mvg_dask.plan.queries.moment import (
    centered_from_moment,
    grouped_centered_from_moment,
    scale_constant,
)
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.plan.stream import StreamPlan, period_release_id
from mvg_dask.privacy.accounting import GaussianDP
from mvg_dask.release_format import COVARIANCE, GRAM, MEAN, MOMENT
from mvg_dask.spec import ReleaseSpec

log = logging.getLogger("mvg_dask")


@dataclass(frozen=True, kw_only=True)
class PeriodResult(ReleaseResult):
    """What a released period reports (data-independent facts only): a
    :class:`~mvg_dask.engine.release.ReleaseResult` of the period (its ``plan`` is the period
    plan, whose std the period's is ``std_factor`` times) and the stream's facts.

    Attributes
    ----------
    stream_id : str
        The stream.
    period : int
        The period released (1-based).
    label : str
        Its label (the period coordinate).
    std_factor : float
        ``‖B[t]‖₂``: the period's noise std over the period plan's.
    """

    stream_id: str
    period: int
    label: str
    std_factor: float


def read_increment(
    client: Client, rplan: ReleasePlan, start: int, stop: int
) -> tuple[np.ndarray, int]:
    """The query's exact partial sum over the records ``[start, stop)`` and the clipped count
    (curator-side): canonical record blocks in tasks, combined by the fixed tree of the Gram
    pass (:func:`~mvg_dask.engine.stages.gram.submit_gram`'s sum over the period's records).

    Parameters
    ----------
    client : distributed.Client
        Where to compute.
    rplan : ReleasePlan
        The period plan with the input's real metadata (what is read).
    start, stop : int
        The period's records.

    Returns
    -------
    tuple of (numpy.ndarray, int)
        The sum (a grouped release: one per group) and the values clipped.
    """
    inp = rplan.input
    runs = chunk_runs(stop - start, inp.canonical_block(), inp.canonical_blocks_per_task())
    ranges = [(start + a, start + b) for a, b in runs] or [(start, start)]
    starts, stops = zip(*ranges, strict=True)
    futures = client.map(
        gram_task,
        starts,
        stops,
        source=gram_source_of(rplan),
        clipper=clipper_for(rplan),
        step=inp.record_chunk,
        block=inp.canonical_block(),
        labels=labels_of(rplan),
        query=rplan.query.gram_pass(),
        pure=False,
    )
    parts = client.gather(futures)
    while len(parts) > 1:
        parts = [
            combine_grams(parts[i : i + TREE_FAN_IN], rplan.query.gram_pass())
            for i in range(0, len(parts), TREE_FAN_IN)
        ]
    total, clipped = parts[0].unwrap()
    return np.asarray(total), int(clipped)


def query_value(rplan: ReleasePlan, total: np.ndarray) -> np.ndarray:
    """The period's query value from its partial sum (normalised by the plan's public record
    bound; a moment's constant coordinate scaled as the one-shot ``moment`` stage does)."""
    query = rplan.query
    if query.augmented:
        return scale_constant(query.gram_pass().finalize(total), getattr(query, "scale", 1.0))
    return np.asarray(query.finalize(total))


def _outputs(
    stream: StreamPlan,
    period: int,
    increments: list[np.ndarray],
    key: NoiseKey,
) -> np.ndarray:
    """Period ``t``'s noisy outputs of the query from every increment so far (each group with
    its own sub-key): the carried state's outputs, for tests and tools."""
    plan = stream.plan.noise_plan()
    assert plan.lattice is not None
    f = stream.factorization
    scale = math.ldexp(plan.lattice.scale, f.scale_bits)
    options: dict[str, Any] = {
        "scale": scale,
        "bound": stream.increment_bound,
        "symmetric": plan.algorithm == "symmetric",
    }
    if stream.plan.query.groups is None:
        return period_outputs(f, period, increments, key, **options)
    per_group = [
        period_outputs(
            f, period, [g[i] for g in increments], key, part=f"release/group-{i}", **options
        )
        for i in range(len(stream.plan.query.groups))
    ]
    return np.stack(per_group, axis=1)


def _count_outputs(
    stream: StreamPlan, period: int, counts: list[np.ndarray], key: NoiseKey
) -> np.ndarray | None:
    """Period ``t``'s noisy outputs of the record count from every count so far (tests, tools)."""
    count_mu = stream.plan.budgets.count_mu
    if count_mu is None:
        return None
    f = stream.factorization
    scale = math.ldexp((1.0 / count_mu) * (1.0 + 2.0**-50), f.scale_bits)
    return period_outputs(
        f, period, counts, key, scale=scale, bound=stream.max_records, part="count"
    )


def _carry_outputs(
    stream: StreamPlan, t: int, h: np.ndarray, carry: Carry, key: NoiseKey
) -> np.ndarray:
    """Period ``t``'s noisy outputs of the query from the carried state (each group with its
    own sub-key)."""
    plan = stream.plan.noise_plan()
    assert plan.lattice is not None
    f = stream.factorization
    options: dict[str, Any] = {
        "scale": math.ldexp(plan.lattice.scale, f.scale_bits),
        "symmetric": plan.algorithm == "symmetric",
    }
    encoded = encode(f, t, carry, "release", h, stream.increment_bound)
    if stream.plan.query.groups is None:
        return add_noise(f, t, encoded, key, **options)
    per_group = [
        add_noise(f, t, encoded[:, i], key, part=f"release/group-{i}", **options)
        for i in range(len(stream.plan.query.groups))
    ]
    return np.stack(per_group, axis=1)


def _carry_count(
    stream: StreamPlan, t: int, n: np.ndarray, carry: Carry, key: NoiseKey
) -> np.ndarray:
    """Period ``t``'s noisy outputs of the record count from the carried state."""
    count_mu = stream.plan.budgets.count_mu
    assert count_mu is not None
    f = stream.factorization
    scale = math.ldexp((1.0 / count_mu) * (1.0 + 2.0**-50), f.scale_bits)
    encoded = encode(f, t, carry, "count", n, stream.max_records)
    return add_noise(f, t, encoded, key, scale=scale, part="count")


def period_values(
    stream: StreamPlan,
    period: int,
    outputs: list[np.ndarray],
    count_outputs: list[np.ndarray] | None,
    records: int,
) -> tuple[str, dict[str, np.ndarray], float | None]:
    """The published variables of period ``t`` from every output so far (post-processing;
    the engine decodes from its carried state, :func:`published_values`).

    Parameters
    ----------
    stream : StreamPlan
        The stream.
    period : int
        ``t``.
    outputs, count_outputs : list of numpy.ndarray
        The query's (and the count's) outputs of periods ``1 .. t``.
    records : int
        The records so far: used under replace-one only.

    Returns
    -------
    tuple
        The skeleton's variable name, the values, the noisy count (or ``None``).
    """
    f = stream.factorization
    count = None if count_outputs is None else decode_count(f, period, count_outputs)
    return published_values(stream, decode_period(f, period, outputs), count, records)


def published_values(
    stream: StreamPlan, x: np.ndarray, count: float | None, records: int
) -> tuple[str, dict[str, np.ndarray], float | None]:
    """The published variables of a period from its decoded estimate (post-processing).

    Parameters
    ----------
    stream : StreamPlan
        The stream.
    x : numpy.ndarray
        The period's estimate ``B[t] y / 2**b`` of the query, in grid units.
    count : float or None
        The period's estimate of the record count (add-remove), else ``None``.
    records : int
        The records so far: used under replace-one only (the record count is public there).

    Returns
    -------
    tuple
        The skeleton's variable name, the values, the noisy count (or ``None``).
    """
    rplan = stream.plan
    value = published_matrix(x, rplan.noise_plan()) * rescale(stream, records)
    query = rplan.query
    if query.augmented:
        centre = getattr(query, "centre_vector", None)
        scale = getattr(query, "scale", 1.0)
        if query.groups is None:
            mean, cov = centered_from_moment(value, centre, scale)
        else:
            mean, cov = grouped_centered_from_moment(value, centre, scale)
        return MOMENT, {MOMENT: value, MEAN: mean, COVARIANCE: cov}, None
    name = query.output_variable or COVARIANCE
    value = np.reshape(value, (query.shape[0],) if query.output_vector else query.shape)
    if count is None:
        return name, {name: value}, None
    return name, {name: value / max(count, 1.0), query.sum_variable or GRAM: value}, count


def rescale(stream: StreamPlan, records: int) -> float:
    """``max_records / N_t`` under replace-one (``N_t`` is public there: the plan divides by
    the public bound), else 1."""
    if stream.plan.neighbours != "replace-one":
        return 1.0
    return stream.max_records / max(records, 1)


def _book(spec: ReleaseSpec, ledger: Any) -> Any:
    """The stream's book (:class:`~mvg_dask.engine.stream_book.StreamBook`): the ledger, or
    the state directory beside the output."""
    return ledger if ledger is not None else FileStreamBook.beside(spec.output.store)


def _open(
    spec: ReleaseSpec, stream: StreamPlan, book: Any, seed: int | None
) -> tuple[Any, NoiseKey, bool]:
    """Open (or find) the stream in its book: its one charge and its key."""
    kwargs: dict[str, Any] = {
        "stream_id": stream.stream_id,
        "horizon": stream.horizon,
        "spec_hash": stream.spec_hash,
    }
    if isinstance(book, FileStreamBook):
        entry, _ = book.open_stream(seed=seed, **kwargs)
        if entry.periods >= stream.horizon:
            raise past_horizon(stream.stream_id, stream.horizon)
        return entry, NoiseKey.from_hex(book.stream_key(stream.stream_id)), book.seeded()
    assert spec.ledger is not None
    entry, _ = book.open_stream(
        dataset=spec.ledger.dataset,
        release_id=stream.stream_id,
        factorization=stream.factorization.to_dict(),
        output=spec.output.store,
        stream_key=NoiseKey.fresh().to_hex(),
        calibration="exact",
        loss=GaussianDP.calibrated(stream.epsilon, stream.delta),
        neighbours=spec.privacy.neighbours,
        convert_neighbours=spec.ledger.convert_neighbours,
        **kwargs,
    )
    if entry.periods >= stream.horizon:
        return entry, NoiseKey.fresh(), False  # begin_period refuses it
    return entry, NoiseKey.from_hex(book.stream_key(stream.stream_id)), False


def release_period(
    spec: ReleaseSpec,
    stream: StreamPlan,
    metadata: InputMetadata,
    client: Client,
    *,
    period_label: str | None = None,
    seed: int | None = None,
    ledger: Any = None,
) -> PeriodResult:
    """Release the next period of ``stream`` (see the module's text).

    Parameters
    ----------
    spec : ReleaseSpec
        The stream's spec.
    stream : StreamPlan
        From :func:`~mvg_dask.plan.stream.plan_stream`.
    metadata : InputMetadata
        The input's metadata now (its record count is the new watermark; curator-side).
    client : distributed.Client
        Where to compute.
    period_label : str, optional
        The period's label (its coordinate); default: its index.
    seed : int, optional
        Reproducible noise (a stream without a ledger only; NOT private).
    ledger : Ledger, optional
        The open ledger (``None``: the state lives beside the output, nothing is charged).

    Returns
    -------
    PeriodResult
        The released period.
    """
    book = _book(spec, ledger)
    entry, key, seeded = _open(spec, stream, book, seed)
    t = entry.periods + 1
    label = period_label if period_label is not None else str(t)
    if metadata.records < entry.watermark:
        raise ReleaseError(
            "the input holds fewer records than the stream has consumed: a stream's store only "
            "grows"
        )
    # the claim keeps the records it reads through: a resumed period reads the same records
    # (the same bytes) even if the next night's were appended meanwhile
    period = book.begin_period(stream.stream_id, t, label, target=metadata.records)
    crash_point("stream-period-claimed")
    w0 = period.watermark_before
    w1 = metadata.records if period.watermark_after is None else period.watermark_after
    if metadata.records < w1:
        raise ReleaseError(
            f"the input holds fewer records than its pending period {t} claimed: a stream's "
            "store only grows"
        )
    read_plan = replace(stream.plan, input=metadata)
    total, clipped = read_increment(client, read_plan, w0, w1)
    h = lattice_increment(query_value(stream.plan, total), stream.plan.noise_plan())
    if h.size and int(np.max(np.abs(h))) > stream.increment_bound:
        raise ReleaseError("a period's lattice increment exceeds the plan's bound")
    f = stream.factorization
    carry = load_carry(book, stream.stream_id, f, t)
    y = _carry_outputs(stream, t, h, carry, key)
    x = decode(f, t, carry, "release", y)
    count = None
    if stream.plan.budgets.count_mu is not None:
        n = np.array([w1 - w0], dtype=np.int64)
        yc = _carry_count(stream, t, n, carry, key)
        count = float(decode(f, t, carry, "count", yc).reshape(-1)[0])
    name, values, count = published_values(stream, x, count, records=w1)
    attrs = stream_attrs(stream, t, label, rescale(stream, w1))
    _write(spec, stream, t, attrs, name, values, count, seeded)
    crash_point("stream-before-commit")
    state, drop = commit_parts(f, t, carry)
    book.commit_period(stream.stream_id, t, watermark=w1, state=state, clipped=clipped, drop=drop)
    log.info("stream %s: period %d (%s) released", stream.stream_id, t, label)
    return PeriodResult(
        release_id=period_release_id(stream.stream_id, t),
        output=spec.output.store,
        plan=stream.plan.noise_plan(),
        seeded=seeded,
        stream_id=stream.stream_id,
        period=t,
        label=label,
        std_factor=stream.std_factor(t),
    )


def _write(
    spec: ReleaseSpec,
    stream: StreamPlan,
    t: int,
    attrs: dict[str, Any],
    name: str,
    values: dict[str, np.ndarray],
    count: float | None,
    seeded: bool,
) -> None:
    """Write period ``t`` into the stream's store (atomic: a complete release of its own),
    unless a previous run of the period wrote it already (the same bytes)."""
    write_stream_root(spec.output.store, stream, spec.output.storage_options)
    rplan = replace(
        stream.plan,
        release_id=period_release_id(stream.stream_id, t),
        output_store=period_store(spec.output.store, t),
        output_storage_options=spec.output.storage_options,
    )
    target = OutputTarget.for_plan(rplan)
    if target.is_complete():
        return
    target.write_matrix_skeleton(rplan, name, count=count)
    crash_point("stream-skeleton")
    target.write_matrix_values(values)
    target.commit({**provenance(rplan, seeded=seeded), **attrs})


def run_stream_release(
    spec: ReleaseSpec,
    client: Client,
    *,
    period_label: str | None = None,
    seed: int | None = None,
    release_id: str | None = None,
) -> PeriodResult:
    """Plan the stream of ``spec`` and release its next period on ``client`` (what
    :func:`mvg_dask.api.release` runs for a spec with a ``stream`` section).

    Parameters
    ----------
    spec : ReleaseSpec
        The spec (with ``stream``).
    client : distributed.Client
        Where to compute.
    period_label : str, optional
        The period's label.
    seed : int, optional
        Reproducible noise, without a ledger only (NOT private).
    release_id : str, optional
        Overrides the stream's id.

    Returns
    -------
    PeriodResult
        The released period.
    """
    from mvg_dask.engine.metadata import read_input_metadata
    from mvg_dask.ledger import open_ledger
    from mvg_dask.plan.planning import _ledger_charge
    from mvg_dask.plan.stream import plan_stream

    metadata = read_input_metadata(spec.input, spec.group_by, spec.cols_variable)
    stream = plan_stream(spec, metadata, release_id=release_id)
    charge = _ledger_charge(spec)
    if charge is None:
        log.warning(
            "stream %s has no ledger in its spec: it is not charged to any privacy budget",
            stream.stream_id,
        )
        return release_period(spec, stream, metadata, client, period_label=period_label, seed=seed)
    if seed is not None:
        raise ReleaseError("a seeded stream is not private: give a seed only without a ledger")
    with open_ledger(charge.location, password_file=charge.password_file) as ledger:
        ledger.ensure_dataset(
            charge.dataset, charge.budget_epsilon, charge.budget_delta, charge.budget_neighbours
        )
        return release_period(
            spec, stream, metadata, client, period_label=period_label, ledger=ledger
        )


def next_period(spec: ReleaseSpec, stream: StreamPlan) -> int:
    """The period the next run of the stream releases (``1`` for a new stream), from its book
    (curator-side; nothing is claimed)."""
    from mvg_dask.ledger import open_ledger
    from mvg_dask.plan.planning import _ledger_charge

    charge = _ledger_charge(spec)
    if charge is None:
        entry: Any = FileStreamBook.beside(spec.output.store).stream(stream.stream_id)
    else:
        with open_ledger(charge.location, password_file=charge.password_file) as ledger:
            lookup = getattr(ledger, "stream", None)
            entry = None if lookup is None else lookup(stream.stream_id)
    return 1 if entry is None else int(entry.periods) + 1
