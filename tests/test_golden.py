"""Golden bytes: a seeded release of every kind publishes the same values, release after release.

Each case releases small generated data with a fixed seed, release id and plan time. The golden
file ``tests/data/golden.json`` holds, per case, two records of the output (every file but the
``zarr.json`` metadata, which carries paths and the plan):

* ``exact``: the SHA-256 of every stored chunk (the published values, their encoding and their
  chunking), per *numerical platform*: the numpy version and the BLAS library, version and kernel
  (:func:`platform_signature`). Dense products, QR and eigen-decompositions are computed by BLAS
  and LAPACK, whose kernels (Haswell, SkylakeX, Zen, Neoverse, ...) order their sums differently,
  so the same code gives the same bytes on one platform and values that differ in the last bits
  on another. Where the running platform has recorded digests, every byte must match.
* ``values``: the stored chunk files (so the chunking and the arrays) and, per array, its
  shape, dtype and a fingerprint of its values: the exact bytes of a non-float array, and for a
  float array its L2 norm and four projections on fixed Gaussian vectors. These must match on
  every platform within ``RTOL`` times ``||values|| ||w||``. BLAS reorderings move published values
  by at most ~3e-13 relative (measured between the Haswell and SkylakeX kernels of the same
  OpenBLAS: ``tests/data/golden.json`` holds both); a changed noise draw, calibration or formula
  moves them by the noise's size, 10^-3 relative and more.

A refactoring or a speed-up must leave both unchanged. A change that means to alter published
values regenerates them on purpose (``MVG_DASK_REGEN_GOLDEN=1 pytest tests/test_golden.py``: the
values and this platform's digests of the cases it runs, dropping the other platforms' digests
of those cases) and says so. The digests of a
new platform are added with ``MVG_DASK_GOLDEN_PLATFORM=1``, which records them only for cases whose
values already match.

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
import threadpoolctl
import zarr

from mvg_dask.engine.metadata import load_directions_matrix, read_input_metadata
from mvg_dask.engine.release import execute_release
from mvg_dask.plan.planning import plan_release
from mvg_dask.spec import parse_spec, resolve_paths
from tests.pipeline_helpers import make_input

GOLDEN = Path(__file__).parent / "data" / "golden.json"
REGEN = os.environ.get("MVG_DASK_REGEN_GOLDEN") == "1"
ADD_PLATFORM = os.environ.get("MVG_DASK_GOLDEN_PLATFORM") == "1"
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
    # a box of features of different widths: the scale-aware allocation it takes by default
    "covariance-scale-aware": {
        "query": "covariance",
        "mechanism": {"algorithm": "symmetric"},
        "domain": {"lower": [-0.25, -0.5, -1.0, -1.0], "upper": [0.25, 0.5, 1.0, 4.0]},
    },
    "centered-scale-aware": {
        "query": "centered-covariance",
        "mechanism": {"algorithm": "symmetric"},
        "domain": {"lower": [-0.25, -0.5, -1.0, -1.0], "upper": [0.25, 0.5, 1.0, 4.0]},
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
        "domain": {
            "box": c.get("domain", {"lower": -1.0, "upper": 1.0}),
            "on_violation": "clip",
        },
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


def release_store(case: str, root: Path, client: Any, noise: str | None) -> Path:
    """Release the case's seeded output under ``root`` and return its store."""
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
    return root / "release.zarr"


def release_digests(store: Path) -> dict[str, str]:
    """SHA-256 of every stored chunk of a release (relative path -> digest)."""
    return {
        p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.rglob("*"))
        if p.is_file() and p.name != "zarr.json"
    }


#: Fingerprint projections: ``PROJECTIONS`` fixed Gaussian vectors (seed ``PROJECTION_SEED``).
PROJECTIONS = 4
PROJECTION_SEED = 20261125
#: Relative tolerance of a float fingerprint, against ``||values|| ||w||``.
RTOL = 1e-9


def _weights(size: int) -> np.ndarray:
    return np.random.default_rng(PROJECTION_SEED).standard_normal((PROJECTIONS, size))


def release_values(store: Path) -> dict[str, Any]:
    """The chunk files and a fingerprint of every stored array (see the module text)."""
    group = zarr.open_group(str(store), mode="r")
    arrays: dict[str, Any] = {}
    for name, arr in sorted(group.arrays()):
        values = np.asarray(arr[...])
        entry: dict[str, Any] = {"shape": list(values.shape), "dtype": str(values.dtype)}
        if values.dtype.kind == "f":
            v = values.astype(np.float64).ravel()
            entry["norm"] = float(np.linalg.norm(v))
            entry["projections"] = [float(x) for x in _weights(v.size) @ v]
        else:
            entry["sha256"] = hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()
        arrays[name] = entry
    return {"files": sorted(release_digests(store)), "arrays": arrays}


def values_mismatch(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """What differs between two :func:`release_values` records (empty: they agree)."""
    if got["files"] != want["files"]:
        return [f"chunk files {got['files']} != {want['files']}"]
    if sorted(got["arrays"]) != sorted(want["arrays"]):
        return [f"arrays {sorted(got['arrays'])} != {sorted(want['arrays'])}"]
    problems = []
    for name, g in got["arrays"].items():
        w = want["arrays"][name]
        if (g["shape"], g["dtype"]) != (w["shape"], w["dtype"]):
            problems.append(f"{name}: {g['shape']} {g['dtype']} != {w['shape']} {w['dtype']}")
        elif "sha256" in w:
            if g.get("sha256") != w["sha256"]:
                problems.append(f"{name}: bytes differ")
        else:
            size = int(np.prod(w["shape"]))
            scale = np.linalg.norm(_weights(size), axis=1) * max(w["norm"], g["norm"])
            diff = np.abs(np.array(g["projections"]) - np.array(w["projections"]))
            if abs(g["norm"] - w["norm"]) > RTOL * w["norm"] or np.any(diff > RTOL * scale):
                problems.append(
                    f"{name}: values moved (norm {g['norm']!r} vs {w['norm']!r}, "
                    f"projections {g['projections']} vs {w['projections']})"
                )
    return problems


def platform_signature() -> str:
    """numpy's version and the BLAS library, version and kernel that run its products."""
    blas = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    libs = ", ".join(
        sorted(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}" for i in blas)
    )
    return f"numpy {np.__version__}; {libs or 'no BLAS seen'}"


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"exact": {}, "values": {}}


def _write_golden(golden: dict[str, Any]) -> None:
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


NOISE_KINDS = ("float", "lattice")


@pytest.mark.parametrize("noise", NOISE_KINDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_published_bytes_are_golden(case: str, noise: str, tmp_path: Path, client) -> None:
    store = release_store(case, tmp_path, client, noise)
    digests, values = release_digests(store), release_values(store)
    key, platform = f"{noise}/{case}", platform_signature()
    golden = _golden()
    if REGEN:  # this case's values and this platform's digests; the other platforms' dropped
        golden["values"][key] = values
        for other in golden["exact"].values():
            other.pop(key, None)
        golden["exact"].setdefault(platform, {})[key] = digests
        _write_golden(golden)
        pytest.skip("golden values and digests regenerated")
    want = golden["values"].get(key)
    assert want is not None, f"no golden values for {key}: regenerate them on purpose"
    problems = values_mismatch(values, want)
    assert not problems, f"the published values of {key} changed: " + "; ".join(problems)
    if ADD_PLATFORM:
        golden["exact"].setdefault(platform, {})[key] = digests
        _write_golden(golden)
    exact = golden["exact"].get(platform, {}).get(key)
    if exact is not None:
        assert digests == exact, f"the published bytes of {key} changed on {platform}"


def test_fingerprints_tolerate_last_bit_changes_but_not_real_ones() -> None:
    """The tolerance is far below a noise draw and far above BLAS's reorderings."""
    rng = np.random.default_rng(1)
    v = rng.standard_normal(1000)
    base = {"arrays": {"a": _fingerprint(v)}, "files": []}
    nudged = np.nextafter(v, np.inf)  # every entry one ulp up: what another BLAS kernel does
    assert not values_mismatch({"arrays": {"a": _fingerprint(nudged)}, "files": []}, base)
    moved = v.copy()
    moved[17] += 1e-6 * np.linalg.norm(v)  # one entry moved far less than any noise draw
    assert values_mismatch({"arrays": {"a": _fingerprint(moved)}, "files": []}, base)
    assert values_mismatch({"arrays": {"a": _fingerprint(v[::-1].copy())}, "files": []}, base)


def _fingerprint(v: np.ndarray) -> dict[str, Any]:
    return {
        "shape": list(v.shape),
        "dtype": str(v.dtype),
        "norm": float(np.linalg.norm(v)),
        "projections": [float(x) for x in _weights(v.size) @ v],
    }
