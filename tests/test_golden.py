"""Golden bytes: a seeded release of every kind publishes the same values, release after release.

Each case releases small generated data with a fixed seed, release id and plan time, and hashes
every stored chunk of the output (every file but the ``zarr.json`` metadata, which carries paths
and the plan): the published values, their encoding and their chunking. The digests are stored
in ``tests/data/golden.json``; a refactoring or a speed-up must leave them unchanged. A change
that means to alter published bytes regenerates them on purpose
(``MVG_DASK_REGEN_GOLDEN=1 pytest tests/test_golden.py``) and says so.

The cases use ``mechanism.noise: float`` (the noise as drawn before lattice releases existed, so
these digests were recorded before that option was introduced) and ``noise: lattice`` (the
floating-point-safe default).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask.engine.metadata import load_directions_matrix, read_input_metadata
from mvg_dask.engine.release import execute_release
from mvg_dask.plan.release_plan import plan_release
from mvg_dask.spec import parse_spec, resolve_paths
from tests.pipeline_helpers import make_input

GOLDEN = Path(__file__).parent / "data" / "golden.json"
REGEN = os.environ.get("MVG_DASK_REGEN_GOLDEN") == "1"
SEED = 20261125
CREATED = "2026-11-25T07:00:00+00:00"

#: case id -> (query, mechanism, privacy, features, records, output extras)
CASES: dict[str, dict[str, Any]] = {
    "identity-standard": {"query": "identity", "mechanism": {"algorithm": "unimodal"}},
    "identity-matrix": {
        "query": "identity",
        "mechanism": {
            "algorithm": "unimodal",
            "directions": {"method": "matrix", "path": "directions.npy"},
            "allocation": {"strategy": "binary", "share": 0.7, "important": [0]},
        },
    },
    "identity-dp-pca": {
        "query": "identity",
        "mechanism": {
            "algorithm": "unimodal",
            "directions": {"method": "dp-pca", "k": 2, "budget_share": 0.2},
        },
    },
    "identity-mvg-thm2": {
        "query": "identity",
        "mechanism": {"algorithm": "unimodal", "calibration": "mvg-thm2"},
    },
    "covariance-symmetric": {"query": "covariance", "mechanism": {"algorithm": "symmetric"}},
    "covariance-equi-modal": {"query": "covariance", "mechanism": {"algorithm": "equi-modal"}},
    "covariance-unimodal": {"query": "covariance", "mechanism": {"algorithm": "unimodal"}},
    "covariance-symmetric-matrix": {
        "query": "covariance",
        "mechanism": {
            "algorithm": "symmetric",
            "directions": {"method": "matrix", "path": "directions.npy"},
        },
    },
    "covariance-symmetric-dp-pca": {
        "query": "covariance",
        "mechanism": {
            "algorithm": "symmetric",
            "directions": {"method": "dp-pca", "k": 2, "budget_share": 0.2},
        },
    },
    "covariance-equi-modal-dp-pca": {
        "query": "covariance",
        "mechanism": {
            "algorithm": "equi-modal",
            "directions": {"method": "dp-pca", "k": 2, "budget_share": 0.2},
        },
    },
    "covariance-add-remove-count": {
        "query": "covariance",
        "mechanism": {"algorithm": "symmetric"},
        "privacy": {"neighbours": "add-remove"},
    },
    "covariance-add-remove-n0": {
        "query": "covariance",
        "mechanism": {"algorithm": "equi-modal"},
        "privacy": {"neighbours": "add-remove", "records": 300},
    },
    "covariance-mvg-thm3": {
        "query": "covariance",
        "mechanism": {"algorithm": "equi-modal", "calibration": "mvg-thm3"},
    },
    "wide-symmetric": {
        "query": "covariance",
        "features": 300,
        "mechanism": {"algorithm": "symmetric"},
        "output": {"matrix_chunk": 256},
    },
    "wide-equi-modal-dp-pca": {
        "query": "covariance",
        "features": 300,
        "mechanism": {
            "algorithm": "equi-modal",
            "directions": {"method": "dp-pca", "k": 3, "budget_share": 0.2},
        },
        "output": {"matrix_chunk": 256},
    },
    "wide-unimodal": {
        "query": "covariance",
        "features": 300,
        "mechanism": {"algorithm": "unimodal"},
        "output": {"matrix_chunk": 256},
    },
}


def _spec(case: str, root: Path, noise: str | None) -> dict[str, Any]:
    c = CASES[case]
    mechanism = {"calibration": "exact", **c["mechanism"]}
    if noise is not None:
        mechanism["noise"] = noise
    return {
        "name": "golden",
        "release_id": f"golden-{case}",
        "input": {"store": str(root / "input.zarr"), "variable": "X"},
        "domain": {"box": {"lower": -1.0, "upper": 1.0}, "on_violation": "clip"},
        "query": c["query"],
        "mechanism": mechanism,
        "privacy": {"epsilon": 1.0, "delta": 1e-6, **c.get("privacy", {})},
        "output": {"store": str(root / "release.zarr"), **c.get("output", {})},
    }


def _data(m: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    X = rng.uniform(-1.1, 1.1, (m, n))  # a few values outside the box: clipping is exercised
    X[:, : n // 2] *= np.linspace(0.2, 1.0, m)[:, None]  # unequal scales and correlations
    return X


def release_digests(case: str, root: Path, client: Any, noise: str | None) -> dict[str, str]:
    """SHA-256 of every stored chunk of the case's seeded release (relative path -> digest)."""
    c = CASES[case]
    m = c.get("features", 4)
    n = 320
    make_input(root / "input.zarr", _data(m, n), chunk=64)
    W = np.linalg.qr(np.random.default_rng(3).standard_normal((m, m)))[0]
    np.save(root / "directions.npy", W)
    spec = resolve_paths(parse_spec(_spec(case, root, noise)), root)
    rplan = plan_release(
        spec,
        read_input_metadata(spec.input),
        directions_matrix=load_directions_matrix(spec),
        created=CREATED,
    )
    execute_release(rplan, client, seed=SEED, progress=False)
    store = root / "release.zarr"
    return {
        p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.rglob("*"))
        if p.is_file() and p.name != "zarr.json"
    }


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


NOISE_KINDS = ("float", "lattice")


@pytest.mark.parametrize("noise", NOISE_KINDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_published_bytes_are_golden(case: str, noise: str, tmp_path: Path, client) -> None:
    if noise == "lattice" and case.startswith("wide-") and "dp-pca" in case:
        pytest.skip("lattice noise with low-rank (wide DP-PCA) directions is refused")
    digests = release_digests(case, tmp_path, client, noise)
    key = f"{noise}/{case}"
    if REGEN:
        golden = _golden()
        golden[key] = digests
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden digests regenerated")
    want = _golden().get(key)
    assert want is not None, f"no golden digests for {key}: regenerate them on purpose"
    assert digests == want, f"the published bytes of {key} changed"
