"""The ``.mvg`` accessor on DataArrays and Datasets: release from memory or lazy data, dry run,
budget, noise std, confidence intervals (with a coverage check) and the covariance estimate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from scipy.stats import norm

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask.errors import IncompleteReleaseError
from mvg_dask.plan.estimators import covariance_from_identity
from mvg_dask.spec import SpecError

BOX = {"box": {"lower": 0.0, "upper": 1.0}}
PRIVACY = {"epsilon": 1.0, "delta": 1e-5}
SEED = 20261122


def dataarray(m: int = 4, n: int = 300, seed: int = 0) -> xr.DataArray:
    """Records inside [0, 1]^m (nothing clipped: the non-private value is X itself)."""
    X = np.random.default_rng(seed).uniform(0.05, 0.95, (m, n))
    return xr.DataArray(
        X,
        dims=("feature", "record"),
        coords={"feature": [f"f{i}" for i in range(m)], "record": np.arange(n)},
        name="X",
    )


def test_release_from_an_in_memory_dataarray(tmp_path: Path, client) -> None:
    arr = dataarray()
    rel = arr.mvg.release(
        tmp_path,
        query="identity",
        domain=BOX,
        privacy=PRIVACY,
        release_id="mem",
        client=client,
        seed=SEED,
        progress=False,
    )
    assert rel.mvg.check() is rel
    assert (tmp_path / "mem.zarr").is_dir() and (tmp_path / "mem.input.zarr").is_dir()
    assert rel["X"].dims == arr.dims and rel["X"].shape == arr.shape
    assert list(rel["feature"].values) == list(arr["feature"].values)
    assert rel.mvg.provenance["release_id"] == "mem"
    assert rel.mvg.provenance["seeded"]
    # the input copy is the DataArray (float64, same values)
    copy = xr.open_zarr(tmp_path / "mem.input.zarr", consolidated=False)["X"]
    np.testing.assert_array_equal(copy.values, arr.values)
    # noise is there, at the stated scale
    std = rel.mvg.noise_std()
    z = (rel["X"] - arr) / std
    assert 0.8 < float(z.std()) < 1.2


def test_release_from_a_lazy_dataset_records_first(tmp_path: Path, client) -> None:
    arr = dataarray(3, 500, seed=1).transpose("record", "feature")
    ds = xr.Dataset({"X": arr.chunk({"record": 128}), "other": ("record", np.zeros(500))})
    assert isinstance(ds["X"].data, da.Array)
    with pytest.raises(ValueError, match="2 data variables"):
        ds.mvg.dry_run(tmp_path, query="covariance", domain=BOX, privacy=PRIVACY)
    rel = ds.mvg.release(
        tmp_path,
        variable="X",
        query="covariance",
        domain=BOX,
        privacy=PRIVACY,
        mechanism={"algorithm": "equi-modal"},
        record_chunk=200,
        release_id="lazy",
        client=client,
        seed=SEED,
        progress=False,
    )
    assert rel["covariance"].dims == ("feature_row", "feature_col")
    truth = arr.values.T @ arr.values / 500
    std = rel.mvg.noise_std()
    assert np.all(np.abs(rel["covariance"].values - truth) < 6 * std.values)
    stored = xr.open_zarr(tmp_path / "lazy.input.zarr", consolidated=False)["X"]
    assert stored.dims == ("record", "feature") and stored.encoding["chunks"] == (200, 3)
    # a covariance release is its own unbiased estimate
    xr.testing.assert_identical(rel.mvg.covariance(), rel["covariance"])


def test_dry_run_writes_nothing_and_shows_a_table(tmp_path: Path) -> None:
    arr = dataarray()
    out = tmp_path / "out"
    preview = arr.mvg.dry_run(out, query="identity", domain=BOX, privacy=PRIVACY, name="nb")
    assert not out.exists()
    html = preview._repr_html_()
    assert "<table>" in html and "calibration exact" in html
    text = preview.text()
    assert "4 features x 300 records" in text and "not charged" in text
    lo, hi = (float(x) for x in text.split("noise std")[1].split("on")[0].split(".."))
    assert math.isclose(
        lo, float(np.sqrt(np.diag(preview.plan.noise_plan().row_cov)).min()), rel_tol=1e-3
    )
    assert hi >= lo
    # bad input: a clear error naming the field, nothing written
    with pytest.raises(SpecError, match=r"privacy\.epsilon"):
        arr.mvg.dry_run(out, query="identity", domain=BOX, privacy={"epsilon": -1, "delta": 0.1})
    with pytest.raises(ValueError, match="record_dim='rows'"):
        arr.mvg.dry_run(out, query="identity", domain=BOX, privacy=PRIVACY, record_dim="rows")
    assert not out.exists()


def test_budget_spent_and_left(tmp_path: Path, client) -> None:
    """Basic composition (mgm-udn): spent is the sum of the epsilons charged, left the rest; the
    dry run's budget line tells what the next release leaves before it is made."""
    ledger = {
        "path": str(tmp_path / "ledger.sqlite"),
        "dataset": "toy",
        "budget": {"epsilon": 3.0, "delta": 1e-4},
    }
    arr = dataarray(3, 200)
    kw = dict(
        query="identity",
        domain=BOX,
        privacy={"epsilon": 0.5, "delta": 1e-6},
        mechanism={"calibration": "mgm-udn"},
        ledger=ledger,
    )
    first = arr.mvg.dry_run(tmp_path, **kw)
    assert first.budget is not None and first.budget.spent_epsilon == 0.0
    assert math.isclose(first.budget.left_epsilon, 2.5)
    assert not (tmp_path / "ledger.sqlite").exists()  # reading the budget creates nothing
    rel = arr.mvg.release(tmp_path, client=client, progress=False, **kw)  # ledger: no seed
    table = rel.mvg.budget(tmp_path / "ledger.sqlite")
    row = table.loc["toy"]
    assert row["composition"] == "basic" and row["committed"] == 1
    assert math.isclose(row["spent_epsilon"], 0.5) and math.isclose(row["left_epsilon"], 2.5)
    assert math.isclose(row["spent_delta"], 1e-6)
    nxt = arr.mvg.dry_run(tmp_path, **kw)
    # two paper-calibrated releases: their privacy-loss-distribution total is within 0.1 % of
    # the basic sum, which is what is reported (PLD_REPORT_GAIN)
    assert nxt.budget.composition == "basic"
    assert math.isclose(nxt.budget.left_epsilon, 2.0)
    assert "left after this release: epsilon = 2" in nxt.text()
    with pytest.raises(ValueError, match="not in the ledger"):
        arr.mvg.budget(tmp_path / "ledger.sqlite", "other")


def test_noise_std_and_confidence_interval_coverage(tmp_path: Path, client) -> None:
    """95 % intervals of an identity release (standard directions: independent entries) cover
    the non-private value in 0.95 +- 3 sigma of its 8 x 1500 entries, sigma the binomial
    standard error (two-sided alpha ~ 0.0027 at a fixed seed SEED); 50 % intervals too."""
    arr = dataarray(8, 1500, seed=3)
    rel = arr.mvg.release(
        tmp_path,
        query="identity",
        domain=BOX,
        privacy=PRIVACY,
        mechanism={"allocation": {"strategy": "binary", "important": [0, 1], "share": 0.7}},
        client=client,
        seed=SEED,
        progress=False,
    )
    std = rel.mvg.noise_std()
    # second computation: the plan's per-entry std from its variances (not from row_cov)
    plan = rel.mvg.noise_plan()
    np.testing.assert_allclose(std.values, np.broadcast_to(plan.entry_std(), arr.shape), rtol=1e-12)
    assert len(np.unique(np.round(std.values[:, 0], 12))) == 2  # binary: two noise levels
    n = arr.size
    for level in (0.95, 0.5):
        ci = rel.mvg.confidence_intervals(level)
        assert math.isclose(ci.attrs["z"], norm.ppf(0.5 + level / 2))
        np.testing.assert_allclose(ci["half_width"], ci.attrs["z"] * std)
        covered = float(((ci["lower"] <= arr) & (arr <= ci["upper"])).mean())
        sigma = math.sqrt(level * (1 - level) / n)
        assert abs(covered - level) < 3 * sigma, (level, covered)
    with pytest.raises(ValueError, match="level"):
        rel.mvg.confidence_intervals(1.0)
    with pytest.raises(TypeError, match="release Dataset"):
        arr.mvg.noise_std()


def test_covariance_estimate_from_an_identity_release(tmp_path: Path, client) -> None:
    arr = dataarray(4, 400, seed=4)
    rel = arr.mvg.release(
        tmp_path,
        query="identity",
        domain=BOX,
        privacy={"epsilon": 4.0, "delta": 1e-3},
        client=client,
        seed=SEED,
        progress=False,
    )
    est = rel.mvg.covariance()
    assert est.dims == ("feature_row", "feature_col")
    Y = rel["X"].values
    np.testing.assert_allclose(est.values, covariance_from_identity(Y, rel.mvg.noise_plan()))
    np.testing.assert_allclose(est.values, Y @ Y.T / 400 - rel["row_cov"].values)


def test_accessor_refuses_an_incomplete_release(tmp_path: Path) -> None:
    ds = xr.Dataset(attrs={"mvg_dask_status": "incomplete", "mvg_dask_plan": json.dumps({})})
    with pytest.raises(IncompleteReleaseError):
        ds.mvg.noise_std()
    with pytest.raises(IncompleteReleaseError):
        ds.mvg.confidence_intervals()


def test_a_retried_release_id_is_the_same_release(tmp_path: Path, client) -> None:
    """Re-running a release id finds it complete (nothing charged twice); other data under the
    same id is refused before anything is released."""
    ledger = {"path": str(tmp_path / "l.sqlite"), "dataset": "d",
              "budget": {"epsilon": 5.0, "delta": 1e-4}}  # fmt: skip
    arr = dataarray(3, 100, seed=6)
    kw = dict(query="identity", domain=BOX, privacy=PRIVACY, ledger=ledger, release_id="again")
    # unseeded (a seed is refused with a ledger): the retry finds the first release complete
    first = arr.mvg.release(tmp_path, client=client, progress=False, **kw)
    second = arr.mvg.release(tmp_path, client=client, progress=False, **kw)
    xr.testing.assert_identical(first.load(), second.load())
    assert first.mvg.budget(tmp_path / "l.sqlite").loc["d", "releases"] == 1
    with pytest.raises(ValueError, match="other data"):
        (arr + 0.01).mvg.release(tmp_path, client=client, progress=False, **kw)
