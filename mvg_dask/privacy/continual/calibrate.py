"""A stream's noise and its comparison with other ways of spending the same budget.

The whole stream is one Gaussian mechanism ``y = C g + Z`` with L2 sensitivity
``‖C‖_{1→2} Δ = max_s ‖C[:, s]‖₂ Δ`` (docs/bounds.md, "Continual releases"): calibrated once
with the analytic Gaussian (Balle & Wang 2018) for the stream's ``(ε, δ)``, exactly like a
one-shot release of sensitivity ``Δ``. Period ``t`` publishes ``x̂_t = B[t] y`` with std
``σ ‖B[t]‖₂`` per entry (in whitened units).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mvg_dask.privacy.calibration import analytic_gaussian_mu
from mvg_dask.privacy.continual.factorizations import (
    DEFAULT_BITS,
    Factorization,
    NaiveFactorization,
    ToeplitzFactorization,
    TreeFactorization,
)


def one_shot_std(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Noise std of a one-shot ``(ε, δ)`` Gaussian release with L2 sensitivity ``sensitivity``.

    Parameters
    ----------
    epsilon, delta : float
        The budget.
    sensitivity : float, default 1.0
        ``Δ`` (whitened: ``Δ_M``).

    Returns
    -------
    float
        ``Δ / μ*(ε, δ)``.
    """
    return sensitivity / analytic_gaussian_mu(epsilon, delta)


def stream_std(
    factorization: Factorization, epsilon: float, delta: float, sensitivity: float = 1.0
) -> float:
    """Noise std ``σ`` of every output ``y`` of a stream calibrated for ``(ε, δ)`` in all.

    Parameters
    ----------
    factorization : Factorization
        The stream's factorization.
    epsilon, delta : float
        The whole stream's budget (its whole horizon).
    sensitivity : float, default 1.0
        ``Δ``: one record's effect on one period's increment (whitened ``Δ_M``).

    Returns
    -------
    float
        ``max_s ‖C[:, s]‖₂ Δ / μ*(ε, δ)``.
    """
    return one_shot_std(epsilon, delta, factorization.sensitivity() * sensitivity)


def period_std(
    factorization: Factorization, t: int, epsilon: float, delta: float, sensitivity: float = 1.0
) -> float:
    """Published noise std of period ``t``'s estimate: ``σ ‖B[t]‖₂``.

    Parameters
    ----------
    factorization : Factorization
        The stream's factorization.
    t : int
        The period.
    epsilon, delta : float
        The whole stream's budget.
    sensitivity : float, default 1.0
        ``Δ``.

    Returns
    -------
    float
        The std per entry (whitened units).
    """
    sigma = stream_std(factorization, epsilon, delta, sensitivity)
    return sigma * factorization.period_std_factor(t)


@dataclass(frozen=True)
class ComparisonRow:
    """One way of releasing ``T`` prefix sums on one ``(ε, δ)``.

    Attributes
    ----------
    method : str
        Its name.
    sensitivity : float
        L2 sensitivity per unit ``Δ`` of what it releases (per release for the split naive).
    worst_std_factor : float
        ``max_t ‖B[t]‖₂``.
    ratio : float
        Worst-period std over the std of a one-shot release at the same ``(ε, δ)``.
    state_matrices : int
        Increment-sized arrays the curator keeps between periods.
    """

    method: str
    sensitivity: float
    worst_std_factor: float
    ratio: float
    state_matrices: int


def _row(method: str, f: Factorization, epsilon: float, delta: float) -> ComparisonRow:
    ratio = stream_std(f, epsilon, delta) * f.worst_std_factor() / one_shot_std(epsilon, delta)
    return ComparisonRow(method, f.sensitivity(), f.worst_std_factor(), ratio, f.state_matrices())


def compare_at_budget(
    horizon: int, epsilon: float, delta: float, *, bits: int = DEFAULT_BITS, band: int = 32
) -> tuple[ComparisonRow, ...]:
    """Worst-period std of each method relative to a one-shot release, same total budget.

    Rows: naive re-release with the budget split by basic composition (``ε/T, δ/T`` per
    release, calibrated with the analytic Gaussian); naive re-release under exact Gaussian
    composition (``C = A``: one Gaussian mechanism of sensitivity ``√T``); the tree with the
    dyadic decoder and with Honaker's; the square root; the square root banded to ``band``.

    Parameters
    ----------
    horizon : int
        ``T``.
    epsilon, delta : float
        The total budget.
    bits : int, default 12
        Dyadic precision of the square-root coefficients.
    band : int, default 32
        Coefficients kept by the banded square root.

    Returns
    -------
    tuple of ComparisonRow
        In the order above.
    """
    one = one_shot_std(epsilon, delta)
    split = one_shot_std(epsilon / horizon, delta / horizon)
    rows = [ComparisonRow("naive, ε/T and δ/T per period", 1.0, 1.0, split / one, 1)]
    methods: list[tuple[str, Factorization]] = [
        ("naive, Gaussian composition", NaiveFactorization(horizon)),
        ("tree, dyadic decoder", TreeFactorization(horizon, decoder="dyadic")),
        ("tree, Honaker decoder", TreeFactorization(horizon, decoder="honaker")),
        ("square root", ToeplitzFactorization(horizon, bits=bits)),
        (f"square root, banded ({band})", ToeplitzFactorization(horizon, bits=bits, band=band)),
    ]
    rows += [_row(name, f, epsilon, delta) for name, f in methods]
    return tuple(rows)


def comparison_table(
    horizons: Sequence[int], epsilon: float, delta: float, *, band: int = 32
) -> str:
    """A Markdown table of :func:`compare_at_budget`'s ratios, one column per horizon.

    Parameters
    ----------
    horizons : sequence of int
        The horizons ``T``.
    epsilon, delta : float
        The total budget.
    band : int, default 32
        Coefficients kept by the banded square root.

    Returns
    -------
    str
        The table (docs/bounds.md prints it; a test checks that it matches).
    """
    columns = [compare_at_budget(t, epsilon, delta, band=band) for t in horizons]
    head = "| method | " + " | ".join(f"T = {t:,}" for t in horizons) + " |"
    rule = "|---|" + "---:|" * len(horizons)
    lines = [head, rule]
    for i, row in enumerate(columns[0]):
        cells = " | ".join(f"{col[i].ratio:.2f}×" for col in columns)
        lines.append(f"| {row.method} | {cells} |")
    return "\n".join(lines)


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def state_table(horizon: int, ms: Sequence[int], *, band: int = 32) -> str:
    """A Markdown table of the curator-side state between periods (``int64`` ``m x m`` arrays).

    Parameters
    ----------
    horizon : int
        ``T``.
    ms : sequence of int
        Increment sizes ``m`` (an ``m x m`` increment per period).
    band : int, default 32
        Coefficients kept by the banded square root.

    Returns
    -------
    str
        The table (docs/bounds.md prints it; a test checks that it matches).
    """
    methods: list[tuple[str, Factorization]] = [
        ("naive (running total)", NaiveFactorization(horizon)),
        ("tree (open nodes)", TreeFactorization(horizon)),
        ("square root (history)", ToeplitzFactorization(horizon)),
        (f"square root, banded ({band})", ToeplitzFactorization(horizon, band=band)),
    ]
    head = "| factorization | arrays kept | " + " | ".join(f"m = {m:,}" for m in ms) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(ms)]
    for name, f in methods:
        cells = " | ".join(_human(f.state_bytes(m)) for m in ms)
        lines.append(f"| {name} | {f.state_matrices()} | {cells} |")
    return "\n".join(lines)
