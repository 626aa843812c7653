"""Noise covariances as types: ``Sigma = W diag(v) W^T`` in the three forms a plan can hold.

* :class:`Diagonal`: standard directions, ``Sigma = diag(v)``: every quantity in O(m), no
  ``m x m`` matrix unless one is asked for.
* :class:`LowRank`: the top ``k`` directions ``U`` and one variance for their orthogonal
  complement, ``Sigma = v_c I + U diag(v_U - v_c) U^T`` (:mod:`mvg_dask.plan.low_rank`): what a
  wide release's DP-PCA gives; its factor is the symmetric square root.
* :class:`Dense`: an explicit orthonormal ``W`` (``m x m``).

Each gives ``diag()``, ``block(rows, cols)``, ``dense()``, ``factor()``, ``precision()``,
``eigenvalues()``, the precision the Mahalanobis bounds take, the whitening of the float-error
bounds and the entry standard deviations of symmetric noise, so a caller never branches on the
kind of directions. :func:`covariance_of` is the one place the kind is chosen. The design
follows scipy's ``scipy.stats.Covariance`` (one class per representation, one interface).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import diagonal_noise_block, low_rank_noise_block
from mvg_dask.plan.low_rank import LowRankPrecision, dense_low_rank, low_rank_factor
from mvg_dask.privacy import float_error as ferr

__all__ = [
    "CovarianceKind",
    "Dense",
    "Diagonal",
    "EntryLaw",
    "LowRank",
    "NoiseCovariance",
    "PrecisionForm",
    "StdRanges",
    "covariance_of",
    "symmetric_entry_std",
]

CovarianceKind = Literal["diagonal", "low-rank", "dense"]
#: ``Sigma^-1`` as the Mahalanobis bounds take it, and the basis ``W`` it is diagonal in (``None``
#: for a precision vector or an identity-plus-low-rank precision).
PrecisionForm = tuple["np.ndarray | LowRankPrecision", "np.ndarray | None"]
#: ``(min, max)`` of the entry stds on the diagonal and off it (``None``: a non-square output).
StdRanges = tuple[tuple[float, float], tuple[float, float] | None]


@dataclass(frozen=True)
class EntryLaw:
    """How the variance of each noise entry follows from ``Sigma`` (docs/bounds.md, Sec. 1).

    Attributes
    ----------
    form : {"rows", "outer", "symmetric"}
        ``rows``: noise on the rows only (``Var Z_kl = Sigma_kk``, every column alike);
        ``outer``: ``Sigma`` on both sides (``Var Z_kl = Sigma_kk Sigma_ll``); ``symmetric``:
        ``B S B^T`` with off-diagonal ratio ``ratio``.
    ratio : float or None
        ``r`` of the symmetric form.
    """

    form: Literal["rows", "outer", "symmetric"]
    ratio: float | None = None


def symmetric_entry_std(factor: np.ndarray, ratio: float) -> np.ndarray:
    """Entry standard deviations of ``B S B^T``, ``S_ii ~ N(0, 1)``, ``S_ij = S_ji ~ N(0, r)``.

    ``Var Z_kl = r (Sigma_kk Sigma_ll + Sigma_kl^2) + (1 - 2r) sum_i B_ki^2 B_li^2`` with
    ``Sigma = B B^T`` (docs/bounds.md, Sec. 1).

    Parameters
    ----------
    factor : ndarray
        ``B`` (``m x m``).
    ratio : float
        ``r``.

    Returns
    -------
    ndarray
        ``m x m`` standard deviations.
    """
    B = np.asarray(factor, dtype=np.float64)
    Sigma = B @ B.T
    d = np.diag(Sigma)
    B2 = B * B
    var = ratio * (np.outer(d, d) + Sigma**2) + (1.0 - 2.0 * ratio) * (B2 @ B2.T)
    return np.asarray(np.sqrt(np.maximum(var, 0.0)))


@dataclass(frozen=True, eq=False)
class NoiseCovariance(ABC):
    """A row noise covariance ``Sigma = W diag(v) W^T``.

    Attributes
    ----------
    basis : ndarray or None
        ``W`` (``m x m``), ``U`` (``m x k``) of the low-rank form, or ``None`` (standard basis).
    variances : ndarray
        ``v``, the ``m`` variances along the directions (low rank: ``k`` along ``U``, then the
        complement's).
    """

    #: Name of the representation (that of :class:`~mvg_dask.privacy.float_error.Whitening`).
    kind: ClassVar[CovarianceKind]
    #: True when ``Sigma`` is diagonal: samplers and writers take their O(m) paths.
    diagonal: ClassVar[bool] = False

    basis: np.ndarray | None
    variances: np.ndarray

    @property
    def dim(self) -> int:
        """``m``."""
        return int(self.variances.shape[0])

    @abstractmethod
    def diag(self) -> np.ndarray:
        """``diag(Sigma)``."""

    @abstractmethod
    def dense(self) -> np.ndarray:
        """``Sigma`` as an ``m x m`` matrix."""

    def block(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        """``Sigma[r0:r1, c0:c1]``.

        Parameters
        ----------
        rows, cols : tuple of int
            Half-open row and column ranges.

        Returns
        -------
        ndarray
            The block.
        """
        (r0, r1), (c0, c1) = rows, cols
        return np.asarray(self.dense()[r0:r1, c0:c1])

    @abstractmethod
    def precision(self) -> np.ndarray:
        """``Sigma^-1`` as an ``m x m`` matrix."""

    @abstractmethod
    def factor(self) -> np.ndarray:
        """``B`` with ``B B^T = Sigma``, the affine sampler's factor."""

    def sampler_factor(self) -> np.ndarray:
        """What the samplers take as the factor: :meth:`factor`, or ``sqrt(v)`` for a diagonal
        covariance (with :attr:`diagonal`, no ``m x m`` matrix is shipped to the tasks)."""
        return self.factor()

    @abstractmethod
    def eigenvalues(self) -> np.ndarray:
        """The eigenvalues of ``Sigma``, ascending."""

    @abstractmethod
    def precision_form(self) -> PrecisionForm:
        """``Sigma^-1`` in the form the queries' ``mahalanobis_sensitivity`` takes it, with its
        basis."""

    @abstractmethod
    def shares_precision(self, theta: np.ndarray) -> PrecisionForm:
        """The precision of a uniform allocation ``theta`` along these directions (the form
        the symmetric ratio search takes)."""

    @abstractmethod
    def whitening(self) -> ferr.Whitening:
        """``A^-1`` of the float-error bounds."""

    def scaled_directions(self, d: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(A^-1, A)`` with ``A = W diag(d)`` for per-direction scales ``d`` and their inverses
        ``w`` (a record lattice's whitening and factor, ``d = fl(sqrt(v))``).

        Parameters
        ----------
        d, w : ndarray
            Length ``m``.

        Returns
        -------
        tuple of ndarray
            ``(W^T / d, W diag(d))``; a diagonal covariance gives ``(w, d)`` themselves.
        """
        raise ValueError(f"a record lattice has no {self.kind} noise covariance")

    def noise_block(
        self,
        key: NoiseKey,
        algorithm: str,
        ratio: float | None,
        i: int,
        j: int,
        *,
        projection: np.ndarray | None = None,
        core: np.ndarray | None = None,
    ) -> np.ndarray:
        """Block ``(i, j)`` of the published noise of a blocked covariance release, on the grid
        of :func:`~mvg_dask.noise.tiles.feature_blocks` (the same bytes whatever the release's
        block size).

        Parameters
        ----------
        key : NoiseKey
            The noise key.
        algorithm : str
            ``symmetric``, ``equi-modal`` or ``unimodal``.
        ratio : float or None
            ``r`` of symmetric noise.
        i, j : int
            Grid block.
        projection, core : ndarray, optional
            The low-rank noise's first-pass projection and ``K = U^T G``.

        Returns
        -------
        ndarray
            The block.
        """
        raise ValueError(f"a blocked release has no {self.kind} noise covariance")

    def symmetric_std(self, ratio: float) -> np.ndarray:
        """Entry stds of symmetric noise ``B S B^T`` with off-diagonal ratio ``r``; for
        ``r = 1/2`` (the symmetrised equi-modal noise) from ``Sigma`` alone, whatever the
        factor: ``Var Z_kl = (Sigma_kk Sigma_ll + Sigma_kl^2) / 2``."""
        if ratio == 0.5:
            Sigma = self.dense()
            d = np.diag(Sigma)
            return np.asarray(np.sqrt(0.5 * (np.outer(d, d) + Sigma * Sigma)))
        return symmetric_entry_std(self.factor(), ratio)

    def entry_std(self, law: EntryLaw) -> np.ndarray:
        """Standard deviation of each noise entry under ``law``: ``m x 1`` (``rows``, every
        column alike) or ``m x m``.

        Parameters
        ----------
        law : EntryLaw
            How the entries' variances follow from ``Sigma``.

        Returns
        -------
        ndarray
            The standard deviations.
        """
        if law.form == "symmetric":
            return self.symmetric_std(float(law.ratio or 0.5))
        d = self.diag()
        if law.form == "outer":
            return np.asarray(np.sqrt(np.outer(d, d)))
        return np.asarray(np.sqrt(d)[:, None])

    def std_ranges(self, law: EntryLaw, shape: tuple[int, int], *, square: bool) -> StdRanges:
        """``(min, max)`` of :meth:`entry_std` on the diagonal (every entry of a non-square
        output) and off it (``None`` for a non-square output).

        Parameters
        ----------
        law : EntryLaw
            How the entries' variances follow from ``Sigma``.
        shape : tuple of int
            Output shape.
        square : bool
            Whether the output has an off-diagonal.

        Returns
        -------
        tuple
            ``((lo, hi), (lo, hi) or None)``.
        """
        m, n = shape
        values = np.broadcast_to(self.entry_std(law), (m, n) if square else (m, 1))
        if not square:
            return (float(values.min()), float(values.max())), None
        on, off = np.diag(values), values[~np.eye(m, dtype=bool)]
        return (float(on.min()), float(on.max())), (float(off.min()), float(off.max()))


@dataclass(frozen=True, eq=False)
class Diagonal(NoiseCovariance):
    """``Sigma = diag(v)`` (standard directions)."""

    kind: ClassVar[CovarianceKind] = "diagonal"
    diagonal: ClassVar[bool] = True

    def diag(self) -> np.ndarray:
        """``v``."""
        return self.variances

    def dense(self) -> np.ndarray:
        """``diag(v)``."""
        return np.diag(self.variances)

    def block(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        """``Sigma[r0:r1, c0:c1]`` in O(block) (no ``m x m`` matrix)."""
        (r0, r1), (c0, c1) = rows, cols
        out = np.zeros((r1 - r0, c1 - c0))
        lo, hi = max(r0, c0), min(r1, c1)
        idx = np.arange(lo, hi)
        out[idx - r0, idx - c0] = self.variances[lo:hi]
        return out

    def precision(self) -> np.ndarray:
        """``diag(1 / v)``."""
        return np.diag(1.0 / self.variances)

    def factor(self) -> np.ndarray:
        """``diag(sqrt(v))`` as an ``m x m`` matrix (the samplers take ``sqrt(v)`` instead)."""
        return np.asarray(np.eye(self.dim) * np.sqrt(self.variances)[None, :])

    def sampler_factor(self) -> np.ndarray:
        """``sqrt(v)``."""
        return np.asarray(np.sqrt(self.variances))

    def eigenvalues(self) -> np.ndarray:
        """``sort(v)``."""
        return np.sort(self.variances)

    def precision_form(self) -> PrecisionForm:
        """The precision vector ``1 / v`` (the O(m) bounds)."""
        return 1.0 / np.asarray(self.variances), None

    def shares_precision(self, theta: np.ndarray) -> PrecisionForm:
        """``theta`` itself."""
        return theta, None

    def whitening(self) -> ferr.Whitening:
        """``diag(1 / sqrt(v))``."""
        return ferr.Whitening.diagonal(self.variances)

    def scaled_directions(self, d: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(w, d)``: the diagonal ``A^-1`` and ``A`` as vectors."""
        return w, d

    def noise_block(
        self,
        key: NoiseKey,
        algorithm: str,
        ratio: float | None,
        i: int,
        j: int,
        *,
        projection: np.ndarray | None = None,
        core: np.ndarray | None = None,
    ) -> np.ndarray:
        """:func:`~mvg_dask.noise.tiles.diagonal_noise_block` with ``sqrt(v)``."""
        d = np.sqrt(self.variances)
        return diagonal_noise_block(key, d, algorithm, ratio, i, j)

    def symmetric_std(self, ratio: float) -> np.ndarray:
        """In O(m^2): ``Var Z_kl = r v_k v_l`` off the diagonal and ``v_k^2`` on it."""
        v = self.variances
        var = ratio * np.outer(v, v)
        np.fill_diagonal(var, v * v)
        return np.asarray(np.sqrt(var))

    def std_ranges(self, law: EntryLaw, shape: tuple[int, int], *, square: bool) -> StdRanges:
        """:meth:`NoiseCovariance.std_ranges` in O(m log m), the closed form of
        ``entry_std``: ``v_i`` on the diagonal and ``sqrt(r v_i v_j)`` off it (``symmetric``;
        ``r = 1`` for ``outer``), or ``sqrt(v_i)`` everywhere (``rows``)."""
        v = np.sort(np.asarray(self.variances, dtype=np.float64))
        if law.form == "rows":
            rows = (float(np.sqrt(v[0])), float(np.sqrt(v[-1])))
            return rows, (rows if square else None)
        factor = 1.0 if law.form == "outer" else float(law.ratio or 0.5)
        diag = (float(v[0]), float(v[-1]))
        if not square:
            return diag, None
        return diag, (float(np.sqrt(factor * v[0] * v[1])), float(np.sqrt(factor * v[-1] * v[-2])))


@dataclass(frozen=True, eq=False)
class LowRank(NoiseCovariance):
    """``Sigma = v_c I + U diag(v_U - v_c) U^T`` (``basis`` is ``U``, ``m x k``)."""

    kind: ClassVar[CovarianceKind] = "low-rank"

    @property
    def U(self) -> np.ndarray:
        """The ``m x k`` top directions."""
        assert self.basis is not None
        return self.basis

    def diag(self) -> np.ndarray:
        """``diag(Sigma)`` in O(m k)."""
        U, v = self.U, self.variances
        k = U.shape[1]
        return np.asarray(v[k] + (U * U) @ (v[:k] - v[k]))

    def dense(self) -> np.ndarray:
        """``Sigma`` as an ``m x m`` matrix."""
        U, v = self.U, self.variances
        k = U.shape[1]
        return dense_low_rank(U, v[:k], float(v[k]))

    def precision(self) -> np.ndarray:
        """``Sigma^-1 = p_c I + U diag(p_U - p_c) U^T`` as an ``m x m`` matrix."""
        U = self.U
        k = U.shape[1]
        p = 1.0 / self.variances
        return dense_low_rank(U, p[:k], float(p[k]))

    def root(self) -> tuple[float, np.ndarray]:
        """``(a, delta)`` of ``Sigma^(1/2) = a I + U diag(delta) U^T``."""
        return low_rank_factor(self.U, self.variances)

    def factor(self) -> np.ndarray:
        """The symmetric square root ``Sigma^(1/2)`` as an ``m x m`` matrix
        (:func:`~mvg_dask.plan.low_rank.low_rank_factor`)."""
        a, delta = self.root()
        return dense_low_rank(self.U, a + delta, a)

    def block(self, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
        """``Sigma[r0:r1, c0:c1]`` in O(block k) (no ``m x m`` matrix)."""
        (r0, r1), (c0, c1) = rows, cols
        U, v = self.U, self.variances
        k = U.shape[1]
        out = (U[r0:r1] * (v[:k] - v[k])) @ U[c0:c1].T
        if rows == cols:
            out[np.diag_indices_from(out)] += v[k]
        else:
            lo, hi = max(r0, c0), min(r1, c1)
            idx = np.arange(lo, hi)
            out[idx - r0, idx - c0] += v[k]
        return np.asarray(out)

    def noise_block(
        self,
        key: NoiseKey,
        algorithm: str,
        ratio: float | None,
        i: int,
        j: int,
        *,
        projection: np.ndarray | None = None,
        core: np.ndarray | None = None,
    ) -> np.ndarray:
        """:func:`~mvg_dask.noise.tiles.low_rank_noise_block` of the factor ``a I + U diag(delta)
        U^T`` (``projection`` is required)."""
        assert projection is not None
        a, delta = self.root()
        return low_rank_noise_block(key, self.U, a, delta, algorithm, ratio, projection, core, i, j)

    def eigenvalues(self) -> np.ndarray:
        """``sort(v)`` (the complement's variance repeated)."""
        return np.sort(self.variances)

    def precision_form(self) -> PrecisionForm:
        """A :class:`~mvg_dask.plan.low_rank.LowRankPrecision` (no ``m x m`` matrix)."""
        return LowRankPrecision.from_variances(self.U, np.asarray(self.variances)), None

    def shares_precision(self, theta: np.ndarray) -> PrecisionForm:
        """``theta`` itself: uniform precisions make ``Sigma^-1 = c I`` whatever ``U``."""
        return theta, None

    def whitening(self) -> ferr.Whitening:
        """``A^-1`` of ``A = Sigma^(1/2) = a I + U diag(delta) U^T`` (the engine's factor)."""
        a, delta = self.root()
        return ferr.Whitening.low_rank(self.U, a, delta)


@dataclass(frozen=True, eq=False)
class Dense(NoiseCovariance):
    """``Sigma = W diag(v) W^T`` for an explicit orthonormal ``W`` (``basis``, ``m x m``)."""

    kind: ClassVar[CovarianceKind] = "dense"

    @property
    def W(self) -> np.ndarray:
        """The ``m x m`` directions."""
        assert self.basis is not None
        return self.basis

    def diag(self) -> np.ndarray:
        """``diag(Sigma)``."""
        return np.diag(self.dense())

    def dense(self) -> np.ndarray:
        """``W diag(v) W^T``."""
        return np.asarray((self.W * self.variances) @ self.W.T)

    def precision(self) -> np.ndarray:
        """``W diag(1/v) W^T``."""
        return np.asarray((self.W / self.variances) @ self.W.T)

    def factor(self) -> np.ndarray:
        """``W diag(sqrt(v))``."""
        return np.asarray(self.W * np.sqrt(self.variances)[None, :])

    def eigenvalues(self) -> np.ndarray:
        """The eigenvalues of the formed ``Sigma`` (computed, not read off ``v``)."""
        return np.linalg.eigvalsh(self.dense())

    def scaled_directions(self, d: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(W^T / d, W diag(d))``."""
        W = self.W
        return W.T / d[:, None], W * d[None, :]

    def precision_form(self) -> PrecisionForm:
        """``W diag(1/v) W^T`` and ``W``."""
        W = self.W
        return (W / self.variances) @ W.T, W

    def shares_precision(self, theta: np.ndarray) -> PrecisionForm:
        """``W diag(theta) W^T`` and ``W``."""
        W = self.W
        return (W * theta) @ W.T, W

    def whitening(self) -> ferr.Whitening:
        """``diag(1 / sqrt(v)) W^T``."""
        return ferr.Whitening.dense(self.W, self.variances)


def covariance_of(
    kind: CovarianceKind, basis: np.ndarray | None, variances: np.ndarray
) -> NoiseCovariance:
    """The covariance of directions of this ``kind`` with these variances.

    Parameters
    ----------
    kind : {"diagonal", "low-rank", "dense"}
        The representation (:attr:`mvg_dask.plan.directions.Directions.covariance_kind`).
    basis : ndarray or None
        ``W``, ``U`` or ``None`` (standard basis).
    variances : ndarray
        The ``m`` variances.

    Returns
    -------
    NoiseCovariance
        The typed covariance.
    """
    v = np.asarray(variances)
    if kind == "diagonal":
        return Diagonal(None, v)
    if kind == "low-rank":
        return LowRank(basis, v)
    return Dense(basis, v)
