"""A release plan as a short table a person reads before anything runs (like ``terraform plan``).

:func:`plan_rows` turns a :class:`~mvg_dask.plan.release_plan.ReleasePlan` into labelled lines:
what is read, the query, the domain, the mechanism and calibration, the sensitivities (and what
declared bounds above the proved ones cost), the noise std range per released entry, the
(epsilon, delta) charged and where the release is written.
:func:`render_text` prints them for a terminal and :func:`render_html` for a notebook. Every line
is a function of the plan's public form: under add-remove neighbours the record count is private
and shown as ``?``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np

from mvg_dask.plan.release_plan import ReleasePlan

__all__ = ["Row", "noise_std_range", "plan_rows", "render_html", "render_text"]

Row = tuple[str, str]

_ALGORITHM = {
    "unimodal": "Alg. 1, noise on rows",
    "equi-modal": "Alg. 2, noise on rows and columns",
}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _domain_text(rplan: ReleasePlan) -> str:
    d = rplan.domain.to_dict()
    if "box" in d:
        box = d["box"]
        assert isinstance(box, dict)
        lo, hi = np.asarray(box["lower"]), np.asarray(box["upper"])
        if np.all(lo == lo[0]) and np.all(hi == hi[0]):
            text = f"box [{lo[0]:g}, {hi[0]:g}] per feature"
        else:
            text = (
                f"box per feature, lower {lo.min():g}..{lo.max():g}, "
                f"upper {hi.min():g}..{hi.max():g}"
            )
    else:
        text = f"l2 ball, ||x|| <= {d['l2_norm']:g}"
    text = f"{text}; values outside: {rplan.on_violation}"
    fill = rplan.missing_fill
    if fill is None:
        return text  # missing: error, the default (NaN aborts the release)
    if isinstance(fill, tuple):
        return f"{text}; NaN filled per feature with {min(fill):g}..{max(fill):g}"
    return f"{text}; NaN filled with {fill:g}"


def _query_text(rplan: ReleasePlan) -> str:
    """What is released: the query type's own line
    (:meth:`~mvg_dask.plan.MatrixQuery.dry_run_text`)."""
    return rplan.query.dry_run_text(rplan)


def centered_routes_text(rplan: ReleasePlan) -> str | None:
    """The two routes to a centered covariance: both routes' expected squared error
    (covariance plus mean, uniform precisions, the data's mean at the box's centre .. at a
    corner; docs/bounds.md, Sec. 14), the smaller in the worst case (what ``route: auto``
    takes: the plan does not see the data's mean) and the route the plan takes. ``None`` where
    the comparison does not apply (not a moment query, an l2 ball, add-remove neighbours, a
    calibration that is not a Gaussian mechanism).

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    str or None
        One line for the dry run.
    """
    from mvg_dask.privacy.sensitivity import centered_route_errors

    mu = rplan.budgets.release_mu
    box = rplan.domain.to_dict().get("box")
    if not rplan.query.augmented or mu is None or box is None or rplan.neighbours != "replace-one":
        return None
    assert isinstance(box, dict)
    if rplan.mean_first is not None:  # the total mu of the two steps
        mu = math.hypot(rplan.mean_first.mu, mu)
    lo, hi = np.asarray(box["lower"], dtype=np.float64), np.asarray(box["upper"], dtype=np.float64)
    lo, hi = np.broadcast_to(lo, (rplan.input.features,)), np.broadcast_to(hi, lo.shape)
    records, scale = float(rplan.input.records), float(getattr(rplan.query, "scale", 1.0))
    share = None if rplan.mean_first is None else [rplan.mean_first.share]
    at_centre = centered_route_errors(lo, hi, records, mu, scale=scale, shares=share)
    at_corner = centered_route_errors(lo, hi, records, mu, mean=hi, scale=scale, shares=[0.5])
    centred = (at_centre.totals()["centred"], at_corner.centred_covariance + at_corner.centred_mean)
    first = (
        at_centre.totals()["mean-first"],
        at_centre.mean_first_worst_covariance + at_centre.mean_first_mean,
    )
    smaller = "the centred moment" if centred[1] <= first[1] else "the mean first"
    taken = "the centred moment" if rplan.mean_first is None else "the mean first"
    return (
        f"expected squared error (covariance + mean; data mean at the box's centre .. a corner): "
        f"centred moment {centred[0]:.3g} .. {centred[1]:.3g}, DP mean first {first[0]:.3g} .. "
        f"{first[1]:.3g}; smaller in the worst case: {smaller}; taken: {taken}"
    )


def noise_std_range(rplan: ReleasePlan) -> tuple[float, float] | None:
    """Smallest and largest noise standard deviation of one released entry (the noise as
    published: :meth:`NoisePlan.released_entry_std`), or ``None`` while DP-PCA's directions
    are pending (they are chosen at run time)."""
    if rplan.noise is None:
        return None
    diag, off = rplan.noise.released_std_ranges()
    if off is None:
        return diag
    return min(diag[0], off[0]), max(diag[1], off[1])


def _noise_std_text(rplan: ReleasePlan) -> str:
    """The dry run's noise line: the published noise's std, on and off the diagonal where a
    square release's differ (:meth:`NoisePlan.released_std_ranges`)."""
    if rplan.noise is None and rplan.mean_first is not None:
        step = rplan.mean_first
        return (
            f"mean {step.std:.4g} on each entry ({step.share:.0%} of mu^2); the covariance's "
            "is set at run time about the released mean"
        )
    if rplan.noise is None:
        return "set at run time by the DP-PCA directions"
    target = "the sum" if rplan.releases_count else "each released entry"
    diag, off = rplan.noise.released_std_ranges()
    if off is None or np.allclose(diag, off, rtol=1e-12, atol=0.0):
        return f"{diag[0]:.4g} .. {diag[1]:.4g} on {target}"
    return (
        f"{diag[0]:.4g} .. {diag[1]:.4g} on the diagonal, {off[0]:.4g} .. {off[1]:.4g} off it, "
        f"of {target}"
    )


def _noise_kind_text(rplan: ReleasePlan) -> str:
    """The lattice (grid, float error, inflation) or the float path's warning."""
    if rplan.noise_kind != "lattice":
        return "float: drawn and added in floating point (not floating-point safe)"
    parts = []
    if rplan.noise is not None and rplan.noise.lattice is not None and rplan.dp_pca is None:
        parts.append(rplan.noise.lattice.summary())
    elif rplan.mean_first is not None and rplan.mean_first.lattice is not None:
        parts.append(f"mean step: {rplan.mean_first.lattice.summary()}")
        parts.append("the covariance's grid and float error: set at run time about the mean")
    else:
        parts.append("lattice noise: grid and float error set at run time by the directions")
    if rplan.dp_pca is not None and rplan.dp_pca.lattice is not None:
        step = rplan.dp_pca.lattice
        parts.append(
            f"DP-PCA step: grid 2^{step.log2_grid}, sensitivity inflated by "
            f"{step.relative_inflation:.3g}"
        )
    return "; ".join(parts)


def _allocation_text(rplan: ReleasePlan) -> str:
    """The allocation taken and why (a function of the spec only)."""
    a = rplan.allocation
    return a.strategy if a.reason is None else f"{a.strategy} ({a.reason})"


def plan_rows(rplan: ReleasePlan) -> list[Row]:
    """The plan as labelled lines (data-independent: the record count is ``?`` under
    add-remove neighbours).

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    list of (str, str)
        ``(label, text)`` in reading order.
    """
    inp = rplan.input
    records = "?" if rplan.neighbours == "add-remove" else str(inp.records)
    public = rplan.public_noise_dict()
    directions = public["directions"]["method"]
    if rplan.dp_pca is not None:
        directions = (
            f"dp-pca (k={rplan.dp_pca.k}, {rplan.dp_pca.budget_share:.0%} of the budget, "
            "chosen at run time)"
        )
    rows: list[Row] = [
        (
            "read",
            f"{inp.store} [{inp.variable}] ({inp.dims[0]} x {inp.dims[1]}): "
            f"{inp.features} features x {records} records",
        ),
        ("query", _query_text(rplan)),
        ("domain", _domain_text(rplan)),
        (
            "mechanism",
            f"MVG {rplan.algorithm} ({_ALGORITHM.get(rplan.algorithm, rplan.algorithm)}), "
            f"calibration {rplan.calibration}, directions {directions}",
        ),
        ("allocation", _allocation_text(rplan)),
    ]
    delta_m = public["mahalanobis_sensitivity"]
    if rplan.mean_first is not None:
        sens = f"mean s1 = {_fmt(rplan.mean_first.sensitivity)}; covariance: after the mean"
    else:
        sens = f"s2 = {_fmt(public['sensitivity'])}, Delta_M = "
        sens += "after DP-PCA" if delta_m is None else _fmt(delta_m)
    if public.get("gamma") is not None:
        sens += f", gamma = {_fmt(public['gamma'])}"
    rows.append(("sensitivity", sens))
    declared = rplan.declared_bounds_text()
    if declared is not None:
        rows.append(("declared", declared.removeprefix("declared ")))
    rows.append(("noise std", _noise_std_text(rplan)))
    routes = centered_routes_text(rplan)
    if routes is not None:
        rows.append(("routes", routes))
    rows.append(("arithmetic", _noise_kind_text(rplan)))
    budgets = rplan.budgets
    parts = [f"epsilon = {rplan.epsilon:g}, delta = {rplan.delta:.3g} ({rplan.neighbours})"]
    if budgets.share > 0 or budgets.count_share > 0:
        parts.append(f"{budgets.composition} composition of its steps")
    rows.append(("privacy", "; ".join(parts)))
    rows.append(("stages", stages_text(rplan)))
    rows.append(("write", rplan.output_store))
    return rows


def stages_text(rplan: ReleasePlan) -> str:
    """The passes the release runs, in order (:mod:`mvg_dask.plan.stages`), as one line.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    str
        The stage names joined by arrows, e.g. ``noisy-count -> gram -> covariance``.
    """
    return " -> ".join(rplan.stages)


def render_text(title: str, rows: Sequence[Row]) -> str:
    """Rows as aligned terminal lines under ``title``."""
    width = max((len(label) for label, _ in rows), default=0)
    return "\n".join([title, *(f"  {label:<{width}}  {text}" for label, text in rows)])


def render_html(title: str, rows: Sequence[Row]) -> str:
    """Rows as an HTML table (a notebook's rich display)."""
    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
        f"<td style='text-align:left'>{html.escape(text)}</td></tr>"
        for label, text in rows
    )
    return f"<div><strong>{html.escape(title)}</strong><table>{body}</table></div>"
