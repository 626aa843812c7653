"""The release format (:mod:`mvg_dask.release_format`): one home for names, dimensions,
completeness, the Gaussian-noise variable, stored directions and the progress directory, read
without dask, zarr or xarray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest

from mvg_dask import release_format as rf
from mvg_dask.errors import IncompleteReleaseError

HEAVY = ("dask", "distributed", "zarr", "xarray", "fsspec")


def test_importing_the_format_loads_no_dask_zarr_or_xarray():
    code = (
        "import json, sys\n"
        "import mvg_dask.release_format\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})\n"
        "print(json.dumps(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_dims_are_built_and_parsed_back_in_one_place():
    assert rf.dims_for("feature") == ("feature_row", "feature_col")
    assert rf.feature_dim(rf.dims_for("f_row")) == "f_row"
    assert rf.attr("status") == "mvg_dask_status" == rf.STATUS_ATTR


def test_completeness():
    done = {rf.STATUS_ATTR: "complete", rf.RELEASE_ID_ATTR: "r1"}
    assert rf.is_complete(done) and rf.is_complete(done, "r1")
    assert not rf.is_complete(done, "r2")
    assert not rf.is_complete({rf.STATUS_ATTR: "incomplete", rf.RELEASE_ID_ATTR: "r1"})
    rf.check_complete(done)
    with pytest.raises(IncompleteReleaseError, match="status: 'incomplete'"):
        rf.check_complete({rf.STATUS_ATTR: "incomplete"})
    assert rf.describe({rf.STATUS_ATTR: "incomplete", rf.RELEASE_ID_ATTR: "r"}) == (
        "release 'r', incomplete"
    )
    assert rf.describe({rf.STATUS_ATTR: "incomplete", rf.RELEASE_ID_ATTR: "r"}, status=False) == (
        "release 'r'"
    )
    assert rf.describe({}) == "data that is not an mvg_dask release"


def test_one_rule_for_the_gaussian_variable():
    cov = {rf.QUERY_ATTR: "covariance", rf.INPUT_VARIABLE_ATTR: "X"}
    ident = {rf.QUERY_ATTR: "identity", rf.INPUT_VARIABLE_ATTR: "X"}
    assert rf.released_variable(cov) == rf.gaussian_variable(cov, {"covariance"}) == "covariance"
    # with a noisy count, covariance is a ratio of noisy values: the Gaussian noise is gram's
    assert rf.gaussian_variable(cov, {"covariance", "gram", "record_count"}) == "gram"
    assert rf.released_variable(ident) == rf.gaussian_variable(ident, {"X", "row_cov"}) == "X"


def test_stored_directions():
    U = np.linalg.qr(np.random.default_rng(0).standard_normal((5, 5)))[0]
    public = {"directions": {"important": [0, 1]}}
    d = rf.stored_directions({"directions": U, "dp_pca_eigenvalues": np.arange(5.0, 0, -1)}, public)
    assert d.method == "dp-pca" and d.important == (0, 1)
    np.testing.assert_array_equal(d.matrix, U)
    np.testing.assert_array_equal(d.eigenvalues, np.arange(5.0, 0, -1))
    assert rf.stored_directions({"directions": U}, public).eigenvalues is None


def test_progress_log_paths_and_markers(tmp_path: Path):
    root = str(tmp_path / "out.zarr")
    log = rf.ProgressLog(f"{root}/", fsspec.filesystem("file"), local=True)
    assert log.chunk_marker(100) == f"{root}/.mvg_dask_progress/100.json"
    assert log.abort_marker == f"{root}/.mvg_dask_progress/ABORT"
    assert log.plan_file == f"{root}/.mvg_dask_progress/plan.json"
    log.make()
    assert log.load_plan() is None
    log.save_plan({"release_id": "r"})
    assert log.load_plan() == {"release_id": "r"}
    assert json.loads(Path(log.plan_file).read_text()) == {"release_id": "r"}
    log.mark_aborted()
    assert Path(log.abort_marker).exists()
    log.clear_abort()
    assert not Path(log.abort_marker).exists()
    assert log.claim("r") == "r" and log.claim("s") == "r" and log.claim_owner() == "r"
    log.unclaim("s")
    assert log.claim_owner() == "r"
    log.unclaim("r")
    assert log.claim_owner() is None
    log.remove()
    assert not Path(log.path).exists()
