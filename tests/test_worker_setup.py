"""The embedded cluster's worker processes load the task modules (and, for an identity release
with lattice noise, numba's kernels) as they start; one embedded cluster serves several
releases (:func:`mvg_dask.api.embedded_client`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from mvg_dask import api
from mvg_dask.engine.worker_setup import TASK_MODULES
from tests.pipeline_helpers import data, make_input, spec_dict


def _loaded() -> tuple[bool, bool]:
    """On a worker: (every task module imported, the lattice kernel compiled or loaded)."""
    lattice = sys.modules.get("mvg_dask.noise.lattice")
    kernel = lattice is not None and bool(getattr(lattice, "_compiled", None))
    return all(name in sys.modules for name in TASK_MODULES), kernel


@pytest.mark.slow
def test_one_embedded_cluster_of_processes_preloads_and_serves_two_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=4), chunk=100)
    monkeypatch.setattr(api, "IN_PROCESS_MAX_BYTES", 0)  # worker processes for this input
    spec = spec_dict(store, str(tmp_path / "a.zarr"), query="identity")
    with api.embedded_client(spec) as client:
        assert client.cluster is not None and client.cluster.processes  # type: ignore[attr-defined]
        deadline = time.monotonic() + 120
        while True:  # no task has run yet: only the preload can have loaded them
            states = set(client.run(_loaded).values())
            if states == {(True, True)} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert states == {(True, True)}
        first = api.release(spec, client=client, seed=1, progress=False)
        again = spec_dict(store, str(tmp_path / "b.zarr"), query="identity")
        second = api.release(again, client=client, seed=1, progress=False)
    assert first.output != second.output
    files = {
        name: sorted(p.name for p in (tmp_path / name / "X").rglob("*") if p.is_file())
        for name in ("a.zarr", "b.zarr")
    }
    assert files["a.zarr"] and files["a.zarr"] == files["b.zarr"]
    a = (tmp_path / "a.zarr" / "X" / "c").rglob("*")
    for chunk in sorted(p for p in a if p.is_file()):
        twin = tmp_path / "b.zarr" / chunk.relative_to(tmp_path / "a.zarr")
        assert chunk.read_bytes() == twin.read_bytes()  # same seed, same noise, same bytes
