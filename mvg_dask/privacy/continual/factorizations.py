"""Factorizations ``A = B C`` of the prefix-sum matrix of a stream (continual releases).

``A`` is the ``T x T`` lower-triangular all-ones matrix: ``(A g)_t = g_1 + ... + g_t``. A stream
releases ``y = C g + Z`` (the *encoder* ``C``, one Gaussian mechanism for the whole horizon) and
publishes ``x̂ = B y`` (the *decoder*, post-processing). A record of period ``s`` moves ``g_s``
only, so ``y`` moves by ``C[:, s] Δ``: the stream's sensitivity is ``max_s ‖C[:, s]‖₂ · Δ``
(docs/bounds.md, "Continual releases").

Each encoder is held as *integers*: ``C = C_int / 2**bits`` with ``C_int`` an integer matrix,
so that ``2**bits · C g̃`` of integer lattice increments ``g̃`` is an exact integer
(:mod:`mvg_dask.privacy.continual.exact`). The sensitivity is computed from ``C_int`` exactly and
rounded up. Decoders are floats (post-processing).

The outputs ``y`` are ordered by release: period ``t`` releases ``outputs_at(t)`` rows of ``C``
(one for the Toeplitz factorizations, the nodes completing at ``t`` for the tree), each using
only ``g_1 .. g_t``; a decoder row ``B[t - 1]`` uses only outputs released up to ``t``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Literal

import numpy as np

#: The largest horizon: the decoders hold ``O(T)`` coefficients and are built in ``O(T²)``.
MAX_HORIZON = 10_000
#: Default dyadic precision of the square-root coefficients: ``c̃_k = round(c_k 2**12) / 2**12``.
DEFAULT_BITS = 12
#: The largest dyadic precision offered (integer coefficients stay below ``2**40``).
MAX_BITS = 40

TreeDecoder = Literal["honaker", "dyadic"]
TREE_DECODERS: tuple[str, ...] = ("honaker", "dyadic")


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def sqrt_up(numerator: int, bits: int) -> float:
    """A float ``>= sqrt(numerator) / 2**bits`` within a few ulps (``numerator >= 0`` an int).

    Parameters
    ----------
    numerator : int
        The exact integer under the root (a squared integer column norm).
    bits : int
        The dyadic scale of the integers.

    Returns
    -------
    float
        The root, rounded up.
    """
    extra = 64
    scaled = numerator << (2 * extra)
    root = math.isqrt(scaled)
    if root * root < scaled:
        root += 1
    exact = Fraction(root, 1 << (bits + extra))
    value = float(exact)
    return value if Fraction(value) >= exact else math.nextafter(value, math.inf)


@dataclass(frozen=True)
class Factorization:
    """Common interface of a factorization ``A = B C`` of the ``T x T`` prefix-sum matrix.

    Attributes
    ----------
    horizon : int
        ``T``, the number of periods.
    """

    horizon: int
    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "horizon", _check_int("horizon", self.horizon, 1, MAX_HORIZON))

    # -- to be provided -------------------------------------------------------------------------
    def outputs_at(self, t: int) -> int:
        """Number of outputs (rows of ``C``) released at period ``t`` (1-based)."""
        raise NotImplementedError

    def encoder_rows(self, t: int) -> np.ndarray:
        """Integer rows of ``C_int`` released at period ``t``, shape ``(outputs_at(t), t)``.

        Column ``s - 1`` multiplies the increment ``g_s``; ``C = C_int / 2**scale_bits``.
        """
        raise NotImplementedError

    def decoder_row(self, t: int) -> np.ndarray:
        """Row ``t`` of ``B`` over the outputs released up to ``t``, shape ``(n_outputs(t),)``."""
        raise NotImplementedError

    def sensitivity_squared_int(self) -> int:
        """``max_s ‖C_int[:, s]‖²``, an exact integer."""
        raise NotImplementedError

    def state_matrices(self) -> int:
        """Most increments-sized arrays the curator keeps between two periods."""
        raise NotImplementedError

    def max_row_sum_int(self) -> int:
        """``max_r Σ_s |C_int[r, s]|``: an output's integer sum is at most this times the
        increments' largest entry (the overflow bound of the exact combination)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description; :meth:`from_dict` inverts it."""
        raise NotImplementedError

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Factorization:
        """The factorization :meth:`to_dict` described (:func:`factorization_from_dict`)."""
        return factorization_from_dict(data)

    def output_keys(self, t: int) -> tuple[str, ...]:
        """Stable names of period ``t``'s outputs, one per row of ``encoder_rows(t)``.

        A period's noise is keyed by ``(stream key, period, output key)``, so a retried period
        re-derives the same noise.
        """
        return tuple(f"y{i}" for i in range(self.outputs_at(t)))

    # -- derived --------------------------------------------------------------------------------
    @property
    def scale_bits(self) -> int:
        """``b`` with ``C = C_int / 2**b`` (0: an integer encoder)."""
        return 0

    def _period(self, t: int) -> int:
        return _check_int("period", t, 1, self.horizon)

    def n_outputs(self, t: int | None = None) -> int:
        """Number of outputs released up to period ``t`` (default: the whole horizon)."""
        t = self.horizon if t is None else self._period(t)
        return sum(self.outputs_at(u) for u in range(1, t + 1))

    def sensitivity(self) -> float:
        """``max_s ‖C[:, s]‖₂`` (rounded up): the stream's L2 sensitivity per unit ``Δ``."""
        return sqrt_up(self.sensitivity_squared_int(), self.scale_bits)

    def period_std_factor(self, t: int) -> float:
        """``‖B[t, :]‖₂``: period ``t``'s published noise std per unit output noise std."""
        return float(np.linalg.norm(self.decoder_row(self._period(t))))

    def period_std_factors(self) -> np.ndarray:
        """``‖B[t, :]‖₂`` for ``t = 1 .. T``."""
        return np.array([self.period_std_factor(t) for t in range(1, self.horizon + 1)])

    def worst_std_factor(self) -> float:
        """``max_t ‖B[t, :]‖₂``."""
        return float(np.max(self.period_std_factors()))

    def ratio_to_one_shot(self) -> float:
        """Worst-period std over a one-shot release's std at the same budget.

        Both are Gaussian mechanisms calibrated with the same ``μ``; the stream's noise is
        ``sensitivity()`` times the one-shot's per output, and ``worst_std_factor()`` per period.
        """
        return self.sensitivity() * self.worst_std_factor()

    def state_elements(self, m: int) -> int:
        """Curator-side state between periods, in entries, for ``m x m`` increments."""
        return self.state_matrices() * m * m

    def state_bytes(self, m: int, itemsize: int = 8) -> int:
        """Curator-side state between periods for ``m x m`` increments of ``itemsize`` bytes."""
        return self.state_elements(m) * itemsize

    @property
    def C(self) -> np.ndarray:
        """The encoder ``C`` as floats, shape ``(n_outputs(), T)``, rows in release order.

        Dense (``O(T²)`` memory): for checks and small horizons; the stream itself uses
        :meth:`encoder_rows` and the closed-form norms.
        """
        return _dense_c(self)

    @property
    def B(self) -> np.ndarray:
        """The decoder ``B``, shape ``(T, n_outputs())``; causal: row ``t`` ends at output
        ``n_outputs(t)``. Dense (``O(T²)`` memory), like :attr:`C`."""
        return _dense_b(self)


def _dense_c(f: Factorization) -> np.ndarray:
    out = np.zeros((f.n_outputs(), f.horizon))
    row = 0
    for t in range(1, f.horizon + 1):
        rows = f.encoder_rows(t)
        out[row : row + rows.shape[0], :t] = rows
        row += rows.shape[0]
    return np.ldexp(out, -f.scale_bits)


def _dense_b(f: Factorization) -> np.ndarray:
    out = np.zeros((f.horizon, f.n_outputs()))
    for t in range(1, f.horizon + 1):
        row = f.decoder_row(t)
        out[t - 1, : row.size] = row
    return out


# -- the binary tree ----------------------------------------------------------------------------
def _v2(t: int) -> int:
    return (t & -t).bit_length() - 1


@functools.lru_cache(maxsize=16)
def _honaker_variances(levels: int) -> tuple[float, ...]:
    """``v_h``: variance (unit node noise) of the best estimate of a height-``h`` node's sum
    from its own perfect subtree: ``v_0 = 1``, ``v_h = 1 / (1 + 1 / (2 v_{h-1}))``."""
    v = [1.0]
    for _ in range(1, levels):
        v.append(1.0 / (1.0 + 1.0 / (2.0 * v[-1])))
    return tuple(v)


@dataclass(frozen=True)
class TreeFactorization(Factorization):
    """The binary tree: one output per dyadic interval ``[k 2^j + 1, (k + 1) 2^j] ⊆ [1, T]``.

    Period ``t`` releases the nodes that complete at ``t`` (levels ``0 .. v₂(t)``, ascending).
    ``decoder="dyadic"`` sums the dyadic decomposition of ``[1, t]`` (``popcount(t)`` nodes);
    ``decoder="honaker"`` is the best linear unbiased estimator of ``x_t`` from the nodes
    released up to ``t`` (Honaker 2015, restricted to causality): the roots of ``[1, t]``'s
    decomposition are whole released subtrees, so it sums each root's bottom-up estimate.
    """

    decoder: TreeDecoder = "honaker"
    name: ClassVar[str] = "tree"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decoder not in TREE_DECODERS:
            raise ValueError(
                f"tree decoder must be one of {', '.join(TREE_DECODERS)}, got {self.decoder!r}"
            )

    @property
    def levels(self) -> int:
        """Number of levels ``floor(log2 T) + 1`` (a level-``j`` node spans ``2**j`` periods)."""
        return self.horizon.bit_length()

    def outputs_at(self, t: int) -> int:
        return _v2(self._period(t)) + 1

    def output_keys(self, t: int) -> tuple[str, ...]:
        return tuple(f"node-{j}" for j in range(self.outputs_at(t)))

    def n_outputs(self, t: int | None = None) -> int:
        t = self.horizon if t is None else self._period(t)
        return int(self._offsets[t])

    def output_index(self, level: int, end: int) -> int:
        """Index in ``y`` of the node of ``level`` that ends at period ``end``."""
        return int(self._offsets[end - 1]) + level

    def encoder_rows(self, t: int) -> np.ndarray:
        t = self._period(t)
        rows = np.zeros((_v2(t) + 1, t), dtype=np.int64)
        for j in range(rows.shape[0]):
            rows[j, t - (1 << j) : t] = 1
        return rows

    @functools.cached_property
    def _offsets(self) -> np.ndarray:
        """``_offsets[t]``: number of nodes released before period ``t + 1``."""
        counts = [_v2(e) + 1 for e in range(1, self.horizon + 1)]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def decoder_row(self, t: int) -> np.ndarray:
        t = self._period(t)
        offsets = self._offsets
        row = np.zeros(int(offsets[t]))
        v = _honaker_variances(self.levels)
        start = 0
        for h in reversed(range(self.levels)):
            if not t >> h & 1:
                continue
            end = start + (1 << h)
            if self.decoder == "dyadic":
                row[offsets[end - 1] + h] = 1.0
            else:
                for lvl in range(h + 1):
                    # weight of a level-lvl node in the root's bottom-up estimate
                    w = v[lvl] * math.prod(1.0 - v[i] for i in range(lvl + 1, h + 1))
                    ends = start + (np.arange(1, (1 << (h - lvl)) + 1) << lvl)
                    row[offsets[ends - 1] + lvl] = w
            start = end
        return row

    def period_std_factor(self, t: int) -> float:
        t = self._period(t)
        v = _honaker_variances(self.levels)
        roots = [h for h in range(self.levels) if t >> h & 1]
        if self.decoder == "dyadic":
            return math.sqrt(len(roots))
        return math.sqrt(math.fsum(v[h] for h in roots))

    def sensitivity_squared_int(self) -> int:
        # period 1 lies in the first node of every level, and every level has a node within T
        return self.levels

    def state_matrices(self) -> int:
        # one open (partial) node per level >= 1 whose node can still complete within T
        return self.levels - 1

    def max_row_sum_int(self) -> int:
        return 1 << (self.levels - 1)

    def to_dict(self) -> dict[str, Any]:
        return {"factorization": self.name, "horizon": self.horizon, "decoder": self.decoder}


# -- Toeplitz factorizations: the square root and its banded truncation ---------------------------
@functools.lru_cache(maxsize=32)
def sqrt_coefficients(horizon: int, bits: int) -> tuple[int, ...]:
    """Integers ``round(c_k 2**bits)``, ``c_k = binom(2k, k) / 4**k``, ``k < horizon``.

    Computed exactly in integers (ties rounded up), so every platform gets the same coefficients.

    Parameters
    ----------
    horizon : int
        Number of coefficients.
    bits : int
        Dyadic precision ``b``.

    Returns
    -------
    tuple of int
        ``n_k``, with ``c̃_k = n_k / 2**bits``.
    """
    out = []
    binom = 1  # binom(2k, k)
    for k in range(horizon):
        if k:
            binom = binom * (2 * k) * (2 * k - 1) // (k * k)
        den = 1 << (2 * k)
        out.append((2 * (binom << bits) + den) // (2 * den))
    return tuple(out)


def toeplitz_decoder(coefficients: np.ndarray) -> np.ndarray:
    """Coefficients ``e`` of ``B = A C⁻¹`` for lower-triangular Toeplitz ``C`` with ``c_0 = 1``.

    ``B C = A`` is ``Σ_{j ≤ k} c_j e_{k-j} = 1`` for every ``k``: ``e_0 = 1`` and
    ``e_k = 1 - Σ_{j=1}^{k} c_j e_{k-j}`` (forward substitution of a triangular Toeplitz system).

    Parameters
    ----------
    coefficients : numpy.ndarray
        ``c_0 .. c_{T-1}`` as floats, ``c_0 = 1``.

    Returns
    -------
    numpy.ndarray
        ``e_0 .. e_{T-1}``; ``B[t, s] = e_{t-s}``.
    """
    c = np.asarray(coefficients, dtype=np.float64)
    if c.size == 0 or c[0] != 1.0:
        raise ValueError("a Toeplitz encoder needs c_0 = 1")
    e = np.empty_like(c)
    e[0] = 1.0
    for k in range(1, c.size):
        e[k] = 1.0 - float(np.dot(c[1 : k + 1], e[k - 1 :: -1]))
    return e


@dataclass(frozen=True)
class ToeplitzFactorization(Factorization):
    """The square-root factorization ``C ≈ A^{1/2}`` with dyadic coefficients, optionally banded.

    ``C̃`` is lower-triangular Toeplitz with ``c̃_k = round(c_k 2**bits) / 2**bits``,
    ``c_k = binom(2k, k) / 4**k`` (``c_0 = 1``), kept for ``k < band`` and zero beyond
    (``band = horizon`` is the full square root). ``B̃ = A C̃⁻¹`` (float, post-processing).
    Henzinger, Upadhyay & Upadhyay (SODA 2023); Fichtenberger, Henzinger & Upadhyay (ICML 2023);
    banded: McKenna et al. (2024).
    """

    bits: int = DEFAULT_BITS
    band: int | None = None
    name: ClassVar[str] = "square-root"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "bits", _check_int("bits", self.bits, 1, MAX_BITS))
        if self.band is not None:
            object.__setattr__(self, "band", _check_int("band", self.band, 1, MAX_HORIZON))

    @property
    def kind(self) -> str:
        """``"square-root"`` or ``"banded"``."""
        return "square-root" if self.band is None else "banded"

    @property
    def scale_bits(self) -> int:
        return self.bits

    @property
    def width(self) -> int:
        """Number of nonzero coefficients ``min(band, T)``."""
        return self.horizon if self.band is None else min(self.band, self.horizon)

    @property
    def coefficients(self) -> tuple[int, ...]:
        """``n_k = c̃_k 2**bits`` for ``k < width`` (the encoder's integers)."""
        return sqrt_coefficients(self.width, self.bits)

    @functools.cached_property
    def _std_factors(self) -> np.ndarray:
        return np.sqrt(np.cumsum(self.decoder_coefficients**2))

    @functools.cached_property
    def decoder_coefficients(self) -> np.ndarray:
        """``e_k`` with ``B̃[t, s] = e_{t-s}``, ``k < T``."""
        c = np.zeros(self.horizon)
        c[: self.width] = np.ldexp(np.array(self.coefficients, dtype=np.float64), -self.bits)
        return toeplitz_decoder(c)

    def outputs_at(self, t: int) -> int:
        self._period(t)
        return 1

    def n_outputs(self, t: int | None = None) -> int:
        return self.horizon if t is None else self._period(t)

    def encoder_rows(self, t: int) -> np.ndarray:
        t = self._period(t)
        row = np.zeros((1, t), dtype=np.int64)
        k = min(t, self.width)
        row[0, t - k :] = self.coefficients[:k][::-1]
        return row

    def decoder_row(self, t: int) -> np.ndarray:
        t = self._period(t)
        return np.asarray(self.decoder_coefficients[:t][::-1].copy())

    def period_std_factors(self) -> np.ndarray:
        return self._std_factors.copy()

    def period_std_factor(self, t: int) -> float:
        return float(self._std_factors[self._period(t) - 1])

    def sensitivity_squared_int(self) -> int:
        # column 1 holds every coefficient; later columns hold a prefix of them
        return sum(n * n for n in self.coefficients)

    def state_matrices(self) -> int:
        return self.width - 1

    def max_row_sum_int(self) -> int:
        return sum(self.coefficients)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"factorization": self.kind, "horizon": self.horizon}
        out["bits"] = self.bits
        if self.band is not None:
            out["band"] = self.band
        return out


@dataclass(frozen=True)
class NaiveFactorization(Factorization):
    """Naive re-release: ``C = A``, ``B = I`` (each period publishes its own noisy prefix sum).

    The comparison's baseline: under exact Gaussian composition the ``T`` re-releases are one
    Gaussian mechanism with sensitivity ``‖A[:, 1]‖ = √T``.
    """

    name: ClassVar[str] = "naive"

    def outputs_at(self, t: int) -> int:
        self._period(t)
        return 1

    def n_outputs(self, t: int | None = None) -> int:
        return self.horizon if t is None else self._period(t)

    def encoder_rows(self, t: int) -> np.ndarray:
        return np.ones((1, self._period(t)), dtype=np.int64)

    def decoder_row(self, t: int) -> np.ndarray:
        row = np.zeros(self._period(t))
        row[-1] = 1.0
        return row

    def period_std_factors(self) -> np.ndarray:
        return np.ones(self.horizon)

    def sensitivity_squared_int(self) -> int:
        return self.horizon

    def state_matrices(self) -> int:
        return 1  # the running total

    def max_row_sum_int(self) -> int:
        return self.horizon

    def to_dict(self) -> dict[str, Any]:
        return {"factorization": self.name, "horizon": self.horizon}


FACTORIZATIONS: tuple[str, ...] = ("square-root", "banded", "tree", "naive")


def make_factorization(name: str, horizon: int, **options: Any) -> Factorization:
    """The factorization called ``name`` (one of :data:`FACTORIZATIONS`).

    Parameters
    ----------
    name : str
        ``"square-root"``, ``"banded"`` (needs ``band``), ``"tree"`` or ``"naive"``.
    horizon : int
        ``T``.
    **options
        ``bits`` and ``band`` (Toeplitz), ``decoder`` (tree).

    Returns
    -------
    Factorization
        The frozen factorization.
    """
    allowed = {"square-root": {"bits"}, "banded": {"bits", "band"}, "tree": {"decoder"}}
    if name not in FACTORIZATIONS:
        raise ValueError(f"factorization must be one of {', '.join(FACTORIZATIONS)}, got {name!r}")
    extra = set(options) - allowed.get(name, set())
    if extra:
        raise ValueError(f"factorization {name!r} takes no option {', '.join(sorted(extra))}")
    if name == "tree":
        return TreeFactorization(horizon, **options)
    if name == "naive":
        return NaiveFactorization(horizon)
    if name == "banded" and "band" not in options:
        raise ValueError("factorization 'banded' needs a band (the number of coefficients kept)")
    return ToeplitzFactorization(horizon, **options)


def factorization_from_dict(data: dict[str, Any]) -> Factorization:
    """Inverse of :meth:`Factorization.to_dict`.

    Parameters
    ----------
    data : dict
        ``{"factorization": name, "horizon": T, ...options}``.

    Returns
    -------
    Factorization
        The factorization.
    """
    options = dict(data)
    name = options.pop("factorization", None)
    if "horizon" not in options:
        raise ValueError("a factorization needs a horizon")
    horizon = options.pop("horizon")
    return make_factorization(str(name), horizon, **options)
