"""Sensitivity bounds over a declared record domain: quadratic forms over a box, a box's entry
ranges, and the outer-product (covariance) sups with per-entry weights (docs/bounds.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def lambda_max(P: np.ndarray) -> float:
    """Largest eigenvalue of a symmetric matrix.

    Parameters
    ----------
    P : ndarray
        Symmetric ``m x m`` matrix.

    Returns
    -------
    float
        ``lambda_max(P)``.
    """
    return float(np.linalg.eigvalsh(P)[-1])


def abs_quadratic_form(P: np.ndarray, v: np.ndarray) -> float:
    """``sum_ij |P_ij| v_i v_j`` for a non-negative vector ``v``.

    Parameters
    ----------
    P : ndarray
        ``m x m`` matrix.
    v : ndarray
        Non-negative vector of length ``m``.

    Returns
    -------
    float
        An upper bound of ``x^T P x`` over all ``|x_i| <= v_i``.
    """
    v = np.asarray(v, dtype=np.float64)
    return float(v @ np.abs(P) @ v)


def sup_quadratic_box(P: np.ndarray, half_widths: np.ndarray) -> float:
    """Upper bound of ``x^T P x`` over ``|x_i| <= h_i``.

    ``min(sum_ij |P_ij| h_i h_j, lambda_max(P) ||h||^2)``; exact when ``P`` is diagonal.

    Parameters
    ----------
    P : ndarray
        Symmetric positive semi-definite ``m x m`` matrix.
    half_widths : ndarray
        ``h``, non-negative.

    Returns
    -------
    float
        The bound.
    """
    h = np.asarray(half_widths, dtype=np.float64)
    return min(abs_quadratic_form(P, h), lambda_max(P) * float(h @ h))


def sup_quadratic_interval_box(P: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """Upper bound of ``x^T P x`` over the box ``lower <= x <= upper`` (docs/bounds.md, Lemma 5).

    The minimum of :func:`sup_quadratic_box` on the symmetric hull (``|x_i| <= a_i``) and of the
    centred bound: with ``x = c + z``, ``c`` the centre and ``|z_i| <= h_i`` the half widths,
    ``x^T P x = c^T P c + 2 (P c)^T z + z^T P z <= c^T P c + 2 sum_i |(P c)_i| h_i +
    sup_{|z| <= h} z^T P z``. The centred bound is much tighter on boxes far from symmetric
    (``[0, 1]^m`` with rotated directions).

    Parameters
    ----------
    P : ndarray
        Symmetric positive semi-definite ``m x m`` matrix.
    lower, upper : ndarray
        Box bounds.

    Returns
    -------
    float
        The bound.
    """
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    hull = sup_quadratic_box(P, box_abs_max(lo, hi))
    c = (lo + hi) / 2.0
    h = (hi - lo) / 2.0
    Pc = P @ c
    centred = float(c @ Pc) + 2.0 * float(np.abs(Pc) @ h) + sup_quadratic_box(P, h)
    return min(hull, centred)


def box_abs_max(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``a_i = max(|lower_i|, |upper_i|)``: the largest magnitude of feature ``i`` in the box.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.

    Returns
    -------
    ndarray
        ``a``.
    """
    return np.maximum(np.abs(np.asarray(lower, float)), np.abs(np.asarray(upper, float)))


def box_entry_range(lower: np.ndarray, upper: np.ndarray) -> tuple[float, float]:
    """Range of one entry of a record in a box: ``[min lower, max upper]``.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.

    Returns
    -------
    tuple of float
        ``(a, b)``.
    """
    return float(np.min(lower)), float(np.max(upper))


def box_outer_entry_range(lower: np.ndarray, upper: np.ndarray) -> tuple[float, float]:
    """Range of an entry of ``x x^T`` (hence of ``X X^T / N``) for ``x`` in a box.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.

    Returns
    -------
    tuple of float
        ``(a, b)`` with ``a <= x_i x_j <= b`` for all ``i, j`` and all ``x`` in the box.
    """
    lo = np.asarray(lower, float)
    hi = np.asarray(upper, float)
    corners = np.stack(
        [np.outer(lo, lo), np.outer(lo, hi), np.outer(hi, lo), np.outer(hi, hi)], axis=0
    )
    low = float(corners.min())
    # the diagonal x_i^2 is >= 0 even when the corner products are negative
    return low, float(corners.max())


# ---------------------------------------------------------------------------------------------
# Outer-product (covariance) sensitivities with per-entry weights: docs/bounds.md.


def _check_ratio(ratio: float) -> None:
    if not (np.isfinite(ratio) and ratio >= 0.5):
        raise ValueError(
            f"the symmetric noise ratio b^2/a^2 must be a finite number >= 0.5, got {ratio!r}"
        )


def outer_weighted_sup(
    coord_sups: np.ndarray,
    quad_sup: float,
    *,
    ratio: float,
    replace_one: bool,
    sign_definite: bool = False,
    area_sup: float | None = None,
) -> float:
    """Upper bound of ``sup Q(y y^T - y' y'^T)``, ``Q(D) = sum_{i<j} D_ij^2 + ratio sum_i D_ii^2``.

    ``y`` and ``y'`` range over a set ``Y`` of vectors described by ``T_i >= sup_Y y_i^2``
    (``coord_sups``) and ``S >= sup_Y ||y||^2`` (``quad_sup``); add/remove neighbours compare
    ``y y^T`` with ``0``. ``Q`` with ``ratio = 1`` is ``||vech(D)||^2`` (each off-diagonal entry
    counted once), with ``ratio = 1/2`` it is ``||D||_F^2 / 2``. Proofs: ``docs/bounds.md``,
    Theorems 1 (any ``Y``) and 2 (every ``y_i`` of constant sign on ``Y``).

    Parameters
    ----------
    coord_sups : ndarray
        ``T_i``, non-negative.
    quad_sup : float
        ``S``.
    ratio : float
        ``r >= 1/2``.
    replace_one : bool
        Replace-one (``y'`` in ``Y``) or add/remove (``y' = 0``).
    sign_definite : bool, default False
        True when every coordinate ``y_i`` has one sign on ``Y`` (``y_i y'_i >= 0``); enables
        Theorem 2.
    area_sup : float, optional
        ``K >= sup (||y||^2 ||y'||^2 - (y . y')^2)``, the squared area of the parallelogram of
        two points (docs/bounds.md, Lemma 3: ``lambda_1 lambda_2 R^2`` for ``y = A^-1 x``);
        by default ``S^2``.

    Returns
    -------
    float
        The bound.
    """
    return outer_weighted_sups(
        coord_sups,
        quad_sup,
        ratios=[ratio],
        replace_one=replace_one,
        sign_definite=sign_definite,
        area_sup=area_sup,
    )[0]


def outer_weighted_sups(
    coord_sups: np.ndarray,
    quad_sup: float,
    *,
    ratios: Sequence[float],
    replace_one: bool,
    sign_definite: bool = False,
    area_sup: float | None = None,
) -> list[float]:
    """:func:`outer_weighted_sup` for each of ``ratios``, sharing the work that does not depend
    on the ratio.

    The bound is ``max_k (g_k + c L_k)`` over a few knots ``k``, ``c = ratio - 1/2``, with
    ``g_k`` and ``L_k`` functions of ``T``, ``S`` and ``K`` alone (and, for sign-definite
    coordinates, the least of it and Theorem 2's ``g + c L``): each is computed once, then
    evaluated per ratio with the same floating-point operations as for one ratio.

    Parameters
    ----------
    coord_sups, quad_sup, replace_one, sign_definite, area_sup
        As for :func:`outer_weighted_sup`.
    ratios : sequence of float
        Ratios ``r >= 1/2``.

    Returns
    -------
    list of float
        The bound for each ratio, in order.
    """
    for ratio in ratios:
        _check_ratio(ratio)
    T = np.asarray(coord_sups, dtype=np.float64)
    t_sum = float(T.sum())
    tau = float(T.max())
    t_sq = float(T @ T)
    S = min(float(quad_sup), t_sum)
    if tau <= 0 or S <= 0:
        return [0.0 for _ in ratios]
    theorem2: tuple[float, float] | None = None
    if not replace_one:
        # Q(y y^T) = s^2/2 + c sum y_i^4 <= s^2/2 + c min(tau s, sum T_i^2), s = ||y||^2 <= S
        terms = [(0.5 * s * s, min(tau * s, t_sq)) for s in (S, min(S, t_sq / tau))]
    else:
        K = S * S if area_sup is None else min(max(float(area_sup), 0.0), S * S)
        terms = []
        knots = [0.0, S, 2.0 * S, S + K / S, t_sum, t_sq / tau, 2.0 * t_sum - t_sq / tau]
        for u in knots:
            if not 0.0 <= u <= 2.0 * S:
                continue
            # ||D||_F^2 / 2 = (s - t)^2 / 2 + (s t - (y.y')^2) <= (s - t)^2 / 2 + min(s t, K),
            # largest at the most unequal split of u = s + t
            s = min(u, S)
            t = u - s
            g = 0.5 * (s - t) ** 2 + min(s * t, K)
            terms.append((g, min(tau * u, tau * (2.0 * t_sum - u), t_sq)))
        if sign_definite:
            M = min(t_sum, 2.0 * S)
            theorem2 = (0.5 * M * M, min(tau * M, t_sq))
    out = []
    for ratio in ratios:
        c = ratio - 0.5
        bound = max(g + c * L for g, L in terms)
        if theorem2 is not None:
            bound = min(bound, theorem2[0] + c * theorem2[1])
        out.append(float(bound))
    return out


#: Largest dimension :func:`traceless_box_sup` enumerates (``2m 2^(2m - 1)`` box edges).
TRACELESS_MAX_FEATURES = 8


def traceless_box_sup(
    lower_sq: np.ndarray, upper_sq: np.ndarray, *, ratio: float, replace_one: bool = True
) -> float:
    """Upper bound of ``sup Q(P(y y^T - y' y'^T))`` for the traceless part ``P(D)``.

    ``P(D) = D - (tr D / m) I`` and ``Q(D) = sum_{i<j} D_ij^2 + ratio sum_i D_ii^2``, so
    ``Q(P(D)) = sum_{i<j} D_ij^2 + ratio (sum_i D_ii^2 - (tr D)^2 / m)``: the weighted
    sensitivity of the traceless covariance ``S - (tr S / m) I`` under symmetric noise, for
    uniform precisions (the whitening is a multiple of an orthogonal map, which keeps ``I``).
    Each ``y_i^2`` ranges over ``[lower_sq_i, upper_sq_i]``. Proof (docs/bounds.md, Sec. 9):
    dropping ``-(y . y')^2`` gives a quadratic ``G`` in ``(y_i^2, y'_i^2)`` that is convex on
    every slice ``sum y_i^2 - sum y'_i^2 = const``, whose vertices lie on the edges of the box of
    squares; ``G`` is maximised exactly along every edge (a one-variable quadratic).

    Parameters
    ----------
    lower_sq, upper_sq : ndarray
        Range of each ``y_i^2`` (``0 <= lower_sq_i <= upper_sq_i``), length ``m <= 8``.
    ratio : float
        ``r >= 1/2``.
    replace_one : bool, default True
        Replace-one (``y'`` in the same set) or add/remove (``y' = 0``).

    Returns
    -------
    float
        The bound.

    Raises
    ------
    ValueError
        If ``m > 8`` (the enumeration would be too large) or the ranges are invalid.
    """
    _check_ratio(ratio)
    lo = np.asarray(lower_sq, dtype=np.float64)
    hi = np.asarray(upper_sq, dtype=np.float64)
    m = lo.size
    if m > TRACELESS_MAX_FEATURES:
        raise ValueError(
            f"the traceless bound enumerates the edges of a {2 * m}-dimensional box; "
            f"at most {TRACELESS_MAX_FEATURES} features are supported, got {m}"
        )
    if lo.shape != hi.shape or np.any(lo < 0) or np.any(hi < lo):
        raise ValueError("need 0 <= lower_sq <= upper_sq, of one length")
    # z = (y_i^2, y'_i^2); add/remove fixes y' = 0, so one formula serves both relations
    lo_z = np.concatenate([lo, lo if replace_one else np.zeros(m)])
    hi_z = np.concatenate([hi, hi if replace_one else np.zeros(m)])
    dims = 2 * m
    c = ratio - 0.5

    def g(z: np.ndarray) -> np.ndarray:
        a, b = z[..., :m], z[..., m:]
        A, B = a.sum(axis=-1), b.sum(axis=-1)
        return np.asarray(
            0.5 * A * A + 0.5 * B * B + c * np.sum((a - b) ** 2, axis=-1) - ratio * (A - B) ** 2 / m
        )

    corners = ((np.arange(2 ** (dims - 1))[:, None] >> np.arange(dims - 1)) & 1).astype(bool)
    best = 0.0
    for k in range(dims):
        best = _edge_sup(g, corners, lo_z, hi_z, k, best)
    return float(best)


def _edge_sup(
    g: Callable[[np.ndarray], np.ndarray],
    corners: np.ndarray,
    lo_z: np.ndarray,
    hi_z: np.ndarray,
    k: int,
    best: float,
) -> float:
    """:func:`traceless_box_sup` along the box edges in direction ``k`` (``corners``: the other
    coordinates' ends): the larger of ``best`` and the exact maximum of ``g`` on those edges."""
    dims = lo_z.size
    rest = [i for i in range(dims) if i != k]
    z = np.empty((corners.shape[0], dims))
    z[:, rest] = np.where(corners, hi_z[rest], lo_z[rest])
    # G along the edge is q(t) = g0 + g1 t + g2 t^2 for t in [lo_k, hi_k]: three exact samples
    t0, t1 = lo_z[k], hi_z[k]
    vals = []
    for t in (t0, t1):
        z[:, k] = t
        vals.append(g(z))
    best = max(best, float(np.max(vals[0])), float(np.max(vals[1])))
    if t1 > t0:
        z[:, k] = 0.5 * (t0 + t1)
        mid = g(z)
        h = 0.5 * (t1 - t0)
        g2 = (vals[0] + vals[1] - 2.0 * mid) / (2.0 * h * h)  # curvature / 2
        g1 = (vals[1] - vals[0]) / (2.0 * h)  # slope at the midpoint
        inner = (g2 < 0) & (np.abs(g1) < -2.0 * g2 * h)  # concave, vertex inside
        if np.any(inner):
            peak = mid[inner] - g1[inner] ** 2 / (4.0 * g2[inner])
            best = max(best, float(np.max(peak)))
    return best


def box_linear_range(
    lower: np.ndarray, upper: np.ndarray, W: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Exact range ``[inf, sup]`` of ``w_i . x`` over the box, for every column ``w_i`` of ``W``.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds (length ``m``).
    W : ndarray
        ``m x k`` matrix.

    Returns
    -------
    tuple of ndarray
        ``(inf, sup)``, each of length ``k``.
    """
    lo = np.asarray(lower, float)[:, None] * W
    hi = np.asarray(upper, float)[:, None] * W
    return np.minimum(lo, hi).sum(axis=0), np.maximum(lo, hi).sum(axis=0)
