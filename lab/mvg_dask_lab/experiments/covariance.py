"""Exp. III of the MVG paper: covariance estimation on the CTG data by input perturbation.

Setup (paper Sec. 8.3): the private data are the 21 x 2,126 CTG features scaled to [0, 1]. A
mechanism releases ``X~ = X + Z`` (identity query, Alg. 1: unimodal noise), the analyst
computes ``S~ = X~ X~^T / N`` and its eigenvectors ``v~_i`` (by decreasing eigenvalue). Metric
(paper Eq. 29): ``RSS = sum_i (lambda_i - rho(v~_i))^2`` where ``lambda_i`` is the i-th largest
eigenvalue of the non-private ``S = X X^T / N`` and ``rho(v) = v^T S v`` the variance of the
non-private data captured by ``v``.

Two extra rows (the paper's rows stay as they are):

* ``exact-unbiased``: the exact row's release, but the analyst removes the noise's known bias,
  ``S~ = X~ X~^T / N - Sigma`` (:func:`mvg_dask.plan.covariance_from_identity`, docs/bounds.md
  Sec. 7).
* ``exact-covariance``: the covariance query itself released with the product's default exact
  mechanism (symmetric noise, docs/bounds.md Sec. 1): the analyst who wants ``S`` asks for
  ``S``, with sensitivity ``R / N`` (Cor. 3: the features are in ``[0, 1]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

from mvg_dask.datasets import PaperDataset, load_ctg
from mvg_dask.noise import NoiseKey
from mvg_dask.plan import BoxDomain, NoisePlan, covariance_from_identity
from mvg_dask.plan.lattice import NoiseKind
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery
from mvg_dask_lab.experiments.literature import blr_method, jl_method
from mvg_dask_lab.experiments.mechanisms import (
    plan_implied_epsilon,
    plan_release,
    plan_std_range,
    symmetric_plan,
)
from mvg_dask_lab.experiments.methods import (
    Evaluation,
    Method,
    baseline_methods,
    binary_method,
    reference_methods,
)
from mvg_dask_lab.experiments.runner import PaperExperiment

__all__ = ["METHODS", "CovarianceExperiment", "principal_axes", "residual_sum_of_squares"]

_CHUNK: Final = 25
_ID = "identity query, Alg. 1 (unimodal), s2 = ||w|| = sqrt(21)"
_IMPORTANT = "LB, ASTV, ALTV"

METHODS: Final[tuple[Method, ...]] = (
    *reference_methods(
        non_private="eigenvectors of the true S",
        random_guess="a uniformly random (Haar) orthonormal basis",
    ),
    binary_method("mvg-thm2", _IMPORTANT, f"mvg-thm2 (Thm. 2 + Thm. 5), {_ID}, gamma = sqrt(21 N)"),
    binary_method("mgm-udn", _IMPORTANT, f"mgm-udn (MGM Thm. 2), {_ID}"),
    binary_method("mgm-idn", _IMPORTANT, "mgm-idn (MGM Thm. 3), entries in [0, 1]"),
    binary_method("exact", _IMPORTANT, f"exact, {_ID}"),
    Method(
        key="exact-unbiased",
        label=f"MVG, exact, unbiased S~ (binary: {_IMPORTANT})",
        kind="exact",
        sweep_tau=True,
        calibration="exact",
        description=f"the exact row's release ({_ID}); the analyst subtracts the known noise "
        "bias: S~ = X~ X~^T / N - Sigma (covariance_from_identity)",
    ),
    Method(
        key="exact-covariance",
        label="MVG, exact, covariance query (the product's default)",
        kind="exact",
        calibration="exact",
        description="the query S = X X^T / N itself (21 x 21), symmetric noise A S A^T, standard "
        "directions, uniform allocation, r* = 1/sqrt(2) (docs/bounds.md Sec. 5), "
        "Delta^2 = sup Q_r(D)/r (Thm. 2, sign-definite box): what a covariance release does "
        "by default",
    ),
    *baseline_methods("b = s1 / ε, s1 = ||w||_1 = 21"),
    jl_method("JL transform (BBDS, for Upadhyay [46])"),
    blr_method("Exponential (Blum et al. [104], public candidates)"),
)


def principal_axes(S: np.ndarray) -> np.ndarray:
    """Eigenvectors of a batch of symmetric matrices ``(T, m, m)``, by decreasing eigenvalue."""
    _, vecs = np.linalg.eigh(S)
    return np.asarray(vecs[..., ::-1])


def residual_sum_of_squares(S: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``RSS = sum_i (lambda_i - v_i^T S v_i)^2`` for batches of ordered bases (paper Eq. 29).

    ``lambda_i`` is evaluated as the captured variance of the i-th eigenvector of ``S`` itself
    (equal to the i-th eigenvalue up to rounding), by the same computation as for the
    estimates, so the non-private answer has an RSS of exactly 0.

    Parameters
    ----------
    S : numpy.ndarray
        The non-private ``m x m`` covariance.
    vectors : numpy.ndarray
        Shape ``(T, m, m)``: column ``i`` of each basis is the estimate of the i-th PC.

    Returns
    -------
    numpy.ndarray
        Shape ``(T,)``.
    """
    lam = _captured(S, principal_axes(S[None]))
    rho = _captured(S, vectors)
    return np.asarray(np.sum((lam - rho) ** 2, axis=1))


def _captured(S: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """``v_i^T S v_i`` for every column ``i`` of every basis in ``(T, m, m)``."""
    return np.asarray(np.einsum("tki,kl,tli->ti", vectors, S, vectors))


class CovarianceExperiment(PaperExperiment):
    """Exp. III: covariance of the released CTG data, metric RSS.

    Parameters
    ----------
    dataset : PaperDataset, optional
        The CTG data (default :func:`mvg_dask.datasets.load_ctg`).
    noise : {"float", "lattice"}, default "float"
        The noise of the MVG rows (:class:`~mvg_dask_lab.experiments.runner.PaperExperiment`).
    """

    name = "covariance"
    title = "Exp. III: covariance estimation (CTG, identity query, RSS)"
    metric = "RSS"
    methods = METHODS

    def __init__(self, dataset: PaperDataset | None = None, *, noise: NoiseKind = "float") -> None:
        self._set_noise(noise)
        ds = dataset if dataset is not None else load_ctg()
        self.dataset = ds
        m, n = ds.X.shape
        self.domain = BoxDomain.create(ds.lower, ds.upper, m)
        self.query = IdentityQuery(m, n)
        self.covariance_query = CovarianceQuery(m, n)
        self.S = ds.X @ ds.X.T / n
        self.output_range = self.query.output_entry_range(self.domain)
        self.settings: Mapping[str, str] = {
            "private data": f"{m} x {n:,} CTG features, scaled to [0, 1]",
            "estimate": "S~ = X~ X~^T / N (not mean-centred), PCs by decreasing eigenvalue",
            "important (binary)": ", ".join(ds.feature_names[i] for i in ds.important),
        }

    def errors(self, noise: np.ndarray) -> np.ndarray:
        """RSS of the covariance of ``X + Z`` for each noise matrix ``Z`` of ``(T, M, N)``."""
        return self._rss(noise, self.dataset.X)

    def released_errors(self, released: np.ndarray) -> np.ndarray:
        """RSS of the covariance of each released ``X~`` of ``(T, M, N)``."""
        return self._rss(released, None)

    def _rss(self, batch: np.ndarray, offset: np.ndarray | None) -> np.ndarray:
        """RSS of ``X~ X~^T / N`` for ``X~ = offset + batch[t]`` (``batch[t]`` without offset)."""
        n = self.dataset.X.shape[1]
        out = np.empty(batch.shape[0])
        for lo in range(0, batch.shape[0], _CHUNK):
            Xt = batch[lo : lo + _CHUNK]
            if offset is not None:
                Xt = offset[None] + Xt
            St = Xt @ np.swapaxes(Xt, 1, 2) / n
            out[lo : lo + _CHUNK] = residual_sum_of_squares(self.S, principal_axes(St))
        return out

    def _non_private_error(self) -> float:
        return float(residual_sum_of_squares(self.S, principal_axes(self.S[None]))[0])

    def _random_guess_errors(self, rng: np.random.Generator, trials: int) -> np.ndarray:
        m = self.dataset.n_features
        Q, R = np.linalg.qr(rng.standard_normal((trials, m, m)))
        Q = Q * np.sign(np.diagonal(R, axis1=1, axis2=2))[:, None, :]
        return residual_sum_of_squares(self.S, Q)

    def _noisy_errors(self, noise: np.ndarray) -> np.ndarray:
        return self.errors(noise)

    def _released_errors(self, released: np.ndarray) -> np.ndarray:
        return self.released_errors(released)

    def _query_value(self) -> np.ndarray:
        return self.dataset.X

    def _plan_errors(self, method: Method, plan: NoisePlan, released: np.ndarray) -> np.ndarray:
        if method.key != "exact-unbiased":
            return self._released_errors(released)
        est = np.stack([covariance_from_identity(x, plan) for x in released])
        return residual_sum_of_squares(self.S, principal_axes(est))

    def _evaluate_extra(
        self, method: Method, epsilon: float, delta: float, trials: int, key: NoiseKey
    ) -> Evaluation:
        """The covariance query released with the product's default exact mechanism."""
        if method.key != "exact-covariance":
            return super()._evaluate_extra(method, epsilon, delta, trials, key)
        plan = symmetric_plan(
            self.covariance_query, self.domain, epsilon=epsilon, delta=delta, noise=self.noise
        )
        released = plan_release(plan, self.S, key, trials)
        return Evaluation(
            errors=residual_sum_of_squares(self.S, principal_axes(released)),
            noise_std=plan_std_range(plan),
            implied_epsilon=plan_implied_epsilon(plan),
            details={"symmetric_ratio": float(plan.symmetric_ratio or 0.5)},
        )

    def _synthetic_errors(self, records: np.ndarray) -> np.ndarray:
        S = np.swapaxes(records, 1, 2) @ records / records.shape[1]
        return residual_sum_of_squares(self.S, principal_axes(S))
