"""The published noise plan, written once and read back one way (mvg_dask.release_codec).

* The pending form (DP-PCA's, a wide DP-PCA's, mean-first's), written by the pending-plan types
  without a stand-in plan, is byte for byte what the code before them published:
  ``tests/data/pending_plans.json`` holds ``json.dumps`` of the plans those releases published
  (recorded from that code for the cases below).
* For every golden case's plan and the pending routes, encoding a plan and decoding the release
  gives the noise plan the engine used (the resume's :meth:`ReleaseCodec.plan_for` and the
  readers' :meth:`ReleaseCodec.noise_plan` alike).
* A pending plan states every field its complete plan states except its dependent ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask.engine.output import provenance
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.pending import PendingCentre, PendingDirections, published_noise_plan
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_codec import PlanMismatchError, ReleaseCodec
from mvg_dask.release_format import (
    CENTRE,
    COMPLETE,
    DIRECTIONS,
    DP_PCA_EIGENVALUES,
    PLAN_ATTR,
    ROW_COV,
    STATUS_ATTR,
)
from mvg_dask.spec import parse_spec
from tests.test_golden import CASES as GOLDEN_CASES

PENDING = Path(__file__).parent / "data" / "pending_plans.json"
CREATED = "2026-11-25T07:00:00+00:00"
DP_PCA = {"method": "dp-pca", "k": 2, "budget_share": 0.2}
WIDE_DP_PCA = {"method": "dp-pca", "k": 3, "budget_share": 0.2}
MEAN_FIRST = {"centered-covariance": {"route": "mean-first"}}


def _golden_cases() -> dict[str, dict[str, Any]]:
    return {
        f"golden-{case}-{noise}": {
            **c,
            "mechanism": {"calibration": "exact", **c["mechanism"], "noise": noise},
        }
        for case, c in GOLDEN_CASES.items()
        for noise in ("float", "lattice")
    }


#: more pending routes: allocations, calibrations, add-remove, wide ones, mean-first
EXTRA: dict[str, dict[str, Any]] = {
    "dp-pca-identity-binary": {
        "query": "identity",
        "mechanism": {
            "algorithm": "unimodal",
            "directions": DP_PCA,
            "allocation": {"strategy": "binary", "share": 0.7},
        },
    },
    "dp-pca-covariance-unimodal": {
        "query": "covariance",
        "mechanism": {"algorithm": "unimodal", "directions": DP_PCA},
    },
    "dp-pca-covariance-unimodal-lattice": {
        "query": "covariance",
        "mechanism": {"algorithm": "unimodal", "directions": DP_PCA, "noise": "lattice"},
    },
    "dp-pca-covariance-add-remove": {
        "query": "covariance",
        "mechanism": {"algorithm": "symmetric", "directions": DP_PCA},
        "privacy": {"neighbours": "add-remove"},
    },
    "dp-pca-identity-thm2": {
        "query": "identity",
        "mechanism": {"algorithm": "unimodal", "calibration": "mvg-thm2", "directions": DP_PCA},
    },
    "dp-pca-covariance-thm3": {
        "query": "covariance",
        "mechanism": {"algorithm": "equi-modal", "calibration": "mvg-thm3", "directions": DP_PCA},
    },
    "wide-symmetric-dp-pca": {
        "query": "covariance",
        "features": 300,
        "mechanism": {"algorithm": "symmetric", "directions": WIDE_DP_PCA},
        "output": {"matrix_chunk": 256},
    },
    "wide-symmetric-dp-pca-binary": {
        "query": "covariance",
        "features": 300,
        "mechanism": {
            "algorithm": "symmetric",
            "directions": WIDE_DP_PCA,
            "allocation": {"strategy": "binary", "share": 0.6},
        },
        "output": {"matrix_chunk": 256},
    },
    "wide-unimodal-dp-pca-lattice": {
        "query": "covariance",
        "features": 300,
        "mechanism": {"algorithm": "unimodal", "noise": "lattice", "directions": WIDE_DP_PCA},
        "output": {"matrix_chunk": 256},
    },
    "mean-first-symmetric": {"query": MEAN_FIRST, "mechanism": {"algorithm": "symmetric"}},
    "mean-first-symmetric-lattice": {
        "query": MEAN_FIRST,
        "mechanism": {"algorithm": "symmetric", "noise": "lattice"},
    },
    "mean-first-unimodal": {"query": MEAN_FIRST, "mechanism": {"algorithm": "unimodal"}},
    "mean-first-binary": {
        "query": MEAN_FIRST,
        "mechanism": {
            "algorithm": "equi-modal",
            "allocation": {"strategy": "binary", "important": [1], "share": 0.6},
        },
    },
}
CASES = {**_golden_cases(), **EXTRA}


def plan_case(name: str) -> ReleasePlan:
    """The case's plan, from metadata only (5,000 records; a golden matrix case's directions
    are a fixed random orthonormal matrix)."""
    c = CASES[name]
    m, n = c.get("features", 4), 5000
    spec = parse_spec(
        {
            "name": "codec",
            "release_id": f"codec-{name}",
            "input": {"store": "/nonexistent/input.zarr", "variable": "X"},
            "domain": {"box": {"lower": -1.0, "upper": 1.0}, "on_violation": "clip"},
            "query": c["query"],
            "mechanism": {"calibration": "exact", **c["mechanism"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6, **c.get("privacy", {})},
            "output": {"store": "/nonexistent/release.zarr", **c.get("output", {})},
        }
    )
    meta = InputMetadata(
        store="/nonexistent/input.zarr",
        variable="X",
        record_dim="record",
        feature_dim="feature",
        dims=("feature", "record"),
        shape=(m, n),
        dtype="float64",
        record_chunk=1000,
    )
    W = np.linalg.qr(np.random.default_rng(3).standard_normal((m, m)))[0]
    matrix = W if spec.mechanism.directions.method == "matrix" else None
    return plan_release(spec, meta, directions_matrix=matrix, created=CREATED)


def run_time_values(rplan: ReleasePlan) -> tuple[ReleasePlan, dict[str, np.ndarray]]:
    """The plan as the engine resolves it, with made-up run-time values (DP-PCA's directions:
    a random orthonormal basis or, wide, its top k; the mean-first centre: a point of the box),
    and the variables a release stores for them."""
    rng = np.random.default_rng(11)
    m = rplan.query.shape[0]
    if rplan.mean_first is not None:
        centre = rng.uniform(-0.5, 0.5, rplan.domain.m)
        from mvg_dask.plan.release_plan import resolve_about_mean

        return resolve_about_mean(rplan, centre), {CENTRE: centre}
    if rplan.dp_pca is None:
        return rplan, {}
    k = rplan.dp_pca.k
    Q = np.linalg.qr(rng.standard_normal((m, m)))[0]
    if rplan.matrix_chunk is not None:  # a wide release keeps the top k
        eig = np.linspace(3.0, 1.0, k)
        directions = Directions.low_rank(Q[:, :k], tuple(range(k)), eig)
    else:
        eig = np.linspace(3.0, 0.5, m)
        directions = Directions("dp-pca", Q, tuple(range(k)), eig)
    resolved = rplan.resolve(directions)
    return resolved, {DIRECTIONS: directions.matrix, DP_PCA_EIGENVALUES: eig}


def release_of(rplan: ReleasePlan) -> tuple[ReleasePlan, dict[str, Any], dict[str, Any]]:
    """The engine's resolved plan, and the root attributes (as the writer makes them) and
    variables of its complete release."""
    resolved, variables = run_time_values(rplan)
    attrs = {**provenance(rplan, seeded=True), STATUS_ATTR: COMPLETE}
    variables[ROW_COV] = resolved.noise_plan().row_cov
    return resolved, attrs, variables


@pytest.mark.parametrize("name", sorted(json.loads(PENDING.read_text())))
def test_the_pending_form_keeps_its_bytes(name):
    """The published plan of a DP-PCA or mean-first release: the pending types write the
    bytes (key order and float formatting included) the stand-in plans wrote."""
    rplan = plan_case(name)
    want = json.loads(PENDING.read_text())[name]
    assert json.dumps(rplan.public_noise_dict()) == want
    assert ReleaseCodec.encode(rplan)["plan"] == want
    assert json.dumps(rplan.to_dict()["plan"]) == want


@pytest.mark.parametrize("name", sorted(CASES))
def test_encode_then_decode_gives_the_engines_noise_plan(name):
    """Encode a plan, decode its release: the noise plan the engine used (row_cov and its whole
    dictionary), by the resume's path and the readers' alike."""
    rplan = plan_case(name)
    resolved, attrs, variables = release_of(rplan)
    want = resolved.noise_plan()
    codec = ReleaseCodec(attrs, variables)
    for got in (codec.noise_plan(), codec.plan_for(rplan)):
        np.testing.assert_array_equal(got.row_cov, want.row_cov)
        assert got.to_dict() == want.to_dict()
        np.testing.assert_array_equal(got.released_entry_std(), want.released_entry_std())


@pytest.mark.parametrize("name", sorted(n for n in CASES if "dp-pca" in n or "mean-first" in n))
def test_a_pending_plan_states_what_its_complete_plan_states(name):
    """Every field of the pending form that is not marked dependent (besides the directions and
    the allocation's shares, which the run-time value sets) equals the resolved plan's, with the
    same keys in the same order; and the published form reads back to the same pending plan."""
    rplan = plan_case(name)
    pending = rplan.pending_noise()
    assert isinstance(pending, PendingCentre if rplan.mean_first else PendingDirections)
    public = pending.to_dict()
    complete = run_time_values(rplan)[0].noise_plan().to_dict()
    assert list(public) == list(complete)
    for key, value in public.items():
        if key in pending.dependent:
            assert value is None, key
        elif key == "allocation":
            assert {**value, "theta": None} == {**complete[key], "theta": None}
        elif key != "directions" and not (rplan.mean_first and key in ("query", "domain")):
            assert value == complete[key], key
    back = published_noise_plan(public, mean_first=rplan.mean_first is not None)
    assert type(back) is type(pending) and back.to_dict() == public


def test_a_release_with_another_plan_is_refused():
    """The resume refuses a release whose published plan is not the spec's; a reader refuses a
    release whose row_cov its plan does not reproduce."""
    rplan = plan_case("golden-covariance-symmetric-dp-pca-float")
    _, attrs, variables = release_of(rplan)
    other = plan_case("golden-covariance-equi-modal-dp-pca-float")
    with pytest.raises(PlanMismatchError, match="another plan than this spec gives"):
        ReleaseCodec(attrs, variables).plan_for(other)
    tampered = {**variables, ROW_COV: 2.0 * variables[ROW_COV]}
    with pytest.raises(ValueError, match="does not match its plan"):
        ReleaseCodec(attrs, tampered).noise_plan()
    public = json.loads(attrs[PLAN_ATTR])
    public["epsilon"] = 2.0
    with pytest.raises(PlanMismatchError):
        ReleaseCodec({**attrs, PLAN_ATTR: json.dumps(public)}, variables).plan_for(rplan)
