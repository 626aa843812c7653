"""Noise covariances of the form identity plus low rank: ``Sigma = v_c I + U diag(v_U - v_c) U^T``.

Top-``k`` directions ``U`` (``m x k``) with their own variances ``v_U`` and one variance ``v_c``
for every direction orthogonal to them: what DP-PCA with a binary (or uniform) allocation gives,
and all a wide release may hold (no ``m x m`` matrix). The noise factor is the symmetric square
root ``B = Sigma^(1/2) = sqrt(v_c) I + U diag(sqrt(v_U) - sqrt(v_c)) U^T``, and a record is
whitened by ``B^-1 = P^(1/2)``, ``P = Sigma^-1`` (docs/bounds.md, Sec. 10). Every bound here
is computed from ``U`` in at most O(m^2 k) time and O(m * ROW_BLOCK) memory.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from mvg_dask.plan.domain import BoxDomain, RecordDomain
from mvg_dask.privacy import sensitivity as sens

#: Rows of ``P^(1/2)`` formed at once when bounding whitened coordinates over a box.
ROW_BLOCK = 512
#: Relative tolerance of "one variance on the complement".
COMPLEMENT_RTOL = 1e-12

_CACHE: OrderedDict[tuple[object, ...], dict[str, object]] = OrderedDict()
_CACHE_SIZE = 8


@dataclass(frozen=True, eq=False)
class LowRankPrecision:
    """``P = Sigma^-1 = p_c I + U diag(p_U - p_c) U^T``.

    Attributes
    ----------
    basis : ndarray
        ``U`` (``m x k``, orthonormal columns).
    top : ndarray
        ``p_U``, the precisions along the columns of ``U``.
    rest : float
        ``p_c``, the precision of every direction orthogonal to ``U``.
    """

    basis: np.ndarray
    top: np.ndarray
    rest: float

    @classmethod
    def from_variances(cls, U: np.ndarray, variances: np.ndarray) -> LowRankPrecision:
        """From the ``m`` noise variances of a low-rank plan: ``k`` for ``U``, then the
        complement's, which must all be equal.

        Parameters
        ----------
        U : ndarray
            ``m x k`` directions.
        variances : ndarray
            Length ``m``.

        Returns
        -------
        LowRankPrecision
            The precision.
        """
        v = np.asarray(variances, dtype=np.float64)
        m, k = U.shape
        if v.shape != (m,):
            raise ValueError(f"expected {m} noise variances, got {v.shape}")
        rest = v[k:]
        if rest.size and np.max(np.abs(rest - rest[0])) > COMPLEMENT_RTOL * abs(rest[0]):
            raise ValueError(
                "low-rank directions give every direction outside the top k one noise "
                "variance: allocate with strategy uniform or binary (important directions among "
                "the top k)"
            )
        return cls(U, 1.0 / v[:k], float(1.0 / rest[0]))

    @property
    def m(self) -> int:
        """Dimension."""
        return int(self.basis.shape[0])

    def values(self) -> np.ndarray:
        """The ``m`` eigenvalues of ``P`` (``p_U``, then ``p_c`` repeated)."""
        return np.concatenate([self.top, np.full(self.m - self.top.size, self.rest)])

    @property
    def lambda_max(self) -> float:
        """``lambda_max(P)``."""
        return float(max(np.max(self.top), self.rest))

    def top_two(self) -> tuple[float, float]:
        """The two largest eigenvalues of ``P`` (for the area bound, docs/bounds.md Lemma 3)."""
        v = np.sort(np.concatenate([self.top, [self.rest] * min(2, self.m - self.top.size)]))
        return float(v[-1]), float(v[-2]) if v.size > 1 else 0.0

    def dense(self) -> np.ndarray:
        """``P`` as an ``m x m`` matrix (tests and small queries only)."""
        U = self.basis
        return np.asarray(self.rest * np.eye(self.m) + (U * (self.top - self.rest)) @ U.T)

    def root_rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` of ``P^(1/2) = sqrt(p_c) I + U diag(sqrt(p_U) - sqrt(p_c)) U^T``."""
        U = self.basis
        g = np.sqrt(self.top) - np.sqrt(self.rest)
        rows = (U[r0:r1] * g) @ U.T
        rows[np.arange(r1 - r0), np.arange(r0, r1)] += np.sqrt(self.rest)
        return np.asarray(rows)

    # -- bounds over a record domain -----------------------------------------------------------
    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` of ``P``."""
        U = self.basis
        out = (U[r0:r1] * (self.top - self.rest)) @ U.T
        out[np.arange(r1 - r0), np.arange(r0, r1)] += self.rest
        return np.asarray(out)

    def _direction_form(self, h: np.ndarray) -> float:
        """``p_c ||h||^2 + sum_l max(p_l - p_c, 0) (|u_l| . h)^2 >= sup_{|z| <= h} z^T P z``."""
        gain = np.maximum(self.top - self.rest, 0.0)
        return float(self.rest * (h @ h) + gain @ ((np.abs(self.basis).T @ h) ** 2))

    def _box_pass(self, domain: BoxDomain) -> dict[str, object]:
        """One O(m^2 k) pass over the rows of ``P^(1/2)`` and ``P`` for a box, of the unit-scale
        precision (``p_c = 1``; every quantity scales with ``p_c``), cached per ``(U, p_U / p_c,
        box)``: the whitened coordinates' ``T`` and signs, and ``sum_ij |P_ij| g_i g_j`` for
        ``g`` the symmetric hull's ``a`` and the half widths ``h``."""
        key = (
            hashlib.sha256(np.ascontiguousarray(self.basis).tobytes()).hexdigest(),
            (self.top / self.rest).tobytes(),
            domain.lower.tobytes(),
            domain.upper.tobytes(),
        )
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
        unit = LowRankPrecision(self.basis, self.top / self.rest, 1.0)
        a = domain.abs_max
        h = domain.widths / 2.0
        m = self.m
        T = np.empty(m)
        definite = True
        abs_a = abs_h = 0.0
        for r0 in range(0, m, ROW_BLOCK):
            r1 = min(r0 + ROW_BLOCK, m)
            lo, hi = sens.box_linear_range(domain.lower, domain.upper, unit.root_rows(r0, r1).T)
            T[r0:r1] = np.maximum(np.abs(lo), np.abs(hi)) ** 2
            definite = definite and bool(np.all((lo >= 0) | (hi <= 0)))
            P_abs = np.abs(unit.rows(r0, r1))
            abs_a += float(a[r0:r1] @ (P_abs @ a))
            abs_h += float(h[r0:r1] @ (P_abs @ h))
        hit = {"T": T, "definite": definite, "abs_a": abs_a, "abs_h": abs_h}
        _CACHE[key] = hit
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return hit

    def _sup_box_form(self, h: np.ndarray, abs_form: float) -> float:
        """``sup_{|z| <= h} z^T P z``: the least of ``sum |P_ij| h_i h_j``, ``lambda_max ||h||^2``
        and the per-direction bound (each valid)."""
        return min(abs_form, self.lambda_max * float(h @ h), self._direction_form(h))

    def sup_quadratic(self, domain: RecordDomain) -> float:
        """An upper bound of ``sup x^T P x`` over the domain: over a box, docs/bounds.md Lemma 5
        (the symmetric hull and the centred bound) as for a dense ``P``, each ``sup_{|z| <= h}``
        the least of three valid bounds; over an L2 ball ``C^2 lambda_max(P)``."""
        if not isinstance(domain, BoxDomain):
            return float(domain.sup_norm_sq() * self.lambda_max)
        cached = self._box_pass(domain)
        a = domain.abs_max
        h = domain.widths / 2.0
        c = (domain.lower + domain.upper) / 2.0
        hull = self._sup_box_form(a, self.rest * float(cached["abs_a"]))  # type: ignore[arg-type]
        U = self.basis
        Pc = self.rest * c + U @ ((self.top - self.rest) * (U.T @ c))
        centred = (
            float(c @ Pc)
            + 2.0 * float(np.abs(Pc) @ h)
            + self._sup_box_form(h, self.rest * float(cached["abs_h"]))  # type: ignore[arg-type]
        )
        return float(min(hull, centred))

    def sup_quadratic_diff(self, domain: RecordDomain) -> float:
        """An upper bound of ``sup (x - x')^T P (x - x')`` over pairs of records: the differences
        fill the box ``|z| <= w`` (widths ``w = 2 h``)."""
        if not isinstance(domain, BoxDomain):
            return float(4.0 * domain.sup_norm_sq() * self.lambda_max)
        cached = self._box_pass(domain)
        w = domain.widths
        return self._sup_box_form(w, 4.0 * self.rest * float(cached["abs_h"]))  # type: ignore[arg-type]

    def coordinate_sups(self, domain: RecordDomain) -> tuple[np.ndarray, bool]:
        """``T_i = sup y_i^2`` of the whitened record ``y = P^(1/2) x`` (exact over a box: each
        ``y_i`` is linear in ``x``), and whether every ``y_i`` keeps one sign.

        O(m^2 k) time over a box (``P^(1/2)`` formed ``ROW_BLOCK`` rows at a time, cached), O(m k)
        over an L2 ball (``T_i = C^2 P_ii``).
        """
        if not isinstance(domain, BoxDomain):
            U = self.basis
            diag = self.rest + ((U * U) @ (self.top - self.rest))
            return np.asarray(domain.sup_norm_sq() * diag), False
        cached = self._box_pass(domain)
        T = np.asarray(cached["T"]) * self.rest
        return T, bool(cached["definite"])


def low_rank_factor(U: np.ndarray, variances: np.ndarray) -> tuple[float, np.ndarray]:
    """``(a, delta)`` of ``B = Sigma^(1/2) = a I + U diag(delta) U^T`` for the ``m`` variances of
    a low-rank plan (``k`` along ``U``, then the complement's)."""
    k = U.shape[1]
    v = np.asarray(variances, dtype=np.float64)
    a = float(np.sqrt(v[k]))
    return a, np.asarray(np.sqrt(v[:k]) - a)


def dense_low_rank(U: np.ndarray, top: np.ndarray, rest: float) -> np.ndarray:
    """``rest I + U diag(top - rest) U^T`` as an ``m x m`` matrix (small queries, tests)."""
    m = U.shape[0]
    return np.asarray(rest * np.eye(m) + (U * (np.asarray(top) - rest)) @ U.T)
