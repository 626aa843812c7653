"""What analysts derive from a covariance-like release, and its uncertainty from the known noise.

Post-processing of a release: these functions use only released values and the public noise
plan, never the data, so they cost no privacy (docs/guide/python.md, "Derived statistics and
their intervals").

* :func:`correlation_matrix`: a correlation matrix that is one (values in ``[-1, 1]``, unit
  diagonal, never NaN) from a noisy covariance, computed from its PSD projection or its floored
  variances, with delta-method intervals and the entries where the noise dominates;
* :func:`published_noise_draws`: draws of the Gaussian noise a release publishes, from its
  noise plan (the law :meth:`~mvg_dask.plan.noise_plan.NoisePlan.released_entry_std` states);
* :func:`basic_bootstrap_interval`: the parametric ("basic") bootstrap interval of a statistic
  from such draws around the released values;
* :func:`explained_variance_fractions`, :func:`top_subspace`, :func:`largest_principal_angle`:
  PCA of a covariance.
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np

from mvg_dask.plan.noise_plan import NoisePlan

__all__ = [
    "CORRELATION_METHODS",
    "RESOLVED_FACTOR",
    "NoiseDominatedWarning",
    "basic_bootstrap_interval",
    "centered_covariance_std",
    "correlation_matrix",
    "explained_variance_fractions",
    "largest_principal_angle",
    "noise_norm_quantile",
    "published_noise_draws",
    "resolved_eigenvalues",
    "top_subspace",
]

#: A statistic is *resolved* by a release when the gap it depends on (the smallest eigenvalue
#: of a regression's predictor covariance, an eigenvalue's distance to its neighbours) exceeds
#: this many times the 95 % quantile of the noise's spectral norm; elsewhere the noise dominates
#: it and the bootstrap's coverage is not what it states (docs/guide/python.md).
RESOLVED_FACTOR = 3.0

#: How :func:`correlation_matrix` makes a covariance a correlation's source.
CORRELATION_METHODS = ("floor", "psd")


class NoiseDominatedWarning(UserWarning):
    """Some entries of a derived statistic are dominated by the release's noise."""


def _symmetric(C: np.ndarray) -> np.ndarray:
    S = np.asarray(C, dtype=np.float64)
    if S.ndim < 2 or S.shape[-1] != S.shape[-2]:
        raise ValueError(f"needs (a stack of) square matrices, got shape {S.shape}")
    return 0.5 * (S + np.swapaxes(S, -1, -2))


def _diagonal(S: np.ndarray) -> np.ndarray:
    return np.array(np.diagonal(S, axis1=-2, axis2=-1))


def correlation_matrix(
    C: np.ndarray,
    std: np.ndarray,
    *,
    method: Literal["floor", "psd"] = "floor",
    z: float = 1.959963984540054,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A correlation matrix from a noisy covariance, its delta-method std and where the noise
    dominates.

    A noisy variance can be at most 0 and a noisy covariance larger than the root of the two
    variances, so ``C_ij / sqrt(C_ii C_jj)`` is not a correlation (NaN, or outside ``[-1, 1]``).
    Here each variance is first floored at its noise std, ``d_i = max(C_ii, s_ii)`` (a feature
    without noise and without spread gets correlation 0 with every other), and
    ``R0 = C_ij / sqrt(d_i d_j)`` is made a correlation by

    * ``method="floor"`` (default): ``R0`` clipped to ``[-1, 1]`` entry by entry (each entry
      from its own three released values; the matrix need not be PSD);
    * ``method="psd"``: the nearest PSD matrix to ``R0`` (Frobenius; the negative eigenvalues
      set to 0) rescaled to a unit diagonal, a correlation matrix (PSD, values in ``[-1, 1]``).
      Standardising first makes it independent of the features' units. Where the noise
      reaches the spectrum the projection moves the entries and shrinks their spread, and the
      delta-method intervals around them are conservative (measured: docs/guide/python.md).

    Where the noise is small against every variance nothing is floored or projected and both are
    ``C_ij / sqrt(C_ii C_jj)``. The std is the delta method's (entries' noises independent, as
    for standard directions), ``Var r_ij ~ s_ij^2 / (d_i d_j) + r_ij^2 (s_ii^2 / d_i^2 +
    s_jj^2 / d_j^2) / 4``. A variance with ``C_ii <= z s_ii`` is *noise-dominated* (not
    significantly above 0 at the level of ``z``); so is every correlation with it, and the
    caller should not read those (:func:`mvg_dask.interactive.read.correlation` gives them
    the interval ``[-1, 1]`` and warns).

    Parameters
    ----------
    C : ndarray
        ``(..., m, m)`` released covariance(s); the symmetric part is used.
    std : ndarray
        Its noise std, broadcastable to ``C``.
    method : {"floor", "psd"}, default "floor"
        As above.
    z : float
        The quantile that marks a variance as noise-dominated.

    Returns
    -------
    tuple of ndarray
        ``(r, std_r, dominated)``, each ``(..., m, m)``: values in ``[-1, 1]`` with a unit
        diagonal and no NaN, their std (0 on the diagonal), and the noise-dominated entries.
    """
    if method not in CORRELATION_METHODS:
        raise ValueError(f"method must be one of {CORRELATION_METHODS}, got {method!r}")
    S = _symmetric(C)
    s = np.broadcast_to(np.abs(np.asarray(std, dtype=np.float64)), S.shape)
    S = np.where(np.isfinite(S), S, 0.0)
    d, sd = _diagonal(S), _diagonal(s)
    floored = np.maximum(d, sd)
    spread = floored > 0
    d_f = np.where(spread, floored, 1.0)
    root = np.sqrt(d_f)
    R0 = S / (root[..., :, None] * root[..., None, :])
    keep = spread[..., :, None] & spread[..., None, :]
    R0 = np.where(keep, R0, 0.0)
    eye = np.eye(S.shape[-1], dtype=bool)
    if method == "psd":
        R0 = np.where(eye, np.where(spread, d / d_f, 0.0)[..., None], R0)
        w, V = np.linalg.eigh(R0)
        P = (V * np.maximum(w, 0.0)[..., None, :]) @ np.swapaxes(V, -1, -2)
        p = _diagonal(P)
        root_p = np.sqrt(np.where(p > 0, p, 1.0))
        r = np.where(
            (p > 0)[..., :, None] & (p > 0)[..., None, :],
            P / (root_p[..., :, None] * root_p[..., None, :]),
            0.0,
        )
    else:
        r = R0
    r = np.where(eye, 1.0, np.clip(r, -1.0, 1.0))
    var = (
        s * s / (root[..., :, None] * root[..., None, :]) ** 2
        + r * r * (((sd / d_f) ** 2)[..., :, None] + ((sd / d_f) ** 2)[..., None, :]) / 4.0
    )
    std_r = np.where(eye, 0.0, np.sqrt(var))
    weak = ~(d > z * sd)
    dominated = (weak[..., :, None] | weak[..., None, :]) & ~eye
    return r, std_r, dominated


def centered_covariance_std(values: np.ndarray, s: np.ndarray, *, grouped: bool) -> np.ndarray:
    """The delta method's noise std of the covariance around the mean computed from noisy
    moments of ``[x - c; 1]`` (:func:`mvg_dask.interactive.read.noise_std` states the formula).

    Parameters
    ----------
    values : ndarray
        ``(G, m + 1, m + 1)`` noisy moments of ``[x - c; 1]``.
    s : ndarray
        ``(m + 1, m + 1)`` the std of their entries' noise.
    grouped : bool
        Each moment divides by its group's noisy share (the corner); else by the public ``N``.

    Returns
    -------
    ndarray
        ``(G, m, m)``; NaN for a group whose share is not positive.
    """
    m = s.shape[-1] - 1
    p = values[:, m, m] if grouped else np.ones(values.shape[0])
    s_p = s[m, m] if grouped else 0.0
    p = np.where(p > 0, p, np.nan)[:, None]
    u = values[:, :m, m] / p
    s_a = s[:m, m]
    cov = values[:, :m, :m] / p[:, :, None] - u[:, :, None] * u[:, None, :]
    u2 = u**2
    v = (
        s[:m, :m] ** 2
        + u2[:, None, :] * (s_a**2)[None, :, None]
        + u2[:, :, None] * (s_a**2)[None, None, :]
        + (u[:, :, None] * u[:, None, :] - cov) ** 2 * s_p**2
    )
    idx = np.arange(m)
    v[:, idx, idx] = (
        np.diag(s[:m, :m]) ** 2 + 4.0 * u2 * s_a**2 + (u2 - cov[:, idx, idx]) ** 2 * s_p**2
    )
    return np.asarray(np.sqrt(v) / p[:, :, None])


def warn_noise_dominated(variances: int, entries: int, total: int, what: str) -> None:
    """Warn that ``entries`` of ``total`` entries of ``what`` are noise-dominated, because of
    ``variances`` variances not significantly above 0 (nothing when there are none)."""
    if entries:
        warnings.warn(
            f"{what}: the noise dominates {variances} noisy variance(s) (not significantly above "
            f"0), so {entries} of {total} correlations are noise-dominated: their interval is "
            "[-1, 1] and their value is mostly noise (a larger epsilon or more records would "
            "help; see noise_std())",
            NoiseDominatedWarning,
            stacklevel=3,
        )


def published_noise_draws(
    plan: NoisePlan, rng: np.random.Generator, size: int | tuple[int, ...]
) -> np.ndarray:
    """Independent draws of the noise a release of a symmetric query publishes, from its plan.

    The law the engine's samplers draw from (:func:`mvg_dask.noise.tiles.symmetric_query_noise`),
    from a local generator instead of the release's key: ``B S B^T`` with ``B`` the plan's
    :attr:`~mvg_dask.plan.noise_plan.NoisePlan.row_factor` and ``S`` symmetric with ``N(0, 1)``
    on the diagonal and ``N(0, r)`` off it (symmetric noise with the plan's ratio ``r``, and
    equi-modal noise averaged with its transpose, ``r = 1/2``), or ``B N`` for unimodal noise.
    Their entry std is :meth:`~mvg_dask.plan.noise_plan.NoisePlan.released_entry_std`.

    Parameters
    ----------
    plan : NoisePlan
        The plan of a covariance or moment release.
    rng : numpy.random.Generator
        The generator.
    size : int or tuple of int
        Leading shape of the draws.

    Returns
    -------
    ndarray
        ``(*size, m, m)``.
    """
    if not plan.query.is_symmetric:
        raise ValueError(
            f"the noise of a {plan.query.kind} release is not a symmetric matrix's: these draws "
            "are for a covariance, centered-covariance or regression release"
        )
    lead = (size,) if isinstance(size, int) else tuple(size)
    B = np.asarray(plan.row_factor, dtype=np.float64)
    m = B.shape[0]
    N = rng.standard_normal((*lead, m, m))
    ratio = plan.output_symmetric_ratio
    if ratio is None:  # unimodal: B N
        return np.asarray(B @ N)
    upper = np.triu(N, 1) * np.sqrt(ratio)
    S = upper + np.swapaxes(upper, -1, -2) + np.eye(m) * N
    if np.all(B == np.diag(np.diag(B))):  # standard directions: the same values, entrywise
        b = np.diag(B)
        out = (b[:, None] * S) * b[None, :]
    else:
        out = B @ S @ B.T
    return np.asarray(0.5 * (out + np.swapaxes(out, -1, -2)))


def basic_bootstrap_interval(
    point: np.ndarray, draws: np.ndarray, level: float
) -> tuple[np.ndarray, np.ndarray]:
    """The basic (reverse-percentile) bootstrap interval ``[2 t - q_hi, 2 t - q_lo]``.

    ``t`` is the statistic of the release and ``draws`` the statistic of the release plus
    independent draws of its published noise (a parametric bootstrap: the noise law is known
    exactly). The spread of ``draws - t`` stands in for that of ``t - truth``; reflecting it
    also removes the statistic's first-order bias. NaN draws (a refit that failed) are ignored.

    Parameters
    ----------
    point : ndarray
        The statistic ``t``.
    draws : ndarray
        ``(B, *point.shape)``.
    level : float
        Coverage, in (0, 1).

    Returns
    -------
    tuple of ndarray
        ``(lower, upper)``.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    a = (1.0 - level) / 2.0
    lo, hi = np.nanquantile(draws, [a, 1.0 - a], axis=0)
    return 2.0 * point - hi, 2.0 * point - lo


def explained_variance_fractions(C: np.ndarray) -> np.ndarray:
    """``lambda_k / tr C``, the eigenvalues of (each) covariance in decreasing order over its
    trace: the share of the total variance along each principal direction.

    Parameters
    ----------
    C : ndarray
        ``(..., m, m)``; the symmetric part is used.

    Returns
    -------
    ndarray
        ``(..., m)``, decreasing.
    """
    S = _symmetric(C)
    w = np.linalg.eigvalsh(S)[..., ::-1]
    trace = np.trace(S, axis1=-2, axis2=-1)
    return np.asarray(w / trace[..., None])


def noise_norm_quantile(drawn: np.ndarray, point: np.ndarray, level: float = 0.95) -> np.ndarray:
    """The ``level`` quantile over draws of the spectral norm of ``drawn - point`` (symmetric
    parts; ``drawn`` ``(B, ..., m, m)``, ``point`` ``(..., m, m)``): a bound, at ``level``, on
    the norm of the noise a release adds (Weyl: no eigenvalue moves by more)."""
    E = _symmetric(drawn) - _symmetric(point)[None]
    norms = np.abs(np.linalg.eigvalsh(np.where(np.isfinite(E), E, 0.0))).max(axis=-1)
    return np.asarray(np.quantile(norms, level, axis=0))


def resolved_eigenvalues(w: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Which eigenvalues (``(..., m)``, decreasing) are resolved: their distance to each
    neighbour exceeds :data:`RESOLVED_FACTOR` times the noise norm's bound (``(...)``)."""
    gaps = np.full(w.shape, np.inf)
    step = w[..., :-1] - w[..., 1:]
    gaps[..., :-1] = step
    gaps[..., 1:] = np.minimum(gaps[..., 1:], step)
    return np.asarray(gaps > RESOLVED_FACTOR * np.asarray(bound)[..., None])


def top_subspace(C: np.ndarray, k: int) -> np.ndarray:
    """The top-``k`` eigenvectors of (each) covariance, ``(..., m, k)``."""
    S = _symmetric(C)
    if not 1 <= k < S.shape[-1]:
        raise ValueError(f"k must lie in [1, {S.shape[-1] - 1}], got {k!r}")
    _, V = np.linalg.eigh(S)
    return np.asarray(V[..., :, ::-1][..., :, :k])


def largest_principal_angle(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """The largest principal angle (radians) between the column spans of orthonormal ``U`` and
    ``V`` (each ``(..., m, k)``): ``arccos`` of the smallest singular value of ``U^T V``.

    Parameters
    ----------
    U, V : ndarray
        Orthonormal bases, broadcastable.

    Returns
    -------
    ndarray
        Angles in ``[0, pi / 2]``.
    """
    sv = np.linalg.svd(np.swapaxes(U, -1, -2) @ V, compute_uv=False)
    return np.asarray(np.arccos(np.clip(sv[..., -1], 0.0, 1.0)))
