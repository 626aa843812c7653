"""Statistical and determinism tests of the exact rounded-Gaussian (lattice) sampler.

Every statistical test states its significance level ALPHA and uses a fixed seed, so it is
deterministic; with a correct sampler each would fail with probability about ALPHA on a fresh
seed. The law under test: ``K = floor(s N + 1/2)``, ``P(K = k) = Phi((k+1/2)/s) - Phi((k-1/2)/s)``.
"""

from __future__ import annotations

import math
import os

import mpmath
import numpy as np
import pytest
from scipy import stats

from mvg_dask.noise import NoiseKey, tile_rounded_gaussian
from mvg_dask.noise.lattice import MAX_SCALE, MIN_SCALE, _draw, _table

ALPHA = 1e-3
FORCE = {"margin": 0.125, "cover": 1.5}  # sends about a quarter of the elements to the exact path


def _interval_prob(lo: np.ndarray, hi: np.ndarray, s: float) -> np.ndarray:
    """P(lo <= K < hi) for integer (or infinite) bounds: Phi((hi-1/2)/s) - Phi((lo-1/2)/s)."""
    a, b = (lo - 0.5) / s, (hi - 0.5) / s
    # the upper half through the survival function, to avoid cancellation in the right tail
    return np.where(
        b <= 0, stats.norm.cdf(b) - stats.norm.cdf(a), stats.norm.sf(a) - stats.norm.sf(b)
    )


def _chi2_pvalue(x: np.ndarray, s: float, nbins: int = 200, fine: int = 0) -> float:
    """Chi-square p-value of the draws ``x`` against the exact law, expected counts >= 5.

    Bins: equal-probability quantiles of the law (distinct integers only), plus single values
    ``-fine..fine``; the two tails are binned together with their neighbours.
    """
    q = np.linspace(0, 1, nbins + 1)[1:-1]
    edges = np.floor(s * stats.norm.ppf(q) + 0.5)
    if fine:
        edges = np.concatenate([edges, np.arange(-fine, fine + 2)])
    edges = np.unique(edges)
    lo = np.concatenate([[-np.inf], edges])
    hi = np.concatenate([edges, [np.inf]])
    expected = x.size * _interval_prob(lo, hi, s)
    # merge bins (from the outside in) until every expected count is at least 5
    while expected[0] < 5 or expected[-1] < 5:
        if expected[0] < 5:
            edges = edges[1:]
        if expected[-1] < 5:
            edges = edges[:-1]
        lo = np.concatenate([[-np.inf], edges])
        hi = np.concatenate([edges, [np.inf]])
        expected = x.size * _interval_prob(lo, hi, s)
    assert expected.min() >= 5 and abs(expected.sum() - x.size) < 1e-6 * x.size
    observed = np.bincount(
        np.searchsorted(edges, x.ravel(), side="right"), minlength=edges.size + 1
    )
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    return float(stats.chi2.sf(chi2, df=edges.size))


def _exact_pmf(k: int, s: float) -> mpmath.mpf:
    """P(K = k) in 50-digit arithmetic, from erfc (independent of scipy)."""
    k = abs(k)  # the law is symmetric; erfc of positive arguments has no cancellation
    with mpmath.workdps(50):
        sq = mpmath.sqrt(2) * s
        return (
            mpmath.erfc((k - mpmath.mpf(1) / 2) / sq) - mpmath.erfc((k + mpmath.mpf(1) / 2) / sq)
        ) / 2


def _exact_moments(s: float) -> tuple[float, float]:
    """E[K^2] and E[K^4] of the exact law (K is symmetric, so E[K] = 0).

    In 50-digit mpmath for small scales; in float64 (relative error ~1e-13, far below the test's
    tolerance) for large ones, where mpmath would need tens of thousands of terms.
    """
    if s > 16:
        k = np.arange(1, math.ceil(14 * s) + 10, dtype=np.float64)
        p = stats.norm.sf((k - 0.5) / s) - stats.norm.sf((k + 0.5) / s)
        return float(2 * np.sum(k * k * p)), float(2 * np.sum(k**4 * p))
    with mpmath.workdps(50):
        top = math.ceil(14 * s) + 10  # P(|K| > top) < 1e-40
        m2 = m4 = mpmath.mpf(0)
        for k in range(1, top + 1):
            p = _exact_pmf(k, s)
            m2 += 2 * k * k * p
            m4 += 2 * k**4 * p
        return float(m2), float(m4)


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.7, 2.0**10, 2.0**24])
def test_chi2_goodness_of_fit(scale):
    """10^7 draws (ten 1000 x 1000 tiles) against the exact law; seed 11, ALPHA = 1e-3."""
    key = NoiseKey.from_seed(11)
    x = np.concatenate([key.tile_lattice(t, (1000, 1000), scale).ravel() for t in range(10)])
    assert x.dtype == np.int64 and x.size == 10**7
    assert _chi2_pvalue(x, scale, fine=20 if scale == 2.0**10 else 0) > ALPHA


@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_exact_pmf_at_small_scales(scale):
    """Per-value frequencies of 10^7 draws (seed 12) against Phi((k+1/2)/s) - Phi((k-1/2)/s).

    Each value with expected count >= 5 is a two-sided binomial z-test at ALPHA / (values)
    (Bonferroni), ALPHA = 1e-3; the pmf used is checked against a 50-digit mpmath one.
    """
    key = NoiseKey.from_seed(12)
    x = key.tile_lattice(0, (10**7,), scale)
    n = x.size
    ks = np.arange(-12, 13)
    pmf = _interval_prob(ks.astype(float), ks + 1.0, scale)
    # independent check of the law itself
    for k, p in zip(ks.tolist(), pmf, strict=True):
        exact = _exact_pmf(k, scale)
        assert abs(p - float(exact)) <= 1e-12 * float(exact) + 1e-300
    with mpmath.workdps(50):
        assert (
            abs(mpmath.fsum(_exact_pmf(k, scale) for k in range(-60, 61)) - 1)
            < mpmath.mpf(10) ** -40
        )
    assert not np.any(np.abs(x) > 12)  # P(|K| > 12) < 1e-30 at these scales
    counts = np.array([(x == k).sum() for k in ks])
    tested = pmf * n >= 5
    z = stats.norm.isf(ALPHA / (2 * tested.sum()))
    sd = np.sqrt(n * pmf * (1 - pmf))
    assert np.all(np.abs(counts - n * pmf)[tested] <= z * sd[tested])
    # values never expected (p n < 5) appear rarely: at most a handful in total
    assert counts[~tested].sum() <= 20


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.7, 2.0**10])
def test_mean_and_variance(scale):
    """Sample mean and variance of 10^7 draws (seed 13) within their z-bands, ALPHA = 1e-3 each.

    The variance is the exact ``sum k^2 P(k)`` (tends to ``s^2 + 1/12``), by mpmath.
    """
    key = NoiseKey.from_seed(13)
    x = key.tile_lattice(5, (10**7,), scale).astype(np.float64)
    n = x.size
    m2, m4 = _exact_moments(scale)
    if scale >= 3:
        assert abs(m2 - (scale**2 + 1 / 12)) < 1e-9 * scale**2
    z = stats.norm.isf(ALPHA / 2)
    assert abs(x.mean()) <= z * math.sqrt(m2 / n)
    var = float(np.mean(x * x))  # the mean is known to be 0
    assert abs(var - m2) <= z * math.sqrt((m4 - m2 * m2) / n)


def test_determinism_and_tile_invariance():
    key = NoiseKey.from_seed(42)
    s = 2.0**20
    a = key.tile_lattice(3, (64, 100), s)
    assert a.shape == (64, 100) and a.dtype == np.int64
    assert np.array_equal(a, NoiseKey.from_seed(42).tile_lattice(3, (64, 100), s))
    assert np.array_equal(a, tile_rounded_gaussian(key, 3, (64, 100), s))
    # C order: the shape only reshapes the one stream
    assert np.array_equal(a.ravel(), key.tile_lattice(3, (6400,), s))
    # prefix property: a shorter tile is a prefix of a longer one (different batch sizes)
    long = key.tile_lattice(7, (100_000,), s)
    for m in (1, 4, 10, 999, 50_000):
        assert np.array_equal(key.tile_lattice(7, (m,), s), long[:m])
    assert not np.array_equal(a, key.tile_lattice(4, (64, 100), s))
    assert not np.array_equal(a, key.derive("lattice").tile_lattice(3, (64, 100), s))
    assert not np.array_equal(a, NoiseKey.from_seed(43).tile_lattice(3, (64, 100), s))
    assert not np.array_equal(a, key.tile_lattice(3, (64, 100), 2.0**21))
    assert key.tile_lattice(0, (0,), s).shape == (0,)


def test_unsupported_scales_are_refused():
    key = NoiseKey.from_seed(1)
    for bad in (0.0, -1.0, MIN_SCALE / 2, MAX_SCALE * 2, math.inf, math.nan):
        with pytest.raises(ValueError, match="scale"):
            key.tile_lattice(0, (3,), bad)
    assert key.tile_lattice(0, (1000,), MAX_SCALE).dtype == np.int64
    assert np.all(key.tile_lattice(0, (1000,), MIN_SCALE) == 0)  # P(K != 0) ~ 1e-19000


@pytest.mark.parametrize("scale", [0.5, 3.7, 2.0**10, 2.0**40])
def test_envelope_dominates_the_density(scale):
    """The rejection envelope is above the target everywhere (checked in 60-digit arithmetic)."""
    tab = _table(scale)
    assert sum(tab.counts) <= 2**32 and tab.acceptance > 0.97
    with mpmath.workdps(60):
        s, w, big_c = mpmath.mpf(scale), mpmath.mpf(tab.w), mpmath.mpf(tab.big_c)
        for j, c in enumerate(tab.counts[:-1]):
            assert big_c * c >= w * mpmath.exp(-((j * w) ** 2) / (2 * s * s))
        ell = mpmath.mpf(tab.tail_start)
        assert ell >= 7 * s
        assert big_c * tab.counts[-1] >= mpmath.exp(-(ell**2) / (2 * s * s)) * s * s / ell


@pytest.mark.parametrize("scale", [3.7, 2.0**10])
def test_forced_exact_path_keeps_the_law(scale):
    """With wide margins and a short table a quarter of the elements go to the exact path.

    Chi-square of 2 x 10^4 draws (seed 14) against the exact law, ALPHA = 1e-3; then 10^4 draws
    with more than half of the elements on the exact path (chi-square, ALPHA = 1e-3).
    """
    key = NoiseKey.from_seed(14)
    n = 20_000
    x, st = _draw(key, 0, (n,), scale, **FORCE)
    assert st.undecided > 0.2 * n and st.tail > 0.05 * n and st.exact_trials > 0
    assert st.side_words > 0
    assert _chi2_pvalue(x, scale, nbins=40) > ALPHA
    y, st2 = _draw(key, 1, (n // 2,), scale, margin=0.4999, cover=0.5)
    assert st2.undecided > 0.25 * n
    assert _chi2_pvalue(y, scale, nbins=40) > ALPHA


def test_forced_exact_path_is_deterministic():
    key = NoiseKey.from_seed(15)
    s = 3.7
    a, st = _draw(key, 2, (3000,), s, **FORCE)
    b, _ = _draw(NoiseKey.from_seed(15), 2, (3000,), s, **FORCE)
    assert st.undecided > 500
    assert np.array_equal(a, b)
    # the side stream is read in element order: the prefix property still holds
    c, _ = _draw(key, 2, (1200,), s, **FORCE)
    assert np.array_equal(a[:1200], c)
    assert not np.array_equal(a, _draw(key, 3, (3000,), s, **FORCE)[0])


def test_reproducible_exp_is_within_its_error_bound():
    """The fast path's own exp(-x) (IEEE + - * only) is within 2^-50 of exp(-x) (seed 16)."""
    from mvg_dask.noise.lattice import _exp_neg_py

    xs = np.concatenate([np.random.default_rng(16).uniform(0, 64, 5000), [0.0, 0.5, 24.5, 64.0]])
    with mpmath.workprec(120):
        worst = max(
            abs(mpmath.mpf(_exp_neg_py(float(x))) / mpmath.exp(-mpmath.mpf(x)) - 1) for x in xs
        )
    assert worst < 2.0**-50


@pytest.mark.parametrize("scale", [MIN_SCALE, 0.8, 3.7, 41.0, 2.0**10, 2.0**20, MAX_SCALE])
@pytest.mark.parametrize("forced", [False, True])
def test_uncompiled_kernel_draws_the_compiled_bits(scale, forced, monkeypatch):
    """A process's first elements are drawn by the kernel's Python source, uncompiled: the same
    bits as the numba-compiled kernel, on the fast path and with a quarter of the elements
    forced onto the exact path (seed 17)."""
    from mvg_dask.noise import lattice

    options = FORCE if forced else {}
    key = NoiseKey.from_seed(17)
    sizes = ((0, 1), (1, 441), (2, 4096), (3, 5000))
    monkeypatch.setattr(lattice, "_uncompiled_left", [0])
    compiled = [_draw(key, t, (n,), scale, **options)[0] for t, n in sizes]
    assert lattice._compiled
    monkeypatch.setattr(lattice, "_uncompiled_left", [10**9])
    monkeypatch.setattr(lattice, "_compiled", [])
    monkeypatch.setattr(lattice, "_exp_neg", lattice._exp_neg_py)
    uncompiled = [_draw(key, t, (n,), scale, **options)[0] for t, n in sizes]
    assert not lattice._compiled  # the Python source ran
    for a, b in zip(compiled, uncompiled, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("scale", [MIN_SCALE, 0.8, 3.7, 2.0**20, MAX_SCALE])
@pytest.mark.parametrize("margin", [2.0**-40, 0.125])
def test_sub_block_bounds_decide_as_the_exponential_path(scale, margin):
    """The kernel's sub-block integer bounds only take decisions its exponential path would take
    the same way (so the undecided trials, and the bytes, are those of the exponential path):
    for random trials and trials at the sub-block and bound edges, ``wq < accept`` implies
    ``(wq + 1) 2^-32 <= plo`` and ``wq >= reject`` implies ``wq 2^-32 >= phi``, with ``plo`` and
    ``phi`` computed as the kernel computes them (seed 18)."""
    from mvg_dask.noise import lattice

    tab = lattice._table(scale, margin)
    rng = np.random.default_rng(18)
    sub_bits = lattice._SUB_BITS
    ulp = math.ldexp(1.0, -(63 - tab.b + tab.e))
    decided = 0
    for _ in range(4000):
        j = int(rng.integers(tab.nblocks))
        edge = int(rng.integers(0, 1 << sub_bits)) << (63 - sub_bits)
        low = int(rng.choice([int(rng.integers(0, 2**63)), edge, max(edge - 1, 0), edge + 1]))
        sb = tab.nblocks + 1 + (j << sub_bits) + (low >> (63 - sub_bits))
        acc, rej = int(tab.accept[sb]), int(tab.reject[sb])
        band = int(rng.integers(tab.accept[j], tab.reject[j]))
        for wq in (acc - 1, acc, rej - 1, rej, band):
            ylo = j * tab.w + float(low) * ulp
            yhi = ylo + ulp
            plo = lattice._exp_neg_py((yhi * yhi) * tab.inv2s2) * tab.beta[j] * (1 - margin)
            phi = lattice._exp_neg_py((ylo * ylo) * tab.inv2s2) * tab.beta[j] * (1 + margin)
            if wq < acc:
                assert (wq + 1) * 2.0**-32 <= plo
                decided += 1
            if wq >= rej:
                assert wq * 2.0**-32 >= phi
                decided += 1
    assert decided >= 8000  # the bounds are tight enough to decide at their edges


def test_kept_tile_generators_give_the_words_of_fresh_ones():
    """``NoiseKey.tile_bits`` (a thread's kept generator moved to a tile) reads the words and
    normals of a generator built for the tile, whatever was drawn from it before, for tiles at
    both ends of the counter space and more keys than a thread keeps."""
    keys = [NoiseKey.from_seed(s) for s in range(10)]
    tiles = [0, 1, 7, 2**32 + 5, 2**63, 2**64 - 1]
    for t in tiles:
        for key in keys:
            kept = key.tile_bits(t).random_raw(37)  # a partial buffer left behind
            assert np.array_equal(kept, key.generator(t).bit_generator.random_raw(37))
    for key in keys[:3]:
        for t in tiles:
            normals = key.tile_normals(t, (3, 5))
            assert normals.tobytes() == key.generator(t).standard_normal((3, 5)).tobytes()
    with pytest.raises(ValueError, match="tile index out of range"):
        keys[0].tile_bits(2**64)


class _PlainKey:
    """A sampler key with a generator only (no kept ones): the sampler's other branch."""

    def __init__(self, key: NoiseKey) -> None:
        self.generator = key.generator


@pytest.mark.parametrize("forced", [False, True])
def test_kept_generators_draw_the_bits_of_fresh_ones(forced):
    """The compiled sampler's main stream (AES-NI words, or a kept generator's) gives the tile
    of a fresh generator's, also when many elements go to the exact path (whose side stream is
    a fresh generator)."""
    from mvg_dask.noise import lattice

    lattice._kernel()  # the compiled kernel and its word source
    key = NoiseKey.from_seed(99)
    knobs = FORCE if forced else {}
    for t, scale in [(0, 1.0), (3, 2.0**-9), (2**40, 2.0**20)]:
        kept, st = _draw(key, t, (5, 700), scale, **knobs)
        fresh, st2 = _draw(_PlainKey(key), t, (5, 700), scale, **knobs)
        assert kept.tobytes() == fresh.tobytes() and st == st2
        assert st.undecided > 0 or not forced


def test_compiled_aes_words_are_the_generators_words():
    """``aes.tile_words`` (AES-NI, eight blocks a step) returns the words ``AESCounter``'s
    ``random_raw`` reads, for tiles at both ends of the counter space, block-aligned offsets
    and odd counts; other ranges are refused."""
    from mvg_dask.noise import aes

    if not aes.available():
        pytest.skip("no AES-NI on this CPU: the sampler reads random_raw")
    for seed, t in [(1, 0), (2, 9), (3, 2**63 + 1), (4, 2**64 - 1)]:
        key = NoiseKey.from_seed(seed)
        rk = key.round_keys()
        assert rk is not None
        want = key.generator(t).bit_generator.random_raw(3001)
        for first, count in [(0, 3001), (0, 0), (2, 1), (16, 15), (998, 2003)]:
            got = aes.tile_words(rk, t, first, count)
            assert got.dtype == np.uint64 and np.array_equal(got, want[first : first + count])
    with pytest.raises(ValueError, match="block-aligned"):
        aes.tile_words(rk, 0, 3, 4)
    # the once-per-key check the sampler makes before it uses them: other round keys disagree
    assert aes.agrees(rk, key.generator)
    assert not aes.agrees(rk ^ np.uint64(1), key.generator)


def test_numba_compiling_for_another_cpu_reads_random_raw(tmp_path):
    """With ``NUMBA_CPU_NAME=generic`` (numba's portable caches) the compiled AES words are not
    used (LLVM would abort the process on the AES-NI instruction): the sampler reads
    ``random_raw`` and draws the same values as here."""
    import subprocess
    import sys

    code = (
        "from mvg_dask.noise import aes; from mvg_dask.noise.rng import NoiseKey; "
        "print(aes.available(), int(NoiseKey.from_seed(5).tile_lattice(3, (4, 256), 7.5).sum()))"
    )
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    available, total = out.stdout.split()
    assert available == "False"
    assert int(total) == int(NoiseKey.from_seed(5).tile_lattice(3, (4, 256), 7.5).sum())
