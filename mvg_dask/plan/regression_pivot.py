"""Intervals for regression coefficients from an exact Gaussian pivot of the released moments.

A regression's released moment is ``Y = M + E`` with ``E`` of the published Gaussian law
``B S B^T`` (``S`` symmetric, ``N(0, 1)`` on its diagonal and ``N(0, r)`` off it; the engine's
law, :func:`~mvg_dask.plan.derived_stats.published_noise_draws`). The coefficients ``beta`` of
the records solve the normal equations ``M_QQ beta = M_Qy`` (``Q`` the predictors, and the
constant with an intercept; ``y`` the target). So at the true ``beta``

``g(beta) = Y_Qy - Y_QQ beta = (E w)_Q``,   ``w = (1, -beta)``,

is *exactly* Gaussian with mean 0 and a covariance ``V(beta)`` that the noise law gives in
closed form, whatever ``M`` is. Its Anderson-Rubin statistic ``g^T V^{-1} g`` is exactly
chi-square, and the set of ``beta`` where it is at most ``c`` is a confidence set that needs
no estimate of ``M``: where the noise swamps the predictors' moment it is wide or unbounded,
as it must be (Gleser and Hwang 1987: in an errors-in-variables model an interval of bounded
length has infimum coverage 0). A coefficient's (or a linear combination's) interval is the
range of that set with ``c`` the chi-square quantile of one degree of freedom (a subvector
Anderson-Rubin interval), found by a fixed point: the end of the ellipsoid
``(beta - b) H (beta - b) <= c`` (``b`` the fit, ``H = Y_QQ^T V^{-1} Y_QQ``) with ``V`` taken
at that end. A direction in which the statistic stays below ``c`` makes both sides infinite;
where the fixed point does not settle without one, the end is searched on the profile (the
least statistic over the other coefficients) by doubling steps and bisection. The coverage
is measured in tests/test_derived_intervals.py (docs/guide/python.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

__all__ = ["pivot_covariance", "pivot_intervals", "pivot_problem"]

#: fixed-point iterations for an interval's end, and the relative change that counts as settled
ITERATIONS, TOLERANCE = 60, 1e-7
#: iterated GLS steps of the search for a direction in which the set has no end (and of a
#: profile's minimum); bisection steps of an end on the profile
GLS_ITERATIONS, BISECTIONS = 6, 12
#: iterated GLS steps of each profile evaluation (warm-started from the previous one)
PROFILE_ITERATIONS = 3
#: an end farther than this many times the fit's scale (plus 1) is taken as unbounded
UNBOUNDED = 1e8


def pivot_covariance(
    w: np.ndarray, B: np.ndarray, ratio: float, *, fixed_corner: bool = False
) -> np.ndarray:
    """``Cov((E w)_{1:})`` for ``E = B S B^T`` (rows of ``B`` in the order of ``w``: the target
    first, then the equations' rows), ``S`` symmetric with ``N(0, 1)`` on the diagonal and
    ``N(0, ratio)`` off it.

    ``Cov(S v) = ratio (|v|^2 I + v v^T) + (1 - 2 ratio) diag(v^2)`` with ``v = B^T w``. With
    ``fixed_corner`` the last entry of ``E``'s diagonal is excluded (the constant's moment is
    its exact value, not the released one).

    Parameters
    ----------
    w : ndarray
        ``(..., K)``.
    B : ndarray
        ``(K, J)``: the rows of ``E``'s factor that ``w`` weighs (``E = B S B^T`` with ``S``
        ``J x J``).
    ratio : float
        The off-diagonal variance ratio ``r``.
    fixed_corner : bool
        As above.

    Returns
    -------
    ndarray
        ``(..., K - 1, K - 1)``.
    """
    r = float(ratio)
    B = np.asarray(B, dtype=np.float64)
    k, K = B.shape
    head = B[:, :k]
    if np.all(B[:, k:] == 0) and np.all(head == np.diag(np.diag(head))):
        # standard directions: one outer product and a diagonal
        a = np.diag(head)
        v = np.concatenate([a * w, np.zeros((*w.shape[:-1], K - k))], axis=-1)
        Bv = a * a * w
        full = r * Bv[..., :, None] * Bv[..., None, :]
        idx = np.arange(k)
        full[..., idx, idx] += (
            a * a * (r * np.sum(v * v, axis=-1)[..., None] + (1 - 2 * r) * v[..., :k] ** 2)
        )
    else:
        v = w @ B  # B^T w
        Bv = v @ B.T
        outer = np.einsum("ka,la->akl", B, B)  # b_a b_a^T per column a
        diag_part = ((v * v) @ outer.reshape(K, k * k)).reshape(*v.shape[:-1], k, k)
        full = (
            r * np.sum(v * v, axis=-1)[..., None, None] * (B @ B.T)
            + r * Bv[..., :, None] * Bv[..., None, :]
            + (1.0 - 2.0 * r) * diag_part
        )
    V = np.array(full[..., 1:, 1:])
    if fixed_corner:
        u = B[-1]
        h = 2.0 * r * u * (v @ u)[..., None] + (1.0 - 2.0 * r) * u * u * v
        ch = (h @ B.T)[..., 1:]
        var = 2.0 * r * np.sum(u * u) ** 2 + (1.0 - 2.0 * r) * np.sum(u**4)
        wc = w[..., -1]
        V[..., :, -1] -= wc[..., None] * ch
        V[..., -1, :] -= wc[..., None] * ch
        V[..., -1, -1] += wc * wc * var
    return np.asarray(V)


def pivot_problem(
    values: np.ndarray,
    row_factor: np.ndarray,
    ratio: float,
    lam: np.ndarray,
    *,
    moment: bool,
    grouped: bool,
    scale: float,
    target: int,
    intercept: bool,
    centre: np.ndarray | None,
) -> dict[str, Any]:
    """What :func:`pivot_intervals` takes for the fits of a release's noisy variable.

    Parameters
    ----------
    values : ndarray
        ``(R, [G,] K, K)``: the noisy variable of ``R`` releases (a moment of ``[x - c; s]``,
        a ``gram`` or a covariance; one per group).
    row_factor : ndarray
        The plan's noise factor ``B`` (``E = B S B^T``).
    ratio : float
        The noise's off-diagonal variance ratio.
    lam : ndarray
        ``(G,)`` the ridge per group (on the predictors, not the constant).
    moment : bool
        ``values`` are moments of ``[x - c; s]`` (the constant last); else a ``gram`` or a
        covariance (no constant; no intercept).
    grouped : bool
        One per group (a moment's corner is then the group's noisy share, kept in the pivot).
    scale : float
        The moment's constant coordinate ``s``.
    target : int
        The target's index; every other feature is a predictor.
    intercept : bool
        Fit an intercept (a moment only).
    centre : ndarray, optional
        The moment's centre ``c``.

    Returns
    -------
    dict
        ``Y`` (``(R, G, K', K')``: ordered target, predictors, constant; the ridge on the
        predictors), ``B`` (the factor's rows in that order), ``ratio``, ``L`` (each
        coefficient; an intercept about the centre moved to the original coordinates, with its
        ``offset``) and ``fixed`` (the constant's moment is exact: an ungrouped moment).
    """
    V = np.asarray(values, dtype=np.float64)
    if not grouped:
        V = V[:, None]
    B = np.asarray(row_factor, dtype=np.float64)
    P = [i for i in range(V.shape[-1] - int(moment)) if i != target]
    cols = [target, *P]
    if moment:
        K = V.shape[-1]
        D = np.ones(K)
        D[-1] = 1.0 / scale
        V = V * D[:, None] * D[None, :]
        B = D[:, None] * B
        if grouped:  # a group without a positive share has no fit
            V = np.where((V[..., -1, -1] > 0)[..., None, None], V, np.nan)
        if intercept:
            cols.append(K - 1)
        elif centre is not None:  # the uncentred moment T M T^T
            T = np.eye(K)
            T[: K - 1, K - 1] = centre
            V, B = T @ V @ T.T, T @ B
    Y = np.array(V[..., cols, :][..., :, cols])
    fixed = moment and intercept and not grouped
    if fixed:
        Y[..., -1, -1] = 1.0
    p = len(P)
    idx = np.arange(1, p + 1)
    Y[..., idx, idx] += np.asarray(lam, dtype=np.float64)[None, :, None]
    L = np.eye(len(cols) - 1)
    offset = np.zeros(len(cols) - 1)
    if moment and intercept and centre is not None:
        L[-1, :p] = -np.asarray(centre)[P]
        offset[-1] = centre[target]
    return {"Y": Y, "B": B[cols], "ratio": ratio, "L": L, "offset": offset, "fixed": fixed}


def pivot_intervals(
    Y: np.ndarray,
    B: np.ndarray,
    ratio: float,
    functionals: np.ndarray,
    level: float,
    *,
    fixed_corner: bool = False,
) -> dict[str, np.ndarray]:
    """Intervals for linear functionals ``L beta`` of the coefficients solving
    ``Y_QQ beta = Y_Qy`` from the pivot above.

    Parameters
    ----------
    Y : ndarray
        ``(..., K, K)`` released moments ordered ``(y, Q)`` (the target first), with any ridge
        already on ``Y_QQ`` and, with ``fixed_corner``, the constant's exact moment in the last
        corner.
    B : ndarray
        ``(K, J)`` the rows of the noise factor in the same order (``E = B S B^T``, ``S``
        ``J x J``).
    ratio : float
        The noise's off-diagonal variance ratio.
    functionals : ndarray
        ``(n, K - 1)``: row ``i`` is ``L_i``.
    level : float
        Coverage, in (0, 1).
    fixed_corner : bool
        The last diagonal entry is exact (its noise excluded from the pivot).

    Returns
    -------
    dict of ndarray
        ``value``, ``lower``, ``upper`` (``+-inf`` where the set has no end on that side) and
        ``std`` (the delta method's at the fit), each ``(..., n)``; NaN where ``Y_QQ`` is
        singular or not finite.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    c = float(stats.chi2.ppf(level, 1))
    Y = np.asarray(Y, dtype=np.float64)
    Y = 0.5 * (Y + np.swapaxes(Y, -1, -2))
    L = np.asarray(functionals, dtype=np.float64)
    lead = Y.shape[:-2]
    ok = np.all(np.isfinite(Y), axis=(-2, -1))
    Y = np.where(ok[..., None, None], Y, np.eye(Y.shape[-1]))
    R = Y[..., 1:, 1:]
    ok &= np.linalg.cond(R) < 1e14
    R = np.where(ok[..., None, None], R, np.eye(R.shape[-1]))
    G = np.linalg.inv(R)
    b = (G @ Y[..., 1:, 0:1])[..., 0]
    n = L.shape[0]
    unbounded = _unbounded(Y, B, ratio, L, c, fixed_corner)
    # the delta method's std at the fit: H^-1 = G V G^T with V at b
    w0 = np.concatenate([np.ones((*lead, 1)), -b], axis=-1)
    H_inv = G @ pivot_covariance(w0, B, ratio, fixed_corner=fixed_corner) @ np.swapaxes(G, -1, -2)
    std = np.sqrt(np.maximum(np.einsum("ij,...jk,ik->...i", L, H_inv, L), 0.0))
    n_eq = b.shape[-1]
    ends = _ends(
        G.reshape(-1, *G.shape[-2:]),
        b.reshape(-1, b.shape[-1]),
        B,
        ratio,
        L,
        c,
        unbounded.reshape(-1, n),
        fixed_corner,
    )
    retry = np.isinf(ends) & ~unbounded.reshape(-1, n)[..., None]
    if np.any(retry):  # no certificate of an unbounded set: search the end on the profile
        fit, fun, sd = np.nonzero(retry)
        R = Y[..., 1:, 1:].reshape(-1, n_eq, n_eq)
        r0 = Y[..., 1:, 0].reshape(-1, n_eq)
        problem = (R[fit], r0[fit], L[fun], np.where(sd == 0, -1.0, 1.0))
        start = std.reshape(-1, n)[fit, fun]
        ends[fit, fun, sd] = _profile_end(problem, B, ratio, c, start, fixed_corner)
    ends = ends.reshape(*lead, n, 2)
    value = np.sum(L * b[..., None, :], axis=-1)
    nan = ~ok[..., None]
    return {
        "value": np.where(nan, np.nan, value),
        "lower": np.where(nan, -np.inf, ends[..., 0]),
        "upper": np.where(nan, np.inf, ends[..., 1]),
        "std": np.where(nan, np.nan, std),
    }


def _unbounded(
    Y: np.ndarray, B: np.ndarray, ratio: float, L: np.ndarray, c: float, fixed_corner: bool
) -> np.ndarray:
    """Whether the set has no end (``(..., n)``): a direction ``w = (0, -beta)`` with
    ``L beta = 1`` and ``AR(w) <= c`` (found by iterated GLS; the statistic is homogeneous of
    degree 0 in ``w``, so the set holds points of ``L beta`` beyond any bound)."""
    p = L.shape[1]
    norm2 = np.sum(L * L, axis=-1)
    base = L / norm2[:, None]  # L base = 1
    # an orthonormal basis of each L's complement, (n, p, p - 1)
    _, _, vt = np.linalg.svd(L[:, None, :])
    N = np.swapaxes(vt[:, 1:, :], -1, -2)
    R = Y[..., None, 1:, 1:]  # (..., 1, p, p)
    g0 = (R @ base[..., None])[..., 0]  # (..., n, p): Y_QQ base
    A = R @ N  # (..., n, p, p - 1)
    x = np.zeros((*A.shape[:-2], p - 1))
    best = np.full(A.shape[:-2], np.inf)
    for _ in range(GLS_ITERATIONS):
        beta = base + (N @ x[..., None])[..., 0]
        w = np.concatenate([np.zeros((*beta.shape[:-1], 1)), -beta], axis=-1)
        V = pivot_covariance(w, B, ratio, fixed_corner=fixed_corner)
        g = g0 + (A @ x[..., None])[..., 0]
        best = np.minimum(best, np.sum(g * np.linalg.solve(V, g[..., None])[..., 0], axis=-1))
        ViA = np.linalg.solve(V, A)
        lhs = np.swapaxes(A, -1, -2) @ ViA
        rhs = np.swapaxes(ViA, -1, -2) @ g0[..., None]
        x = -np.linalg.solve(lhs, rhs)[..., 0]
    return np.asarray(best <= c)


def _ends(
    G: np.ndarray,
    b: np.ndarray,
    B: np.ndarray,
    ratio: float,
    L: np.ndarray,
    c: float,
    unbounded: np.ndarray,
    fixed_corner: bool,
) -> np.ndarray:
    """The ends ``(F, n, 2)`` of the set's range of each ``L_i beta`` for ``F`` fits (``G``
    the inverses of their ``Y_QQ``, ``b`` the fits): the fixed point of "the end of the
    ellipsoid with ``V`` at the end"; ``+-inf`` where it does not settle, or is unbounded."""
    F = b.shape[0]
    n = L.shape[0]
    fit, fun, sd = (
        a.reshape(-1) for a in np.meshgrid(np.arange(F), np.arange(n), [0, 1], indexing="ij")
    )
    side = np.where(sd == 0, -1.0, 1.0)
    end = np.where(unbounded[fit, fun], side * np.inf, np.nan)
    active = np.flatnonzero(~unbounded[fit, fun])
    beta = b[fit[active]]
    scale = 1.0 + np.abs(b).max(axis=-1)
    for _ in range(ITERATIONS):
        if active.size == 0:
            break
        f, i, sg = fit[active], fun[active], side[active]
        w = np.concatenate([np.ones((active.size, 1)), -beta], axis=-1)
        V = pivot_covariance(w, B, ratio, fixed_corner=fixed_corner)
        Gf = G[f]
        q = (Gf @ (V @ (np.swapaxes(Gf, -1, -2) @ L[i][..., None])))[..., 0]  # H^-1 L
        sigma = np.sqrt(np.maximum(np.sum(L[i] * q, axis=-1), 1e-300))
        new = np.sum(L[i] * b[f], axis=-1) + sg * np.sqrt(c) * sigma
        beta = b[f] + (sg * np.sqrt(c) / sigma)[:, None] * q
        done = np.abs(new - end[active]) <= TOLERANCE * (np.abs(new) + sigma)
        far = np.abs(beta).max(axis=-1) > UNBOUNDED * scale[f]
        end[active] = np.where(far, sg * np.inf, new)
        keep = ~(done | far)
        active, beta = active[keep], beta[keep]
    end[active] = side[active] * np.inf
    return end.reshape(F, n, 2)


def _profile_end(
    problem: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    B: np.ndarray,
    ratio: float,
    c: float,
    start: np.ndarray,
    fixed_corner: bool,
) -> np.ndarray:
    """The end of ``{L beta : AR(beta) <= c}`` on one side, for problems ``(R, r0, L, side)``
    (``R = Y_QQ``, ``r0 = Y_Qy``, each with a leading axis of problems) whose fixed point did
    not settle and whose set has no certified unbounded direction: steps of doubling length
    from the fit (``start`` the delta method's std) until the profile ``min AR`` over
    ``L beta = t`` (iterated GLS) exceeds ``c``, then bisection. ``+-inf`` where no step up to
    ``2^40`` std is rejected."""
    R, r0, L, side = problem
    base = L / np.sum(L * L, axis=-1, keepdims=True)
    _, _, vt = np.linalg.svd(L[:, None, :])
    N = np.swapaxes(vt[:, 1:, :], -1, -2)
    A = R @ N
    fit = np.linalg.solve(R, r0[..., None])[..., 0]
    t0 = np.sum(L * fit, axis=-1)
    x0 = (np.swapaxes(N, -1, -2) @ fit[..., None])[..., 0]
    scale = np.maximum(start, 1e-300) * np.sqrt(c)

    def accepted(t: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = r0 - (R @ (base * t[:, None])[..., None])[..., 0]
        best = np.full(t.shape, np.inf)
        for _ in range(PROFILE_ITERATIONS):
            beta = base * t[:, None] + (N @ x[..., None])[..., 0]
            w = np.concatenate([np.ones((t.size, 1)), -beta], axis=-1)
            V = pivot_covariance(w, B, ratio, fixed_corner=fixed_corner)
            g = h - (A @ x[..., None])[..., 0]
            best = np.minimum(best, np.sum(g * np.linalg.solve(V, g[..., None])[..., 0], -1))
            ViA = np.linalg.solve(V, A)
            lhs = np.swapaxes(A, -1, -2) @ ViA
            x = np.linalg.solve(lhs, (np.swapaxes(ViA, -1, -2) @ h[..., None]))[..., 0]
        return best <= c, x

    lo = t0.copy()
    hi = np.full(t0.shape, np.nan)
    x = x0
    open_ = np.ones(t0.shape, dtype=bool)
    for k in range(41):
        t = t0 + side * scale * 2.0**k
        ok, x_new = accepted(t, x)
        x = np.where(open_[:, None] & ok[:, None], x_new, x)
        lo = np.where(open_ & ok, t, lo)
        hi = np.where(open_ & ~ok, t, hi)
        open_ &= ok
        if not np.any(open_):
            break
    bounded = ~np.isnan(hi)
    hi = np.where(bounded, hi, lo)
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        ok, x_new = accepted(mid, x)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
        x = np.where(ok[:, None], x_new, x)
    return np.where(bounded, hi, side * np.inf)
