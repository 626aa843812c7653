"""The scale-aware allocation a box of features of different scales gets by default
(docs/howto/feature-scales.md; docs/bounds.md, "Scale-aware allocation").

* the choice is a function of the spec only: scale-aware where the declared box's per-feature
  scales differ and the query has one noise row per feature, uniform otherwise, a declared
  allocation always; the spec hash of a default that resolves to uniform is the old one;
* the noise variances follow the public scales (``Sigma`` proportional to ``diag(a^2)``);
* privacy: the planned ``Delta_M`` of the scale-aware noise bounds an independent oracle, the
  whitened change ``||A^-1 (f(X) - f(X')) B^-T||`` over every pair of box corners and random
  records, for every query it applies to, under replace-one and add-remove;
* accuracy: on an 8-feature table of widths 0.1 to 1e4 the centered covariance's median
  per-entry relative error falls by far more than 2x against uniform, at N = 3,000 and 1e5;
* the dry run names the allocation and why.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from mvg_dask.engine.metadata import read_input_metadata
from mvg_dask.engine.release import execute_release
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.presentation import plan_rows
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.privacy.sensitivity import augmented_scale
from mvg_dask.spec import parse_spec, resolve_paths, spec_hash
from mvg_dask.spec.allocation import choose_allocation
from tests.pipeline_helpers import make_input, write_spec

#: a 4-feature box of very different widths and offsets
LOWER = [0.0, -5.0, 10.0, 0.0]
UPPER = [0.1, 5.0, 110.0, 1000.0]
CREATED = "2026-11-27T07:00:00+00:00"
#: four unit-width boxes at different offsets
SHIFTED = {"lower": [0, 10, 20, 30], "upper": [1, 11, 21, 31]}


def _spec(
    root: Path, query: Any = "covariance", box: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "scale",
        "release_id": "scale-1",
        "input": {"store": str(root / "input.zarr"), "variable": "X"},
        "domain": {"box": box or {"lower": LOWER, "upper": UPPER}},
        "query": query,
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "output": {"store": str(root / "out.zarr")},
    }
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value}
    return spec


def _plan(root: Path, spec: dict[str, Any]) -> ReleasePlan:
    if not (root / "input.zarr").exists():
        rng = np.random.default_rng(0)
        lo, hi = np.array(LOWER), np.array(UPPER)
        make_input(root / "input.zarr", lo[:, None] + (hi - lo)[:, None] * rng.random((4, 50)))
    parsed = resolve_paths(parse_spec(spec), root)
    return plan_release(parsed, read_input_metadata(parsed.input), created=CREATED)


# -- the choice -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "box", "mechanism", "want"),
    [
        ("covariance", None, {}, "scale-aware"),
        ("centered-covariance", None, {}, "scale-aware"),
        ({"regression": {"target": "f1"}}, None, {}, "scale-aware"),
        ("identity", None, {}, "scale-aware"),
        ("mean", None, {}, "scale-aware"),
        ("covariance", {"lower": -1.0, "upper": 1.0}, {}, "uniform"),
        ("covariance", {"lower": [0, 0, 0, 0], "upper": [2, 2, 2, 2]}, {}, "uniform"),
        # equal widths, different offsets: the centred queries see equal scales, the raw
        # second moment does not
        (
            "centered-covariance",
            {"lower": [0, 10, 20, 30], "upper": [1, 11, 21, 31]},
            {},
            "uniform",
        ),
        ("covariance", {"lower": [0, 10, 20, 30], "upper": [1, 11, 21, 31]}, {}, "scale-aware"),
        ("covariance", None, {"allocation": {"strategy": "uniform"}}, "uniform"),
        ("covariance", None, {"directions": {"method": "dp-pca", "k": 2}}, "uniform"),
        ({"cross-covariance": {"rows": ["f0"], "cols": ["f1", "f2"]}}, None, {}, "uniform"),
    ],
)
def test_the_choice_reads_the_spec_only(
    query: Any, box: Any, mechanism: dict[str, Any], want: str, tmp_path: Path
) -> None:
    mech = {"algorithm": "unimodal"} if "cross" in str(query) else {}
    spec = _spec(tmp_path, query, box, mechanism={**mech, **mechanism})
    choice = choose_allocation(parse_spec(spec))
    assert choice.strategy == want, choice.reason
    rplan = _plan(tmp_path, spec)
    assert rplan.allocation.strategy == want
    assert rplan.allocation.reason == choice.reason and choice.reason.startswith(
        "declared" if mechanism.get("allocation") else "default"
    )


def test_the_spec_hash_names_the_resolved_strategy(tmp_path: Path) -> None:
    """A default resolving to uniform hashes as before (homogeneous boxes keep their bytes);
    a heterogeneous box's default hashes as its declared scale-aware, not as uniform."""

    def h(box: Any, strategy: str | None) -> str:
        mech = {} if strategy is None else {"allocation": {"strategy": strategy}}
        return spec_hash(parse_spec(_spec(tmp_path, box=box, mechanism=mech)))

    same = {"lower": -1.0, "upper": 1.0}
    assert h(same, None) == h(same, "uniform")
    assert h(None, None) == h(None, "scale-aware") != h(None, "uniform")


@pytest.mark.parametrize(
    ("query", "mechanism", "words"),
    [
        (
            {"cross-covariance": {"rows": ["f0"], "cols": ["f1", "f2"]}},
            {"algorithm": "unimodal"},
            "cross-covariance allocates its column side",
        ),
        ("covariance", {"directions": {"method": "dp-pca", "k": 2}}, "mix the features"),
    ],
)
def test_a_declared_scale_aware_allocation_is_refused_where_it_does_not_apply(
    query: Any, mechanism: dict[str, Any], words: str, tmp_path: Path
) -> None:
    spec = _spec(
        tmp_path, query, mechanism={**mechanism, "allocation": {"strategy": "scale-aware"}}
    )
    with pytest.raises(ValueError, match=words) as info:
        parse_spec(spec)
    assert "scale-aware does not apply here" in str(info.value)


def test_the_noise_variances_follow_the_public_scales(tmp_path: Path) -> None:
    """``Sigma`` proportional to ``diag(a^2)``: the largest absolute values for the raw second
    moment, the widths (and the constant's ``s / s'``) for the centred moment."""
    lo, hi = np.array(LOWER), np.array(UPPER)
    cov = _plan(tmp_path, _spec(tmp_path)).noise_plan().row_variances
    a = np.maximum(np.abs(lo), np.abs(hi))
    np.testing.assert_allclose(cov / cov[0], (a / a[0]) ** 2, rtol=1e-9)
    moment = _plan(tmp_path, _spec(tmp_path, "centered-covariance"))
    v = moment.noise_plan().row_variances
    w = hi - lo
    np.testing.assert_allclose(v[:4] / v[0], (w / w[0]) ** 2, rtol=1e-9)
    # the constant: s of the box, over s' of the records rescaled to unit widths
    s, unit = moment.query.scale, augmented_scale(4 / 4.0, 4)  # type: ignore[attr-defined]
    assert v[4] / v[0] == pytest.approx((s / unit / w[0]) ** 2, rel=1e-9)


# -- privacy: an independent oracle of the whitened sensitivity ----------------------------------
def _records(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Every corner of the box and 200 random records in it (seed 3), as rows."""
    corners = np.array(list(itertools.product(*zip(lo, hi, strict=True))))
    rng = np.random.default_rng(3)
    return np.vstack([corners, lo + (hi - lo) * rng.random((200, lo.size))])


def _whitened(D: np.ndarray, p: np.ndarray, algorithm: str, r: float | None) -> np.ndarray:
    """``||A^-1 D B^-T||`` of the noise (``A = diag(p^-1/2)``) for a stack of changes ``D``
    (``... x m x n``): unimodal ``B = I``; equi-modal ``B = A``; symmetric: the
    half-vectorisation with off-diagonal entries once, divided by ``sqrt(r)``."""
    q = np.sqrt(p)
    if algorithm == "unimodal":
        return np.sqrt(np.sum((q[:, None] * D) ** 2, axis=(-2, -1)))
    W = q[:, None] * D * q[None, :]
    if algorithm == "equi-modal":
        return np.sqrt(np.sum(W**2, axis=(-2, -1)))
    assert r is not None
    diag = np.sum(np.diagonal(W, axis1=-2, axis2=-1) ** 2, axis=-1)
    off = (np.sum(W**2, axis=(-2, -1)) - diag) / 2.0  # the upper triangle's squares
    return np.sqrt(diag + off / r)


def _oracle(rplan: ReleasePlan) -> float:
    """The largest whitened change of the query over pairs of the records of :func:`_records`
    (replace-one: ``x -> x'``; add-remove: ``x`` added), by the query's own definition:
    ``f(X) = X`` (identity), ``X 1 / N`` (mean), ``Z Z^T / N`` with ``z = x`` (covariance) or
    ``z = [x - c; s]`` (the moment queries)."""
    noise = rplan.noise_plan()
    p = 1.0 / noise.row_variances
    q, algorithm = rplan.query, rplan.algorithm
    lo, hi = rplan.domain.lower, rplan.domain.upper  # type: ignore[union-attr]
    X = _records(lo, hi)
    kind = q.kind
    N = 1.0 if kind == "identity" else float(q.records)
    if kind in ("centered-covariance", "regression"):
        c, s = q.centre_vector, q.scale  # type: ignore[attr-defined]
        X = np.hstack([X - c, np.full((X.shape[0], 1), s)])
    G = X[:, :, None] if kind in ("identity", "mean") else np.einsum("ki,kj->kij", X, X)
    r = noise.symmetric_ratio
    if rplan.neighbours == "add-remove":
        return float(np.max(_whitened(G / N, p, algorithm, r)))
    return float(
        max(np.max(_whitened((g[None] - G) / N, p, algorithm, r)) for g in G)  # every pair
    )


@pytest.mark.parametrize(
    ("query", "algorithm", "privacy"),
    [
        ("covariance", "symmetric", {}),
        ("covariance", "equi-modal", {}),
        ("covariance", "unimodal", {}),
        ("covariance", "symmetric", {"neighbours": "add-remove", "records": 300}),
        ("covariance", "equi-modal", {"neighbours": "add-remove"}),
        ("centered-covariance", "symmetric", {}),
        ("centered-covariance", "equi-modal", {}),
        ({"regression": {"target": "f1"}}, "symmetric", {}),
        ("identity", "unimodal", {}),
        ("mean", "unimodal", {}),
        ("mean", "unimodal", {"neighbours": "add-remove", "records": 300}),
    ],
)
def test_the_planned_sensitivity_bounds_the_oracle(
    query: Any, algorithm: str, privacy: dict[str, Any], tmp_path: Path
) -> None:
    """Soundness of the scale-aware noise: no pair of records moves the whitened query by more
    than the plan's ``Delta_M``, which the calibration holds at the release's ``mu``."""
    spec = _spec(tmp_path, query, mechanism={"algorithm": algorithm}, privacy=privacy)
    rplan = _plan(tmp_path, spec)
    assert rplan.allocation.strategy == "scale-aware"
    bound = rplan.noise_plan().mahalanobis_sensitivity
    oracle = _oracle(rplan)
    assert oracle <= bound * (1 + 1e-9), (oracle, bound)
    assert oracle >= 0.2 * bound, (oracle, bound)  # the bound is not vacuous either


def test_the_neighbour_cases_take_the_scale_aware_allocation(tmp_path: Path) -> None:
    """tests/test_neighbours.py's ``scaled-box`` cases publish a scale-aware plan."""
    from tests.test_neighbours import CASES, spec_for

    scaled = [c for c in CASES if c.domain == "scaled-box"]
    assert len(scaled) >= 5
    for case in scaled:
        spec = parse_spec(spec_for(case, tmp_path))
        assert choose_allocation(spec).strategy == "scale-aware", case.id


# -- accuracy -----------------------------------------------------------------------------------
#: 8 features of widths 0.1 to 1e4 (box [0, w]); every pair correlated (a common factor)
WIDTHS = np.array([0.1, 0.5, 3.0, 20.0, 100.0, 700.0, 3000.0, 1e4])
DATA_SEED, NOISE_SEEDS = 7, (0, 1, 2)


def heterogeneous_table(n: int, seed: int = DATA_SEED) -> np.ndarray:
    """``8 x n`` records: ``clip(0.5 + 0.2 (0.6 z + 0.8 u_i), 0, 1) w_i``, ``z`` shared."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n)
    u = rng.standard_normal((WIDTHS.size, n))
    return np.clip(0.5 + 0.2 * (0.6 * z + 0.8 * u), 0.0, 1.0) * WIDTHS[:, None]


def _released_covariance(root: Path, alloc: str | None, seed: int, client: Any) -> np.ndarray:
    out = root / f"out-{alloc}-{seed}.zarr"
    spec = _spec(
        root,
        "centered-covariance",
        {"lower": 0.0, "upper": WIDTHS.tolist()},
        output={"store": str(out)},
        mechanism={} if alloc is None else {"allocation": {"strategy": alloc}},
    )
    parsed = resolve_paths(parse_spec(spec), root)
    rplan = plan_release(parsed, read_input_metadata(parsed.input), created=CREATED)
    assert rplan.allocation.strategy == (alloc or "scale-aware")
    execute_release(rplan, client, seed=seed, progress=False)
    return np.asarray(zarr.open_group(str(out), mode="r")["covariance"][...])


def relative_errors(root: Path, X: np.ndarray, alloc: str | None, client: Any) -> list[float]:
    """The median over entries of ``|C_hat - C| / |C|`` (``C = numpy.cov(X, bias=True)``), one
    per seeded release."""
    C = np.cov(X, bias=True)
    return [
        float(np.median(np.abs(_released_covariance(root, alloc, s, client) - C) / np.abs(C)))
        for s in NOISE_SEEDS
    ]


@pytest.mark.parametrize("n", [3_000, 100_000])
def test_scale_aware_cuts_the_centered_covariance_error(n: int, tmp_path: Path, client) -> None:
    """At epsilon = 1, delta = 1e-6 (replace-one) the default beats uniform by >= 2x on the
    median per-entry relative error, for each of three seeded releases (seeds 0, 1, 2; data
    seed 7). Measured over ten releases: about 4,000x at both sizes (docs/howto/
    feature-scales.md), so a 2x threshold leaves the noise no realistic way to fail it."""
    X = heterogeneous_table(n)
    make_input(tmp_path / "input.zarr", X, chunk=min(n, 10_000))
    uniform = relative_errors(tmp_path, X, "uniform", client)
    scaled = relative_errors(tmp_path, X, None, client)
    for u, s in zip(uniform, scaled, strict=True):
        assert u >= 2.0 * s, (uniform, scaled)


# -- the dry run ----------------------------------------------------------------------------------
def test_the_dry_run_names_the_allocation_and_why(tmp_path: Path) -> None:
    make_input(tmp_path / "input.zarr", heterogeneous_table(500))
    box = {"lower": 0.0, "upper": WIDTHS.tolist()}
    path = write_spec(tmp_path / "spec.yaml", _spec(tmp_path, "centered-covariance", box))
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("  allocation ")]
    assert line.split(None, 1)[1] == (
        "scale-aware (default: the features' box widths differ, 0.1 to 1e+04; each feature's "
        "noise is sized by its own)"
    )
    declared = _spec(
        tmp_path, "centered-covariance", box, mechanism={"allocation": {"strategy": "uniform"}}
    )
    rows = dict(plan_rows(_plan(tmp_path, declared)))
    assert rows["allocation"] == "uniform (declared in mechanism.allocation)"
