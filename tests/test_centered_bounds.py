"""The centered covariance's bounds (docs/bounds.md, Sec. 13 and 14) against optimisation.

Route (a): the covariance machinery on the augmented record ``z = [x - c; s]`` (a box gains
the constant coordinate ``[s, s]``, a ball of radius ``C`` the enclosing ball of radius
``sqrt(C^2 + s^2)``; most cases at ``c = 0``, ``s = 1``). Route (b): a DP mean, then the
covariance around it on the shifted box. Each bound is checked, as in tests/test_bounds.py, by
L-BFGS-B from many random starts over the records ``x`` (the constant coordinate appended,
never optimised), plus corners where stated. Seeds are stated; the tests are deterministic.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from scipy.optimize import minimize

from mvg_dask.plan import BoxDomain, L2BallDomain
from mvg_dask.plan.domain import augmented_domain, domain_from_dict
from mvg_dask.plan.queries import CovarianceQuery
from mvg_dask.plan.symmetric_ratio import best_symmetric_ratio
from mvg_dask.privacy import sensitivity as sens

STARTS = 20
REL = 1e-9
RATIOS = (0.5, 1 / math.sqrt(2), 2.5, 4.0)


def q_weighted(D: np.ndarray, r: float) -> float:
    """Q_r(D) = sum_{i<j} D_ij^2 + r sum_i D_ii^2, entry by entry."""
    m = D.shape[0]
    off = sum(D[i, j] ** 2 for i in range(m) for j in range(i + 1, m))
    return float(off + r * np.sum(np.diag(D) ** 2))


def aug(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    return np.append(x, scale)


def maximise(objective, lower, upper, pairs: bool, rng, *, radius: float | None = None) -> float:
    """Largest objective(x, x') found over records x, x' of the box (or of the ball of
    ``radius``) from STARTS random starts; add/remove compares with x' = None."""
    m = len(lower)
    lo = np.tile(lower, 2 if pairs else 1)
    hi = np.tile(upper, 2 if pairs else 1)
    bounds = None if radius is not None else list(zip(lo, hi, strict=True))

    def record(z: np.ndarray) -> np.ndarray:
        if radius is None:
            return z
        norm = np.linalg.norm(z)
        return z if norm <= radius else z * (radius / norm)

    def f(z: np.ndarray) -> float:
        x = record(z[:m])
        xp = record(z[m:]) if pairs else None
        return -objective(x, xp)

    best = 0.0
    for _ in range(STARTS):
        z0 = rng.uniform(lo, hi)
        if radius is not None:
            z0 = z0 * (radius * rng.uniform(0.7, 1.0) / np.linalg.norm(z0))
        res = minimize(f, z0, bounds=bounds, method="L-BFGS-B")
        best = max(best, -float(res.fun), -f(z0))
    return best


def corners_max(objective, lower, upper, pairs: bool) -> float:
    """Brute force over the box's corners (pairs of corners, or corners and 0)."""
    m = len(lower)
    corners = [np.where(np.array(c), upper, lower) for c in itertools.product([0, 1], repeat=m)]
    if not pairs:
        return max(objective(x, None) for x in corners)
    return max(objective(x, xp) for x in corners for xp in corners)


def aug_diff(x: np.ndarray, xp: np.ndarray | None, scale: float = 1.0) -> np.ndarray:
    z = aug(x, scale)
    D = np.outer(z, z)
    return D if xp is None else D - np.outer(aug(xp, scale), aug(xp, scale))


def boxes(m: int, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    lo = rng.uniform(-2.0, 0.5, m)
    return {
        "unit": (np.zeros(m), np.ones(m)),
        "sym": (-np.ones(m), np.ones(m)),
        "asym": (lo, lo + rng.uniform(0.2, 2.0, m)),
        "positive": (np.full(m, 0.5), np.linspace(1.0, 2.0, m)),
    }


# -- the degenerate coordinate -----------------------------------------------------------------


def test_box_with_a_constant_coordinate_is_accepted_only_when_asked():
    with pytest.raises(ValueError, match="lower must be < upper"):
        BoxDomain.create([0.0, 1.0], [1.0, 1.0], 2)
    box = BoxDomain.create([0.0, 1.0], [1.0, 1.0], 2, allow_equal=True)
    assert box.widths[1] == 0.0 and box.sign_definite
    with pytest.raises(ValueError, match="lower must be <= upper"):
        BoxDomain.create([0.0, 2.0], [1.0, 1.0], 2, allow_equal=True)
    auged = augmented_domain(BoxDomain.create(-1, 1, 3))
    assert isinstance(auged, BoxDomain)
    np.testing.assert_array_equal(auged.lower, [-1, -1, -1, 1])
    np.testing.assert_array_equal(auged.upper, [1, 1, 1, 1])
    centred = augmented_domain(BoxDomain.create(0, 1, 3), shift=np.full(3, 0.5))
    np.testing.assert_array_equal(centred.lower, [-0.5, -0.5, -0.5, 1])
    assert not centred.sign_definite
    with pytest.raises(ValueError, match="centre 0"):
        augmented_domain(L2BallDomain(1.0, 3), shift=np.ones(3))
    # a stored augmented domain rebuilds (the plan's JSON round trip)
    again = domain_from_dict(auged.to_dict(), 4)
    assert isinstance(again, BoxDomain)
    np.testing.assert_array_equal(again.lower, auged.lower)
    # every bound the covariance query takes is finite on it
    q = CovarianceQuery(4, 10)
    W = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))[0]
    P = (W * np.array([0.4, 0.3, 0.2, 0.1])) @ W.T
    for algorithm in ("unimodal", "equi-modal"):
        assert math.isfinite(q.mahalanobis_sensitivity(auged, "replace-one", P, algorithm))
    assert math.isfinite(
        q.mahalanobis_sensitivity(auged, "replace-one", P, "symmetric", directions=W, ratio=2.0)
    )
    assert math.isfinite(auged.sup_quadratic(P)) and auged.sup_quadratic_diff(P) >= 0


@pytest.mark.parametrize("radius", [0.3, 1.0, 1.0 + 1e-16, 2.5, 1e8])
def test_augmented_ball_radius_is_never_below_the_true_one(radius):
    ball = augmented_domain(L2BallDomain(radius, 3))
    assert isinstance(ball, L2BallDomain) and ball.m == 4
    from fractions import Fraction

    assert Fraction(ball.radius) ** 2 >= Fraction(radius) ** 2 + 1
    assert ball.radius <= math.sqrt(radius**2 + 1) * (1 + 1e-14)


# -- route (a): the L2 sensitivity on the augmented domain -------------------------------------


def test_augmented_difference_identity_on_random_pairs():
    """||z z^T - z' z'^T||_F^2 = ||x x^T - x' x'^T||_F^2 + 2 ||x - x'||^2 (docs Sec. 13)."""
    rng = np.random.default_rng(21)
    for _ in range(500):
        m = int(rng.integers(1, 7))
        x, xp = rng.standard_normal(m), rng.standard_normal(m)
        lhs = np.sum(aug_diff(x, xp) ** 2)
        rhs = np.sum((np.outer(x, x) - np.outer(xp, xp)) ** 2) + 2 * np.sum((x - xp) ** 2)
        assert lhs == pytest.approx(rhs, rel=1e-12)


@pytest.mark.parametrize("m", [2, 3, 4])
def test_augmented_box_l2_sensitivity_dominates_optimisation_and_corners(m):
    """CovarianceQuery's s_2 on [lo; 1] x [hi; 1] against the sup of ||zz^T - z'z'^T|| / N."""
    rng = np.random.default_rng(100 + m)
    N = 9
    q = CovarianceQuery(m + 1, N)
    for name, (lo, hi) in boxes(m, rng).items():
        domain = augmented_domain(BoxDomain.create(lo, hi, m))
        for neighbours in ("replace-one", "add-remove"):
            pairs = neighbours == "replace-one"
            s2 = q.l2_sensitivity(domain, neighbours)

            def frob(x, xp):
                return float(np.linalg.norm(aug_diff(x, xp)))

            found = max(maximise(frob, lo, hi, pairs, rng), corners_max(frob, lo, hi, pairs))
            assert found / N <= s2 * (1 + REL), (name, neighbours)
            R1 = float(np.sum(np.maximum(lo**2, hi**2))) + 1.0
            if not pairs:  # add/remove: R + 1, attained at the far corner
                assert found == pytest.approx(R1, rel=1e-9)
            elif name == "unit":  # sign-definite: R + 1 = m + 1; sup sqrt(m^2 + 2m)
                assert s2 * N == pytest.approx(m + 1)
                assert found == pytest.approx(math.sqrt(m * m + 2 * m), rel=1e-9)
            elif name == "sym":  # sqrt(2)(m + 1), attained for odd m (x'x' = -1)
                assert s2 * N == pytest.approx(math.sqrt(2) * (m + 1))
                want = 2 * (m + 1) ** 2 - (0 if m % 2 else 2)
                assert found**2 == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("radius", [0.5, 1.0, 2.0])
def test_augmented_ball_l2_sensitivity_dominates_optimisation(radius):
    """The enclosing ball: sqrt(2)(C^2 + 1) / N, attained for C >= 1; sqrt(8) C for C < 1."""
    rng = np.random.default_rng(int(40 * radius))
    m, N = 3, 5
    domain = augmented_domain(L2BallDomain(radius, m))
    s2 = CovarianceQuery(m + 1, N).l2_sensitivity(domain, "replace-one")
    lo, hi = -radius * np.ones(m), radius * np.ones(m)
    found = maximise(
        lambda x, xp: float(np.linalg.norm(aug_diff(x, xp))), lo, hi, True, rng, radius=radius
    )
    assert found / N <= s2 * (1 + REL)
    claimed = math.sqrt(2) * (radius**2 + 1) if radius >= 1 else math.sqrt(8) * radius
    assert found == pytest.approx(claimed, rel=1e-6)


@pytest.mark.parametrize("scale", [0.125, 4.0])
@pytest.mark.parametrize("box", ["unit", "sym", "asym"])
def test_scaled_constant_bounds_dominate_optimisation(scale, box):
    """The constant coordinate ``[s, s]`` (``z = [x - c; s]``): the l2 and the whitened
    (unimodal, equi-modal, symmetric) bounds of the augmented box against L-BFGS-B from 20
    starts and the corners, both neighbouring relations, a random diagonal precision (seed
    500 + case); and the augmented ball's radius ``sqrt(C^2 + s^2)`` against its records."""
    m = 3
    case = 3 * ["unit", "sym", "asym"].index(box) + (scale > 1)
    rng = np.random.default_rng(500 + case)
    lo, hi = boxes(m, rng)[box]
    domain = augmented_domain(BoxDomain.create(lo, hi, m), scale=scale)
    assert domain.lower[-1] == domain.upper[-1] == scale  # type: ignore[attr-defined]
    q = CovarianceQuery(m + 1, 1)
    P, _, Ainv = _precisions("diagonal", m + 1, rng)
    for neighbours in ("replace-one", "add-remove"):
        pairs = neighbours == "replace-one"

        def diff(x, xp):
            return aug_diff(x, xp, scale)

        def white(x, xp, Ainv=Ainv):
            return Ainv @ diff(x, xp) @ Ainv.T

        s2 = q.l2_sensitivity(domain, neighbours)
        frob = lambda x, xp: float(np.linalg.norm(diff(x, xp)))  # noqa: E731
        found = max(maximise(frob, lo, hi, pairs, rng), corners_max(frob, lo, hi, pairs))
        assert found <= s2 * (1 + REL), (neighbours, "l2")
        uni = q.mahalanobis_sensitivity(domain, neighbours, P, "unimodal")
        found = maximise(
            lambda x, xp: float(np.linalg.norm(Ainv @ diff(x, xp))), lo, hi, pairs, rng
        )
        assert found <= uni * (1 + REL), (neighbours, "unimodal")
        equi = q.mahalanobis_sensitivity(domain, neighbours, P, "equi-modal")
        found = maximise(lambda x, xp: float(np.linalg.norm(white(x, xp))), lo, hi, pairs, rng)
        assert found <= equi * (1 + REL), (neighbours, "equi-modal")
        for r in RATIOS[:2]:
            bound = q.mahalanobis_sensitivity(domain, neighbours, P, "symmetric", ratio=r)
            obj = lambda x, xp, r=r: q_weighted(white(x, xp), r) / r  # noqa: E731
            found = max(maximise(obj, lo, hi, pairs, rng), corners_max(obj, lo, hi, pairs))
            assert math.sqrt(found) <= bound * (1 + REL), (neighbours, r)
    ball = augmented_domain(L2BallDomain(0.75, m), scale=scale)
    assert ball.radius >= math.hypot(0.75, scale)  # type: ignore[attr-defined]
    assert ball.radius <= math.hypot(0.75, scale) * (1 + 1e-14)  # type: ignore[attr-defined]


def test_augmented_scale_is_the_optimum_of_the_planners_error():
    """:func:`augmented_scale` (a closed-form first-order rule) against the exact expected
    error of route (a) about the centre (:func:`augmented_route_errors`: the planner's symmetric
    noise at its best ratio, the data's mean at a corner), minimised over ``s = 2^k``: the same
    power of two on boxes of widths 0.01 to 100 and 1 to 64 features, and never more than 1 %
    worse where they differ; ``s = 1`` costs 20x and more on narrow and wide boxes."""
    for width in (0.01, 0.1, 1.0, 10.0, 100.0):
        for m in (1, 2, 5, 20, 64):
            lo, hi = np.zeros(m), np.full(m, width)
            centre = (lo + hi) / 2

            def total(s, lo=lo, hi=hi, centre=centre):
                cov, mean, _ = sens.augmented_route_errors(
                    lo, hi, 1e4, 1.0, shift=centre, mean=hi, scale=s
                )
                return cov + mean

            grid = [2.0**k for k in range(-12, 12)]
            errors = [total(s) for s in grid]
            chosen = sens.augmented_scale(float(np.sum((hi - centre) ** 2)), m)
            assert total(chosen) <= min(errors) * 1.01, (width, m, chosen)
            if width in (0.01, 100.0):
                assert total(1.0) >= 20 * total(chosen), (width, m)
    assert sens.augmented_scale(0.25 * 5, 5) == 1.0  # [0, 1]^5 keeps the constant 1
    assert sens.augmented_scale(0.25 * 4, 4) == 0.5
    with pytest.raises(ValueError, match="A > 0"):
        sens.augmented_scale(0.0, 3)


# -- route (a): the whitened bounds on the augmented domain ------------------------------------


def _precisions(kind: str, m: int, rng: np.random.Generator):
    """(precision argument, directions, A^-1) for standard, random diagonal and dense cases."""
    if kind == "standard":
        p = np.full(m, 1.0 / m)
        return p, None, np.diag(np.sqrt(p))
    if kind == "diagonal":
        p = rng.dirichlet(np.ones(m))
        return p, None, np.diag(np.sqrt(p))
    W = np.linalg.qr(rng.standard_normal((m, m)))[0]
    theta = rng.dirichlet(np.ones(m))
    return (W * theta) @ W.T, W, np.sqrt(theta)[:, None] * W.T


@pytest.mark.parametrize("kind", ["standard", "diagonal", "dense"])
@pytest.mark.parametrize("box", ["unit", "sym", "asym"])
def test_augmented_whitened_bounds_dominate_optimisation(kind, box):
    """Unimodal ||A^-1 D||_F, equi-modal ||A^-1 D A^-T||_F and symmetric
    sqrt(Q_r(A^-1 D A^-T) / r) over z = [x; 1], both neighbouring relations."""
    m = 3
    seed = 7 * ["standard", "diagonal", "dense"].index(kind) + ["unit", "sym", "asym"].index(box)
    rng = np.random.default_rng(300 + seed)
    lo, hi = boxes(m, rng)[box]
    domain = augmented_domain(BoxDomain.create(lo, hi, m))
    q = CovarianceQuery(m + 1, 1)
    P, W, Ainv = _precisions(kind, m + 1, rng)
    for neighbours in ("replace-one", "add-remove"):
        pairs = neighbours == "replace-one"

        def white(x, xp, Ainv=Ainv):
            return Ainv @ aug_diff(x, xp) @ Ainv.T

        uni = q.mahalanobis_sensitivity(domain, neighbours, P, "unimodal", directions=W)
        found = maximise(
            lambda x, xp: float(np.linalg.norm(Ainv @ aug_diff(x, xp))), lo, hi, pairs, rng
        )
        assert found <= uni * (1 + REL), (neighbours, "unimodal")
        equi = q.mahalanobis_sensitivity(domain, neighbours, P, "equi-modal", directions=W)
        found = maximise(lambda x, xp: float(np.linalg.norm(white(x, xp))), lo, hi, pairs, rng)
        assert found <= equi * (1 + REL), (neighbours, "equi-modal")
        for r in RATIOS:
            bound = q.mahalanobis_sensitivity(
                domain, neighbours, P, "symmetric", directions=W, ratio=r
            )
            found = maximise(lambda x, xp, r=r: q_weighted(white(x, xp), r) / r, lo, hi, pairs, rng)
            found = max(
                found,
                corners_max(lambda x, xp, r=r: q_weighted(white(x, xp), r) / r, lo, hi, pairs),
            )
            assert math.sqrt(found) <= bound * (1 + REL), (neighbours, r)


@pytest.mark.parametrize("r", [0.5, 1.0, 2.5])
def test_augmented_symmetric_bound_attained_on_the_unit_box_add_remove(r):
    """[0,1]^m + [1,1], standard directions, add/remove: Q* = (m+1)^2/2 + (r - 1/2)(m+1),
    attained at x = 1 (Theorem 1's add/remove form, every T_i = 1)."""
    m = 4
    domain = augmented_domain(BoxDomain.create(0, 1, m))
    q = CovarianceQuery(m + 1, 1)
    bound = q.mahalanobis_sensitivity(domain, "add-remove", np.ones(m + 1), "symmetric", ratio=r)
    z = np.ones(m + 1)
    attained = q_weighted(np.outer(z, z), r)
    assert attained == pytest.approx((m + 1) ** 2 / 2 + (r - 0.5) * (m + 1))
    assert bound**2 * r == pytest.approx(attained, rel=1e-12)


# -- route (b): the mean, the shifted box ------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3, 5])
def test_mean_sensitivity_dominates_and_is_attained(m):
    rng = np.random.default_rng(500 + m)
    N = 11
    lo = rng.uniform(-2, 0.5, m)
    hi = lo + rng.uniform(0.2, 2, m)
    s = sens.mean_l2_sensitivity(lo, hi, N)
    found = maximise(lambda x, xp: float(np.linalg.norm(x - xp)), lo, hi, True, rng)
    assert found / N <= s * (1 + REL)
    assert np.linalg.norm(hi - lo) / N == pytest.approx(s)  # the opposite corners
    s_ar = sens.mean_l2_sensitivity(lo, hi, N, "add-remove")
    assert corners_max(lambda x, _: float(np.linalg.norm(x)), lo, hi, False) / N == (
        pytest.approx(s_ar)
    )
    C = 1.5
    ball = sens.mean_l2_sensitivity_ball(C, N)
    x = rng.standard_normal(m)
    x *= C / np.linalg.norm(x)
    assert np.linalg.norm(x - (-x)) / N == pytest.approx(ball)
    assert sens.mean_l2_sensitivity_ball(C, N, "add-remove") == pytest.approx(C / N)
    with pytest.raises(ValueError, match="neighbouring"):
        sens.mean_l2_sensitivity(lo, hi, N, "swap")


def test_mean_step_privacy_loss_matches_its_calibration_monte_carlo():
    """The mean released with N(0, s^2 I), s = Delta / mu_1: at the attaining pair (all records
    equal, one moved from lo to hi) the privacy loss is N(mu_1^2 / 2, mu_1^2) exactly.

    Seed 2024, 200,000 draws; the mean and the variance of the loss are each tested at
    alpha = 1e-4 (z-test on the mean, chi-square on the variance), and a Kolmogorov-Smirnov
    test of the standardised loss at alpha = 1e-4. With a noise std 10% low the test fails.
    """
    rng = np.random.default_rng(2024)
    m, N, mu1 = 4, 50, 0.7
    lo, hi = np.array([0.0, -1.0, 0.5, 2.0]), np.array([1.0, 1.0, 3.0, 2.5])
    X = np.tile(lo[:, None], (1, N))
    Xp = X.copy()
    Xp[:, 0] = hi
    f, fp = X.mean(axis=1), Xp.mean(axis=1)

    def losses(sigma: float, n: int) -> np.ndarray:
        y = f + sigma * rng.standard_normal((n, m))
        return (np.sum((y - fp) ** 2, axis=1) - np.sum((y - f) ** 2, axis=1)) / (2 * sigma**2)

    sigma = sens.mean_l2_sensitivity(lo, hi, N) / mu1
    n = 200_000
    L = losses(sigma, n)
    alpha = 1e-4
    z = (L.mean() - mu1**2 / 2) / (mu1 / math.sqrt(n))
    assert abs(z) < stats.norm.ppf(1 - alpha / 2)
    chi = (n - 1) * L.var(ddof=1) / mu1**2
    assert stats.chi2.ppf(alpha / 2, n - 1) < chi < stats.chi2.ppf(1 - alpha / 2, n - 1)
    assert stats.kstest((L - mu1**2 / 2) / mu1, "norm").pvalue > alpha
    # the same test sees a noise std 10% too small
    L_bad = losses(0.9 * sigma, n)
    assert (L_bad.mean() - mu1**2 / 2) / (mu1 / math.sqrt(n)) > stats.norm.ppf(1 - alpha / 2)


@pytest.mark.parametrize("seed", range(5))
def test_shifted_box_covariance_bounds_dominate_optimisation(seed):
    """Sum (x - mu)(x - mu)^T / N with mu the clamped released mean: the covariance bounds of
    [lo - mu, hi - mu] (L2, and symmetric at several r, standard directions) dominate the sup
    over pairs of records of the original box; the hull [-w, w] bound dominates them."""
    rng = np.random.default_rng(600 + seed)
    m, N = int(rng.integers(2, 5)), 13
    lo = rng.uniform(-1.0, 0.5, m)
    hi = lo + rng.uniform(0.3, 1.5, m)
    mu_hat = rng.uniform(lo - 0.5, hi + 0.5)  # noisy: it may fall outside the box
    if seed == 0:
        mu_hat = lo.copy()  # an end: the shifted box is sign-definite
    s_lo, s_hi = sens.shifted_box(lo, hi, mu_hat)
    mu = np.clip(mu_hat, lo, hi)
    np.testing.assert_allclose(s_hi - s_lo, hi - lo)
    assert np.all(s_lo <= 0) and np.all(s_hi >= 0)
    shifted = BoxDomain.create(s_lo, s_hi, m, allow_equal=True)
    assert shifted.sign_definite == bool(np.all((mu == lo) | (mu == hi)))
    q = CovarianceQuery(m, N)

    def diff(x, xp):
        u, up = x - mu, xp - mu
        return np.outer(u, u) - np.outer(up, up)

    s2 = q.l2_sensitivity(shifted, "replace-one")
    found = maximise(lambda x, xp: float(np.linalg.norm(diff(x, xp))), lo, hi, True, rng)
    assert found / N <= s2 * (1 + REL)
    w = hi - lo
    hull = BoxDomain.create(-w, w, m)
    assert s2 <= q.l2_sensitivity(hull, "replace-one") * (1 + REL)
    for r in RATIOS:
        bound = q.mahalanobis_sensitivity(shifted, "replace-one", np.ones(m), "symmetric", ratio=r)
        found = maximise(lambda x, xp, r=r: q_weighted(diff(x, xp), r) / r, lo, hi, True, rng)
        assert math.sqrt(found) / N <= bound * (1 + REL), r
        unit = sens.box_symmetric_unit_sensitivity(s_lo, s_hi, N, [r])[0]
        assert unit == pytest.approx(bound, rel=1e-12)  # the math layer's copy of the plan's bound
        hull_bound = q.mahalanobis_sensitivity(
            hull, "replace-one", np.ones(m), "symmetric", ratio=r
        )
        assert bound <= hull_bound * (1 + REL)


def test_unit_box_centre_halves_r_and_adds_sqrt2():
    """[0, 1]^m around its centre: R = m / 4 with the sqrt(2) factor: s_2 = sqrt(2) m / (4N)."""
    m, N = 6, 10
    s_lo, s_hi = sens.shifted_box(np.zeros(m), np.ones(m), np.full(m, 0.5))
    shifted = BoxDomain.create(s_lo, s_hi, m)
    assert CovarianceQuery(m, N).l2_sensitivity(shifted, "replace-one") == pytest.approx(
        math.sqrt(2) * m / 4 / N
    )


# -- the planning helper -----------------------------------------------------------------------


@pytest.mark.parametrize("m", [3, 6])
def test_box_symmetric_noise_matches_the_planner(m):
    """The math layer's ratio search and Delta_1 agree with best_symmetric_ratio and
    CovarianceQuery on the augmented and the shifted boxes."""
    N = 1000
    for lo, hi in [
        (np.append(np.zeros(m), 1.0), np.ones(m + 1)),
        (np.append(-np.ones(m), 1.0), np.ones(m + 1)),
        (np.full(m, -0.5), np.full(m, 0.5)),
    ]:
        k = lo.size
        domain = BoxDomain.create(lo, hi, k, allow_equal=True)
        q = CovarianceQuery(k, N)
        r_plan = best_symmetric_ratio(q, domain, "replace-one", np.eye(k))
        v, r = sens.box_symmetric_noise(lo, hi, N, 0.5)
        assert r == pytest.approx(r_plan, rel=1e-12)
        d1 = q.mahalanobis_sensitivity(domain, "replace-one", np.ones(k), "symmetric", ratio=r)
        assert v == pytest.approx(d1 / 0.5, rel=1e-12)


def test_route_errors_match_monte_carlo():
    """Route (a)'s covariance and mean errors (closed form), plain, about the box centre and
    about it with the constant ``s = 1/4``, against 20,000 simulated releases of
    ``M = Z Z^T / N + sqrt(v) S sqrt(v)``, seed 77: each within 4 standard errors (alpha about
    6e-5 per check). Route (b)'s covariance error (noise at the
    plug-in, the bias of the clamped noisy mean) is checked the same way against its upper
    bound."""
    rng = np.random.default_rng(77)
    m, N, mu = 3, 40, 1.0
    lo, hi = np.zeros(m), np.ones(m)
    X = rng.uniform(0, 1, (m, N))
    X = X - X.mean(axis=1, keepdims=True) + 0.5  # mean at the box centre (the plug-in)
    X = np.clip(X, 0, 1)
    xbar = X.mean(axis=1)
    cov = np.cov(X, bias=True)
    res = sens.centered_route_errors(lo, hi, N, mu, mean=xbar)
    scaled = sens.centered_route_errors(lo, hi, N, mu, mean=xbar, scale=0.25)
    n = 20_000
    k = m + 1
    iu = np.triu_indices(k, 1)
    for shift, s_c, want_cov, want_mean in (
        (np.zeros(m), 1.0, res.augmented_covariance, res.augmented_mean),
        (np.full(m, 0.5), 1.0, res.centred_covariance, res.centred_mean),
        (np.full(m, 0.5), 0.25, scaled.centred_covariance, scaled.centred_mean),
    ):
        v, r = sens.box_symmetric_noise(
            np.append(lo - shift, s_c), np.append(hi - shift, s_c), N, mu
        )
        Z = np.vstack([X - shift[:, None], np.full(N, s_c)])
        M = Z @ Z.T / N
        cov_err, mean_err = np.empty(n), np.empty(n)
        for t in range(n):
            S = np.diag(rng.standard_normal(k))
            S[iu] = math.sqrt(r) * rng.standard_normal(iu[0].size)
            S = np.triu(S) + np.triu(S, 1).T
            Mh = M + v * S
            d = Mh[:m, m] / s_c
            cov_err[t] = np.sum((Mh[:m, :m] - np.outer(d, d) - cov) ** 2)
            mean_err[t] = np.sum((shift + d - xbar) ** 2)
        for sample, want in ((cov_err, want_cov), (mean_err, want_mean)):
            se = sample.std(ddof=1) / math.sqrt(n)
            assert abs(sample.mean() - want) < 4 * se, (sample.mean(), want)
    # route (b) at its split
    f = res.mean_first_share
    s = sens.mean_l2_sensitivity(lo, hi, N) / (mu * math.sqrt(f))
    s_lo, s_hi = sens.shifted_box(lo, hi, np.full(m, 0.5))
    v2, r2 = sens.box_symmetric_noise(s_lo, s_hi, N, mu * math.sqrt(1 - f))
    iu = np.triu_indices(m, 1)
    b_err = np.empty(n)
    for t in range(n):
        mu_hat = np.clip(xbar + s * rng.standard_normal(m), lo, hi)
        G = (X - mu_hat[:, None]) @ (X - mu_hat[:, None]).T / N
        S = np.diag(rng.standard_normal(m))
        S[iu] = math.sqrt(r2) * rng.standard_normal(iu[0].size)
        S = np.triu(S) + np.triu(S, 1).T
        b_err[t] = np.sum((G + v2 * S - cov) ** 2)
    se = b_err.std(ddof=1) / math.sqrt(n)
    assert b_err.mean() < res.mean_first_covariance + 4 * se
    assert res.mean_first_worst_covariance >= res.mean_first_covariance
    totals = res.totals()
    assert res.choice == min(totals, key=lambda key: totals[key])
    with pytest.raises(ValueError, match="budget share"):
        sens.centered_route_errors(lo, hi, N, mu, shares=[0.0, 0.5])


def test_post_processing_gives_numpy_mean_and_cov_with_ddof():
    """mean = M[:m, m], cov = M[:m, :m] - mean mean^T = np.cov(bias=True); about c:
    mean = c + M[:m, m]; ddof: cov N / (N - ddof) = np.cov(ddof=ddof). Seed 8."""
    rng = np.random.default_rng(8)
    m, N = 4, 37
    X = rng.uniform(-1, 2, (m, N))
    for c in (np.zeros(m), np.full(m, 0.5)):
        Z = np.vstack([X - c[:, None], np.ones(N)])
        M = Z @ Z.T / N
        d = M[:m, m]
        np.testing.assert_allclose(c + d, X.mean(axis=1), rtol=1e-12)
        cov = M[:m, :m] - np.outer(d, d)
        np.testing.assert_allclose(cov, np.cov(X, bias=True), rtol=1e-10, atol=1e-12)
        for ddof in (0, 1, 2):
            np.testing.assert_allclose(
                cov * N / (N - ddof), np.cov(X, ddof=ddof), rtol=1e-10, atol=1e-12
            )
        assert M[m, m] == 1.0


@pytest.mark.parametrize("box", ["unit", "sym", "asym"])
def test_group_by_joint_bound_dominates_and_needs_sqrt2(box):
    """Lemma 15.1: concatenated per-group sums; a record moving between groups changes two
    blocks by -x x^T and x' x'^T: sup = max(Delta_RO, sqrt(2) Delta_AR) (Frobenius, and
    symmetric at several r, standard directions). On [0, 1]^m the move needs the sqrt(2):
    sqrt(2) R > R = Delta_RO. Seed 900 + box index."""
    m = 3
    rng = np.random.default_rng(900 + ["unit", "sym", "asym"].index(box))
    lo, hi = boxes(m, rng)[box]
    domain = BoxDomain.create(lo, hi, m)
    q = CovarianceQuery(m, 1)  # unnormalised sums

    def concat_move(x, xp):  # group g loses x, g' gains x'
        return np.outer(x, x), np.outer(xp, xp)

    joint = max(
        q.l2_sensitivity(domain, "replace-one"),
        math.sqrt(2) * q.l2_sensitivity(domain, "add-remove"),
    )
    found = maximise(
        lambda x, xp: math.sqrt(sum(np.sum(b**2) for b in concat_move(x, xp))), lo, hi, True, rng
    )
    assert found <= joint * (1 + REL)
    R = float(np.sum(np.maximum(lo**2, hi**2)))
    assert found == pytest.approx(math.sqrt(2) * R, rel=1e-9)  # both at the far corner
    if box == "unit":
        assert q.l2_sensitivity(domain, "replace-one") == pytest.approx(R)  # so sqrt(2) R > it
    for r in RATIOS:
        ro = q.mahalanobis_sensitivity(domain, "replace-one", np.ones(m), "symmetric", ratio=r)
        ar = q.mahalanobis_sensitivity(domain, "add-remove", np.ones(m), "symmetric", ratio=r)
        bound = max(ro, math.sqrt(2) * ar)
        found = maximise(
            lambda x, xp, r=r: sum(q_weighted(b, r) for b in concat_move(x, xp)) / r,
            lo,
            hi,
            True,
            rng,
        )
        assert math.sqrt(found) <= bound * (1 + REL), r
