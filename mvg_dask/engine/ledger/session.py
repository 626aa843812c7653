"""The ledger protocol of one release, in one place: :func:`ledger_session`.

A release is reserved before any data is read (or, when its id is pending after a crash,
resumed with its stored key and the plan its first run saved); it is committed once its output
is complete. A clean failure (:class:`~mvg_dask.errors.DataError`,
:class:`~mvg_dask.errors.ReleaseError`, :class:`~mvg_dask.errors.BudgetError`) while publishing
aborts the release when data was read (it stays charged) and cancels it when not (refunded);
any other fault of the machinery leaves a charged release pending, for a resume
(:func:`~mvg_dask.engine.faults.classify`). The protocol's rules are stated in
:mod:`mvg_dask.ledger.base`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from mvg_dask.engine.faults import classify, crash_point, scheduler_lost
from mvg_dask.engine.output import OutputTarget
from mvg_dask.errors import (
    BudgetError,
    ChargedFailure,
    DataError,
    MvgDaskError,
    ReleaseError,
    charged_clause,
)
from mvg_dask.ledger import Ledger, LedgerEntry, open_ledger
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.release_plan import ReleasePlan

log = logging.getLogger("mvg_dask")


class RunState(Protocol):
    """What the session needs to know of a run
    (:class:`~mvg_dask.engine.stages.context.RunContext`)."""

    read_started: bool
    clipped: int


def open_plan_ledger(rplan: ReleasePlan) -> Ledger | None:
    """The ledger the plan charges (``None``: the plan charges none).

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    Ledger or None
        Open; :func:`ledger_session` closes it.
    """
    charge = rplan.ledger
    if charge is None:
        return None
    return open_ledger(charge.location, password_file=charge.password_file)


@dataclass
class LedgerSession:
    """One release's place in the ledger, while it runs (made by :func:`ledger_session`).

    Attributes
    ----------
    rplan : ReleasePlan
        The plan as planned now.
    target : OutputTarget
        The output.
    ledger : Ledger or None
        The ledger (``None``: the release is not charged).
    key : NoiseKey
        The release key: fresh (or seeded), or the stored key of a resumed release.
    resumed : bool
        The run resumes a pending release (or finds a committed one complete).
    published : bool
        The output is complete (:meth:`publishing` ended without error).
    clipped : int
        Values the run clipped (kept curator side by the ledger).
    """

    rplan: ReleasePlan
    target: OutputTarget
    ledger: Ledger | None
    key: NoiseKey
    resumed: bool
    published: bool = False
    clipped: int = 0

    def already_complete(self) -> bool:
        """True when a resumed release's output is already complete (the previous run finished
        writing, and may have stopped before the ledger commit: a pending entry is committed)."""
        if not (self.resumed and self.target.is_complete()):
            return False
        assert self.ledger is not None
        entry = self.ledger.lookup(self.rplan.release_id)
        if entry is not None and entry.status == "pending":
            self.ledger.commit(self.rplan.release_id)
        log.info("release %s is already complete: nothing to do", self.rplan.release_id)
        return True

    def plan(self) -> ReleasePlan:
        """The plan to run: a resumed release runs the plan its first run saved."""
        return saved_plan(self.rplan, self.target) if self.resumed else self.rplan

    @contextmanager
    def publishing(self, run: RunState) -> Iterator[None]:
        """Compute and publish the output inside this block: a clean failure aborts (data was
        read, or the run resumes) or cancels (nothing read) the release and removes the
        staged output; a :class:`~mvg_dask.errors.ChargedFailure` leaves it for a resume."""
        release_id = self.rplan.release_id
        try:
            yield
        except ChargedFailure:
            raise  # the output stays as it is, for a resume
        except (DataError, ReleaseError, BudgetError) as exc:
            # nothing is published. Refunded only if no chunk was read; after a read the error
            # may depend on the data, so the release stays charged (aborted)
            self.target.abort()
            if self.ledger is not None:
                if run.read_started or self.resumed:
                    self.ledger.abort(release_id, str(exc))
                    # the CLI's exit code 3: charged, and not resumable; the message says so,
                    # with what was charged to which dataset
                    message = str(exc)
                    exc.charged, exc.release_id, exc.pending = True, release_id, False
                    exc.charge = charge_text(self.rplan, self.ledger.lookup(release_id))
                    exc.args = (f"{message} {charged_clause(exc)}",)
                else:
                    self.ledger.cancel(release_id)
            raise
        self.published, self.clipped = True, run.clipped

    def commit(self) -> None:
        """Commit a published release in the ledger (with its exact clipped count)."""
        if not self.published:
            return
        release_id = self.rplan.release_id
        if self.rplan.query.groups is None:  # a grouped count holds the dropped records: no log
            log.debug("release %s: %d values clipped (curator only)", release_id, self.clipped)
        crash_point("before-ledger-commit")
        if self.ledger is not None:
            # the exact clipped count is a curator-side fact: the ledger keeps it, no output does
            self.ledger.commit(release_id, clipped=self.clipped)


@contextmanager
def ledger_session(
    ledger: Ledger | None,
    rplan: ReleasePlan,
    target: OutputTarget,
    *,
    seed: int | None,
    client: Any,
) -> Iterator[LedgerSession]:
    """Reserve (or resume) a release, yield its session, then commit it.

    Inside the block, :meth:`LedgerSession.already_complete` tells a retried release that is
    done, and :meth:`LedgerSession.publishing` wraps the computation. On leaving the block the
    published release is committed; a fault of the disk, the scheduler or the object store
    becomes a :class:`~mvg_dask.errors.ChargedFailure` (charged when reserved, the release
    left pending). The ledger is closed in every case.

    Parameters
    ----------
    ledger : Ledger or None
        From :func:`open_plan_ledger`.
    rplan : ReleasePlan
        The plan.
    target : OutputTarget
        The output.
    seed : int or None
        A user seed (never with a ledger: the plan refused it).
    client : distributed.Client
        The run's client (to tell a lost scheduler).

    Yields
    ------
    LedgerSession
        The reserved release.
    """
    reserved = False
    try:
        key, resumed = reserve(rplan, ledger, target, seed)
        reserved = ledger is not None
        session = LedgerSession(rplan, target, ledger, key, resumed)
        yield session
        session.commit()
    except MvgDaskError:
        raise
    except Exception as exc:
        # a fault of the disk, the scheduler or the object store: the output is left as it is
        # and a charged release stays pending, for a re-run with the same release id
        fault = classify(
            exc,
            release_id=rplan.release_id,
            store=target.output,
            charged=reserved,
            inputs=(rplan.input.store,),
            scheduler_lost=scheduler_lost(client),
        )
        if fault is None:
            raise
        log.debug("release %s failed: %r", rplan.release_id, exc)
        raise fault from exc
    finally:
        if ledger is not None:
            ledger.close()


def charge_text(rplan: ReleasePlan, entry: LedgerEntry | None) -> str:
    """What a release charged and to which dataset: ``epsilon=0.5, delta=1e-06 to dataset
    'patients'`` (the ledger entry's charge, converted to the budget's neighbour relation; the
    plan's guarantee when the entry has none).

    Parameters
    ----------
    rplan : ReleasePlan
        The plan (with a ledger).
    entry : LedgerEntry or None
        The release's ledger entry.

    Returns
    -------
    str
        One phrase.
    """
    charge = rplan.ledger
    assert charge is not None
    epsilon, delta = charge.epsilon, charge.delta
    if entry is not None and entry.charge_epsilon is not None and entry.charge_delta is not None:
        epsilon, delta = entry.charge_epsilon, entry.charge_delta
    return f"epsilon={epsilon:g}, delta={delta:g} to dataset {charge.dataset!r}"


def saved_plan(rplan: ReleasePlan, target: OutputTarget) -> ReleasePlan:
    """The plan an interrupted run saved; it must be the plan this spec gives.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan made now.
    target : OutputTarget
        The output, where the first run saved its plan.

    Returns
    -------
    ReleasePlan
        The saved plan (``rplan`` when none was saved).

    Raises
    ------
    ReleaseError
        When the saved plan differs (another input or mvg_dask version).
    """
    saved = target.load_plan()
    if saved is None:
        return rplan
    # a plan saved before plans carried their stages is compared without them (its stages are
    # implied by its fields when it is read back)
    volatile = ("created", "resolved") if "stages" in saved else ("created", "resolved", "stages")
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


def _claim(target: OutputTarget) -> None:
    """Take the output: it must be free; of two jobs on one object-store output, the second is
    refused here."""
    target.check_free()
    target.claim()
    target.clear_staging()


def _resumed_key(rplan: ReleasePlan, target: OutputTarget, entry: LedgerEntry) -> NoiseKey | None:
    """The key of a release already in the ledger (``None``: committed and complete, nothing
    to do), or the reason it cannot run again."""
    charge = rplan.ledger
    assert charge is not None
    if entry.spec_hash != rplan.spec_hash or entry.dataset != charge.dataset:
        raise ReleaseError(
            f"release_id {rplan.release_id!r} is already in the ledger with a different "
            "spec; a resume must use the same spec, otherwise choose a new release_id"
        )
    if entry.status == "committed":
        if target.is_complete():
            return None  # idempotent: a retried job finds its release done
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
    return NoiseKey.from_hex(entry.noise_key, seeded=entry.seeded)


def reserve(
    rplan: ReleasePlan, ledger: Ledger | None, target: OutputTarget, seed: int | None
) -> tuple[NoiseKey, bool]:
    """Reserve the release in the ledger (or find it there) and claim its output.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.
    ledger : Ledger or None
        The ledger (``None``: not charged, and a warning says so).
    target : OutputTarget
        The output.
    seed : int or None
        A user seed.

    Returns
    -------
    tuple of (NoiseKey, bool)
        The release key and whether this run resumes a release already in the ledger.
    """
    fresh = NoiseKey.from_seed(seed) if seed is not None else NoiseKey.fresh()
    if ledger is None:
        log.warning(
            "release %s has no ledger in its spec: it is not charged to any privacy budget "
            "and cannot be resumed after a crash",
            rplan.release_id,
        )
        _claim(target)
        return fresh, False
    charge = rplan.ledger
    assert charge is not None
    ledger.ensure_dataset(
        charge.dataset, charge.budget_epsilon, charge.budget_delta, charge.budget_neighbours
    )
    entry = ledger.lookup(rplan.release_id)
    if entry is not None:
        key = _resumed_key(rplan, target, entry)
        return (fresh if key is None else key), True
    _claim(target)
    try:
        ledger.reserve(
            dataset=charge.dataset,
            release_id=rplan.release_id,
            calibration=charge.calibration,
            loss=charge.loss,
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
