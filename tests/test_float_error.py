"""The float error bounds of the computed whitened query (docs/bounds.md, Sec. 11) against exact
arithmetic.

Each test reproduces the engine's float64 sequences exactly (``x @ x.T`` per chunk, chunk
partials added in sequence inside a task, task partials summed in groups of 8 level by level,
one division by the normaliser, then the whitening of the kind under test and the symmetric
coordinates ``fl(g_ij * fl(1/sqrt(r)))``) and compares them with the exact value: the Gram
matrix in ``fractions.Fraction`` (exact), the whitening in mpmath at 60 digits (``1/sqrt(v)``
and ``W^-1`` are irrational; 60 digits leave a margin of ~1e-45 relative, far below any bound).
Random inputs are seeded (seeds in each test's docstring) or drawn by hypothesis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvg_dask.privacy.float_error import (
    UNIT_ROUNDOFF,
    Whitening,
    covariance_error_bound,
    gamma,
    gram_error,
    identity_error,
    lattice_coordinates_error,
    whitened_error,
)
from tests.strategies import boxes

mpmath.mp.dps = 60
ALGORITHMS = ("equi-modal", "symmetric", "unimodal")
RATIOS = (0.5, 1.0, 3.7)


# -- the engine's float sequences ----------------------------------------------------------------


def _fold(parts: Sequence[np.ndarray]) -> np.ndarray:
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


def engine_gram(
    chunks: Sequence[np.ndarray], chunks_per_task: int, repeat: int = 1
) -> tuple[np.ndarray, int]:
    """The engine's Gram sum of ``chunks`` (each ``m x n_c``, features by records) repeated
    ``repeat`` times, and the largest number of additions any product term passes through."""
    partials = [c @ c.T for c in chunks] * repeat
    widths = [c.shape[1] for c in chunks]
    tasks = [
        _fold(partials[i : i + chunks_per_task]) for i in range(0, len(partials), chunks_per_task)
    ]
    depth = max(widths) - 1 + min(chunks_per_task, len(partials)) - 1
    while len(tasks) > 1:
        depth += min(8, len(tasks)) - 1
        tasks = [_fold(tasks[i : i + 8]) for i in range(0, len(tasks), 8)]
    return tasks[0], depth


def engine_normalise(G: np.ndarray, normaliser: float) -> np.ndarray:
    return G if normaliser == 1.0 else G / normaliser


def low_rank_apply(X: np.ndarray, U: np.ndarray, a: float, delta: np.ndarray) -> np.ndarray:
    """The low-rank sequence of docs/bounds.md Lemma 11.5: ``fl(fl(c X) + fl(V fl(U^T X)))``."""
    c = 1.0 / a
    beta = 1.0 / (a + delta) - c
    V = U * beta[None, :]
    return c * X + V @ (U.T @ X)


def engine_whiten(f: np.ndarray, wh: Whitening, two_sided: bool) -> np.ndarray:
    if wh.kind == "diagonal":
        assert wh.variances is not None
        w = 1.0 / np.sqrt(wh.variances)
        g = f * w[:, None]
        return g * w[None, :] if two_sided else g
    if wh.kind == "dense":
        P = wh.dense_factor()
        return (P @ f) @ P.T if two_sided else P @ f
    assert wh.directions is not None and wh.a is not None and wh.delta is not None
    Y = low_rank_apply(f, wh.directions, wh.a, wh.delta)
    return low_rank_apply(Y.T, wh.directions, wh.a, wh.delta).T if two_sided else Y


def engine_identity(x: np.ndarray, wh: Whitening) -> np.ndarray:
    if wh.kind == "diagonal":
        assert wh.variances is not None
        return x * (1.0 / np.sqrt(wh.variances))
    if wh.kind == "dense":
        return wh.dense_factor() @ x
    assert wh.directions is not None and wh.a is not None and wh.delta is not None
    return low_rank_apply(x[:, None], wh.directions, wh.a, wh.delta)[:, 0]


def engine_coordinates(g: np.ndarray, algorithm: str, ratio: float | None) -> list[float]:
    if algorithm != "symmetric":
        return [float(t) for t in g.ravel()]
    assert ratio is not None
    q = 1.0 / np.sqrt(ratio)
    iu = np.triu_indices(g.shape[0], 1)
    return [float(t) for t in np.diag(g)] + [float(t) for t in g[iu] * q]


# -- exact arithmetic ----------------------------------------------------------------------------


def exact_gram(chunks: Sequence[np.ndarray], repeat: int = 1) -> list[list[Fraction]]:
    m = chunks[0].shape[0]
    G = [[Fraction(0)] * m for _ in range(m)]
    for c in chunks:
        rows = [[Fraction(float(t)) for t in c[i]] for i in range(m)]
        for i in range(m):
            for j in range(i, m):
                s = sum((p * q for p, q in zip(rows[i], rows[j], strict=True)), Fraction(0))
                G[i][j] += s
    for i in range(m):
        for j in range(i, m):
            G[i][j] *= repeat
            G[j][i] = G[i][j]
    return G


def mp_matrix(F: list[list[Fraction]]) -> mpmath.matrix:
    return mpmath.matrix([[mpmath.mpf(t.numerator) / t.denominator for t in row] for row in F])


def exact_inverse(wh: Whitening) -> mpmath.matrix:
    """``A^-1`` of the plan's exact factor (``1/sqrt(v)`` and ``W^-1`` at 60 digits)."""
    if wh.kind == "diagonal":
        assert wh.variances is not None
        return mpmath.diag([1 / mpmath.sqrt(mpmath.mpf(float(t))) for t in wh.variances])
    if wh.kind == "dense":
        assert wh.variances is not None and wh.directions is not None
        W = mpmath.matrix(wh.directions.tolist())
        s = mpmath.diag([1 / mpmath.sqrt(mpmath.mpf(float(t))) for t in wh.variances])
        return s * mpmath.inverse(W)
    assert wh.directions is not None and wh.a is not None and wh.delta is not None
    U = mpmath.matrix(wh.directions.tolist())
    m = wh.directions.shape[0]
    A = mpmath.mpf(wh.a) * mpmath.eye(m) + U * mpmath.diag(wh.delta.tolist()) * U.T
    return mpmath.inverse(A)


def exact_coordinates(g: mpmath.matrix, algorithm: str, ratio: float | None) -> list[mpmath.mpf]:
    m = g.rows
    if algorithm != "symmetric":
        return [g[i, j] for i in range(m) for j in range(m)]
    assert ratio is not None
    q = 1 / mpmath.sqrt(mpmath.mpf(ratio))
    iu = np.triu_indices(m, 1)
    return [g[i, i] for i in range(m)] + [g[int(i), int(j)] * q for i, j in zip(*iu, strict=True)]


def l2_distance(computed: Sequence[float], exact: Sequence[mpmath.mpf]) -> float:
    return float(
        mpmath.sqrt(
            mpmath.fsum((mpmath.mpf(c) - e) ** 2 for c, e in zip(computed, exact, strict=True))
        )
    )


# -- a release, float and exact ------------------------------------------------------------------


def release_errors(
    chunks: Sequence[np.ndarray],
    abs_max: np.ndarray,
    wh: Whitening,
    algorithm: str,
    ratio: float | None,
    *,
    chunks_per_task: int = 3,
    repeat: int = 1,
    normaliser: float | None = None,
    norm_max: float | None = None,
) -> tuple[float, float, float]:
    """``(measured, entrywise bound, composed bound)`` of the lattice coordinates' error; also
    checks the entrywise bounds of ``f_hat`` and ``g_hat`` entry by entry."""
    records = sum(c.shape[1] for c in chunks) * repeat
    N = float(records) if normaliser is None else normaliser
    G_hat, depth = engine_gram(chunks, chunks_per_task, repeat)
    f_hat = engine_normalise(G_hat, N)
    f_exact = mp_matrix([[t / Fraction(N) for t in row] for row in exact_gram(chunks, repeat)])
    two_sided = algorithm != "unimodal"
    g_hat = engine_whiten(f_hat, wh, two_sided)
    Ainv = exact_inverse(wh)
    g_exact = Ainv * f_exact * Ainv.T if two_sided else Ainv * f_exact

    err, mag = gram_error(abs_max, records, depth, N)
    f_dev = np.array((mpmath.matrix(f_hat.tolist()) - f_exact).tolist(), dtype=float)
    assert np.all(np.abs(f_dev) <= err), "Gram entrywise bound"
    assert np.all(np.abs(f_hat) <= mag)
    err_g, mag_g = whitened_error(err, mag, whitening=wh, two_sided=two_sided)
    g_dev = np.array((mpmath.matrix(g_hat.tolist()) - g_exact).tolist(), dtype=float)
    assert np.all(np.abs(g_dev) <= err_g), "whitened entrywise bound"
    assert np.all(np.abs(g_hat) <= mag_g)

    measured = l2_distance(
        engine_coordinates(g_hat, algorithm, ratio), exact_coordinates(g_exact, algorithm, ratio)
    )
    entrywise = lattice_coordinates_error(err_g, mag_g, algorithm=algorithm, ratio=ratio)
    composed = covariance_error_bound(
        abs_max, records, depth, N, wh, algorithm, ratio, norm_max=norm_max
    )
    return measured, entrywise, composed


# -- adversarial inputs --------------------------------------------------------------------------


def random_orthonormal(rng: np.random.Generator, m: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((m, m)))
    return q * np.sign(np.diag(r))


def ill_conditioned_variances(rng: np.random.Generator, m: int, ratio: float) -> np.ndarray:
    """Variances spread log-uniformly over ``[1, ratio]``, full 53-bit mantissas."""
    return np.exp(rng.uniform(0.0, math.log(ratio), m)) * (1 + rng.uniform(-1e-3, 1e-3, m))


def whitenings(rng: np.random.Generator, m: int, cond: float) -> dict[str, Whitening]:
    v = ill_conditioned_variances(rng, m, cond)
    U = random_orthonormal(rng, m)[:, :2]
    a = float(np.sqrt(v.min()) * 1.3)
    return {
        "diagonal": Whitening.diagonal(v),
        "dense": Whitening.dense(random_orthonormal(rng, m), v),
        "low-rank": Whitening.low_rank(U, a, np.array([a * 40.0, -a * 0.9])),
    }


def corner_chunks(rng: np.random.Generator, a: np.ndarray, n_chunks: int, width: int) -> list:
    """Records at random corners ``±a`` of a box."""
    return [a[:, None] * rng.choice([-1.0, 1.0], size=(a.size, width)) for _ in range(n_chunks)]


def cancelling_chunks(rng: np.random.Generator, m: int, n_chunks: int, width: int) -> list:
    """Box ``[-1, 1]``: records in pairs ``x``, ``x o s`` with a random sign flip ``s`` and
    entries ``1 - t`` (``t`` small, full mantissa): the off-diagonal sums nearly cancel, every
    product is inexact."""
    out = []
    for _ in range(n_chunks):
        x = 1.0 - rng.uniform(0, 2.0**-10, size=(m, width // 2))
        s = rng.choice([-1.0, 1.0], size=(m, width // 2))
        out.append(np.concatenate([x, x * s], axis=1))
    return out


def generic_chunks(rng: np.random.Generator, a: np.ndarray, n_chunks: int, width: int) -> list:
    return [a[:, None] * rng.uniform(-1, 1, size=(a.size, width)) for _ in range(n_chunks)]


# -- tests ---------------------------------------------------------------------------------------


def test_gamma_is_rounded_up_and_guarded():
    """``gamma(n) >= n u / (1 - n u)`` exactly, increasing, and refuses ``n u >= 1/2``."""
    u = Fraction(UNIT_ROUNDOFF)
    assert u == Fraction(1, 2**53)
    for n in (0, 1, 2, 3, 7, 1000, 10**6 + 3, 2**40 + 1):
        assert Fraction(gamma(n)) >= n * u / (1 - n * u)
        assert gamma(n) <= gamma(n + 1)
    assert gamma(0) == 0.0
    for n in (2**52, 2**53, -1):
        with pytest.raises(ValueError):
            gamma(n)


@pytest.mark.parametrize("normaliser_kind", ["records", "odd", "one"])
def test_gram_bound_on_corners_and_cancellation(normaliser_kind):
    """Seed 11: corner records of an asymmetric-magnitude box and cancelling records of
    ``[-1, 1]``, chunk widths 1-17, tasks of 1-5 chunks; the normaliser is the record count, an
    odd non-power of two (``N + 0.3``) or 1 (no division)."""
    rng = np.random.default_rng(11)
    m = 5
    for trial in range(6):
        width = int(rng.integers(1, 18)) * 2
        a = np.exp(rng.uniform(-3, 3, m)) if trial % 2 else np.ones(m)
        chunks = (
            corner_chunks(rng, a, 7, width) if trial % 2 else cancelling_chunks(rng, m, 7, width)
        )
        records = 7 * width
        N = {"records": float(records), "odd": records + 0.3, "one": 1.0}[normaliser_kind]
        G_hat, depth = engine_gram(chunks, int(rng.integers(1, 6)))
        f_hat = engine_normalise(G_hat, N)
        exact = exact_gram(chunks)
        err, mag = gram_error(a, records, depth, N)
        for i in range(m):
            for j in range(m):
                dev = abs(Fraction(float(f_hat[i, j])) - exact[i][j] / Fraction(N))
                assert dev <= Fraction(float(err[i, j]))
                assert abs(f_hat[i, j]) <= mag[i, j]


@pytest.mark.parametrize("kind", ["diagonal", "dense", "low-rank"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_release_bounds_hold(kind, algorithm):
    """Seed 23 (+ kind, algorithm): corners, cancellation and generic records; variances with
    condition 1, 1e6 and 1e12; random orthonormal directions from QR with their tiny defect;
    ratios 0.5, 1 and 3.7 for the symmetric mechanism; non-power-of-two normalisers. The
    measured ℓ2 error of the lattice coordinates is at most the entrywise and the composed
    bounds (and every entry of ``f_hat`` and ``g_hat`` within its entrywise bound)."""
    rng = np.random.default_rng([23, ALGORITHMS.index(algorithm), len(kind)])
    m = 6
    ratios = RATIOS if algorithm == "symmetric" else (None,)
    for cond in (1.0, 1e6, 1e12):
        wh = whitenings(rng, m, cond)[kind]
        for data in ("corners", "cancel", "generic"):
            a = np.ones(m) if data == "cancel" else np.exp(rng.uniform(-2, 2, m))
            if data == "corners":
                chunks = corner_chunks(rng, a, 4, 6)
            elif data == "cancel":
                chunks = cancelling_chunks(rng, m, 4, 6)
            else:
                chunks = generic_chunks(rng, a, 4, 6)
            for ratio in ratios:
                measured, entrywise, composed = release_errors(
                    chunks, a, wh, algorithm, ratio, normaliser=24.0 * 1.1
                )
                assert measured <= entrywise, (cond, data, ratio, measured, entrywise)
                assert measured <= composed, (cond, data, ratio, measured, composed)


@pytest.mark.parametrize("records", [10**5, 10**7])
def test_huge_record_counts(records):
    """Seed 37: ``records`` identical-chunk records (a 1000-record chunk of full-mantissa values
    near the box's corners, repeated), tasks of 100 chunks, the tree of groups of 8; the exact
    Gram matrix is the repeat count times the chunk's exact sum. The bound holds for every
    algorithm with diagonal whitening (variances' condition 1e12) and for the Gram entries."""
    rng = np.random.default_rng(37)
    m = 4
    a = np.array([1.0, 3.5, 0.25, 7.0])
    chunk = a[:, None] * (1.0 - rng.uniform(0, 2.0**-8, size=(m, 1000)))
    chunk *= rng.choice([-1.0, 1.0], size=chunk.shape)
    wh = Whitening.diagonal(ill_conditioned_variances(rng, m, 1e12))
    for algorithm in ALGORITHMS:
        ratio = 3.7 if algorithm == "symmetric" else None
        measured, entrywise, composed = release_errors(
            [chunk], a, wh, algorithm, ratio, chunks_per_task=100, repeat=records // 1000
        )
        assert measured <= min(entrywise, composed)


def test_identity_bounds_hold():
    """Seed 41: one record column at the corners of a box (and random points of it, and of an
    L2 ball with ``norm_max``), each whitening kind, condition 1e12: ``||h_hat - A^-1 x||`` is
    within :func:`identity_error`."""
    rng = np.random.default_rng(41)
    m = 7
    for cond in (1.0, 1e12):
        for kind, wh in whitenings(rng, m, cond).items():
            Ainv = exact_inverse(wh)
            a = np.exp(rng.uniform(-2, 2, m))
            bound = identity_error(a, whitening=wh)
            C = 2.5
            ball_bound = identity_error(np.full(m, C), whitening=wh, norm_max=C)
            for trial in range(20):
                if trial < 10:
                    x = a * rng.choice([-1.0, 1.0], m)
                    b = bound
                else:
                    z = rng.standard_normal(m)
                    x = z / np.linalg.norm(z) * C * (1 - 1e-12)
                    b = ball_bound
                h = engine_identity(x, wh)
                exact = Ainv * mpmath.matrix(x.tolist())
                measured = l2_distance(h.tolist(), [exact[i] for i in range(m)])
                assert measured <= b, (kind, cond, measured, b)


def test_ball_domain_composed_bound():
    """Seed 43: records on the sphere of radius 2 (norm_max = 2) hold the composed bound, which
    is far below the box bound from ``a_i = 2``."""
    rng = np.random.default_rng(43)
    m = 6
    C = 2.0
    z = rng.standard_normal((m, 24))
    chunks = [
        (z / np.linalg.norm(z, axis=0) * C * (1 - 1e-12))[:, 6 * i : 6 * i + 6] for i in range(4)
    ]
    for wh in whitenings(rng, m, 1e6).values():
        for algorithm in ALGORITHMS:
            ratio = 1.0 if algorithm == "symmetric" else None
            measured, _, composed = release_errors(
                chunks, np.full(m, C), wh, algorithm, ratio, norm_max=C
            )
            assert measured <= composed
            box = covariance_error_bound(np.full(m, C), 24, 8, 24.0, wh, algorithm, ratio)
            assert composed <= box


@given(
    box=boxes(4),
    seed=st.integers(0, 2**32 - 1),
    width=st.integers(1, 9),
    per_task=st.integers(1, 4),
    algorithm=st.sampled_from(ALGORITHMS),
    ratio=st.sampled_from(RATIOS),
)
def test_property_box_records(box, seed, width, per_task, algorithm, ratio):
    """Hypothesis: records at the box's vertices and on its faces (shared strategy ``boxes``),
    diagonal and dense whitening with condition 1e8."""
    lo, hi = box
    rng = np.random.default_rng(seed)
    a = np.maximum(np.abs(lo), np.abs(hi))
    pick = rng.integers(0, 3, size=(4, 5 * width))
    x = np.where(pick == 0, lo[:, None], np.where(pick == 1, hi[:, None], 0.0))
    x = np.where(pick == 2, rng.uniform(lo[:, None], hi[:, None], size=x.shape), x)
    chunks = [x[:, i * width : (i + 1) * width] for i in range(5)]
    r = ratio if algorithm == "symmetric" else None
    for kind in ("diagonal", "dense"):
        wh = whitenings(rng, 4, 1e8)[kind]
        measured, entrywise, composed = release_errors(
            chunks, a, wh, algorithm, r, chunks_per_task=per_task
        )
        assert measured <= min(entrywise, composed)


def test_bound_is_not_absurdly_loose():
    """Seed 53: diagonal whitening, unit variances scaled by full-mantissa factors, records
    ``1 - t`` (one sign), 10^5 records in chunks of 100, tasks of 10 chunks, equi-modal. The
    composed bound exceeds the largest measured error by less than 10^6 (a wrong formula would
    be off by orders of magnitude); the observed factor is printed."""
    rng = np.random.default_rng(53)
    m = 4
    worst = 0.0
    bound = math.inf
    for _ in range(3):
        chunk = 1.0 - rng.uniform(0, 2.0**-6, size=(m, 100))
        wh = Whitening.diagonal(1.0 + rng.uniform(0, 0.5, m))
        measured, _, composed = release_errors(
            [chunk], np.ones(m), wh, "equi-modal", None, chunks_per_task=10, repeat=1000
        )
        worst = max(worst, measured)
        bound = min(bound, composed)
        assert measured <= composed
    factor = bound / worst
    print(f"\nbound / measured worst case: {factor:.3g}")
    assert 1.0 <= factor < 1e6


def test_defect_is_rigorous():
    """Seed 59: the certified ``||W^T W - I||_2`` of QR directions and of perturbed ones
    (1e-9, 1e-6) dominates the 60-digit value, and stays within 10^3 of it."""
    rng = np.random.default_rng(59)
    for m, k in ((8, 8), (9, 3)):
        for noise in (0.0, 1e-9, 1e-6):
            Q = random_orthonormal(rng, m)[:, :k] + noise * rng.standard_normal((m, k))
            wh = (
                Whitening.dense(Q, np.ones(m)) if k == m else Whitening.low_rank(Q, 1.0, np.ones(k))
            )
            M = mpmath.matrix(Q.tolist())
            D = M.T * M - mpmath.eye(k)
            exact = max(abs(t) for t in mpmath.svd_r(D, compute_uv=False))
            assert exact <= wh.defect
            assert wh.defect <= 1e3 * max(exact, 1e-16)


def test_overflow_and_invalid_inputs():
    """Domains whose Gram sums could overflow give ``inf``; a bad ratio, algorithm or
    whitening is refused."""
    wh = Whitening.diagonal(np.ones(3))
    assert covariance_error_bound(np.full(3, 1e150), 10**6, 10, 1e6, wh, "equi-modal") == math.inf
    err, _ = gram_error(np.full(3, 1e150), 10**6, 10, 1e6)
    assert np.all(np.isinf(err))
    with pytest.raises(ValueError):
        covariance_error_bound(np.ones(3), 10, 3, 10.0, wh, "symmetric", 0.4)
    with pytest.raises(ValueError):
        covariance_error_bound(np.ones(3), 10, 3, 10.0, wh, "gaussian")
    with pytest.raises(ValueError):
        Whitening.dense(2.0 * np.eye(3), np.ones(3))
    with pytest.raises(ValueError):
        Whitening.low_rank(np.eye(3)[:, :1], 1.0, np.array([-1.0]))


def test_wide_diagonal_and_low_rank_paths_are_cheap():
    """m = 20,000: the composed bound for diagonal and low-rank (k = 10) whitening is computed
    without any m x m matrix and is finite and small relative to ``sup ||g||``."""
    m, k = 20_000, 10
    rng = np.random.default_rng(61)
    a = np.ones(m)
    wh = Whitening.diagonal(rng.uniform(0.5, 2.0, m))
    E = covariance_error_bound(a, 10**9, 10**4, 1e9, wh, "symmetric", 1.0)
    assert 0 < E < 1e-6 * m * 2.0
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    lr = Whitening.low_rank(U, 1.0, rng.uniform(-0.5, 3.0, k))
    E = covariance_error_bound(a, 10**9, 10**4, 1e9, lr, "equi-modal", norm_max=math.sqrt(m))
    assert 0 < E < 1e-5 * m


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_whitening_dominated_errors(algorithm):
    """Seed 67: small-integer records and normaliser 1 make ``f_hat`` exact, so only the
    whitening rounds; directions perturbed by 1e-9 (dense ``W`` and low-rank ``U``) make their
    orthonormality defect the leading error. The bounds hold, and the composed bound is within
    10^4 of the measured error for the perturbed directions (the defect term is not dropped)."""
    rng = np.random.default_rng([67, ALGORITHMS.index(algorithm)])
    m = 6
    ratio = 3.7 if algorithm == "symmetric" else None
    for trial in range(4):
        chunks = [rng.integers(-3, 4, size=(m, 3)).astype(float) for _ in range(2)]
        a = np.full(m, 3.0)
        v = ill_conditioned_variances(rng, m, 1e4)
        W = random_orthonormal(rng, m) + 1e-9 * rng.standard_normal((m, m))
        U = random_orthonormal(rng, m)[:, :2] + 1e-9 * rng.standard_normal((m, 2))
        for wh in (
            Whitening.diagonal(v),
            Whitening.dense(W, v),
            Whitening.low_rank(U, 0.7, np.array([2.0, -0.5])),
        ):
            measured, entrywise, composed = release_errors(
                chunks, a, wh, algorithm, ratio, normaliser=1.0
            )
            assert measured <= min(entrywise, composed), (trial, wh.kind)
            if wh.kind != "diagonal":
                assert composed < 1e4 * measured, (trial, wh.kind, measured, composed)
