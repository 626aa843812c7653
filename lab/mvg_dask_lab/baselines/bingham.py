"""PPCA: the exponential mechanism for the first principal component (a Bingham sampler).

Chaudhuri, Sarwate and Sinha's PPCA releases a unit vector ``v`` drawn with density

    ``f(v) proportional to exp((epsilon / 2) v^T G v)`` on the unit sphere,

where ``G = sum_i x_i x_i^T`` over records scaled to ``||x_i|| <= 1`` (their
``(n epsilon / 2) v^T A v`` with ``A = G / n``). The score ``v^T G v`` changes by at most 1 when
one record is replaced, so this is the exponential mechanism and ``epsilon``-DP (``delta = 0``).
The law is a Bingham distribution, ``exp(-v^T B v)`` with ``B = (epsilon/2)(lambda_max I - G)``
(PSD, smallest eigenvalue 0).

Sampler: exact rejection from an angular central Gaussian envelope (Kent, Ganeiber & Mardia 2013),
the algorithm diffprivlib's ``Bingham`` mechanism implements. It is written here, vectorised and
fed by the package's keyed generator, because neither diffprivlib 0.6.6 nor its fork
``diffprivlib-fix`` 0.6.7 imports with scikit-learn 1.9 (``ImportError: cannot import name
'DOUBLE' from 'sklearn.tree._tree'``, checked in this project's environment); their ``Bingham``
also takes an integer seed or a ``RandomState`` only, and scales the score by
``epsilon / (4 sensitivity)``, half the exponent of PPCA's calibration.

References
----------
.. [1] K. Chaudhuri, A. D. Sarwate, K. Sinha, "Near-optimal Differentially Private Principal
   Components", NIPS 2012, Algorithm 1 (PPCA) and Thm. 4 (its ``k = 1`` case).
.. [2] J. T. Kent, A. M. Ganeiber, K. V. Mardia, "A new method to simulate the Bingham and related
   distributions in directional data analysis with applications", arXiv:1310.8110 (2013).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

__all__ = ["PPCA", "acg_parameter", "ppca", "sample_bingham"]

_BATCH_MIN = 64


def acg_parameter(eigenvalues: np.ndarray) -> float:
    """The envelope parameter ``b``: the root in ``[1, q]`` of ``sum_i 1/(b + 2 lambda_i) = 1``.

    Parameters
    ----------
    eigenvalues : numpy.ndarray
        Eigenvalues ``lambda_i >= 0`` of ``B`` (smallest 0), ``q`` of them.

    Returns
    -------
    float
        ``b`` (``q`` when ``B = 0``: the uniform distribution).
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    q = lam.size
    if np.all(lam == 0):
        return float(q)

    def excess(b: float) -> float:
        return float(np.sum(1.0 / (b + 2.0 * lam))) - 1.0

    return float(optimize.brentq(excess, 1.0, float(q), xtol=1e-14, rtol=1e-14))


def sample_bingham(B: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """Exact draws from the Bingham density ``exp(-x^T B x)`` on the unit sphere.

    Proposal ``y ~ N(0, Omega^-1)``, ``x = y / ||y||`` (angular central Gaussian) with
    ``Omega = I + 2 B / b``; accept with probability
    ``exp(-x^T B x) (x^T Omega x)^(q/2) exp((q - b)/2) (b/q)^(q/2)``, which is at most 1.

    Parameters
    ----------
    B : numpy.ndarray
        Symmetric PSD ``q x q`` matrix (it is shifted so that its smallest eigenvalue is 0,
        which leaves the law unchanged).
    rng : numpy.random.Generator
        Keyed generator.
    size : int
        Number of draws.

    Returns
    -------
    numpy.ndarray
        Shape ``(size, q)``, unit vectors (the sign is uniform: the law is antipodally symmetric).

    References
    ----------
    .. [1] Kent, Ganeiber, Mardia (2013), Sec. 4.
    """
    B = np.asarray(B, dtype=np.float64)
    q = B.shape[0]
    lam, vecs = np.linalg.eigh(0.5 * (B + B.T))
    lam = np.maximum(lam - lam[0], 0.0)
    b = acg_parameter(lam)
    omega = 1.0 + 2.0 * lam / b  # eigenvalues of Omega, in B's eigenbasis
    log_m = 0.5 * (q - b) + 0.5 * q * math.log(b / q)
    out = np.empty((size, q))
    filled = 0
    while filled < size:
        batch = max(_BATCH_MIN, 2 * (size - filled))
        y = rng.standard_normal((batch, q)) / np.sqrt(omega)
        x = y / np.linalg.norm(y, axis=1, keepdims=True)
        quad_b = (x * x) @ lam
        quad_o = (x * x) @ omega
        log_accept = -quad_b + 0.5 * q * np.log(quad_o) + log_m
        accepted = x[np.log(rng.random(batch)) < log_accept]
        take = min(accepted.shape[0], size - filled)
        out[filled : filled + take] = accepted[:take]
        filled += take
    return np.asarray(out @ vecs.T)


@dataclass(frozen=True, kw_only=True)
class PPCA:
    """Chaudhuri-Sarwate-Sinha's PPCA for the first principal component (``epsilon``-DP).

    Attributes
    ----------
    epsilon : float
        Privacy parameter (``delta = 0``).
    record_norm : float
        Largest record norm ``max ||x||``; records are divided by it.
    """

    epsilon: float
    record_norm: float

    @property
    def delta(self) -> float:
        """Always 0: PPCA is pure ``epsilon``-DP."""
        return 0.0

    def bingham_matrix(self, gram: np.ndarray) -> np.ndarray:
        """``B = (epsilon/2)(lambda_max I - G)`` for the raw Gram ``X X^T`` (records as columns)."""
        g = np.asarray(gram, dtype=np.float64) / self.record_norm**2
        lam_max = float(np.linalg.eigvalsh(g)[-1])
        return 0.5 * self.epsilon * (lam_max * np.eye(g.shape[0]) - g)

    def sample(self, gram: np.ndarray, rng: np.random.Generator, trials: int) -> np.ndarray:
        """Draw ``trials`` private first principal components of the Gram ``X X^T``.

        Parameters
        ----------
        gram : numpy.ndarray
            ``d x d`` Gram matrix of the raw records.
        rng : numpy.random.Generator
            Keyed generator.
        trials : int
            Number of independent releases.

        Returns
        -------
        numpy.ndarray
            Shape ``(trials, d)``, unit vectors.
        """
        return sample_bingham(self.bingham_matrix(gram), rng, trials)


def ppca(*, epsilon: float, record_norm: float) -> PPCA:
    """Calibrate PPCA.

    Parameters
    ----------
    epsilon : float
        Privacy parameter.
    record_norm : float
        Declared ``max ||x||`` of a record (for a box ``[l, u]^d``, ``||max(|l|, |u|)||``).

    Returns
    -------
    PPCA
        The mechanism.

    References
    ----------
    .. [1] Chaudhuri, Sarwate, Sinha, NIPS 2012, Algorithm 1.
    """
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
    if not record_norm > 0:
        raise ValueError(f"record_norm must be positive, got {record_norm}")
    return PPCA(epsilon=float(epsilon), record_norm=float(record_norm))
