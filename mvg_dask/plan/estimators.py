"""Post-processing estimators computed from a release and its (public) noise plan.

Post-processing never costs privacy: these functions use only the released values and the
plan, never the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import ArrayLike

from mvg_dask.plan.noise_plan import NoisePlan
from mvg_dask.plan.queries.moment import scale_constant


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
    if not plan.query.per_record_columns:
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
    return _from_eigen(spiked_eigenvalues(w, float(off_diagonal_std), bulk=bulk), V)


def spiked_eigenvalues(w: np.ndarray, off_diagonal_std: float, *, bulk: str = "zero") -> np.ndarray:
    """The eigenvalue map of :func:`spiked_shrinkage`: ``w`` (ascending eigenvalues of the
    release) shrunk above the noise edge ``2 s sqrt(m)``, the bulk set to 0 or its mean.

    Parameters
    ----------
    w : numpy.ndarray
        The release's eigenvalues.
    off_diagonal_std : float
        The noise's std off the diagonal.
    bulk : {"zero", "mean"}, default "zero"
        The eigenvalues below the edge.

    Returns
    -------
    numpy.ndarray
        The shrunk eigenvalues.
    """
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
    return out


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


#: The ridge of :func:`moment_regression`'s ``ridge="adassp"`` rule, in units of the root mean
#: square Frobenius norm of the noise on the released predictor block.
ADASSP_RIDGE_FACTOR: Final = 4.0
#: The label of the constant term of a second-moment release (the augmented record's last
#: coordinate, ``z = [x; 1]``).
CONSTANT_TERM: Final = "1"


def adassp_ridge(block_std: ArrayLike, *, factor: float = ADASSP_RIDGE_FACTOR) -> float:
    """The ridge ``lambda = factor sqrt(E ||E||_F^2)`` for a released Gram block with noise ``E``.

    ``E ||E||_F^2 = sum_ij s_ij^2`` whatever the noise's correlations (linearity of expectation),
    with ``s_ij`` the public std of the block's entries (the plan's
    :meth:`~mvg_dask.plan.noise_plan.NoisePlan.released_entry_std`). Since
    ``||E||_2 <= ||E||_F``, Markov's inequality on ``||E||_F^2`` gives
    ``P(||E||_2 > lambda) <= 1 / factor^2`` (1/16 at the default 4) for any noise; Gaussian noise
    makes it far smaller (``||E||_F^2`` is a weighted sum of chi-square variables; one weight alone
    gives ``P(chi^2_1 > 16) ~ 6e-5``). On the complementary event Weyl's inequality keeps
    ``G~ + lambda I`` at least as positive definite as the true Gram ``G``: the regression never
    divides by the noise. This is the ridge rule of AdaSSP (Wang 2018: the ridge set from the
    public noise level of the released sufficient statistics, no budget spent on choosing it)
    with a bound from the plan's noise instead of a private estimate of the smallest
    eigenvalue.

    Parameters
    ----------
    block_std : array_like
        The std of every entry of the penalised block (a square array), or a scalar for a
        ``1 x 1`` block.
    factor : float, default 4.0
        ``lambda`` in units of the noise's root mean square Frobenius norm.

    Returns
    -------
    float
        ``lambda >= 0``.

    References
    ----------
    .. [1] Y.-X. Wang, "Revisiting differentially private linear regression: optimal and
       adaptive prediction & estimation in unbounded domain", UAI 2018.
    """
    s = np.asarray(block_std, dtype=np.float64)
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("the noise std must be finite and non-negative")
    if not (factor >= 0 and np.isfinite(factor)):
        raise ValueError(f"the ridge factor must be finite and non-negative, got {factor!r}")
    return float(factor) * float(np.sqrt(np.sum(s * s)))


@dataclass(frozen=True)
class MomentRegression:
    """A linear regression fitted from a released second moment (:func:`moment_regression`).

    Parameters
    ----------
    terms : tuple of str
        The predictors' labels, then :data:`CONSTANT_TERM` when fitted with an intercept.
    coefficients : numpy.ndarray
        Shape ``(..., len(terms))``: the predictors' coefficients, then the intercept.
    ridge : float
        The ridge ``lambda`` used.
    target : str
        The target's label.
    """

    terms: tuple[str, ...]
    coefficients: np.ndarray
    ridge: float
    target: str

    def predict(self, x: ArrayLike) -> np.ndarray:
        """Predictions ``x b (+ b_0)`` for records ``x`` of shape ``(n, predictors)``.

        Parameters
        ----------
        x : array_like
            Records, one per row, the predictors in the order of ``terms``.

        Returns
        -------
        numpy.ndarray
            Shape ``(..., n)``: one row of predictions per fit.
        """
        X = np.asarray(x, dtype=np.float64)
        b = self.coefficients
        if self.terms and self.terms[-1] == CONSTANT_TERM:
            return np.asarray(np.einsum("...k,nk->...n", b[..., :-1], X) + b[..., -1:])
        return np.asarray(np.einsum("...k,nk->...n", b, X))


def moment_regression(
    moment: ArrayLike,
    labels: Sequence[str],
    target: str,
    *,
    intercept: bool = False,
    noise_std: ArrayLike | None = None,
    ridge: float | str = "adassp",
    centre: ArrayLike | None = None,
    scale: float = 1.0,
) -> MomentRegression:
    """Ridge regression of ``target`` on every other feature from a released second moment.

    ``moment`` estimates ``M = Z Z^T / N`` of the augmented records ``z = [x; 1]`` (``x`` holds
    the target), its terms labelled ``labels`` with :data:`CONSTANT_TERM` last (a moment of
    ``[x - c; s]`` is first taken to ``[x - c; 1]``: ``centre`` and ``scale``). With ``P`` the
    predictors (every feature but the target) and ``y`` the target, the fit minimises
    ``(1/N) sum (y - x_P b - b_0)^2 + lambda ||b||^2`` (the intercept is not penalised), in the
    released sufficient statistics (Wang 2018's SSP, "sufficient statistics perturbation"):

    - ``intercept=False``: ``b = (M~_PP + lambda I)^-1 M~_Py``;
    - ``intercept=True``: with the released means ``m~ = M~[:, 1]`` and the constant's own
      moment its public value 1 (not the noisy entry), ``b = (C~_PP + lambda I)^-1 c~_Py``,
      ``C~_PP = M~_PP - m~_P m~_P^T``, ``c~_Py = M~_Py - m~_P m~_y``, and
      ``b_0 = m~_y - m~_P^T b`` (the normal equations of the augmented system solved through
      the constant's Schur complement).

    ``ridge="adassp"`` sets ``lambda`` from the public noise of the released ``M~_PP`` by
    :func:`adassp_ridge` (``4 sqrt(E ||E_PP||_F^2)``); the noise of the released means, which
    also moves ``C~_PP``, is not counted. Post-processing: no privacy cost.
    ``moment`` may carry leading batch dimensions (one fit per release); the rule's ``lambda``
    is then the same for all.

    Parameters
    ----------
    moment : array_like
        Shape ``(..., K, K)``; its symmetric part is used.
    labels : sequence of str
        The ``K`` term labels: the features, then ``"1"``.
    target : str
        The target's label.
    intercept : bool, default False
        Fit an intercept (the constant term; not penalised).
    noise_std : array_like, optional
        The ``K x K`` public std of the released entries (or a scalar for all); needed by
        ``ridge="adassp"``.
    ridge : float or "adassp", default "adassp"
        ``lambda >= 0``, or the rule above.
    centre : array_like, optional
        ``c`` (one per feature) when ``moment`` is the moment of ``[x - c; 1]`` (a moment
        release about its box's centre). With an intercept the fit is the same on shifted
        data and only ``b_0`` moves (``b_0 + c_y - c_P^T b``); without one the uncentred moment
        ``T M~ T^T`` (``T = [[I, c], [0, 1]]``) is fitted, its noise std taken entry by entry
        with independent entries (as for standard directions).
    scale : float, default 1
        ``s`` when ``moment`` is the moment of ``[x - c; s]`` (a moment release's constant
        coordinate, a power of two): its last row and column, and their noise std, are
        divided by ``s`` first (the corner by ``s^2``; exact).

    Returns
    -------
    MomentRegression
        The terms (predictors, then ``"1"`` with an intercept), coefficients and ``lambda``.

    References
    ----------
    .. [1] Y.-X. Wang, "Revisiting differentially private linear regression: optimal and
       adaptive prediction & estimation in unbounded domain", UAI 2018.
    """
    M = np.asarray(moment, dtype=np.float64)
    names = [str(v) for v in labels]
    K = len(names)
    if M.ndim < 2 or M.shape[-2:] != (K, K):
        raise ValueError(f"the moment must be (..., {K}, {K}) for {K} labels, got {M.shape}")
    if names[-1] != CONSTANT_TERM or names.count(CONSTANT_TERM) != 1:
        raise ValueError(f"the last term must be the constant {CONSTANT_TERM!r}, got {names}")
    if target not in names[:-1]:
        raise ValueError(f"the target {target!r} is not one of the features {names[:-1]}")
    t = names.index(target)
    P = [i for i in range(K - 1) if i != t]
    if not P:
        raise ValueError("the regression needs at least one predictor besides the target")
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"the constant's scale must be positive and finite, got {scale!r}")
    if scale != 1.0:
        M = scale_constant(M, 1.0 / scale)
        if noise_std is not None:
            std = np.broadcast_to(np.asarray(noise_std, dtype=np.float64), (K, K))
            noise_std = scale_constant(std, 1.0 / scale)
    c = None if centre is None else np.asarray(centre, dtype=np.float64)
    if c is not None and c.shape != (K - 1,):
        raise ValueError(f"the centre must hold one value per feature ({K - 1}), got {c.shape}")
    if c is not None and not intercept:
        M, noise_std = _uncentred(M, noise_std, c)
    lam = _ridge_value(ridge, noise_std, M.shape[-2:], P)
    M = 0.5 * (M + np.swapaxes(M, -1, -2))
    gram = M[..., P, :][..., :, P]
    cross = M[..., P, t]
    if intercept:
        mx, my = M[..., P, -1], M[..., t, -1]
        gram = gram - mx[..., :, None] * mx[..., None, :]
        cross = cross - mx * my[..., None]
    b = np.linalg.solve(gram + lam * np.eye(len(P)), cross[..., None])[..., 0]
    terms = tuple(names[i] for i in P)
    if intercept:
        b0 = my - np.sum(b * mx, axis=-1)
        if c is not None:  # the fit on [x - c; y - c_y]: only the intercept moves
            b0 = b0 + c[t] - np.sum(b * c[P], axis=-1)
        b = np.concatenate([b, b0[..., None]], axis=-1)
        terms = (*terms, CONSTANT_TERM)
    return MomentRegression(terms=terms, coefficients=b, ridge=lam, target=target)


def _uncentred(
    M: np.ndarray, noise_std: ArrayLike | None, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """``T M T^T`` with ``T = [[I, c], [0, 1]]`` (the moment of ``[x; 1]`` from that of
    ``[x - c; 1]``) and the std of its entries for independent entries of ``M``'s noise:
    ``s_ij^2 + c_i^2 s_j1^2 + c_j^2 s_i1^2 + c_i^2 c_j^2 s_11^2`` off the diagonal,
    ``s_ii^2 + 4 c_i^2 s_i1^2 + c_i^4 s_11^2`` on it (the constant term's row and column:
    ``s_i1^2 + c_i^2 s_11^2``)."""
    K = M.shape[-1]
    T = np.eye(K)
    T[: K - 1, K - 1] = c
    out = T @ M @ T.T
    if noise_std is None:
        return out, None
    s2 = np.broadcast_to(np.asarray(noise_std, dtype=np.float64), (K, K)) ** 2
    cc = np.append(c, 0.0)  # the constant term is not shifted
    col = s2[:, K - 1]  # s_i1^2
    var = s2 + np.outer(cc**2, col) + np.outer(col, cc**2) + np.outer(cc**2, cc**2) * s2[-1, -1]
    diag = np.diag(s2) + 4 * cc**2 * col + cc**4 * s2[-1, -1]
    var[np.diag_indices(K)] = diag
    return out, np.sqrt(var)


def _ridge_value(
    ridge: float | str, noise_std: ArrayLike | None, shape: tuple[int, ...], P: list[int]
) -> float:
    """``lambda``: a given value (>= 0) or the AdaSSP rule on the predictor block's noise."""
    if isinstance(ridge, str):
        if ridge != "adassp":
            raise ValueError(f"ridge must be a number >= 0 or 'adassp', got {ridge!r}")
        if noise_std is None:
            raise ValueError("ridge='adassp' needs the released entries' noise std (noise_std)")
        s = np.broadcast_to(np.asarray(noise_std, dtype=np.float64), shape)
        return adassp_ridge(s[np.ix_(P, P)])
    lam = float(ridge)
    if not (lam >= 0 and np.isfinite(lam)):
        raise ValueError(f"the ridge must be finite and non-negative, got {ridge!r}")
    return lam


def rank_one_scales(std: np.ndarray) -> tuple[float, np.ndarray] | None:
    """``(s, a)`` with ``std[i, j] = s a_i a_j`` off the diagonal (``a`` of geometric mean 1),
    or ``None`` when the off-diagonal stds are not of that form (or not finite and positive).

    In logs ``log std_ij = c + u_i + u_j``; with ``sum(u) = 0`` the row sums give ``c`` and
    ``u`` in closed form, and the fit must be exact to ``1e-9``. Noise of this form (standard
    directions with any diagonal allocation) is homogeneous once the matrix is divided by
    ``a aᵀ``: what the spiked shrinkage needs.

    Parameters
    ----------
    std : numpy.ndarray
        ``m x m`` noise stds of a released matrix.

    Returns
    -------
    tuple of (float, numpy.ndarray) or None
        ``(s, a)``, or ``None``.
    """
    m = std.shape[-1]
    off = ~np.eye(m, dtype=bool)
    if m < 2 or not np.all(np.isfinite(std[off])) or np.any(std[off] <= 0):
        return None
    if m == 2:
        return float(std[0, 1]), np.ones(2)
    logs = np.where(off, np.log(np.where(off, std, 1.0)), 0.0)
    rows = logs.sum(axis=1)
    c = rows.sum() / (m * (m - 1))
    u = (rows - (m - 1) * c) / (m - 2)
    fit = c + u[:, None] + u[None, :]
    if np.max(np.abs(fit - logs)[off]) > 1e-9:
        return None
    return float(np.exp(c)), np.exp(u)
