"""Rigorous floating-point error bounds of the computed whitened query (docs/bounds.md, Sec. 11).

A lattice release rounds the *computed* whitened query ``g_hat`` (float64) to a public grid, so
its sensitivity needs ``E >= sup ||g_hat - g||_2`` over every dataset of the declared record
domain, ``g = A^-1 f(X) A^-T`` (two-sided) or ``A^-1 f(X)`` (one-sided) in exact arithmetic.
This module bounds ``E`` for the engine's fixed float sequences:

* Gram: products ``x_ri x_rj`` summed through at most ``depth`` additions (BLAS inner products
  over a chunk, chunk partials, a tree of task partials), then one division by the normaliser;
* whitening by the plan's factor, diagonal (``w = 1/sqrt(v)``), dense
  (``P = W^T / sqrt(v)[:, None]``) or low rank (``A = a I + U diag(delta) U^T``);
* the symmetric mechanism's scaled coordinates ``g_ij / sqrt(r)``.

Model: ``fl(a op b) = (a op b)(1 + d)``, ``|d| <= u = 2^-53`` (round to nearest), no underflow
and no overflow; ``gamma_n = n u / (1 - n u)``. Every bound returned is an upper bound of the
true error; the bound's own float evaluation is covered by a final factor ``1 + 2^-20``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

UNIT_ROUNDOFF: float = 2.0**-53
"""``u``: the unit roundoff of IEEE binary64 with round to nearest."""

#: Factor covering the rounding of the bounds' own evaluation (non-negative quantities, at most
#: ~2^30 well-conditioned operations each: relative error below 2^-22).
_UP = 1.0 + 2.0**-20
#: Intermediates above this magnitude could overflow in the engine: the bound is then ``inf``.
_OVERFLOW = 2.0**1000
#: Largest dense order for which ``W^T W`` is formed in extended precision (numpy's longdouble
#: product has no BLAS; beyond this order the float64 product's a-priori error is used).
_EXTENDED_MAX_ORDER = 1024

WhiteningKind = Literal["diagonal", "dense", "low-rank"]


def gamma(n: int) -> float:
    """``gamma_n = n u / (1 - n u)``, rounded up to a float.

    Parameters
    ----------
    n : int
        Number of rounding errors, ``n >= 0``.

    Returns
    -------
    float
        The smallest float ``>= n u / (1 - n u)``.

    Raises
    ------
    ValueError
        If ``n < 0`` or ``n u >= 1/2``.

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002,
       Sec. 3.1, Lemma 3.1 and Eq. (3.5).
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"gamma(n) needs n >= 0, got {n}")
    if n >= 2**52:
        raise ValueError(f"gamma(n) needs n u < 1/2, got n = {n}")
    exact = Fraction(n, 2**53 - n)
    value = float(exact)
    if Fraction(value) < exact:
        value = math.nextafter(value, math.inf)
    return value


def _frob(x: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(np.asarray(x, dtype=np.float64)))))


def _abs_two_norm(B: np.ndarray) -> float:
    """Upper bound of ``|| |B| ||_2`` (and of ``||B||_2``): ``min(sqrt(||B||_1 ||B||_inf),
    ||B||_F)``."""
    A = np.abs(np.asarray(B, dtype=np.float64))
    one = float(A.sum(axis=0).max()) if A.size else 0.0
    inf = float(A.sum(axis=1).max()) if A.size else 0.0
    return min(math.sqrt(one * inf), _frob(A)) * _UP


def _orthonormality_defect(Q: np.ndarray) -> float:
    """A rigorous upper bound of ``||Q^T Q - I||_2`` for ``Q`` (``m x k``, ``k <= m``).

    ``Q^T Q`` is formed in numpy's longdouble (extended precision on x86) when ``m k^2`` is
    small enough, else in float64; with ``u_e`` that format's unit roundoff,
    ``|fl(Q^T Q) - Q^T Q| <= gamma_m(u_e) |Q|^T |Q|`` (Higham, Eq. (3.5)), whose 2-norm is at
    most ``gamma_m(u_e) || |Q| ||_2^2``; the subtraction of ``I`` costs one more relative
    ``u_e``, and ``||.||_2 <= ||.||_F``.
    """
    Q = np.asarray(Q, dtype=np.float64)
    m, k = Q.shape
    if m * k * k <= _EXTENDED_MAX_ORDER**3:
        dtype: type[np.floating] = np.longdouble
    else:
        dtype = np.float64
    u_e = float(np.finfo(dtype).eps) / 2.0
    Ql = Q.astype(dtype)
    C = Ql.T @ Ql
    C[np.diag_indices(k)] -= 1
    frob = float(np.sqrt(np.sum(C * C)))
    gamma_m = m * u_e / (1.0 - m * u_e)
    return (frob * (1.0 + 2.0 * u_e) + gamma_m * _abs_two_norm(Q) ** 2) * _UP


@dataclass(frozen=True, eq=False)
class Whitening:
    """The public whitening of a release: ``A^-1`` of the plan's noise factor ``A``.

    Build one with :meth:`diagonal`, :meth:`dense` or :meth:`low_rank`.

    Attributes
    ----------
    kind : {"diagonal", "dense", "low-rank"}
        The structure of ``A``.
    variances : ndarray or None
        ``v`` (diagonal and dense): ``A = W diag(sqrt(v))``.
    directions : ndarray or None
        ``W`` (dense, ``m x m``) or ``U`` (low rank, ``m x k``).
    a : float or None
        Low rank: the scale of the identity part, ``A = a I + U diag(delta) U^T``.
    delta : ndarray or None
        Low rank: ``delta`` (``a + delta_j > 0``).
    defect : float
        Rigorous upper bound of ``||W^T W - I||_2`` (dense) or ``||U^T U - I||_2`` (low rank);
        0 for diagonal whitening.
    """

    kind: WhiteningKind
    variances: np.ndarray | None = None
    directions: np.ndarray | None = None
    a: float | None = None
    delta: np.ndarray | None = None
    defect: float = 0.0

    @property
    def order(self) -> int:
        """``m``, the number of features."""
        if self.kind == "diagonal":
            assert self.variances is not None
            return int(self.variances.shape[0])
        assert self.directions is not None
        return int(self.directions.shape[0])

    @classmethod
    def diagonal(cls, variances: np.ndarray) -> Whitening:
        """Diagonal whitening ``A^-1 = diag(1/sqrt(v))``.

        Parameters
        ----------
        variances : ndarray
            The plan's noise variances ``v > 0`` (float64), one per feature.

        Returns
        -------
        Whitening
            The whitening.
        """
        v = np.array(variances, dtype=np.float64).reshape(-1)
        if not np.all(v > 0) or not np.all(np.isfinite(v)):
            raise ValueError("variances must be positive and finite")
        v.setflags(write=False)
        return cls(kind="diagonal", variances=v)

    @classmethod
    def dense(
        cls, directions: np.ndarray, variances: np.ndarray, *, defect: float | None = None
    ) -> Whitening:
        """Dense whitening ``A^-1 = diag(1/sqrt(v)) W^-1``, applied as ``P = W^T / sqrt(v)``.

        Parameters
        ----------
        directions : ndarray
            ``W`` (``m x m``), nearly orthonormal float directions.
        variances : ndarray
            ``v > 0``, one per direction.
        defect : float, optional
            A certified upper bound of ``||W^T W - I||_2``; computed (rigorously, in extended
            precision where available) when omitted.

        Returns
        -------
        Whitening
            The whitening.
        """
        W = np.array(directions, dtype=np.float64)
        v = np.array(variances, dtype=np.float64).reshape(-1)
        if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] != v.shape[0]:
            raise ValueError("dense whitening needs an m x m W and m variances")
        if not np.all(v > 0) or not np.all(np.isfinite(v)):
            raise ValueError("variances must be positive and finite")
        eps = _orthonormality_defect(W) if defect is None else float(defect)
        if not eps < 0.5:
            raise ValueError(f"W is too far from orthonormal (||W^T W - I|| <= {eps:.3g})")
        W.setflags(write=False)
        v.setflags(write=False)
        return cls(kind="dense", variances=v, directions=W, defect=eps)

    @classmethod
    def low_rank(
        cls, directions: np.ndarray, a: float, delta: np.ndarray, *, defect: float | None = None
    ) -> Whitening:
        """Low-rank whitening of ``A = a I + U diag(delta) U^T``.

        Parameters
        ----------
        directions : ndarray
            ``U`` (``m x k``), nearly orthonormal columns.
        a : float
            ``a > 0``.
        delta : ndarray
            ``delta`` (``k``), with ``a + delta_j > 0``.
        defect : float, optional
            A certified upper bound of ``||U^T U - I||_2``; computed when omitted.

        Returns
        -------
        Whitening
            The whitening.
        """
        U = np.array(directions, dtype=np.float64)
        dl = np.array(delta, dtype=np.float64).reshape(-1)
        if U.ndim != 2 or U.shape[1] != dl.shape[0] or U.shape[1] > U.shape[0]:
            raise ValueError("low-rank whitening needs an m x k U (k <= m) and k deltas")
        a = float(a)
        if not (a > 0 and np.all(a + dl > 0)):
            raise ValueError("low-rank whitening needs a > 0 and a + delta > 0")
        eps = _orthonormality_defect(U) if defect is None else float(defect)
        if not eps < 0.5:
            raise ValueError(f"U is too far from orthonormal (||U^T U - I|| <= {eps:.3g})")
        U.setflags(write=False)
        dl.setflags(write=False)
        return cls(kind="low-rank", directions=U, a=a, delta=dl, defect=eps)

    # -- quantities used by the bounds --------------------------------------------------------

    def scales(self) -> np.ndarray:
        """Upper bounds of ``s_i = 1/sqrt(v_i)`` (diagonal and dense)."""
        assert self.variances is not None
        return (1.0 / np.sqrt(self.variances)) * _UP

    def dense_factor(self) -> np.ndarray:
        """``P_hat = fl(W^T / fl(sqrt(v))[:, None])``, exactly as the engine computes it."""
        assert self.kind == "dense" and self.directions is not None
        assert self.variances is not None
        return self.directions.T / np.sqrt(self.variances)[:, None]

    def dense_constants(self) -> tuple[float, float, float]:
        """``(phi, ||A^-1||_2, ||P_hat||_2)`` upper bounds, dense whitening.

        ``phi >= ||A^-1 - P_hat||_2`` (docs/bounds.md, Lemma 11.4).
        """
        P = self.dense_factor()
        eps = self.defect
        s_max = float(self.scales().max())
        eta = eps * math.sqrt(1.0 + eps) / (1.0 - eps)
        g2 = gamma(2)
        abs_P = _abs_two_norm(P)
        phi = (g2 / (1.0 - g2) * abs_P + s_max * eta) * _UP
        inv_norm = s_max / math.sqrt(1.0 - eps) * _UP
        return phi, inv_norm, min(abs_P, inv_norm + phi)

    def low_rank_constants(self) -> dict[str, float | np.ndarray]:
        """The constants of the low-rank sequence (docs/bounds.md, Lemma 11.5).

        Returns
        -------
        dict
            ``beta_hat`` (the engine's ``fl(fl(1/fl(a + delta)) - fl(1/a))``), ``e_beta``
            (``|beta_hat - beta| <= e_beta``), ``inv_tilde`` (``>= ||A~^-1||_2``, the formula's
            inverse), ``phi`` (``>= ||A^-1 - A~^-1||_2``), ``inv`` (``>= ||A^-1||_2``), ``nu``
            (``>= || |U| ||_2^2``).
        """
        assert self.kind == "low-rank" and self.directions is not None
        assert self.a is not None and self.delta is not None
        a, dl, U, eps = self.a, self.delta, self.directions, self.defect
        u = UNIT_ROUNDOFF
        c = 1.0 / a
        beta_hat = 1.0 / (a + dl) - c
        inv_ad = (1.0 / (a + dl)) * _UP
        e_beta = ((1 + u) * (gamma(2) * inv_ad + u * c * _UP) + u * np.abs(beta_hat)) / (1 - u)
        e_beta = e_beta * _UP
        beta_abs = np.abs(beta_hat) + e_beta
        beta_pos = np.maximum(beta_hat + e_beta, 0.0)
        inv_tilde = max(c + float(beta_pos.max(initial=0.0)) * (1 + eps), eps * c) * _UP
        rho = (1 + eps) * float(np.abs(dl).max(initial=0.0)) * float(beta_abs.max(initial=0.0))
        rho = rho * eps * _UP
        if not rho < 1:
            raise ValueError("U is too far from orthonormal for the low-rank inverse")
        phi = inv_tilde * rho / (1 - rho) * _UP
        inv = inv_tilde / (1 - rho) * _UP
        nu = min(_frob(U) ** 2, _abs_two_norm(U) ** 2) * _UP
        return {
            "beta_hat": beta_hat,
            "e_beta": e_beta,
            "inv_tilde": inv_tilde,
            "phi": phi,
            "inv": inv,
            "nu": nu,
        }


def _gram_count(depth: int, normaliser: float) -> int:
    """Rounding errors of one entry of ``f_hat``: the product, ``depth`` additions and the
    division (none when the normaliser is 1)."""
    if depth < 0:
        raise ValueError("depth must be >= 0")
    return int(depth) + (1 if float(normaliser) == 1.0 else 2)


def gram_error(
    abs_max: np.ndarray, records: int, depth: int, normaliser: float
) -> tuple[np.ndarray, np.ndarray]:
    """Entrywise bounds of the computed ``f_hat = fl(G_hat / N)`` (docs/bounds.md, Lemma 11.1).

    ``|f_hat_ij - f_ij| <= gamma_n rho a_i a_j`` and ``|f_hat_ij| <= (1 + gamma_n) rho a_i a_j``
    with ``n = depth + 2`` (``depth + 1`` when the normaliser is 1) and ``rho = records / N``.

    Parameters
    ----------
    abs_max : ndarray
        ``a_i >= sup |x_i|`` over the record domain.
    records : int
        An upper bound of the number of records (public: under add-remove, the largest count the
        bound must cover).
    depth : int
        The largest number of additions any product term passes through.
    normaliser : float
        The public normaliser ``N`` (1: no division).

    Returns
    -------
    tuple of ndarray
        ``(err, mag)``, both ``m x m``; ``inf`` where the engine's sums could overflow.

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002,
       Lemma 3.1, Eq. (3.5) and Sec. 4.2 (summation in any order).
    """
    a = np.abs(np.asarray(abs_max, dtype=np.float64)).reshape(-1)
    n = _gram_count(depth, normaliser)
    rho = float(records) / float(normaliser)
    base = rho * np.outer(a, a)
    g = gamma(n)
    if float(records) * float(a.max(initial=0.0)) ** 2 > _OVERFLOW:
        full = np.full_like(base, math.inf)
        return full, full.copy()
    return g * base * _UP, (1.0 + g) * base * _UP


def whitened_error(
    err: np.ndarray, mag: np.ndarray, *, whitening: Whitening, two_sided: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Entrywise bounds of the computed whitened query from those of ``f_hat``.

    Given ``|f_hat - f| <= err`` and ``|f_hat| <= mag`` entrywise, bound ``|g_hat - g|`` and
    ``|g_hat|``, ``g = A^-1 f A^-T`` (``two_sided``) or ``A^-1 f``, for the engine's sequence
    of the whitening's kind (docs/bounds.md, Lemmas 11.3-11.5). Forms ``m x m`` matrices (and
    ``O(m^3)`` products for dense whitening): the composed :func:`covariance_error_bound` is the
    ``O(m)`` / ``O(mk)`` path.

    Parameters
    ----------
    err, mag : ndarray
        ``m x m`` bounds of ``f_hat``.
    whitening : Whitening
        The release's whitening.
    two_sided : bool
        Two-sided (equi-modal and symmetric noise) or one-sided (unimodal).

    Returns
    -------
    tuple of ndarray
        ``(err_g, mag_g)``.

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002,
       Lemma 3.1, Lemma 3.3 and Eq. (3.5)/(3.13) (matrix products).
    """
    E = np.asarray(err, dtype=np.float64)
    M = np.asarray(mag, dtype=np.float64)
    if not (np.all(np.isfinite(E)) and np.all(np.isfinite(M))):
        full = np.full_like(E, math.inf)
        return full, full.copy()
    if whitening.kind == "diagonal":
        s = whitening.scales()
        if two_sided:
            S = np.outer(s, s)
            g6 = gamma(6)
            err_g = (E + g6 * M) * S
            mag_g = M * (1 + g6) * S
        else:
            g3 = gamma(3)
            err_g = (E + g3 * M) * s[:, None]
            mag_g = M * (1 + g3) * s[:, None]
    elif whitening.kind == "dense":
        P = np.abs(whitening.dense_factor())
        m = P.shape[0]
        gm = gamma(m)
        phi, inv_norm, p_norm = whitening.dense_constants()
        F = M + E  # >= |f|
        if two_sided:
            Ymag = (1 + gm) * (P @ M)
            core = gm * (Ymag @ P.T) + gm * (P @ M @ P.T) + P @ E @ P.T
            err_g = core + phi * (inv_norm + p_norm) * _frob(F)
            mag_g = (1 + gm) * (Ymag @ P.T)
        else:
            col = np.sqrt(np.sum(F * F, axis=0))
            err_g = gm * (P @ M) + P @ E + phi * col[None, :]
            mag_g = (1 + gm) * (P @ M)
    else:
        err_g, mag_g = _low_rank_apply(E, M, whitening)
        if two_sided:
            err_t, mag_t = _low_rank_apply(err_g.T, mag_g.T, whitening)
            err_g, mag_g = err_t.T, mag_t.T
    err_g, mag_g = err_g * _UP, mag_g * _UP
    if float(mag_g.max(initial=0.0)) > _OVERFLOW:
        full = np.full_like(err_g, math.inf)
        return full, full.copy()
    return err_g, mag_g


def _low_rank_apply(
    E: np.ndarray, M: np.ndarray, whitening: Whitening
) -> tuple[np.ndarray, np.ndarray]:
    """Entrywise bounds of one application ``L(X_hat)`` of the low-rank sequence (Lemma 11.5)."""
    assert whitening.directions is not None and whitening.a is not None
    U = np.abs(whitening.directions)
    m, k = U.shape
    const = whitening.low_rank_constants()
    beta_hat = np.abs(np.asarray(const["beta_hat"]))
    e_beta = np.asarray(const["e_beta"])
    phi = float(const["phi"])
    inv_a = (1.0 / whitening.a) * _UP

    def J(Y: np.ndarray, w: np.ndarray) -> np.ndarray:
        return U @ (w[:, None] * (U.T @ Y))

    JM = J(M, beta_hat)
    gk = gamma(m + k + 2)
    col = np.sqrt(np.sum((M + E) ** 2, axis=0))
    err = (
        gamma(3) * inv_a * M
        + gk * JM
        + J(M, e_beta)
        + inv_a * E
        + J(E, beta_hat + e_beta)
        + phi * col[None, :]
    )
    mag = (1 + gamma(3)) * inv_a * M + (1 + gk) * JM
    return err * _UP, mag * _UP


def lattice_coordinates_error(
    err_g: np.ndarray, mag_g: np.ndarray, *, algorithm: str, ratio: float | None
) -> float:
    """ℓ2 bound on the error of the lattice coordinates (docs/bounds.md, Lemma 11.6).

    ``"symmetric"``: the coordinates are ``vech_r(g_hat)``: ``g_hat_ii`` and
    ``fl(g_hat_ij q)``, ``q = fl(1/fl(sqrt(r)))``, for ``i < j``; each off-diagonal error is at
    most ``(err_ij + gamma_3 mag_ij) / sqrt(r)``. ``"equi-modal"`` and ``"unimodal"``: all
    entries, the Frobenius norm of ``err_g``.

    Parameters
    ----------
    err_g, mag_g : ndarray
        Entrywise bounds of ``|g_hat - g|`` and ``|g_hat|``.
    algorithm : {"symmetric", "equi-modal", "unimodal"}
        The noise kind.
    ratio : float or None
        ``r >= 1/2`` for the symmetric mechanism.

    Returns
    -------
    float
        The bound (``inf`` if an input is not finite).

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002,
       Lemma 3.1.
    """
    E = np.asarray(err_g, dtype=np.float64)
    if not np.all(np.isfinite(E)):
        return math.inf
    if algorithm in ("equi-modal", "unimodal"):
        return _frob(E) * _UP
    if algorithm != "symmetric":
        raise ValueError(f"unknown algorithm {algorithm!r}")
    r = _check_ratio(ratio)
    M = np.asarray(mag_g, dtype=np.float64)
    off = np.triu(E + gamma(3) * M, 1)
    total = float(np.sum(np.diag(E) ** 2)) + float(np.sum(off * off)) / r
    return math.sqrt(total) * _UP


def _check_ratio(ratio: float | None) -> float:
    if ratio is None or not float(ratio) >= 0.5:
        raise ValueError(f"the symmetric mechanism needs a ratio r >= 1/2, got {ratio}")
    return float(ratio)


def _norm_max(abs_max: np.ndarray, norm_max: float | None) -> float:
    a_norm = float(np.sqrt(np.sum(abs_max * abs_max))) * _UP
    return a_norm if norm_max is None else min(float(norm_max), a_norm)


def identity_error(
    abs_max: np.ndarray, *, whitening: Whitening, norm_max: float | None = None
) -> float:
    """ℓ2 bound of ``||h_hat - A^-1 x||`` for one record column, sup over the domain.

    Diagonal: ``gamma_3 sup ||s o x||``. Dense: ``gamma_m sup || |P_hat| |x| || + phi C``.
    Low rank: ``(lambda_L + phi_U) C`` (docs/bounds.md, Lemma 11.7).

    Parameters
    ----------
    abs_max : ndarray
        ``a_i >= sup |x_i|``.
    whitening : Whitening
        The release's whitening.
    norm_max : float, optional
        ``C >= sup ||x||_2`` (an L2 ball's radius); ``||a||`` when omitted.

    Returns
    -------
    float
        The bound.

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002,
       Lemma 3.1 and Eq. (3.5).
    """
    a = np.abs(np.asarray(abs_max, dtype=np.float64)).reshape(-1)
    C = _norm_max(a, norm_max)
    if whitening.kind == "diagonal":
        s = whitening.scales()
        sup_y = min(_frob(s * a), C * float(s.max()))
        out = gamma(3) * sup_y
    elif whitening.kind == "dense":
        P = np.abs(whitening.dense_factor())
        phi, _, _ = whitening.dense_constants()
        sup_p = min(_frob(P @ a), _abs_two_norm(P) * C)
        out = gamma(P.shape[0]) * sup_p + phi * C
    else:
        out = (_low_rank_lambda(whitening) + float(whitening.low_rank_constants()["phi"])) * C
    return out * _UP


def _low_rank_lambda(whitening: Whitening) -> float:
    """``lambda_L``: ``||L_hat(X) - A~^-1 X||_F <= lambda_L ||X||_F`` (rounding only)."""
    assert whitening.directions is not None and whitening.a is not None
    m, k = whitening.directions.shape
    const = whitening.low_rank_constants()
    beta_max = float(np.abs(np.asarray(const["beta_hat"])).max(initial=0.0))
    e_max = float(np.asarray(const["e_beta"]).max(initial=0.0))
    nu = float(const["nu"])
    inv_a = (1.0 / whitening.a) * _UP
    return (gamma(3) * inv_a + (gamma(m + k + 2) * beta_max + e_max) * nu) * _UP


def _diagonal_covariance_error(
    whitening: Whitening,
    a: np.ndarray,
    C: float,
    n: int,
    rho: float,
    algorithm: str,
    r: float,
) -> tuple[float, float]:
    """:func:`covariance_error_bound`'s ``(E, magnitude)`` for diagonal whitening (``O(m)``)."""
    s = whitening.scales()
    b = s * a
    b2 = b * b
    S_d = min(float(np.sum(b2)), C * C * float(s.max()) ** 2)
    if algorithm == "unimodal":
        out = gamma(n + 3) * rho * math.sqrt(S_d) * C
        mag = rho * math.sqrt(S_d) * C
    elif algorithm == "equi-modal":
        out = gamma(n + 6) * rho * S_d
        mag = rho * S_d
    else:
        sum2, sum4 = float(np.sum(b2)), float(np.sum(b2 * b2))
        off = max(sum2 * sum2 - sum4, 0.0) / 2.0
        rank_one = rho * math.sqrt(gamma(n + 6) ** 2 * sum4 + gamma(n + 9) ** 2 * off / r)
        out = min(rank_one, gamma(n + 9) * rho * S_d)
        mag = rho * S_d
    return out, mag


def _dense_covariance_error(
    whitening: Whitening, a: np.ndarray, C: float, n: int, rho: float, algorithm: str
) -> tuple[float, float]:
    """:func:`covariance_error_bound`'s ``(E, magnitude)`` for dense whitening (``O(m^2)``)."""
    g3 = gamma(3)
    P = np.abs(whitening.dense_factor())
    m = P.shape[0]
    phi, inv_norm, p_norm = whitening.dense_constants()
    abs_p = _abs_two_norm(P)
    sup_p = min(_frob(P @ a) * _UP, abs_p * C)  # sup || |P| |x| ||
    if algorithm != "unimodal":
        e_f = gamma(2 * m + n) * rho * sup_p**2 + phi * (inv_norm + p_norm) * rho * C * C
        g_f = rho * min(inv_norm * C, sup_p + phi * C) ** 2
        out = e_f if algorithm == "equi-modal" else (1 + g3) * e_f + g3 * g_f
    else:
        out = gamma(m + n) * rho * sup_p * C + phi * rho * C * C
    mag = rho * abs_p**2 * C * C
    return out, mag


def _low_rank_covariance_error(
    whitening: Whitening, C: float, n: int, rho: float, algorithm: str, r: float
) -> tuple[float, float]:
    """:func:`covariance_error_bound`'s ``(E, magnitude)`` for low-rank whitening (``O(mk)``)."""
    g3 = gamma(3)
    const = whitening.low_rank_constants()
    lam = _low_rank_lambda(whitening)
    inv_t, phi, inv = float(const["inv_tilde"]), float(const["phi"]), float(const["inv"])
    f_norm = rho * C * C
    f_err = gamma(n) * f_norm
    e1 = lam * (f_norm + f_err) + inv_t * f_err + phi * f_norm
    if algorithm == "unimodal":
        return e1, inv * f_norm + e1
    y_norm = inv * f_norm
    e_f = lam * (y_norm + e1) + inv_t * e1 + phi * y_norm
    g_f = inv * inv * f_norm
    # g_hat is not exactly symmetric here: its upper triangle weighs up to max(1, 1/r)
    sym = math.sqrt(max(1.0, 1.0 / r))
    out = e_f if algorithm == "equi-modal" else sym * ((1 + g3) * e_f + g3 * g_f)
    return out, g_f + e_f


def covariance_error_bound(
    abs_max: np.ndarray,
    records: int,
    depth: int,
    normaliser: float,
    whitening: Whitening,
    algorithm: str,
    ratio: float | None = None,
    *,
    norm_max: float | None = None,
) -> float:
    """``E``: an ℓ2 bound of the lattice coordinates' float error for the covariance query.

    Composes Lemmas 11.1-11.6 of docs/bounds.md without ``m x m`` matrices for diagonal
    (``O(m)``) and low-rank (``O(mk)``) whitening; dense whitening costs ``O(m^2)``. With
    ``rho = records / normaliser``, ``n = depth + 2`` (``+1`` when ``normaliser == 1``),
    ``C >= sup ||x||`` and ``S_d = min(sum_i s_i^2 a_i^2, C^2 max_i s_i^2)``:

    * diagonal, two-sided: ``gamma_{n+6} rho S_d`` (equi-modal); symmetric: the ``vech_r`` norm of
      ``gamma_{n+6}`` (diagonal) and ``gamma_{n+9} / sqrt(r)`` (off-diagonal) times
      ``rho b b^T``, ``b = s o a``, or ``gamma_{n+9} rho S_d``, whichever is smaller;
    * diagonal, one-sided (unimodal): ``gamma_{n+3} rho sqrt(S_d) C``;
    * dense: ``gamma_{2m+n} rho R_P + phi (||A^-1|| + ||P_hat||) rho C^2`` (two-sided),
      ``gamma_{m+n} rho sqrt(R_P) C + phi rho C^2`` (one-sided), ``R_P = sup || |P_hat| |x| ||^2``;
    * low rank: two applications of Lemma 11.5's norm-wise bound;

    then for the symmetric mechanism ``(1 + gamma_3) E_F + gamma_3 ||g||_F`` (Lemma 11.6).

    Parameters
    ----------
    abs_max : ndarray
        ``a_i >= sup |x_i|`` over the record domain.
    records : int
        Public upper bound of the number of records.
    depth : int
        Largest number of additions a product term passes through in the Gram sum.
    normaliser : float
        Public normaliser ``N`` (1: no division).
    whitening : Whitening
        The release's whitening.
    algorithm : {"symmetric", "equi-modal", "unimodal"}
        The noise kind (unimodal is one-sided, the others two-sided).
    ratio : float, optional
        ``r >= 1/2``, symmetric mechanism only.
    norm_max : float, optional
        ``C >= sup ||x||_2`` (an L2 ball's radius); ``||a||`` when omitted.

    Returns
    -------
    float
        ``E`` (``inf`` where the engine's floats could overflow).

    References
    ----------
    .. [1] N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002,
       Sec. 3.1 (Lemma 3.1, Lemma 3.3, Eq. (3.5)) and Sec. 4.2.
    """
    if algorithm not in ("symmetric", "equi-modal", "unimodal"):
        raise ValueError(f"unknown algorithm {algorithm!r}")
    r = _check_ratio(ratio) if algorithm == "symmetric" else 1.0
    a = np.abs(np.asarray(abs_max, dtype=np.float64)).reshape(-1)
    C = _norm_max(a, norm_max)
    n = _gram_count(depth, normaliser)
    rho = float(records) / float(normaliser) * _UP
    if float(records) * float(a.max(initial=0.0)) ** 2 > _OVERFLOW:
        return math.inf
    if whitening.kind == "diagonal":
        out, mag = _diagonal_covariance_error(whitening, a, C, n, rho, algorithm, r)
    elif whitening.kind == "dense":
        out, mag = _dense_covariance_error(whitening, a, C, n, rho, algorithm)
    else:
        out, mag = _low_rank_covariance_error(whitening, C, n, rho, algorithm, r)
    if not math.isfinite(out) or mag > _OVERFLOW:
        return math.inf
    return out * _UP


def mean_error(abs_max: np.ndarray, records: int, depth: int, normaliser: float) -> float:
    """Bound on ``||g_hat - g||_2`` for the whitened mean ``g = (sum_r x_r / N) / sigma`` as the
    engine computes it, in units of ``1 / sigma`` (docs/bounds.md, Sec. 14, "What is built").

    The row sums pass through at most ``depth`` additions (Lemma 11.1's sequence without the
    product), ``f_hat = fl(S_hat / N)`` adds one rounding and ``fl(f_hat w)`` with
    ``w = fl(1 / sigma)`` two more, so ``|g_hat_i - g_i| <= gamma_{depth + 3} rho a_i / sigma``
    and the L2 bound is ``gamma_{depth + 3} rho ||a||``; multiply by ``1 / sigma``.

    Parameters
    ----------
    abs_max : ndarray
        ``a_i >= sup |x_i|`` over the (shifted) record domain.
    records : int
        An upper bound of the number of records.
    depth : int
        The largest number of additions a term passes through.
    normaliser : float
        The public normaliser ``N``.

    Returns
    -------
    float
        ``gamma_{depth + 3} rho ||a||`` (``inf`` where the sums could overflow).
    """
    a = np.abs(np.asarray(abs_max, dtype=np.float64)).reshape(-1)
    if depth < 0:
        raise ValueError("depth must be >= 0")
    if float(records) * float(a.max(initial=0.0)) > _OVERFLOW:
        return math.inf
    rho = float(records) / float(normaliser)
    return gamma(int(depth) + 3) * rho * float(np.linalg.norm(a)) * _UP
