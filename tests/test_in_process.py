"""Small releases run on threads in the releasing process; the published bytes are the same as on
a cluster of worker processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mvg_dask import api
from mvg_dask.engine import cluster as cluster_module
from mvg_dask.engine.cluster import connect
from mvg_dask.plan.queries import IdentityQuery
from tests.pipeline_helpers import data, make_input, spec_dict

QUERIES = {
    "identity": {"algorithm": "unimodal"},
    "covariance": {"algorithm": "equi-modal"},
    "covariance-dp-pca": {
        "algorithm": "equi-modal",
        "directions": {"method": "dp-pca", "k": 2, "budget_share": 0.2},
    },
}


def _files(store: Path) -> dict[str, Any]:
    """Every file of a release; the root metadata without its plan time (``created``)."""
    out: dict[str, Any] = {}
    for path in sorted(store.rglob("*")):
        if not path.is_file():
            continue
        key = str(path.relative_to(store))
        if key == "zarr.json":
            doc = json.loads(path.read_bytes())
            doc["attributes"].pop("mvg_dask_created")
            out[key] = doc
        else:
            out[key] = path.read_bytes()
    return out


@pytest.mark.parametrize("case", sorted(QUERIES))
def test_in_process_and_worker_processes_publish_the_same_bytes(
    case: str, tmp_path: Path, client
) -> None:
    store = make_input(tmp_path / "in.zarr", data(5, 700, seed=11), chunk=100)
    query = case.split("-")[0]
    outputs = {}
    with connect(processes=False) as threads:
        assert threads.cluster is not None and not threads.cluster.processes  # type: ignore[attr-defined]
        for name, c in (("threads", threads), ("processes", client)):
            out = tmp_path / name / "out.zarr"
            spec = spec_dict(
                store, str(out), query=query, release_id="same", mechanism=QUERIES[case]
            )
            api.release(spec, client=c, seed=5, progress=False)
            outputs[name] = _files(out)
    assert outputs["threads"] == outputs["processes"]


@pytest.fixture
def picked(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The ``processes`` choice of every embedded cluster a release starts (each then run on
    threads here, which gives the same bytes)."""
    choices: list[bool] = []

    @contextmanager
    def spy(*args: Any, processes: bool = True, **kwargs: Any) -> Iterator[Any]:
        choices.append(processes)
        with connect(*args, processes=False, **kwargs) as c:
            yield c

    monkeypatch.setattr(cluster_module, "connect", spy)
    return choices


def test_the_input_size_picks_threads_or_worker_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, picked: list[bool]
) -> None:
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=2), chunk=100)  # 7,200 bytes
    for limit, out in ((7_200, "a.zarr"), (7_199, "b.zarr")):
        monkeypatch.setattr(api, "IN_PROCESS_MAX_BYTES", limit)
        api.release(spec_dict(store, str(tmp_path / out)), seed=1, progress=False)
    assert picked == [False, True]


def test_add_remove_picks_the_cluster_from_public_values_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, picked: list[bool]
) -> None:
    """Under add-remove neighbours the record count (and so the input's size) is private: two
    neighbouring inputs pick the same cluster, decided by ``privacy.max_records``."""
    monkeypatch.setattr(api, "IN_PROCESS_MAX_BYTES", 3 * 8 * 1_000)  # 1,000 records of 3 features
    stores = [
        make_input(tmp_path / f"in{n}.zarr", data(3, n, seed=2), chunk=100) for n in (300, 301)
    ]
    runs = [(None, True), (1_000, False), (1_001, True)]  # (max_records, worker processes)
    for max_records, _ in runs:
        for i, store in enumerate(stores):
            bound = {} if max_records is None else {"max_records": max_records}
            s = spec_dict(
                store,
                str(tmp_path / f"out-{max_records}-{i}.zarr"),
                query="covariance",
                privacy={"neighbours": "add-remove", **bound},
            )
            api.release(s, seed=1, progress=False)
    assert picked == [p for _, p in runs for _ in stores]


def test_an_identity_release_keeps_worker_processes_at_a_smaller_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, picked: list[bool]
) -> None:
    """The limit of an identity release is its query type's ``threads_max_bytes`` when smaller
    (its noise and write run faster on worker processes); a covariance of the same input keeps
    ``IN_PROCESS_MAX_BYTES``. The query is public: the choice depends on nothing private."""
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=2), chunk=100)  # 7,200 bytes
    monkeypatch.setattr(api, "IN_PROCESS_MAX_BYTES", 7_200)
    monkeypatch.setattr(IdentityQuery, "threads_max_bytes", 7_199)
    for query in ("identity", "covariance"):
        spec = spec_dict(store, str(tmp_path / f"{query}.zarr"), query=query)
        api.release(spec, seed=1, progress=False)
    assert picked == [True, False]
