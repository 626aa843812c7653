"""Noise directions: the standard basis, an explicit orthonormal matrix, or DP-PCA.

DP-PCA is *Analyze Gauss* (Dwork, Talwar, Thakurta, Zhang, STOC 2014): symmetric Gaussian noise on
the Gram matrix ``X X^T`` of the clipped records (upper triangle iid, mirrored), then an
eigendecomposition; the top-``k`` eigenvectors are the important directions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import symmetric_normals
from mvg_dask.plan.covariance import CovarianceKind, NoiseCovariance, covariance_of
from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.privacy import sensitivity as sens

ORTHONORMAL_TOL = 1e-8


def check_orthonormal(W: np.ndarray, m: int, *, tol: float = ORTHONORMAL_TOL) -> np.ndarray:
    """Validate an ``m x m`` matrix with orthonormal columns.

    Parameters
    ----------
    W : array_like
        Candidate direction matrix (directions are its columns).
    m : int
        Expected size.
    tol : float
        Largest allowed ``max |W^T W - I|``.

    Returns
    -------
    ndarray
        ``W`` as float64.
    """
    arr = np.asarray(W, dtype=np.float64)
    if arr.shape != (m, m):
        raise ValueError(f"direction matrix must be {m} x {m}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("direction matrix must be finite")
    err = float(np.max(np.abs(arr.T @ arr - np.eye(m))))
    if err > tol:
        raise ValueError(
            f"direction matrix is not orthonormal: max |W^T W - I| = {err:.3g} > {tol:g}; "
            "orthonormalise it (e.g. numpy.linalg.qr) or use method: standard"
        )
    return arr


@dataclass(frozen=True, eq=False)
class Directions:
    """Chosen noise directions.

    Attributes
    ----------
    method : str
        ``"standard"``, ``"matrix"`` or ``"dp-pca"``.
    matrix : ndarray
        ``W`` (``m x m``, orthonormal columns); or, in the low-rank form (:meth:`low_rank`),
        the ``m x k`` top directions ``U``, the complement being every direction orthogonal to
        them, all with one noise variance (``Sigma = v_c I + U diag(v_U - v_c) U^T``). The
        standard basis is formed only when asked for (a property): planning, sampling and
        writing take O(m) paths for it, so a release of ``m`` features holds no ``m x m``
        identity (3.2 GB at 20,000 features).
    important : tuple of int
        Indices of the directions flagged important (DP-PCA: the top ``k``).
    eigenvalues : ndarray or None
        DP-PCA's noisy eigenvalues of ``X X^T / N`` along each direction (for max-PNR).
    """

    method: str
    _matrix: np.ndarray | None
    important: tuple[int, ...] = ()
    eigenvalues: np.ndarray | None = field(default=None)
    _dim: int = 0  # m of the standard basis (``_matrix`` is None)

    @classmethod
    def standard(cls, m: int, important: tuple[int, ...] = ()) -> Directions:
        """The standard basis (``W = I``, not formed: see :attr:`matrix`)."""
        return cls("standard", None, tuple(important), None, int(m))

    @property
    def matrix(self) -> np.ndarray:
        """``W``, or ``U`` of the low-rank form; the standard basis is formed on first use."""
        if self._matrix is None:
            object.__setattr__(self, "_matrix", np.eye(self._dim))
        assert self._matrix is not None
        return self._matrix

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of :attr:`matrix` (``m x m``, or ``m x k`` low-rank), without forming it."""
        if self._matrix is None:
            return (self._dim, self._dim)
        m, k = self._matrix.shape
        return (int(m), int(k))

    @classmethod
    def from_matrix(cls, W: np.ndarray, important: tuple[int, ...] = ()) -> Directions:
        """An explicit orthonormal matrix (validated)."""
        arr = np.asarray(W, dtype=np.float64)
        return cls("matrix", check_orthonormal(arr, arr.shape[0]), tuple(important))

    @classmethod
    def low_rank(
        cls,
        U: np.ndarray,
        important: tuple[int, ...] = (),
        eigenvalues: np.ndarray | None = None,
        *,
        method: str = "dp-pca",
    ) -> Directions:
        """The top ``k`` directions ``U`` (``m x k``, orthonormal columns, ``k < m``) and their
        orthogonal complement, kept implicit: no ``m x m`` matrix (validated in O(m k^2)).

        Parameters
        ----------
        U : ndarray
            ``m x k`` with orthonormal columns.
        important : tuple of int
            Important directions (indices below ``k``).
        eigenvalues : ndarray, optional
            DP-PCA's noisy eigenvalues along the ``k`` directions.
        method : str
            ``"dp-pca"`` (default) or ``"matrix"``.

        Returns
        -------
        Directions
            Directions with :attr:`is_low_rank`.
        """
        arr = np.asarray(U, dtype=np.float64)
        if arr.ndim != 2 or not 1 <= arr.shape[1] < arr.shape[0]:
            raise ValueError(f"low-rank directions must be m x k with 1 <= k < m, got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("direction matrix must be finite")
        k = arr.shape[1]
        err = float(np.max(np.abs(arr.T @ arr - np.eye(k))))
        if err > ORTHONORMAL_TOL:
            raise ValueError(
                f"low-rank directions are not orthonormal: max |U^T U - I| = {err:.3g}"
            )
        if any(not 0 <= i < k for i in important):
            raise ValueError(f"important directions of a low-rank set must lie in 0..{k - 1}")
        return cls(method, arr, tuple(important), eigenvalues)

    @property
    def dim(self) -> int:
        """``m``, the dimension the directions live in."""
        return self.shape[0]

    @property
    def is_low_rank(self) -> bool:
        """True for the low-rank form (``matrix`` is ``m x k``, ``k < m``)."""
        m, k = self.shape
        return k < m

    @property
    def is_standard(self) -> bool:
        """True when ``W`` is the identity (``Sigma`` is then diagonal: the plan's math and the
        sampler take their O(m) and O(m^2) paths)."""
        if self.method == "standard":
            return True
        if self.is_low_rank:
            return False
        W = self.matrix
        return bool(np.all(np.diagonal(W) == 1.0) and np.count_nonzero(W) == W.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (a noise plan's ``directions``; the standard basis is not
        written out)."""
        eig = self.eigenvalues
        return {
            "method": self.method,
            "important": list(self.important),
            "matrix": None if self.is_standard else self.matrix.tolist(),
            "eigenvalues": None if eig is None else np.asarray(eig).tolist(),
        }

    @property
    def covariance_kind(self) -> CovarianceKind:
        """The form of a noise covariance along these directions: ``diagonal`` (standard),
        ``low-rank`` or ``dense``."""
        if self.is_standard:
            return "diagonal"
        return "low-rank" if self.is_low_rank else "dense"

    def covariance(self, variances: np.ndarray) -> NoiseCovariance:
        """The noise covariance ``Sigma = W diag(v) W^T`` along these directions, typed by its
        form (:mod:`mvg_dask.plan.covariance`): the one place the form is chosen.

        Parameters
        ----------
        variances : ndarray
            ``v``, the ``m`` variances (low rank: ``k`` along ``U``, then the complement's).

        Returns
        -------
        NoiseCovariance
            :class:`~mvg_dask.plan.covariance.Diagonal`, ``LowRank`` or ``Dense``.
        """
        kind = self.covariance_kind
        return covariance_of(kind, None if kind == "diagonal" else self.matrix, variances)


def vech_sensitivity(domain: RecordDomain, neighbours: Neighbours, *, ratio: float = 1.0) -> float:
    """Sensitivity of the half-vectorised Gram matrix ``X X^T`` under symmetric iid noise.

    ``sup sqrt(sum_{i<j} D_ij^2 + r sum_i D_ii^2)`` over ``D = x x^T - x' x'^T`` (replace-one)
    or ``D = x x^T`` (add/remove): each off-diagonal entry counted once. With ``r = 1`` it is the
    L2 sensitivity of ``vech(X X^T)``, the right calibration of Analyze Gauss (upper triangle
    iid, mirrored). Proof: docs/bounds.md, Thm. 1 and 2 with ``y = x`` (Cor. 4). Examples:
    ``[-1, 1]^4``: ``4.0`` (the Frobenius ``sqrt(2) R`` is ``5.66``); ``[0, 1]^6``: ``sqrt(21) =
    4.58`` (vs ``8.49``).

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    ratio : float, default 1
        Weight ``r >= 1/2`` of the squared diagonal (the noise's off-diagonal over diagonal
        variance); ``1`` for iid noise on the upper triangle.

    Returns
    -------
    float
        The sensitivity.
    """
    m = domain.m
    T, sign_definite = domain.coordinate_sups(np.eye(m), np.ones(m))
    q = sens.outer_weighted_sup(
        T,
        domain.sup_norm_sq(),
        ratio=ratio,
        replace_one=neighbours == "replace-one",
        sign_definite=sign_definite,
    )
    return math.sqrt(q)


def gram_sensitivity(domain: RecordDomain, neighbours: Neighbours) -> float:
    """L2 sensitivity of the upper triangle of ``X X^T`` (the Analyze Gauss input).

    :func:`vech_sensitivity` with ``r = 1``: each off-diagonal entry counted once, as the
    noise of :func:`symmetric_noise` treats it. It is at most the Frobenius bound
    (``sqrt(2) R`` replace-one, ``R`` add/remove, ``R = sup ||x||^2``) it replaces.

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.

    Returns
    -------
    float
        Sensitivity.
    """
    return vech_sensitivity(domain, neighbours, ratio=1.0)


def symmetric_noise(key: NoiseKey, m: int, sigma: float) -> np.ndarray:
    """Symmetric ``m x m`` Gaussian noise: upper triangle iid ``N(0, sigma^2)``, mirrored.

    The draw of :func:`mvg_dask.noise.tiles.symmetric_normals` with ``r = 1`` (tile 0 of
    ``key``), scaled by ``sigma``.

    Parameters
    ----------
    key : NoiseKey
        Keyed generator (tile 0 of this key is used).
    m : int
        Size.
    sigma : float
        Standard deviation.

    Returns
    -------
    ndarray
        The noise matrix.
    """
    return symmetric_normals(key, m, 1.0) * sigma


def dp_pca(
    gram: np.ndarray,
    *,
    records: float,
    k: int,
    mu: float,
    sensitivity: float,
    key: NoiseKey,
) -> Directions:
    """DP-PCA directions by Analyze Gauss.

    Parameters
    ----------
    gram : ndarray
        ``X X^T`` (a sum, not divided by ``N``) of the clipped records.
    records : float
        The public normaliser ``N`` (replace-one), ``N0`` or the noisy count (add-remove), to
        report eigenvalues of ``X X^T / N``.
    k : int
        Number of important directions.
    mu : float
        Gaussian-mechanism ratio ``Delta / sigma`` of this step (its privacy).
    sensitivity : float
        L2 sensitivity of the Gram upper triangle (:func:`gram_sensitivity`).
    key : NoiseKey
        The step's own (derived) key.

    Returns
    -------
    Directions
        All eigenvectors of the noisy Gram, by decreasing eigenvalue; the first ``k`` important.

    References
    ----------
    .. [1] C. Dwork, K. Talwar, A. Thakurta, L. Zhang, "Analyze Gauss: Optimal Bounds for
       Privacy-Preserving Principal Component Analysis", STOC 2014, Algorithm 1.
    """
    m = gram.shape[0]
    if not 1 <= k <= m:
        raise ValueError(f"dp-pca k must lie in 1..{m}, got {k}")
    sigma = sensitivity / mu
    noisy = np.asarray(gram, dtype=np.float64) + symmetric_noise(key, m, sigma)
    return directions_from_noisy_gram(noisy, records=records, k=k)


def directions_from_noisy_gram(noisy: np.ndarray, *, records: float, k: int) -> Directions:
    """DP-PCA's directions from its noisy Gram matrix (post-processing): every eigenvector by
    decreasing eigenvalue, the first ``k`` important, eigenvalues of ``noisy / records``.

    Parameters
    ----------
    noisy : ndarray
        The noisy (symmetric) ``X X^T``.
    records : float
        The normaliser of the reported eigenvalues.
    k : int
        Number of important directions.

    Returns
    -------
    Directions
        The directions.
    """
    m = noisy.shape[0]
    if not 1 <= k <= m:
        raise ValueError(f"dp-pca k must lie in 1..{m}, got {k}")
    vals, vecs = np.linalg.eigh(noisy)
    order = np.argsort(vals)[::-1]
    return Directions(
        "dp-pca",
        np.ascontiguousarray(vecs[:, order]),
        tuple(range(k)),
        vals[order] / records,
    )


#: Most subspace iterations of the top-``k`` DP-PCA (:func:`top_k_directions`).
TOP_K_ITERATIONS = 24
#: Its convergence: the top ``k`` Ritz values change by less than this (relative).
TOP_K_RTOL = 1e-12
#: Extra columns of its iterated subspace.
TOP_K_OVERSAMPLE = 10


def top_k_directions(
    apply: Callable[[np.ndarray], np.ndarray],
    m: int,
    k: int,
    *,
    start: NoiseKey,
    records: float,
    iterations: int = TOP_K_ITERATIONS,
    oversample: int = TOP_K_OVERSAMPLE,
    rtol: float = TOP_K_RTOL,
) -> Directions:
    """The top ``k`` eigenvectors of a noisy Gram matrix seen only through products, as
    low-rank directions: DP-PCA for a release too wide to hold ``m x m`` matrices.

    Subspace iteration with ``k + oversample`` columns from a start block drawn from ``start``
    (keyed, so a resumed release finds the same directions), with Rayleigh-Ritz at every step:
    it stops when the top ``k`` Ritz values (largest eigenvalues, not largest in magnitude) have
    converged to ``rtol``, or after ``iterations`` products (each a pass over the noisy matrix;
    a spectrum with no gap above the noise never converges, and then its top ``k`` are noise
    directions whatever the accuracy). Everything is post-processing of the
    noisy matrix: it costs no privacy, whatever its accuracy. The iteration converges fast when
    the top eigenvalues stand out of the noise, the only case in which DP-PCA's directions carry
    information about the data.

    Parameters
    ----------
    apply : callable
        ``Q -> G Q`` for the noisy Gram matrix ``G`` (``m x m``, symmetric).
    m, k : int
        Dimension and number of directions (``1 <= k < m``).
    start : NoiseKey
        Key of the start block.
    records : float
        Normaliser of the reported eigenvalues (of ``G / records``).
    iterations, oversample : int
        Most products and extra columns.
    rtol : float
        Convergence of the Ritz values.

    Returns
    -------
    Directions
        :meth:`Directions.low_rank`, the ``k`` directions all important.

    References
    ----------
    .. [1] N. Halko, P.-G. Martinsson, J. A. Tropp, "Finding structure with randomness",
       SIAM Review 53(2), 2011, Algorithm 4.4 (randomized subspace iteration).
    """
    if not 1 <= k < m:
        raise ValueError(f"top-k DP-PCA needs 1 <= k < {m}, got {k}")
    width = min(m, k + oversample)
    Q = np.linalg.qr(start.tile_normals(0, (m, width)))[0]
    previous = None
    for step in range(iterations):
        Y = apply(Q)
        T = Q.T @ Y
        vals, vecs = np.linalg.eigh((T + T.T) / 2.0)
        top = vals[::-1][:k]
        done = previous is not None and bool(
            np.all(np.abs(top - previous) <= rtol * np.abs(top).max())
        )
        if done or step == iterations - 1:
            break
        previous = top
        Q = np.linalg.qr(Y)[0]
    order = np.argsort(vals)[::-1][:k]
    ritz = Q @ vecs[:, order]
    U = np.linalg.qr(ritz)[0]
    U *= np.sign(np.sum(U * ritz, axis=0))[None, :]  # QR may flip a column's sign
    return Directions.low_rank(U, tuple(range(k)), vals[order] / records)
