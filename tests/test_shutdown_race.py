"""A release that succeeds leaves nothing behind on the terminal: no ``Future exception was
never retrieved`` (a ``TimeoutError`` of a comm's batched sender, left unread when the embedded
cluster's event loop stopped; :func:`mvg_dask.engine.cluster._local_client`)."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from mvg_dask import api
from tests.pipeline_helpers import data, make_input, spec_dict

RELEASES = 50


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.slow
def test_fifty_releases_leave_no_unretrieved_future(tmp_path: Path) -> None:
    """50 small releases in one process, each on its own embedded cluster (threads in this
    process, the default for a small input): asyncio reports no exception of any future or task
    after any of them (each release's garbage is collected before the next starts)."""
    store = make_input(tmp_path / "in.zarr", data(3, 200, seed=1), chunk=100)
    caught = _Records()
    logger = logging.getLogger("asyncio")
    logger.addHandler(caught)
    try:
        for i in range(RELEASES):
            spec = spec_dict(store, str(tmp_path / f"out{i}.zarr"), query="covariance")
            api.release(spec, seed=1, progress=False)
            gc.collect()
    finally:
        logger.removeHandler(caught)
    reported = [r.getMessage() for r in caught.records if r.levelno >= logging.WARNING]
    assert reported == []
