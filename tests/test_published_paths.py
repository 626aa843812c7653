"""A release publishes no path of the curator's machine: the input store by its name alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from mvg_dask import api
from mvg_dask.engine.output import store_name
from tests.pipeline_helpers import data, make_input, spec_dict


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_published_metadata_names_the_input_store_without_its_path(
    query: str, tmp_path: Path
) -> None:
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=4), chunk=100)
    out = tmp_path / "out.zarr"
    api.release(spec_dict(store, str(out), query=query), seed=1, progress=False)
    ds = api.open_release(str(out))
    assert ds.attrs["mvg_dask_input_store"] == "in.zarr"
    for meta in out.rglob("*.json"):
        assert str(tmp_path) not in meta.read_text(), meta


def test_store_name_is_the_last_component() -> None:
    assert store_name("/data/curator/in.zarr") == "in.zarr"
    assert store_name("s3://bucket/data/x.zarr/") == "x.zarr"
    assert store_name("x.zarr") == "x.zarr"
