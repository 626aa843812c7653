"""Continual releases (mvg_dask.privacy.continual) against independent numpy/scipy computations:
explicit matrices built here from their definitions, scipy's matrix square root, brute force over
the changed record's period, generalised least squares, a seeded Monte Carlo, and Python-int
arithmetic for the exact integer encoders."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import linalg, special, stats

from mvg_dask.privacy.calibration import analytic_gaussian_mu
from mvg_dask.privacy.continual import (
    INT64_MAX,
    NaiveFactorization,
    StreamOverflowError,
    ToeplitzFactorization,
    TreeFactorization,
    TreeState,
    combine_exact,
    compare_at_budget,
    comparison_table,
    encode_period,
    factorization_from_dict,
    increment_headroom,
    make_factorization,
    one_shot_std,
    period_std,
    sqrt_coefficients,
    state_table,
    stream_std,
    tree_advance,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "bounds.md"


# -- independent constructions -----------------------------------------------------------------
def prefix(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T)))


def tree_encoder(T: int) -> np.ndarray:
    """Rows: the dyadic intervals [k 2^j + 1, (k + 1) 2^j] within [1, T], ordered by the period
    they end at, then by level."""
    nodes = [
        (k * 2**j + 2**j, j, k * 2**j + 1) for j in range(T.bit_length()) for k in range(T // 2**j)
    ]
    C = np.zeros((len(nodes), T))
    for r, (end, _, start) in enumerate(sorted(nodes)):
        C[r, start - 1 : end] = 1
    return C


def released_upto(T: int, t: int) -> int:
    return sum(1 for j in range(T.bit_length()) for k in range(T // 2**j) if (k + 1) * 2**j <= t)


def sqrt_encoder(T: int, bits: int | None = None, band: int | None = None) -> np.ndarray:
    c = np.array([special.comb(2 * k, k, exact=True) / 4**k for k in range(T)])
    if bits is not None:
        c = np.array(
            [
                float(round(Fraction(special.comb(2 * k, k, exact=True), 4**k) * 2**bits)) / 2**bits
                for k in range(T)
            ]
        )
    if band is not None:
        c[band:] = 0.0
    return linalg.toeplitz(c, np.zeros(T))


def brute_sensitivity(C: np.ndarray, rng: np.random.Generator) -> float:
    """A record added in period s changes g_s by Δ = 1: the released vector moves by C g' - C g."""
    T = C.shape[1]
    g = rng.integers(-50, 50, size=T).astype(float)
    best = 0.0
    for s in range(T):
        g2 = g.copy()
        g2[s] += 1.0
        best = max(best, float(np.linalg.norm(C @ g2 - C @ g)))
    return best


def all_factorizations(T: int) -> list:
    return [
        TreeFactorization(T, decoder="dyadic"),
        TreeFactorization(T, decoder="honaker"),
        ToeplitzFactorization(T),
        ToeplitzFactorization(T, band=3),
        NaiveFactorization(T),
    ]


HORIZONS = [1, 2, 3, 7, 8, 13, 16, 30]


# -- the matrices --------------------------------------------------------------------------------
@pytest.mark.parametrize("T", HORIZONS)
def test_encoders_are_the_definitions(T: int) -> None:
    np.testing.assert_array_equal(TreeFactorization(T).C, tree_encoder(T))
    np.testing.assert_array_equal(NaiveFactorization(T).C, prefix(T))
    for bits in (4, 12, 30):
        np.testing.assert_array_equal(ToeplitzFactorization(T, bits=bits).C, sqrt_encoder(T, bits))
    np.testing.assert_array_equal(
        ToeplitzFactorization(T, bits=12, band=3).C, sqrt_encoder(T, 12, band=3)
    )


def test_square_root_is_scipys_matrix_square_root() -> None:
    T = 24
    root = linalg.sqrtm(prefix(T))
    np.testing.assert_allclose(sqrt_encoder(T), root, atol=1e-10)
    np.testing.assert_allclose(sqrt_encoder(T) @ sqrt_encoder(T), prefix(T), atol=1e-12)
    # the dyadic rounding is within 2^-(bits+1) of the exact root, entry by entry
    for bits in (8, 12, 20):
        err = np.abs(ToeplitzFactorization(T, bits=bits).C - root).max()
        assert err <= 2.0 ** -(bits + 1) + 1e-12


def test_dyadic_coefficients_are_exact_roundings() -> None:
    for bits in (1, 12, 33):
        got = sqrt_coefficients(200, bits)
        for k, n in enumerate(got):
            exact = Fraction(math.comb(2 * k, k) * 2**bits, 4**k)
            assert abs(Fraction(n) - exact) <= Fraction(1, 2)


@pytest.mark.parametrize("T", HORIZONS)
def test_decoders_are_causal_and_unbiased(T: int) -> None:
    A = prefix(T)
    for f in all_factorizations(T):
        B, C = f.B, f.C
        assert B.shape == (T, f.n_outputs()) and C.shape == (f.n_outputs(), T)
        for t in range(1, T + 1):
            assert not B[t - 1, f.n_outputs(t) :].any(), (f, t)  # decoder uses outputs up to t
            rows = C[f.n_outputs(t - 1) if t > 1 else 0 : f.n_outputs(t)]
            assert rows.shape[0] == f.outputs_at(t)
            assert not rows[:, t:].any(), (f, t)  # encoder of period t uses g_1 .. g_t
        np.testing.assert_allclose(B @ C, A, atol=1e-10, rtol=0)
    # the integer tree decoders are exactly unbiased
    np.testing.assert_array_equal(TreeFactorization(T, decoder="dyadic").B @ tree_encoder(T), A)


@pytest.mark.parametrize("T", [5, 30, 200])
def test_toeplitz_decoder_solves_b_c_equal_a(T: int) -> None:
    for f in (ToeplitzFactorization(T, bits=12), ToeplitzFactorization(T, bits=12, band=4)):
        expected = linalg.solve_triangular(f.C.T, prefix(T).T, lower=False).T  # B = A C^-1
        np.testing.assert_allclose(f.B, expected, atol=1e-12)


@pytest.mark.parametrize("T", [1, 2, 5, 8, 11, 16])
def test_honaker_is_the_best_causal_linear_unbiased_estimator(T: int) -> None:
    tree = TreeFactorization(T, decoder="honaker")
    dyadic = TreeFactorization(T, decoder="dyadic")
    C = tree_encoder(T)
    better = False
    for t in range(1, T + 1):
        Ct = C[: released_upto(T, t), :t]  # the nodes released up to t, over g_1 .. g_t
        a = np.ones(t)
        # GLS / Gauss-Markov with iid unit noise: a^T (Ct^T Ct)^-1 Ct^T
        blue = np.linalg.solve(Ct.T @ Ct, a) @ Ct.T
        np.testing.assert_allclose(tree.decoder_row(t), blue, atol=1e-12)
        var_blue = float(a @ np.linalg.solve(Ct.T @ Ct, a))
        assert tree.period_std_factor(t) == pytest.approx(math.sqrt(var_blue), rel=1e-12)
        assert dyadic.period_std_factor(t) == pytest.approx(math.sqrt(bin(t).count("1")))
        assert tree.period_std_factor(t) <= dyadic.period_std_factor(t) + 1e-12
        better |= tree.period_std_factor(t) < dyadic.period_std_factor(t) - 1e-9
    assert better or T < 3


@pytest.mark.parametrize("T", HORIZONS)
def test_norms_are_the_matrices_norms(T: int) -> None:
    rng = np.random.default_rng(T)
    for f in all_factorizations(T):
        C, B = f.C, f.B
        sens = float(np.linalg.norm(C, axis=0).max())
        assert f.sensitivity() >= sens
        assert f.sensitivity() == pytest.approx(sens, rel=1e-14)
        assert brute_sensitivity(C, rng) == pytest.approx(sens, rel=1e-12)
        np.testing.assert_allclose(f.period_std_factors(), np.linalg.norm(B, axis=1), rtol=1e-12)
        assert f.worst_std_factor() == pytest.approx(np.linalg.norm(B, axis=1).max(), rel=1e-12)


# -- calibration and the ratios ----------------------------------------------------------------
def test_stream_is_one_gaussian_mechanism_of_the_column_norm() -> None:
    f = ToeplitzFactorization(30)
    mu = analytic_gaussian_mu(1.0, 1e-6)
    assert stream_std(f, 1.0, 1e-6, 0.5) == pytest.approx(f.sensitivity() * 0.5 / mu)
    assert one_shot_std(1.0, 1e-6, 0.5) == pytest.approx(0.5 / mu)
    assert period_std(f, 7, 1.0, 1e-6) == pytest.approx(
        f.sensitivity() / mu * float(np.linalg.norm(f.B[6]))
    )


def test_the_ratio_at_t_365() -> None:
    """The issue's 'must show': worst-period std at T = 365, (1, 1e-6), from numpy norms."""
    T, eps, delta = 365, 1.0, 1e-6
    one = one_shot_std(eps, delta)
    C = sqrt_encoder(T, bits=12)
    B = linalg.solve_triangular(C.T, prefix(T).T, lower=False).T
    sigma = np.linalg.norm(C, axis=0).max() / analytic_gaussian_mu(eps, delta)
    sqrt_ratio = sigma * np.linalg.norm(B, axis=1).max() / one
    Ct = tree_encoder(T)
    sigma_tree = np.linalg.norm(Ct, axis=0).max() / analytic_gaussian_mu(eps, delta)
    tree_ratio = sigma_tree * np.linalg.norm(TreeFactorization(T, decoder="dyadic").B, axis=1).max()
    tree_ratio /= one
    assert sqrt_ratio <= 3.0
    assert tree_ratio <= 9.0
    rows = {r.method: r.ratio for r in compare_at_budget(T, eps, delta)}
    assert rows["square root"] == pytest.approx(sqrt_ratio, rel=1e-9)
    assert rows["tree, dyadic decoder"] == pytest.approx(tree_ratio, rel=1e-9)
    assert rows["tree, Honaker decoder"] < tree_ratio
    assert rows["naive, Gaussian composition"] == pytest.approx(math.sqrt(T), rel=1e-9)
    # basic composition of T releases at (eps/T, delta/T) is worse than Gaussian composition
    assert rows["naive, ε/T and δ/T per period"] > math.sqrt(T)


def test_docs_print_the_code_s_tables() -> None:
    text = DOCS.read_text()
    assert comparison_table([30, 365, 1024], 1.0, 1e-6) in text
    assert state_table(365, [64, 2000]) in text


# -- the law of the published noise (Monte Carlo) -------------------------------------------------
def test_monte_carlo_period_std_matches_the_published_factor() -> None:
    """B (C g + Z) - A g over 20,000 seeded draws (seed 2026): each period's std within
    z SE of period_std_factor * sigma, and its mean within z SE of 0, with z = 3.84: Bonferroni
    for a family-wise alpha of 0.01 over the 5 x 8 x 2 = 80 comparisons (3 SE each would give a
    family-wise alpha near 0.2)."""
    T, n, sigma = 8, 20_000, 1.7
    checks = 2 * T * len(all_factorizations(T))
    z = float(stats.norm.isf(0.01 / (2 * checks)))
    rng = np.random.default_rng(2026)
    g = rng.integers(-1000, 1000, size=T).astype(float)
    for f in all_factorizations(T):
        Z = rng.standard_normal((n, f.n_outputs())) * sigma
        err = (f.C @ g + Z) @ f.B.T - prefix(T) @ g
        want = f.period_std_factors() * sigma
        sd = err.std(axis=0, ddof=1)
        assert np.all(np.abs(sd - want) <= z * want / math.sqrt(2 * (n - 1))), (f, sd, want)
        assert np.all(np.abs(err.mean(axis=0)) <= z * want / math.sqrt(n)), f


# -- the exact integer encoders ----------------------------------------------------------------
int64s = st.integers(-(2**40), 2**40)


@settings(max_examples=60, deadline=None)
@given(
    coefs=st.lists(st.integers(-(2**20), 2**20), min_size=1, max_size=12),
    data=st.data(),
)
def test_combine_exact_is_python_int_arithmetic(coefs: list[int], data: st.DataObject) -> None:
    hist = np.array(
        data.draw(
            st.lists(
                st.lists(int64s, min_size=6, max_size=6), min_size=len(coefs), max_size=len(coefs)
            )
        ),
        dtype=np.int64,
    ).reshape(len(coefs), 2, 3)
    got = combine_exact(coefs, hist)
    want = [sum(c * int(h.ravel()[i]) for c, h in zip(coefs, hist, strict=True)) for i in range(6)]
    assert got.dtype == np.int64
    assert [int(v) for v in got.ravel()] == want


def test_overflow_is_refused_not_wrapped() -> None:
    big = np.full((2, 3), 2**62, dtype=np.int64)
    with pytest.raises(StreamOverflowError, match="2\\*\\*63 - 1"):
        combine_exact([1, 1], np.stack([big, big]))
    with pytest.raises(StreamOverflowError):
        combine_exact([2], big[np.newaxis])
    # a sum whose exact value fits but whose bound does not is refused too (any order is safe)
    with pytest.raises(StreamOverflowError):
        combine_exact([1, -1], np.stack([big, big]))
    ok = combine_exact([1, 1], np.stack([big - 1, np.full((2, 3), 2**62, dtype=np.int64) - 1]))
    assert int(ok[0, 0]) == 2**63 - 2
    # a public bound decides the refusal from public numbers only
    with pytest.raises(StreamOverflowError):
        combine_exact([2**20], np.zeros((1, 2), dtype=np.int64), bound=2**43)
    with pytest.raises(ValueError, match="beyond the declared bound"):
        combine_exact([1], np.full((1, 2), 5, dtype=np.int64), bound=4)
    with pytest.raises(TypeError, match="int64"):
        combine_exact([1], np.ones((1, 2)))


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), band=st.none() | st.integers(1, 6))
def test_encode_period_is_python_int_arithmetic(T: int, seed: int, band: int | None) -> None:
    rng = np.random.default_rng(seed)
    f = ToeplitzFactorization(T, band=band)
    g = rng.integers(-(2**30), 2**30, size=(T, 2, 2))
    coef = sqrt_coefficients(T, f.bits)
    keep = f.state_matrices() + 1
    for t in range(1, T + 1):
        want = [
            sum(coef[t - s] * int(g[s - 1].ravel()[i]) for s in range(max(1, t - keep + 1), t + 1))
            for i in range(4)
        ]
        hist = g[max(0, t - keep) : t]  # what the curator keeps, plus the new increment
        got = encode_period(f, t, hist, bound=2**30)
        assert got.shape == (1, 2, 2)
        assert [int(v) for v in got.ravel()] == want
    if 1 < keep <= T:
        with pytest.raises(ValueError, match="needs its last"):
            encode_period(f, T, g[T - keep + 1 : T])


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_tree_state_releases_the_encoder_rows(T: int, seed: int) -> None:
    tree = TreeFactorization(T)
    rng = np.random.default_rng(seed)
    g = rng.integers(-(2**40), 2**40, size=(T, 3))
    state = TreeState()
    for t in range(1, T + 1):
        released, state = tree_advance(tree, state, g[t - 1])
        rows = tree.encoder_rows(t)
        want = [[sum(int(r[s]) * int(g[s, i]) for s in range(t)) for i in range(3)] for r in rows]
        assert released.tolist() == want
        assert len(state.open) <= tree.state_matrices()
        np.testing.assert_array_equal(encode_period(tree, t, g[:t]), released)
    assert state.open == ()
    with pytest.raises(ValueError, match="past it"):
        tree_advance(tree, state, g[0])


def test_tree_overflow_is_refused() -> None:
    tree = TreeFactorization(4)
    big = np.full(2, 2**62, dtype=np.int64)
    _, state = tree_advance(tree, TreeState(), big)
    with pytest.raises(StreamOverflowError):
        tree_advance(tree, state, big)
    with pytest.raises(StreamOverflowError, match="headroom"):
        tree_advance(tree, TreeState(), np.zeros(2, dtype=np.int64), bound=2**62)
    assert increment_headroom(tree) == INT64_MAX // 4


def test_headroom_admits_the_bound() -> None:
    f = ToeplitzFactorization(50)
    m = increment_headroom(f)
    hist = np.full((50, 1), m, dtype=np.int64)
    out = encode_period(f, 50, hist, bound=m)
    assert int(out[0, 0]) == sum(sqrt_coefficients(50, f.bits)) * m
    with pytest.raises(StreamOverflowError):
        encode_period(f, 50, hist, bound=m + 1)


# -- descriptions and refusals -------------------------------------------------------------------
def test_round_trip_and_refusals() -> None:
    for f in [*all_factorizations(9), ToeplitzFactorization(9, bits=7)]:
        again = factorization_from_dict(json.loads(json.dumps(f.to_dict())))
        assert again == f and again.to_dict() == f.to_dict()
    assert make_factorization("banded", 9, band=4).to_dict()["factorization"] == "banded"
    bad = [
        ({"factorization": "square-root", "horizon": 0}, "horizon"),
        ({"factorization": "square-root", "horizon": 10**6}, "horizon"),
        ({"factorization": "square-root", "horizon": 3.0}, "horizon"),
        ({"factorization": "cube-root", "horizon": 3}, "one of"),
        ({"factorization": "banded", "horizon": 3}, "needs a band"),
        ({"factorization": "square-root", "horizon": 3, "bits": 0}, "bits"),
        ({"factorization": "tree", "horizon": 3, "bits": 8}, "takes no option bits"),
        ({"factorization": "tree", "horizon": 3, "decoder": "x"}, "decoder"),
        ({"factorization": "tree"}, "needs a horizon"),
    ]
    for data, message in bad:
        with pytest.raises(ValueError, match=message):
            factorization_from_dict(data)
    with pytest.raises(ValueError, match="period"):
        ToeplitzFactorization(5).period_std_factor(6)


def test_state_sizes() -> None:
    assert TreeFactorization(365).state_matrices() == 8
    assert ToeplitzFactorization(365).state_matrices() == 364
    assert ToeplitzFactorization(365, band=32).state_matrices() == 31
    assert ToeplitzFactorization(365).state_bytes(2000) == 364 * 2000 * 2000 * 8


def test_rounding_and_band_claims_of_the_docs() -> None:
    """docs/bounds.md: b = 12 is within 2e-5 (relative) of the exact root's ratio for T <= 10,000,
    and the banded ratios at T = 365."""
    for T in (365, 1024, 10_000):
        coarse = ToeplitzFactorization(T, bits=12).ratio_to_one_shot()
        fine = ToeplitzFactorization(T, bits=40).ratio_to_one_shot()
        assert abs(coarse / fine - 1) < 2e-5
    got = [
        round(ToeplitzFactorization(365, band=b).ratio_to_one_shot(), 2) for b in (16, 32, 64, 128)
    ]
    assert got == [6.15, 4.77, 3.85, 3.30]
    assert round(math.log2(increment_headroom(ToeplitzFactorization(365))), 1) == 46.6
    assert round(math.log2(increment_headroom(ToeplitzFactorization(1024))), 1) == 45.8
    assert round(math.log2(increment_headroom(TreeFactorization(365))), 1) == 55.0


def test_bad_integer_inputs_are_refused() -> None:
    with pytest.raises(TypeError, match="integers"):
        combine_exact([1.5], np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(StreamOverflowError, match="coefficient"):
        combine_exact([2**63], np.zeros((1, 2), dtype=np.int64))
    tree = TreeFactorization(4)
    _, state = tree_advance(tree, TreeState(), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="does not match"):
        tree_advance(tree, state, np.zeros((2, 3), dtype=np.int64))


def test_output_keys_name_each_output_once() -> None:
    tree = TreeFactorization(8)
    assert tree.output_keys(8) == ("node-0", "node-1", "node-2", "node-3")
    assert ToeplitzFactorization(8).output_keys(3) == ("y0",)
    f = TreeFactorization(np.int64(9))
    assert type(f.horizon) is int and json.dumps(f.to_dict())
    assert TreeFactorization.from_dict(f.to_dict()) == f
    assert ToeplitzFactorization(365).state_elements(64) == 364 * 64 * 64


def _released_stream(f, g: np.ndarray) -> np.ndarray:
    """Every output of the stream over increments ``g``, by the exact integer encoders (the tree
    through its open-node state, the Toeplitz ones from the kept history, the naive one from the
    whole history: its state is a running total, not a history)."""
    out, state = [], TreeState()
    keep = f.state_matrices() + 1 if isinstance(f, ToeplitzFactorization) else f.horizon
    for t in range(1, f.horizon + 1):
        if isinstance(f, TreeFactorization):
            released, state = tree_advance(f, state, g[t - 1])
        else:
            released = encode_period(f, t, g[max(0, t - keep) : t])
        out.extend(released)
    return np.array(out)


@pytest.mark.parametrize("T", [1, 6, 13])
def test_a_record_in_period_s_moves_the_integer_stream_by_column_s(T: int) -> None:
    """End to end through the integer encoders: adding Δ to g_s moves the released integers by
    exactly C_int[:, s] ⊗ Δ; the largest move over s, scaled back, is ``sensitivity() ‖Δ‖``."""
    rng = np.random.default_rng(T)
    g = rng.integers(-(2**20), 2**20, size=(T, 2, 2))
    delta = rng.integers(-9, 10, size=(2, 2))
    for f in all_factorizations(T):
        base = _released_stream(f, g)
        c_int = np.rint(np.ldexp(f.C, f.scale_bits)).astype(np.int64)
        worst = 0.0
        for s in range(T):
            g2 = g.copy()
            g2[s] += delta
            move = _released_stream(f, g2) - base
            np.testing.assert_array_equal(move, c_int[:, s, None, None] * delta)
            worst = max(worst, float(np.linalg.norm(np.ldexp(move.astype(float), -f.scale_bits))))
        assert worst == pytest.approx(f.sensitivity() * np.linalg.norm(delta), rel=1e-12)
        assert worst <= f.sensitivity() * np.linalg.norm(delta) * (1 + 1e-15)
