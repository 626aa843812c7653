"""Shared test configuration: hypothesis profiles and small helpers."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default")
)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def client():
    """A LocalCluster (2 worker processes, loopback) shared by the pipeline tests."""
    from distributed import Client

    from mvg_dask.engine.cluster import local_cluster

    cluster = local_cluster(2)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server (binaries of the pgserver wheel), started once per session."""
    from tests.pg_helpers import PgServer

    server = PgServer()
    print(f"\nPostgreSQL test server started in {server.start_seconds:.2f} s")
    yield server
    server.close()
