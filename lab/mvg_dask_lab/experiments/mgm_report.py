"""Outputs of the MGM learning experiments: ``mgm.csv``, ``mgm.md`` (the tables and the check
of the paper's claims) and ``mgm.png`` (accuracy over epsilon, one panel per setting).

Every number comes from the :class:`~mvg_dask_lab.experiments.mgm.MgmResult` of the run.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mvg_dask_lab.experiments.mgm import DELTA, MgmResult, describe

__all__ = ["Claim", "MgmFiles", "check_claims", "mgm_markdown", "write_mgm_files"]

#: The rows of the same-privacy table (the paper's per-element Gaussian is the second table's).
SAME_PRIVACY = ("gaussian", "exact", "mvg", "mgm", "udn", "idn")
#: The rows of the paper's-accounting table.
PAPER_ACCOUNTING = ("gaussian-per-element", "mvg", "udn", "idn")
_COLOURS = {
    "gaussian": "tab:blue",
    "exact": "tab:cyan",
    "mvg": "tab:red",
    "mgm": "tab:olive",
    "udn": "tab:purple",
    "idn": "tab:green",
    "gaussian-per-element": "tab:gray",
}


@dataclass(frozen=True)
class MgmFiles:
    """Where the outputs were written."""

    csv: Path
    markdown: Path
    plot: Path


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims on one setting, as measured."""

    setting: str
    accounting: str
    claim: str
    agreed: bool
    evidence: str


def _cell(result: MgmResult, setting: str, mechanism: str, eps: float | None) -> str:
    p = result.point(setting, mechanism, eps)
    return f"{p.mean:.3f} ± {p.std:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _mean_over_eps(result: MgmResult, setting: str, mechanism: str) -> float:
    return float(np.mean([result.point(setting, mechanism, e).mean for e in result.epsilons]))


def check_claims(result: MgmResult) -> list[Claim]:
    """The paper's two claims (IDN best overall; Gaussian above MVG) on every setting, under
    both accountings, by the mean test accuracy over the epsilon grid."""
    claims = []
    for s in result.settings:
        name = s.name
        for accounting, gauss, rows in (
            ("same total (epsilon, delta)", "gaussian", SAME_PRIVACY),
            ("paper's (Gaussian per element)", "gaussian-per-element", PAPER_ACCOUNTING),
        ):
            means = {m: _mean_over_eps(result, name, m) for m in rows}
            best = max(means, key=lambda m: means[m])
            claims.append(
                Claim(
                    name,
                    accounting,
                    "IDN best overall",
                    means["idn"] >= means[best] - 1e-12,
                    f"IDN {means['idn']:.3f}; best {best} {means[best]:.3f}",
                )
            )
            claims.append(
                Claim(
                    name,
                    accounting,
                    "Gaussian above MVG",
                    means[gauss] > means["mvg"],
                    f"{gauss} {means[gauss]:.3f}; MVG {means['mvg']:.3f}",
                )
            )
    return claims


def mgm_markdown(result: MgmResult, *, command: str) -> str:
    """The tables of a run, in Markdown."""
    eps = [f"ε = {e:g}" for e in result.epsilons]
    parts = [
        f"Made by `{command}` ({result.seeds} seeded runs per point, δ = {DELTA:g}, "
        f"{result.elapsed:.0f} s). Cells: test accuracy, mean ± standard deviation.",
        "",
        "### Settings",
        "",
        _table(
            ["setting", "train", "test", "participants", "upload", "rounds", "q", "C", "s₂"],
            [
                [
                    d["setting"],
                    str(d["train"]),
                    str(d["test"]),
                    str(d["participants"]),
                    d["shape"],
                    str(d["rounds"]),
                    f"{d['sampling']:g}",
                    f"{d['clip']:g}",
                    f"{d['s2']:.3g}",
                ]
                for d in map(describe, result.settings)
            ],
        ),
    ]
    for s in result.settings:
        name = s.name
        ceiling = result.point(name, "non-private", None)
        same = [[m, *[_cell(result, name, m, e) for e in result.epsilons]] for m in SAME_PRIVACY]
        paper = [
            [m, *[_cell(result, name, m, e) for e in result.epsilons]] for m in PAPER_ACCOUNTING
        ]
        stds = [
            [m, *[f"{result.point(name, m, e).noise_std:.3g}" for e in result.epsilons]]
            for m in (*SAME_PRIVACY, "gaussian-per-element")
        ]
        parts += [
            "",
            f"### {name}",
            "",
            f"Non-private ceiling: {ceiling.mean:.3f} ± {ceiling.std:.3f}; majority class: "
            f"{_majority(s.data.y_test):.3f}.",
            "",
            "Every mechanism at the same total (ε, δ) per participant, composed by "
            "dp-accounting's PLD with Poisson-sampling amplification:",
            "",
            _table(["mechanism", *eps], same),
            "",
            "The paper's accounting (its Sec. 8.2): the Gaussian baseline's ε is per element "
            "of the matrix and per round (not the privacy of the other rows):",
            "",
            _table(["mechanism", *eps], paper),
            "",
            "Noise standard deviation per entry (root mean square over the entries):",
            "",
            _table(["mechanism", *eps], stds),
        ]
    claims = check_claims(result)
    parts += [
        "",
        "### The paper's claims",
        "",
        _table(
            ["setting", "accounting", "claim", "agreed", "mean accuracy over ε"],
            [
                [c.setting, c.accounting, c.claim, "yes" if c.agreed else "no", c.evidence]
                for c in claims
            ],
        ),
    ]
    return "\n".join(parts) + "\n"


def _majority(y: np.ndarray) -> float:
    return float(np.bincount(y).max() / len(y))


def mgm_csv(result: MgmResult) -> str:
    """One line per point and seeded run."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["setting", "mechanism", "epsilon", "delta", "run", "accuracy", "noise_std"])
    for p in result.points:
        for i, acc in enumerate(p.accuracies):
            w.writerow(
                [
                    p.setting,
                    p.mechanism,
                    "" if p.epsilon is None else repr(p.epsilon),
                    "" if p.epsilon is None else repr(DELTA),
                    i,
                    repr(acc),
                    "" if p.noise_std is None else repr(p.noise_std),
                ]
            )
    return out.getvalue()


def plot_mgm(result: MgmResult, path: Path) -> None:
    """Accuracy over epsilon per setting (mean and spread), with the non-private ceiling."""
    k = len(result.settings)
    fig = Figure(figsize=(4.2 * k, 3.6))
    FigureCanvasAgg(fig)
    for i, s in enumerate(result.settings):
        ax = fig.add_subplot(1, k, i + 1)
        for m in (*SAME_PRIVACY, "gaussian-per-element"):
            pts = [result.point(s.name, m, e) for e in result.epsilons]
            mean = np.array([p.mean for p in pts])
            std = np.array([p.std for p in pts])
            style = "--" if m == "gaussian-per-element" else "-"
            ax.plot(result.epsilons, mean, style, marker="o", ms=3, label=m, color=_COLOURS[m])
            ax.fill_between(result.epsilons, mean - std, mean + std, alpha=0.12, color=_COLOURS[m])
        top = result.point(s.name, "non-private", None).mean
        ax.axhline(top, color="black", lw=0.8, ls=":", label="non-private")
        ax.set_xscale("log")
        ax.set_xlabel("total ε per participant")
        ax.set_title(s.name)
        if i == 0:
            ax.set_ylabel("test accuracy")
    fig.axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_mgm_files(result: MgmResult, out_dir: Path, *, command: str) -> MgmFiles:
    """Write ``mgm.csv``, ``mgm.md`` and ``mgm.png`` into ``out_dir`` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = MgmFiles(out_dir / "mgm.csv", out_dir / "mgm.md", out_dir / "mgm.png")
    files.csv.write_text(mgm_csv(result))
    files.markdown.write_text(mgm_markdown(result, command=command))
    plot_mgm(result, files.plot)
    return files
