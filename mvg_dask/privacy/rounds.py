"""A training run's budget split into rounds: the per-round loss whose composition over the
run's rounds (dp-accounting's privacy-loss distributions, with Poisson-subsampling
amplification where the run samples) meets the run's total ``(epsilon, delta)``
(docs/guide/rounds.md).

A Gaussian-DP calibration (``exact``, ``gaussian``) gets the largest ``mu`` per round; a paper
calibration, whose theorem states ``(epsilon, delta)``, gets ``delta_r`` with
``R q delta_r = delta / 2`` and the largest ``epsilon_r``. The split is found by bisection on
the composed distribution the ledger charges (:class:`~mvg_dask.privacy.accounting.RoundsLoss`),
so the charge always fits the total it was split from.

Examples
--------
>>> loss = split_run_budget(2.0, 1e-5, rounds=10, sampling_probability=1.0, gaussian_dp=True)
>>> total = RoundsLoss(loss_to_json(loss), 10, 1.0, 1e-5).approx_dp().epsilon
>>> 1.99 < total <= 2.0
True
"""

from __future__ import annotations

import functools
import math

from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import (
    PLD_DISCRETISATION,
    ApproxDP,
    GaussianDP,
    RoundsLoss,
    amplified_by_sampling,
    loss_to_json,
)

__all__ = ["run_loss", "split_run_budget"]

#: Relative precision of the bisection (the split is never above the total, only this close).
SPLIT_RTOL = 1e-3
#: The largest epsilon of an (epsilon, delta) round (dp-accounting overflows beyond 700).
MAX_ROUND_EPSILON = 500.0
#: The grid of the search's distributions (coarser than the charge's, so above it: faster).
SEARCH_DISCRETISATION = 1e-2


def run_loss(
    round_loss: GaussianDP | ApproxDP, rounds: int, sampling_probability: float, delta: float
) -> RoundsLoss:
    """The loss of ``rounds`` rounds of ``round_loss`` (what the ledger charges for the run)."""
    return RoundsLoss(loss_to_json(round_loss), rounds, float(sampling_probability), delta)


def _check(epsilon: float, delta: float, rounds: int, q: float) -> None:
    cal._check_privacy(epsilon, delta)
    if not (isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1):
        raise ValueError(f"rounds must be an integer >= 1, not {rounds!r}")
    if not (isinstance(q, float | int) and 0 < q <= 1):
        raise ValueError(f"sampling_probability must lie in (0, 1], not {q!r}")


def split_run_budget(
    epsilon: float,
    delta: float,
    *,
    rounds: int,
    sampling_probability: float,
    gaussian_dp: bool,
) -> GaussianDP | ApproxDP:
    """The per-round loss whose composition over the run meets ``(epsilon, delta)``.

    Parameters
    ----------
    epsilon, delta : float
        The run's total.
    rounds : int
        How many rounds the run has.
    sampling_probability : float
        Each round's Poisson sampling rate (1: no sampling).
    gaussian_dp : bool
        The calibration's rounds are Gaussian mechanisms (``exact``, ``gaussian``): the split
        is a ``mu``; otherwise an ``(epsilon_r, delta_r)`` statement.

    Returns
    -------
    GaussianDP or ApproxDP
        One round's loss; its :func:`run_loss` composes to at most ``epsilon`` at ``delta``.

    Raises
    ------
    ValueError
        For invalid inputs, or a total so small that no round fits.
    """
    _check(epsilon, delta, rounds, sampling_probability)
    return _split(float(epsilon), float(delta), rounds, float(sampling_probability), gaussian_dp)


@functools.lru_cache(maxsize=512)
def _split(
    epsilon: float, delta: float, rounds: int, q: float, gaussian_dp: bool
) -> GaussianDP | ApproxDP:
    delta_r = delta / (2.0 * rounds * q) if not gaussian_dp else delta / rounds
    if not delta_r < 1:
        raise ValueError(f"delta={delta!r} is too large for {rounds} rounds")

    def make(x: float) -> GaussianDP | ApproxDP:
        if gaussian_dp:
            return GaussianDP(x, cal.analytic_gaussian_epsilon(x, delta_r), delta_r)
        return ApproxDP(x, delta_r)

    # the search's grid: coarse, but fine against a round's share (a grid as coarse as the
    # share would round every round's loss up to it)
    grid = min(SEARCH_DISCRETISATION, max(PLD_DISCRETISATION, epsilon / (20.0 * rounds)))

    def fits(x: float) -> bool:
        if not gaussian_dp and x > MAX_ROUND_EPSILON:
            return False  # dp-accounting's (epsilon, delta) distributions overflow beyond
        return _coarse_epsilon(make(x), rounds, q, delta, grid) <= epsilon

    # an upper start: without sampling, the whole total in one round
    hi = cal.analytic_gaussian_mu(epsilon, delta) if gaussian_dp else epsilon
    if q < 1:
        hi *= 4.0 / math.sqrt(q)  # subsampling lets each round spend more
    if not gaussian_dp:
        hi = min(hi, MAX_ROUND_EPSILON)
    lo = hi / 2.0
    for _ in range(60):
        if fits(lo):
            break
        hi, lo = lo, lo / 2.0
    else:  # pragma: no cover - the composition of tiny rounds is tiny
        raise ValueError(f"no round fits epsilon={epsilon!r}, delta={delta!r}")
    while fits(hi):
        lo, hi = hi, hi * 2.0
    while hi - lo > SPLIT_RTOL * lo:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    for _ in range(100):  # the charge's own (finer) distribution: at most the coarse one
        if run_loss(make(lo), rounds, q, delta).approx_dp().epsilon <= epsilon:
            return make(lo)
        lo *= 1.0 - SPLIT_RTOL  # pragma: no cover - the finer grid is tighter
    raise ValueError(f"no round fits epsilon={epsilon!r}, delta={delta!r}")  # pragma: no cover


def _coarse_epsilon(
    loss: GaussianDP | ApproxDP, rounds: int, q: float, delta: float, grid: float
) -> float:
    """The run's epsilon on the coarser ``grid`` (pessimistic: above the charge's)."""
    from dp_accounting.pld import privacy_loss_distribution as pld
    from dp_accounting.pld.common import DifferentialPrivacyParameters

    if isinstance(loss, GaussianDP):
        if q == 1.0:
            return cal.analytic_gaussian_epsilon(loss.mu * math.sqrt(rounds), delta)
        one = pld.from_gaussian_mechanism(
            1.0 / loss.mu,
            sensitivity=1.0,
            sampling_prob=q,
            value_discretization_interval=grid,
        )
    else:
        point = loss if q == 1.0 else amplified_by_sampling(loss, q)
        one = pld.from_privacy_parameters(
            DifferentialPrivacyParameters(point.epsilon, point.delta),
            value_discretization_interval=grid,
        )
    return float(one.self_compose(rounds).get_epsilon_for_delta(delta))
