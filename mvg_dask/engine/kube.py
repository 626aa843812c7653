"""Kubernetes: an ephemeral Dask cluster through the dask-kubernetes operator, and version checks.

``mvg-dask release --cluster kubernetes`` builds a ``DaskCluster`` resource with
:func:`cluster_spec` (our image, single-threaded workers with the malloc environment of the
sizing guide, an idle timeout so that the operator deletes the cluster of a killed job pod),
creates it with dask-kubernetes' ``KubeCluster`` and deletes it at the end
(:func:`kube_cluster`). :func:`check_versions` compares the package versions of the client, the
scheduler and every worker; call it before the ledger reserves anything. The resource is checked
against the ``DaskCluster`` CRD shipped inside dask-kubernetes (:func:`validate_resource`)
before it is sent.

dask-kubernetes' ``KubeCluster`` talks to its scheduler over ``tcp://`` only (its address
discovery and readiness check hard-code the scheme), so the ephemeral cluster is plaintext inside
the pod network: a private release on it needs ``--insecure-transport`` (see
:func:`mvg_dask.engine.security.check_transport`). For TLS use a ``DaskJob`` or a long-lived
``DaskCluster`` from ``cluster/`` with ``--scheduler tls://...``.
"""

from __future__ import annotations

import copy
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mvg_dask._version import __version__
from mvg_dask.errors import MvgDaskError
from mvg_dask.spec import SpecLoader

__all__ = [
    "DEFAULT_IMAGE",
    "VERSION_PACKAGES",
    "WORKER_MALLOC_ENV",
    "ClusterOptions",
    "KubernetesError",
    "VersionMismatchError",
    "check_versions",
    "cluster_spec",
    "crd_schema",
    "kube_cluster",
    "load_cluster_options",
    "validate_resource",
]

#: The image built from this repository's Dockerfile; its tag is the package version.
DEFAULT_IMAGE = f"mvg-dask:{__version__}"
#: The environment variable that names the image of the ephemeral cluster when ``--cluster-spec``
#: sets none (the CronJob of cluster/overlays/scheduled sets it to the job pod's own image).
IMAGE_ENV = "MVG_DASK_IMAGE"

#: The worker environment (cluster/dask.yaml): glibc's dynamic mmap threshold back on, so that
#: chunk-sized buffers are reused instead of mmapped afresh. The nanny overrides the trim
#: threshold with its ``pre-spawn-environ``; the image's ``/etc/dask/mvg-dask.yaml`` sets both
#: there too, these reach the nanny and the job pod.
WORKER_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "67108864",
}

#: Packages whose versions must be identical on the client, the scheduler and every worker.
VERSION_PACKAGES = ("mvg_dask", "dask", "distributed", "numpy", "randomgen", "zarr", "cloudpickle")
#: The subset that matters on the scheduler (it does not run tasks).
SCHEDULER_PACKAGES = ("mvg_dask", "dask", "distributed", "cloudpickle")

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")


class KubernetesError(MvgDaskError, RuntimeError):
    """The Kubernetes cluster cannot be built or reached as asked."""


class VersionMismatchError(MvgDaskError, RuntimeError):
    """The client, scheduler and workers run different package versions."""


class ClusterOptions(BaseModel):
    """What ``--cluster-spec FILE`` may set for the ephemeral cluster (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=_NAME_RE.pattern)] | None = None
    namespace: str | None = None
    #: default: ``MVG_DASK_IMAGE`` (the job pod's own image, set by cluster/), else
    #: :data:`DEFAULT_IMAGE`
    image: str = Field(default_factory=lambda: os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE)
    workers: Annotated[int, Field(ge=1, le=1000)] = 2
    worker_cpu: str = "1"
    worker_memory: str = "4Gi"
    scheduler_cpu: str = "500m"
    scheduler_memory: str = "1Gi"
    idle_timeout: Annotated[int, Field(ge=60)] = 600
    resource_timeout: Annotated[int, Field(ge=10)] = 300
    service_account: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    env_from_secrets: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/part-of": "mvg-dask"}
    )


def load_cluster_options(path: str | Path | None) -> ClusterOptions:
    """Read ``--cluster-spec FILE`` (YAML); defaults without a file.

    Raises
    ------
    KubernetesError
        The file cannot be read or has an invalid or unknown key.
    """
    if path is None:
        return ClusterOptions()
    p = Path(path)
    try:
        data = yaml.load(p.read_text(), Loader=SpecLoader) or {}  # a SafeLoader, as specs'
    except (OSError, yaml.YAMLError) as exc:
        raise KubernetesError(f"--cluster-spec {p}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise KubernetesError(f"--cluster-spec {p}: must be a mapping of option names to values")
    try:
        return ClusterOptions.model_validate(data)
    except ValidationError as exc:
        errs = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise KubernetesError(f"--cluster-spec {p}: {errs}") from None


def _env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in env.items()]


def _resources(cpu: str, memory: str) -> dict[str, dict[str, str]]:
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def _worker_container(options: ClusterOptions, env: list[dict[str, str]]) -> dict[str, Any]:
    """The worker container: one single-threaded ``dask worker`` per pod."""
    return {
        "name": "worker",
        "image": options.image,
        "args": [
            "dask",
            "worker",
            "--name",
            "$(DASK_WORKER_NAME)",
            "--nthreads",
            "1",
            "--memory-limit",
            "auto",
            "--dashboard-address",
            "8788",
        ],
        "env": env,
        "resources": _resources(options.worker_cpu, options.worker_memory),
        "ports": [{"name": "http-dashboard", "containerPort": 8788, "protocol": "TCP"}],
        "securityContext": _SECURITY_CONTEXT,
    }


def _scheduler_container(options: ClusterOptions, env: list[dict[str, str]]) -> dict[str, Any]:
    """The scheduler container, with health probes on its dashboard port."""
    return {
        "name": "scheduler",
        "image": options.image,
        "args": ["dask", "scheduler", "--host", "0.0.0.0", "--port", "8786"],
        "env": env,
        "resources": _resources(options.scheduler_cpu, options.scheduler_memory),
        "ports": [
            {"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"},
            {"name": "http-dashboard", "containerPort": 8787, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"port": "http-dashboard", "path": "/health"},
            "periodSeconds": 2,
            "timeoutSeconds": 10,
        },
        "livenessProbe": {
            "httpGet": {"port": "http-dashboard", "path": "/health"},
            "initialDelaySeconds": 15,
            "periodSeconds": 20,
        },
        "securityContext": _SECURITY_CONTEXT,
    }


def _scheduler_service(name: str) -> dict[str, Any]:
    """The scheduler's ``ClusterIP`` service: its comm and dashboard ports."""
    return {
        "type": "ClusterIP",
        "selector": {
            "dask.org/cluster-name": name,
            "dask.org/component": "scheduler",
        },
        "ports": [
            {"name": "tcp-comm", "protocol": "TCP", "port": 8786,
             "targetPort": "tcp-comm"},
            {"name": "http-dashboard", "protocol": "TCP", "port": 8787,
             "targetPort": "http-dashboard"},
        ],
    }  # fmt: skip


def cluster_spec(name: str, options: ClusterOptions) -> dict[str, Any]:
    """The ``DaskCluster`` resource of an ephemeral release cluster.

    Workers: ``options.workers`` single-threaded ``dask worker`` processes (one per pod) with
    the malloc environment and a memory limit equal to the pod limit; the scheduler: one pod
    with health probes on its dashboard port. ``spec.idleTimeout`` lets the operator delete the
    cluster when its job pod was killed before it could close it.

    Parameters
    ----------
    name : str
        The cluster name (a DNS label of at most 40 characters).
    options : ClusterOptions
        Image, sizes, timeouts, extra environment and labels.

    Returns
    -------
    dict
        A ``kubernetes.dask.org/v1`` ``DaskCluster``.
    """
    if not _NAME_RE.match(name):
        raise KubernetesError(
            f"cluster name {name!r}: use at most 40 lowercase letters, digits or '-'"
        )
    env = _env_list({**WORKER_MALLOC_ENV, **options.env})
    worker = _worker_container(options, env)
    scheduler = _scheduler_container(options, env)
    if options.env_from_secrets:
        env_from = [{"secretRef": {"name": n}} for n in options.env_from_secrets]
        worker["envFrom"] = scheduler["envFrom"] = env_from
    pod_extra: dict[str, Any] = {}
    if options.service_account is not None:
        pod_extra["serviceAccountName"] = options.service_account
    return {
        "apiVersion": "kubernetes.dask.org/v1",
        "kind": "DaskCluster",
        "metadata": {"name": name, "labels": dict(options.labels)},
        "spec": {
            "idleTimeout": options.idle_timeout,
            "worker": {
                "replicas": options.workers,
                "spec": {"containers": [worker], **pod_extra},
            },
            "scheduler": {
                "spec": {"containers": [scheduler], **pod_extra},
                "service": _scheduler_service(name),
            },
        },
    }  # fmt: skip


# --- validation against the CRDs shipped in dask-kubernetes ---------------------------------

_CRD_FILES = {
    "DaskCluster": "daskcluster.yaml",
    "DaskJob": "daskjob.yaml",
    "DaskWorkerGroup": "daskworkergroup.yaml",
    "DaskAutoscaler": "daskautoscaler.yaml",
}
_CRD_DIR = ("operator", "deployment", "helm", "dask-kubernetes-operator", "crds")


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 structural schema as a JSON schema that rejects unknown fields.

    Kubernetes prunes unknown fields silently; for a check we reject them instead, and we
    translate the Kubernetes extensions (int-or-string) that plain JSON schema does not know.
    """
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string") or out.get("format") == "int-or-string":
        out.pop("type", None)
        out.pop("format", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The strict JSON schema of a dask-kubernetes resource, read from the installed package.

    Parameters
    ----------
    kind : str
        ``DaskCluster``, ``DaskJob``, ``DaskWorkerGroup`` or ``DaskAutoscaler``.
    """
    try:
        base = resources.files("dask_kubernetes")
    except ModuleNotFoundError:
        raise KubernetesError(
            "dask-kubernetes is not installed: pip install 'mvg_dask[kubernetes]'"
        ) from None
    path = base.joinpath(*_CRD_DIR, _CRD_FILES[kind])
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage", True)]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    # apiVersion, kind and metadata are checked by the API server, not by the CRD schema
    schema.setdefault("properties", {}).update(
        {
            "apiVersion": {"type": "string", "enum": [f"{crd['spec']['group']}/v1"]},
            "kind": {"type": "string", "enum": [kind]},
            "metadata": {"type": "object"},
        }
    )
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    strict: dict[str, Any] = _strict(schema)
    return strict


def drop_nulls(obj: Any) -> Any:
    """``obj`` without the keys whose value is None (the API server drops them too)."""
    if isinstance(obj, dict):
        return {k: drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_nulls(v) for v in obj]
    return obj


def validate_resource(obj: dict[str, Any]) -> None:
    """Check a DaskCluster/DaskJob/... against its CRD schema, nulls dropped, unknown fields
    rejected.

    Raises
    ------
    KubernetesError
        Naming the first invalid field.
    """
    import jsonschema

    kind = obj.get("kind")
    if kind not in _CRD_FILES:
        raise KubernetesError(f"kind {kind!r} is not a dask-kubernetes resource")
    validator = jsonschema.Draft7Validator(crd_schema(kind))
    error = jsonschema.exceptions.best_match(validator.iter_errors(drop_nulls(obj)))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        name = obj.get("metadata", {}).get("name")
        raise KubernetesError(f"{kind} {name}: {where}: {error.message}")


# --- versions ------------------------------------------------------------------------------


def check_versions(client: Any) -> dict[str, str | None]:
    """Refuse to run when the scheduler or a worker has other package versions than the client.

    Compares :data:`VERSION_PACKAGES` on the client and every worker (the noise generator and
    the encoders must be identical for a resumed release to write identical bytes), and
    :data:`SCHEDULER_PACKAGES` on the scheduler. Call it before the ledger reserves anything.

    Parameters
    ----------
    client : distributed.Client
        A connected client.

    Returns
    -------
    dict
        The client's versions of :data:`VERSION_PACKAGES`.

    Raises
    ------
    VersionMismatchError
        Listing every package that differs and where.
    """
    versions = client.get_versions(packages=list(VERSION_PACKAGES))
    mine = {p: versions["client"]["packages"].get(p) for p in VERSION_PACKAGES}
    problems = []
    sched = versions["scheduler"]["packages"]
    for p in SCHEDULER_PACKAGES:
        if sched.get(p) != mine[p]:
            problems.append(f"{p} {sched.get(p)} on the scheduler")
    for address, info in sorted(versions["workers"].items()):
        pkgs = info.get("packages", {}) if isinstance(info, dict) else {}
        for p in VERSION_PACKAGES:
            if pkgs.get(p) != mine[p]:
                problems.append(f"{p} {pkgs.get(p)} on worker {address}")
    if problems:
        shown = ", ".join(problems[:6]) + (f" and {len(problems) - 6} more" if problems[6:] else "")
        expected = ", ".join(f"{p} {mine[p]}" for p in VERSION_PACKAGES)
        raise VersionMismatchError(
            f"package versions differ from this client's ({expected}): {shown}; "
            "run the same image everywhere (cluster/README.md)"
        )
    return mine


# --- the ephemeral cluster -----------------------------------------------------------------


def default_cluster_name() -> str:
    """``mvg-`` and a random suffix: one name per job pod, so that a retried pod never meets
    the cluster of a killed one (which the operator reclaims after its idle timeout)."""
    return f"mvg-{secrets.token_hex(4)}"


@contextmanager
def kube_cluster(
    options: ClusterOptions | None = None,
    *,
    cluster_class: Any = None,
    quiet: bool = True,
) -> Iterator[Any]:
    """Create an ephemeral DaskCluster, yield a client to it, delete the cluster on exit.

    Parameters
    ----------
    options : ClusterOptions, optional
        From ``--cluster-spec``; defaults otherwise.
    cluster_class : type, optional
        The cluster manager (default: ``dask_kubernetes.operator.KubeCluster``); called with
        ``custom_cluster_spec=``, ``namespace=``, ``n_workers=``, ``resource_timeout=``,
        ``shutdown_on_close=True`` and ``quiet=``.
    quiet : bool
        No rich progress display from KubeCluster.

    Yields
    ------
    distributed.Client
        Connected, with every worker up.
    """
    from distributed import Client

    options = options or ClusterOptions()
    if cluster_class is None:
        try:
            from dask_kubernetes.operator import KubeCluster
        except ImportError:
            raise KubernetesError(
                "--cluster kubernetes needs dask-kubernetes: pip install 'mvg_dask[kubernetes]'"
            ) from None
        cluster_class = KubeCluster
    spec = cluster_spec(options.name or default_cluster_name(), options)
    validate_resource(spec)
    cluster = cluster_class(
        custom_cluster_spec=spec,
        namespace=options.namespace,
        n_workers=options.workers,
        resource_timeout=options.resource_timeout,
        shutdown_on_close=True,
        quiet=quiet,
    )
    try:
        client = Client(cluster, timeout="60s")
        try:
            client.wait_for_workers(options.workers, timeout=options.resource_timeout)
            yield client
        finally:
            client.close()
    finally:
        cluster.close()
