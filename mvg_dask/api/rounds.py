"""In-memory matrix releases, one round at a time (docs/guide/rounds.md): :func:`release_round`
and :func:`training_run`, re-exported by :mod:`mvg_dask.api` (no Zarr, no cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mvg_dask.engine.rounds import RoundRelease, TrainingRun
    from mvg_dask.ledger.base import Ledger

__all__ = ["release_round", "training_run"]


def release_round(
    values: Any,
    *,
    epsilon: float,
    delta: float,
    calibration: str = "mgm-idn",
    clip: float | None = None,
    frobenius: float | None = None,
    allocation: str | dict[str, Any] | None = None,
    seed: int | None = None,
) -> RoundRelease:
    """Release one matrix from memory under ``(epsilon, delta)``-DP: a round.

    One contributor determines the whole matrix within a declared bound: ``clip=C`` (every
    entry in ``[-C, C]``) or ``frobenius=r`` (``||f||_F <= r``); the matrix is clipped to it
    and released with lattice noise from the keyed generator, without Zarr or a cluster, and
    without a ledger (:func:`training_run` charges one; docs/guide/rounds.md).

    Parameters
    ----------
    values : array-like
        An ``m x n`` numpy or dask matrix (a dask array is computed).
    epsilon, delta : float
    calibration : {"mgm-idn", "mgm-udn", "mgm", "mvg-thm2", "exact", "gaussian"}
        ``gaussian`` is the i.i.d. analytic Gaussian; ``mgm-idn`` needs ``clip``.
    clip, frobenius : float
        Exactly one: the declared per-contributor bound.
    allocation : str or dict, optional
        ``"uniform"`` or ``{"binary": {"important": [rows], "share": 0.8}}`` over the rows.
    seed : int, optional
        A reproducible key (not private); default: a fresh one.

    Returns
    -------
    RoundRelease
        ``.values`` (the noisy matrix) and ``.plan`` (its public plan: ``.std`` per entry).

    Raises
    ------
    ValueError
        One line for bad input (a calibration that does not apply, no bound, a bad matrix).

    Examples
    --------
    >>> import numpy as np
    >>> from mvg_dask import api
    >>> out = api.release_round(np.zeros((3, 2)), epsilon=1.0, delta=1e-5, clip=1.0, seed=0)
    >>> out.values.shape, out.plan.calibration
    ((3, 2), 'mgm-idn')
    """
    from mvg_dask.engine.rounds import one_round
    from mvg_dask.plan.rounds import RoundBound

    bound = RoundBound.of(clip, frobenius)
    return one_round(values, epsilon, delta, calibration, bound, allocation, seed)


def training_run(
    *,
    shape: tuple[int, int],
    rounds: int,
    epsilon: float,
    delta: float,
    calibration: str = "mgm-idn",
    clip: float | None = None,
    frobenius: float | None = None,
    allocation: str | dict[str, Any] | None = None,
    sampling_probability: float = 1.0,
    ledger: Ledger | str | Path | None = None,
    dataset: str | None = None,
    release_id: str | None = None,
    seed: int | None = None,
) -> TrainingRun:
    """A training run: ``rounds`` rounds of one contributor's ``shape`` matrices (gradients,
    features) whose total is ``(epsilon, delta)``, charged to the ledger as one entry.

    The total is split over the rounds by dp-accounting's privacy-loss distributions (with
    Poisson-subsampling amplification when ``sampling_probability < 1``); the run's composed
    loss is checked against the dataset's budget and reserved *before round 1*: a run that
    does not fit is refused here and nothing is charged (docs/guide/rounds.md).

    Parameters
    ----------
    shape, rounds : tuple of int, int
        ``(m, n)`` of every round's matrix, and how many rounds.
    epsilon, delta : float
        The run's total guarantee.
    calibration, clip, frobenius, allocation
        As for :func:`release_round`.
    sampling_probability : float, default 1
        Each round is computed on a Poisson sample of the records at this rate (the caller
        samples; the guarantee is then add-remove).
    ledger : Ledger, str or Path, optional
        Where the run is charged (``dataset`` must have a budget there).
    dataset, release_id : str, optional
        The ledger's dataset, and the entry's id (default: a fresh one).
    seed : int, optional
        A reproducible key: not private, so the ledger refuses it.

    Returns
    -------
    TrainingRun
        ``.release(matrix)`` per round; a context manager that commits the entry at the end.

    Raises
    ------
    ValueError
        Bad input (:class:`~mvg_dask.errors.BudgetError`: the run does not fit).

    Examples
    --------
    >>> import numpy as np
    >>> from mvg_dask import api
    >>> with api.training_run(shape=(4, 3), rounds=2, epsilon=2.0, delta=1e-5, clip=0.1,
    ...                       seed=0) as run:
    ...     noisy = [run.release(np.zeros((4, 3))) for _ in range(2)]
    >>> run.done, round(run.spent_epsilon(), 2) <= 2.0
    (2, True)
    """
    from mvg_dask.engine.rounds import TrainingRun
    from mvg_dask.plan.rounds import RoundBound

    return TrainingRun(
        shape=shape,
        rounds=rounds,
        epsilon=epsilon,
        delta=delta,
        calibration=calibration,
        bound=RoundBound.of(clip, frobenius),
        allocation=allocation,
        sampling_probability=sampling_probability,
        seed=seed,
        ledger=ledger,
        dataset=dataset,
        release_id=release_id,
    )


# documented and pickled as the public api's
release_round.__module__ = "mvg_dask.api"
training_run.__module__ = "mvg_dask.api"
