"""Outputs of one experiment: CSV files, Markdown tables and plots (:mod:`.document`: the results
document).

Every number written here comes from an :class:`~mvg_dask_lab.experiments.runner.ExperimentResult`
of the current run, except the paper's reported values, which come from
:mod:`mvg_dask_lab.experiments.paper_values` and are always labelled as the paper's. The prose lives
in ``templates/*.md`` (``string.Template``); every ``$name`` in it is filled with a number or label
computed from the run.

Plots use Matplotlib's object API with the Agg canvas (no ``pyplot``, no global backend).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mvg_dask_lab.experiments.paper_values import PAPER_TABLES, PaperRow, PaperTable
from mvg_dask_lab.experiments.runner import (
    CONFIDENCE,
    REFERENCE_EPSILON,
    TAUS,
    ExperimentResult,
    Row,
)
from mvg_dask_lab.experiments.targets import (
    PAPER_RATIO_TARGET,
    TargetCheck,
    check_targets,
    fmt,
    position,
)

__all__ = [
    "CSV_FIELDS",
    "ExperimentFiles",
    "experiment_markdown",
    "write_experiment_files",
]

#: Columns of ``<experiment>.csv``.
CSV_FIELDS: tuple[str, ...] = (
    "experiment",
    "method",
    "label",
    "kind",
    "privacy",
    "epsilon",
    "delta",
    "tau",
    "trials",
    "mean",
    "ci95",
    "std",
    "noise_std_min",
    "noise_std_max",
    "implied_epsilon",
    "valid",
    "paper_mean",
    "paper_ci95",
)

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
#: One colour per method, the same in every plot.
_COLOURS = {
    "mvg-thm2": "tab:blue",
    "mvg-thm2-dppca": "tab:cyan",
    "mvg-thm3": "tab:purple",
    "mgm-udn": "tab:olive",
    "mgm-idn": "tab:brown",
    "exact": "tab:red",
    "exact-dppca": "tab:pink",
    "gaussian-classic": "tab:gray",
    "gaussian-analytic": "tab:green",
    "laplace": "tab:orange",
    "analyze-gauss": "black",
    "jl": "magenta",
    "blr": "darkgoldenrod",
    "ppca": "darkgoldenrod",
}


@dataclass(frozen=True, kw_only=True)
class ExperimentFiles:
    """Paths written for one experiment."""

    csv: Path
    sweep_csv: Path
    markdown: Path
    plot: Path


# ---------------------------------------------------------------------------------------------
# small helpers


def _num(x: float | None) -> str:
    """A number for a CSV cell (full precision, deterministic)."""
    if x is None:
        return ""
    return format(float(x), ".12g")


def _mean_ci(row: Row) -> str:
    return f"{fmt(row.mean)} ± {fmt(row.ci)}" if row.ci > 0 else fmt(row.mean)


def _unit(table: PaperTable) -> str:
    exponent = round(math.log10(table.scale))
    return f"×10{str(exponent).translate(_SUPERSCRIPT)}"


def _paper_cell(p: PaperRow | None) -> str:
    if p is None:
        return "-"
    head = f"~{p.mean:g}" if p.approximate else f"{p.mean:g}"
    return f"{head} ± {p.ci:g}" if p.ci is not None else head


def _paper_position(table: PaperTable, value: float) -> float | None:
    rows = table.by_method()
    lo, hi = rows.get("non-private"), rows.get("random-guess")
    if lo is None or hi is None or hi.mean == lo.mean:
        return None
    return (value - lo.mean) / (hi.mean - lo.mean)


def _paper_for(result: ExperimentResult, row: Row) -> PaperRow | None:
    if row.epsilon is not None and not math.isclose(row.epsilon, REFERENCE_EPSILON):
        return None
    return PAPER_TABLES[result.name].by_method().get(row.method.key)


def _paper_with_position(
    result: ExperimentResult, row: Row
) -> tuple[PaperRow | None, float | None]:
    """The paper's row matching ``row`` and its position on the paper's scale."""
    p = _paper_for(result, row)
    return p, None if p is None else _paper_position(PAPER_TABLES[result.name], p.mean)


def _pos_cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def _short(result: ExperimentResult) -> str:
    """``"Exp. I"`` etc.: the title up to its colon."""
    return result.title.split(":")[0]


def _std_cell(row: Row) -> str:
    std = row.evaluation.noise_std
    if std is None:
        return "-"
    lo, hi = std
    return fmt(lo) if math.isclose(lo, hi, rel_tol=1e-9) else f"{fmt(lo)} – {fmt(hi)}"


def _eps_cell(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.3g}"


def _label(row: Row) -> str:
    mark = " †" if not row.evaluation.valid else ""
    return f"{row.method.label}{mark}"


def _template(name: str, **values: object) -> str:
    """Fill ``templates/<name>.md`` with computed values (``string.Template``, ``$name``)."""
    text = resources.files("mvg_dask_lab.experiments").joinpath(f"templates/{name}.md")
    raw = text.read_text(encoding="utf-8").rstrip("\n")
    return Template(raw).substitute({k: str(v) for k, v in values.items()})


def _rel(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


# ---------------------------------------------------------------------------------------------
# CSV


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def experiment_csv(result: ExperimentResult) -> str:
    """All rows of one experiment as CSV text (columns :data:`CSV_FIELDS`)."""
    table = PAPER_TABLES[result.name]
    lines = []
    for row in result.rows:
        paper = _paper_for(result, row)
        std = row.evaluation.noise_std
        lines.append(
            [
                result.name,
                row.method.key,
                row.method.label,
                row.method.kind,
                row.method.privacy,
                _num(row.epsilon),
                _num(row.delta),
                _num(row.tau),
                row.errors.size,
                _num(row.mean),
                _num(row.ci),
                _num(row.std),
                _num(None if std is None else std[0]),
                _num(None if std is None else std[1]),
                _num(row.evaluation.implied_epsilon),
                str(row.evaluation.valid).lower(),
                _num(None if paper is None else paper.mean * table.scale),
                _num(None if paper is None or paper.ci is None else paper.ci * table.scale),
            ]
        )
    return _csv_text(CSV_FIELDS, lines)


def sweep_csv(result: ExperimentResult) -> str:
    """The ``tau`` sweeps of one experiment as CSV text."""
    return _csv_text(
        ["experiment", "method", "epsilon", "tau", "mean", "ci95", "chosen"],
        (
            [
                result.name,
                row.method.key,
                _num(row.epsilon),
                _num(tau),
                _num(mean),
                _num(ci),
                str(row.tau is not None and math.isclose(tau, row.tau)).lower(),
            ]
            for row in result.rows
            for tau, mean, ci in row.sweep
        ),
    )


# ---------------------------------------------------------------------------------------------
# plot


def plot_experiment(result: ExperimentResult, path: Path) -> None:
    """Error versus epsilon, one line per method, saved as PNG.

    Parameters
    ----------
    result : ExperimentResult
        The run.
    path : pathlib.Path
        Output file.
    """
    fig = Figure(figsize=(10.0, 5.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    eps = np.array(result.epsilons)
    styles = {"paper-mvg": "-", "mgm": "-.", "exact": "-", "baseline": "--"}
    markers = {"paper-mvg": "s", "mgm": "^", "exact": "o", "baseline": "D"}
    for method in result.methods:
        if method.kind == "reference":
            continue
        rows = [result.row(method.key, e) for e in eps]
        mean = np.array([r.mean for r in rows])
        ci = np.array([r.ci for r in rows])
        lower = np.minimum(ci, 0.999 * mean)
        label = method.label + (" (no proof for ε ≥ 1)" if method.key == "gaussian-classic" else "")
        ax.errorbar(
            eps,
            mean,
            yerr=np.vstack([lower, ci]),
            label=label,
            capsize=3,
            linestyle=styles[method.kind],
            marker=markers[method.kind],
            markersize=4,
            linewidth=2.2 if method.kind == "exact" else 1.2,
            color=_COLOURS.get(method.key),
        )
    rand = result.row("random-guess").mean
    ax.axhline(rand, color="grey", linestyle=":", label=f"Random guess ({fmt(rand)})")
    nonpriv = result.row("non-private").mean
    if nonpriv > 0:
        ax.axhline(nonpriv, color="black", linestyle=":", label=f"Non-private ({fmt(nonpriv)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(eps)
    ax.set_xticklabels([f"{e:g}" for e in eps])
    ax.set_xlabel("ε (δ = 1/N)")
    ax.set_ylabel(f"{result.metric} (mean, {CONFIDENCE:.0%} CI)")
    ax.set_title(f"{result.title}\n{result.trials} trials per point", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.savefig(path, bbox_inches="tight")


# ---------------------------------------------------------------------------------------------
# Markdown


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _epsilon_table(result: ExperimentResult, paper: PaperTable) -> str:
    header = [
        "Method",
        "Privacy",
        "τ",
        f"{result.metric}: mean ± 95 % CI",
        f"Paper, {paper.table} ({_unit(paper)})",
        "Position: ours / paper",
        "Noise std per entry",
        "Implied ε",
    ]
    body = []
    for row in result.rows_at(REFERENCE_EPSILON):
        p, paper_pos = _paper_with_position(result, row)
        pos = f"{position(result, row.mean):.3g} / {_pos_cell(paper_pos)}"
        body.append(
            [
                _label(row),
                row.method.privacy,
                "-" if row.tau is None else f"{row.tau:.2f}",
                _mean_ci(row),
                _paper_cell(p),
                pos,
                _std_cell(row),
                _eps_cell(row.evaluation.implied_epsilon),
            ]
        )
    return _table(header, body)


def _sweep_table(result: ExperimentResult) -> str:
    eps = result.epsilons
    header = ["Method", *[f"ε = {e:g}" for e in eps]]
    body = []
    for method in result.methods:
        cells = []
        for e in eps:
            row = result.row(method.key, e)
            cell = _mean_ci(row)
            if row.tau is not None:
                cell += f" (τ {row.tau:.2f})"
            if not row.evaluation.valid:
                cell += " †"
            cells.append(cell)
        body.append([method.label, *cells])
    return _table(header, body)


def _targets_block(check: TargetCheck) -> str:
    return "\n".join(
        [
            f"- exact ≤ best valid baseline: **{_met(check.met_baseline)}**, ratio exact / "
            f"baseline = {check.ratio_exact_baseline:.3g}. {check.why_baseline.strip()}",
            f"- exact ≥ {PAPER_RATIO_TARGET:g}x below the paper-calibrated MVG: "
            f"**{_met(check.met_paper)}**, ratio "
            f"paper / exact = {check.ratio_paper_exact:.3g}. {check.why_paper.strip()}",
        ]
    )


def experiment_markdown(result: ExperimentResult, plot_link: str, *, level: int = 2) -> str:
    """The Markdown section of one experiment.

    Parameters
    ----------
    result : ExperimentResult
        The run.
    plot_link : str
        Relative link to the plot.
    level : int, default 2
        Heading level of the section title.

    Returns
    -------
    str
        Markdown text.
    """
    paper = PAPER_TABLES[result.name]
    h, hh = "#" * level, "#" * (level + 1)
    unmatched = [r for r in paper.rows if r.ours is None]
    settings = "\n".join(f"- {k}: {v}" for k, v in result.settings.items())
    details = "\n".join(f"- `{m.key}`: {m.description}" for m in result.methods if m.description)
    parts = [
        f"{h} {result.title}",
        "",
        f"{result.dataset}: M = {result.features} features x N = {result.records:,} records, "
        f"δ = 1/N = {fmt(result.delta)}; {result.trials} trials per setting; noise seed "
        f"{result.seed}; run time {result.elapsed:.1f} s.",
        "",
        settings,
        "",
        f"{hh} ε = {REFERENCE_EPSILON:g}, δ = 1/N (the paper's {paper.table})",
        "",
        _epsilon_table(result, paper),
        "",
        _template("epsilon_notes", taus=", ".join(f"{t:g}" for t in TAUS)),
        "",
    ]
    if unmatched:
        listed = "; ".join(f"{r.label}: {_paper_cell(r)} {_unit(paper)}" for r in unmatched)
        parts += [f"Paper rows without a counterpart here: {listed}.", ""]
    parts += [
        "Rows:",
        "",
        details,
        "",
        f"{hh} Targets at ε = {REFERENCE_EPSILON:g}",
        "",
        _targets_block(check_targets(result)),
        "",
        f"{hh} Error versus ε (δ = 1/N)",
        "",
        _sweep_table(result),
        "",
        f"![{result.metric} versus ε]({plot_link})",
        "",
    ]
    return "\n".join(parts)


def write_experiment_files(result: ExperimentResult, out_dir: Path) -> ExperimentFiles:
    """Write ``<name>.csv``, ``<name>_tau_sweep.csv``, ``<name>.md`` and ``<name>.png``.

    Parameters
    ----------
    result : ExperimentResult
        The run.
    out_dir : pathlib.Path
        Output directory (created if needed).

    Returns
    -------
    ExperimentFiles
        The paths written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ExperimentFiles(
        csv=out_dir / f"{result.name}.csv",
        sweep_csv=out_dir / f"{result.name}_tau_sweep.csv",
        markdown=out_dir / f"{result.name}.md",
        plot=out_dir / f"{result.name}.png",
    )
    files.csv.write_text(experiment_csv(result), encoding="utf-8")
    files.sweep_csv.write_text(sweep_csv(result), encoding="utf-8")
    plot_experiment(result, files.plot)
    files.markdown.write_text(
        experiment_markdown(result, files.plot.name, level=1), encoding="utf-8"
    )
    return files
