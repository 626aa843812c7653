"""Post-processing estimators computed from a release and its (public) noise plan.

Post-processing never costs privacy: these functions use only the released values and the
plan, never the data.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from mvg_dask.plan.noise_plan import NoisePlan


def identity_noise_gram(plan: NoisePlan) -> np.ndarray:
    """``E[Z Z^T]`` of the noise of an identity release (an ``m x n`` matrix ``Z``).

    Unimodal noise ``Z = B N`` with ``N`` an ``m x n`` iid ``N(0, 1)`` matrix:
    ``E[Z Z^T] = B E[N N^T] B^T = n Sigma`` (``E[N N^T] = n I_m``). Equi-modal noise
    ``Z = B N B^T`` (square queries): ``E[Z Z^T] = B E[N Psi N^T] B^T = tr(Psi) Sigma``.

    Parameters
    ----------
    plan : NoisePlan
        The plan of an identity release.

    Returns
    -------
    ndarray
        ``m x m``.
    """
    if plan.query.kind != "identity":
        raise ValueError(f"this needs the plan of an identity release, got {plan.query.kind!r}")
    Sigma = plan.row_cov
    n = plan.shape[1]
    psi = plan.col_cov
    trace = float(n) if psi is None else float(np.trace(psi))
    return np.asarray(trace * Sigma)


def covariance_from_identity(Y: Any, plan: NoisePlan) -> Any:
    """Unbiased estimate of ``X X^T / N`` from an identity release ``Y = X + Z``.

    ``E[Y Y^T] = X X^T + E[Z Z^T]`` (``E[Z] = 0``, ``Z`` independent of ``X``), so
    ``(Y Y^T - E[Z Z^T]) / N`` is unbiased, with ``E[Z Z^T] = N Sigma`` for unimodal noise
    (:func:`identity_noise_gram`): the estimate is ``Y Y^T / N - Sigma``. It is symmetric but
    may be indefinite.

    Parameters
    ----------
    Y : array_like
        The released ``m x N`` matrix (features x records); numpy or dask (``Y @ Y.T`` must be
        defined; a dask array gives a lazy result).
    plan : NoisePlan
        Its noise plan.

    Returns
    -------
    array_like
        ``m x m`` unbiased estimate of ``X X^T / N``.
    """
    noise_gram = identity_noise_gram(plan)
    m, n = plan.shape
    if tuple(Y.shape) != (m, n):
        raise ValueError(
            f"the release is {tuple(Y.shape)} but its plan describes an {m} x {n} identity query"
        )
    return (Y @ Y.T) / n - noise_gram / n


def psd_projection(C: np.ndarray) -> np.ndarray:
    """The positive semidefinite matrix nearest to a released covariance in Frobenius norm.

    The symmetric part ``(C + C^T) / 2`` with its negative eigenvalues set to 0 (Higham 1988,
    Theorem 2.1). Post-processing: it never costs privacy. It helps where the noise dominates
    the small eigenvalues (the negative ones are pure noise) and never moves the matrix farther
    from a PSD truth in Frobenius norm (a projection onto a convex set containing it).

    Parameters
    ----------
    C : ndarray
        ``m x m``.

    Returns
    -------
    ndarray
        ``m x m``, symmetric PSD.

    References
    ----------
    .. [1] N. J. Higham, "Computing a nearest symmetric positive semidefinite matrix", Linear
       Algebra Appl. 103 (1988), 103-118.
    """
    w, V = _symmetric_eigh(C)
    return _from_eigen(np.maximum(w, 0.0), V)


def _symmetric_eigh(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues and eigenvectors of the symmetric part of a square matrix."""
    S = np.asarray(C, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"needs a square matrix, got shape {S.shape}")
    w, V = np.linalg.eigh((S + S.T) / 2.0)
    return w, V


def _from_eigen(w: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``V diag(w) V^T``, exactly symmetric."""
    out = (V * w) @ V.T
    return np.asarray((out + out.T) / 2.0)


def spiked_shrinkage(
    C: np.ndarray, off_diagonal_std: float, *, bulk: Literal["zero", "mean"] = "zero"
) -> np.ndarray:
    """Eigenvalue shrinkage of a released covariance for a spiked (low-rank) truth.

    The published noise ``W`` of a covariance release with homogeneous noise is symmetric with
    independent entries of std ``s`` off the diagonal (the plan's, public). Its spectrum fills
    ``[-2 sigma, 2 sigma]``, ``sigma = s sqrt(m)`` (Wigner's semicircle); an eigenvalue ``theta``
    of the truth above ``sigma`` appears at ``lambda = theta + sigma^2 / theta`` with its
    eigenvector's squared overlap ``1 - sigma^2 / theta^2`` (the spiked Wigner model; Benaych-
    Georges and Nadakuditi 2011). The Frobenius-optimal shrinker keeps the eigenvectors and maps
    ``lambda > 2 sigma`` to ``theta (1 - sigma^2 / theta^2)`` with
    ``theta = (lambda + sqrt(lambda^2 - 4 sigma^2)) / 2``, and every other eigenvalue to 0
    (Donoho, Gavish and Johnstone 2018 derive these shrinkers for the spiked covariance
    model). It helps a spiked spectrum (a few eigenvalues far above the noise's edge); on a
    flat full-rank spectrum it biases every eigenvalue down and can be farther from the truth
    than the raw release or :func:`psd_projection`: never apply it without looking at the
    spectrum. ``bulk="mean"`` is for a truth with a few spikes above an isotropic floor ``tau I``
    (the spiked covariance model): the bulk is then a semicircle around ``tau``, estimated as
    the mean of the eigenvalues within ``2 sigma`` of it (at least 0, found by fixed-point
    iteration from the median); the spikes are shrunk
    above it and the bulk set to it, which keeps the bulk's trace (the noise hardly moves it).

    Parameters
    ----------
    C : ndarray
        The released ``m x m`` covariance.
    off_diagonal_std : float
        ``s``, the std of every off-diagonal entry of the published noise.
    bulk : {"zero", "mean"}, default "zero"
        What the eigenvalues below the noise edge become.

    Returns
    -------
    ndarray
        ``m x m``, symmetric PSD.

    References
    ----------
    .. [1] F. Benaych-Georges, R. R. Nadakuditi, "The eigenvalues and eigenvectors of finite,
       low rank perturbations of large random matrices", Adv. Math. 227 (2011), 494-521.
    .. [2] D. L. Donoho, M. Gavish, I. M. Johnstone, "Optimal shrinkage of eigenvalues in the
       spiked covariance model", Ann. Statist. 46(4) (2018), 1742-1778.
    """
    if not (off_diagonal_std > 0 and np.isfinite(off_diagonal_std)):
        raise ValueError(f"the noise std must be positive and finite, got {off_diagonal_std!r}")
    if bulk not in ("zero", "mean"):
        raise ValueError(f"bulk must be 'zero' or 'mean', got {bulk!r}")
    w, V = _symmetric_eigh(C)
    sigma = float(off_diagonal_std) * np.sqrt(w.size)
    floor = 0.0
    spike = w > 2.0 * sigma
    if bulk == "mean":
        # the bulk is a semicircle of radius 2 sigma around the floor: start from the median
        # (the spikes are few), then the mean of the bulk, and the bulk again
        floor = max(float(np.median(w)), 0.0)
        for _ in range(3):
            spike = w - floor > 2.0 * sigma
            if np.all(spike):
                break
            floor = max(float(np.mean(w[~spike])), 0.0)
        spike = w - floor > 2.0 * sigma
    out = np.full_like(w, floor)
    lam = w[spike] - floor
    theta = (lam + np.sqrt(lam * lam - 4.0 * sigma * sigma)) / 2.0
    out[spike] = floor + theta - sigma * sigma / theta
    return _from_eigen(out, V)


def identity_shrinkage(C: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Linear shrinkage of a released covariance toward a multiple of the identity, with the
    noise's public std, then the PSD projection.

    With ``C = S + W`` (``W`` the published noise, entries independent up to symmetry, of std
    ``s_ij``), ``D = C - (tr C / m) I`` has ``E ||D||_F^2 = ||S - (tr S / m) I||_F^2 + nu`` where
    ``nu = E ||W - (tr W / m) I||_F^2 = sum_ij s_ij^2 - sum_i s_ii^2 / m``. The estimate is
    ``(tr C / m) I + beta D`` with ``beta = max(||D||_F^2 - nu, 0) / ||D||_F^2``, the
    James-Stein estimate of the Frobenius-optimal factor ``signal / (signal + noise)``, projected
    onto the PSD cone (:func:`psd_projection`). It keeps the trace, which the noise hardly moves,
    and damps the rest in proportion to how much of it is noise: it helps a flat or full-rank
    spectrum where the noise dominates, and changes little where the noise is small. A spiked
    spectrum is better served by :func:`spiked_shrinkage`. With dense or DP-PCA directions the
    entries' noises are correlated and ``nu`` is an approximation.

    Parameters
    ----------
    C : ndarray
        The released ``m x m`` covariance.
    std : ndarray
        The ``m x m`` std of its noise (the plan's ``released_entry_std()``).

    Returns
    -------
    ndarray
        ``m x m``, symmetric PSD.
    """
    S = np.asarray(C, dtype=np.float64)
    S = 0.5 * (S + S.T)
    m = S.shape[0]
    s = np.broadcast_to(np.asarray(std, dtype=np.float64), S.shape)
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("the noise std must be finite and non-negative")
    mu = float(np.trace(S)) / m
    D = S - mu * np.eye(m)
    d2 = float(np.sum(D * D))
    nu = float(np.sum(s * s) - np.sum(np.diag(s) ** 2) / m)
    beta = max(d2 - nu, 0.0) / d2 if d2 > 0 else 0.0
    return psd_projection(mu * np.eye(m) + beta * D)


def correlation_with_std(C: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Correlations ``C_ij / sqrt(C_ii C_jj)`` of a released covariance and their approximate
    standard deviations (the delta method, entries' noises independent).

    ``d r_ij = dC_ij / sqrt(C_ii C_jj) - r_ij (dC_ii / C_ii + dC_jj / C_jj) / 2``, so
    ``Var r_ij ~ s_ij^2 / (C_ii C_jj) + r_ij^2 (s_ii^2 / C_ii^2 + s_jj^2 / C_jj^2) / 4`` with
    ``s`` the published noise's std. Exact to first order when the noises of ``C_ij``, ``C_ii``
    and ``C_jj`` are independent (standard directions); an approximation otherwise, and poor
    where the noise is not small against ``C_ii`` (a diagonal entry at most 0 gives ``nan``).

    Parameters
    ----------
    C : ndarray
        The released ``m x m`` covariance.
    std : ndarray
        The ``m x m`` std of its noise.

    Returns
    -------
    tuple of ndarray
        ``(r, std_r)``, ``m x m``; the diagonal is 1 with std 0.
    """
    S = np.asarray(C, dtype=np.float64)
    s = np.broadcast_to(np.asarray(std, dtype=np.float64), S.shape)
    d = np.diag(S).copy()
    d[~(d > 0)] = np.nan
    root = np.sqrt(d)
    r = S / np.outer(root, root)
    sd = np.diag(s)
    var = (s / np.outer(root, root)) ** 2 + r * r * (
        (sd / d)[:, None] ** 2 + (sd / d)[None, :] ** 2
    ) / 4.0
    std_r = np.sqrt(var)
    ok = np.isfinite(d)
    idx = np.flatnonzero(ok)
    r[idx, idx] = 1.0
    std_r[idx, idx] = 0.0
    return r, std_r
