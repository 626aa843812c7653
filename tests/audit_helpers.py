"""Helpers of the empirical privacy audit (tests/test_audit.py).

The audit estimates, from many independent runs of the release code on a worst-case
neighbouring pair ``(D, D')``, the rates ``p0 = P[T > t | D]`` and ``p1 = P[T > t | D']`` of a
test statistic ``T``, and turns them into a lower bound on epsilon: an ``(epsilon, delta)``-DP
mechanism has ``p1 <= e^epsilon p0 + delta`` for every ``t``, so

    epsilon >= ln((p1_lower - delta) / p0_upper)

with one-sided Clopper-Pearson bounds. The thresholds are a fixed grid (:data:`GRID`, chosen
before any trial is drawn) and every bound of the grid is taken at level ``ALPHA / (2 * len(GRID))``
(Bonferroni), so with probability at least ``1 - ALPHA`` every bound holds at once and the
largest value over the grid is a valid lower bound.

``T`` is the likelihood-ratio statistic of the pair (Neyman-Pearson: the most powerful test),
standardised with the claimed ``mu`` of the Gaussian mechanism: ``T = (log LR + mu^2 / 2) / mu``,
which is ``N(0, 1)`` under ``D`` and ``N(mu, 1)`` under ``D'`` when the pair's whitened shift is
exactly the claimed ``mu`` (the grid is in these units).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from mvg_dask.engine.stages.count import draw_noisy_count
from mvg_dask.engine.stages.covariance import write_covariance, write_covariance_skeleton
from mvg_dask.engine.stages.dp_pca import dp_pca_directions
from mvg_dask.noise import NoiseKey
from mvg_dask.plan.release_plan import ReleasePlan

#: family-wise error of one audit (all Clopper-Pearson bounds of the grid hold at once)
ALPHA = 0.01
#: thresholds on the standardised statistic, fixed before any trial
GRID = tuple(float(t) for t in np.arange(1.0, 3.51, 0.25))


@dataclass(frozen=True)
class AuditResult:
    """The best threshold of the grid and its bound."""

    epsilon_lower: float
    threshold: float
    trials: tuple[int, int]
    hits: tuple[int, int]
    p0_upper: float
    p1_lower: float

    def describe(self, claimed: float) -> str:
        """One line for the test log."""
        return (
            f"eps_lb={self.epsilon_lower:.3f} (claimed {claimed:g}, "
            f"{self.epsilon_lower / claimed:.0%}) at t={self.threshold:g}: "
            f"{self.hits[0]}/{self.trials[0]} under D, {self.hits[1]}/{self.trials[1]} under D'"
        )


def epsilon_lower_bound(
    t0: np.ndarray, t1: np.ndarray, delta: float, *, alpha: float = ALPHA
) -> AuditResult:
    """The Clopper-Pearson lower bound on epsilon over :data:`GRID`.

    Parameters
    ----------
    t0, t1 : ndarray
        The statistic on independent runs with ``D`` and with ``D'``.
    delta : float
        The claimed delta.
    alpha : float
        Family-wise error (Bonferroni over the grid and the two bounds of each threshold).

    Returns
    -------
    AuditResult
        ``epsilon_lower = -inf`` when no threshold separates the two at this confidence.
    """
    n0, n1 = len(t0), len(t1)
    level = alpha / (2 * len(GRID))
    best = AuditResult(-math.inf, math.nan, (n0, n1), (0, 0), 1.0, 0.0)
    for t in GRID:
        k0, k1 = int(np.count_nonzero(t0 > t)), int(np.count_nonzero(t1 > t))
        p0_hi = 1.0 if k0 == n0 else float(stats.beta.ppf(1 - level, k0 + 1, n0 - k0))
        p1_lo = 0.0 if k1 == 0 else float(stats.beta.ppf(level, k1, n1 - k1 + 1))
        if p1_lo <= delta:
            continue
        eps = math.log((p1_lo - delta) / p0_hi)
        if eps > best.epsilon_lower:
            best = AuditResult(eps, t, (n0, n1), (k0, k1), p0_hi, p1_lo)
    return best


def standardise(log_lr: np.ndarray, mu: float) -> np.ndarray:
    """``(log LR + mu^2 / 2) / mu``: ``N(0, 1)`` under ``D`` for a Gaussian shift of ``mu``."""
    return (log_lr + mu * mu / 2) / mu


def gaussian_log_lr(whitened: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """``log p(y | D') - log p(y | D)`` of a whitened Gaussian: ``<e, s> - ||s||^2 / 2`` per trial,
    ``e`` the whitened residual against ``D`` (trials on the first axis)."""
    e = whitened.reshape(len(whitened), -1)
    s = np.asarray(shift).ravel()
    return np.asarray(e @ s - float(s @ s) / 2)


def whiten(residual: np.ndarray, factor: np.ndarray, equi_modal: bool) -> np.ndarray:
    """``B^-1 R`` (unimodal, ``Psi = I``) or ``B^-1 R B^-T`` (equi-modal, ``Psi = Sigma``)."""
    left = np.linalg.solve(factor, residual)
    if not equi_modal:
        return left
    return np.swapaxes(np.linalg.solve(factor, np.swapaxes(left, -1, -2)), -1, -2)


def whiten_symmetric(residual: np.ndarray, factor: np.ndarray, ratio: float) -> np.ndarray:
    """``vech_r(B^-1 R B^-T)``: the diagonal, then the upper off-diagonal entries over ``sqrt(r)``.

    For symmetric noise ``B S B^T`` (docs/bounds.md Sec. 1) these coordinates are iid
    ``N(0, 1)``, so the Gaussian log-likelihood ratio in them is exact. Trials on the first axis.
    """
    G = whiten(residual, factor, True)
    m = G.shape[-1]
    iu = np.triu_indices(m, 1)
    diag = np.diagonal(G, axis1=-2, axis2=-1)
    off = G[..., iu[0], iu[1]] / math.sqrt(ratio)
    return np.concatenate([diag, off], axis=-1)


class CapturedOutput:
    """Stands where the engine's :class:`~mvg_dask.engine.output.OutputTarget` stands and keeps
    what :func:`~mvg_dask.engine.stages.covariance.write_covariance_skeleton` and
    :func:`~mvg_dask.engine.stages.covariance.write_covariance` hand it to write (the audit
    runs thousands of releases in process; writing each to Zarr would only add time). The values
    are the ones a release publishes: ``test_trial_sampler_is_the_release`` checks them against a
    real release."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.value: np.ndarray | None = None
        self.extra: dict[str, Any] = {}
        self.rplan: ReleasePlan | None = None

    def write_matrix_skeleton(
        self, rplan: ReleasePlan, name: str, *, count: float | None = None
    ) -> None:
        self.rplan, self.name = rplan, name
        self.extra = {} if count is None else {"record_count": count}

    def write_matrix_values(self, values: dict[str, np.ndarray]) -> None:
        assert self.name is not None
        self.value = values[self.name]
        self.extra |= {k: v for k, v in values.items() if k != self.name}


def covariance_trial(rplan: ReleasePlan, gram: np.ndarray, seed: int) -> CapturedOutput:
    """One covariance release of the dataset whose clipped Gram matrix is ``gram`` (from the
    engine's own Gram pass), with the noise key ``execute_release`` makes for ``seed``.

    The public functions of the plan's stages run in their order around the Gram pass: the
    noisy count, the DP-PCA step (the real :func:`~mvg_dask.plan.dp_pca` and
    :meth:`ReleasePlan.resolve`), the skeleton with the noise (the plan's own draw,
    :meth:`NoisePlan.draw`), then the covariance; every draw comes from the sub-keys those
    functions derive themselves.
    """
    out = CapturedOutput()
    key = NoiseKey.from_seed(seed)
    count = draw_noisy_count(rplan, key) if rplan.releases_count else None
    resolved = rplan
    if rplan.uses_dp_pca:
        normaliser = rplan.query.records if count is None else max(count, 1)
        resolved = dp_pca_directions(rplan, key, gram, normaliser)
    noise = write_covariance_skeleton(out, resolved, key, count)  # type: ignore[arg-type]
    write_covariance(out, resolved, key, gram, noise, count)  # type: ignore[arg-type]
    return out


def moment_trial(rplan: ReleasePlan, gram: np.ndarray, seed: int) -> CapturedOutput:
    """One centered-covariance or regression release of the dataset whose augmented Gram matrix
    ``Z Z^T`` is ``gram`` (from the engine's own Gram pass): the engine's ``moment`` stage
    (:func:`~mvg_dask.engine.stages.moment.run_moment`) with the key ``execute_release`` makes
    for ``seed``; ``value`` is the published ``moment``, ``extra`` its ``mean`` and
    ``covariance``."""
    from mvg_dask.engine.stages.context import RunContext
    from mvg_dask.engine.stages.moment import run_moment

    out = CapturedOutput()
    ctx = RunContext(None, NoiseKey.from_seed(seed), out, progress=False)  # type: ignore[arg-type]
    ctx.gram = gram
    run_moment(ctx, rplan)
    return out
