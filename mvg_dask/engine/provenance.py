"""A release's provenance attributes: functions of its plan only, never of the data (the
README's trust model), in the format of :mod:`mvg_dask.release_format`."""

from __future__ import annotations

import json
from typing import Any

from mvg_dask._version import __version__
from mvg_dask.plan.plan_json import missing_entry
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_codec import ReleaseCodec
from mvg_dask.release_format import provenance_attrs


def provenance(rplan: ReleasePlan, *, seeded: bool) -> dict[str, Any]:
    """The provenance attributes of a release: functions of its plan only (the input store by
    its name alone, never the curator's path to it).

    For DP-PCA releases the direction-dependent quantities (``Delta_M`` of a paper calibration,
    the noise variances) are not attributes: they are in the noisy data variables.
    """
    values: dict[str, Any] = {
        "release_id": rplan.release_id,
        "name": rplan.name,
        "version": __version__,
        "created": rplan.created,
        "query": rplan.query.kind,
        "algorithm": rplan.algorithm,
        "calibration": rplan.calibration,
        "epsilon": rplan.epsilon,
        "delta": rplan.delta,
        "neighbours": rplan.neighbours,
        "composition": rplan.budgets.composition,
        # lattice (floating-point safe) or float
        "noise": rplan.noise_kind,
        "record_domain": json.dumps(rplan.domain.to_dict()),
        "on_violation": rplan.on_violation,
        # domain.missing: {fill: ...} as declared (a function of the spec); absent for the
        # default missing: error. How many values were filled is curator-side only
        "missing": None
        if rplan.missing_fill is None
        else json.dumps(missing_entry(rplan.missing_fill)),
        "seeded": seeded,
        "seeded_note": "noise derived from a user seed: reproducible, NOT private"
        if seeded
        else "",
        "tile_records": rplan.tile_records,
        # the store's name, never where it is: the curator's paths are not published (the
        # ledger and the dry run, curator-side, name the full location)
        "input_store": store_name(rplan.input.store),
        "input_variable": rplan.input.variable,
        # a regression's response feature (a label from the spec, public)
        "target": getattr(rplan.query, "target_label", None),
        "route": None if rplan.mean_first is None else "mean-first",
        "mean_step": None if rplan.mean_first is None else json.dumps(rplan.mean_first.to_dict()),
        # the published noise plan and its terms (sensitivity, gamma, Delta_M, ...): the codec's
        **ReleaseCodec.encode(rplan),
    }
    return provenance_attrs(values)


def store_name(store: str) -> str:
    """The last path component of a store's path or URL (``s3://bucket/data/x.zarr``:
    ``x.zarr``), the input's name in a release's provenance.

    Examples
    --------
    >>> store_name("s3://bucket/data/x.zarr/")
    'x.zarr'
    """
    return store.rstrip("/").rsplit("/", 1)[-1]
