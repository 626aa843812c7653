"""The centered covariance: one moment release against two separate releases, at the same budget.

Run: ``.venv/bin/python -m tests.benchmarks.bench_centered [--trials 200]``

For records uniform in ``[0, w]^m`` (seeded; ``--widths``, default 1), at the same
``(epsilon, delta)``:

* **moment**: the product's ``centered-covariance`` release, the second moment of
  ``[x - c; s]`` about the box's centre ``c`` with the plan's constant ``s``
  (:func:`~mvg_dask.privacy.sensitivity.augmented_scale`; symmetric noise, standard directions,
  exact calibration), ``covariance = M_xx - u u^T``, ``u = M[:m, m] / s``; and the same with
  the constant ``1`` (column ``s=1``), what the scale buys;
* **separate**: the covariance ``X X^T / N`` released by the product (the same mechanism) and
  the mean by the Gaussian mechanism (L2 sensitivity ``||hi - lo|| / N`` under replace-one),
  composed in Gaussian DP (``mu^2 = mu_cov^2 + mu_mean^2``), then ``X X^T / N - m m^T``. The
  split is the best of a grid of 9 (generous to the baseline: choosing it on the error is not
  private).

The metric is the root mean squared Frobenius error of the covariance around the mean against
``numpy.cov(X, bias=True)`` of the clipped records, over ``--trials`` draws of each release's own
noise plan (``NoisePlan.draw`` with keys from seeds ``0..trials-1``: the draw the engine adds;
the mean's Gaussian from ``numpy.random.default_rng(seed)``). Float noise: the lattice release
has the same noise law up to its grid, so the ratio is the lattice one too. Reported, never
asserted.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy.optimize import brentq

from mvg_dask.noise import NoiseKey
from mvg_dask.plan import BoxDomain, build_noise_plan
from mvg_dask.plan.queries import CenteredCovarianceQuery, CovarianceQuery
from mvg_dask.plan.queries.moment import centered_from_moment
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.sensitivity import augmented_scale

SPLITS = np.linspace(0.1, 0.9, 9)  # the covariance's share of mu^2 in the separate releases


def epsilon_for_mu(mu: float, delta: float) -> float:
    """The ``epsilon`` whose analytic-Gaussian ``mu`` at ``delta`` is ``mu``."""
    return float(brentq(lambda e: cal.analytic_gaussian_mu(e, delta) - mu, 1e-9, 1e4, xtol=1e-13))


def moment_error(
    X: np.ndarray, width: float, epsilon: float, delta: float, trials: int, scale: float
) -> float:
    """RMS Frobenius error of the moment release's covariance, constant ``scale``."""
    m, n = X.shape
    box = BoxDomain.create(0.0, width, m)
    c = np.full(m, width / 2)  # the box's centre, as the release plans it
    query = CenteredCovarianceQuery(m + 1, n, centre=tuple(c), scale=scale)
    plan = build_noise_plan(
        query,
        query.record_domain(box),
        epsilon=epsilon,
        delta=delta,
        algorithm="symmetric",
    )
    truth = np.cov(X, bias=True)
    M = query.partial(X) / n
    err = [
        centered_from_moment(M + plan.draw(NoiseKey.from_seed(t)), c, scale)[1] - truth
        for t in range(trials)
    ]
    return float(np.sqrt(np.mean([np.sum(e * e) for e in err])))


def separate_error(
    X: np.ndarray, width: float, epsilon: float, delta: float, trials: int
) -> tuple[float, float]:
    """RMS Frobenius error of ``X X^T / N - m m^T`` from two releases, at the best split."""
    m, n = X.shape
    box = BoxDomain.create(0.0, width, m)
    mu = cal.analytic_gaussian_mu(epsilon, delta)
    G = X @ X.T / n
    mean = X.mean(axis=1)
    truth = np.cov(X, bias=True)
    best = (math.inf, 0.0)
    for share in SPLITS:
        mu_cov, mu_mean = mu * math.sqrt(share), mu * math.sqrt(1 - share)
        plan = build_noise_plan(
            CovarianceQuery(m, n),
            box,
            epsilon=epsilon_for_mu(mu_cov, delta),
            delta=delta,
            algorithm="symmetric",
        )
        sigma_mean = width * math.sqrt(m) / n / mu_mean  # ||hi - lo|| / N over mu
        sq = []
        for t in range(trials):
            noisy_mean = mean + sigma_mean * np.random.default_rng(t).standard_normal(m)
            e = G + plan.draw(NoiseKey.from_seed(t)) - np.outer(noisy_mean, noisy_mean) - truth
            sq.append(float(np.sum(e * e)))
        best = min(best, (float(np.sqrt(np.mean(sq))), float(share)))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--features", default="5,20,64")
    p.add_argument("--records", default="1000,100000")
    p.add_argument("--epsilons", default="0.1,1")
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--widths", default="1", help="box widths w of [0, w]^m, comma-separated")
    args = p.parse_args()
    print(
        f"RMS Frobenius error of the centered covariance, {args.trials} trials, delta {args.delta}"
    )
    head = f"{'w':>5} {'m':>4} {'N':>7} {'eps':>5} {'s':>7} {'moment':>10} {'s=1':>10}"
    print(f"{head} {'separate':>10} {'split':>6} {'ratio':>6} {'s=1 / s':>8}")
    for width in map(float, args.widths.split(",")):
        for m in map(int, args.features.split(",")):
            scale = augmented_scale(m * width * width / 4, m)
            for n in map(int, args.records.split(",")):
                rng = np.random.default_rng(m * 7919 + n)
                X = width * rng.uniform(0.0, 1.0, (m, n))
                for eps in map(float, args.epsilons.split(",")):
                    one = moment_error(X, width, eps, args.delta, args.trials, scale)
                    unit = moment_error(X, width, eps, args.delta, args.trials, 1.0)
                    two, share = separate_error(X, width, eps, args.delta, args.trials)
                    print(
                        f"{width:>5g} {m:>4} {n:>7} {eps:>5g} {scale:>7g} {one:>10.3e} "
                        f"{unit:>10.3e} {two:>10.3e} {share:>6.1f} {one / two:>6.2f} "
                        f"{unit / one:>8.2f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
