"""Executing a release plan on a Dask client: reserve, stages, commit.

The plan (:class:`mvg_dask.plan.release_plan.ReleasePlan`) says everything; this module only runs
its stages in order — an optional Gram pass, the DP-PCA step, then the identity pass or the
covariance — with the output format in :mod:`mvg_dask.engine.output` and the budget protocol of
the ledger (reserve before any read, commit after the output is complete).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client, Future

from mvg_dask.engine.blocks import (
    Clipper,
    PanelNoise,
    ZarrMatrix,
    abort_marker,
    add_grams,
    combine_grams,
    covariance_panel_task,
    gram_task,
    identity_task,
    low_rank_lattice_task,
    low_rank_products_task,
    low_rank_projection_task,
    low_rank_publish_task,
    noisy_gram_panel_task,
    panel_product_task,
    projection_task,
)
from mvg_dask.engine.cluster import Progress, gather_with_progress, stop_tasks
from mvg_dask.engine.faults import classify, scheduler_lost
from mvg_dask.engine.lattice import (
    LowRankSquareLattice,
    RecordLattice,
    StandardSquareLattice,
)
from mvg_dask.engine.lattice import gram_step as lattice_gram_step
from mvg_dask.engine.lattice import noisy_count as lattice_noisy_count
from mvg_dask.engine.lattice import square_release as lattice_square_release
from mvg_dask.engine.ledger import Ledger, open_ledger
from mvg_dask.engine.metadata import check_chunks_present
from mvg_dask.engine.output import OutputTarget, open_release, provenance, stored_plan
from mvg_dask.errors import BudgetError, ChargedFailure, DataError, MvgDaskError, ReleaseError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, feature_blocks
from mvg_dask.plan import BoxDomain, NoisePlan, dp_pca, gram_sensitivity
from mvg_dask.plan.directions import directions_from_noisy_gram, top_k_directions
from mvg_dask.plan.lattice import panel_inner_groups
from mvg_dask.plan.release_plan import PANEL_RECORDS, SPLIT_EVERY, ReleasePlan
from mvg_dask.release_format import SEEDED_ATTR
from mvg_dask.spec import is_local

log = logging.getLogger("mvg_dask")

#: Partial Gram matrices up to this many bytes in all are summed on the client.
CLIENT_REDUCE_BYTES = 64 * 2**20
#: The scratch group of a wide release's DP-PCA (its noisy Gram matrix).
DP_PCA_SCRATCH = "dp-pca"
#: the lattice values of a wide low-rank lattice release, between its passes
LOW_RANK_SCRATCH = "low-rank-lattice"


@dataclass(frozen=True)
class ReleaseResult:
    """What a finished release reports (data-independent facts only).

    Attributes
    ----------
    release_id : str
        The release id.
    output : str
        The output store.
    plan : NoisePlan
        The noise plan the release was made with.
    seeded : bool
        True when the noise came from a user seed (NOT private).
    """

    release_id: str
    output: str
    plan: NoisePlan
    seeded: bool


def clipper_for(rplan: ReleasePlan) -> Clipper:
    """The block clipper of a plan's record domain."""
    d = rplan.domain
    if isinstance(d, BoxDomain):
        return Clipper("box", d.lower[:, None], d.upper[:, None], None, rplan.on_violation)
    return Clipper("l2", None, None, d.radius, rplan.on_violation)


def _source(rplan: ReleasePlan) -> ZarrMatrix:
    inp = rplan.input
    return ZarrMatrix(inp.store, inp.variable, inp.records_first, inp.storage_options)


def _grid_sum(parts: list[np.ndarray]) -> np.ndarray:
    """The sum of per-grid-block parts (each task's stacked along axis 0), added one by one in
    grid order: the same sequence of additions whatever the panels."""
    stacked = np.concatenate(parts, axis=0)
    total = stacked[0].copy()
    for part in stacked[1:]:
        total += part
    return total


class _Stages:
    """The stages of one run; remembers whether any chunk of the input was read."""

    def __init__(
        self, rplan: ReleasePlan, client: Client, key: NoiseKey, target: OutputTarget
    ) -> None:
        self.rplan = rplan
        self.client = client
        self.key = key
        self.target = target
        self.clipper = clipper_for(rplan)
        self.read_started = False
        self.clipped = 0

    def submit_gram(self) -> _GramPass:
        """Start the Gram pass, ``X X^T`` of the clipped records (:meth:`finish_gram` waits for
        it and returns the sum): per-task partials, then a fixed-order tree
        reduction (groups of ``SPLIT_EVERY`` consecutive nodes, level by level), the same sum on
        every run.

        Small partials are summed on the client (two fewer scheduler round trips after the last
        task). Large ones are reduced on the workers, each group as a left fold of pairwise
        additions (:func:`~mvg_dask.engine.blocks.add_grams`): the additions of one combine of
        the group, in its order, so the same bytes; and a fold step can run as soon as its two
        operands exist. Consecutive leaves are placed on one worker (``_homes``), so a fold
        moves a partial between workers only where its group crosses from one worker's leaves
        to the next one's (placement never changes the bytes: the tree is fixed by metadata).
        """
        rplan, client = self.rplan, self.client
        source = _source(rplan)
        ranges = rplan.input.gram_ranges()
        step = rplan.input.record_chunk
        m = rplan.input.features
        on_client = m * m * 8 * len(ranges) <= CLIENT_REDUCE_BYTES
        homes = [None] * len(ranges) if on_client else _homes(client, len(ranges))
        self.read_started = True
        # one scheduler message per run of leaves that share a home (one for the whole pass
        # when the client sums): with a message per leaf, while the client wrote the skeleton
        # on a two-core machine, each reached the scheduler 5-8 ms after the one before. Within
        # a message the leaves keep their order (``map``'s internal priorities): record order
        # on each worker, at the default user priority (never above other work's)
        leaves: list[Future] = []
        for home, run in itertools.groupby(zip(ranges, homes, strict=True), key=lambda r: r[1]):
            starts, stops = zip(*(r for r, _ in run), strict=True)
            leaves += client.map(
                gram_task,
                starts,
                stops,
                source=source,
                clipper=self.clipper,
                step=step,
                pure=False,
                **_placed(home),
            )
        level = list(zip(leaves, homes, strict=True))
        while len(level) > 1 and not on_client:
            folded = []
            for i in range(0, len(level), SPLIT_EVERY):
                (acc, home), *rest = level[i : i + SPLIT_EVERY]
                for part, home in rest:
                    # a step runs as soon as its operands exist: a partial is folded in
                    # (and its memory freed) before the worker starts another leaf
                    acc = client.submit(
                        add_grams,
                        acc,
                        part,
                        pure=False,
                        priority=1,
                        **_placed(home),
                    )
                folded.append((acc, home))
            level = folded
        return _GramPass(leaves, None if on_client else level[0][0])

    def finish_gram(self, gram_pass: _GramPass, progress: bool) -> np.ndarray:
        """Wait for the Gram pass and return ``X X^T`` (raises the first data error met, in
        record order)."""
        client, leaves = self.client, gram_pass.leaves
        gather_with_progress(
            client,
            leaves,
            Progress(len(leaves), "gram", enabled=progress, private_total=self._private_n()),
            keep=False,
        )
        if gram_pass.root is None:
            parts = client.gather(leaves)
            while len(parts) > 1:
                parts = [
                    combine_grams(parts[i : i + SPLIT_EVERY])
                    for i in range(0, len(parts), SPLIT_EVERY)
                ]
            result = parts[0]
        else:
            result = gram_pass.root.result()
        gram, clipped = result.unwrap()
        self.clipped += int(clipped)
        return np.asarray(gram)

    def _private_n(self) -> bool:
        return self.rplan.neighbours == "add-remove"

    def noisy_count(self) -> float:
        """The record count with Gaussian noise (sensitivity 1 under add-remove), charged in the
        release's own accounting (its share of the budget: ``split.count_mu``)."""
        count_mu = self.rplan.split.count_mu
        assert count_mu is not None
        if self.rplan.noise_kind == "lattice":
            return lattice_noisy_count(self.rplan.input.records, count_mu, self.key.derive("count"))
        z = float(self.key.derive("count").tile_normals(0, (1,))[0])
        return self.rplan.input.records + z / count_mu

    def directions(self, gram: np.ndarray, normaliser: float) -> ReleasePlan:
        """The DP-PCA step: the plan with its directions filled in."""
        rplan = self.rplan
        step = rplan.dp_pca
        assert step is not None and rplan.split.step_mu is not None
        key = self.key.derive("dp-pca")
        if step.lattice is not None:
            sigma = step.noise_std(rplan.domain, rplan.neighbours, rplan.split.step_mu)
            noisy = lattice_gram_step(gram, step.lattice, sigma, key)
            directions = directions_from_noisy_gram(noisy, records=normaliser, k=step.k)
            return rplan.resolve(directions)
        directions = dp_pca(
            gram,
            records=normaliser,
            k=step.k,
            mu=rplan.split.step_mu,
            sensitivity=gram_sensitivity(rplan.domain, rplan.neighbours),  # type: ignore[arg-type]
            key=key,
        )
        return rplan.resolve(directions)

    def covariance_skeleton(self, rplan: ReleasePlan, count: float | None) -> np.ndarray | None:
        """The covariance output's skeleton (:meth:`OutputTarget.write_matrix_skeleton`) and the
        float noise the release adds (``None`` for lattice noise, drawn with the query): functions
        of the resolved plan and the key only (a release without DP-PCA makes them while its
        Gram pass runs)."""
        self.target.write_matrix_skeleton(rplan, "covariance", count=count)
        if rplan.noise_kind == "lattice":
            return None
        return covariance_noise(rplan.noise_plan(), self.key.derive("release"))

    def covariance(
        self, rplan: ReleasePlan, gram: np.ndarray, noise: np.ndarray | None, count: float | None
    ) -> None:
        """Privatize ``X X^T / N`` (``N`` public: replace-one, or a declared ``N0``) and write it;
        with a noisy count, write the noisy sum ``X X^T`` and the count, and their ratio as the
        covariance estimate (post-processing)."""
        query = gram / rplan.query.records
        if noise is None:  # lattice noise
            noisy = lattice_square_release(query, rplan.noise_plan(), self.key.derive("release"))
        else:
            noisy = query + noise
        if count is None:
            self.target.write_matrix_values({"covariance": noisy})
        else:
            self.target.write_matrix_values({"covariance": noisy / max(count, 1.0), "gram": noisy})

    def identity(self, rplan: ReleasePlan, *, resume: bool, progress: bool) -> None:
        """Read, check, clip, add noise and write every chunk (skipping written ones)."""
        import xarray as xr

        plan = rplan.noise_plan()
        info = rplan.input
        target = self.target
        if not (resume and target.has_skeleton()):
            variable = xr.open_zarr(
                info.store, consolidated=False, storage_options=info.storage_options, chunks={}
            )[info.variable]
            target.write_identity_skeleton(rplan, variable)
        crash_point("skeleton")
        sink = ZarrMatrix(
            target.write_store, info.variable, info.records_first, target.storage_options
        )
        source = _source(rplan)
        # standard directions: the tasks need the diagonal only (no m x m matrix is shipped)
        standard = plan.directions.is_standard
        factor: Any = np.sqrt(plan.row_variances) if standard else plan.row_factor
        lattice: Any = RecordLattice.for_plan(plan) if plan.lattice is not None else None
        ranges = info.task_ranges()
        if len(ranges) > 1:
            factor = self.client.scatter(factor, broadcast=True)
            if lattice is not None:
                lattice = self.client.scatter(lattice, broadcast=True)
        self.read_started = True
        # one scheduler message for the whole pass, the tasks in record order (as the Gram pass)
        futures = self.client.map(
            identity_task,
            [a for a, _ in ranges],
            [b for _, b in ranges],
            source=source,
            sink=sink,
            clipper=self.clipper,
            noise_key=self.key.derive("release"),
            factor=factor,
            tile=rplan.tile_records,
            n_total=info.records,
            diagonal=plan.directions.is_standard,
            step=info.record_chunk,
            lattice=lattice,
            pure=False,
        )
        # the noise matrices (a function of the plan) are written while the tasks run
        try:
            target.write_noise_matrices(plan)
        except BaseException:
            stop_tasks(self.client, futures, functools.partial(_mark_aborted, target))
            raise
        results = gather_with_progress(
            self.client,
            futures,
            Progress(len(futures), "release", enabled=progress, private_total=self._private_n()),
            on_result=functools.partial(crash_point, "chunk"),
            on_failure=functools.partial(_mark_aborted, target),
        )
        if any(r.skipped for r in results):  # another run of this release marked it failed
            raise ChargedFailure(
                f"release {rplan.release_id!r}: tasks found the release marked as failed by "
                "another run of it; let that run end, then re-run the same release id to resume"
            )
        counts = np.sum([r.unwrap() for r in results], axis=0)
        if int(counts[1]) != info.records:  # pragma: no cover - a bookkeeping invariant
            raise ReleaseError(f"wrote {counts[1]} records, expected {info.records}")
        self.clipped += int(counts[0])

    def blocked_directions(self, count: float | None, progress: bool) -> ReleasePlan:
        """DP-PCA of a wide release, with no ``m x m`` matrix in memory: the workers write the
        noisy Gram matrix (Analyze Gauss, its noise from the grid of the step's key) panel by
        panel to a scratch array, then a subspace iteration finds its top ``k`` eigenvectors
        (:func:`~mvg_dask.plan.directions.top_k_directions`, post-processing) and the plan
        takes them as low-rank directions. The scratch array is removed."""
        rplan, target, client = self.rplan, self.target, self.client
        assert rplan.dp_pca is not None and rplan.split.step_mu is not None
        m, block = rplan.input.features, rplan.matrix_chunk
        assert block is not None
        step = rplan.dp_pca
        sigma = step.noise_std(rplan.domain, rplan.neighbours, rplan.split.step_mu)
        key = self.key.derive("dp-pca")
        scratch = target.scratch_matrix(DP_PCA_SCRATCH, m, block)
        # sqrt(v) S sqrt(v) with v = sigma: sigma S, the whole-matrix step's noise
        noise = PanelNoise(key, np.full(m, sigma), "symmetric", 1.0)
        lattice = inner = None
        if step.lattice is not None:  # the step on the lattice, as lattice_gram_step
            assert rplan.lattice_context is not None
            lattice = StandardSquareLattice(
                key, np.full(m, sigma), "symmetric", 1.0, step.lattice.log2_grid, step.lattice.scale
            )
            inner = panel_inner_groups(rplan.lattice_context.records, PANEL_RECORDS)
        panels = [(r0, min(r0 + block, m)) for r0 in range(0, m, block)]
        source = _source(rplan)
        ranges = rplan.input.record_ranges()
        self.read_started = True
        futures = [
            client.submit(
                noisy_gram_panel_task,
                rows,
                source=source,
                sink=scratch,
                storage_options=target.storage_options,
                clipper=self.clipper,
                ranges=ranges,
                noise=noise,
                block=block,
                lattice=lattice,
                inner=inner,
                pure=False,
            )
            for rows in panels
        ]
        results = gather_with_progress(
            client,
            futures,
            Progress(len(futures), "dp-pca", enabled=progress, private_total=False),
        )
        self.clipped += int(np.sum([r.unwrap() for r in results], axis=0)[0])

        def apply(Q: np.ndarray) -> np.ndarray:
            q = client.scatter(Q, broadcast=True)
            parts = [
                client.submit(
                    panel_product_task,
                    rows,
                    sink=scratch,
                    storage_options=target.storage_options,
                    Q=q,
                    pure=False,
                )
                for rows in panels
            ]
            return np.vstack(client.gather(parts))

        directions = top_k_directions(
            apply,
            m,
            rplan.dp_pca.k,
            start=key.derive("start"),
            records=rplan.query.records if count is None else max(count, 1.0),
        )
        target.remove_scratch(DP_PCA_SCRATCH)
        return rplan.resolve(directions)

    def blocked_covariance(
        self, rplan: ReleasePlan, count: float | None, *, resume: bool, progress: bool
    ) -> None:
        """A covariance of many features, panel by panel on the workers (``matrix_chunk``):
        each task reads the input, computes one row panel of ``X X^T``, adds the noise of its
        blocks from the noise grid and writes them; no ``m x m`` matrix exists anywhere. With
        low-rank directions a first pass computes the noise's ``m x k`` projection."""
        target = self.target
        plan = rplan.noise_plan()
        info = rplan.input
        block = rplan.matrix_chunk
        assert block is not None and (plan.directions.is_standard or plan.directions.is_low_rank)
        names = ("covariance",) if count is None else ("covariance", "gram")
        if not (resume and target.has_skeleton()):
            scalars = {} if count is None else {"record_count": count}
            target.write_blocked_skeleton(rplan, names, scalars)
        crash_point("skeleton")
        if plan.lattice is not None and plan.directions.is_low_rank:
            self._low_rank_lattice(rplan, count, progress=progress)
            return
        noise = self._panel_noise(plan, block)
        lattice = inner = None
        if plan.lattice is not None:
            assert rplan.lattice_context is not None
            lattice = StandardSquareLattice.for_plan(plan, self.key.derive("release"))
            inner = panel_inner_groups(rplan.lattice_context.records, PANEL_RECORDS)
        source = _source(rplan)
        ranges = info.record_ranges()
        self.read_started = True
        m = info.features
        futures = [
            self.client.submit(
                covariance_panel_task,
                (r0, min(r0 + block, m)),
                source=source,
                sink=target.write_store,
                storage_options=target.storage_options,
                clipper=self.clipper,
                ranges=ranges,
                normaliser=float(rplan.query.records),
                count=count,
                noise=noise,
                block=block,
                lattice=lattice,
                inner=inner,
                pure=False,
            )
            for r0 in range(0, m, block)
        ]
        results = gather_with_progress(
            self.client,
            futures,
            Progress(len(futures), "covariance", enabled=progress, private_total=False),
            on_result=functools.partial(crash_point, "chunk"),
            on_failure=functools.partial(_mark_aborted, target),
        )
        self.clipped += int(np.sum([r.unwrap() for r in results], axis=0)[0])

    def _low_rank_lattice(self, rplan: ReleasePlan, count: float | None, *, progress: bool) -> None:
        """A wide lattice release with low-rank directions, in four passes over row panels
        (:class:`~mvg_dask.engine.lattice.LowRankSquareLattice`): ``P = U^T f`` (reads the
        data), the lattice values ``T = 2^k t`` of the whitened query to a scratch array (reads
        the data again), ``R = U^T T`` and ``T U`` (the scratch), then the published
        ``A T A^T`` with the noise description. Every product is formed grid block by grid
        block and summed in grid order, so the bytes do not depend on ``matrix_chunk``."""
        client, target = self.client, self.target
        plan = rplan.noise_plan()
        assert rplan.lattice_context is not None and rplan.matrix_chunk is not None
        m, block = rplan.input.features, rplan.matrix_chunk
        lattice = LowRankSquareLattice.for_plan(plan, self.key.derive("release"))
        # the noise description (Sigma's blocks) needs no projection of float noise
        noise = PanelNoise(
            lattice.key,
            plan.row_variances,
            plan.algorithm,
            plan.symmetric_ratio,
            basis=lattice.basis,
        )
        inner = panel_inner_groups(rplan.lattice_context.records, PANEL_RECORDS)
        panels = [(r0, min(r0 + block, m)) for r0 in range(0, m, block)]
        source, ranges = _source(rplan), rplan.input.record_ranges()
        common = {
            "source": source,
            "clipper": self.clipper,
            "ranges": ranges,
            "normaliser": float(rplan.query.records),
            "lattice": client.scatter(lattice, broadcast=True),
            "inner": inner,
        }
        self.read_started = True

        def run(fn: Any, name: str, **kw: Any) -> list[Any]:
            futures = [client.submit(fn, rows, **kw, pure=False) for rows in panels]
            return gather_with_progress(
                client,
                futures,
                Progress(len(futures), name, enabled=progress, private_total=False),
                # the last pass writes the output: a crash there is the one a rerun resumes
                on_result=functools.partial(crash_point, "chunk") if name == "covariance" else None,
                on_failure=functools.partial(_mark_aborted, target),
            )

        parts = run(low_rank_projection_task, "projection", **common)
        P = _grid_sum([p.unwrap() for p in parts])
        scratch = target.scratch_matrix(LOW_RANK_SCRATCH, m, block)
        results = run(
            low_rank_lattice_task,
            "lattice",
            sink=scratch,
            storage_options=target.storage_options,
            P=client.scatter(P, broadcast=True),
            **common,
        )
        self.clipped += int(np.sum([r.unwrap() for r in results], axis=0)[0])
        products = run(
            low_rank_products_task,
            "products",
            sink=scratch,
            storage_options=target.storage_options,
            basis=client.scatter(lattice.basis, broadcast=True),
        )
        R = _grid_sum([r for r, _ in products])
        TU = np.vstack([tu for _, tu in products])
        S = R @ lattice.basis
        run(
            low_rank_publish_task,
            "covariance",
            scratch=scratch,
            sink=target.write_store,
            storage_options=target.storage_options,
            lattice=common["lattice"],
            R=client.scatter(R, broadcast=True),
            TU=client.scatter(TU, broadcast=True),
            S=S,
            count=count,
            noise=noise,
        )
        target.remove_scratch(LOW_RANK_SCRATCH)

    def _panel_noise(self, plan: NoisePlan, block: int) -> PanelNoise:
        """The panel tasks' noise: the diagonal factor, or for low-rank directions the factor
        ``Sigma^(1/2)`` with the first pass's projection (computed on the workers, grid block by
        grid block: the same bytes whatever ``block``)."""
        key = self.key.derive("release")
        directions = plan.directions
        if not directions.is_low_rank:
            return PanelNoise(key, plan.row_variances, plan.algorithm, plan.symmetric_ratio)
        U = directions.matrix
        nb = len(feature_blocks(U.shape[0]))
        per = max(1, block // NOISE_TILE_FEATURES)
        u = self.client.scatter(U, broadcast=True)
        futures = [
            self.client.submit(
                projection_task,
                (i, min(i + per, nb)),
                noise_key=key,
                U=u,
                algorithm=plan.algorithm,
                ratio=plan.symmetric_ratio,
                pure=False,
            )
            for i in range(0, nb, per)
        ]
        projection = np.vstack(self.client.gather(futures))
        core = None
        if plan.algorithm != "unimodal":
            K = U.T @ projection
            core = (K + K.T) / 2.0
        return PanelNoise(
            key,
            plan.row_variances,
            plan.algorithm,
            plan.symmetric_ratio,
            basis=U,
            projection=projection,
            core=core,
        )

    def run(self, *, resume: bool, progress: bool) -> ReleasePlan:
        """Every stage of the plan; returns the resolved plan."""
        rplan = self.rplan
        inp = rplan.input
        check_chunks_present(inp.store, inp.variable, inp.storage_options)
        covariance = rplan.query.kind == "covariance"
        if covariance and rplan.matrix_chunk is not None:
            count = self.noisy_count() if rplan.releases_count else None
            if rplan.uses_dp_pca and not rplan.is_resolved:
                rplan = self.blocked_directions(count, progress)
            self.blocked_covariance(rplan, count, resume=resume, progress=progress)
            return rplan
        count = self.noisy_count() if rplan.releases_count else None
        if not (covariance or rplan.uses_dp_pca):
            self.identity(rplan, resume=resume, progress=progress)
            return rplan
        # one pass gives the Gram matrix for DP-PCA and, for covariance, the query itself
        gram_pass = self.submit_gram()
        noise = None
        skeleton_written = covariance and not rplan.uses_dp_pca
        if skeleton_written:
            # the plan is resolved: the output's skeleton and the noise, while the pass runs
            noise = self.covariance_skeleton(rplan, count)
        gram = self.finish_gram(gram_pass, progress)
        if rplan.uses_dp_pca:
            rplan = self.directions(gram, rplan.query.records if count is None else max(count, 1))
        if not covariance:
            self.identity(rplan, resume=resume, progress=progress)
            return rplan
        if not skeleton_written:
            noise = self.covariance_skeleton(rplan, count)
        self.covariance(rplan, gram, noise, count)
        return rplan


@dataclass(frozen=True)
class _GramPass:
    """A submitted Gram pass: its leaf tasks (for progress) and the root of its reduction on
    the workers (``None``: the client sums the leaves)."""

    leaves: list[Future]
    root: Future | None


def _homes(client: Client, tasks: int) -> list[str | None]:
    """A worker per task: runs of consecutive tasks on one worker (task ``i`` of ``T`` on worker
    ``i W // T`` of the ``W`` workers, sorted by address)."""
    workers = sorted(client.ncores())
    if not workers:
        return [None] * tasks
    return [workers[i * len(workers) // tasks] for i in range(tasks)]


def _placed(home: str | None) -> dict[str, Any]:
    """``submit`` and ``map`` options placing a task on ``home``, loosely: another worker takes
    it if ``home`` has left the cluster."""
    return {} if home is None else {"workers": [home], "allow_other_workers": True}


def covariance_noise(plan: NoisePlan, key: NoiseKey) -> np.ndarray:
    """The noise a covariance release adds: symmetric noise, equi-modal noise averaged with its
    transpose (post-processing, docs/bounds.md Sec. 6) or unimodal noise — the plan's own draw
    (:meth:`NoisePlan.draw`), the one sampling path the experiments use too."""
    return plan.draw(key)


def _mark_aborted(target: OutputTarget) -> None:
    """Tell the release's remaining tasks to do nothing (they check before reading)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(
        abort_marker(target.write_store), **(target.storage_options or {})
    )
    fs.pipe_file(path, b"")


def _open_ledger(rplan: ReleasePlan) -> Ledger | None:
    charge = rplan.ledger
    if charge is None:
        return None
    return open_ledger(charge.location, password_file=charge.password_file)


def execute_release(
    rplan: ReleasePlan,
    client: Client,
    *,
    seed: int | None = None,
    progress: bool = True,
    insecure_transport: bool = False,
) -> ReleaseResult:
    """Run a planned release on ``client``: reserve, compute, write, commit.

    With a ledger the release is reserved before any data is read and committed after the
    output is complete. A release id that is pending in the ledger (a crashed run) is resumed
    with its stored key and the plan saved by the interrupted run: chunks already written are
    skipped and the output is the same as that of an uninterrupted run; it is charged once.

    Parameters
    ----------
    rplan : ReleasePlan
        From :func:`mvg_dask.plan.plan_release`.
    client : distributed.Client
        Where to compute.
    seed : int, optional
        Reproducible noise (tests, demos), recorded as NOT private; refused with a ledger
        (:meth:`~mvg_dask.plan.release_plan.ReleasePlan.check_seed`).
    progress : bool
        Show progress.
    insecure_transport : bool
        Accept sending a private key in plaintext to a remote scheduler.

    Returns
    -------
    ReleaseResult
        Summary of the complete release.
    """
    from mvg_dask.engine.kube import check_versions
    from mvg_dask.engine.security import check_transport

    t0 = time.perf_counter()
    rplan.check_seed(seed)  # a seeded release is not private: never charged to a ledger
    # before anything is reserved: the key must not travel in plaintext to another machine, and
    # the client, scheduler and workers must run the same code (nothing is charged if not)
    address = client.scheduler.address if client.scheduler is not None else None
    check_transport(address, seed is not None, insecure_transport)
    check_versions(client)
    target = OutputTarget.for_plan(rplan)
    ledger = _open_ledger(rplan)
    log.info("%s", rplan.summary().splitlines()[0])
    reserved = False
    try:
        key, resumed = _reserve(rplan, ledger, target, seed)
        reserved = ledger is not None
        if resumed and target.is_complete():
            # the previous run finished writing (and may have stopped before the ledger commit)
            assert ledger is not None
            entry = ledger.lookup(rplan.release_id)
            if entry is not None and entry.status == "pending":
                ledger.commit(rplan.release_id)
            log.info("release %s is already complete: nothing to do", rplan.release_id)
            return _result_from_store(rplan)
        crash_point("reserved")
        if resumed:
            rplan = _saved_plan(rplan, target)
        # an abort marker left by a failed run (disk full, scheduler lost) would make this
        # run's tasks skip their chunks
        target.clear_abort()
        stages = _Stages(rplan, client, key, target)
        try:
            rplan = stages.run(resume=resumed, progress=progress)
            crash_point("before-commit")
            target.commit(provenance(rplan, seeded=key.seeded))
        except ChargedFailure:
            raise  # the output stays as it is, for a resume
        except (DataError, ReleaseError, BudgetError) as exc:
            # a clean failure: nothing is published. Refunded only if no chunk was read; after
            # a read the error may depend on the data, so the release stays charged (aborted)
            target.abort()
            if ledger is not None:
                if stages.read_started or resumed:
                    ledger.abort(rplan.release_id, str(exc))
                    # the CLI's exit code 3: charged, and not resumable
                    exc.charged, exc.release_id, exc.pending = True, rplan.release_id, False
                else:
                    ledger.cancel(rplan.release_id)
            raise
        log.debug("release %s: %d values clipped (curator only)", rplan.release_id, stages.clipped)
        crash_point("before-ledger-commit")
        if ledger is not None:
            # the exact clipped count is a curator-side fact: the ledger keeps it, no output does
            ledger.commit(rplan.release_id, clipped=stages.clipped)
    except MvgDaskError:
        raise
    except Exception as exc:
        # a fault of the disk, the scheduler or the object store: the output is left as it is
        # and a charged release stays pending, for a re-run with the same release id
        fault = classify(
            exc,
            release_id=rplan.release_id,
            store=rplan.output_store,
            charged=reserved,
            remote=not (is_local(rplan.output_store) and is_local(rplan.input.store)),
            scheduler_lost=scheduler_lost(client),
        )
        if fault is None:
            raise
        log.debug("release %s failed: %r", rplan.release_id, exc)
        raise fault from exc
    finally:
        if ledger is not None:
            ledger.close()
    # the wall time can depend on the data (clipping): curator-side, DEBUG only
    log.debug("release %s took %.1f s", rplan.release_id, time.perf_counter() - t0)
    return ReleaseResult(
        release_id=rplan.release_id,
        output=rplan.output_store,
        plan=rplan.noise_plan(),
        seeded=key.seeded,
    )


def _saved_plan(rplan: ReleasePlan, target: OutputTarget) -> ReleasePlan:
    """The plan an interrupted run saved; it must be the plan this spec gives."""
    saved = target.load_plan()
    if saved is None:
        return rplan
    volatile = ("created", "resolved")
    if {k: v for k, v in saved.items() if k not in volatile} != {
        k: v for k, v in rplan.to_dict().items() if k not in volatile
    }:
        raise ReleaseError(
            f"release {rplan.release_id!r} was started with another plan (another input or "
            "mvg_dask version); choose a new release_id"
        )
    return ReleasePlan.from_dict(
        saved,
        input_storage_options=rplan.input.storage_options,
        output_storage_options=rplan.output_storage_options,
        ledger_location=None if rplan.ledger is None else rplan.ledger.location,
        ledger_password_file=None if rplan.ledger is None else rplan.ledger.password_file,
    )


def _reserve(
    rplan: ReleasePlan, ledger: Ledger | None, target: OutputTarget, seed: int | None
) -> tuple[NoiseKey, bool]:
    """The release key and whether this run resumes a pending release."""
    fresh = NoiseKey.from_seed(seed) if seed is not None else NoiseKey.fresh()
    if ledger is None:
        log.warning(
            "release %s has no ledger in its spec: it is not charged to any privacy budget "
            "and cannot be resumed after a crash",
            rplan.release_id,
        )
        target.check_free()
        target.claim()
        target.clear_staging()
        return fresh, False
    charge = rplan.ledger
    assert charge is not None
    ledger.ensure_dataset(
        charge.dataset, charge.budget_epsilon, charge.budget_delta, charge.budget_neighbours
    )
    entry = ledger.lookup(rplan.release_id)
    if entry is not None:
        if entry.spec_hash != rplan.spec_hash or entry.dataset != charge.dataset:
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
    target.claim()  # of two jobs on one object-store output, the second is refused here
    target.clear_staging()
    try:
        ledger.reserve(
            dataset=charge.dataset,
            release_id=rplan.release_id,
            epsilon=charge.epsilon,
            delta=charge.delta,
            calibration=charge.calibration,
            mu=charge.mu,
            spec_hash=rplan.spec_hash,
            output=rplan.output_store,
            noise_key=fresh.to_hex(),
            seeded=fresh.seeded,
            neighbours=charge.neighbours,
            convert_neighbours=charge.convert_neighbours,
        )
    except BaseException:
        target.unclaim()  # refused (budget, ledger): nothing was written or charged
        raise
    return fresh, False


def _result_from_store(rplan: ReleasePlan) -> ReleaseResult:
    """A retried release that is already complete: its plan is reloaded from the output."""
    ds = open_release(rplan.output_store, storage_options=rplan.output_storage_options)
    done = stored_plan(rplan, ds)
    return ReleaseResult(
        release_id=rplan.release_id,
        output=rplan.output_store,
        plan=done.noise_plan(),
        seeded=bool(ds.attrs[SEEDED_ATTR]),
    )


def crash_point(name: str, index: int | None = None) -> None:
    """Fault injection for the crash tests: ``MVG_DASK_CRASH_AT=name[:index]`` SIGKILLs this
    process when the release reaches that point (``chunk:k``: once ``k`` tasks of the record
    pass have finished); with ``MVG_DASK_CRASH_SIGNAL=SIGSTOP`` it stops there instead (until a
    SIGCONT: the fault tests break the scheduler meanwhile). Unset in production (does
    nothing)."""
    target = os.environ.get("MVG_DASK_CRASH_AT")
    if not target:
        return
    want, _, at = target.partition(":")
    if want == name and (not at or (index is not None and index >= int(at))):
        if os.environ.get("MVG_DASK_CRASH_SIGNAL") != "SIGSTOP":
            os.kill(os.getpid(), signal.SIGKILL)
        elif target not in _STOPPED:  # once
            _STOPPED.add(target)
            os.kill(os.getpid(), signal.SIGSTOP)


#: the crash points this process has stopped at
_STOPPED: set[str] = set()
