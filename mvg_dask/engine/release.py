"""Executing a release plan on a Dask client: reserve, run the plan's stages, commit.

The plan (:class:`mvg_dask.plan.release_plan.ReleasePlan`) says everything, its stages included
(:mod:`mvg_dask.plan.stages`); this module only opens the release's ledger session
(:func:`~mvg_dask.engine.ledger.session.ledger_session`: reserve before any read, commit after
the output is complete) and walks the stages
(:func:`~mvg_dask.engine.stages.executor.run_stages`), with the output format in
:mod:`mvg_dask.engine.output`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from distributed import Client

from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.ledger.session import ledger_session, open_plan_ledger
from mvg_dask.engine.output import OutputTarget, open_release, provenance, stored_plan
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.executor import run_stages
from mvg_dask.plan import NoisePlan
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_format import SEEDED_ATTR

log = logging.getLogger("mvg_dask")


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
    ledger = open_plan_ledger(rplan)
    log.info("%s", rplan.summary().splitlines()[0])
    with ledger_session(ledger, rplan, target, seed=seed, client=client) as session:
        if session.already_complete():
            return _result_from_store(rplan)
        crash_point("reserved")
        rplan = session.plan()
        # an abort marker left by a failed run (disk full, scheduler lost) would make this
        # run's tasks skip their chunks
        target.clear_abort()
        ctx = RunContext(client, session.key, target, progress=progress, resume=session.resumed)
        with session.publishing(ctx):
            rplan = run_stages(ctx, rplan)
            crash_point("before-commit")
            target.commit(provenance(rplan, seeded=session.key.seeded))
    # the wall time can depend on the data (clipping): curator-side, DEBUG only
    log.debug("release %s took %.1f s", rplan.release_id, time.perf_counter() - t0)
    return ReleaseResult(
        release_id=rplan.release_id,
        output=rplan.output_store,
        plan=rplan.noise_plan(),
        seeded=session.key.seeded,
    )


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
