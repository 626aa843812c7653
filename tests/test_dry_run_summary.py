"""The dry run reads like a plan (``mvg-dask release --dry-run``), the JSON stays behind
``--json``; and a release opens quietly with plain ``xr.open_zarr``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from mvg_dask import api
from mvg_dask.errors import IncompleteReleaseError
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

LABELS = (
    "read",
    "query",
    "domain",
    "mechanism",
    "allocation",
    "sensitivity",
    "noise std",
    "arithmetic",
    "privacy",
    "stages",
    "write",
    "budget",
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_cli_dry_run_prints_a_short_summary_and_json_on_request(tmp_path: Path) -> None:
    store = make_input(tmp_path / "in.zarr", data(3, 500), chunk=100)
    ledger = tmp_path / "ledger.sqlite"
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        release_id="plan-1",
        ledger={"path": str(ledger), "dataset": "d", "budget": {"epsilon": 4.0, "delta": 1e-4}},
    )
    path = write_spec(tmp_path / "spec.yaml", spec)
    text = _cli(str(path), "--dry-run")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) <= 16 and lines[0].startswith("release plan plan-1")
    assert [ln.split()[0] if not ln.startswith("  noise") else "noise std" for ln in lines[1:]] == [
        label.split()[0] if label != "noise std" else "noise std" for label in LABELS
    ]
    body = text.stdout
    assert "3 features x 500 records" in body and "calibration exact" in body
    assert "epsilon = 1, delta = 1e-05 (replace-one)" in body
    lattice = api.dry_run(path).noise_plan().lattice
    assert lattice is not None and f"lattice noise: grid 2^{lattice.log2_grid}" in body
    plan = api.dry_run(path)
    std = plan.noise_plan().entry_std()
    assert f"{std.min():.4g} .. {std.max():.4g}" in body
    assert f"Delta_M = {plan.noise_plan().mahalanobis_sensitivity:.4g}" in body
    assert "spent epsilon = 0 of 4; left after this release: epsilon = " in body
    assert not ledger.exists() and not (tmp_path / "out.zarr").exists()
    as_json = _cli(str(path), "--dry-run", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["plan"] == plan.public_dict()["plan"]
    wrong = _cli(str(path), "--json")
    assert wrong.returncode == 2 and "--json goes with --dry-run" in wrong.stderr


def test_dry_run_summary_is_the_same_for_neighbouring_datasets(tmp_path: Path) -> None:
    """Add-remove: N and N + 1 records give the same summary (the count is shown as ``?``),
    with a noisy count and with DP-PCA directions."""
    X = data(3, 320, seed=4)
    texts = []
    for Xi in (X, np.concatenate([X, np.full((3, 1), 3.0)], axis=1)):
        shutil.rmtree(tmp_path / "in.zarr", ignore_errors=True)  # one input path for both
        store = make_input(tmp_path / "in.zarr", Xi, chunk=64)
        for directions in ({"method": "standard"}, {"method": "dp-pca", "k": 2}):
            spec = spec_dict(
                store,
                str(tmp_path / "out.zarr"),
                query="covariance",
                release_id="nbr",
                mechanism={"directions": directions},
                privacy={"epsilon": 1.0, "delta": 1e-5, "neighbours": "add-remove"},
            )
            text = api.preview(write_spec(tmp_path / "s.yaml", spec)).text()
            texts.append((directions["method"], text))
    assert texts[0] == texts[2] and texts[1] == texts[3]
    assert "x ? records" in texts[0][1] and "noisy record count" in texts[0][1]


def test_a_release_opens_quietly_with_plain_xarray(tmp_path: Path, client) -> None:
    store = make_input(tmp_path / "in.zarr", data(3, 300), chunk=100)
    out = tmp_path / "out.zarr"
    res = api.release(spec_dict(store, str(out)), client=client, seed=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = xr.open_zarr(out)  # no "Failed to open Zarr store with consolidated metadata"
        opened = api.open_release(res.output)
    assert ds.attrs["mvg_dask_status"] == "complete"
    xr.testing.assert_identical(ds.load(), opened.load())
    root = json.loads((out / "zarr.json").read_text())
    # status and the consolidated metadata are in the one root document (one last write)
    assert root["attributes"]["mvg_dask_status"] == "complete"
    assert set(root["consolidated_metadata"]["metadata"]) >= {"X", "row_cov", "feature"}


def test_an_incomplete_store_is_refused_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "half.zarr"
    xr.Dataset(
        {"X": (("a", "b"), np.zeros((2, 2)))}, attrs={"mvg_dask_status": "incomplete"}
    ).to_zarr(path, zarr_format=3, consolidated=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(IncompleteReleaseError, match="not a complete release"):
            api.open_release(str(path))
