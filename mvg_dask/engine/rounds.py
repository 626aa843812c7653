"""Rounds: matrix releases of declared per-contributor sensitivity from memory, and training
runs that charge their rounds to the ledger as one entry (docs/guide/rounds.md).

A round needs no Zarr store and no cluster: it whitens the clipped matrix, rounds it to the
plan's lattice, adds exact rounded-Gaussian integers from the keyed generator
(:meth:`mvg_dask.noise.rng.NoiseKey.tile_lattice`) and publishes the result
(:func:`mvg_dask.engine.lattice.diagonal_release`), as a lattice release of the identity query
does. A :class:`TrainingRun` splits its total ``(epsilon, delta)`` over its rounds
(:func:`mvg_dask.privacy.rounds.split_run_budget`), reserves the run's composed loss in the
ledger before round 1 (refused, with nothing charged, when it does not fit), releases round
``i`` from tile ``i`` of its key and commits when it ends.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mvg_dask.engine.lattice import diagonal_release
from mvg_dask.ledger import open_ledger
from mvg_dask.ledger.base import Ledger
from mvg_dask.noise.lattice import tile_rounded_gaussian
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.rounds import RoundBound, RoundPlan, plan_round
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP, RoundsLoss
from mvg_dask.privacy.rounds import run_loss, split_run_budget

__all__ = [
    "RoundRelease",
    "TileCursor",
    "TrainingRun",
    "noisy_round",
    "one_round",
    "round_values",
]


@dataclass(frozen=True, eq=False)
class RoundRelease:
    """A released round: the noisy matrix and the public plan it was released with."""

    values: np.ndarray
    plan: RoundPlan


def round_values(values: Any, shape: tuple[int, int] | None = None) -> np.ndarray:
    """``values`` (numpy, a dask array or anything array-like) as a float64 matrix in memory,
    checked: 2-d, of ``shape`` when given, finite (a ``ValueError`` of one line otherwise)."""
    if hasattr(values, "compute") and callable(values.compute):
        values = values.compute()
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        kind = type(values).__name__
        raise ValueError(f"a round releases a numeric matrix, not {kind}") from None
    if x.ndim != 2:
        raise ValueError(f"a round releases a 2-d matrix, not an array of shape {x.shape}")
    if shape is not None and x.shape != tuple(shape):
        raise ValueError(f"this run releases {shape[0]} x {shape[1]} matrices, not {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("a round's matrix must be finite (it has NaN or infinite entries)")
    return x


class TileCursor:
    """Tile starts of one key from a single AES-CTR bit generator, repositioned per tile
    instead of built anew (the key schedule is expanded once): the words of tile ``t`` are
    those of :meth:`NoiseKey.generator` ``(t)``. A second request for the same tile (the
    sampler's rare side stream) gets the key's own generator."""

    def __init__(self, key: NoiseKey) -> None:
        from randomgen import AESCounter

        self._key = key
        bits = key.generator(0).bit_generator
        assert isinstance(bits, AESCounter)
        self._bits = bits
        state = bits.state
        self._seed = state["s"]["seed"]
        self._last: int | None = None

    def generator(self, tile: int = 0) -> Any:
        """An object whose ``bit_generator`` starts at tile ``tile`` (what the sampler reads)."""
        if tile == self._last or not 0 <= tile < 2**64:
            return self._key.generator(tile)
        self._last = tile
        self._bits.state = {
            "bit_generator": "randomgen.aes.AESCounter",
            "s": {
                "state": np.zeros(64, np.uint8),
                "seed": self._seed,
                "counter": np.array([0, tile, 1, tile, 2, tile, 3, tile], dtype=np.uint64),
                "offset": 64,
            },
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self

    @property
    def bit_generator(self) -> Any:
        """The repositioned bit generator."""
        return self._bits


def noisy_round(
    x: np.ndarray, plan: RoundPlan, key: NoiseKey | TileCursor, *, tile: int = 0
) -> np.ndarray:
    """The published values of one round of ``plan`` on ``x`` (clipped to the plan's bound),
    with the lattice noise of tile ``tile`` of ``key``."""
    x = plan.bound.clip(x)
    lattice = plan.lattice
    K = tile_rounded_gaussian(key, tile, plan.shape, lattice.scale)
    return diagonal_release(x, plan.inverse_std, plan.row_std, K, lattice.log2_grid)


def _key(seed: int | None) -> NoiseKey:
    return NoiseKey.fresh() if seed is None else NoiseKey.from_seed(seed)


def one_round(
    values: Any,
    epsilon: float,
    delta: float,
    calibration: str,
    bound: RoundBound,
    allocation: str | dict[str, Any] | None,
    seed: int | None,
) -> RoundRelease:
    """:func:`mvg_dask.api.release_round`: one round at ``(epsilon, delta)``, no ledger."""
    x = round_values(values)
    share = (
        GaussianDP.calibrated(epsilon, delta)
        if calibration in ("gaussian", "exact")
        else ApproxDP(float(epsilon), float(delta))
    )
    plan = plan_round(
        x.shape, calibration=calibration, loss=share, bound=bound, allocation=allocation
    )
    return RoundRelease(noisy_round(x, plan, _key(seed).derive("rounds")), plan)


class TrainingRun:
    """A training run: ``rounds`` rounds of one plan, charged to the ledger as one entry.

    Build it with :func:`mvg_dask.api.training_run`; see there for the parameters. Use it as a
    context manager: a run that ends normally commits its ledger entry, one that fails after
    a round aborts it (still charged), one that fails before any round cancels it (refunded).

    Attributes
    ----------
    plan : RoundPlan
        Every round's plan.
    loss : RoundsLoss
        The run's total loss (what the ledger charges).
    rounds, done : int
        Rounds declared, rounds released.
    release_id : str or None
        The ledger entry's id (``None`` without a ledger).
    """

    def __init__(
        self,
        *,
        shape: tuple[int, int],
        rounds: int,
        epsilon: float,
        delta: float,
        calibration: str,
        bound: RoundBound,
        allocation: str | dict[str, Any] | None,
        sampling_probability: float,
        seed: int | None,
        ledger: Ledger | str | Path | None,
        dataset: str | None,
        release_id: str | None,
    ) -> None:
        gaussian = calibration in ("gaussian", "exact")
        share = split_run_budget(
            epsilon,
            delta,
            rounds=rounds,
            sampling_probability=sampling_probability,
            gaussian_dp=gaussian,
        )
        self.plan = plan_round(
            shape, calibration=calibration, loss=share, bound=bound, allocation=allocation
        )
        self.loss: RoundsLoss = run_loss(share, rounds, sampling_probability, delta)
        self.rounds, self.done = rounds, 0
        self.epsilon, self.delta = float(epsilon), float(delta)
        self._key = _key(seed).derive("rounds")
        self._cursor = TileCursor(self._key)
        self._ledger: Ledger | None = None
        self._own_ledger = False
        self._ended = False
        self.release_id: str | None = None
        if ledger is not None:
            self._reserve(ledger, dataset, release_id, seed)

    def _reserve(
        self, ledger: Ledger | str | Path, dataset: str | None, release_id: str | None, seed: Any
    ) -> None:
        if not dataset:
            raise ValueError("a run charged to a ledger needs its dataset's name (dataset=...)")
        book = open_ledger(ledger) if isinstance(ledger, str | Path) else ledger
        own = book is not ledger
        public = json.dumps(self.plan.to_dict(), sort_keys=True) + repr(self.loss)
        rid = release_id or f"run-{uuid.uuid4().hex[:12]}"
        try:
            book.reserve(
                dataset=dataset,
                release_id=rid,
                calibration=self.plan.calibration,
                spec_hash=hashlib.sha256(public.encode()).hexdigest(),
                output=f"rounds:{self.rounds}",
                noise_key=self._key.to_hex(),
                seeded=seed is not None,
                neighbours="add-remove" if self.loss.sampling_probability < 1 else "replace-one",
                loss=self.loss,
            )
        except BaseException:
            if own:
                book.close()
            raise
        self._ledger, self._own_ledger, self.release_id = book, own, rid

    def spent_epsilon(self, rounds: int | None = None) -> float:
        """epsilon (at the run's delta) of the first ``rounds`` rounds (default: those done)."""
        k = self.done if rounds is None else rounds
        if k == 0:
            return 0.0
        return (
            RoundsLoss(self.loss.round_loss, k, self.loss.sampling_probability, self.delta)
            .approx_dp()
            .epsilon
        )

    def release(self, values: Any) -> np.ndarray:
        """Release the next round of ``values`` (the run's shape).

        Raises
        ------
        ValueError
            For a matrix of another shape, a non-finite one, after the last round, or after
            the run ended (:meth:`close`: a run refunded before round 1 must not release).
        """
        if self._ended:  # its entry is committed, aborted or refunded: nothing more is charged
            raise ValueError("this run has ended: start a new run (charged) for more rounds")
        if self.done >= self.rounds:
            raise ValueError(f"this run has released all its {self.rounds} rounds")
        x = round_values(values, self.plan.shape)
        out = noisy_round(x, self.plan, self._cursor, tile=self.done)
        self.done += 1
        return out

    def close(self, error: BaseException | None = None) -> None:
        """End the run: commit its ledger entry (abort it after a failure that followed a
        round, cancel it when no round was released)."""
        book, self._ledger, self._ended = self._ledger, None, True
        if book is None or self.release_id is None:
            return
        try:
            if error is None:
                book.commit(self.release_id)
            elif self.done:
                book.abort(self.release_id, f"run failed after round {self.done}: {error!r}")
            else:
                book.cancel(self.release_id)
        finally:
            if self._own_ledger:
                book.close()

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        self.close(error)

    def __repr__(self) -> str:
        return (
            f"TrainingRun({self.plan.calibration}, {self.plan.shape[0]}x{self.plan.shape[1]}, "
            f"{self.done}/{self.rounds} rounds, epsilon={self.epsilon:g}, delta={self.delta:g})"
        )
