"""fsspec URLs: input and output in an object store (fsspec's in-memory filesystem stands in
for S3/GCS; an in-process cluster shares it). Object stores get no staging rename: the release is
written in place with ``status: incomplete`` and marked ``complete`` last."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
from distributed import Client

from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.engine.cluster import local_cluster
from mvg_dask.errors import DataError, IncompleteReleaseError
from tests.pipeline_helpers import spec_dict


@pytest.fixture(scope="module")
def threaded_client():
    cluster = local_cluster(1, threads_per_worker=2, processes=False)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_release_to_and_from_fsspec_urls(threaded_client, query):
    X = np.random.default_rng(0).uniform(0, 1, (3, 500))
    fs = fsspec.filesystem("memory")
    if fs.exists("/obj"):
        fs.rm("/obj", recursive=True)
    write_matrix(X, f"memory://obj/{query}/in.zarr", record_chunk=100)
    out = f"memory://obj/{query}/out.zarr"
    spec = spec_dict(f"memory://obj/{query}/in.zarr", out, query=query)
    res = api.release(spec, client=threaded_client, seed=1, progress=False)
    ds = api.open_release(res.output)
    assert ds.attrs["mvg_dask_status"] == "complete"
    name = "X" if query == "identity" else "covariance"
    assert ds[name].shape == ((3, 500) if query == "identity" else (3, 3))
    leftovers = [p for p in fs.find(f"/obj/{query}/out.zarr") if "progress" in p]
    assert leftovers == []


def test_incomplete_object_store_release_is_refused(threaded_client):
    X = np.random.default_rng(1).uniform(0, 1, (3, 200))
    write_matrix(X, "memory://obj2/in.zarr", record_chunk=100)
    res = api.release(
        spec_dict("memory://obj2/in.zarr", "memory://obj2/out.zarr"),
        client=threaded_client,
        seed=1,
        progress=False,
    )
    import zarr

    zarr.open_group(res.output, mode="r+").update_attributes({"mvg_dask_status": "incomplete"})
    with pytest.raises(IncompleteReleaseError, match="status: 'incomplete'"):
        api.open_release(res.output)


def test_failed_object_store_release_leaves_nothing(threaded_client):
    X = np.random.default_rng(2).uniform(0, 1, (3, 300))
    X[0, 250] = np.nan
    write_matrix(X, "memory://obj3/in.zarr", record_chunk=100)
    with pytest.raises(DataError, match="NaN"):
        api.release(
            spec_dict("memory://obj3/in.zarr", "memory://obj3/out.zarr"),
            client=threaded_client,
            seed=1,
            progress=False,
        )
    assert not fsspec.filesystem("memory").exists("/obj3/out.zarr")


@pytest.mark.parametrize("name", ["run*.zarr", "run?.zarr", "run[12].zarr"])
def test_an_object_store_output_with_a_glob_pattern_is_refused(threaded_client, tmp_path, name):
    """fsspec removes a path as a glob pattern: ``memory://obj4/run*.zarr`` would let an abort
    of the release remove ``run1.zarr`` too. Such an output is refused before anything is
    read, written or charged, and the data the pattern matches is left alone."""
    from mvg_dask.engine.ledger import open_ledger
    from mvg_dask.spec import SpecError

    fs = fsspec.filesystem("memory")
    if fs.exists("/obj4"):
        fs.rm("/obj4", recursive=True)
    X = np.random.default_rng(3).uniform(0, 1, (3, 200))
    write_matrix(X, "memory://obj4/in.zarr", record_chunk=100)
    write_matrix(X, "memory://obj4/run1.zarr", record_chunk=100)  # someone else's data
    before = {p: fs.cat_file(p) for p in fs.find("/obj4")}
    ledger = {
        "path": str(tmp_path / "ledger.sqlite"),
        "dataset": "obj4",
        "budget": {"epsilon": 5.0, "delta": 1e-4},
    }
    spec = spec_dict("memory://obj4/in.zarr", f"memory://obj4/{name}", ledger=ledger)
    with pytest.raises(SpecError, match=r"output\.store: .*glob patterns"):
        api.release(spec, client=threaded_client, progress=False)
    # the output override (`output=`, the CLI's --output) is checked the same way
    fine = spec_dict("memory://obj4/in.zarr", "memory://obj4/out.zarr", ledger=ledger)
    with pytest.raises(SpecError, match=r"output\.store: .*glob patterns"):
        api.release(fine, output=f"memory://obj4/{name}", client=threaded_client, progress=False)
    with pytest.raises(SpecError, match=r"output\.store: .*glob patterns"):
        api.dry_run(fine, output=f"memory://obj4/{name}")
    assert {p: fs.cat_file(p) for p in fs.find("/obj4")} == before
    if (tmp_path / "ledger.sqlite").exists():
        with open_ledger(tmp_path / "ledger.sqlite") as book:
            assert book.releases() == []
    # the same name as a local path is a valid output (its removals never glob)
    local = spec_dict("memory://obj4/in.zarr", str(tmp_path / name), ledger=ledger)
    res = api.release(local, client=threaded_client, progress=False)  # a ledger: unseeded
    assert api.open_release(res.output).attrs["mvg_dask_status"] == "complete"
