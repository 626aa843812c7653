r"""Exact, keyed sampler of the rounded Gaussian on the integers (the lattice release).

The law
-------
For a scale ``s > 0``, :func:`tile_rounded_gaussian` draws iid integers

.. math:: K = \lfloor s N + 1/2 \rfloor, \qquad N \sim \mathcal N(0, 1),

that is :math:`P(K = k) = \Phi((k + 1/2)/s) - \Phi((k - 1/2)/s)`. For an integer vector ``h``,
``h + K = round(h + s N)``: the release is post-processing of the continuous Gaussian
mechanism, so its Gaussian-DP accounting is that of ``h + s N``. The sampler is *exact*: with
ideal uniform bits its output has exactly this law — no truncation, no float approximation.

The algorithm
-------------
``Y = ±|Y|`` with a fair sign and ``|Y|`` drawn by rejection from a dyadic *step envelope* of
the half-Gaussian ``f(y) = exp(-y^2 / 2 s^2)``, ``y >= 0``:

* blocks ``[j w, (j + 1) w)``, ``j < J``, of a power-of-two width ``w`` in ``(s/32, s/16]``,
  cover ``[0, L)``, ``L = J w >= 7 s``; block ``j`` has proposal mass ``c_j / 2^32`` and height
  ``C c_j / w`` (integers ``c_j``, a float ``C``, checked with interval arithmetic to satisfy
  ``C c_j >= w f(j w)``: the envelope dominates ``f``);
* the tail ``[L, ∞)`` has mass ``c_T / 2^32`` and the exponential envelope tangent to ``f`` at
  ``L`` (``C c_T >= f(L) s^2 / L``); the remaining ``2^32 - sum c`` of the 32-bit index means
  "reject this trial".

A trial reads two 64-bit words: 32 bits choose the block (a guide table over the cumulative
``c``), 32 bits are the leading bits of the acceptance uniform ``W``, one bit is the sign and 63
bits are the leading bits of the position of ``|Y|`` inside the block. As ``w`` and the block
edges are dyadic, ``|Y| = (A + U) 2^{-e}`` with an integer ``A`` read from the bits, ``e >= 1``
and ``U`` the unread rest of the position, so ``round(|Y|) = (A + 2^{e-1}) >> e`` is exact. The
trial accepts when ``W < f(|Y|) w / (C c_j)`` (tail: ``W < f(|Y|) / (C c_T q_T(|Y|))``).
Most trials are decided by integer bounds of the 32 read bits of ``W`` for the block, the
few left open by bounds for the block's sixteenth the position falls in (:func:`_sub_bounds`:
they take exactly the decisions the exponential below would take), the rest by that
exponential.

Why the law is exact
--------------------
Each trial is standard rejection sampling: the proposal density is ``sum_j c_j / 2^32`` times
uniform on block ``j`` plus the tail part, ``f <= C 2^32 q`` everywhere, and a trial accepts with
probability ``f / (C 2^32 q)``, so an accepted ``|Y|`` has density ``∝ f`` (Canonne, Kamath and
Steinke 2020, Alg. 1–3, use the same scheme with a discrete-Laplace proposal). The uniforms are
infinite bit strings of which only a prefix is read (Karney 2016): a comparison ``W < p(Y)`` is
taken on the fast path only when it holds for *every* completion of the read bits, with a relative
margin (``2^-40``) that covers every float rounding error (at most about ``2^-45`` here; the fast
path's ``exp`` is built from IEEE-754 ``+ - *`` only, so its decisions, and hence the output bits,
do not depend on the platform's ``libm``). Otherwise the trial is handed to an exact path that reads
further bits of the same uniforms from a side stream and decides with rigorous interval arithmetic
(:mod:`mpmath` ``iv``, precision growing with the bits), until the interval of ``p(Y)`` and that of
``W`` separate, which happens with probability 1. A comparison is therefore a function of the
infinite uniforms, decided by reading enough of them, and the output is the exact law whatever path
decides it. About ``2^-31`` of the elements reach the exact path (an undecided comparison,
``2^-32``, or the tail). The tail (probability ``2^-32`` per trial) is entirely on the exact path:
``|Y| = L + (s^2 / L) E``, ``E = -ln V``, with ``V`` refined until both the acceptance and the
rounding are decided.

Keyed and deterministic
-----------------------
The words come from ``key.generator(tile)`` (AES-CTR from block ``tile * 2^64``), read in order
(the compiled kernel's are the same words, encrypted by :mod:`mvg_dask.noise.aes` with AES-NI);
an element takes trials until one is accepted or undecided on the fast path. An undecided
element is finished by the exact path from the side stream (the same tile, from block
``tile * 2^64 + 2^63``), in element order; a rejected exact trial is followed by fresh trials
from the side stream. Every bit is read once, so the elements are iid; the output depends only
on ``(key, tile, shape, scale)``, and a shorter tile is a prefix of a longer one. The running
time depends on the random bits only.

References
----------
C. L. Canonne, G. Kamath, T. Steinke, "The discrete Gaussian for differential privacy",
NeurIPS 2020 (Algorithms 1–3).
C. F. F. Karney, "Sampling exactly from the normal distribution", ACM Trans. Math. Softw. 42(1),
2016.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from mpmath import libmp
from mpmath.ctx_iv import MPIntervalContext


class TileKey(Protocol):
    """What the sampler needs of a :class:`mvg_dask.noise.rng.NoiseKey` (which calls it, so the
    sampler does not import it back): the keyed generator of a tile."""

    def generator(self, tile: int = 0) -> np.random.Generator:
        """The AES-CTR generator of tile ``tile``."""
        ...


#: Supported scales: ``2^-16 <= s <= 2^46`` (then ``|K|`` stays far inside int64).
MIN_SCALE = 2.0**-16
MAX_SCALE = 2.0**46

#: Relative safety margin of every fast-path decision (float errors are below ``2^-45``).
_MARGIN = 2.0**-40
#: The blocks cover ``[0, _COVER * s)`` at least; beyond is the (exact-path) tail.
_COVER = 7.0
#: Side stream: AES blocks ``tile * 2^64 + 2^63`` onwards, i.e. ``2^64`` words after the tile start.
_SIDE_WORDS = 1 << 64
_MASK63 = (1 << 63) - 1
_MASK32 = (1 << 32) - 1
#: The guide table has ``2^_GUIDE_BITS`` buckets of the 32-bit block index (16 KiB of int32): a
#: bucket holds a block boundary for a few per cent of the trials only, so the search after the
#: guide rarely loops (a mispredicted branch costs more than the rest of a trial).
_GUIDE_BITS = 12
#: Words are generated and consumed a chunk at a time (256 KiB), so that they are still in the
#: core's cache when the kernel reads them; the words read, in order, do not depend on it.
_CHUNK_WORDS = 1 << 15


@dataclass(frozen=True)
class _Table:
    """The envelope of one ``(scale, margin, cover)``; see the module text."""

    scale: float
    k: int  # block width w = 2^k
    e: int  # |Y| = (A + U) 2^-e
    b: int  # bits of the within-block integer offset R (A = j 2^b + R)
    nblocks: int
    w: float
    big_c: float
    counts: tuple[int, ...]  # c_0 .. c_{J-1}, c_T
    cum: npt.NDArray[np.int64]  # inclusive cumulative counts, length J + 1
    guide: npt.NDArray[np.int32]
    beta: npt.NDArray[np.float64]  # w / (C c_j)
    lam32: npt.NDArray[np.float64]  # 2^32 x certain lower bound of the acceptance on block j
    mu32: npt.NDArray[np.float64]  # 2^32 x certain upper bound of the acceptance on block j
    # the same bounds for the 32-bit integer W: accept when wq < accept[j], reject when
    # wq >= reject[j] (floor(lam32), ceil(mu32); the tail, j = J, is never decided: 0 and 2^33);
    # then, from index J + 1, the bounds of the 2^_SUB_BITS sub-blocks of each block
    # (:func:`_sub_bounds`)
    accept: npt.NDArray[np.int64]
    reject: npt.NDArray[np.int64]
    inv2s2: float
    margin: float
    acceptance: float  # probability that a trial accepts

    @property
    def tail_start(self) -> float:
        """``L``, where the blocks end and the tail begins."""
        return self.nblocks * self.w


def _lower(x: Any) -> Fraction:
    """Exact lower end of an mpmath interval."""
    p, q = libmp.to_rational(x._mpi_[0])
    return Fraction(p, q)


def _upper(x: Any) -> Fraction:
    """Exact upper end of an mpmath interval."""
    p, q = libmp.to_rational(x._mpi_[1])
    return Fraction(p, q)


def _rational(ctx: Any, x: Fraction) -> Any:
    """The interval enclosing the rational ``x``."""
    return ctx.mpf(x.numerator) / x.denominator


def _check_scale(scale: float) -> float:
    s = float(scale)
    if not (math.isfinite(s) and MIN_SCALE <= s <= MAX_SCALE):
        raise ValueError(
            f"rounded-Gaussian scale must be a finite float in [2^-16, 2^46], got {scale!r}"
        )
    return s


@lru_cache(maxsize=64)
def _table(scale: float, margin: float = _MARGIN, cover: float = _COVER) -> _Table:
    """Build (and rigorously check) the step envelope of scale ``scale``."""
    s = _check_scale(scale)
    if not 0.5 <= cover <= 8.0 or not _MARGIN <= margin < 0.5:
        raise ValueError("cover must lie in [0.5, 8] and margin in [2^-40, 0.5)")
    k = math.frexp(s)[1] - 1 - 4  # 2^(k+4) <= s < 2^(k+5): w = 2^k in (s/32, s/16]
    e = max(1, -k)
    b = k + e
    w = math.ldexp(1.0, k)
    nblocks = math.ceil(cover * s / w)
    big_l = nblocks * w
    g = [_exp_neg_py((j * w) * (j * w) / (2 * s * s)) for j in range(nblocks)]
    tail_env = _exp_neg_py(big_l * big_l / (2 * s * s)) * s * s / big_l
    big_z = (sum(w * gj for gj in g) + tail_env) * (1 + 2.0**-20)
    big_c = big_z * 2.0**-32
    counts = [math.floor(w * gj / big_c) + 1 for gj in g]
    counts.append(math.floor(tail_env / big_c) + 1)
    # rigorous domination: C c_j >= w f(j w) and C c_T >= f(L) s^2 / L
    ctx = MPIntervalContext()
    ctx.prec = 120
    two_s2 = 2 * ctx.mpf(s) ** 2
    for j in range(nblocks + 1):
        if j < nblocks:
            need = ctx.mpf(w) * ctx.exp(-((j * ctx.mpf(w)) ** 2) / two_s2)
        else:
            need = ctx.exp(-(ctx.mpf(big_l) ** 2) / two_s2) * ctx.mpf(s) ** 2 / ctx.mpf(big_l)
        while _lower(ctx.mpf(big_c) * counts[j]) < _upper(need):
            counts[j] += 1
    total = sum(counts)
    if total > 1 << 32:  # cannot happen: each count is rounded up by at most 2 in 2^32 Z
        raise AssertionError("envelope counts overflow the 32-bit index")
    cum = np.cumsum(np.asarray(counts, dtype=np.int64))
    # guide[g]: the first block whose cumulative count exceeds the bucket's first index
    starts = np.arange(1 << _GUIDE_BITS, dtype=np.int64) << (32 - _GUIDE_BITS)
    guide = np.minimum(np.searchsorted(cum, starts, side="right"), nblocks).astype(np.int32)
    beta = np.array([w / (big_c * c) for c in counts[:nblocks]])
    inv2s2 = 1.0 / (2 * s * s)
    lam32 = np.array(
        [
            2.0**32 * beta[j] * _exp_neg_py(((j + 1) * w) * ((j + 1) * w) * inv2s2) * (1 - margin)
            for j in range(nblocks)
        ]
    )
    mu32 = np.array(
        [
            2.0**32 * beta[j] * _exp_neg_py((j * w) * (j * w) * inv2s2) * (1 + margin)
            for j in range(nblocks)
        ]
    )
    sub_accept, sub_reject = _sub_bounds(beta, w, inv2s2, margin)
    accept = np.concatenate([np.floor(lam32), [0], sub_accept]).astype(np.int64)
    reject = np.concatenate([np.ceil(mu32), [2.0**33], sub_reject]).astype(np.int64)
    return _Table(
        scale=s,
        k=k,
        e=e,
        b=b,
        nblocks=nblocks,
        w=w,
        big_c=big_c,
        counts=tuple(counts),
        cum=cum,
        guide=guide,
        beta=beta,
        lam32=lam32,
        mu32=mu32,
        accept=accept,
        reject=reject,
        inv2s2=inv2s2,
        margin=margin,
        acceptance=s * math.sqrt(math.pi / 2) / (big_c * 2.0**32),
    )


#: Sub-blocks per block of the second, finer integer bounds (consulted for the few per cent of
#: the trials the block's bounds leave open, before the exact exponential is computed).
_SUB_BITS = 4
#: Relative slack of the sub-block bounds: far above every float error between them and the
#: exponential path's own ``plo`` and ``phi`` (below ``2^-46``).
_SUB_SLACK = 2.0**-30


def _sub_bounds(
    beta: npt.NDArray[np.float64], w: float, inv2s2: float, margin: float
) -> tuple[list[float], list[float]]:
    """Integer bounds of ``W`` on each sub-block ``[l, r)`` of each block (``r - l = w/2^4``):
    ``wq < floor(2^32 plo(r'))`` implies the fast path's own ``(wq + 1) 2^-32 <= plo`` for every
    ``|Y|`` of the sub-block, and ``wq >= ceil(2^32 phi(l))`` its ``wq 2^-32 >= phi``; so they
    decide exactly the trials the exponential path would decide, the same way (the undecided
    trials, hence the side stream, do not change).

    Why: the kernel's ``ylo = fl(j w + fl(low) ulp)`` is at least ``l`` and its ``yhi`` at most
    ``r (1 + 2^-52 + 2^-59) < r' = r (1 + 2^-40)`` (``l``, ``r`` are dyadic with few bits, hence
    floats; rounding is monotone); ``_exp_neg_py`` is within ``2^-50`` of ``exp``, which is
    decreasing; the remaining roundings are below ``2^-50`` each; ``_SUB_SLACK`` (``2^-30``)
    covers them all many times over.
    """
    sub = 1 << _SUB_BITS
    lo_f, hi_f = (1.0 - margin) * (1.0 - _SUB_SLACK), (1.0 + margin) * (1.0 + _SUB_SLACK)
    acc: list[float] = []
    rej: list[float] = []
    for j, bj in enumerate(beta.tolist()):
        for t in range(sub):
            left = j * w + t * (w / sub)
            right = (j * w + (t + 1) * (w / sub)) * (1.0 + 2.0**-40)
            acc.append(math.floor(2.0**32 * bj * _exp_neg_py((right * right) * inv2s2) * lo_f))
            rej.append(math.ceil(2.0**32 * bj * _exp_neg_py((left * left) * inv2s2) * hi_f))
    return acc, rej


# --------------------------------------------------------------------------------------------
# fast path (compiled with numba on first use)


_LN2_HI = 0.693145751953125  # 2^-1 .. 2^-16 bits of ln 2: n * _LN2_HI is exact for n < 2^37
_LN2_LO = 1.4286068203094173e-06  # ln 2 - _LN2_HI, to double precision
_INV_LN2 = 1.4426950408889634
_INV_FACT = tuple(1.0 / math.factorial(i) for i in range(13))


def _exp_neg_py(x: float) -> float:
    """``exp(-x)`` for ``0 <= x <= 64`` from IEEE-754 ``+ - *`` only (bitwise reproducible).

    ``exp(-x) = 2^-n exp(-r)``, ``|r| <= ln(2)/2 + 2^-40``, by Cody–Waite reduction and the
    degree-12 Taylor polynomial (truncation below ``2^-52``); relative error below ``2^-50``.
    Unlike the platform's ``exp`` (whose last bit may depend on the CPU's code path) it gives
    the same bits everywhere, so the fast path's decisions do too.
    """
    n = math.floor(x * _INV_LN2 + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = _INV_FACT[12]
    for i in range(11, -1, -1):
        p = p * -r + _INV_FACT[i]
    return math.ldexp(p, -n)


_exp_neg: Callable[[float], float] = _exp_neg_py  # replaced by its compiled version in _kernel()


def _kernel_py(
    words: npt.NDArray[np.uint64],
    wpos: int,
    out: npt.NDArray[np.int64],
    opos: int,
    amb: npt.NDArray[np.int64],
    guide: npt.NDArray[np.int32],
    cum: npt.NDArray[np.int64],
    beta: npt.NDArray[np.float64],
    accept: npt.NDArray[np.int64],
    reject: npt.NDArray[np.int64],
    nblocks: int,
    b: int,
    e: int,
    w: float,
    inv2s2: float,
    margin: float,
) -> tuple[int, int, int]:
    """Fill ``out[opos:]`` from ``words[wpos:]``; undecided elements go to ``amb``.

    Returns ``(wpos, opos, namb)``; stops when ``out`` is full, fewer than two words are left or
    ``amb`` is full. A row of ``amb`` is ``(element, kind, block, low63, w32, negative)``, kind
    0 for an undecided block trial and 1 for the tail. The common trial (a block and an
    acceptance certain from the integer bounds ``accept``) takes no unpredictable branch: the
    guide rarely needs the search, and the sign is applied without a branch.
    """
    n = out.shape[0]
    nw = words.shape[0]
    cap = amb.shape[0]
    nu = np.int64(63 - b)
    ulp = math.ldexp(1.0, -(63 - b + e))
    half = np.int64(1) << np.int64(e - 1)
    eb = np.int64(e)
    bb = np.int64(b)
    total = cum[nblocks]
    shift_g = np.uint64(64 - _GUIDE_BITS)
    lo_f = 1.0 - margin
    hi_f = 1.0 + margin
    inv32 = 2.0**-32
    namb = 0
    while opos < n and wpos + 2 <= nw and namb < cap:
        w1 = words[wpos]
        w2 = words[wpos + 1]
        wpos += 2
        r = np.int64(w1 >> np.uint64(32))
        if r >= total:
            continue
        wq = np.int64(w1 & np.uint64(_MASK32))
        j = np.int64(guide[np.int64(w1 >> shift_g)])
        while cum[j] <= r:
            j += 1
        neg = np.int64(w2 >> np.uint64(63))
        low = np.int64(w2 & np.uint64(_MASK63))
        if wq >= accept[j]:  # not certainly accepted (always so for the tail)
            if wq >= reject[j]:
                continue
            undecided = j == nblocks
            if not undecided:  # the sub-block's bounds, then the exponential
                sb = nblocks + 1 + (j << np.int64(_SUB_BITS)) + (low >> np.int64(63 - _SUB_BITS))
                if wq >= reject[sb]:
                    continue
                if wq >= accept[sb]:
                    ylo = j * w + low * ulp
                    yhi = ylo + ulp
                    plo = _exp_neg((yhi * yhi) * inv2s2) * beta[j] * lo_f
                    if not (wq + 1) * inv32 <= plo:
                        phi = _exp_neg((ylo * ylo) * inv2s2) * beta[j] * hi_f
                        if wq * inv32 >= phi:
                            continue
                        undecided = True
            if undecided:
                out[opos] = 0
                amb[namb, 0] = opos
                amb[namb, 1] = 0 if j < nblocks else 1
                amb[namb, 2] = j
                amb[namb, 3] = low
                amb[namb, 4] = wq
                amb[namb, 5] = neg
                namb += 1
                opos += 1
                continue
        mag = (((j << bb) + (low >> nu)) + half) >> eb
        out[opos] = (mag ^ -neg) + neg  # -mag when neg (two's complement), without a branch
        opos += 1
    return wpos, opos, namb


_compiled: list[Callable[..., tuple[int, int, int]]] = []

#: The first this many elements a process draws are drawn by :func:`_kernel_py` itself,
#: uncompiled (slowly): the same bits (IEEE ``+ - *`` and integer operations only, in the
#: order written), and a small release spends neither numba's import nor the loading of its
#: compiled code. Past it, the compiled kernel draws everything.
UNCOMPILED_ELEMENTS = 16_384
_uncompiled_left = [UNCOMPILED_ELEMENTS]


_compile_lock = threading.Lock()


def _kernel() -> Callable[..., tuple[int, int, int]]:
    """The numba-compiled kernel (numba is imported on first use only; one thread makes it)."""
    global _exp_neg
    if not _compiled:
        with _compile_lock:
            if not _compiled:
                import numba

                _exp_neg = numba.njit(cache=True, nogil=True)(_exp_neg_py)
                _compiled.append(numba.njit(cache=True, nogil=True)(_kernel_py))
    return _compiled[0]


def load_kernel(key: TileKey) -> None:
    """Import numba and load the compiled kernel now (from numba's on-disk cache, or compile
    it), by drawing one element with it: a worker can do this while a release is prepared
    (:mod:`mvg_dask.engine.warmup`) instead of at its first large tile."""
    _kernel()
    _draw(key, 0, (1,), 1.0)


# --------------------------------------------------------------------------------------------
# exact path


class _SideBits:
    """64-bit words of the tile's side stream, read in order."""

    def __init__(self, key: TileKey, tile: int) -> None:
        bitgen: Any = key.generator(tile).bit_generator  # randomgen.AESCounter
        bitgen.advance(_SIDE_WORDS)
        self._bitgen = bitgen
        self.used = 0

    def word(self) -> int:
        self.used += 1
        return int(self._bitgen.random_raw())


class _Exact:
    """Exact decisions by interval arithmetic, reading more bits from the side stream."""

    def __init__(self, tab: _Table, src: _SideBits) -> None:
        self.tab = tab
        self.src = src
        self.ctx = MPIntervalContext()
        self.trials = 0

    def block(self, j: int, low: int, wq: int) -> bool:
        """Decide ``W < f(|Y|) w / (C c_j)`` for ``|Y| in [(j 2^63 + low) 2^-(63-b+e), +ulp)``."""
        tab, ctx = self.tab, self.ctx
        num, nexp = (j << 63) + low, 63 - tab.b + tab.e
        wnum, wexp = wq, 32
        factor = Fraction(tab.w) / (Fraction(tab.big_c) * tab.counts[j])  # beta_j, exactly
        while True:
            ctx.prec = nexp + 96
            y = ctx.ldexp(ctx.mpf([num, num + 1]), -nexp)
            p = ctx.exp(-(y * y) / (2 * ctx.mpf(tab.scale) ** 2)) * _rational(ctx, factor)
            if Fraction(wnum + 1, 1 << wexp) <= _lower(p):
                return True
            if Fraction(wnum, 1 << wexp) >= _upper(p):
                return False
            num, nexp = (num << 64) | self.src.word(), nexp + 64
            wnum, wexp = (wnum << 64) | self.src.word(), wexp + 64

    def tail(self, wq: int) -> int | None:
        """A tail trial: ``round(|Y|)`` if it accepts, else None."""
        tab, ctx = self.tab, self.ctx
        s, big_l = Fraction(tab.scale), Fraction(tab.tail_start)
        slope = s * s / big_l  # |Y| = L + slope E
        # acceptance W < tau exp(-(|Y| - L)^2 / 2 s^2), tau = f(L) s^2 / (L C c_T) <= 1
        tau_factor = slope / (Fraction(tab.big_c) * tab.counts[-1])
        v, vexp = self.src.word(), 64  # V = 1 - (v + theta) 2^-vexp, theta uniform in [0, 1)
        wnum, wexp = wq, 32
        accepted = False
        while True:
            ctx.prec = max(vexp, wexp) + 96
            vlo, vhi = (1 << vexp) - v - 1, (1 << vexp) - v
            if vlo > 0:
                two_s2 = 2 * ctx.mpf(tab.scale) ** 2
                ell = ctx.mpf(tab.tail_start)
                ev = -ctx.log(ctx.ldexp(ctx.mpf([vlo, vhi]), -vexp))
                y = ell + _rational(ctx, slope) * ev
                if not accepted:
                    tau = ctx.exp(-(ell * ell) / two_s2) * _rational(ctx, tau_factor)
                    p = tau * ctx.exp(-((y - ell) ** 2) / two_s2)
                    if Fraction(wnum + 1, 1 << wexp) <= _lower(p):
                        accepted = True
                    elif Fraction(wnum, 1 << wexp) >= _upper(p):
                        return None
                if accepted:
                    lo = math.floor(_lower(y) + Fraction(1, 2))
                    if lo == math.floor(_upper(y) + Fraction(1, 2)):
                        return lo
            v, vexp = (v << 64) | self.src.word(), vexp + 64
            if not accepted:
                wnum, wexp = (wnum << 64) | self.src.word(), wexp + 64

    def fresh(self) -> int:
        """A whole trial on the exact path, repeated until one accepts."""
        tab = self.tab
        while True:
            self.trials += 1
            w1, w2 = self.src.word(), self.src.word()
            r, wq = w1 >> 32, w1 & _MASK32
            if r >= int(tab.cum[-1]):
                continue
            j = bisect_right(tab.cum.tolist(), r)
            mag = self.resolve(1 if j == tab.nblocks else 0, j, w2 & _MASK63, wq, w2 >> 63)
            if mag is not None:
                return mag

    def resolve(self, kind: int, j: int, low: int, wq: int, neg: int) -> int | None:
        """The signed value of an undecided trial, or None when it rejects."""
        tab = self.tab
        if kind == 1:
            mag = self.tail(wq)
            if mag is None:
                return None
        else:
            if not self.block(j, low, wq):
                return None
            mag = ((j << tab.b) + (low >> (63 - tab.b)) + (1 << (tab.e - 1))) >> tab.e
        return -mag if neg else mag


# --------------------------------------------------------------------------------------------
# driver


@dataclass(frozen=True)
class _Stats:
    """How a tile was drawn (for tests and benchmarks)."""

    words: int  # main-stream words read
    undecided: int  # elements handed to the exact path
    tail: int  # of which tail trials
    side_words: int  # side-stream words read
    exact_trials: int  # fresh trials run on the exact path


def _main_stream(key: TileKey, tile: int, *, compiled: bool) -> Callable[[int], np.ndarray]:
    """``raw(count)``: the next ``count`` words of the tile's main stream, read in order.

    With the compiled kernel on a CPU with AES-NI, from :func:`mvg_dask.noise.aes.tile_words`
    (the generator's words, encrypted eight blocks at a time); else from the key's kept
    generator (:meth:`NoiseKey.tile_bits`: no generator built per tile) or a new one. The words
    are the same: the batches are even (whole AES blocks) and read one after the other.
    """
    round_keys = getattr(key, "round_keys", None)
    rk = round_keys() if compiled and round_keys is not None else None
    if rk is not None:
        from mvg_dask.noise import aes

        if aes.available() and aes.agrees(rk, key.generator):
            read = [0]

            def words(count: int) -> np.ndarray:
                out = aes.tile_words(rk, tile, read[0], count)
                read[0] += count
                return out

            return words
    tile_bits = getattr(key, "tile_bits", None)
    bitgen = tile_bits(tile) if tile_bits is not None else key.generator(tile).bit_generator
    raw: Callable[[int], np.ndarray] = bitgen.random_raw
    return raw


def _draw(
    key: TileKey,
    tile: int,
    shape: tuple[int, ...],
    scale: float,
    *,
    margin: float = _MARGIN,
    cover: float = _COVER,
) -> tuple[npt.NDArray[np.int64], _Stats]:
    """:func:`tile_rounded_gaussian` with its statistics and the test-only knobs."""
    tab = _table(_check_scale(scale), margin, cover)
    n = math.prod(shape)
    if n < 0 or any(d < 0 for d in shape):
        raise ValueError(f"invalid shape {shape!r}")
    out = np.empty(n, dtype=np.int64)
    if not _compiled and n <= _uncompiled_left[0]:
        _uncompiled_left[0] -= n  # threads may race here: the count is a bound on time only
        kernel = _kernel_py
    else:
        kernel = _kernel()
    raw = _main_stream(key, tile, compiled=kernel is not _kernel_py)
    per = 2.0 / tab.acceptance

    def batch(m: int) -> int:  # words for m more elements (rarely too few), at most a chunk
        return min(2 * math.ceil(per / 2 * m + 4 * math.sqrt(m) + 16), _CHUNK_WORDS)

    words = raw(batch(n))
    consumed = 0
    amb = np.empty((64, 6), dtype=np.int64)
    pending: list[npt.NDArray[np.int64]] = []
    wpos = opos = 0
    while opos < n:
        wpos, opos, namb = kernel(
            words,
            wpos,
            out,
            opos,
            amb,
            tab.guide,
            tab.cum,
            tab.beta,
            tab.accept,
            tab.reject,
            tab.nblocks,
            tab.b,
            tab.e,
            tab.w,
            tab.inv2s2,
            tab.margin,
        )
        if namb:
            pending.append(amb[:namb].copy())
        if opos < n and words.size - wpos < 2:
            consumed += wpos
            words = np.concatenate([words[wpos:], raw(batch(n - opos))])
            wpos = 0
    consumed += wpos
    used = 0
    trials = 0
    undecided = sum(len(p) for p in pending)
    tail = sum(int((p[:, 1] == 1).sum()) for p in pending)
    if pending:
        src = _SideBits(key, tile)
        exact = _Exact(tab, src)
        for rows in pending:
            for idx, kind, j, low, wq, neg in rows.tolist():
                value = exact.resolve(kind, j, low, wq, neg)
                if value is None:
                    value = exact.fresh()
                out[idx] = value
        used, trials = src.used, exact.trials
    return out.reshape(shape), _Stats(
        words=consumed, undecided=undecided, tail=tail, side_words=used, exact_trials=trials
    )


def tile_rounded_gaussian(
    key: TileKey, tile: int, shape: tuple[int, ...], scale: float
) -> npt.NDArray[np.int64]:
    """Rounded-Gaussian integers of tile ``tile``, drawn whole and in C order.

    Parameters
    ----------
    key : NoiseKey
        The noise key.
    tile : int
        Tile index, ``0 <= tile < 2**64`` (the same tile grid as :meth:`NoiseKey.tile_normals`).
    shape : tuple of int
        Shape of the tile.
    scale : float
        ``s``, in ``[2^-16, 2^46]``.

    Returns
    -------
    numpy.ndarray
        int64 array of ``shape``, iid with the exact law of ``floor(s N + 1/2)``,
        ``N ~ N(0, 1)``: ``P(K = k) = Phi((k + 1/2)/s) - Phi((k - 1/2)/s)``. It depends only on
        ``(key, tile, shape, scale)``, and a tile is a prefix of any longer tile.

    Raises
    ------
    ValueError
        If ``scale`` is outside the supported range or the tile index is out of range.
    """
    return _draw(key, tile, tuple(int(d) for d in shape), scale)[0]
