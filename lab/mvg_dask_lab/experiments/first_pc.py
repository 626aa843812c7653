"""Exp. II of the MVG paper: the first principal component of the Movement data.

Setup (paper Sec. 8.2): the query is the 4 x 4 second-moment matrix ``S = X X^T / N`` of the
four anchors' RSS (records in [-1, 1]^4, N = 10,176: sample ``"full_version"`` of
:func:`mvg_dask.datasets.load_movement`, sequences 1-255 in ID order, the only rule found that
reproduces both of the paper's N). A mechanism releases ``S~ = S + Z``; the first principal
component ``v`` is the eigenvector of the largest eigenvalue of the symmetric part
``(S~ + S~^T) / 2`` (MVG noise ``B N B^T`` and iid noise are not symmetric; symmetrising is
post-processing, applied identically to every method; for a PSD matrix it equals the paper's
"SVD"). Metric (paper Eq. 28): ``Delta-rho = lambda_1 - v^T S v`` on the non-private ``S``.

Sensitivity: the MVG paper's rows use its own ``s_2 = 2 max||x||^2 / N = 8/N`` and
``gamma = max||x||^2 = 4``; the other rows use the library's tighter (and valid)
``s_2 = sqrt(2) max||x||^2 / N``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

from mvg_dask.datasets import MovementSample, PaperDataset, load_movement
from mvg_dask.noise import NoiseKey
from mvg_dask.plan import BoxDomain, MatrixQuery, dp_pca, gram_sensitivity
from mvg_dask.plan.lattice import NoiseKind
from mvg_dask.plan.queries import CovarianceQuery
from mvg_dask.privacy import analytic_gaussian_epsilon, analytic_gaussian_mu
from mvg_dask.privacy.calibration import Algorithm
from mvg_dask_lab.experiments.literature import jl_method, ppca_method
from mvg_dask_lab.experiments.mechanisms import (
    plan_implied_epsilon,
    plan_release,
    plan_std_range,
    symmetric_plan,
    traceless_noise,
)
from mvg_dask_lab.experiments.methods import (
    Evaluation,
    Method,
    baseline_methods,
    binary_method,
    reference_methods,
)
from mvg_dask_lab.experiments.runner import PaperExperiment

__all__ = [
    "METHODS",
    "FirstPCExperiment",
    "captured_variance_gap",
    "rayleigh",
    "top_eigenvector",
]

_PAPER_S2 = "s2 = 2 max||x||^2/N = 8/N, gamma = 4 (the paper's)"
_TIGHT_S2 = "s2 = sqrt(2) max||x||^2/N (tight)"

_IMPORTANT = "ANC0, ANC3"
_EQUI = "Alg. 2 (equi-modal)"
_IID = "iid on the 16 entries of S,"

METHODS: Final[tuple[Method, ...]] = (
    *reference_methods(
        non_private="top eigenvector of the true S",
        random_guess="a uniformly random unit vector",
    ),
    binary_method("mvg-thm2", _IMPORTANT, f"mvg-thm2 (Thm. 2 + Thm. 6), {_EQUI}, {_PAPER_S2}"),
    binary_method("mvg-thm3", _IMPORTANT, f"mvg-thm3 (Thm. 3 + Thm. 6), {_EQUI}, {_PAPER_S2}"),
    binary_method("mgm-udn", _IMPORTANT, f"mgm-udn (MGM Thm. 2), unimodal noise, {_TIGHT_S2}"),
    binary_method(
        "mgm-idn", _IMPORTANT, "mgm-idn (MGM Thm. 3), unimodal noise, entries of S in [-1, 1]"
    ),
    binary_method("exact", _IMPORTANT, f"exact, {_EQUI}, {_TIGHT_S2}"),
    Method(
        key="exact-traceless",
        label="MVG, exact, symmetric on the traceless S (eigenvectors)",
        kind="exact",
        calibration="exact",
        description="exact, symmetric noise on S - (tr S / m) I, which has the eigenvectors "
        "of S; weighted sensitivity sup Q_r(P(D)) (docs/bounds.md Sec. 9), standard directions, "
        "uniform allocation, r minimising the expected squared error of the release",
    ),
    Method(
        key="exact-symmetric",
        label="MVG, exact, symmetric (the product's default)",
        kind="exact",
        calibration="exact",
        description="exact, symmetric noise A S A^T (docs/bounds.md Sec. 1), standard "
        "directions, uniform allocation, off-diagonal/diagonal variance r* = (m + 1)/2 = 2.5 "
        "(docs/bounds.md Sec. 5), "
        "Delta^2 = sup Q_r(D)/r (Thm. 1): what a covariance release does by default",
    ),
    *baseline_methods(
        f"{_IID} b = s1/ε, s1 = 2 (sum a_i)^2/N",
        classic=f"{_IID} classic sigma, {_TIGHT_S2}",
        analytic=f"{_IID} analytic sigma, {_TIGHT_S2}",
    ),
    Method(
        key="analyze-gauss",
        label="Analyze Gauss (Dwork et al. 2014)",
        kind="baseline",
        description="symmetric Gaussian noise on X X^T (upper triangle iid, mirrored; "
        "s2 = sup ||vech(x x^T - x' x'^T)|| = 4, docs/bounds.md Cor. 4, analytic sigma), "
        "top eigenvector",
    ),
    jl_method("JL transform (Blocki et al. [42])"),
    ppca_method(),
)


def top_eigenvector(released: np.ndarray) -> np.ndarray:
    """Eigenvector of the largest eigenvalue of the symmetric part, batched.

    Parameters
    ----------
    released : numpy.ndarray
        Shape ``(T, m, m)``.

    Returns
    -------
    numpy.ndarray
        Shape ``(T, m)``, unit vectors.
    """
    sym = 0.5 * (released + np.swapaxes(released, -1, -2))
    _, vecs = np.linalg.eigh(sym)
    return np.asarray(vecs[..., :, -1])


def rayleigh(S: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Captured variance ``rho(v) = v^T S v`` for a batch of vectors ``v`` of shape ``(T, m)``."""
    return np.asarray(np.einsum("ti,ij,tj->t", v, S, v))


def captured_variance_gap(S: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``Delta-rho = lambda_1(S) - v^T S v`` for a batch of unit vectors (paper Eq. 28).

    ``lambda_1`` is evaluated as the captured variance of the top eigenvector of ``S`` itself
    (equal to the largest eigenvalue up to rounding), by the same computation as for ``v``, so
    the non-private answer has an error of exactly 0.

    Parameters
    ----------
    S : numpy.ndarray
        The non-private ``m x m`` covariance.
    v : numpy.ndarray
        Shape ``(T, m)``.

    Returns
    -------
    numpy.ndarray
        Shape ``(T,)``.
    """
    lam1 = rayleigh(S, top_eigenvector(S[None]))[0]
    return np.asarray(lam1 - rayleigh(S, v))


class FirstPCExperiment(PaperExperiment):
    """Exp. II: first principal component of the released covariance, metric Delta-rho.

    Parameters
    ----------
    dataset : PaperDataset, optional
        The Movement data (default :func:`mvg_dask.datasets.load_movement` with ``sample``).
    sample : {"full_version", "conference", "all"}, default "full_version"
        Which Movement records to load when ``dataset`` is not given.
    noise : {"float", "lattice"}, default "float"
        The noise of the MVG rows built on a plan (the binary rows and ``exact-symmetric``;
        ``exact-traceless`` and Analyze Gauss keep float noise).
    """

    name = "first-pc"
    title = "Exp. II: first principal component (Movement, covariance query, Δρ)"
    metric = "Δρ"
    methods = METHODS

    def __init__(
        self,
        dataset: PaperDataset | None = None,
        sample: MovementSample = "full_version",
        *,
        noise: NoiseKind = "float",
    ) -> None:
        self._set_noise(noise)
        ds = dataset if dataset is not None else load_movement(sample)
        self.dataset = ds
        m, n = ds.X.shape
        self.domain = BoxDomain.create(ds.lower, ds.upper, m)
        R = self.domain.sup_norm_sq()
        self.S = ds.X @ ds.X.T / n
        self.gram = ds.X @ ds.X.T
        self.query = CovarianceQuery(m, n)
        self.paper_query = CovarianceQuery(m, n, sensitivity=2.0 * R / n, gamma=R)
        self.output_range = self.query.output_entry_range(self.domain)
        tight = self.query.l2_sensitivity(self.domain, "replace-one")
        self.settings: Mapping[str, str] = {
            "private data": f"{m} x {n:,} ({', '.join(ds.feature_names)}) in [-1, 1]",
            "sample": sample if dataset is None else "(given)",
            "query": "S = X X^T / N (not mean-centred), 4 x 4",
            "first PC": "top eigenvector of (S~ + S~^T)/2",
            "paper s2, gamma": f"2 max||x||^2/N = {2.0 * R / n:.4g}, gamma = {R:g}",
            "tight s2": f"sqrt(2) max||x||^2/N = {tight:.4g}",
            "important (binary)": ", ".join(ds.feature_names[i] for i in ds.important),
        }

    def errors(self, released: np.ndarray) -> np.ndarray:
        """Delta-rho of the first PC of each released ``(T, m, m)`` matrix."""
        return captured_variance_gap(self.S, top_eigenvector(released))

    def _non_private_error(self) -> float:
        return float(self.errors(self.S[None])[0])

    def _random_guess_errors(self, rng: np.random.Generator, trials: int) -> np.ndarray:
        v = rng.standard_normal((trials, self.dataset.n_features))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        return captured_variance_gap(self.S, v)

    def _noisy_errors(self, noise: np.ndarray) -> np.ndarray:
        return self.errors(self.S[None] + noise)

    def _released_errors(self, released: np.ndarray) -> np.ndarray:
        return self.errors(released)

    def _query_value(self) -> np.ndarray:
        return self.S

    def _synthetic_errors(self, records: np.ndarray) -> np.ndarray:
        return self.errors(np.swapaxes(records, 1, 2) @ records / records.shape[1])

    def _vector_errors(self, vectors: np.ndarray) -> np.ndarray:
        return captured_variance_gap(self.S, vectors)

    def _binary_query(self, method: Method) -> tuple[MatrixQuery, Algorithm]:
        """The paper's rows use its own sensitivities; MGM's calibrations add unimodal noise."""
        query = self.paper_query if method.kind == "paper-mvg" else self.query
        return query, "unimodal" if method.kind == "mgm" else "equi-modal"

    def _evaluate_extra(
        self, method: Method, epsilon: float, delta: float, trials: int, key: NoiseKey
    ) -> Evaluation:
        """Analyze Gauss, and the symmetric mechanisms (the product's default, traceless)."""
        if method.key == "exact-traceless":
            tl = traceless_noise(
                self.domain,
                self.dataset.n_records,
                epsilon=epsilon,
                delta=delta,
                key=key,
                trials=trials,
            )
            stds = sorted((tl.sigma, tl.sigma * float(np.sqrt(tl.ratio))))
            return Evaluation(
                errors=self._noisy_errors(tl.noise),
                noise_std=(stds[0], stds[1]),
                implied_epsilon=analytic_gaussian_epsilon(tl.sensitivity / tl.sigma, delta),
                details={"symmetric_ratio": tl.ratio},
            )
        if method.key == "exact-symmetric":
            plan = symmetric_plan(
                self.query, self.domain, epsilon=epsilon, delta=delta, noise=self.noise
            )
            return Evaluation(
                errors=self._released_errors(plan_release(plan, self.S, key, trials)),
                noise_std=plan_std_range(plan),
                implied_epsilon=plan_implied_epsilon(plan),
                details={"symmetric_ratio": float(plan.symmetric_ratio or 0.5)},
            )
        if method.key != "analyze-gauss":
            return super()._evaluate_extra(method, epsilon, delta, trials, key)
        n = self.dataset.n_records
        mu = analytic_gaussian_mu(epsilon, delta)
        sens = gram_sensitivity(self.domain, "replace-one")
        v = np.stack(
            [
                dp_pca(
                    self.gram,
                    records=n,
                    k=1,
                    mu=mu,
                    sensitivity=sens,
                    key=key.derive(f"trial/{t}"),
                ).matrix[:, 0]
                for t in range(trials)
            ]
        )
        std = sens / mu / n
        return Evaluation(
            errors=captured_variance_gap(self.S, v),
            noise_std=(std, std),
            implied_epsilon=epsilon,
        )
