"""The centered covariance's bounds: the mean step's sensitivity, the shifted box, symmetric noise
over a box, the two routes' expected errors and the augmented record's constant (docs/bounds.md,
Sec. 13 and 14)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mvg_dask.privacy.sensitivity.bounds import box_abs_max, outer_weighted_sups


def mean_l2_sensitivity(
    lower: np.ndarray, upper: np.ndarray, records: float, neighbours: str = "replace-one"
) -> float:
    """L2 sensitivity of the mean ``sum_j x_j / N`` over a box (docs/bounds.md, Sec. 14).

    Replace-one: ``(x - x') / N``, whose norm is at most ``||upper - lower|| / N`` (attained by
    the two opposite corners). Add/remove with a public normaliser ``N0 = records``:
    ``||x|| / N0 <= ||a|| / N0``, ``a_i = max(|lower_i|, |upper_i|)``.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.
    records : float
        ``N`` (replace-one) or the public ``N0`` (add/remove).
    neighbours : {"replace-one", "add-remove"}, default "replace-one"
        Neighbouring relation.

    Returns
    -------
    float
        The sensitivity.
    """
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    if neighbours == "replace-one":
        return float(np.linalg.norm(hi - lo)) / float(records)
    if neighbours == "add-remove":
        return float(np.linalg.norm(box_abs_max(lo, hi))) / float(records)
    raise ValueError(f"unknown neighbouring relation {neighbours!r}")


def mean_l2_sensitivity_ball(
    radius: float, records: float, neighbours: str = "replace-one"
) -> float:
    """L2 sensitivity of the mean over the ball ``||x|| <= C``: ``2C / N`` (replace-one, attained
    by ``x = -x'`` on the sphere) or ``C / N0`` (add/remove).

    Parameters
    ----------
    radius : float
        ``C``.
    records : float
        ``N`` or the public ``N0``.
    neighbours : {"replace-one", "add-remove"}, default "replace-one"
        Neighbouring relation.

    Returns
    -------
    float
        The sensitivity.
    """
    if neighbours not in ("replace-one", "add-remove"):
        raise ValueError(f"unknown neighbouring relation {neighbours!r}")
    factor = 2.0 if neighbours == "replace-one" else 1.0
    return factor * float(radius) / float(records)


def shifted_box(
    lower: np.ndarray, upper: np.ndarray, mu_hat: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The box of ``x - mu`` for ``x`` in ``[lower, upper]``, ``mu`` the released mean clamped
    into the box (post-processing; docs/bounds.md, Sec. 14).

    Every shifted interval contains 0; it keeps one sign only where ``mu_i`` is an end of the
    interval, so the covariance around ``mu`` takes the ``sqrt(2)`` factor of a mixed-sign box
    unless every ``mu_i`` is ``lower_i`` or ``upper_i``.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.
    mu_hat : ndarray
        The released (noisy) mean.

    Returns
    -------
    tuple of ndarray
        ``(lower - mu, upper - mu)`` with ``mu = clip(mu_hat, lower, upper)``.
    """
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    mu = np.clip(np.asarray(mu_hat, dtype=np.float64), lo, hi)
    return lo - mu, hi - mu


def symmetric_ratio_grid(m: int) -> np.ndarray:
    """The candidate ratios ``r`` of the planner's search (log grid on ``[1/2, 2 (m + 1)]`` and
    the closed-form optima ``1/2``, ``1/sqrt(2)``, ``(m + 1)/2``; docs/bounds.md, Sec. 5)."""
    return np.unique(
        np.concatenate(
            [np.geomspace(0.5, 2.0 * (m + 1), 241), [0.5, 1.0 / math.sqrt(2.0), (m + 1) / 2.0]]
        )
    )


def box_symmetric_unit_sensitivity(
    lower: np.ndarray,
    upper: np.ndarray,
    records: float,
    ratios: Sequence[float],
    neighbours: str = "replace-one",
) -> list[float]:
    """``Delta_1(r)``: the covariance's whitened sensitivity under symmetric noise with standard
    directions and unit precisions over a box (``CovarianceQuery.mahalanobis_sensitivity`` with
    ``precision = ones``), for each ratio.

    The least of the L2 bound ``(1 or sqrt(2)) R / N`` and Theorem 1/2's ``sqrt(Q*(r) / r) / N``
    with ``T_i = a_i^2``, ``S = R``, ``K = R^2`` (docs/bounds.md, Sec. 2, 4). At precisions
    ``c`` the sensitivity is ``c Delta_1(r)``.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds (a constant coordinate, ``lower_i == upper_i``, is allowed).
    records : float
        ``N``.
    ratios : sequence of float
        Ratios ``r >= 1/2``.
    neighbours : {"replace-one", "add-remove"}, default "replace-one"
        Neighbouring relation.

    Returns
    -------
    list of float
        ``Delta_1(r)`` per ratio.
    """
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    a = box_abs_max(lo, hi)
    T = a * a
    R = float(T.sum())
    sign_definite = bool(np.all((lo >= 0) | (hi <= 0)))
    replace_one = neighbours == "replace-one"
    one_sided = not replace_one or sign_definite
    s2 = (1.0 if one_sided else math.sqrt(2.0)) * R / float(records)
    area = R * R if T.size > 1 else 0.0
    qs = outer_weighted_sups(
        T, R, ratios=ratios, replace_one=replace_one, sign_definite=sign_definite, area_sup=area
    )
    return [
        float(min(s2, math.sqrt(q / r) / float(records))) for q, r in zip(qs, ratios, strict=True)
    ]


def box_symmetric_noise(
    lower: np.ndarray, upper: np.ndarray, records: float, mu: float
) -> tuple[float, float]:
    """Symmetric noise ``A S A^T``, ``A = sqrt(v) I``, calibrated to ``Delta_M = mu`` for the
    covariance over a box (replace-one), at the ratio that minimises its expected error.

    ``v = Delta_1(r) / mu`` and ``E ||A S A^T||_F^2 = v^2 (m + r m (m - 1))``
    (docs/bounds.md, Sec. 1, 5), minimised over :func:`symmetric_ratio_grid`.

    Parameters
    ----------
    lower, upper : ndarray
        Box bounds.
    records : float
        ``N``.
    mu : float
        The step's Gaussian-DP ``mu``.

    Returns
    -------
    tuple of float
        ``(v, r)``: the entry variance scale (diagonal ``v``, off-diagonal ``r v`` per entry of
        ``S`` times ``v``) and the ratio.
    """
    m = np.asarray(lower).size
    grid = symmetric_ratio_grid(m)
    d1s = box_symmetric_unit_sensitivity(lower, upper, records, list(grid))
    best_r, best_d, best_err = 0.5, math.inf, math.inf
    for r, d1 in zip(grid, d1s, strict=True):
        err = d1 * d1 * (m + float(r) * m * (m - 1))
        if err < best_err * (1.0 - 1e-12):
            best_r, best_d, best_err = float(r), d1, err
    return best_d / float(mu), best_r


@dataclass(frozen=True)
class CenteredRouteErrors:
    """Expected squared errors of the routes to the centered covariance and the mean at one
    total Gaussian-DP ``mu`` (docs/bounds.md, Sec. 14; :func:`centered_route_errors`).

    Attributes
    ----------
    augmented_covariance, augmented_mean, augmented_ratio : float
        Route (a), the second moment of ``[x; 1]``: ``E ||cov_hat - cov||_F^2``,
        ``E ||mean_hat - mean||^2`` and its symmetric ratio ``r``.
    centred_covariance, centred_mean, centred_ratio : float
        Route (a) about the box centre ``c`` (public): the second moment of ``[x - c; 1]``.
    mean_first_covariance, mean_first_mean, mean_first_ratio : float
        Route (b), a DP mean then the covariance around it, at the best budget split.
    mean_first_share : float
        ``mu_1^2 / mu^2``, the mean step's share of the squared budget.
    mean_first_worst_covariance : float
        Route (b)'s covariance error at the same split with the noise calibrated to the hull
        ``[-w, w]`` of every shifted box (valid whatever the released mean).
    """

    augmented_covariance: float
    augmented_mean: float
    augmented_ratio: float
    centred_covariance: float
    centred_mean: float
    centred_ratio: float
    mean_first_covariance: float
    mean_first_mean: float
    mean_first_share: float
    mean_first_ratio: float
    mean_first_worst_covariance: float

    def totals(self) -> dict[str, float]:
        """Covariance plus mean error of each route: ``augmented``, ``centred``,
        ``mean-first``."""
        return {
            "augmented": self.augmented_covariance + self.augmented_mean,
            "centred": self.centred_covariance + self.centred_mean,
            "mean-first": self.mean_first_covariance + self.mean_first_mean,
        }

    @property
    def choice(self) -> str:
        """The route with the smallest total error (ties: the earlier of ``augmented``,
        ``centred``, ``mean-first``)."""
        totals = self.totals()
        return min(totals, key=lambda k: totals[k])


def _symmetric_noise_error(v: float, r: float, m: int) -> float:
    """``E ||A S A^T||_F^2 = v^2 (m + r m (m - 1))``, ``A = sqrt(v) I`` (docs/bounds.md Sec. 1)."""
    return v * v * (m + r * m * (m - 1))


def augmented_route_errors(
    lower: np.ndarray,
    upper: np.ndarray,
    records: float,
    mu: float,
    *,
    shift: np.ndarray,
    mean: np.ndarray,
    scale: float = 1.0,
) -> tuple[float, float, float]:
    """Route (a) about a public ``shift`` ``c``: release ``M`` of ``z = [x - c; s]`` with
    symmetric noise ``sqrt(v) S sqrt(v)``; ``u = M[:m, m] / s``, ``mean = c + u``,
    ``cov = M[:m, :m] - u u^T``.

    With ``d = mean - c`` and ``e / s`` the noise of ``u`` (``e``'s entries ``N(0, r v^2)``,
    independent of the block's noise; ``sigma^2 = r v^2 / s^2``): ``E ||cov err||_F^2 = v^2 (m +
    r m (m - 1)) + 2 (m + 1) ||d||^2 sigma^2 + sigma^4 (m^2 + 2m)`` and ``E ||mean err||^2 =
    m sigma^2`` (docs/bounds.md, Sec. 14).

    Parameters
    ----------
    lower, upper : ndarray
        The box of ``x``.
    records : float
        ``N``.
    mu : float
        Gaussian-DP ``mu`` of the release.
    shift : ndarray
        ``c`` (zeros: the plain augmented record).
    mean : ndarray
        The data's mean (a plug-in).
    scale : float, default 1
        ``s``, the constant coordinate (:func:`augmented_scale`).

    Returns
    -------
    tuple of float
        ``(covariance error, mean error, r)``.
    """
    lo = np.asarray(lower, dtype=np.float64) - shift
    hi = np.asarray(upper, dtype=np.float64) - shift
    m = lo.size
    v, r = box_symmetric_noise(np.append(lo, scale), np.append(hi, scale), records, mu)
    d = np.asarray(mean, dtype=np.float64) - shift
    sigma_sq = r * v * v / (scale * scale)  # an off-diagonal entry's variance, over s^2
    cov = (
        _symmetric_noise_error(v, r, m)
        + 2.0 * (m + 1) * float(d @ d) * sigma_sq
        + sigma_sq * sigma_sq * (m * m + 2 * m)
    )
    return float(cov), float(m * sigma_sq), r


def mean_first_route_errors(
    lower: np.ndarray,
    upper: np.ndarray,
    records: float,
    mu: float,
    *,
    mean: np.ndarray,
    shares: Sequence[float],
) -> tuple[float, float, float, float, float]:
    """Route (b): the mean with ``N(0, s^2 I)``, ``s = ||upper - lower|| / (N mu_1)``, then
    ``sum (x - mu)(x - mu)^T / N`` with noise of the shifted box at ``mu_2``,
    ``mu_1^2 + mu_2^2 = mu^2``, the split ``mu_1^2 / mu^2`` the best of ``shares`` for the
    total (mean plus covariance) error.

    ``E ||cov err||_F^2 <= v_2^2 (m + r m (m - 1)) + s^4 (m^2 + 2m)``: the noise, and the bias
    ``d d^T``, ``d = xbar - clip(mu_hat)``, ``||d|| <= ||mu_hat - xbar||`` (the clamp is a
    projection onto a convex set holding ``xbar``); ``E ||mean err||^2 <= m s^2``
    (docs/bounds.md, Sec. 14). The shifted box is taken at ``mean`` (the plug-in).

    Parameters
    ----------
    lower, upper : ndarray
        The box of ``x``.
    records : float
        ``N``.
    mu : float
        Total Gaussian-DP ``mu``.
    mean : ndarray
        Plug-in for the released mean.
    shares : sequence of float
        Candidate ``mu_1^2 / mu^2`` in ``(0, 1)``.

    Returns
    -------
    tuple of float
        ``(covariance error, mean error, share, r, covariance error with the hull's noise)``.
    """
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    m = lo.size
    s_lo, s_hi = shifted_box(lo, hi, mean)
    v1, r = box_symmetric_noise(s_lo, s_hi, records, 1.0)  # v at mu_2 is v1 / mu_2
    w = hi - lo
    v_hull, r_hull = box_symmetric_noise(-w, w, records, 1.0)
    s1 = mean_l2_sensitivity(lo, hi, records)
    best = (math.inf, math.inf, 0.5, 0.0)
    for f in shares:
        if not 0.0 < f < 1.0:
            raise ValueError(f"a budget share must lie in (0, 1), got {f!r}")
        s_sq = s1 * s1 / (mu * mu * f)
        bias = s_sq * s_sq * (m * m + 2 * m)
        cov = _symmetric_noise_error(v1 / (mu * math.sqrt(1.0 - f)), r, m) + bias
        if cov + m * s_sq < best[0]:
            best = (cov + m * s_sq, cov, float(f), s_sq)
    _, cov, f, s_sq = best
    hull = _symmetric_noise_error(v_hull / (mu * math.sqrt(1.0 - f)), r_hull, m)
    return cov, m * s_sq, f, r, hull + s_sq * s_sq * (m * m + 2 * m)


def centered_route_errors(
    lower: np.ndarray,
    upper: np.ndarray,
    records: float,
    mu: float,
    *,
    mean: np.ndarray | None = None,
    shares: Sequence[float] | None = None,
    scale: float = 1.0,
) -> CenteredRouteErrors:
    """Expected squared errors of the centered covariance ``numpy.cov(X, bias=True)`` and of the
    mean by each route at one total Gaussian-DP ``mu`` (replace-one, box domain, standard
    directions, uniform precisions, symmetric noise at its best ratio; docs/bounds.md, Sec. 14).

    Routes: (a) the second moment of ``[x; 1]`` (:func:`augmented_route_errors`, shift 0); (a)
    about the box centre ``c``, ``[x - c; 1]``; (b) a DP mean, then the covariance around it
    (:func:`mean_first_route_errors`). The errors depend on the data's mean, which the plan does
    not see: ``mean`` is a plug-in (default: the box centre) for route (a)'s cross term and
    for the released mean of route (b) (its best case: the centre minimises the shifted box's
    ``R``). ``mean_first_worst_covariance`` drops the plug-in.

    Parameters
    ----------
    lower, upper : ndarray
        The box of ``x`` (``m`` features).
    records : float
        ``N`` (public under replace-one).
    mu : float
        Total Gaussian-DP ``mu``.
    mean : ndarray, optional
        Plug-in mean (clamped into the box); the box centre by default.
    shares : sequence of float, optional
        Candidate ``mu_1^2 / mu^2`` in ``(0, 1)``; by default 2000 log- and linearly spaced.
    scale : float, default 1
        The constant coordinate ``s`` of route (a) about the centre (``z = [x - c; s]``; a
        release takes :func:`augmented_scale`).

    Returns
    -------
    CenteredRouteErrors
        Every route's errors, the split and the ratios.
    """
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    centre = (lo + hi) / 2.0
    xbar = centre if mean is None else np.clip(np.asarray(mean, dtype=np.float64), lo, hi)
    grid: Sequence[float] = (
        [
            float(f)
            for f in np.unique(
                np.concatenate([np.geomspace(1e-6, 0.5, 1000), np.linspace(0.5, 0.999, 1000)])
            )
        ]
        if shares is None
        else shares
    )
    a = augmented_route_errors(lo, hi, records, mu, shift=np.zeros_like(lo), mean=xbar)
    c = augmented_route_errors(lo, hi, records, mu, shift=centre, mean=xbar, scale=scale)
    b = mean_first_route_errors(lo, hi, records, mu, mean=xbar, shares=grid)
    return CenteredRouteErrors(
        augmented_covariance=a[0],
        augmented_mean=a[1],
        augmented_ratio=a[2],
        centred_covariance=c[0],
        centred_mean=c[1],
        centred_ratio=c[2],
        mean_first_covariance=b[0],
        mean_first_mean=b[1],
        mean_first_share=b[2],
        mean_first_ratio=b[3],
        mean_first_worst_covariance=b[4],
    )


#: The exponents ``k`` of the constant coordinate ``s = 2^k`` :func:`augmented_scale` chooses
#: from: a power of two scales the Gram pass's sums exactly, and this range keeps ``s^2`` far
#: from float64's overflow and subnormals.
SCALE_EXPONENTS = range(-64, 65)


def augmented_scale(sup_sq: float, m: int) -> float:
    """The constant coordinate ``s = 2^k`` of the augmented record ``z = [x - c; s]`` that
    minimises the first-order worst-case expected squared error of the mean and the covariance
    computed from its second moment (docs/bounds.md, Sec. 14, "The constant's scale").

    With ``A = sup ||x - c||^2`` over the domain, the noise scale ``v`` follows ``R = A + s^2``;
    the mean ``c + M[:m, m] / s`` has error ``m r v^2 / s^2`` and the covariance ``v^2 (m + r m
    (m - 1)) + 2 (m + 1) ||d||^2 r v^2 / s^2`` to first order, ``||d||^2 = ||mean - c||^2 <= A``.
    At ``r = 1`` and the worst ``d`` the total is proportional to ``(A + s^2)^2 (m^2 + ((2m + 2)
    A + m) / s^2)``, minimised over :data:`SCALE_EXPONENTS` (ties: the smaller ``s``). It depends
    on the domain only, never on the data, the budget or the record count. A constant of ``1``
    instead costs ``4-190x`` the error on ``[0, 0.1]^m`` and ``6-41x`` on ``[0, 10]^m`` (1 to 300
    features), and nothing on ``[0, 1]^m`` from 5 to 200 features.

    Parameters
    ----------
    sup_sq : float
        ``A = sup ||x - c||^2`` (a box: ``sum ((upper - lower) / 2)^2`` about its centre; an L2
        ball about 0: its squared radius).
    m : int
        The records' features.

    Returns
    -------
    float
        ``s``, a power of two.
    """
    if not (math.isfinite(sup_sq) and sup_sq > 0) or m < 1:
        raise ValueError(f"augmented_scale needs A > 0 and m >= 1, got A={sup_sq!r}, m={m!r}")
    best_k, best = 0, math.inf
    for k in SCALE_EXPONENTS:
        t = math.ldexp(1.0, 2 * k)
        err = (sup_sq + t) ** 2 * (m * m + ((2 * m + 2) * sup_sq + m) / t)
        if err < best * (1.0 - 1e-12):
            best_k, best = k, err
    return math.ldexp(1.0, best_k)
