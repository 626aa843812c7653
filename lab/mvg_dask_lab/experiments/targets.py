"""The two targets at ``epsilon = 1``, checked and explained from the run's own numbers.

1. The ``exact`` MVG row's error is at most the best valid baseline's at the same
   ``(epsilon, delta)``.
2. The ``exact`` MVG row's error is at least 10x below the paper-calibrated MVG row's.

Rows compared: the best ``exact`` row (kind ``exact``: the paper's primary design with the exact
calibration, i.e. binary allocation on the domain-knowledge features at the best ``tau``, and the
designs the product uses by default, e.g. the symmetric mechanism for a covariance; every design
is fixed from metadata, and the choice among them is made on the reported error, as the paper
chooses ``tau``; :func:`best_exact`); the best valid baseline (kind ``baseline``, calibration
with a proof at this epsilon: the classic Gaussian is excluded at epsilon >= 1); the best
paper-calibrated MVG row with the same design (``mvg-thm2``; Exp. II also ``mvg-thm3``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Final

from mvg_dask_lab.experiments.runner import REFERENCE_EPSILON, TAUS, ExperimentResult, Row

__all__ = [
    "PAPER_RATIO_TARGET",
    "TargetCheck",
    "best_exact",
    "check_targets",
    "fmt",
    "position",
]

#: Target 2: the paper-calibrated row must be at least this many times the exact row.
PAPER_RATIO_TARGET: Final = 10.0
_NOISE_DOMINATED: Final = 0.8


def fmt(x: float | None) -> str:
    """Format a number compactly (4 significant digits; scientific when very small or large)."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.3e}"
    return f"{x:.4g}"


def position(result: ExperimentResult, value: float) -> float:
    """Where ``value`` lies between our non-private (0) and random-guess (1) errors.

    Parameters
    ----------
    result : ExperimentResult
        The run (its ``non-private`` and ``random-guess`` rows).
    value : float
        An error.

    Returns
    -------
    float
        ``(value - non_private) / (random - non_private)``.
    """
    lo = result.row("non-private").mean
    hi = result.row("random-guess").mean
    return (value - lo) / (hi - lo)


@dataclass(frozen=True, kw_only=True, eq=False)
class TargetCheck:
    """Both targets of one experiment at ``epsilon = 1``.

    Attributes
    ----------
    experiment : str
        Experiment name.
    exact, baseline, paper : Row
        The best exact row (:func:`best_exact`), the best valid baseline and the best
        paper-calibrated MVG row.
    exact_design : Row
        The exact row with the paper-calibrated rows' design (binary allocation, best ``tau``):
        target 2 compares calibrations, so it compares like with like.
    ratio_exact_baseline : float
        ``exact / best baseline`` (target 1: <= 1).
    ratio_paper_exact : float
        ``paper-calibrated / exact_design`` (target 2: >= 10).
    met_baseline, met_paper : bool
        Whether each target is met.
    why_baseline, why_paper : str
        One paragraph each, built from the numbers of the run.
    """

    experiment: str
    exact: Row
    exact_design: Row
    baseline: Row
    paper: Row
    ratio_exact_baseline: float
    ratio_paper_exact: float
    met_baseline: bool
    met_paper: bool
    why_baseline: str
    why_paper: str


def _overlap(a: Row, b: Row) -> bool:
    return abs(a.mean - b.mean) <= a.ci + b.ci


def _sweep_text(row: Row) -> str:
    if not row.sweep:
        return ""
    means = [m for _, m, _ in row.sweep]
    taus = [t for t, _, _ in row.sweep]
    pairs = ", ".join(f"τ = {t:.2f}: {fmt(m)}" for t, m, _ in row.sweep)
    if row.tau == min(taus) and all(b >= a for a, b in itertools.pairwise(means)):
        return (
            f" The exact row's τ sweep is best at its smallest share and its error grows with τ "
            f"({pairs}): concentrating the precision on the domain-knowledge features does not "
            "help this metric. With the uniform allocation the exact plan *is* the iid analytic "
            f"Gaussian mechanism (same s₂, same noise), and the paper's τ grid (≥ {min(TAUS):g}) "
            "never reaches it."
        )
    return f" The exact row's τ sweep: {pairs}."


def _design(row: Row) -> str:
    """The exact row's label, and its ``tau`` where swept."""
    return row.method.label + ("" if row.tau is None else f", τ = {row.tau}")


def best_exact(result: ExperimentResult, epsilon: float = REFERENCE_EPSILON) -> Row:
    """The exact-calibration row with the smallest mean error at ``epsilon``.

    Parameters
    ----------
    result : ExperimentResult
        The run.
    epsilon : float, default 1.0
        Privacy parameter.

    Returns
    -------
    Row
        The row (the paper's design ``exact`` when no other exact row is better).

    Raises
    ------
    KeyError
        If the run has no exact row at ``epsilon``.
    """
    rows = [
        r
        for r in result.rows_at(epsilon)
        if r.method.kind == "exact" and r.evaluation.valid and math.isfinite(r.mean)
    ]
    if not rows:
        raise KeyError(f"{result.name}: no exact row at ε = {epsilon}")
    return min(rows, key=lambda r: (r.mean, r.method.key != "exact"))


def _why_baseline(result: ExperimentResult, exact: Row, base: Row, ratio: float) -> str:
    head = (
        f"Exact {fmt(exact.mean)} ± {fmt(exact.ci)} ({_design(exact)}) vs {base.method.label} "
        f"{fmt(base.mean)} ± {fmt(base.ci)}."
    )
    if exact.mean <= base.mean:
        return head
    parts = [head]
    if _overlap(exact, base):
        parts.append(" The difference lies within the two 95 % confidence intervals.")
    pe, pb = position(result, exact.mean), position(result, base.mean)
    if pe > _NOISE_DOMINATED and pb > _NOISE_DOMINATED:
        parts.append(
            f" Both errors sit near the random guess (positions {pe:.2f} and {pb:.2f} on the "
            "scale non-private = 0, random guess = 1): at ε = 1 the release is noise-dominated "
            "for this metric, whichever mechanism adds the noise."
        )
    parts.append(_sweep_text(exact))
    return "".join(parts)


def _why_paper(result: ExperimentResult, exact: Row, paper: Row, ratio: float) -> str:
    head = (
        f"{paper.method.label} {fmt(paper.mean)} ± {fmt(paper.ci)} (τ = {paper.tau}) vs exact "
        f"{fmt(exact.mean)} ± {fmt(exact.ci)} ({_design(exact)})."
    )
    if ratio >= PAPER_RATIO_TARGET:
        return head
    rand = result.row("random-guess").mean
    pp, pe = position(result, paper.mean), position(result, exact.mean)
    std = paper.evaluation.noise_std
    std_text = f" (noise std per entry {fmt(std[0])}–{fmt(std[1])})" if std else ""
    return (
        f"{head} The paper-calibrated row{std_text} is already at the random-guess "
        f"level (position {pp:.2f}; random guess {fmt(rand)}), and this metric is bounded near "
        f"that level, so the ratio cannot grow with more noise. Reaching "
        f"{PAPER_RATIO_TARGET:g}x would need "
        f"exact ≤ {fmt(paper.mean / PAPER_RATIO_TARGET)}, far below the error the exact plan "
        f"achieves at ε = 1 (position {pe:.2f})."
    )


def check_targets(result: ExperimentResult, epsilon: float = REFERENCE_EPSILON) -> TargetCheck:
    """Evaluate both targets on one experiment's rows at ``epsilon``.

    Parameters
    ----------
    result : ExperimentResult
        The run.
    epsilon : float, default 1.0
        Privacy parameter of the comparison.

    Returns
    -------
    TargetCheck
        Ratios, verdicts and explanations.

    Raises
    ------
    KeyError
        If the run has no exact, baseline or paper-calibrated row at ``epsilon``.
    """
    rows = result.rows_at(epsilon)
    exact = best_exact(result, epsilon)
    baselines = [r for r in rows if r.method.kind == "baseline" and r.evaluation.valid]
    papers = [r for r in rows if r.method.kind == "paper-mvg" and r.method.primary]
    if not baselines or not papers:
        raise KeyError(f"{result.name}: need baseline and paper-calibrated rows at ε = {epsilon}")
    base = min(baselines, key=lambda r: r.mean)
    paper = min(papers, key=lambda r: r.mean)
    r1 = exact.mean / base.mean if base.mean > 0 else math.inf
    design = result.row("exact", epsilon)
    r2 = paper.mean / design.mean if design.mean > 0 else math.inf
    return TargetCheck(
        experiment=result.name,
        exact=exact,
        exact_design=design,
        baseline=base,
        paper=paper,
        ratio_exact_baseline=r1,
        ratio_paper_exact=r2,
        met_baseline=exact.mean <= base.mean,
        met_paper=r2 >= PAPER_RATIO_TARGET,
        why_baseline=_why_baseline(result, exact, base, r1),
        why_paper=_why_paper(result, design, paper, r2),
    )
