"""The release plan as a plain value: round trips, purity, and the dry run's imports."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mvg_dask.plan import Directions
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.spec import parse_spec
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

META = InputMetadata(
    store="in.zarr",
    variable="X",
    record_dim="record",
    feature_dim="feature",
    dims=("feature", "record"),
    shape=(5, 3000),
    dtype="float64",
    record_chunk=700,
    feature_names=tuple(f"f{i}" for i in range(5)),
)


def _orthonormal(m: int, seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(m, m)))
    return q


# (query, overrides) of every plan kind: fixed directions of each method, each calibration
# family, each domain kind and neighbour relation, and DP-PCA (pending and resolved)
KINDS = {
    "identity-standard-exact": ("identity", {}),
    "identity-binary-thm2": (
        "identity",
        {
            "mechanism": {
                "calibration": "mvg-thm2",
                "allocation": {"strategy": "binary", "important": [1, 3], "share": 0.7},
            }
        },
    ),
    "identity-matrix-mgm-udn": (
        "identity",
        {"mechanism": {"calibration": "mgm-udn", "directions": {"method": "matrix"}}},
    ),
    "identity-custom-l2": (
        "identity",
        {
            "domain": {"box": None, "l2_norm": 2.0},
            "mechanism": {"allocation": {"strategy": "custom", "theta": [0.3, 0.2, 0.2, 0.2, 0.1]}},
        },
    ),
    "identity-idn": ("identity", {"mechanism": {"calibration": "mgm-idn"}}),
    "covariance-exact": ("covariance", {}),
    "covariance-thm3": ("covariance", {"mechanism": {"calibration": "mvg-thm3"}}),
    "covariance-mgm-declared": (
        "covariance",
        # above the bounds [0, 1]^5 proves at N = 3000 (s2 = 5/3000, gamma = 5): used as declared
        {"mechanism": {"calibration": "mgm", "sensitivity": 2e-3, "gamma": 6.0}},
    ),
    "covariance-dp-pca-max-pnr": (
        "covariance",
        {
            "mechanism": {
                "directions": {"method": "dp-pca", "k": 2, "budget_share": 0.25},
                "allocation": {"strategy": "max-pnr"},
            }
        },
    ),
    "covariance-dp-pca-thm2": (
        "covariance",
        {
            "mechanism": {
                "calibration": "mvg-thm2",
                "directions": {"method": "dp-pca", "k": 1},
                "allocation": {"strategy": "binary", "share": 0.9},
            }
        },
    ),
}


def _spec(tmp_path: Path, query: str, overrides: dict) -> tuple:
    spec = spec_dict("in.zarr", "out.zarr", query=query, release_id="rid-1", **overrides)
    matrix = None
    if spec["mechanism"].get("directions", {}).get("method") == "matrix":
        matrix = _orthonormal(5, 3)
        np.save(tmp_path / "W.npy", matrix)
        spec["mechanism"]["directions"]["path"] = str(tmp_path / "W.npy")
    spec["ledger"] = {"path": "l.sqlite", "dataset": "d", "budget": {"epsilon": 5, "delta": 1e-4}}
    return parse_spec(spec), matrix


def _resolved(rplan: ReleasePlan) -> ReleasePlan:
    """A DP-PCA plan with directions filled in as the engine would (any orthonormal W)."""
    m = rplan.query.shape[0]
    eig = np.linspace(3.0, 0.5, m)
    return rplan.resolve(Directions("dp-pca", _orthonormal(m, 7), (0, 1)[:m], eig))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_plan_kind_round_trips(tmp_path, kind):
    query, overrides = KINDS[kind]
    spec, matrix = _spec(tmp_path, query, overrides)
    rplan = plan_release(spec, META, directions_matrix=matrix, created="2026-01-01T00:00:00+00:00")
    variants = [rplan] + ([_resolved(rplan)] if rplan.uses_dp_pca else [])
    for p in variants:
        d = json.loads(json.dumps(p.to_dict()))  # through JSON, as the output stores it
        back = ReleasePlan.from_dict(d, ledger_location="l.sqlite")
        assert back.to_dict() == p.to_dict()
        assert back.is_resolved == p.is_resolved
        if p.is_resolved:
            np.testing.assert_array_equal(back.noise_plan().row_cov, p.noise_plan().row_cov)
            assert back.noise_plan().theorem_check() == p.noise_plan().theorem_check()


def test_a_tampered_plan_is_refused(tmp_path):
    spec, _ = _spec(tmp_path, "identity", {})
    d = plan_release(spec, META).to_dict()
    d["plan"]["row_variances"][0] *= 0.5  # less noise than the calibration gives
    with pytest.raises(ValueError, match="does not reproduce its own noise variances"):
        ReleasePlan.from_dict(d, ledger_location="l.sqlite")


def test_plan_is_pure_and_carries_no_secrets(tmp_path):
    spec, _ = _spec(tmp_path, "covariance", {"input": {"storage_options": {"key": "SECRET"}}})
    meta = InputMetadata(**{**META.__dict__, "storage_options": {"key": "SECRET"}})
    a = plan_release(spec, meta, created="t")
    b = plan_release(spec, meta, created="t")
    assert a.to_dict() == b.to_dict()
    text = json.dumps(a.to_dict())
    assert "SECRET" not in text and "l.sqlite" not in text


def test_dp_pca_publishes_only_the_pending_plan(tmp_path):
    spec, _ = _spec(tmp_path, *KINDS["covariance-dp-pca-max-pnr"])
    rplan = plan_release(spec, META)
    done = _resolved(rplan)
    assert done.public_dict() == rplan.public_dict()  # directions are data, not metadata
    assert done.public_dict()["plan"]["row_variances"] is None
    assert "resolved" in done.to_dict() and "resolved" not in done.public_dict()


def test_add_remove_plan_does_not_publish_the_record_count(tmp_path):
    spec, _ = _spec(tmp_path, "covariance", {"privacy": {"neighbours": "add-remove"}})
    public = plan_release(spec, META).public_dict()
    assert public["input"]["records"] is None and public["input"]["shape"] is None


def test_dry_run_imports_neither_dask_nor_distributed(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=1), chunk=100)
    spec = write_spec(
        tmp_path / "spec.yaml",
        spec_dict(
            store,
            str(tmp_path / "out.zarr"),
            query="covariance",
            mechanism={"directions": {"method": "dp-pca", "k": 1}},
        ),
    )
    code = (
        "import sys, json\n"
        "from mvg_dask import api\n"
        "from mvg_dask.cli import main\n"
        f"plan = api.dry_run({str(spec)!r})\n"
        f"assert main(['release', {str(spec)!r}, '--dry-run']) == 0\n"
        f"assert main(['release', {str(spec)!r}, '--dry-run', '--json']) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))\n"
        "print(json.dumps({'heavy': heavy, 'features': plan.input.features}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"heavy": [], "features": 3}


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_one_sampling_path_the_plan_draws_what_the_release_adds(tmp_path, client, query):
    """Float noise: ``NoisePlan.draw`` (used by the experiments) gives the bytes a release adds.
    Lattice noise: the engine's lattice functions, applied to the query here, give the bytes the
    release publishes (the identity's exactly; the covariance's up to its sum's rounding)."""
    from mvg_dask import api
    from mvg_dask.engine.lattice import RecordLattice, square_release
    from mvg_dask.noise import NoiseKey

    X = data(4, 2500, seed=6, low=0, high=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=600)
    key = NoiseKey.from_seed(17).derive("release")
    for noise in ("float", "lattice"):
        mech = {"algorithm": "equi-modal"} if query == "covariance" else {}
        out = str(tmp_path / f"o-{noise}.zarr")
        spec = spec_dict(store, out, query=query, mechanism={**mech, "noise": noise})
        res = api.release(spec, client=client, seed=17, progress=False)
        ds = api.open_release(res.output)
        if noise == "float":
            Z = res.plan.draw(key)
            if query == "identity":
                assert (X + Z).tobytes() == ds["X"].values.tobytes()
            else:
                want = X @ X.T / 2500 + Z
                np.testing.assert_allclose(ds["covariance"].values, want, rtol=0, atol=1e-12)
        elif query == "identity":
            lattice = RecordLattice.for_plan(res.plan)
            Y = lattice.release(X, key, 0, 2500, tile=1024, n_total=2500)
            assert Y.tobytes() == ds["X"].values.tobytes()
        else:
            want = square_release(X @ X.T / 2500, res.plan, key)
            np.testing.assert_allclose(ds["covariance"].values, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_planning_20000_features_forms_no_m_by_m_matrix(tmp_path, query):
    """Standard directions at m = 20,000: planning, the plan's round trip, its public form and
    the noise description (variances, diagonal of Sigma, the output's noise variables) hold
    no m x m array (3.2 GB); numpy reports its allocations to tracemalloc, so the peak would
    show one even where the pages are never touched."""
    import tracemalloc

    from mvg_dask.engine.output import noise_variables

    m = 20_000
    meta = dataclasses.replace(META, shape=(m, 50_000), record_chunk=50, feature_names=None)
    spec, _ = _spec(tmp_path, query, {})
    tracemalloc.start()
    try:
        rplan = plan_release(spec, meta, created="2026-01-01T00:00:00+00:00")
        back = ReleasePlan.from_dict(
            json.loads(json.dumps(rplan.to_dict())), ledger_location="l.sqlite"
        )
        plan = back.noise_plan()
        rplan.public_dict()
        variables = noise_variables(back, plan)
        diagonal = plan.covariance.diag()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plan.directions.is_standard and plan.directions.shape == (m, m)
    assert variables["row_cov"].shape == (m, m) and diagonal.shape == (m,)
    assert peak < 400 * 2**20, f"peak {peak / 2**20:.0f} MiB"


# (query, overrides, features, stages) of every release kind the engine runs differently
STAGE_KINDS = {
    "identity": ("identity", {}, 5, ("identity",)),
    "identity-dp-pca": (
        "identity",
        {"mechanism": {"directions": {"method": "dp-pca", "k": 2}}},
        5,
        ("gram", "dp-pca", "identity"),
    ),
    "covariance": ("covariance", {}, 5, ("gram", "covariance")),
    "covariance-noisy-count": (
        "covariance",
        {"privacy": {"neighbours": "add-remove"}},
        5,
        ("noisy-count", "gram", "covariance"),
    ),
    "covariance-public-n0": (
        "covariance",
        {"privacy": {"neighbours": "add-remove", "records": 3000}},
        5,
        ("gram", "covariance"),
    ),
    "covariance-dp-pca-noisy-count": (
        "covariance",
        {
            "privacy": {"neighbours": "add-remove"},
            "mechanism": {"directions": {"method": "dp-pca", "k": 2}},
        },
        5,
        ("noisy-count", "gram", "dp-pca", "covariance"),
    ),
    "covariance-panels": (
        "covariance",
        {"output": {"matrix_chunk": 256}},
        600,
        ("covariance-panels",),
    ),
    "covariance-panels-lattice": (
        "covariance",
        {"output": {"matrix_chunk": 256}, "mechanism": {"noise": "lattice"}},
        600,
        ("covariance-panels",),
    ),
    "covariance-panels-dp-pca": (
        "covariance",
        {
            "output": {"matrix_chunk": 256},
            "mechanism": {"noise": "float", "directions": {"method": "dp-pca", "k": 2}},
        },
        600,
        ("dp-pca-panels", "covariance-panels"),
    ),
    "covariance-panels-dp-pca-lattice": (
        "covariance",
        {
            "output": {"matrix_chunk": 256},
            "privacy": {"neighbours": "add-remove"},
            "mechanism": {"noise": "lattice", "directions": {"method": "dp-pca", "k": 2}},
        },
        600,
        ("noisy-count", "dp-pca-panels", "low-rank-lattice-panels"),
    ),
}


def _stage_plan(tmp_path: Path, kind: str) -> ReleasePlan:
    query, overrides, m, _ = STAGE_KINDS[kind]
    spec, _ = _spec(tmp_path, query, overrides)
    meta = dataclasses.replace(META, shape=(m, 3000), feature_names=None)
    return plan_release(spec, meta, created="2026-01-01T00:00:00+00:00")


@pytest.mark.parametrize("kind", sorted(STAGE_KINDS))
def test_the_plan_says_which_stages_run(tmp_path, kind):
    """Each release kind's stages, in the plan, its JSON (a round trip keeps them) and the dry
    run's ``stages`` line; they follow from the plan's fields alone."""
    from mvg_dask.engine.preview import PlanPreview

    rplan = _stage_plan(tmp_path, kind)
    want = STAGE_KINDS[kind][3]
    assert rplan.stages == want == rplan.implied_stages()
    d = json.loads(json.dumps(rplan.to_dict()))
    assert d["stages"] == list(want) and rplan.public_dict()["stages"] == list(want)
    back = ReleasePlan.from_dict(d, ledger_location="l.sqlite")
    assert back.stages == want and back.to_dict() == rplan.to_dict()
    if rplan.uses_dp_pca:  # the directions do not change what runs
        assert dataclasses.replace(rplan, stages=()).stages == want
    line = next(ln for ln in PlanPreview(rplan, None).text().splitlines() if "stages" in ln)
    assert line.split() == ["stages", *" -> ".join(want).split()]


def test_a_plan_saved_without_stages_loads_and_wrong_stages_are_refused(tmp_path):
    """A plan saved before plans carried their stages (a pending release to resume) gets the
    stages its fields imply; a plan whose stages disagree with its fields is refused."""
    rplan = _stage_plan(tmp_path, "covariance-noisy-count")
    old = rplan.to_dict()
    del old["stages"]
    assert ReleasePlan.from_dict(old, ledger_location="l.sqlite").stages == rplan.stages
    wrong = {**rplan.to_dict(), "stages": ["gram", "covariance"]}
    with pytest.raises(ValueError, match="this plan runs noisy-count, gram, covariance"):
        ReleasePlan.from_dict(wrong, ledger_location="l.sqlite")
