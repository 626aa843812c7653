"""The public record domain: declared by the data owner, never computed from the data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mvg_dask.privacy import sensitivity as sens

Neighbours = Literal["replace-one", "add-remove"]
NEIGHBOURS: tuple[Neighbours, ...] = ("replace-one", "add-remove")

#: The range of the numbers that set a declared domain's scale: each width ``upper_i -
#: lower_i`` of a box (whose bounds are also 0 or normal floats, at most :data:`MAX_SCALE` in
#: absolute value), an L2 ball's radius (docs/guide/specs.md, "The record domain"). It is the
#: range of the constant coordinate ``s = 2^k``
#: (:data:`mvg_dask.privacy.sensitivity.SCALE_EXPONENTS`). A plan's quantities (``R = sup
#: ||x||^2``, sensitivities, noise variances and the calibrations' products of them) grow like
#: powers of the domain's scale up to about the 8th (planning leaves float64 near a scale of
#: ``2^+-128``), so this range keeps them within about ``2^+-512``: normal numbers, with as much
#: again to spare for the record count, the features and the budget.
MIN_SCALE = 2.0**-64
#: See :data:`MIN_SCALE`.
MAX_SCALE = 2.0**64
_RANGE_TEXT = "[2^-64, 2^64] (about 5.4e-20 to 1.8e19)"
_SMALLEST_NORMAL = float(np.finfo(np.float64).smallest_normal)
_RANGE_REMEDY = "rescale the data (docs/guide/specs.md, record domain)"


class DomainRangeError(ValueError):
    """A declared record domain the plan cannot compute with (degenerate, non-finite, with a
    subnormal bound or out of :data:`MIN_SCALE` .. :data:`MAX_SCALE`).

    Attributes
    ----------
    field : str
        The domain field at fault (``lower``, ``upper`` or ``l2_norm``); the message starts
        with it, so that a caller prefixing the domain's path names it: ``domain.box.upper:``.
    """

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


def _as_vector(name: str, value: float | list[float] | np.ndarray, m: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(m, float(arr))
    if arr.shape != (m,):
        raise ValueError(f"domain {name} has {arr.size} values but the data has {m} features")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        i = int(bad[0])
        raise DomainRangeError(
            name, f"domain {name} must be finite; feature {i} has {name}={float(arr[i])!r}"
        )
    return arr


def _check_scale(lo: np.ndarray, hi: np.ndarray) -> None:
    """Refuse a box whose bounds exceed :data:`MAX_SCALE` in absolute value or are subnormal,
    or whose widths leave :data:`MIN_SCALE` .. :data:`MAX_SCALE` (``lower < upper`` holds)."""
    for name, arr in (("lower", lo), ("upper", hi)):
        size = np.abs(arr)
        for bad, what in (
            (size > MAX_SCALE, f"exceeds 2^64 (about 1.8e19) in absolute value: {_RANGE_REMEDY}"),
            ((size != 0) & (size < _SMALLEST_NORMAL), "is a subnormal float: write 0"),
        ):
            i = int(np.argmax(bad))
            if bad[i]:
                raise DomainRangeError(
                    name, f"feature {i} has {name}={float(arr[i])!r}, which {what}"
                )
    width = hi - lo  # finite: both bounds are at most 2^64 in absolute value
    bad = np.flatnonzero((width < MIN_SCALE) | (width > MAX_SCALE))
    if bad.size:
        i = int(bad[0])
        raise DomainRangeError(
            "upper",
            f"feature {i} has width upper - lower = {width[i]:g} (lower={float(lo[i])!r}, "
            f"upper={float(hi[i])!r}); a box's widths lie in {_RANGE_TEXT}: {_RANGE_REMEDY}",
        )


@dataclass(frozen=True, eq=False)
class BoxDomain:
    """Every record lies in the box ``lower <= x <= upper`` (per feature).

    Parameters
    ----------
    lower, upper : ndarray
        Per-feature bounds, ``lower < upper``.
    """

    lower: np.ndarray
    upper: np.ndarray
    kind: Literal["box"] = field(default="box", init=False)

    @classmethod
    def create(
        cls,
        lower: float | list[float] | np.ndarray,
        upper: float | list[float] | np.ndarray,
        m: int,
        *,
        allow_equal: bool = False,
    ) -> BoxDomain:
        """Build a box from scalars (broadcast) or per-feature lists, validating it.

        Parameters
        ----------
        lower, upper : float or array_like
            Bounds; scalars apply to every feature.
        m : int
            Number of features.
        allow_equal : bool, default False
            Accept ``lower_i == upper_i`` (a constant coordinate, such as the ``s`` of the
            augmented record ``[x - c; s]``; every bound holds on it, docs/bounds.md Sec. 13). A
            declared domain keeps ``lower < upper`` (and the range of :meth:`declared`).

        Returns
        -------
        BoxDomain
            The validated box.

        Raises
        ------
        ValueError
            A ``DomainRangeError`` whose message starts with the bound at fault (``lower:`` or
            ``upper:``); a plain ``ValueError`` when a bound has not ``m`` values.
        """
        lo = _as_vector("lower", lower, m)
        hi = _as_vector("upper", upper, m)
        bad = np.flatnonzero(lo > hi if allow_equal else lo >= hi)
        if bad.size:
            i = int(bad[0])
            relation = "<=" if allow_equal else "<"
            raise DomainRangeError(
                "upper",
                f"domain lower must be {relation} upper for every feature; feature {i} has "
                f"lower={lo[i]:g} {'>' if allow_equal else '>='} upper={hi[i]:g}",
            )
        return cls(lo, hi)

    @classmethod
    def declared(
        cls,
        lower: float | list[float] | np.ndarray,
        upper: float | list[float] | np.ndarray,
        m: int,
    ) -> BoxDomain:
        """A declared box (a spec's): :meth:`create`, its widths within ``[2^-64, 2^64]``, its
        bounds 0 or normal floats at most ``2^64`` in absolute value (docs/guide/specs.md, "The
        record domain").

        Parameters
        ----------
        lower, upper : float or array_like
            Bounds; scalars apply to every feature.
        m : int
            Number of features.

        Returns
        -------
        BoxDomain
            The validated box.

        Raises
        ------
        ValueError
            A ``DomainRangeError`` whose message starts with the bound at fault (``lower:`` or
            ``upper:``); a plain ``ValueError`` when a bound has not ``m`` values.
        """
        box = cls.create(lower, upper, m)
        _check_scale(box.lower, box.upper)
        return box

    @property
    def m(self) -> int:
        """Number of features."""
        return int(self.lower.size)

    @property
    def widths(self) -> np.ndarray:
        """``upper - lower``: the largest change of one feature between two records."""
        return self.upper - self.lower

    @property
    def abs_max(self) -> np.ndarray:
        """``max(|lower|, |upper|)`` per feature."""
        return sens.box_abs_max(self.lower, self.upper)

    def sup_norm_sq(self) -> float:
        """``sup ||x||^2`` over the domain."""
        a = self.abs_max
        return float(a @ a)

    def sup_quadratic(self, P: np.ndarray) -> float:
        """Upper bound of ``sup x^T P x`` over the domain (symmetric hull or centred bound,
        :func:`mvg_dask.privacy.sensitivity.sup_quadratic_interval_box`)."""
        return sens.sup_quadratic_interval_box(P, self.lower, self.upper)

    def sup_quadratic_diff(self, P: np.ndarray) -> float:
        """Upper bound of ``sup (x - x')^T P (x - x')`` over pairs of records."""
        return sens.sup_quadratic_box(P, self.widths)

    def sup_quadratic_diag(self, p: np.ndarray) -> float:
        """``sup x^T diag(p) x = sum_i p_i max(lower_i^2, upper_i^2)`` (exact: separable)."""
        a = self.abs_max
        return float(np.asarray(p, float) @ (a * a))

    def sup_quadratic_diff_diag(self, p: np.ndarray) -> float:
        """``sup (x - x')^T diag(p) (x - x') = sum_i p_i width_i^2`` (exact)."""
        w = self.widths
        return float(np.asarray(p, float) @ (w * w))

    def coordinate_sups_diag(self, p: np.ndarray) -> tuple[np.ndarray, bool]:
        """:meth:`coordinate_sups` for the standard basis, in O(m)."""
        a = self.abs_max
        return np.asarray(p, float) * a * a, self.sign_definite

    def diff_norm(self) -> float:
        """``sup ||x - x'||`` over pairs of records."""
        return float(np.linalg.norm(self.widths))

    @property
    def sign_definite(self) -> bool:
        """True when no feature's interval contains values of both signs (``lower_i >= 0`` or
        ``upper_i <= 0``): then ``x_i x'_i >= 0`` for all records (docs/bounds.md, Thm. 2)."""
        return bool(np.all((self.lower >= 0) | (self.upper <= 0)))

    def coordinate_sups(self, W: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, bool]:
        """``T_i = p_i sup (w_i . x)^2`` over the box, and whether every ``w_i . x`` keeps one sign.

        ``y_i = sqrt(p_i) w_i . x`` are the coordinates of a record whitened by
        ``A = W diag(1/sqrt(p))``; the range of ``w_i . x`` over a box is exact (a linear
        function's extremes), so ``T_i`` is the exact supremum of ``y_i^2``.

        Parameters
        ----------
        W : ndarray
            Orthonormal directions (columns).
        p : ndarray
            Precisions along the directions.

        Returns
        -------
        tuple
            ``(T, sign_definite)``.
        """
        lo, hi = sens.box_linear_range(self.lower, self.upper, W)
        T = np.asarray(p, float) * np.maximum(np.abs(lo), np.abs(hi)) ** 2
        return T, bool(np.all((lo >= 0) | (hi <= 0)))

    def diff_l1(self) -> float:
        """``sup ||x - x'||_1`` over pairs of records."""
        return float(np.sum(self.widths))

    def entry_range(self) -> tuple[float, float]:
        """Range of one entry of a record."""
        return sens.box_entry_range(self.lower, self.upper)

    def describe(self) -> str:
        """The box in words for messages: ``box [0, 1]^4``, or its ranges per feature."""
        lo, hi = self.lower, self.upper
        if np.all(lo == lo[0]) and np.all(hi == hi[0]):
            return f"box [{lo[0]:g}, {hi[0]:g}]^{self.m}"
        return (
            f"box of {self.m} features, lower {lo.min():g}..{lo.max():g}, "
            f"upper {hi.min():g}..{hi.max():g}"
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description."""
        return {"box": {"lower": self.lower.tolist(), "upper": self.upper.tolist()}}


@dataclass(frozen=True, eq=False)
class L2BallDomain:
    """Every record has ``||x||_2 <= radius``.

    Parameters
    ----------
    radius : float
        ``C > 0``.
    m : int
        Number of features.
    """

    radius: float
    m: int
    kind: Literal["l2"] = field(default="l2", init=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.radius) and self.radius > 0):
            raise ValueError(f"domain l2_norm must be a finite number > 0, got {self.radius!r}")

    @classmethod
    def declared(cls, radius: float, m: int) -> L2BallDomain:
        """A declared ball: its radius within ``[2^-64, 2^64]`` (docs/guide/specs.md, "The
        record domain").

        Parameters
        ----------
        radius : float
            ``C``.
        m : int
            Number of features.

        Returns
        -------
        L2BallDomain
            The validated ball.

        Raises
        ------
        ValueError
            A ``DomainRangeError`` whose message starts with ``l2_norm:``.
        """
        c = float(radius)
        if not (math.isfinite(c) and MIN_SCALE <= c <= MAX_SCALE):
            raise DomainRangeError(
                "l2_norm", f"got {c!r}; a ball's radius lies in {_RANGE_TEXT}: {_RANGE_REMEDY}"
            )
        return cls(c, m)

    def sup_norm_sq(self) -> float:
        """``C^2``."""
        return float(self.radius**2)

    def sup_quadratic(self, P: np.ndarray) -> float:
        """``C^2 lambda_max(P)``."""
        return self.radius**2 * sens.lambda_max(P)

    def sup_quadratic_diff(self, P: np.ndarray) -> float:
        """``(2C)^2 lambda_max(P)``."""
        return 4.0 * self.radius**2 * sens.lambda_max(P)

    def sup_quadratic_diag(self, p: np.ndarray) -> float:
        """``C^2 max p``."""
        return float(self.radius**2 * np.max(p))

    def sup_quadratic_diff_diag(self, p: np.ndarray) -> float:
        """``(2C)^2 max p``."""
        return float(4.0 * self.radius**2 * np.max(p))

    def coordinate_sups_diag(self, p: np.ndarray) -> tuple[np.ndarray, bool]:
        """:meth:`coordinate_sups` for the standard basis."""
        return self.coordinate_sups(np.empty((0, 0)), p)

    def diff_norm(self) -> float:
        """``2C``."""
        return 2.0 * self.radius

    @property
    def sign_definite(self) -> bool:
        """Always False: a ball contains ``x`` and ``-x``."""
        return False

    def coordinate_sups(self, W: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, bool]:
        """``T_i = p_i C^2 = sup (sqrt(p_i) w_i . x)^2`` over the ball; never sign-definite."""
        return np.asarray(p, float) * self.radius**2, False

    def diff_l1(self) -> float:
        """``2C sqrt(m)``."""
        return 2.0 * self.radius * math.sqrt(self.m)

    def entry_range(self) -> tuple[float, float]:
        """``(-C, C)``."""
        return -self.radius, self.radius

    def describe(self) -> str:
        """The ball in words for messages: ``l2 ball ||x|| <= C in R^m``."""
        return f"l2 ball ||x|| <= {self.radius:g} in R^{self.m}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready description."""
        return {"l2_norm": self.radius}


RecordDomain = BoxDomain | L2BallDomain


def domain_from_dict(data: dict[str, Any], m: int) -> RecordDomain:
    """Rebuild a record domain from its ``to_dict`` form.

    Parameters
    ----------
    data : dict
        ``{"box": {"lower": [...], "upper": [...]}}`` or ``{"l2_norm": C}``.
    m : int
        Number of features.

    Returns
    -------
    BoxDomain or L2BallDomain
        The domain.
    """
    if "box" in data:
        # a stored domain was validated when it was built; an augmented one has a constant
        # coordinate (lower == upper)
        return BoxDomain.create(data["box"]["lower"], data["box"]["upper"], m, allow_equal=True)
    return L2BallDomain(float(data["l2_norm"]), m)


def augmented_domain(
    domain: RecordDomain, shift: np.ndarray | None = None, scale: float = 1.0
) -> RecordDomain:
    """The domain of the augmented record ``z = [x - c; s]`` (docs/bounds.md, Sec. 13).

    A box gains the coordinate ``[s, s]`` (exactly the augmented records), shifted by a public
    ``c`` if given (docs/bounds.md Sec. 14 recommends the box centre); an L2 ball of radius
    ``C`` (``c = 0``) is enclosed in the ball of radius ``sqrt(C^2 + s^2)`` in ``m + 1``
    dimensions, rounded up so that the float radius is never below the true one.

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        The declared record domain of ``x``.
    shift : ndarray, optional
        ``c`` (box only); ``0`` by default.
    scale : float, default 1
        ``s > 0``, the public constant coordinate (a power of two in a release:
        :func:`mvg_dask.privacy.sensitivity.augmented_scale`).

    Returns
    -------
    BoxDomain or L2BallDomain
        The domain of ``z``, with ``m + 1`` features.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"the constant coordinate must be positive and finite, got {scale!r}")
    if isinstance(domain, BoxDomain):
        c = np.zeros(domain.m) if shift is None else _as_vector("shift", shift, domain.m)
        lo = np.append(domain.lower - c, scale)
        hi = np.append(domain.upper - c, scale)
        return BoxDomain.create(lo, hi, domain.m + 1, allow_equal=True)
    if shift is not None and np.any(np.asarray(shift) != 0):
        raise ValueError("an L2-ball domain is augmented about its centre 0 only")
    # three roundings below sqrt(C^2 + s^2) cost at most ~1.5 ulp; 4 ulp more covers them
    radius = math.sqrt(domain.radius**2 + scale * scale) * (1.0 + 4.0 * np.finfo(np.float64).eps)
    return L2BallDomain(radius, domain.m + 1)
