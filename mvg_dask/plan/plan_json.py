"""A release plan's JSON form, read back: the fields of
:class:`~mvg_dask.plan.release_plan.ReleasePlan` from
:meth:`~mvg_dask.plan.release_plan.ReleasePlan.to_dict`'s output.

The noise plan is recomputed and checked (:func:`~mvg_dask.plan.noise_plan.noise_plan_from_dict`),
the budget shares are recomputed from the published composition, and a plan saved before plans
carried their stages gets the stages its fields imply.
"""

from __future__ import annotations

from typing import Any

from mvg_dask.plan.budget import Allocation
from mvg_dask.plan.domain import domain_from_dict
from mvg_dask.plan.lattice import LatticeContext
from mvg_dask.plan.mean_first import MeanStep
from mvg_dask.plan.noise_plan import NoisePlan, noise_plan_from_dict
from mvg_dask.plan.pending import PendingNoise, published_noise_plan
from mvg_dask.plan.queries import query_from_dict
from mvg_dask.plan.release_parts import DpPcaStep, LedgerCharge


def _allocation(a: dict[str, Any]) -> Allocation:
    return Allocation(
        strategy=a["strategy"],
        important=a.get("important"),
        share=a.get("share"),
        theta=a.get("theta") if a["strategy"] == "custom" else None,
    )


def _noise(data: dict[str, Any], published: NoisePlan | PendingNoise) -> NoisePlan | None:
    """The complete noise plan: the published one, or a DP-PCA (mean-first) release's resolved
    one (``None`` while its directions, or its centre, are pending)."""
    if isinstance(published, NoisePlan):
        return published
    if "resolved" in data:
        return noise_plan_from_dict(data["resolved"])
    return None


def _ledger(
    data: dict[str, Any], location: str | None, password_file: str | None
) -> LedgerCharge | None:
    ledger = data.get("ledger")
    if ledger is None:
        return None
    if location is None:
        raise ValueError("this plan charges a ledger: pass ledger_location")
    return LedgerCharge.from_dict(ledger, location, password_file)


def violation_dict(on_violation: str, fill: float | tuple[float, ...] | None) -> dict[str, Any]:
    """A plan's ``on_violation`` entry and, for ``domain.missing: {fill: v}``, its ``missing``
    entry ``{"fill": v}`` (a number or a list); ``missing: error`` (the default) adds no key,
    so the plans of specs without ``missing`` are unchanged.

    Parameters
    ----------
    on_violation : str
        ``clip`` or ``error``.
    fill : float, tuple of float or None
        The declared fill (``None``: ``missing: error``).

    Returns
    -------
    dict
        The entries of :meth:`~mvg_dask.plan.release_plan.ReleasePlan.to_dict`.
    """
    if fill is None:
        return {"on_violation": on_violation}
    return {"on_violation": on_violation, "missing": missing_entry(fill)}


def missing_entry(fill: float | tuple[float, ...]) -> dict[str, Any]:
    """``domain.missing: {fill: v}`` as a plan and a release publish it: ``{"fill": v}``, ``v``
    a number or a list (a function of the spec only)."""
    return {"fill": list(fill) if isinstance(fill, tuple) else fill}


def _missing_fill(missing: dict[str, Any] | None) -> float | tuple[float, ...] | None:
    """The fill of a plan's ``missing`` entry (absent: ``missing: error``)."""
    if missing is None:
        return None
    fill = missing["fill"]
    return tuple(float(v) for v in fill) if isinstance(fill, list | tuple) else float(fill)


def plan_fields(
    data: dict[str, Any],
    *,
    ledger_location: str | None = None,
    ledger_password_file: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of a :class:`~mvg_dask.plan.release_plan.ReleasePlan` saved as
    ``data``, all but ``input`` and ``output_storage_options`` (the caller's).

    Parameters
    ----------
    data : dict
        A plan dictionary.
    ledger_location, ledger_password_file : str, optional
        The ledger's path or URL (required when the plan charges a ledger) and password file.

    Returns
    -------
    dict
        Field name to value.
    """
    noise_d = data["plan"]
    query = query_from_dict(noise_d["query"])
    step = data.get("dp_pca")
    dp = None if step is None else DpPcaStep.from_dict(step)
    mean = data.get("mean_first")
    mean_step = None if mean is None else MeanStep.from_dict(mean)
    ctx = noise_d.get("lattice_context")
    # the published plan, decoded as a release's readers decode it (complete or pending)
    published = published_noise_plan(noise_d, mean_first=mean_step is not None)
    output = data["output"]
    return {
        "release_id": data["release_id"],
        "name": data["name"],
        "created": data["created"],
        "spec_hash": data["spec_hash"],
        "output_store": output["store"],
        "output_codec": output.get("codec", "none"),
        "output_dtype": output.get("dtype", "float64"),
        "matrix_chunk": output.get("matrix_chunk"),
        "ledger": _ledger(data, ledger_location, ledger_password_file),
        "query": query,
        # a mean-first plan publishes the declared box (its query sums [x - c; 1])
        "domain": domain_from_dict(noise_d["domain"], query.features - (mean is not None)),
        "on_violation": data["on_violation"],
        "missing_fill": _missing_fill(data.get("missing")),
        "epsilon": float(noise_d["epsilon"]),
        "delta": float(noise_d["delta"]),
        "neighbours": noise_d["neighbours"],
        "algorithm": noise_d["algorithm"],
        "calibration": noise_d["calibration"],
        "allocation": _allocation(noise_d["allocation"]),
        "budgets": published.budgets,
        "dp_pca": dp,
        "noise": _noise(data, published),
        "mean_first": mean_step,
        "tile_records": int(data["tile_records"]),
        "noise_kind": noise_d.get("noise", "float"),
        "lattice_context": None if ctx is None else LatticeContext.from_dict(ctx),
        # absent from plans saved before plans carried their stages: implied by the fields
        "stages": tuple(data.get("stages", ())),
    }
