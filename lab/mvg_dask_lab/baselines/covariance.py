"""Modern DP covariance estimators, the baselines of ``mvg-dask experiments covariance-bench``.

Every estimator releases ``Sigma = X^T X / n`` of ``n`` records ``x_i`` (rows here, as in the
papers; the product's features x records is the transpose) with ``||x_i||_2 <= r``, under
replace-one neighbours, and draws its noise from the generator it is given (the benchmark hands
each a keyed one):

================  ====================================================  =====================
estimator         method                                                privacy
================  ====================================================  =====================
``gauss_cov``     Analyze Gauss: ``Sigma`` + a symmetric Gaussian       ``rho``-zCDP
                  matrix, eigenvalues clipped to ``[0, r^2]``
``separate_cov``  SeparateCov: eigenvectors from Analyze Gauss at       ``rho``-zCDP
                  ``rho / 2``, eigenvalues by a Gaussian vector at
                  ``rho / 2``
``adaptive_cov``  AdaptiveCov: a private trace, a private clipping      ``rho``-zCDP
                  radius (sparse vector), then the better of the two
                  above on the clipped records
``coinpress_cov`` CoinPress: iterative whitening, clipping and          ``rho``-zCDP
                  Analyze Gauss (``t`` steps)
``em_cov``        Amin et al.: Laplace eigenvalues and eigenvectors     ``(epsilon, delta)``
                  one by one from the exponential mechanism
                  (Bingham), advanced composition over them
================  ====================================================  =====================

They follow the reference code of Dong, Liang and Yi (``hkustDB/PrivateCovariance``:
``adaptive/algos.py``, ``coinpress/algos.py``, which copies ``twistedcubic/coin-press``, and
``exponential/algos.py`` for Amin et al.), rewritten in numpy for a keyed generator, with these
differences, each noted where it is made: eigenvectors come from ``eigh`` by decreasing
eigenvalue (the reference takes an SVD of an indefinite matrix, which orders by ``|lambda|``
and can mix signs); CoinPress undoes its whitening with ``A^-T Z A^-1`` (the reference's
``A^-1 Z A^-1`` equals it for the two steps used here); record norms of 0 fall in no bin of
AdaptiveCov's histogram (the reference takes ``log2(0)``).

The estimators that need more than ``X^T X`` read the records through :class:`Records`, so the
benchmark can stream records it cannot hold in memory.

References
----------
.. [1] W. Dong, Y. Liang, K. Yi, "Differentially Private Covariance Revisited", NeurIPS 2022
   (SeparateCov, AdaptiveCov).
.. [2] S. Biswas, Y. Dong, G. Kamath, J. Ullman, "CoinPress: Practical Private Mean and
   Covariance Estimation", NeurIPS 2020.
.. [3] K. Amin, T. Dick, A. Kulesza, A. Munoz Medina, S. Vassilvitskii, "Differentially Private
   Covariance Estimation", NeurIPS 2019.
.. [4] C. Dwork, K. Talwar, A. Thakurta, L. Zhang, "Analyze Gauss: Optimal Bounds for
   Privacy-Preserving Principal Component Analysis", STOC 2014.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy import linalg

from mvg_dask_lab.baselines.bingham import sample_bingham

__all__ = [
    "InMemoryRecords",
    "Records",
    "adaptive_cov",
    "advanced_composition_epsilon",
    "coinpress_cov",
    "em_cov",
    "gauss_cov",
    "separate_cov",
    "symmetric_gaussian",
]


class Records(Protocol):
    """Records ``x_i`` (rows) read as sums, so they need not fit in memory."""

    @property
    def n(self) -> int:
        """Number of records."""
        ...

    @property
    def d(self) -> int:
        """Number of features."""
        ...

    def norms(self) -> np.ndarray:
        """``||x_i||_2`` of every record, shape ``(n,)``."""
        ...

    def gram(self, transform: np.ndarray | None = None, clip: float | None = None) -> np.ndarray:
        """``sum_i w_i w_i^T`` with ``w_i = A^T x_i`` (``A = transform``, identity if None)
        scaled to norm ``clip`` where it is longer; ``d x d``."""
        ...


@dataclass(frozen=True)
class InMemoryRecords:
    """:class:`Records` of an ``n x d`` array held in memory.

    Parameters
    ----------
    X : numpy.ndarray
        The records, one per row.
    """

    X: np.ndarray

    @property
    def n(self) -> int:
        """Number of records."""
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        """Number of features."""
        return int(self.X.shape[1])

    def norms(self) -> np.ndarray:
        """``||x_i||_2`` of every record."""
        return np.asarray(np.linalg.norm(self.X, axis=1))

    def gram(self, transform: np.ndarray | None = None, clip: float | None = None) -> np.ndarray:
        """``sum_i w_i w_i^T`` of the transformed, clipped records (:class:`Records`)."""
        return clipped_gram(self.X, transform, clip)


def clipped_gram(X: np.ndarray, transform: np.ndarray | None, clip: float | None) -> np.ndarray:
    """``W^T W`` for ``W = X A`` with every row longer than ``clip`` scaled to norm ``clip``.

    Parameters
    ----------
    X : numpy.ndarray
        ``n x d`` records.
    transform : numpy.ndarray or None
        ``A`` (``d x d``), identity if None.
    clip : float or None
        Row norm bound, none if None.

    Returns
    -------
    numpy.ndarray
        ``d x d``.
    """
    W = X if transform is None else X @ transform
    if clip is not None:
        norms = np.linalg.norm(W, axis=1)
        scale = np.minimum(1.0, clip / np.maximum(norms, np.finfo(float).tiny))
        W = W * scale[:, None]
    return np.asarray(W.T @ W)


def symmetric_gaussian(d: int, rng: np.random.Generator) -> np.ndarray:
    """A ``d x d`` symmetric matrix whose upper triangle (diagonal included) is iid ``N(0, 1)``."""
    upper = np.triu(rng.standard_normal((d, d)))
    return np.asarray(upper + np.triu(upper, 1).T)


def _eig_desc(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, V = np.linalg.eigh(0.5 * (C + C.T))
    return w[::-1], V[:, ::-1]


def _clip_eigen(C: np.ndarray, top: float) -> np.ndarray:
    """Eigenvalues of a symmetric matrix clipped to ``[0, top]`` (free post-processing)."""
    w, V = _eig_desc(C)
    return np.asarray((V * np.clip(w, 0.0, top)) @ V.T)


def _check_rho(rho: float) -> float:
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be a finite number > 0, got {rho!r}")
    return float(rho)


def gauss_cov(
    S: np.ndarray,
    n: int,
    rho: float,
    rng: np.random.Generator,
    *,
    r: float = 1.0,
    clip_eigen: bool = True,
) -> np.ndarray:
    """Analyze Gauss (Dwork et al. 2014) under ``rho``-zCDP, reference ``GaussCov``.

    ``Sigma + (sqrt(2) r^2 / n) / sqrt(2 rho) W`` with ``W`` :func:`symmetric_gaussian`: the
    upper triangle of ``x x^T - x' x'^T`` has norm at most ``||x x^T - x' x'^T||_F <=
    sqrt(2) r^2``.

    Parameters
    ----------
    S : numpy.ndarray
        ``X^T X / n``.
    n : int
        Number of records.
    rho : float
        zCDP budget.
    rng : numpy.random.Generator
        Noise generator.
    r : float, default 1
        Record norm bound.
    clip_eigen : bool, default True
        Clip the eigenvalues to ``[0, r^2]`` (the reference's ``b_fleig``).

    Returns
    -------
    numpy.ndarray
        ``d x d`` estimate.
    """
    rho = _check_rho(rho)
    sens = math.sqrt(2.0) * r * r / n
    out = S + sens / math.sqrt(2.0 * rho) * symmetric_gaussian(S.shape[0], rng)
    return _clip_eigen(out, r * r) if clip_eigen else np.asarray(out)


def separate_cov(
    S: np.ndarray,
    n: int,
    rho: float,
    rng: np.random.Generator,
    *,
    r: float = 1.0,
    clip_eigen: bool = True,
) -> np.ndarray:
    """SeparateCov (Dong et al. 2022, Alg. 1) under ``rho``-zCDP, reference ``SeparateCov``.

    Eigenvectors ``U~`` of Analyze Gauss at ``rho / 2``; eigenvalues ``lambda(Sigma) +
    (sqrt(2) r^2 / n) / sqrt(rho) z`` (the eigenvalue vector moves by at most
    ``||x x^T - x' x'^T||_F / n``, Hoffman-Wielandt), paired in decreasing order.

    Parameters
    ----------
    S, n, rho, rng, r, clip_eigen
        As in :func:`gauss_cov`.

    Returns
    -------
    numpy.ndarray
        ``d x d`` estimate.
    """
    rho = _check_rho(rho)
    noisy = gauss_cov(S, n, 0.5 * rho, rng, r=r, clip_eigen=False)
    _, U = _eig_desc(noisy)
    lam, _ = _eig_desc(S)
    sens = math.sqrt(2.0) * r * r / n
    lam = lam + sens / math.sqrt(rho) * rng.standard_normal(lam.size)
    if clip_eigen:
        lam = np.clip(lam, 0.0, r * r)
    return np.asarray((U * lam) @ U.T)


def gaussian_tailbound(d: int, beta: float) -> float:
    """Reference ``gaussian_tailbound``: ``P(||z||_2 > bound) <= beta`` for ``z ~ N(0, I_d)``."""
    return math.sqrt(d + 2.0 * math.sqrt(d * math.log(1 / beta)) + 2.0 * math.log(1 / beta))


def wigner_gauss_tailbound(d: int, beta: float) -> float:
    """Reference ``wigner_gauss_tailbound``: a spectral-norm bound of :func:`symmetric_gaussian`."""
    theta = min((math.log(d) / d) ** 0.3, 0.5)
    bound = (1 + theta) * (
        2 * math.sqrt(d) + 6 * math.sqrt(math.log(d)) / math.sqrt(math.log(1 + theta))
    )
    return bound + math.sqrt(2 * math.log(2 / beta))


def wigner_gauss_fnormbound(d: int, beta: float) -> float:
    """Reference ``wigner_gauss_fnormbound``: a Frobenius-norm bound of the same matrix."""
    return math.sqrt(
        d * d
        + 2.0 * math.sqrt(d * math.log(2.0 / beta)) * (1 + math.sqrt(2 * (d - 1)))
        + 6 * math.log(2.0 / beta)
    )


def _norm_bins(norms: np.ndarray, t: int) -> np.ndarray:
    """Reference ``get_bincounts``: bin ``l >= 1`` counts norms in ``(2^-l, 2^(1-l)]``."""
    counts = np.zeros(t)
    positive = norms[norms > 0]
    level = -np.floor(np.log2(positive)).astype(np.int64)
    level = np.where(positive > np.exp2(-level.astype(float)), level, level + 1)
    level = np.maximum(level, 1)
    level = level[level < t]
    np.add.at(counts, level, 1.0)
    return counts


def _sparse_vector(queries: np.ndarray, epsilon: float, rng: np.random.Generator) -> int:
    """Reference ``SVT`` with threshold 0: the first index whose noisy query clears it."""
    threshold = rng.laplace(scale=2.0 / epsilon)
    for i, q in enumerate(queries):
        if q + rng.laplace(scale=4.0 / epsilon) >= threshold:
            return i
    return int(queries.size)


def adaptive_cov(
    records: Records, rho: float, rng: np.random.Generator, *, beta: float = 0.1, r: float = 1.0
) -> np.ndarray:
    """AdaptiveCov (Dong et al. 2022, Alg. 3) under ``rho``-zCDP, reference ``AdaptiveCov``.

    Spends ``rho / 8`` on a noisy trace, ``rho / 8`` (as ``epsilon = sqrt(rho) / 2`` of the
    sparse vector technique) on a clipping radius ``2^-k`` from the histogram of the record
    norms, and ``3 rho / 4`` on :func:`gauss_cov` or :func:`separate_cov` of the clipped records,
    whichever its error bound (at failure probability ``beta``) favours.

    Parameters
    ----------
    records : Records
        The data.
    rho : float
        zCDP budget.
    rng : numpy.random.Generator
        Noise generator.
    beta : float, default 0.1
        Failure probability of the error bounds (the reference's default).
    r : float, default 1
        Record norm bound.

    Returns
    -------
    numpy.ndarray
        ``d x d`` estimate.
    """
    rho = _check_rho(rho)
    n, d = records.n, records.d
    S = records.gram() / n
    factor = math.sqrt(8.0 / rho * math.log(8.0 / beta))
    tr = float(np.trace(S)) + r * r * (
        2.0 / math.sqrt(rho) / n * rng.standard_normal() + factor / n
    )
    tr = max(min(tr, r), 1e-16)
    rho1, beta1 = 0.75 * rho, 0.75 * beta
    eta = gaussian_tailbound(d, 0.5 * beta1)
    nu = wigner_gauss_tailbound(d, 0.5 * beta1)
    omega = wigner_gauss_fnormbound(d, beta1)
    sep1 = 2**1.25 * math.sqrt(tr) / math.sqrt(n) / rho1**0.25 * math.sqrt(nu) / 6.0
    sep2 = math.sqrt(2.0) * eta / math.sqrt(rho1) / n
    gauss1 = omega / math.sqrt(rho1) / n
    k1 = int(math.log2(r))
    t = k1 + min(d * n, -int(math.log2(1e-24))) + 1
    counts = _norm_bins(records.norms(), t)
    parts = np.exp2(2.0 * (k1 - np.arange(t)) + 2.0)
    queries = np.empty(t)
    for level in range(t):
        k = k1 - level
        i = level + 1
        bias = (float(counts[:i] @ parts[:i]) - float(counts[:i].sum()) * 2.0 ** (2 * k)) / n
        noise = min(2.0**k * gauss1, 2.0**k * sep1 + 2.0 ** (2 * k) * sep2)
        queries[level] = n * (bias - noise) / (r * r)
    k2 = k1 - _sparse_vector(queries, math.sqrt(rho) / 2.0, rng)
    radius = min(2.0 ** (k2 + 1), r)
    clipped = S if radius >= r else records.gram(clip=radius) / n
    sep = 2.0**k2 * sep1 + 2.0 ** (2 * k2) * sep2
    gauss = 2.0 ** (2 * k2) * gauss1
    estimator = gauss_cov if sep >= gauss else separate_cov
    return estimator(clipped, n, rho1, rng, r=radius, clip_eigen=True)


def coinpress_cov(
    records: Records,
    rho: float,
    rng: np.random.Generator,
    *,
    steps: int = 2,
    u: float = 1.0,
) -> np.ndarray:
    """CoinPress covariance (Biswas et al. 2020, Alg. 2) under ``rho``-zCDP, reference ``cov_est``.

    Starting from ``A = I / sqrt(u)`` (``Sigma <= u I``), each step clips the whitened records
    ``A^T x_i`` to the Gaussian tail radius ``gamma``, adds a symmetric Gaussian matrix of
    variance ``gamma^4 / (rho_j n^2)`` to their second moment, projects it onto the PSD cone and
    re-whitens. The budget is split ``1/4, 3/4`` over two steps (the split of the authors'
    notebooks), evenly otherwise.

    Parameters
    ----------
    records : Records
        The data.
    rho : float
        zCDP budget.
    rng : numpy.random.Generator
        Noise generator.
    steps : int, default 2
        Number of steps ``t``.
    u : float, default 1
        Upper bound on the eigenvalues of ``Sigma``.

    Returns
    -------
    numpy.ndarray
        ``d x d`` estimate.
    """
    rho = _check_rho(rho)
    if steps < 1:
        raise ValueError(f"CoinPress needs at least one step, got {steps}")
    shares = [0.25, 0.75] if steps == 2 else [1.0 / steps] * steps
    n, d = records.n, records.d
    gamma = gaussian_tailbound(d, 0.1)
    eta = 0.5 * (2.0 * math.sqrt(d / n) + d / n)
    A = np.eye(d) / math.sqrt(u)
    Z = np.zeros((d, d))
    for j, share in enumerate(shares):
        Z = records.gram(transform=A, clip=gamma) / n
        Z = Z + math.sqrt(gamma**4 / (share * rho * n * n)) * symmetric_gaussian(d, rng)
        w, V = _eig_desc(Z)
        Z = (V * np.maximum(w, 0.0)) @ V.T
        if j < len(shares) - 1:
            w_u, V_u = np.linalg.eigh(Z + eta * np.eye(d))
            A = ((V_u / np.sqrt(w_u)) @ V_u.T) @ A
    A_inv = np.linalg.inv(A)
    return np.asarray(A_inv.T @ Z @ A_inv)


def advanced_composition_epsilon(epsilon: float, k: int, delta: float) -> float:
    """Per-step ``epsilon_0`` whose ``k``-fold advanced composition is ``(epsilon, delta)``.

    The root of ``sqrt(2 k log(1/delta)) e0 + k e0 (e^e0 - 1) = epsilon`` with ``e^e0 - 1``
    replaced by ``e0`` (the reference's ``convert_eps``), which solves a quadratic.

    Parameters
    ----------
    epsilon : float
        Total epsilon of the composition.
    k : int
        Number of steps.
    delta : float
        Its delta.

    Returns
    -------
    float
        ``epsilon_0``.
    """
    b = math.sqrt(2.0 * k * math.log(1.0 / delta))
    return (-b + math.sqrt(b * b + 4.0 * k * epsilon)) / (2.0 * k)


def em_cov(
    S: np.ndarray,
    n: int,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    clip_eigen: bool = True,
) -> np.ndarray:
    """Amin et al. (2019), Alg. 1, under ``(epsilon, delta)``-DP, reference ``EMCov``.

    Half the budget releases the eigenvalues of ``C = X^T X`` with Laplace noise of scale
    ``2 / (epsilon / 2)``; the other half draws ``d`` eigenvectors one by one, the ``i``-th from
    the density ``exp((epsilon_0 / 4) u^T C_i u)`` on the unit sphere of the complement of the
    ones drawn (a Bingham law, :func:`mvg_dask_lab.baselines.bingham.sample_bingham`), with
    ``epsilon_0`` from :func:`advanced_composition_epsilon`.

    Parameters
    ----------
    S : numpy.ndarray
        ``X^T X / n``.
    n : int
        Number of records.
    epsilon, delta : float
        Privacy parameters.
    rng : numpy.random.Generator
        Noise generator.
    clip_eigen : bool, default True
        Clip the eigenvalues of ``C`` to ``[0, n]``.

    Returns
    -------
    numpy.ndarray
        ``d x d`` estimate.
    """
    if not (math.isfinite(epsilon) and epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon!r}, {delta!r}")
    d = S.shape[0]
    C = S * n
    eps0 = 0.5 * epsilon
    lam, _ = _eig_desc(C)
    lam = lam + rng.laplace(scale=2.0 / eps0, size=d)
    if clip_eigen:
        lam = np.clip(lam, 0.0, float(n))
    step = advanced_composition_epsilon(eps0, d, delta)
    theta = np.zeros((d, d))
    P = np.eye(d)
    Ci = C
    for i in range(d):
        u = sample_bingham(-(step / 4.0) * Ci, rng, 1)[0]
        theta[i] = P @ u
        if i < d - 1:
            P = linalg.null_space(theta[: i + 1])
            Ci = P.T @ C @ P
    return np.asarray((theta.T * lam) @ theta / n)
