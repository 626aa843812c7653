"""The distributed release pipeline: Zarr -> Dask -> MVG noise blockwise -> Zarr."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from scipy import stats

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.errors import DataError, IncompleteReleaseError, ReleaseError
from tests.cluster_helpers import loopback_cluster
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

ALPHA = 1e-3


def test_identity_release_is_mvg_noise_on_the_clipped_input(tmp_path, client):
    X = data(5, 3000, seed=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=700)
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        mechanism={"allocation": {"strategy": "binary", "important": [1, 3], "share": 0.7}},
    )
    res = api.release(spec, client=client, seed=11, progress=False)
    ds = api.open_release(res.output)
    assert ds.attrs["mvg_dask_status"] == "complete"
    assert ds["X"].dims == ("feature", "record")
    assert list(ds["feature"].values) == [f"f{i}" for i in range(5)]
    clipped = np.clip(X, 0, 1)
    # an exact count of clipped values would tell whether one record is out of the domain
    assert "mvg_dask_clipped_count" not in ds.attrs
    Z = ds["X"].values - clipped
    L = np.linalg.cholesky(ds["row_cov"].values)
    w = np.linalg.solve(L, Z).ravel()
    # whitened by row_cov the noise is iid N(0, 1) (alpha = 1e-3, seed 11)
    assert stats.kstest(w, "norm").pvalue > ALPHA
    C = np.corrcoef(np.linalg.solve(L, Z))
    assert np.max(np.abs(C - np.eye(5))) < 5 / np.sqrt(3000)
    for key in (
        "mvg_dask_release_id",
        "mvg_dask_query",
        "mvg_dask_algorithm",
        "mvg_dask_calibration",
        "mvg_dask_epsilon",
        "mvg_dask_delta",
        "mvg_dask_neighbours",
        "mvg_dask_sensitivity",
        "mvg_dask_mahalanobis_sensitivity",
        "mvg_dask_seeded",
        "mvg_dask_version",
    ):
        assert key in ds.attrs
    assert ds.attrs["mvg_dask_seeded"] is True
    assert not list(tmp_path.glob("*.staging-*"))


def test_same_bytes_whatever_the_input_chunking_and_layout(tmp_path, client):
    X = data(4, 2500, seed=2)
    outs = []
    for i, (chunk, records_first) in enumerate([(500, False), (333, False), (2500, True)]):
        store = make_input(tmp_path / f"in{i}.zarr", X, chunk=chunk, records_first=records_first)
        spec = spec_dict(
            store, str(tmp_path / f"out{i}.zarr"), input={"store": store, "variable": "X"}
        )
        res = api.release(spec, client=client, seed=5, progress=False)
        values = api.open_release(res.output)["X"]
        outs.append(values.transpose("feature", "record").values)
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()


def test_gram_summed_on_the_client_or_the_workers_gives_the_same_bytes(
    tmp_path, client, monkeypatch
):
    """Small partial Gram matrices are summed on the client in the workers' tree order: the
    covariance bytes are those of the worker reduction, whose folds run on two workers with
    consecutive leaves placed together (one task per chunk: 71 leaves, three tree levels, so a
    fold over other groups would give other bytes)."""
    from mvg_dask.engine.stages import gram
    from mvg_dask.plan import input_metadata

    monkeypatch.setattr(input_metadata, "TASK_ELEMENTS", 1)
    store = make_input(tmp_path / "in.zarr", data(4, 7100, seed=9), chunk=100)
    outs = []
    for limit in (gram.CLIENT_REDUCE_BYTES, 0):
        monkeypatch.setattr(gram, "CLIENT_REDUCE_BYTES", limit)
        spec = spec_dict(store, str(tmp_path / f"cov{limit}.zarr"), query="covariance")
        res = api.release(spec, client=client, seed=3, progress=False)
        outs.append(api.open_release(res.output)["covariance"].values)
    assert outs[0].tobytes() == outs[1].tobytes()


def test_covariance_with_huge_epsilon_is_the_clipped_second_moment(tmp_path, client):
    X = data(6, 4000, seed=3)
    store = make_input(tmp_path / "in.zarr", X, chunk=512)
    spec = spec_dict(
        store,
        str(tmp_path / "cov.zarr"),
        query="covariance",
        privacy={"epsilon": 1e9, "delta": 1e-5},
    )
    res = api.release(spec, client=client, seed=1, progress=False)
    ds = api.open_release(res.output)
    Xc = np.clip(X, 0, 1)
    assert np.allclose(ds["covariance"].values, Xc @ Xc.T / 4000, rtol=1e-6, atol=1e-9)
    assert ds["covariance"].dims == ("feature_row", "feature_col")
    assert "col_cov" in ds and np.allclose(ds["col_cov"], ds["row_cov"])


@pytest.mark.parametrize("calibration", ["exact", "mvg-thm2"])
def test_dp_pca_release(tmp_path, client, calibration):
    X = data(6, 3000, seed=4, low=0, high=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=1000)
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        query="covariance",
        mechanism={
            "calibration": calibration,
            "directions": {"method": "dp-pca", "budget_share": 0.2, "k": 2},
            "allocation": {"strategy": "binary", "share": 0.8},
        },
    )
    res = api.release(spec, client=client, seed=2, progress=False)
    ds = api.open_release(res.output)
    W = ds["directions"].values
    assert np.allclose(W.T @ W, np.eye(6), atol=1e-10)
    plan = json.loads(ds.attrs["mvg_dask_plan"])
    assert plan["directions"]["method"] == "dp-pca"
    assert plan["composition"]["direction_share"] == 0.2


def test_dry_run_reads_no_chunk_and_matches_the_release(tmp_path, client):
    X = data(3, 1000, seed=5)
    store = make_input(tmp_path / "in.zarr", X, chunk=250)
    hidden = tmp_path / "chunks-hidden"
    shutil.move(str(Path(store) / "X" / "c"), hidden)  # no chunk data left: reading one fails
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        release_id="fixed-id",
        mechanism={"allocation": {"strategy": "binary", "important": [0], "share": 0.6}},
    )
    path = write_spec(tmp_path / "spec.yaml", spec)
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path), "--dry-run", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    dry = json.loads(out.stdout)
    assert not (tmp_path / "out.zarr").exists()
    shutil.move(str(hidden), str(Path(store) / "X" / "c"))
    res = api.release(path, client=client, seed=3, progress=False)
    attrs = api.open_release(res.output).attrs
    assert dry["plan"] == json.loads(attrs["mvg_dask_plan"])
    assert dry["release_id"] == attrs["mvg_dask_release_id"] == "fixed-id"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"input": {"store": "MISSING", "variable": "X"}}, "does not exist"),
        ({"input": {"variable": "Y"}}, "'Y' is not in"),
        ({"input": {"record_dim": "rows"}}, "record_dim='rows'"),
        ({"domain": {"box": {"lower": [0, 0], "upper": 1}}}, "2 values but the data has 3"),
        ({"mechanism": {"allocation": {"strategy": "binary", "important": [5]}}}, "out of range"),
        ({"mechanism": {"directions": {"method": "dp-pca", "k": 7}}}, "1..3"),
        (
            {"domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "error"}},
            "outside the declared",
        ),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, client, change, needle):
    X = data(3, 500, seed=6)
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = spec_dict(store, str(tmp_path / "out.zarr"), **change)
    if spec["input"]["store"] == "MISSING":
        spec["input"]["store"] = str(tmp_path / "missing.zarr")
    with pytest.raises((DataError, ReleaseError), match=needle):
        api.release(spec, client=client, seed=1, progress=False)
    assert not (tmp_path / "out.zarr").exists()
    assert not list(tmp_path.glob("out.zarr.staging-*"))


def test_nan_is_rejected_and_nothing_written(tmp_path, client):
    X = data(3, 600, seed=7)
    X[1, 450] = np.nan
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = spec_dict(store, str(tmp_path / "out.zarr"))
    with pytest.raises(DataError, match=r"NaN or infinite values in records 400\.\.499"):
        api.release(spec, client=client, seed=1, progress=False)
    assert list(tmp_path.iterdir()) == [tmp_path / "in.zarr"]


def test_output_that_exists_is_refused_and_readers_refuse_incomplete(tmp_path, client):
    X = data(3, 300, seed=8)
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    out = tmp_path / "out.zarr"
    api.release(spec_dict(store, str(out)), client=client, seed=1, progress=False)
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(ReleaseError, match="already exists"):
        api.release(spec_dict(store, str(out)), client=client, seed=1, progress=False)
    assert sorted(p.name for p in out.rglob("*")) == before
    with pytest.raises(IncompleteReleaseError, match="not a complete release"):
        api.open_release(store)  # the input is not a release


@pytest.mark.cluster
def test_real_multiprocess_cluster_gives_the_same_bytes(tmp_path, client):
    """A `dask scheduler` + two `dask worker` processes on loopback, started by the test."""
    X = data(4, 3000, seed=9)
    store = make_input(tmp_path / "in.zarr", X, chunk=600)
    with loopback_cluster(tmp_path) as address:
        path = write_spec(tmp_path / "spec.yaml", spec_dict(store, str(tmp_path / "a.zarr")))
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "mvg_dask",
                "release",
                str(path),
                "--scheduler",
                address,
                "--seed",
                "42",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
    remote = api.open_release(str(tmp_path / "a.zarr"))["X"].values
    store2 = make_input(tmp_path / "in2.zarr", X, chunk=1000)
    local = api.release(
        spec_dict(store2, str(tmp_path / "b.zarr")), client=client, seed=42, progress=False
    )
    assert remote.tobytes() == api.open_release(local.output)["X"].values.tobytes()


def test_cli_release_errors_are_one_line(tmp_path):
    path = write_spec(tmp_path / "spec.yaml", {"name": "x", "bogus": 1})
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert "bogus: unknown key" in out.stderr and "Traceback" not in out.stderr


def test_xarray_reads_the_release_directly(tmp_path, client):
    X = data(3, 200, seed=10)
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    res = api.release(
        spec_dict(store, str(tmp_path / "o.zarr")), client=client, seed=1, progress=False
    )
    ds = xr.open_zarr(res.output, consolidated=False)
    assert ds["X"].shape == (3, 200) and ds["row_cov"].shape == (3, 3)
    assert os.path.isdir(res.output)


def test_xarray_accessor(tmp_path, client):
    X = data(3, 400, seed=11)
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    ds = api.open_release(
        api.release(
            spec_dict(store, str(tmp_path / "i.zarr")), client=client, seed=1, progress=False
        ).output
    )
    assert ds.mvg.provenance["calibration"] == "exact"
    assert ds.mvg.provenance["record_domain"] == {"box": {"lower": [0.0] * 3, "upper": [1.0] * 3}}
    assert ds.mvg.provenance["seeded"] is True
    std = ds.mvg.noise_std()
    assert std.shape == ds["X"].shape
    assert np.allclose(std.isel(record=0).values, np.sqrt(np.diag(ds["row_cov"].values)))
    assert ds.mvg.plan["epsilon"] == 1.0
    cov = api.open_release(
        api.release(
            spec_dict(store, str(tmp_path / "c.zarr"), query="covariance"),
            client=client,
            seed=1,
            progress=False,
        ).output
    )
    s = cov.mvg.noise_std()
    # the published (Z + Z^T) / 2 of equi-modal noise with standard directions: Sigma_ii on
    # the diagonal, sqrt(Sigma_ii Sigma_jj / 2) off it (tests/test_accuracy.py measures it)
    v = np.diag(cov["row_cov"].values)
    want = np.sqrt(np.outer(v, v) / 2)
    np.fill_diagonal(want, v)
    assert s.shape == (3, 3) and np.allclose(s.values, want, rtol=1e-12)


def test_provenance_of_an_unseeded_release(tmp_path, client):
    """A private release's provenance: its empty ``seeded_note`` is a string, not JSON."""
    store = make_input(tmp_path / "in.zarr", data(3, 100, seed=12), chunk=50)
    out = str(tmp_path / "u.zarr")
    ds = api.open_release(api.release(spec_dict(store, out), client=client, progress=False).output)
    prov = ds.mvg.provenance
    assert prov["seeded"] is False and prov["seeded_note"] == ""
    assert prov["noise"] == "lattice" and isinstance(prov["lattice_log2_grid"], int)
    assert prov["record_domain"] == {"box": {"lower": [0.0] * 3, "upper": [1.0] * 3}}


def test_release_plan_repr(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(3, 100, seed=12), chunk=50)
    plan = api.dry_run(spec_dict(store, str(tmp_path / "o.zarr")))
    assert "identity of" in repr(plan) and "calibration exact" in repr(plan)
    assert plan._repr_html_().startswith("<pre>")
    dp = api.dry_run(
        spec_dict(
            store,
            str(tmp_path / "o.zarr"),
            query="covariance",
            mechanism={"directions": {"method": "dp-pca", "k": 1}, "algorithm": "equi-modal"},
        )
    )
    assert "DP-PCA at run time (20% of the budget, gaussian-dp composition)" in repr(dp)


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_noise_matrices_are_stored_in_blocks_without_their_zero_blocks(tmp_path, client, query):
    """m = 300 features: the noise-description matrices are chunked on the 256-feature noise
    grid with fill value 0. Standard directions store only the diagonal blocks (the same files
    for two different datasets: they depend on the plan only); dense directions store every
    block. Read back, both equal the plan's dense matrices (an independent dense formula)."""
    from mvg_dask.engine.output import NOISE_MATRIX_CHUNK

    m, n = 300, 40
    algorithm = "unimodal" if query == "identity" else "equi-modal"
    names = ("row_cov", "directions") + (("col_cov",) if algorithm == "equi-modal" else ())
    W = np.linalg.qr(np.random.default_rng(4).standard_normal((m, m)))[0]
    np.save(tmp_path / "W.npy", W)
    stored: dict[str, dict[str, bytes]] = {}
    for case, directions, seed in [
        ("standard", {"method": "standard"}, 1),
        ("standard-other-data", {"method": "standard"}, 2),
        ("matrix", {"method": "matrix", "path": str(tmp_path / "W.npy")}, 1),
    ]:
        store = make_input(tmp_path / f"in-{case}.zarr", data(m, n, seed=seed), chunk=20)
        out = tmp_path / f"out-{case}.zarr"
        spec = spec_dict(
            store,
            str(out),
            query=query,
            mechanism={"algorithm": algorithm, "directions": directions},
        )
        res = api.release(spec, client=client, seed=3, progress=False)
        ds = api.open_release(res.output)
        plan = res.plan
        for name in names:
            meta = json.loads((out / name / "zarr.json").read_text())
            assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [NOISE_MATRIX_CHUNK] * 2
            assert meta["fill_value"] == 0.0
        dense_sigma = (plan.directions.matrix * plan.row_variances) @ plan.directions.matrix.T
        np.testing.assert_allclose(ds["row_cov"].values, dense_sigma, rtol=1e-12, atol=1e-300)
        if "col_cov" in names:
            np.testing.assert_array_equal(ds["col_cov"].values, ds["row_cov"].values)
        else:
            assert "col_cov" not in ds
        np.testing.assert_array_equal(ds["directions"].values, plan.directions.matrix)
        stored[case] = {
            p.relative_to(out).as_posix(): p.read_bytes()
            for name in names
            for p in sorted((out / name).rglob("*"))
            if p.is_file()
        }
    diagonal = {f"{v}/c/{i}/{i}" for v in names for i in (0, 1)}
    assert {k for k in stored["standard"] if "/c/" in k} == diagonal
    assert stored["standard"] == stored["standard-other-data"]
    assert len([k for k in stored["matrix"] if "/c/" in k]) == len(names) * 4
