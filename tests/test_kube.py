"""The ``--cluster kubernetes`` path: the DaskCluster we build, the version check, the client.

dask-kubernetes' ``KubeCluster`` needs a Kubernetes API server and the operator; here the cluster
class is injected: :class:`LoopbackKubeCluster` runs the DaskCluster resource it receives on
loopback (replicas, threads and the worker environment taken from the resource), so that our
code - option parsing, the resource, its CRD check, the transport and version checks, the client
and the cleanup - runs unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from distributed import Client, LocalCluster

from mvg_dask import api
from mvg_dask._version import __version__
from mvg_dask.engine.cluster import connect
from mvg_dask.engine.kube import (
    DEFAULT_IMAGE,
    WORKER_MALLOC_ENV,
    ClusterOptions,
    KubernetesError,
    VersionMismatchError,
    check_versions,
    cluster_spec,
    kube_cluster,
    load_cluster_options,
    validate_resource,
)
from mvg_dask.engine.security import TransportError
from tests.cluster_helpers import loopback_cluster, stop
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec


class LoopbackKubeCluster(LocalCluster):
    """Stands in for ``dask_kubernetes.operator.KubeCluster``: takes the same keywords and
    runs the ``DaskCluster`` resource on loopback."""

    created: ClassVar[list[LoopbackKubeCluster]] = []

    def __init__(self, *, custom_cluster_spec: dict[str, Any], **kwargs: Any) -> None:
        self.resource = custom_cluster_spec
        self.kwargs = kwargs
        worker = custom_cluster_spec["spec"]["worker"]
        (container,) = worker["spec"]["containers"]
        args = container["args"]
        super().__init__(
            n_workers=worker["replicas"],
            threads_per_worker=int(args[args.index("--nthreads") + 1]),
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            env={e["name"]: e["value"] for e in container["env"]},
        )
        type(self).created.append(self)


def test_the_cluster_resource_passes_the_crd_of_dask_kubernetes():
    options = ClusterOptions(workers=3, env={"EXTRA": "1"}, env_from_secrets=["store"])
    spec = cluster_spec("mvg-0123abcd", options)
    validate_resource(spec)
    assert spec["spec"]["idleTimeout"] == 600
    (worker,) = spec["spec"]["worker"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env == {**WORKER_MALLOC_ENV, "EXTRA": "1"}
    assert worker["image"] == DEFAULT_IMAGE == f"mvg-dask:{__version__}"
    assert worker["envFrom"] == [{"secretRef": {"name": "store"}}]
    assert worker["resources"]["limits"] == {"cpu": "1", "memory": "4Gi"}


@pytest.mark.parametrize(
    ("path", "new_key"),
    [
        (("spec", "idleTimeout"), "idle_timeout"),
        (("spec", "worker", "replicas"), "replica"),
        (("spec", "scheduler", "service"), "services"),
    ],
)
def test_the_crd_check_fails_on_a_renamed_field(path, new_key):
    spec = cluster_spec("mvg-0123abcd", ClusterOptions())
    parent = spec
    for key in path[:-1]:
        parent = parent[key]
    parent[new_key] = parent.pop(path[-1])
    with pytest.raises(KubernetesError, match="DaskCluster mvg-0123abcd"):
        validate_resource(spec)


def test_the_crd_check_drops_nulls_and_rejects_wrong_types():
    spec = cluster_spec("mvg-0123abcd", ClusterOptions())
    spec["spec"]["worker"]["spec"]["nodeName"] = None
    validate_resource(spec)
    spec["spec"]["worker"]["replicas"] = "two"
    with pytest.raises(KubernetesError, match=r"spec\.worker\.replicas"):
        validate_resource(spec)


def test_cluster_options_reject_unknown_keys_and_bad_names(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("workers: 2\nworker_memroy: 4Gi\n")
    with pytest.raises(KubernetesError, match="worker_memroy"):
        load_cluster_options(p)
    p.write_text("name: Not_A_DNS_Label\n")
    with pytest.raises(KubernetesError, match="name"):
        load_cluster_options(p)
    with pytest.raises(KubernetesError, match="cluster name"):
        cluster_spec("x" * 41, ClusterOptions())
    assert load_cluster_options(None) == ClusterOptions()


def _input_spec(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    X = data(3, 600, seed=7)
    store = make_input(tmp_path / "in.zarr", X, chunk=200)
    return spec_dict(store, str(tmp_path / "out.zarr"), **overrides)


@pytest.mark.cluster
def test_a_release_on_the_ephemeral_cluster_closes_it_at_the_end(tmp_path):
    LoopbackKubeCluster.created.clear()
    options = tmp_path / "cluster.yaml"
    options.write_text(yaml.safe_dump({"workers": 2, "idle_timeout": 300}))
    spec = _input_spec(tmp_path)
    with connect(
        None,
        cluster="kubernetes",
        cluster_spec=options,
        seeded=False,
        insecure_transport=True,
        cluster_class=LoopbackKubeCluster,
    ) as client:
        env = client.run(lambda: {k: os.environ.get(k) for k in WORKER_MALLOC_ENV})
        assert list(env.values()) == [WORKER_MALLOC_ENV] * 2
        res = api.release(spec, client=client, progress=False, insecure_transport=True)
    (cluster,) = LoopbackKubeCluster.created
    assert cluster.status.name == "closed"
    assert cluster.resource["spec"]["idleTimeout"] == 300
    assert cluster.kwargs["shutdown_on_close"] is True
    assert api.open_release(res.output).attrs["mvg_dask_status"] == "complete"


def test_the_ephemeral_cluster_needs_accepted_plaintext_and_no_tls(tmp_path):
    LoopbackKubeCluster.created.clear()
    kw: dict[str, Any] = {"cluster": "kubernetes", "cluster_class": LoopbackKubeCluster}
    with pytest.raises(TransportError, match="--insecure-transport"):
        with connect(None, seeded=False, **kw):
            pass
    with pytest.raises(KubernetesError, match="cannot use TLS"):
        with connect(None, seeded=False, security=object(), **kw):
            pass
    with pytest.raises(KubernetesError, match="drop --scheduler"):
        with connect("tcp://127.0.0.1:1", seeded=True, **kw):
            pass
    assert LoopbackKubeCluster.created == []  # refused before any cluster was made


def _other_version_dist(root: Path, version: str) -> Path:
    """A directory that, first on a process's path, makes it report another mvg_dask version."""
    info = root / f"mvg_dask-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mvg_dask\nVersion: {version}\n")
    return root


@pytest.mark.cluster
def test_a_worker_with_another_version_is_refused_before_any_reservation(tmp_path, capsys):
    from mvg_dask.cli import main

    spec = _input_spec(
        tmp_path,
        ledger={
            "path": str(tmp_path / "ledger.sqlite"),
            "dataset": "d",
            "budget": {"epsilon": 5.0, "delta": 1e-4},
        },
    )
    spec_file = write_spec(tmp_path / "spec.yaml", spec)
    with loopback_cluster(tmp_path, workers=1) as address:
        with Client(address) as client:
            assert check_versions(client)["mvg_dask"] == __version__
        other = _other_version_dist(tmp_path / "other", "9.9.9")
        env = {**os.environ, "PYTHONPATH": str(other)}
        dask_bin = str(Path(sys.executable).parent / "dask")
        worker = subprocess.Popen(
            [dask_bin, "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
             "--no-dashboard"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            with Client(address) as client:
                client.wait_for_workers(2, timeout=60)
                with pytest.raises(VersionMismatchError, match=r"mvg_dask 9\.9\.9 on worker"):
                    check_versions(client)
            assert main(["release", str(spec_file), "--quiet", "--scheduler", address]) == 1
        finally:
            stop([worker])
    err = capsys.readouterr().err
    assert "package versions differ" in err and "mvg_dask 9.9.9" in err
    assert not (tmp_path / "ledger.sqlite").exists()  # nothing reserved
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.cluster
def test_a_release_through_dask_scheduler_address(tmp_path):
    spec_file = write_spec(tmp_path / "spec.yaml", _input_spec(tmp_path))
    with loopback_cluster(tmp_path, workers=1) as address:
        env = {**os.environ, "DASK_SCHEDULER_ADDRESS": address}
        cmd = [sys.executable, "-m", "mvg_dask", "release", str(spec_file), "--quiet"]
        cmd += ["--release-id", "env-run", "--output", str(tmp_path / "env-run.zarr")]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        with Client(address) as client:
            # the release ran on the cluster of DASK_SCHEDULER_ADDRESS, not on a LocalCluster
            prefixes = client.run_on_scheduler(
                lambda dask_scheduler: sorted(dask_scheduler.task_prefixes)
            )
    assert prefixes  # the tasks of the release ran on it
    assert not (tmp_path / "out.zarr").exists()
    attrs = api.open_release(str(tmp_path / "env-run.zarr")).attrs
    assert attrs["mvg_dask_release_id"] == "env-run"
    assert attrs["mvg_dask_status"] == "complete"


def test_kubecluster_accepts_the_keywords_kube_cluster_passes():
    """The injected stand-in gets the same keywords as the real KubeCluster; they must bind."""
    import inspect

    from dask_kubernetes.operator import KubeCluster

    LoopbackKubeCluster.created.clear()
    options = ClusterOptions(workers=1)
    with kube_cluster(options, cluster_class=LoopbackKubeCluster):
        pass
    (cluster,) = LoopbackKubeCluster.created
    bound = inspect.signature(KubeCluster).bind(
        custom_cluster_spec=cluster.resource, **cluster.kwargs
    )
    assert bound.arguments["shutdown_on_close"] is True
    assert cluster.resource["metadata"]["name"].startswith("mvg-")
    assert cluster.status.name == "closed"
