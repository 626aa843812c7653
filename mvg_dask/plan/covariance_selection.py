"""A covariance estimator that chooses for itself, and the nuclear-norm (trace) projection.

Both are post-processing of a covariance release ``C = S + W``: they read the released matrix
and public values only (the plan's noise law and the declared domain), never the data, so they
cost no privacy.

* :func:`nuclear_norm_projection` projects ``C`` onto the PSD matrices of trace at most a
  radius ``R`` (the nuclear-norm ball intersected with the PSD cone), in Frobenius norm. With
  ``R`` at least the truth's trace the truth lies in the ball, so the projection is never
  farther from it than ``C``; for ``N < d^2 / epsilon`` it improves the error of a Gaussian
  release to ``O(sqrt(d tr(S) / N))`` (d'Orsi and Novikov 2026). ``R`` comes from the declared
  domain (``tr S <= sup ||x||^2``) or from the release's own trace.
* :func:`select_covariance` estimates the Frobenius risk ``E ||g(C) - S||_F^2`` of every
  candidate ``g`` (the raw release, its PSD projection, the two shrinkers of
  :mod:`mvg_dask.plan.estimators` and the nuclear-norm projections) by Stein's unbiased risk
  estimate under the published noise law and returns the candidate with the smallest.

The rule (docs/guide/python.md, "Choosing a covariance estimator"): for Gaussian noise ``W``
of covariance ``K`` (an operator on matrices), Stein's lemma gives
``E <W, g(C)> = E tr(K J_g(C))``, so

``SURE(g) = ||g(C) - C||_F^2 - E ||W||_F^2 + 2 tr(K J_g(C))``

is unbiased for the risk. ``E ||W||_F^2 = sum_ij s_ij^2`` with ``s`` the public std of every
released entry; the raw release's risk is exactly that. Every other candidate keeps the
eigenvectors of ``C`` and maps its eigenvalues, so its divergence ``tr(K J_g)`` has a closed
form (the Daleckii-Krein formula for the derivative of a spectral function) when the entries'
noises are independent up to symmetry with off-diagonal variances ``a_k a_l`` (standard
directions, uniform or per-feature allocation): :func:`sure_risks` computes it exactly. For
other noise it is estimated by finite differences along probes ``b`` drawn from the noise law
itself (``E <b, J b> = tr(K J)``), seeded by a public seed and the released bytes. Either way
the choice is a deterministic function of the release, its public noise law and the public
trace bound.

The references: C. M. Stein, "Estimation of the mean of a multivariate normal distribution",
Ann. Statist. 9(6) (1981), 1135-1151; S. Ramani, T. Blu, M. Unser, "Monte-Carlo SURE: a
black-box optimization of regularization parameters for general denoising algorithms", IEEE
Trans. Image Process. 17(9) (2008), 1540-1554; and T. d'Orsi, G. Novikov, ALT 2026 (the
nuclear-norm projection of a private covariance).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from mvg_dask.plan.estimators import spiked_eigenvalues

__all__ = [
    "CANDIDATES",
    "CovarianceChoice",
    "nuclear_norm_projection",
    "select_covariance",
    "spectral_candidates",
    "sure_risks",
    "symmetric_noise_sampler",
]

#: Draws one noise matrix from the published noise law.
NoiseSampler = Callable[[np.random.Generator], np.ndarray]

#: The candidates of :func:`select_covariance`, in the order ties are broken.
CANDIDATES: Final = ("raw", "psd", "spiked", "identity", "nuclear-domain", "nuclear-trace")
#: Probes of the divergence per candidate (the same probes for every candidate).
DEFAULT_PROBES: Final = 4
#: Finite-difference step along a probe, in units of the probe (itself at the noise's scale).
_STEP: Final = 1e-3


def _eigh(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    S = np.asarray(C, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"needs a square matrix, got shape {S.shape}")
    w, V = np.linalg.eigh((S + S.T) / 2.0)
    return w, V


def _trace_capped(w: np.ndarray, radius: float) -> np.ndarray:
    """Euclidean projection of ``w`` onto ``{v >= 0, sum v <= radius}``."""
    pos = np.maximum(w, 0.0)
    if pos.sum() <= radius:
        return pos
    if radius <= 0:
        return np.zeros_like(w)
    # soft threshold at tau with sum max(w - tau, 0) = radius (Duchi et al. 2008)
    u = np.sort(w)[::-1]
    cums = np.cumsum(u) - radius
    ks = np.arange(1, u.size + 1)
    k = int(np.flatnonzero(u - cums / ks > 0)[-1]) + 1
    tau = cums[k - 1] / k
    return np.maximum(w - tau, 0.0)


def nuclear_norm_projection(C: np.ndarray, radius: float) -> np.ndarray:
    """The PSD matrix of trace at most ``radius`` nearest to a released covariance (Frobenius).

    The symmetric part of ``C`` keeps its eigenvectors; its eigenvalues ``w`` are projected onto
    ``{v >= 0, sum v <= radius}``: ``max(w, 0)`` if their sum is within the radius, else
    ``max(w - tau, 0)`` with ``tau`` such that the sum is the radius (a soft threshold). A
    projection onto a convex set (the PSD matrices with nuclear norm at most ``radius``): when
    the truth lies in it (``radius >= tr S``) the result is never farther from the truth than
    ``C``. Post-processing when ``radius`` is public, e.g. ``sup ||x||^2`` of the declared
    domain (an ``XX^T / N`` has trace at most that), or a function of the release (its trace).

    Parameters
    ----------
    C : ndarray
        The released ``m x m`` covariance.
    radius : float
        The trace bound ``R >= 0``.

    Returns
    -------
    ndarray
        ``m x m``, symmetric PSD, trace at most ``radius``.

    References
    ----------
    .. [1] T. d'Orsi, G. Novikov, ALT 2026 (the nuclear-norm projection of a private
       covariance).
    """
    if not (math.isfinite(radius) and radius >= 0):
        raise ValueError(f"the radius must be finite and non-negative, got {radius!r}")
    w, V = _eigh(C)
    return _from_eigen(_trace_capped(w, float(radius)), V)


def _from_eigen(w: np.ndarray, V: np.ndarray) -> np.ndarray:
    out = (V * w) @ V.T
    return np.asarray((out + out.T) / 2.0)


def _homogeneous_off_diagonal(std: np.ndarray) -> float | None:
    """The one off-diagonal std, or None when the off-diagonal stds differ."""
    m = std.shape[0]
    if m < 2:
        return None
    off = std[~np.eye(m, dtype=bool)]
    if float(off.max()) <= 0 or np.ptp(off) > 1e-9 * float(off.max()):
        return None
    return float(off.max())


def _spiked_map(w: np.ndarray, off_diagonal_std: float) -> np.ndarray:
    """:func:`~mvg_dask.plan.estimators.spiked_shrinkage` (``bulk="mean"``) on eigenvalues."""
    return spiked_eigenvalues(w, off_diagonal_std, bulk="mean")


def _identity_map(w: np.ndarray, nu: float) -> np.ndarray:
    """:func:`~mvg_dask.plan.estimators.identity_shrinkage` on eigenvalues (``nu`` its noise
    term ``sum_ij s_ij^2 - sum_i s_ii^2 / m``)."""
    m = w.size
    mu = float(w.sum()) / m
    d2 = float(np.sum((w - mu) ** 2))
    beta = max(d2 - nu, 0.0) / d2 if d2 > 0 else 0.0
    return np.maximum(mu + beta * (w - mu), 0.0)


def spectral_candidates(
    std: np.ndarray, *, trace_bound: float | None = None
) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """The candidate estimators as maps of the released matrix's eigenvalues.

    Every candidate but the raw release keeps the eigenvectors of the symmetric part of ``C``
    and maps its eigenvalues: ``psd`` as :func:`~mvg_dask.plan.estimators.psd_projection`,
    ``spiked`` as :func:`~mvg_dask.plan.estimators.spiked_shrinkage` with ``bulk="mean"`` (only
    for homogeneous off-diagonal noise), ``identity`` as
    :func:`~mvg_dask.plan.estimators.identity_shrinkage`, ``nuclear-domain`` and
    ``nuclear-trace`` as :func:`nuclear_norm_projection` with the radius ``trace_bound`` or the
    released trace (at least 0). Working on eigenvalues lets every candidate share one
    eigendecomposition; tests check each map against the named function.

    Parameters
    ----------
    std : ndarray
        The ``m x m`` public std of the released entries.
    trace_bound : float, optional
        A public bound on the truth's trace (the declared domain's ``sup ||x||^2``); without
        it there is no ``nuclear-domain`` candidate.

    Returns
    -------
    dict
        Name to eigenvalue map, in :data:`CANDIDATES` order.
    """
    s = np.asarray(std, dtype=np.float64)
    out: dict[str, Callable[[np.ndarray], np.ndarray]] = {"psd": lambda w: np.maximum(w, 0.0)}
    off = _homogeneous_off_diagonal(s)
    if off is not None:
        out["spiked"] = lambda w: _spiked_map(w, off)
    nu = float(np.sum(s * s) - np.sum(np.diag(s) ** 2) / s.shape[0])
    out["identity"] = lambda w: _identity_map(w, nu)
    if trace_bound is not None:
        bound = float(trace_bound)
        if not (math.isfinite(bound) and bound >= 0):
            raise ValueError(f"the trace bound must be finite and non-negative, got {bound!r}")
        out["nuclear-domain"] = lambda w: _trace_capped(w, bound)
    out["nuclear-trace"] = lambda w: _trace_capped(w, max(float(w.sum()), 0.0))
    return out


def symmetric_noise_sampler(std: np.ndarray) -> NoiseSampler:
    """Draws of symmetric noise with independent entries (up to symmetry) of std ``std``.

    The published noise law of a covariance release with standard directions (the default);
    with dense or DP-PCA directions pass the plan's own draw instead.

    Parameters
    ----------
    std : ndarray
        ``m x m``, symmetric.

    Returns
    -------
    callable
        ``rng -> m x m`` noise matrix.
    """
    s = np.asarray(std, dtype=np.float64)
    upper = np.triu(np.ones(s.shape, dtype=bool))

    def draw(rng: np.random.Generator) -> np.ndarray:
        Z = np.where(upper, rng.standard_normal(s.shape) * s, 0.0)
        return np.asarray(Z + np.triu(Z, 1).T)

    return draw


def _probe_generator(seed: int, A: np.ndarray) -> np.random.Generator:
    """Probes seeded by the public seed and the released bytes: a deterministic function of
    the release, with probes that differ from release to release (so their error averages out
    over releases instead of biasing every one alike)."""
    digest = hashlib.sha256(np.ascontiguousarray(A).tobytes()).digest()
    return np.random.default_rng([int(seed), *np.frombuffer(digest[:16], dtype=np.uint32)])


def _check(C: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    A = np.asarray(C, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or not np.all(np.isfinite(A)):
        raise ValueError(f"needs a finite square matrix, got shape {A.shape}")
    s = np.broadcast_to(np.asarray(std, dtype=np.float64), A.shape)
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("the noise std must be finite and non-negative")
    return (A + A.T) / 2.0, np.asarray(s)


def _rank_one_off_diagonal(var: np.ndarray) -> np.ndarray | None:
    """``a`` with ``var_kl = a_k a_l`` off the diagonal, or None (no such ``a``)."""
    m = var.shape[0]
    if m == 1:
        return np.zeros(1)
    if m == 2:
        return np.full(2, math.sqrt(var[0, 1]))
    k = np.arange(m)
    j, n = (k + 1) % m, (k + 2) % m
    if np.any(var[j, n] <= 0):
        return None
    a = np.sqrt(var[k, j] * var[k, n] / var[j, n])
    off = ~np.eye(m, dtype=bool)
    if np.max(np.abs(np.outer(a, a) - var)[off]) > 1e-9 * float(np.max(var[off])):
        return None
    return np.asarray(a)


def _exact_divergences(
    w: np.ndarray,
    V: np.ndarray,
    var: np.ndarray,
    a: np.ndarray,
    maps: Mapping[str, Callable[[np.ndarray], np.ndarray]],
) -> dict[str, float]:
    """``tr(K J_g)`` of every eigenvalue map, exactly, for noise with independent entries (up
    to symmetry) of variance ``var`` whose off-diagonal part is ``a a^T``.

    With ``B = V^T W V`` (the noise in the eigenbasis) and ``g(C) = V F(w) V^T``,
    ``<W, Dg[W]> = sum_ik dF_i/dw_k B_ii B_kk + sum_{i != j} G_ij B_ij^2``, with
    ``G_ij = (F_i - F_j) / (w_i - w_j)`` (Daleckii-Krein). Over the noise law,
    ``E B_ij^2 = (P^T var P)_ij + (V^T diag(a) V)_ij^2 - (P^T diag(a^2) P)_ij`` and
    ``E B_ii B_kk = (P^T diag(var) P)_ik + 2 (V^T diag(a) V)_ik^2 - 2 (P^T diag(a^2) P)_ik``,
    ``P = V o V``; ``dF / dw`` by finite differences on the eigenvalues.
    """
    P = V * V
    R = V.T @ (a[:, None] * V)
    Pa = P.T @ ((a * a)[:, None] * P)
    E_off = P.T @ var @ P + R * R - Pa
    E_diag = P.T @ (np.diag(var)[:, None] * P) + 2.0 * (R * R - Pa)
    m = w.size
    scale = max(float(np.max(np.abs(w))), float(np.sqrt(np.max(var))), 1e-300)
    h = 1e-7 * scale
    gaps = np.subtract.outer(w, w)
    close = np.abs(gaps) <= 1e-9 * scale
    out = {}
    for name, f in maps.items():
        F = f(w)
        J = np.empty((m, m))
        for k in range(m):
            up = w.copy()
            up[k] += h
            J[:, k] = (f(up) - F) / h
        G = np.subtract.outer(F, F) / np.where(close, 1.0, gaps)
        slope = np.diag(J)
        G = np.where(close, (slope[:, None] + slope[None, :]) / 2.0, G)
        np.fill_diagonal(G, 0.0)
        out[name] = float(np.sum(J * E_diag) + np.sum(G * E_off))
    return out


def _probe_divergences(
    A: np.ndarray,
    w: np.ndarray,
    V: np.ndarray,
    maps: Mapping[str, Callable[[np.ndarray], np.ndarray]],
    draw: NoiseSampler,
    rng: np.random.Generator,
    probes: int,
) -> dict[str, float]:
    """``tr(K J_g)`` by finite differences along probes ``b`` of the noise law
    (``E <b, J b> = tr(K J)``), the same probes for every map."""
    div = dict.fromkeys(maps, 0.0)
    values = {name: f(w) for name, f in maps.items()}
    for _ in range(probes):
        b = draw(rng)
        b = (b + b.T) / 2.0
        wb, Vb = _eigh(A + _STEP * b)
        # <b, V F V^T> = sum_i F_i (V^T b V)_ii: no matrix is rebuilt
        here = np.sum(V * (b @ V), axis=0)
        moved = np.sum(Vb * (b @ Vb), axis=0)
        for name, f in maps.items():
            div[name] += float(f(wb) @ moved - values[name] @ here) / _STEP / probes
    return div


def sure_risks(
    C: np.ndarray,
    std: np.ndarray,
    *,
    trace_bound: float | None = None,
    probes: int = DEFAULT_PROBES,
    seed: int = 0,
    noise: NoiseSampler | None = None,
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Stein's unbiased estimate of every candidate's Frobenius risk, and the candidates.

    ``SURE(g) = ||g(C) - C||_F^2 - sum s^2 + 2 tr(K J_g)``. The divergence ``tr(K J_g)`` is
    exact (no randomness) when the entries' noises are independent up to symmetry with
    off-diagonal variances ``s_kl^2 = a_k a_l`` (standard directions, uniform or per-feature
    allocation); otherwise, or when ``noise`` is given, it is estimated along ``probes`` draws
    of the noise law seeded by ``seed`` and the released bytes (module docstring).

    Parameters
    ----------
    C : ndarray
        The released ``m x m`` covariance.
    std : ndarray
        The ``m x m`` public std of its entries.
    trace_bound : float, optional
        Public bound on the truth's trace (for ``nuclear-domain``).
    probes : int, default 4
        Probes of the divergence where it is not exact.
    seed : int, default 0
        Public seed of the probes.
    noise : callable, optional
        ``rng -> m x m`` draw of the published noise law (noise whose entries are
        correlated); default: independent entries of std ``std``.

    Returns
    -------
    tuple of dict
        ``(risks, estimates)``: each candidate's estimated risk ``E ||g(C) - S||_F^2`` and its
        estimate ``g(C)``.
    """
    A, s = _check(C, std)
    if probes < 1:
        raise ValueError(f"probes must be at least 1, got {probes}")
    maps = spectral_candidates(s, trace_bound=trace_bound)
    var = s * s
    total = float(np.sum(var))
    w, V = _eigh(A)
    estimates = {"raw": A, **{name: _from_eigen(f(w), V) for name, f in maps.items()}}
    a = None if noise is not None else _rank_one_off_diagonal(var)
    if a is not None:
        div = _exact_divergences(w, V, var, a, maps)
    else:
        draw = noise if noise is not None else symmetric_noise_sampler(s)
        div = _probe_divergences(A, w, V, maps, draw, _probe_generator(seed, A), probes)
    risks = {"raw": total}
    for name in maps:
        gap = estimates[name] - A
        risks[name] = float(np.sum(gap * gap)) - total + 2.0 * div[name]
    return risks, estimates


@dataclass(frozen=True)
class CovarianceChoice:
    """What :func:`select_covariance` chose, and why.

    Attributes
    ----------
    name : str
        The chosen candidate.
    estimate : ndarray
        Its estimate.
    risks : dict
        Every candidate's estimated Frobenius risk ``E ||g(C) - S||_F^2``.
    """

    name: str
    estimate: np.ndarray = field(repr=False)
    risks: Mapping[str, float]


def select_covariance(
    C: np.ndarray,
    std: np.ndarray,
    *,
    trace_bound: float | None = None,
    candidates: Sequence[str] | None = None,
    probes: int = DEFAULT_PROBES,
    seed: int = 0,
    noise: NoiseSampler | None = None,
) -> CovarianceChoice:
    """The candidate estimate with the smallest unbiased risk estimate (SURE).

    Post-processing: the choice and the estimate are functions of the release ``C``, its public
    noise law (``std`` or ``noise``), the public ``trace_bound`` and the public ``seed`` only.

    Parameters
    ----------
    C : ndarray
        The released ``m x m`` covariance.
    std : ndarray
        The ``m x m`` public std of its entries (the plan's ``released_entry_std()``).
    trace_bound : float, optional
        Public bound on the truth's trace: the declared domain's ``sup ||x||^2``.
    candidates : sequence of str, optional
        A subset of :data:`CANDIDATES` (default: every one that applies; ``spiked`` needs
        homogeneous off-diagonal noise, ``nuclear-domain`` a ``trace_bound``).
    probes : int, default 4
        Probes of the divergence.
    seed : int, default 0
        Public seed of the probes.
    noise : callable, optional
        Draw of the published noise law, for noise whose entries are correlated.

    Returns
    -------
    CovarianceChoice
        The chosen name, its estimate and every candidate's estimated risk.
    """
    if candidates is not None:
        unknown = sorted(set(candidates) - set(CANDIDATES))
        if unknown or not candidates:
            raise ValueError(f"candidates must be among {list(CANDIDATES)}, got {list(candidates)}")
    risks, estimates = sure_risks(
        C, std, trace_bound=trace_bound, probes=probes, seed=seed, noise=noise
    )
    allowed = [c for c in CANDIDATES if c in risks and (candidates is None or c in candidates)]
    if not allowed:
        raise ValueError(f"none of {list(candidates or [])} applies to this release")
    best = min(allowed, key=lambda c: (risks[c], CANDIDATES.index(c)))
    return CovarianceChoice(best, estimates[best], {c: risks[c] for c in allowed})
