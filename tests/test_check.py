"""``mvg-dask check`` / :func:`mvg_dask.api.check`: the curator-side data check.

The counts it reports (NaN, infinite and out-of-domain values, per feature; records outside an
L2 ball; a second variable against its own box; undeclared group labels) are compared with
numpy's on generated data; and a check charges nothing and publishes nothing: the ledger's
bytes and every other file are unchanged and no output store appears.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.engine.check import NOTICE, variable_counts
from mvg_dask.errors import ReleaseError
from mvg_dask.plan import input_metadata
from tests.pipeline_helpers import (
    add_group_variable,
    add_second_variable,
    data,
    make_input,
    run_cli,
    spec_dict,
    write_spec,
)

LEDGER = {"path": "ledger.sqlite", "dataset": "d", "budget": {"epsilon": 4, "delta": 1e-4}}


def _spoiled(m: int, n: int, seed: int) -> np.ndarray:
    """Data partly outside [0, 1], with values on its bounds 0 and 1, and NaN, +inf and -inf
    values in a few records."""
    X = data(m, n, seed=seed)
    X[0, 1], X[-1, 2] = 0.0, 1.0
    rng = np.random.default_rng(seed + 100)
    for value, count in ((np.nan, 7), (np.inf, 3), (-np.inf, 2)):
        X[rng.integers(0, m, count), rng.integers(0, n, count)] = value
    return X


def _box_counts(X: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> dict[str, Any]:
    """numpy's counts of ``X`` (features x records) against a box."""
    return {
        "nan_per_feature": np.isnan(X).sum(axis=1).tolist(),
        "inf_per_feature": np.isinf(X).sum(axis=1).tolist(),
        "below_lower_per_feature": (X < lower[:, None]).sum(axis=1).tolist(),
        "above_upper_per_feature": (X > upper[:, None]).sum(axis=1).tolist(),
        "nonfinite_records": int((~np.isfinite(X)).any(axis=0).sum()),
    }


def _subset(d: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in keys}


def _files(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


@pytest.mark.parametrize("records_first", [False, True])
def test_box_counts_and_undeclared_labels_are_numpys(
    tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch, records_first: bool
) -> None:
    # one task per stored chunk (and a last short chunk): the partial counts are summed
    monkeypatch.setattr(input_metadata, "TASK_ELEMENTS", 1)
    m, n = 4, 300
    X = _spoiled(m, n, seed=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=64, records_first=records_first)
    labels = np.random.default_rng(5).integers(0, 4, n)  # 3 is not declared
    add_group_variable(store, labels)
    lower, upper = np.array([0.0, -0.1, 0.1, 0.0]), np.array([1.0, 1.1, 0.9, 1.0])
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        query="centered-covariance",
        domain={"box": {"lower": lower.tolist(), "upper": upper.tolist()}},
        group_by={"variable": "site", "groups": [0, 1, 2]},
    )
    spec["mechanism"].pop("algorithm")
    report = api.check(spec, client=client, progress=False)

    want = _box_counts(X, lower, upper)
    got = report.to_dict()
    assert _subset(got["input"], want) == want
    assert got["records"] == n and got["features"] == m and report.input.features == m
    assert got["input"]["nan"] == int(np.isnan(X).sum()) == 7
    assert got["input"]["inf"] == int(np.isinf(X).sum())
    assert report.undeclared_labels == int((labels == 3).sum()) > 0
    assert report.cols is None and not report.clean
    assert got["input"]["feature_names"] == ["f0", "f1", "f2", "f3"]
    text = str(report)
    assert text.splitlines()[-1] == NOTICE
    assert "NaN values: 7 (" in text and "label not among the 3 declared groups" in text
    json.dumps(got)  # JSON-ready
    assert not (tmp_path / "out.zarr").exists()


def test_second_variable_is_counted_against_its_own_box(tmp_path: Path, client: Any) -> None:
    n = 300
    X = data(3, n, seed=2, low=0.0, high=1.0)  # inside its box
    Y = np.random.default_rng(3).uniform(-1.5, 2.5, (2, n))
    Y[1, 17] = np.nan
    store = make_input(tmp_path / "in.zarr", X, chunk=64)
    add_second_variable(store, Y, chunk=50)  # Y's chunks are not X's
    y_lower, y_upper = np.array([-1.0, 0.0]), np.array([2.0, 1.0])
    cols = {"variable": "Y", "features": ["g1"], "box": {"lower": [-1.0, 0.0], "upper": [2, 1]}}
    spec = {
        "name": "cross2",
        "input": {"store": store, "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": {"cross-covariance": {"rows": ["f0"], "cols": cols}},
        "privacy": {"epsilon": 1.0, "delta": 1e-5},
        "output": {"store": str(tmp_path / "out.zarr")},
    }
    report = api.check(spec, client=client, progress=False)
    assert report.input.outside == 0 and report.input.nan_total == 0
    assert report.cols is not None and report.cols.variable == "Y"
    want = _box_counts(Y, y_lower, y_upper)
    assert _subset(report.to_dict()["cols"], want) == want
    assert report.cols.nan == (0, 1) and report.cols.feature_names == ("g0", "g1")
    assert "query.cross-covariance.cols.box" in report.summary()


def test_l2_counts_are_numpys(tmp_path: Path, client: Any) -> None:
    X = _spoiled(5, 400, seed=4)
    radius = 1.6
    store = make_input(tmp_path / "in.zarr", X, chunk=96)
    spec = spec_dict(store, str(tmp_path / "out.zarr"), domain={"box": None, "l2_norm": radius})
    report = api.check(spec, client=client, progress=False)
    norms = np.linalg.norm(X, axis=0)  # NaN for a record with a NaN: never counted as over
    got = report.to_dict()["input"]
    assert got["over_radius"] == int((norms > radius).sum()) == report.input.outside
    assert 0 < got["over_radius"] < 400
    assert got["nan_per_feature"] == np.isnan(X).sum(axis=1).tolist()
    assert got["nonfinite_records"] == int((~np.isfinite(X)).any(axis=0).sum())
    assert "below_lower" not in got and report.input.below is None
    assert "L2 norm above the radius" in report.summary()


def test_the_verdict_follows_the_declared_missing_fill(tmp_path: Path, client: Any) -> None:
    """With ``domain.missing: {fill: ...}`` the NaN are filled, not an abort; only infinite
    values still stop a release (and the counts are the same raw counts)."""
    X = _spoiled(4, 300, seed=6)
    assert np.isnan(X).any() and np.isinf(X).any()
    store = make_input(tmp_path / "in.zarr", X, chunk=96)
    plain = api.check(spec_dict(store, str(tmp_path / "out.zarr")), client=client, progress=False)
    assert "first NaN or infinite value" in plain.summary()
    assert "declare domain.missing" in plain.summary()
    spec = spec_dict(store, str(tmp_path / "out.zarr"))
    spec["domain"] = {**spec["domain"], "missing": {"fill": 0.5}}
    filled = api.check(spec, client=client, progress=False)
    assert filled.to_dict()["input"] == plain.to_dict()["input"]
    text = filled.summary()
    assert "replace each NaN by the declared domain.missing fill" in text
    assert "first infinite value" in text and "first NaN" not in text


def test_block_counts_compare_as_a_release_clips() -> None:
    # integers compared as float64; inf is both infinite and above; NaN is neither below nor
    # above; the last two entries: records with a non-finite value, records over the radius
    # the bounds themselves (1.0 and 0.0 here) are inside the box
    block = np.array([[1.0, np.nan, np.inf], [-2.0, 0.0, 3.0]])
    got = variable_counts(block, np.array([0.0, 0.0]), np.array([1.0, 1.0]), 2.0)
    assert got.tolist() == [1, 0, 1, 0, 0, 1, 1, 1, 2, 2]
    ints = variable_counts(np.array([[0, 5, 9]], dtype=np.int16), np.array([1.0]), np.array([8.0]))
    assert ints.tolist() == [0, 0, 1, 1, 0, 0]


def test_cli_reports_and_charges_nothing_publishes_nothing(tmp_path: Path, client: Any) -> None:
    # a ledger holding a committed release of clean data, then a check of spoiled data
    clean = make_input(tmp_path / "clean.zarr", data(3, 200, seed=6, low=0.0, high=1.0))
    first = spec_dict(clean, str(tmp_path / "first.zarr"), ledger=LEDGER)
    api.release(resolved_ledger(first, tmp_path), client=client, progress=False)
    X = _spoiled(3, 300, seed=7)
    make_input(tmp_path / "in.zarr", X, chunk=100)
    write_spec(tmp_path / "spec.yaml", spec_dict("in.zarr", "out.zarr", ledger=LEDGER))
    before = _files(tmp_path)
    assert "ledger.sqlite" in before

    out = run_cli(tmp_path, "check", "spec.yaml", "--quiet")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == NOTICE and out.stderr == ""
    assert "variable 'X': 3 features" in out.stdout and "300 records" in lines[0]
    assert f"NaN values: {int(np.isnan(X).sum())} (" in out.stdout
    assert f"below the lower bound: {int((X < 0).sum())} (" in out.stdout
    assert f"above the upper bound: {int((X > 1).sum())} (" in out.stdout

    out = run_cli(tmp_path, "check", "spec.yaml", "--quiet", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = _box_counts(X, np.zeros(3), np.ones(3))
    assert _subset(got["input"], want) == want and got["notice"] == NOTICE
    assert out.stderr.strip() == NOTICE

    assert _files(tmp_path) == before  # the ledger's bytes included
    assert not (tmp_path / "out.zarr").exists()


def resolved_ledger(spec: dict[str, Any], root: Path) -> dict[str, Any]:
    """``spec`` with its ledger's relative path resolved against ``root`` (as a spec file's)."""
    return {**spec, "ledger": {**spec["ledger"], "path": str(root / spec["ledger"]["path"])}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bogus": 1}, "bogus: unknown key"),
        ({"input": {"store": "missing.zarr", "variable": "X"}}, "missing.zarr does not exist"),
        ({"domain": {"box": {"lower": [0, 0], "upper": 1}}}, "domain.box: domain lower has 2"),
    ],
)
def test_bad_spec_or_input_is_one_line_exit_2(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    make_input(tmp_path / "in.zarr", data(3, 100, seed=1))
    write_spec(tmp_path / "spec.yaml", {**spec_dict("in.zarr", "out.zarr"), **change})
    before = _files(tmp_path)
    out = run_cli(tmp_path, "check", "spec.yaml", "--quiet")
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("mvg-dask: error: ") and message in line
    assert out.stdout == "" and _files(tmp_path) == before


def test_unreadable_chunk_is_an_error_not_a_report(tmp_path: Path, client: Any) -> None:
    store = Path(make_input(tmp_path / "in.zarr", data(3, 200, seed=1), chunk=100))
    chunk = next(p for p in sorted((store / "X" / "c").rglob("*")) if p.is_file())
    chunk.write_bytes(b"not a chunk")
    spec = spec_dict(str(store), str(tmp_path / "out.zarr"))
    with pytest.raises(ReleaseError, match="cannot be read"):
        api.check(spec, client=client, progress=False)
