"""Samplers for the matrix-variate Gaussian ``MVG_{m,n}(0, Sigma, Psi)``.

The affine sampler (MVG Lemma 7) is the production path; the Kronecker sampler (MVG Lemma 6,
``vec(Z) ~ N(0, Psi kron Sigma)``) is a test oracle for small shapes.
"""

from __future__ import annotations

import numpy as np


def sqrt_factor(directions: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """``B = W diag(sqrt(v))`` so that ``B B^T = W diag(v) W^T``.

    Parameters
    ----------
    directions : ndarray
        ``W``, ``m x m`` with orthonormal columns.
    variances : ndarray
        ``v``, positive.

    Returns
    -------
    ndarray
        ``B``.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Sec. 6.3.2 (step 2).
    """
    return np.asarray(directions, float) * np.sqrt(np.asarray(variances, float))[None, :]


def affine_sample(
    normals: np.ndarray, row_factor: np.ndarray, col_factor: np.ndarray | None = None
) -> np.ndarray:
    """Affine MVG sample ``Z = B_Sigma N B_Psi^T`` from iid standard normals ``N``.

    Parameters
    ----------
    normals : ndarray
        ``N``, ``m x n`` iid ``N(0, 1)`` (from the keyed generator).
    row_factor : ndarray
        ``B_Sigma`` (``m x m``).
    col_factor : ndarray, optional
        ``B_Psi`` (``n x n``); ``None`` means ``Psi = I`` (unimodal noise, Alg. 1).

    Returns
    -------
    ndarray
        ``Z ~ MVG_{m,n}(0, B_Sigma B_Sigma^T, B_Psi B_Psi^T)``.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Lemma 7.
    """
    Z = row_factor @ normals
    if col_factor is not None:
        Z = Z @ col_factor.T
    return np.asarray(Z)


def sample_mvg(
    rng: np.random.Generator,
    row_factor: np.ndarray,
    col_factor: np.ndarray | None,
    n: int | None = None,
) -> np.ndarray:
    """Draw one MVG sample with an explicit generator (affine method).

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of the iid normals.
    row_factor : ndarray
        ``B_Sigma``.
    col_factor : ndarray or None
        ``B_Psi`` or ``None`` for ``Psi = I_n``.
    n : int, optional
        Number of columns when ``col_factor`` is None.

    Returns
    -------
    ndarray
        ``m x n`` sample.
    """
    m = row_factor.shape[0]
    if col_factor is None:
        if n is None:
            raise ValueError("n is required when Psi = I")
        cols = n
    else:
        cols = col_factor.shape[0]
    return affine_sample(rng.standard_normal((m, cols)), row_factor, col_factor)


def kronecker_sample(
    rng: np.random.Generator, Sigma: np.ndarray, Psi: np.ndarray, size: int = 1
) -> np.ndarray:
    """Oracle sampler: ``vec(Z) ~ N(0, Psi kron Sigma)`` (column-major ``vec``).

    Parameters
    ----------
    rng : numpy.random.Generator
        Explicit generator.
    Sigma, Psi : ndarray
        Row (``m x m``) and column (``n x n``) covariances.
    size : int, default 1
        Number of samples.

    Returns
    -------
    ndarray
        ``size x m x n`` samples.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Lemma 6.
    """
    m, n = Sigma.shape[0], Psi.shape[0]
    cov = np.kron(Psi, Sigma)
    v = rng.multivariate_normal(np.zeros(m * n), cov, size=size, method="eigh")
    return np.asarray(v.reshape(size, n, m).transpose(0, 2, 1))
