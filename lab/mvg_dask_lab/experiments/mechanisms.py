"""Noise for the experiments: MVG plans, the iid baselines, and how private each really is.

Thin helpers over :mod:`mvg_dask.plan`, :mod:`mvg_dask.noise` and :mod:`mvg_dask_lab.baselines`
that draw the noise of many trials at once (vectorised over a leading trial axis) from one keyed
generator.

The MVG rows publish either ``f + Z`` with float noise ``Z`` (``noise="float"``, the papers'
path) or exactly what a lattice release publishes (``noise="lattice"``, docs/lattice.md): the
plan is built with ``noise="lattice"`` and the summation context of :func:`lattice_context`, and
each trial's published matrix comes from the engine's own functions
(:meth:`mvg_dask.engine.lattice.RecordLattice.release` for the identity query,
:func:`mvg_dask.engine.lattice.square_release` for square queries) under the same per-trial key
as the float path (:func:`plan_release`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mvg_dask.engine.lattice import RecordLattice, square_release
from mvg_dask.noise import NoiseKey
from mvg_dask.noise.tiles import symmetric_normals, tile_records_for
from mvg_dask.plan import Allocation, Directions, NoisePlan, build_noise_plan
from mvg_dask.plan.domain import BoxDomain, RecordDomain
from mvg_dask.plan.lattice import LatticeContext, NoiseKind, gram_depth
from mvg_dask.plan.queries import MatrixQuery
from mvg_dask.privacy import analytic_gaussian_epsilon, analytic_gaussian_mu
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.privacy.sensitivity import traceless_box_sup
from mvg_dask_lab.baselines import IidMechanism

__all__ = [
    "binary_plan",
    "iid_implied_epsilon",
    "iid_noise",
    "lattice_context",
    "noise_options",
    "plan_implied_epsilon",
    "plan_noise",
    "plan_release",
    "plan_std_range",
    "release_value",
    "symmetric_plan",
    "traceless_noise",
]


def binary_plan(
    query: MatrixQuery,
    domain: RecordDomain,
    *,
    epsilon: float,
    delta: float,
    algorithm: Algorithm,
    calibration: Calibration,
    important: Sequence[int],
    tau: float,
    noise: NoiseKind = "float",
) -> NoisePlan:
    """MVG plan with standard-basis directions and the paper's binary allocation.

    Parameters
    ----------
    query : MatrixQuery
        The query (with the paper's declared ``s_2``/``gamma`` where reproduced).
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    epsilon, delta : float
        Privacy parameters.
    algorithm : {"unimodal", "equi-modal"}
        Alg. 1 or Alg. 2.
    calibration : str
        Calibration name.
    important : sequence of int
        The domain-knowledge features.
    tau : float
        Share of the precision budget given (equally) to the important features.
    noise : {"float", "lattice"}, default "float"
        The plan's noise; ``lattice`` with the summation context :func:`lattice_context`.

    Returns
    -------
    NoisePlan
        The plan.
    """
    m = query.shape[0]
    imp = tuple(int(i) for i in important)
    return build_noise_plan(
        query,
        domain,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,
        calibration=calibration,
        directions=Directions.standard(m, imp),
        allocation=Allocation(strategy="binary", important=imp, share=tau),
        **noise_options(query, noise),
    )


#: Fan-in of the summation tree :func:`lattice_context` assumes (the engine's default).
GRAM_FAN_IN = 8


def lattice_context(query: MatrixQuery) -> LatticeContext:
    """How an experiment computes its query, for the float-error bound of a lattice plan.

    The experiments compute a covariance in one piece on the client (``X @ X.T / N``, BLAS in
    whatever order it sums): modelled as one stored chunk holding all ``N`` records, one chunk
    per task and the engine's fan-in :data:`GRAM_FAN_IN`, so
    :func:`mvg_dask.plan.lattice.gram_depth` gives ``L = N``. Every summation order of ``N``
    products has at most ``N - 1`` additions on any path, so ``L = N`` bounds the depth of
    whatever order BLAS uses. The identity query sums nothing: depth 0.

    Parameters
    ----------
    query : MatrixQuery
        The query (its ``records`` is the data set's ``N``, public under replace-one).

    Returns
    -------
    LatticeContext
        ``records = N`` and the depth.
    """
    n = int(query.records)
    depth = 0 if query.kind == "identity" else gram_depth(n, n, 1, GRAM_FAN_IN)
    return LatticeContext(records=n, depth=depth)


def noise_options(query: MatrixQuery, noise: NoiseKind) -> dict[str, Any]:
    """The ``noise``/``lattice_context`` keywords of :func:`build_noise_plan` for ``noise``.

    Parameters
    ----------
    query : MatrixQuery
        The query.
    noise : {"float", "lattice"}
        The noise.

    Returns
    -------
    dict
        Empty for float noise (the builder's default); ``noise="lattice"`` and
        :func:`lattice_context` otherwise.
    """
    if noise == "float":
        return {}
    if noise != "lattice":
        raise ValueError(f"noise must be lattice or float, got {noise!r}")
    return {"noise": "lattice", "lattice_context": lattice_context(query)}


def symmetric_plan(
    query: MatrixQuery,
    domain: RecordDomain,
    *,
    epsilon: float,
    delta: float,
    noise: NoiseKind = "float",
) -> NoisePlan:
    """The product's default plan for a covariance release: the symmetric mechanism.

    ``exact`` calibration, symmetric noise ``A S A^T`` (docs/bounds.md Sec. 1), standard
    directions, uniform allocation and the ``r`` that minimises the expected squared error
    (:func:`mvg_dask.plan.best_symmetric_ratio`), all chosen from metadata alone: what
    ``mvg-dask release`` does for ``query: covariance`` when the spec names no algorithm.

    Parameters
    ----------
    query : MatrixQuery
        A covariance query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    epsilon, delta : float
        Privacy parameters.
    noise : {"float", "lattice"}, default "float"
        The plan's noise (:func:`noise_options`).

    Returns
    -------
    NoisePlan
        The plan.
    """
    return build_noise_plan(
        query,
        domain,
        epsilon=epsilon,
        delta=delta,
        algorithm="symmetric",
        calibration="exact",
        **noise_options(query, noise),
    )


@dataclass(frozen=True)
class TracelessNoise:
    """Noise of the symmetric mechanism on the traceless covariance (docs/bounds.md Sec. 9).

    Attributes
    ----------
    noise : numpy.ndarray
        ``(T, m, m)`` symmetric noise, one matrix per trial.
    ratio : float
        ``r``, off-diagonal over diagonal variance.
    sigma : float
        Standard deviation of a diagonal entry (``sigma sqrt(r)`` off the diagonal).
    sensitivity : float
        ``Delta = sqrt(sup Q_r(P(D)) / r) / N``; ``Delta / sigma = mu*(epsilon, delta)``.
    """

    noise: np.ndarray
    ratio: float
    sigma: float
    sensitivity: float


def traceless_noise(
    domain: BoxDomain, n: int, *, epsilon: float, delta: float, key: NoiseKey, trials: int
) -> TracelessNoise:
    """The symmetric mechanism on ``S - (tr S / m) I`` (eigenvector queries), per trial.

    The traceless part of ``S = X X^T / N`` has the eigenvectors of ``S`` and a smaller weighted
    sensitivity (:func:`mvg_dask.privacy.sensitivity.traceless_box_sup`), so it takes less
    noise for the same ``(epsilon, delta)``. Standard directions, uniform precisions, the ``r``
    that minimises the expected squared error of the released traceless matrix,
    ``Delta(r)^2 ((m - 1) + r m (m - 1))`` over the same fixed grid as
    :func:`mvg_dask.plan.best_symmetric_ratio` (metadata only); exact calibration
    ``sigma = Delta / mu*(epsilon, delta)`` (Balle & Wang). Trial ``t`` draws
    :func:`mvg_dask.noise.tiles.symmetric_normals` under ``key.derive(f"trial/{t}")``.

    Parameters
    ----------
    domain : BoxDomain
        Declared record domain (at most 8 features).
    n : int
        Records (the public normaliser of the replace-one covariance).
    epsilon, delta : float
        Privacy parameters.
    key : NoiseKey
        Keyed generator of this set of trials.
    trials : int
        Number of draws.

    Returns
    -------
    TracelessNoise
        The draws and their calibration.
    """
    m = domain.m
    lo, hi = domain.lower, domain.upper
    sq_hi = np.maximum(lo**2, hi**2)
    sq_lo = np.where((lo < 0) & (hi > 0), 0.0, np.minimum(lo**2, hi**2))
    grid = np.unique(
        np.concatenate(
            [np.geomspace(0.5, 2.0 * (m + 1), 241), [0.5, 1.0 / math.sqrt(2.0), (m + 1) / 2.0]]
        )
    )
    best: tuple[float, float, float] | None = None
    for r in grid:
        q = traceless_box_sup(sq_lo, sq_hi, ratio=float(r))
        cost = q / r * ((m - 1) + r * m * (m - 1))
        if best is None or cost < best[0]:
            best = (cost, float(r), q)
    assert best is not None
    _, ratio, q = best
    sens = math.sqrt(q / ratio) / n
    sigma = sens / analytic_gaussian_mu(epsilon, delta)
    noise = np.stack(
        [sigma * symmetric_normals(key.derive(f"trial/{t}"), m, ratio) for t in range(trials)]
    )
    return TracelessNoise(noise=noise, ratio=ratio, sigma=sigma, sensitivity=sens)


def plan_noise(plan: NoisePlan, key: NoiseKey, trials: int) -> np.ndarray:
    """Draw ``trials`` MVG noise matrices of a plan, as a release draws them.

    Trial ``t`` is :meth:`NoisePlan.draw` under ``key.derive(f"trial/{t}")``: the canonical tile
    grid and the affine sampler (MVG Lemma 7) of the release engine, the one sampling path.

    Parameters
    ----------
    plan : NoisePlan
        The plan.
    key : NoiseKey
        Keyed generator of this set of trials.
    trials : int
        Number of independent draws.

    Returns
    -------
    numpy.ndarray
        Shape ``(trials, m, n)``: ``B_Sigma N`` (unimodal) or ``B_Sigma N B_Sigma^T``
        (equi-modal) per trial.
    """
    return np.stack([plan.draw(key.derive(f"trial/{t}")) for t in range(trials)])


def release_value(plan: NoisePlan, value: np.ndarray, key: NoiseKey) -> np.ndarray:
    """What one release of ``plan`` under ``key`` publishes for the query value ``value``.

    Float noise: ``value + plan.draw(key)``. Lattice noise: what the engine publishes, by its own
    functions: :meth:`RecordLattice.release` over all ``N`` records with the release's tile
    (:func:`mvg_dask.noise.tiles.tile_records_for`) for the identity query,
    :func:`mvg_dask.engine.lattice.square_release` for a square query. The published matrix is
    then a function of ``value`` and ``key``, not ``value`` plus a noise matrix.

    Parameters
    ----------
    plan : NoisePlan
        The plan (its ``lattice`` says which path).
    value : numpy.ndarray
        The query's value, ``m x n`` float64 (the clipped records or the covariance).
    key : NoiseKey
        The release's noise key.

    Returns
    -------
    numpy.ndarray
        The published ``m x n`` matrix.
    """
    f = np.asarray(value, dtype=np.float64)
    if plan.lattice is None:
        return np.asarray(f + plan.draw(key))
    if plan.query.kind == "identity":
        m, n = f.shape
        lattice = RecordLattice.for_plan(plan)
        return lattice.release(f, key, 0, n, tile=tile_records_for(m), n_total=n)
    return square_release(f, plan, key)


def plan_release(plan: NoisePlan, value: np.ndarray, key: NoiseKey, trials: int) -> np.ndarray:
    """The published matrices of ``trials`` releases of ``plan`` on the query value ``value``.

    Trial ``t`` is :func:`release_value` under ``key.derive(f"trial/{t}")``, the key of
    :func:`plan_noise`'s trial ``t``: with float noise the result is ``value + plan_noise(...)``
    bit for bit.

    Parameters
    ----------
    plan : NoisePlan
        The plan.
    value : numpy.ndarray
        The query's value, ``m x n``.
    key : NoiseKey
        Keyed generator of this set of trials.
    trials : int
        Number of independent releases.

    Returns
    -------
    numpy.ndarray
        Shape ``(trials, m, n)``.
    """
    return np.stack([release_value(plan, value, key.derive(f"trial/{t}")) for t in range(trials)])


def plan_std_range(plan: NoisePlan) -> tuple[float, float]:
    """Smallest and largest standard deviation of one noise entry of a plan."""
    std = plan.released_entry_std()
    return float(np.min(std)), float(np.max(std))


def plan_implied_epsilon(plan: NoisePlan) -> float:
    """Smallest ``epsilon`` the whole plan (direction step included) has at its ``delta``.

    Both a DP-PCA step (Analyze Gauss, ratio ``step_mu``) and the MVG release (whitened, ratio
    ``Delta_M``, for lattice noise its effective sensitivity) are Gaussian mechanisms, so
    together they are ``mu``-GDP with ``mu = hypot(Delta_M, step_mu)``; the answer is that
    mechanism's analytic epsilon at ``delta``.

    Parameters
    ----------
    plan : NoisePlan
        The plan.

    Returns
    -------
    float
        The implied epsilon (for a paper calibration far below its nominal epsilon).
    """
    mu = plan.release_sensitivity
    if plan.budgets.step_mu is not None:
        mu = math.hypot(mu, plan.budgets.step_mu)
    return analytic_gaussian_epsilon(mu, plan.delta)


def iid_noise(mech: IidMechanism, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Draw iid baseline noise of the given shape (trial axis included)."""
    return mech.sample(rng, shape)


def iid_implied_epsilon(mech: IidMechanism) -> float:
    """Smallest ``epsilon`` of an iid baseline at its own ``delta``.

    Gaussian (classic or analytic): the analytic epsilon of ratio ``s_2 / sigma``; Laplace: its
    ``epsilon`` (pure DP, tight for the L1 sensitivity).

    Parameters
    ----------
    mech : IidMechanism
        The baseline.

    Returns
    -------
    float
        Epsilon.
    """
    if mech.name == "laplace":
        return mech.epsilon
    return analytic_gaussian_epsilon(mech.sensitivity / mech.scale, mech.delta)
