"""Calibrations of the MVG mechanism: one function per published theorem, plus ``exact``.

Every function here is pure numpy/scipy: no dask, zarr or xarray (the layout in
docs/guide/architecture.md).

Conventions
-----------
A noise plan has row covariance ``Sigma = W diag(v) W^T`` (``v`` are the *variances* along the
orthonormal directions ``W``) and column covariance ``Psi`` (``I`` for unimodal noise, ``Sigma`` for
equi-modal noise). Each paper calibration bounds a *precision budget*:

* MVG (Chanyaswad et al.), Thm. 2/3, Alg. 1/2: ``sum_i p_i <= P`` with ``p_i = 1 / v_i**2``;
  the paper writes ``sigma_i(Sigma) = 1/sqrt(p_i)`` and that ``sigma_i`` is a singular value
  of ``Sigma``, i.e. a variance. We call this a *squared* budget.
* MGM (Yang et al.), Thm. 1-3: ``||U^-1||_F^2 = tr(Sigma^-1) = sum_i 1 / v_i <= B``: a *linear*
  budget on ordinary precisions.

Allocations ``theta`` (``sum theta <= 1``) split the budget: ``p_i = theta_i * P``.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np

#: Calibration names; :mod:`mvg_dask.privacy.registry` describes each (and checks they agree).
Calibration = Literal["exact", "mvg-thm2", "mvg-thm3", "mgm", "mgm-udn", "mgm-idn"]
Algorithm = Literal["unimodal", "equi-modal", "symmetric"]
BudgetKind = Literal["squared", "linear"]

#: The noise types: ``unimodal`` (Alg. 1, ``A N``), ``equi-modal`` (Alg. 2, ``A N A^T``) and
#: ``symmetric`` (``A S A^T`` with ``S`` symmetric, for symmetric queries; docs/bounds.md).
ALGORITHMS: tuple[Algorithm, ...] = ("unimodal", "equi-modal", "symmetric")
#: The noise types of the papers (MVG Alg. 1 and 2), which their theorems cover.
PAPER_ALGORITHMS: tuple[Algorithm, ...] = ("unimodal", "equi-modal")
#: The one wording of the rule that equi-modal noise (``Psi = Sigma``) needs ``m == n``.
EQUI_MODAL_NEEDS_SQUARE = "equi-modal noise (Alg. 2, Psi = Sigma) needs a square query"

_BLOCK = 1 << 20


def _check_privacy(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise ValueError(f"delta must lie in the open interval (0, 1), got {delta!r}")


def _check_square(algorithm: Algorithm, m: int, n: int) -> None:
    if algorithm != "unimodal" and m != n:
        raise ValueError(f"{EQUI_MODAL_NEEDS_SQUARE}, got {m} x {n}: use algorithm: unimodal")


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def harmonic_number(r: int, order: float = 1.0) -> float:
    """Generalised harmonic number ``H_{r,order} = sum_{i=1}^{r} i**-order``.

    Computed by blockwise pairwise summation (no recursion), so ``r`` of 10**5 or 10**8 is fine.

    Parameters
    ----------
    r : int
        Number of terms, ``r >= 1``.
    order : float, default 1.0
        The exponent: ``1`` gives ``H_r``, ``0.5`` gives ``H_{r,1/2}`` of MVG Table 1.

    Returns
    -------
    float
        The sum.

    References
    ----------
    .. [1] T. Chanyaswad, A. Dytso, H. V. Poor, P. Mittal, "A Differential Privacy Mechanism
       Design Under Matrix-Valued Query", arXiv:1802.10077, Table 1.

    Examples
    --------
    >>> round(harmonic_number(4), 6)
    2.083333
    """
    if int(r) != r or r < 1:
        raise ValueError(f"r must be a positive integer, got {r!r}")
    total = 0.0
    start = 1
    while start <= r:
        stop = min(r, start + _BLOCK - 1)
        i = np.arange(start, stop + 1, dtype=np.float64)
        # sum the small terms first for accuracy
        total += float(np.sum(i[::-1] ** (-order)))
        start = stop + 1
    return total


def zeta(delta: float, m: int, n: int) -> float:
    """Laurent-Massart radius ``zeta(delta)`` for an ``m x n`` standard normal matrix.

    ``zeta(delta) = sqrt(mn + 2 sqrt(-mn ln delta) - 2 ln delta)``, so that
    ``P[||N||_F <= zeta(delta)] >= 1 - delta``.

    The authors' public code later dropped the outer square root; that only makes the bound (and
    the noise) larger. We implement the paper's definition.

    Parameters
    ----------
    delta : float
        Failure probability in (0, 1).
    m, n : int
        Shape of the noise matrix.

    Returns
    -------
    float
        ``zeta(delta)``.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Lemma 1 (Laurent-Massart).
    .. [2] B. Laurent, P. Massart, "Adaptive estimation of a quadratic functional by model
       selection", Ann. Statist. 28(5), 2000, Lemma 1.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    mn = float(m) * float(n)
    ln_d = math.log(delta)
    return math.sqrt(mn + 2.0 * math.sqrt(-mn * ln_d) - 2.0 * ln_d)


def quadratic_root_bound(a: float, b: float, epsilon: float) -> float:
    """Right-hand side ``(-b + sqrt(b^2 + 8 a eps))^2 / (4 a^2)`` shared by MVG/MGM theorems.

    Evaluated in the cancellation-free form ``16 eps^2 / (b + sqrt(b^2 + 8 a eps))^2``, which is
    algebraically identical: with ``b >> a eps`` (the common case) the textbook form loses most
    significant digits.

    Parameters
    ----------
    a, b : float
        The theorem's ``alpha`` (or ``omega``) and ``beta``, ``a > 0``, ``b >= 0``.
    epsilon : float
        Privacy parameter.

    Returns
    -------
    float
        The bound.
    """
    _check_positive("alpha", a)
    if not b >= 0:
        raise ValueError(f"beta must be >= 0, got {b!r}")
    root = math.sqrt(b * b + 8.0 * a * epsilon)
    return 16.0 * epsilon * epsilon / (b + root) ** 2


@dataclass(frozen=True, kw_only=True)
class PrecisionBudget:
    """A calibration's precision budget and what it bounds.

    Attributes
    ----------
    calibration : str
        Calibration name.
    kind : {"squared", "linear"}
        ``"squared"``: the budget bounds ``sum 1/v_i**2`` (MVG); ``"linear"``: ``sum 1/v_i`` (MGM).
    budget : float
        The precision budget ``P`` the allocation splits.
    bound : float
        The theorem's right-hand side before it is specialised to the algorithm.
    alpha, beta : float or None
        The theorem's constants (``alpha`` is ``omega`` for MVG Thm. 3).
    zeta : float
        ``zeta(delta)`` with the theorem's shape.
    """

    calibration: Calibration
    kind: BudgetKind
    budget: float
    bound: float
    alpha: float | None
    beta: float | None
    zeta: float

    def variances(self, theta: np.ndarray) -> np.ndarray:
        """Variances along the directions for the allocation ``theta`` (``p_i = theta_i P``)."""
        theta = np.asarray(theta, dtype=np.float64)
        # a relative margin of 1e-12 rounds toward more privacy, so that the theorem's
        # inequality holds strictly in floating point
        p = theta * (self.budget * (1.0 - 1e-12))
        if self.kind == "squared":
            return np.asarray(1.0 / np.sqrt(p))
        return np.asarray(1.0 / p)


def mvg_thm2_budget(
    *,
    m: int,
    n: int,
    epsilon: float,
    delta: float,
    sensitivity: float,
    gamma: float,
    algorithm: Algorithm,
) -> PrecisionBudget:
    """Precision budget of the MVG mechanism from its general sufficient condition.

    Thm. 2: ``||sigma(Sigma^-1)||_2 ||sigma(Psi^-1)||_2 <= (-b + sqrt(b^2 + 8 a eps))^2 / (4 a^2)``
    with ``a = [H_r + H_{r,1/2}] gamma^2 + 2 H_r gamma s_2`` and
    ``b = 2 (mn)^{1/4} zeta(delta) H_r s_2``, ``r = min(m, n)``.
    Unimodal noise (``Psi = I_n``, Alg. 1): budget ``bound^2 / n`` on ``sum 1/v_i^2`` (Thm. 5).
    Equi-modal noise (``Psi = Sigma``, Alg. 2): budget ``bound`` on ``sum 1/v_i^2`` (Thm. 6).

    Parameters
    ----------
    m, n : int
        Query output shape.
    epsilon, delta : float
        Privacy parameters.
    sensitivity : float
        ``s_2(f)``, the L2 (Frobenius) sensitivity.
    gamma : float
        ``sup ||f(X)||_F`` over the record domain.
    algorithm : {"unimodal", "equi-modal"}
        Alg. 1 or Alg. 2.

    Returns
    -------
    PrecisionBudget
        ``kind="squared"``.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Theorem 2, Theorem 5, Theorem 6, Alg. 1, Alg. 2.
    """
    _check_privacy(epsilon, delta)
    _check_positive("sensitivity", sensitivity)
    _check_positive("gamma", gamma)
    _check_square(algorithm, m, n)
    r = min(m, n)
    h_r = harmonic_number(r)
    h_half = harmonic_number(r, 0.5)
    z = zeta(delta, m, n)
    alpha = (h_r + h_half) * gamma**2 + 2.0 * h_r * gamma * sensitivity
    beta = 2.0 * (float(m) * float(n)) ** 0.25 * z * h_r * sensitivity
    bound = quadratic_root_bound(alpha, beta, epsilon)
    budget = bound**2 / n if algorithm == "unimodal" else bound
    return PrecisionBudget(
        calibration="mvg-thm2",
        kind="squared",
        budget=budget,
        bound=bound,
        alpha=alpha,
        beta=beta,
        zeta=z,
    )


def mvg_thm3_budget(
    *, m: int, epsilon: float, delta: float, sensitivity: float, gamma: float
) -> PrecisionBudget:
    """Precision budget of the MVG mechanism for a symmetric PSD query (``Psi = Sigma``).

    Thm. 3: ``||sigma(Sigma^-1)||_2^2 <= (-b + sqrt(b^2 + 8 w eps))^2 / (4 w^2)`` with
    ``w = 4 H_r gamma s_2`` and ``b = 2 sqrt(r) zeta(delta) H_r s_2``, ``r = m``; it is the budget
    on ``sum 1/v_i^2`` of Alg. 2 (Thm. 6).

    Parameters
    ----------
    m : int
        Query output is ``m x m`` symmetric PSD.
    epsilon, delta : float
        Privacy parameters.
    sensitivity : float
        ``s_2(f)``.
    gamma : float
        ``sup ||f(X)||_F``.

    Returns
    -------
    PrecisionBudget
        ``kind="squared"``; ``alpha`` holds ``omega``.

    References
    ----------
    .. [1] Chanyaswad et al., arXiv:1802.10077, Theorem 3, Theorem 6, Alg. 2.
    """
    _check_privacy(epsilon, delta)
    _check_positive("sensitivity", sensitivity)
    _check_positive("gamma", gamma)
    r = m
    h_r = harmonic_number(r)
    z = zeta(delta, m, m)
    omega = 4.0 * h_r * gamma * sensitivity
    beta = 2.0 * math.sqrt(r) * z * h_r * sensitivity
    bound = quadratic_root_bound(omega, beta, epsilon)
    return PrecisionBudget(
        calibration="mvg-thm3",
        kind="squared",
        budget=bound,
        bound=bound,
        alpha=omega,
        beta=beta,
        zeta=z,
    )


def mgm_budget(
    *, m: int, n: int, epsilon: float, delta: float, sensitivity: float, algorithm: Algorithm
) -> PrecisionBudget:
    """Precision budget of the Matrix Gaussian Mechanism's general condition.

    MGM Thm. 1: ``||U_1^-1||_F^2 ||U_2^-1||_F^2 <= B = (-b + sqrt(b^2 + 8 a eps))^2/(4 a^2)``,
    ``a = s_2^2``, ``b = 2 zeta(delta) s_2``. With ``||U^-1||_F^2 = tr(Sigma^-1) = sum 1/v_i``:
    unimodal (``U_2 = I_n``): ``sum 1/v_i <= B / n``; equi-modal (``U_2 = U_1``):
    ``(sum 1/v_i)^2 <= B``, i.e. ``sum 1/v_i <= sqrt(B)``.

    Parameters
    ----------
    m, n : int
        Query output shape.
    epsilon, delta : float
        Privacy parameters.
    sensitivity : float
        ``s_2(f)``.
    algorithm : {"unimodal", "equi-modal"}
        Noise type.

    Returns
    -------
    PrecisionBudget
        ``kind="linear"``.

    References
    ----------
    .. [1] J. Yang, L. Xiang, et al., "Matrix Gaussian Mechanisms for Differentially-Private
       Learning", IEEE TMC, Theorem 1, Eq. (11).
    """
    _check_privacy(epsilon, delta)
    _check_positive("sensitivity", sensitivity)
    _check_square(algorithm, m, n)
    z = zeta(delta, m, n)
    alpha = sensitivity**2
    beta = 2.0 * z * sensitivity
    bound = quadratic_root_bound(alpha, beta, epsilon)
    budget = bound / n if algorithm == "unimodal" else math.sqrt(bound)
    return PrecisionBudget(
        calibration="mgm", kind="linear", budget=budget, bound=bound, alpha=alpha, beta=beta, zeta=z
    )


def mgm_udn_budget(
    *, m: int, n: int, epsilon: float, delta: float, sensitivity: float
) -> PrecisionBudget:
    """Precision budget of MGM with unimodal directional noise (``U_2 = I``).

    MGM Thm. 2: ``||U_1^-1||_F^2 = sum 1/v_i <= (-b + sqrt(b^2 + 8 a eps))^2/(4 a^2)``,
    ``a = s_2^2``, ``b = 2 zeta(delta) s_2``: ``n`` times the unimodal budget of Thm. 1.

    Parameters
    ----------
    m, n : int
        Query output shape.
    epsilon, delta : float
        Privacy parameters.
    sensitivity : float
        ``s_2(f)``.

    Returns
    -------
    PrecisionBudget
        ``kind="linear"``.

    References
    ----------
    .. [1] Yang et al., "Matrix Gaussian Mechanisms for Differentially-Private Learning",
       Theorem 2 (UDN), Eq. (12).
    """
    _check_privacy(epsilon, delta)
    _check_positive("sensitivity", sensitivity)
    z = zeta(delta, m, n)
    alpha = sensitivity**2
    beta = 2.0 * z * sensitivity
    bound = quadratic_root_bound(alpha, beta, epsilon)
    return PrecisionBudget(
        calibration="mgm-udn",
        kind="linear",
        budget=bound,
        bound=bound,
        alpha=alpha,
        beta=beta,
        zeta=z,
    )


def mgm_idn_budget(
    *, m: int, n: int, epsilon: float, delta: float, entry_range: tuple[float, float]
) -> PrecisionBudget:
    """Precision budget of MGM with independent directional noise (diagonal ``U_1``, ``U_2 = I``).

    MGM Thm. 3: ``||U_1^-1||_F^2 <= m / s^2 (-zeta + sqrt(zeta^2 + 2 eps))^2`` with
    ``s = (b - a) sqrt(mn)`` when every entry of ``f(X)`` lies in ``[a, b]``.

    Parameters
    ----------
    m, n : int
        Query output shape.
    epsilon, delta : float
        Privacy parameters.
    entry_range : tuple of float
        ``(a, b)``, the range of every entry of the query output.

    Returns
    -------
    PrecisionBudget
        ``kind="linear"``; ``alpha`` holds ``s^2``, ``beta`` is ``None``.

    References
    ----------
    .. [1] Yang et al., "Matrix Gaussian Mechanisms for Differentially-Private Learning",
       Theorem 3 (IDN), Eq. (13).
    """
    _check_privacy(epsilon, delta)
    a, b = entry_range
    if not (math.isfinite(a) and math.isfinite(b) and b > a):
        raise ValueError(f"entry_range must be finite with lower < upper, got {entry_range!r}")
    z = zeta(delta, m, n)
    s_hat = (b - a) * math.sqrt(float(m) * float(n))
    # -z + sqrt(z^2 + 2 eps) == 2 eps / (z + sqrt(z^2 + 2 eps)), without cancellation
    root = 2.0 * epsilon / (z + math.sqrt(z * z + 2.0 * epsilon))
    bound = m / s_hat**2 * root**2
    return PrecisionBudget(
        calibration="mgm-idn",
        kind="linear",
        budget=bound,
        bound=bound,
        alpha=s_hat**2,
        beta=None,
        zeta=z,
    )


# ---------------------------------------------------------------------------------------------
# The analytic Gaussian mechanism (Balle & Wang 2018), used by the ``exact`` calibration.


def _log_ndtr() -> Callable[[float], float]:
    """scipy's ``log_ndtr`` ufunc (``log Phi``), without importing :mod:`scipy.special`.

    ``import scipy.special`` costs about 0.3 s of CPU (its array-API layer imports
    ``numpy.testing`` and more), several times a small release's own work; the ufunc itself
    lives in the compiled module ``scipy.special._special_ufuncs`` (which ``_ufuncs`` and the
    package re-export), which imports nothing else and loads in milliseconds. It is loaded
    under placeholder parent packages (``scipy.special``, and ``scipy`` itself unless it is
    already imported: its ``__init__`` costs more than the ufunc), held for the load only,
    under the interpreter's import lock (no other thread can import meanwhile), and what was
    loaded under them is forgotten: a later ``import scipy.special`` runs the packages as usual
    (the compiled module it loads is the same). The function is scipy's own, so every
    calibrated value is bit for bit what ``scipy.special.log_ndtr`` gives.
    """
    loaded = sys.modules.get("scipy.special")
    if loaded is not None and hasattr(loaded, "log_ndtr"):
        return loaded.log_ndtr
    return _load_ufuncs().log_ndtr


@functools.cache
def _load_ufuncs() -> ModuleType:
    """``scipy.special._special_ufuncs`` loaded under placeholder parents (see
    :func:`_log_ndtr`)."""
    import _imp
    import importlib
    import importlib.util
    import os

    _imp.acquire_lock()
    try:
        if "scipy.special" in sys.modules:  # imported meanwhile: the real package
            return importlib.import_module("scipy.special._special_ufuncs")
        real = sys.modules.get("scipy")
        spec = importlib.util.find_spec("scipy") if real is None else real.__spec__
        assert spec is not None and spec.origin is not None
        root = os.path.dirname(spec.origin)
        placeholders = [("scipy.special", os.path.join(root, "special"))]
        if real is None:
            placeholders.insert(0, ("scipy", root))
        before = set(sys.modules)
        for name, path in placeholders:
            module = ModuleType(name)
            module.__path__ = [path]
            module.__package__ = name
            sys.modules[name] = module
        try:
            return importlib.import_module("scipy.special._special_ufuncs")
        finally:
            # forget what was loaded under the placeholders: a later ``import scipy.special``
            # loads its modules as children of the real packages (the compiled module is the
            # same)
            for name in set(sys.modules) - before:
                if name.startswith("scipy.") or name == "scipy":
                    del sys.modules[name]
            if real is not None and "special" in vars(real):  # not getattr: lazy
                del real.special
    finally:
        _imp.release_lock()


def analytic_gaussian_delta(epsilon: float, mu: float) -> float:
    """Exact ``delta`` of a Gaussian mechanism with sensitivity/noise ratio ``mu`` at ``epsilon``.

    ``delta(eps, mu) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)``; the mechanism is
    ``(eps, delta)``-DP if and only if its delta is at least this.

    Parameters
    ----------
    epsilon : float
        ``epsilon >= 0``.
    mu : float
        ``Delta / sigma``; for the whitened MVG mechanism, the Mahalanobis sensitivity.

    Returns
    -------
    float
        The smallest ``delta`` for which the mechanism is ``(epsilon, delta)``-DP.

    References
    ----------
    .. [1] B. Balle, Y.-X. Wang, "Improving the Gaussian Mechanism for Differential Privacy:
       Analytical Calibration and Optimal Denoising", ICML 2018, Theorem 8.
    """
    if mu <= 0:
        return 0.0
    a = mu / 2.0 - epsilon / mu
    b = -mu / 2.0 - epsilon / mu
    log_ndtr = _log_ndtr()
    log_a = float(log_ndtr(a))
    if log_a == -math.inf:  # Phi(a) underflows (a huge epsilon): delta <= Phi(a) = 0
        return 0.0
    # Phi(a) - e^eps Phi(b) = Phi(a) (1 - exp(eps + log Phi(b) - log Phi(a))), in log space so
    # that the two nearly equal terms do not cancel
    gap = epsilon + float(log_ndtr(b)) - log_a
    if gap >= 0:
        return 0.0
    return max(math.exp(log_a) * -math.expm1(gap), 0.0)


def analytic_gaussian_mu(epsilon: float, delta: float, *, rtol: float = 1e-13) -> float:
    """Largest ``mu = Delta / sigma`` of a Gaussian mechanism that is ``(epsilon, delta)``-DP.

    Solved by bracketed bisection on the monotone map ``mu -> delta(epsilon, mu)`` and rounded
    toward more privacy: the returned ``mu`` always satisfies
    ``analytic_gaussian_delta(epsilon, mu) <= delta``.

    Parameters
    ----------
    epsilon, delta : float
        Privacy parameters.
    rtol : float, default 1e-13
        Relative width of the final bracket.

    Returns
    -------
    float
        ``mu*``.

    References
    ----------
    .. [1] Balle & Wang, ICML 2018, Theorem 8 and Algorithm 1.
    """
    _check_privacy(epsilon, delta)
    lo, hi = 0.0, 1.0
    while analytic_gaussian_delta(epsilon, hi) <= delta:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise ValueError(
                f"no noise can be calibrated for epsilon={epsilon:g}, delta={delta:g}: the "
                "Gaussian-DP mu exceeds 1e12, where the noise vanishes below floating-point "
                "resolution; choose a smaller epsilon"
            )
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:  # no float between them (a bracket among subnormals)
            break
        if analytic_gaussian_delta(epsilon, mid) <= delta:
            lo = mid
        else:
            hi = mid
    # a relative margin of 1e-10 (toward more privacy) keeps delta(eps, mu) <= delta robust to
    # the last-digit noise of evaluating delta at values within rounding of mu
    return lo * (1.0 - 1e-10)


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest ``epsilon`` at which a Gaussian mechanism with ratio ``mu`` is ``(eps, delta)``-DP.

    Parameters
    ----------
    mu : float
        ``Delta / sigma``.
    delta : float
        Target delta in (0, 1).

    Returns
    -------
    float
        ``epsilon`` (rounded up, toward less claimed privacy).
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if analytic_gaussian_delta(0.0, mu) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while analytic_gaussian_delta(hi, mu) > delta:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        if analytic_gaussian_delta(mid, mu) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Noise scale of the classic Gaussian mechanism, ``sqrt(2 ln(1.25/delta)) s / eps``.

    Valid (as a sufficient condition) only for ``epsilon < 1``; callers that use it above 1 are
    told so in the baseline's documentation.

    Parameters
    ----------
    epsilon, delta : float
        Privacy parameters.
    sensitivity : float
        L2 sensitivity.

    Returns
    -------
    float
        Standard deviation of each noise entry.

    References
    ----------
    .. [1] C. Dwork, A. Roth, "The Algorithmic Foundations of Differential Privacy", 2014,
       Theorem A.1.
    """
    _check_privacy(epsilon, delta)
    return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon
