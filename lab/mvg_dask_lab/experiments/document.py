"""The results document: the three experiments, the summary and the explanations.

The prose lives in ``templates/*.md`` (``string.Template``); every ``$name`` in it is filled with a
number or label computed from the run, except the paper's reported values, which come from
:mod:`mvg_dask_lab.experiments.paper_values` and are always labelled as the paper's.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from mvg_dask.privacy.allocation import max_pnr
from mvg_dask_lab.experiments.literature import BLR_CANDIDATES, BLR_GRID, BLR_SIZE
from mvg_dask_lab.experiments.paper_values import PAPER_TABLES
from mvg_dask_lab.experiments.report import (
    ExperimentFiles,
    _eps_cell,
    _mean_ci,
    _met,
    _paper_cell,
    _paper_with_position,
    _pos_cell,
    _rel,
    _short,
    _std_cell,
    _table,
    _template,
    _unit,
    experiment_markdown,
)
from mvg_dask_lab.experiments.runner import REFERENCE_EPSILON, TAUS, ExperimentResult, Row
from mvg_dask_lab.experiments.targets import (
    PAPER_RATIO_TARGET,
    best_exact,
    check_targets,
    fmt,
    position,
)

__all__ = ["results_document", "write_results_document"]

# ---------------------------------------------------------------------------------------------
# results document


def _summary_table(results: Sequence[ExperimentResult]) -> str:
    header = [
        "Experiment",
        "Metric",
        "Non-private",
        "Random guess",
        "Paper-calibrated MVG",
        "Exact MVG",
        "Best valid baseline",
        "exact / baseline (≤ 1)",
        f"paper MVG / exact (≥ {PAPER_RATIO_TARGET:g})",
    ]
    body = []
    for res in results:
        c = check_targets(res)
        body.append(
            [
                _short(res),
                res.metric,
                fmt(res.row("non-private").mean),
                fmt(res.row("random-guess").mean),
                f"{_mean_ci(c.paper)} ({c.paper.method.key})",
                f"{_mean_ci(c.exact)} ({c.exact.method.key})",
                f"{_mean_ci(c.baseline)} ({c.baseline.method.key})",
                f"{c.ratio_exact_baseline:.3g} ({_met(c.met_baseline)})",
                f"{c.ratio_paper_exact:.3g} ({_met(c.met_paper)})",
            ]
        )
    return _table(header, body)


def _best_baseline(res: ExperimentResult, eps: float) -> Row | None:
    rows = [r for r in res.rows_at(eps) if r.method.kind == "baseline" and r.evaluation.valid]
    return min(rows, key=lambda r: r.mean) if rows else None


def _sweep_table(results: Sequence[ExperimentResult]) -> tuple[str, str]:
    """Best exact design against the best valid baseline at every epsilon of the run."""
    header = ["Experiment", "ε", "Best exact design", "Best valid baseline", "ratio", "Verdict"]
    body = []
    beyond = []
    for res in results:
        for eps in res.epsilons:
            exact, base = best_exact(res, eps), _best_baseline(res, eps)
            if base is None:
                continue
            if exact.mean <= base.mean:
                verdict = "exact smaller"
            elif _overlap(exact, base):
                verdict = "exact larger, within the 95 % CIs"
            else:
                verdict = "exact larger, beyond the 95 % CIs"
                beyond.append(f"{_short(res)} at ε = {eps:g}")
            body.append(
                [
                    _short(res),
                    f"{eps:g}",
                    f"{_mean_ci(exact)} ({exact.method.key})",
                    f"{_mean_ci(base)} ({base.method.key})",
                    _ratio(exact.mean, base.mean),
                    verdict,
                ]
            )
    text = (
        "Exact is above the best valid baseline beyond the confidence intervals at: "
        + ", ".join(beyond)
        + "."
        if beyond
        else "Exact is never above the best valid baseline beyond the 95 % confidence intervals."
    )
    return _table(header, body), text


def _noise_table(results: Sequence[ExperimentResult]) -> str:
    header = [
        "Experiment",
        "Row",
        "Query entries in",
        "Noise std per entry",
        "Implied ε",
        "Error (ours)",
        "Position (ours)",
        "Paper's error",
        "Position (paper)",
    ]
    body = []
    for res in results:
        paper = PAPER_TABLES[res.name]
        lo, hi = res.output_range
        for row in res.rows_at(REFERENCE_EPSILON):
            if row.method.kind not in ("paper-mvg", "exact"):
                continue
            p, ppos = _paper_with_position(res, row)
            body.append(
                [
                    _short(res),
                    row.method.label,
                    f"[{lo:g}, {hi:g}]",
                    _std_cell(row),
                    _eps_cell(row.evaluation.implied_epsilon),
                    _mean_ci(row),
                    f"{position(res, row.mean):.3g}",
                    "-" if p is None else f"{_paper_cell(p)} {_unit(paper)}",
                    _pos_cell(ppos),
                ]
            )
    return _table(header, body)


def _scale_table(results: Sequence[ExperimentResult]) -> str:
    header = [
        "Experiment",
        "Non-private: ours / paper",
        "Random guess: ours / paper",
        "Random / non-private: ours / paper",
    ]
    body = []
    for res in results:
        paper = PAPER_TABLES[res.name].by_method()
        scale = PAPER_TABLES[res.name].scale
        npv, rnd = res.row("non-private").mean, res.row("random-guess").mean
        pn, pr = paper["non-private"].mean * scale, paper["random-guess"].mean * scale
        ratio_ours = f"{rnd / npv:.3g}" if npv > 0 else "∞ (non-private = 0)"
        ratio_paper = f"{pr / pn:.3g}" if pn > 0 else "∞"
        body.append(
            [
                _short(res),
                f"{fmt(npv)} / {fmt(pn)}",
                f"{fmt(rnd)} / {fmt(pr)}",
                f"{ratio_ours} / {ratio_paper}",
            ]
        )
    return _table(header, body)


def _paper_positions_text(results: Sequence[ExperimentResult]) -> str:
    lines = []
    for res in results:
        for row in res.rows_at(REFERENCE_EPSILON):
            p, ppos = _paper_with_position(res, row)
            if row.method.kind != "paper-mvg" or p is None:
                continue
            lines.append(
                f"- {_short(res)}, {row.method.label}: ours "
                f"{position(res, row.mean):.3g}, the paper's {_pos_cell(ppos)}."
            )
    return "\n".join(lines)


def _exact_positions_text(results: Sequence[ExperimentResult]) -> str:
    lines = []
    for res in results:
        check = check_targets(res)
        _, ppos = _paper_with_position(res, check.paper)
        if ppos is None:
            continue
        epos = position(res, check.exact_design.mean)
        relation = "above" if epos > ppos else "below"
        lines.append(
            f"- {_short(res)}: exact at {epos:.3g}, {relation} the paper's "
            f"{check.paper.method.label} row at {ppos:.3g}."
        )
    return "\n".join(lines)


def _row_or_none(res: ExperimentResult, key: str, eps: float) -> Row | None:
    try:
        return res.row(key, eps)
    except KeyError:
        return None


def _directional_text(results: Mapping[str, ExperimentResult]) -> str:
    lines = []
    for res in results.values():
        check = check_targets(res)
        exact, base = check.exact_design, check.baseline
        sweep = ", ".join(f"{t:.2f}: {fmt(m)}" for t, m, _ in exact.sweep)
        lines.append(
            f"- {_short(res)}: exact (binary, best τ = {exact.tau:.2f}) "
            f"{_mean_ci(exact)} vs {base.method.label} {_mean_ci(base)}; exact's τ sweep at "
            f"ε = 1: {sweep}."
        )
        if check.exact is not exact:
            lines.append(
                f"  The best exact design, {check.exact.method.label}: {_mean_ci(check.exact)}."
            )
        high = max(res.epsilons)
        e_hi = _row_or_none(res, "exact", high)
        b_hi = _row_or_none(res, base.method.key, high)
        if e_hi is not None and b_hi is not None:
            lines.append(
                f"  At ε = {high:g}: exact {_mean_ci(e_hi)} vs {base.method.label} "
                f"{_mean_ci(b_hi)}."
            )
    return "\n".join(lines)


def _dppca_text(results: Mapping[str, ExperimentResult]) -> str:
    res = results.get("regression")
    if res is None:
        return ""
    lines = []
    for key in ("mvg-thm2-dppca", "exact-dppca"):
        row = _row_or_none(res, key, REFERENCE_EPSILON)
        partner = _row_or_none(res, key.removesuffix("-dppca"), REFERENCE_EPSILON)
        if row is None or partner is None:
            continue
        d = row.evaluation.details
        starved = ""
        if "starved_directions_median" in d:
            starved = (
                f"; directions left at the floor: median {d['starved_directions_median']:g}, "
                f"minimum {d['starved_directions_min']:g} of {d['directions']:g}"
            )
        lines.append(
            f"- {row.method.label}: noise std per entry {_std_cell(row)} (median over trials), "
            f"RMSE {_mean_ci(row)}{starved}; the same calibration with the binary allocation: "
            f"noise std {_std_cell(partner)}, RMSE {_mean_ci(partner)}."
        )
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3g}" if b > 0 else "∞"


#: The paper's four basic mechanisms and the row keys that stand for each (best valid row).
_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Gaussian", ("gaussian-analytic", "analyze-gauss")),
    ("JL transform", ("jl",)),
    ("Laplace", ("laplace",)),
    ("Exponential", ("blr", "ppca")),
)


def _family_rows(res: ExperimentResult) -> list[tuple[str, Row]]:
    out = []
    for family, keys in _FAMILIES:
        rows = [_row_or_none(res, k, REFERENCE_EPSILON) for k in keys]
        valid = [r for r in rows if r is not None and r.evaluation.valid]
        if valid:
            out.append((family, min(valid, key=lambda r: r.mean)))
    return out


def _basic_table(results: Sequence[ExperimentResult]) -> tuple[str, str]:
    header = ["Experiment", "Exact MVG", *[f for f, _ in _FAMILIES], "Exact beats"]
    body, lines = [], []
    for res in results:
        exact = best_exact(res, REFERENCE_EPSILON)
        fams = dict(_family_rows(res))
        cells = []
        for family, _ in _FAMILIES:
            row = fams.get(family)
            cells.append(
                "-" if row is None else f"{_mean_ci(row)} (ratio {_ratio(exact.mean, row.mean)})"
            )
        beaten = [f for f, r in fams.items() if exact.mean < r.mean]
        lost = [f for f, r in fams.items() if exact.mean >= r.mean]
        body.append([_short(res), _mean_ci(exact), *cells, f"{len(beaten)} of {len(fams)}"])
        clear = [f for f in lost if not _overlap(exact, fams[f])]
        lines.append(
            f"- {_short(res)}: exact ({fmt(exact.mean)}) has a smaller error than "
            f"{', '.join(beaten) or 'none of them'}"
            + (
                f"; a larger one than {', '.join(lost)}"
                + (f" (beyond both 95 % CIs: {', '.join(clear)})" if clear else "")
                if lost
                else ""
            )
            + "."
        )
    return _table(header, body), "\n".join(lines)


def _overlap(a: Row, b: Row) -> bool:
    return abs(a.mean - b.mean) <= a.ci + b.ci


def _jl_text(results: Sequence[ExperimentResult]) -> str:
    lines = []
    for res in results:
        row = _row_or_none(res, "jl", REFERENCE_EPSILON)
        if row is None:
            continue
        d = row.evaluation.details
        lines.append(
            f"  - {_short(res)}: best r = {d['projections']:g}; the lift adds "
            f"{fmt(d['lift'])} to every diagonal entry of XXᵀ, {fmt(d['lift_over_top_eigenvalue'])}"
            f" times its largest eigenvalue, so the released rows are close to isotropic noise: "
            f"{res.metric} {_mean_ci(row)}, position {position(res, row.mean):.3g}."
        )
    return "\n".join(lines)


def _ppca_text(results: Sequence[ExperimentResult]) -> str:
    for res in results:
        row = _row_or_none(res, "ppca", REFERENCE_EPSILON)
        if row is not None:
            gap = row.evaluation.details["concentration_gap"]
            return (
                f"At ε = {REFERENCE_EPSILON:g} the Bingham exponent separates the top two "
                f"directions by (ε/2)(λ₁ − λ₂) = {fmt(gap)}: the draw concentrates near the top "
                f"eigenvector, {res.metric} {_mean_ci(row)} (position "
                f"{position(res, row.mean):.3g})."
            )
    return ""


def _blr_text(results: Sequence[ExperimentResult]) -> str:
    lines = []
    for res in results:
        row = _row_or_none(res, "blr", REFERENCE_EPSILON)
        if row is None:
            continue
        d = row.evaluation.details
        lines.append(
            f"  - {_short(res)}: BLR's full range holds 10^{d['log10_full_range']:.0f} databases. "
            f"Largest query error of the best candidate {fmt(d['best_query_error'])} (median "
            f"candidate {fmt(d['median_query_error'])}); εN/2 = "
            f"{REFERENCE_EPSILON * res.records / 2:g} per unit of error, so the mechanism picks "
            f"candidates with median error {fmt(d['selected_query_error'])} "
            f"({d['distinct_selected']:g} distinct over {res.trials} trials). The best "
            f"candidate's {res.metric} is {fmt(d['best_candidate_metric'])}; the row's "
            f"{_mean_ci(row)}, position {position(res, row.mean):.3g}."
        )
    return "\n".join(lines)


def _names(results: Sequence[ExperimentResult], key: str, paper_mentions: str = "") -> str:
    """The experiments with a row ``key`` (whose paper row mentions ``paper_mentions``)."""
    names = []
    for res in results:
        paper = PAPER_TABLES[res.name].by_method().get(key)
        if _row_or_none(res, key, REFERENCE_EPSILON) is None or paper is None:
            continue
        if paper_mentions in paper.label:
            names.append(_short(res))
    if len(names) < 2:
        return names[0] if names else "-"
    return f"{', '.join(names[:-1])} and {names[-1]}"


def _why_values(results: Sequence[ExperimentResult]) -> dict[str, object]:
    """Numbers of the run the "why" templates need, by template variable."""
    by = {r.name: r for r in results}
    reg, pc, cov = by.get("regression"), by.get("first-pc"), by.get("covariance")
    values: dict[str, object] = {"epsilon": f"{REFERENCE_EPSILON:g}"}
    paper_rows = [r for res in results for r in res.rows_at(REFERENCE_EPSILON)]
    implied = [
        r.evaluation.implied_epsilon
        for r in paper_rows
        if r.method.kind == "paper-mvg" and r.evaluation.implied_epsilon is not None
    ]
    values["min_implied"] = _eps_cell(min(implied)) if implied else "-"
    ratios = []
    for res in results:
        ex = res.row("exact", REFERENCE_EPSILON).evaluation.noise_std
        for row in res.rows_at(REFERENCE_EPSILON):
            std = row.evaluation.noise_std
            if row.method.kind == "paper-mvg" and std is not None and ex is not None:
                ratios.append(std[1] / ex[1])
    values["noise_ratio"] = fmt(max(ratios)) if ratios else "-"
    values["paper_s2"] = pc.settings.get("paper s2, gamma", "-") if pc else "-"
    values["tau_min"] = f"{min(TAUS):g}"
    values["uniform_shares"] = ", ".join(f"{len(r.important)}/{r.features}" for r in results)
    values["experiments"] = ", ".join(_short(r) for r in results)
    values["floor"] = f"{inspect.signature(max_pnr).parameters['floor'].default:g}"
    if cov is not None:
        plain = _row_or_none(cov, "exact", REFERENCE_EPSILON)
        unbiased = _row_or_none(cov, "exact-unbiased", REFERENCE_EPSILON)
        direct = _row_or_none(cov, "exact-covariance", REFERENCE_EPSILON)
        values |= {
            "cov_plain": _mean_ci(plain) if plain else "-",
            "cov_unbiased": _mean_ci(unbiased) if unbiased else "-",
            "cov_direct": _mean_ci(direct) if direct else "-",
            "cov_rg": fmt(cov.row("random-guess").mean),
            "cov_exp": _short(cov),
            "cov_small": len(cov.important),
            "cov_large": cov.features - len(cov.important),
            "cov_rg_ratio": fmt(
                cov.row("random-guess").mean
                / (
                    PAPER_TABLES["covariance"].by_method()["random-guess"].mean
                    * PAPER_TABLES["covariance"].scale
                )
            ),
        }
    if reg is not None:
        paper = PAPER_TABLES["regression"]
        pn = paper.by_method()["non-private"].mean * paper.scale
        pr = paper.by_method()["random-guess"].mean * paper.scale
        npv, rnd = reg.row("non-private").mean, reg.row("random-guess").mean
        values |= {
            "reg_exp": _short(reg),
            "reg_m": reg.features,
            "reg_n": reg.records,
            "reg_test": reg.held_out,
            "krr": reg.settings.get("regressor", "-"),
            "reg_np_ratio": fmt(npv / pn),
            "reg_rg_ratio": fmt(rnd / pr),
            "reg_ours_ratio": fmt(rnd / npv),
            "reg_paper_ratio": fmt(pr / pn),
        }
    if pc is not None:
        values |= {
            "pc_exp": _short(pc),
            "pc_sample": pc.settings.get("sample", "-"),
            "pc_n": f"{pc.records:,}",
        }
    return values


def _why_sections(
    results: Sequence[ExperimentResult],
) -> list[tuple[str, str, dict[str, object]]]:
    """The sections of "Why our numbers differ": title, template and the template's own values."""
    by_name = {r.name: r for r in results}
    return [
        ("", "why_intro", {}),
        ("1. What the paper's theorems really require", "why_calibration", {}),
        (
            "2. Can the paper's MVG numbers come from that noise?",
            "why_paper",
            {
                "positions": _paper_positions_text(results),
                "exact_positions": _exact_positions_text(results),
            },
        ),
        (
            "3. Directional versus iid noise",
            "why_directional",
            {"rows": _directional_text(by_name), "dppca": _dppca_text(by_name)},
        ),
        (
            "4. Units, samples and choices the paper leaves open",
            "why_units",
            {"scale": _scale_table(results)},
        ),
        (
            "5. Baselines",
            "why_baselines",
            {
                "jl_exps": _names(results, "jl", "Upadhyay"),
                "jl_text": _jl_text(results),
                "ppca_text": _ppca_text(results),
                "blr_exps": _names(results, "blr"),
                "blr_count": BLR_CANDIDATES,
                "blr_size": BLR_SIZE,
                "blr_grid": BLR_GRID,
                "blr_text": _blr_text(results),
            },
        ),
        ("6. What is not private in this protocol", "why_privacy", {}),
    ]


def results_document(
    results: Sequence[ExperimentResult],
    plot_links: Mapping[str, str],
    *,
    command: str,
    total_seconds: float,
) -> str:
    """The whole results document (Markdown), from the templates in ``templates/``.

    Parameters
    ----------
    results : sequence of ExperimentResult
        The three runs.
    plot_links : mapping of str to str
        Relative link to each experiment's plot, by experiment name.
    command : str
        The command line that produced the run.
    total_seconds : float
        Wall-clock time of the whole command.

    Returns
    -------
    str
        Markdown text.
    """
    values = _why_values(results)
    basic_table, basic_text = _basic_table(results)
    sweep_table, sweep_text = _sweep_table(results)
    parts = [
        _template(
            "doc_header",
            command=command,
            trials=", ".join(map(str, sorted({r.trials for r in results}))),
            seeds=", ".join(map(str, sorted({r.seed for r in results}))),
            seconds=f"{total_seconds:.1f}",
            cores=os.cpu_count(),
            epsilon=f"{REFERENCE_EPSILON:g}",
            summary=_summary_table(results),
            ratio=f"{PAPER_RATIO_TARGET:g}",
            basic_table=basic_table,
            basic_text=basic_text,
            sweep_table=sweep_table,
            sweep_text=sweep_text,
        ),
        "",
    ]
    parts += [experiment_markdown(res, plot_links[res.name], level=2) for res in results]
    parts += ["## Why our numbers differ from the paper's", ""]
    for title, name, extra in _why_sections(results):
        if title:
            parts += [f"### {title}", ""]
        parts += [_template(name, **(values | extra)), ""]
        if name == "why_calibration":
            parts += [_noise_table(results), ""]
    parts += [_template("doc_footer", command=command), ""]
    return "\n".join(parts)


def write_results_document(
    results: Sequence[ExperimentResult],
    files: Mapping[str, ExperimentFiles],
    doc_path: Path,
    *,
    command: str,
    total_seconds: float,
) -> Path:
    """Write the results document, linking each plot relative to the document.

    Parameters
    ----------
    results : sequence of ExperimentResult
        The runs.
    files : mapping of str to ExperimentFiles
        What :func:`write_experiment_files` wrote, by experiment name.
    doc_path : pathlib.Path
        Where to write the document.
    command : str
        The command line of the run.
    total_seconds : float
        Wall-clock time of the whole command.

    Returns
    -------
    pathlib.Path
        ``doc_path``.
    """
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    links = {name: _rel(f.plot, doc_path.parent) for name, f in files.items()}
    doc_path.write_text(
        results_document(results, links, command=command, total_seconds=total_seconds),
        encoding="utf-8",
    )
    return doc_path
