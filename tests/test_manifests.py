"""Offline checks of the Dockerfile and of the Kubernetes manifests in ``cluster/``.

Tools come from the ``[dev]`` extra (PyPI wheels that ship the binaries): ``kubectl`` (its
built-in kustomize renders each overlay), ``kubernetes-validate`` (the core objects against the
Kubernetes OpenAPI schemas, strict), ``hadolint`` (the Dockerfile); the dask-kubernetes package
ships the CRDs the custom resources are checked against, and ``cluster/crds/`` the cert-manager
ones (their ``cert-manager.io/v1`` schemas, descriptions removed). Each check has a test that
breaks the input on purpose and sees it fail.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

from mvg_dask._version import __version__
from mvg_dask.engine.kube import (
    DEFAULT_IMAGE,
    WORKER_MALLOC_ENV,
    KubernetesError,
    load_cluster_options,
    validate_resource,
)
from mvg_dask.spec import SpecError, parse_spec

pytestmark = pytest.mark.manifests

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
OVERLAYS = sorted(p.name for p in (CLUSTER / "overlays").iterdir() if p.is_dir())
K8S_VERSION = "1.33.0"  # the oldest Kubernetes the manifests target (CronJob timeZone is GA)
DASK_GROUP = "kubernetes.dask.org/v1"
CERT_MANAGER = "cert-manager.io/v1"
CUSTOM = (DASK_GROUP, CERT_MANAGER)


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert path, f"{name} is missing: it comes with the [dev] extra (make test installs it)"
    return path


def _render_dir(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [_tool("kubectl"), "kustomize", str(directory)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@cache
def _rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(_render_dir(CLUSTER / "overlays" / overlay))


def render(overlay: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_rendered(overlay)))


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _walk(obj: Any) -> Any:
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for d in _walk(doc) for c in d.get("containers", [])]


# --- kustomize -------------------------------------------------------------------------------


def test_every_overlay_renders_with_kubectl_kustomize():
    assert OVERLAYS == ["long-lived", "one-off", "scheduled", "stream"]
    kinds = {o: sorted(d["kind"] for d in render(o)) for o in OVERLAYS}
    base = ["ConfigMap", "Role", "RoleBinding", "Secret", "Secret", "ServiceAccount"]
    base += ["Service", "StatefulSet"]  # the ledger's PostgreSQL
    tls = ["Certificate", "Certificate", "Issuer", "Issuer"]  # cert-manager: mvg-dask-tls
    assert kinds["scheduled"] == sorted([*base, "CronJob", "NetworkPolicy"])
    assert kinds["one-off"] == sorted([*base, *tls, "DaskJob"])
    assert kinds["long-lived"] == sorted([*base, *tls, "DaskCluster", "Job"])
    for o in OVERLAYS:
        assert {d["metadata"].get("namespace") for d in render(o)} == {"mvg-dask"}


def test_kustomize_fails_on_a_renamed_field(tmp_path):
    shutil.copytree(CLUSTER, tmp_path / "cluster")
    k = tmp_path / "cluster" / "overlays" / "scheduled" / "kustomization.yaml"
    k.write_text(k.read_text().replace("resources:", "resource:"))
    with pytest.raises(RuntimeError, match="resource"):
        _render_dir(k.parent)


# --- core objects: kubernetes-validate --strict ----------------------------------------------


def _validate_core(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_pass_kubernetes_validate_strict(overlay):
    core = [d for d in render(overlay) if d["apiVersion"] not in CUSTOM]
    assert core
    for doc in core:
        _validate_core(doc)


def test_the_cli_of_kubernetes_validate_agrees(tmp_path):
    docs = [d for d in render("scheduled") if d["apiVersion"] not in CUSTOM]
    f = tmp_path / "core.yaml"
    f.write_text(yaml.safe_dump_all(docs))
    cmd = [_tool("kubernetes-validate"), "--strict", "--quiet", "-k", K8S_VERSION, str(f)]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    one(docs, "CronJob")["spec"]["concurrencyPolicyy"] = "Forbid"
    f.write_text(yaml.safe_dump_all(docs))
    assert subprocess.run(cmd, capture_output=True).returncode != 0


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("CronJob", ("spec", "concurrencyPolicy")),
        ("CronJob", ("spec", "jobTemplate", "spec", "backoffLimit")),
        ("Role", ("rules",)),
        ("NetworkPolicy", ("spec", "podSelector")),
        ("StatefulSet", ("spec", "volumeClaimTemplates")),
    ],
)
def test_kubernetes_validate_fails_on_a_renamed_field(kind, path):
    doc = one(render("scheduled"), kind)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1] + "x"] = parent.pop(path[-1])
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_core(doc)


# --- custom resources: the CRDs shipped in dask-kubernetes -----------------------------------


@pytest.mark.parametrize(
    ("overlay", "kind"), [("one-off", "DaskJob"), ("long-lived", "DaskCluster")]
)
def test_dask_resources_pass_the_crd_schema(overlay, kind):
    validate_resource(one(render(overlay), kind))


@pytest.mark.parametrize(
    ("overlay", "kind", "path"),
    [
        ("one-off", "DaskJob", ("spec", "cluster", "spec", "worker", "replicas")),
        ("one-off", "DaskJob", ("spec", "job", "spec", "containers")),
        ("long-lived", "DaskCluster", ("spec", "scheduler", "service")),
    ],
)
def test_the_crd_check_fails_on_a_renamed_field(overlay, kind, path):
    doc = one(render(overlay), kind)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1] + "x"] = parent.pop(path[-1])
    with pytest.raises(KubernetesError, match=kind):
        validate_resource(doc)


# --- the release spec in the ConfigMap -------------------------------------------------------


def _configmap(docs: list[dict[str, Any]], name: str = "mvg-dask-release") -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    return doc


def _configmap_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    data = yaml.safe_load(_configmap(docs)["data"]["release.yaml"])
    assert isinstance(data, dict)
    return data


def test_the_configmap_spec_passes_the_spec_validator():
    spec = _configmap_spec(render("scheduled"))
    assert urlsplit(spec["ledger"]["url"]).scheme == "postgresql"
    assert urlsplit(spec["ledger"]["url"]).password is None  # PGPASSWORD comes from a Secret
    parsed = parse_spec(spec, source="ConfigMap release.yaml")
    assert parsed.ledger is not None and parsed.ledger.dataset == "ctg"
    for overlay in OVERLAYS:
        assert _configmap_spec(render(overlay)) == spec


def test_the_spec_validator_fails_on_a_renamed_field():
    spec = _configmap_spec(render("scheduled"))
    spec["privacy"]["epsilonn"] = spec["privacy"].pop("epsilon")
    with pytest.raises(SpecError, match=r"privacy\.epsilonn"):
        parse_spec(spec)


def test_the_configmap_cluster_options_are_valid(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_text(_configmap(render("scheduled"))["data"]["cluster.yaml"])
    options = load_cluster_options(f)
    assert options.image == DEFAULT_IMAGE and options.idle_timeout > 0
    f.write_text(f.read_text().replace("idle_timeout", "idle_timeoutt"))
    with pytest.raises(KubernetesError, match="idle_timeoutt"):
        load_cluster_options(f)


# --- what the manifests must say -------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_tag_is_the_package_version(overlay):
    images = {c["image"] for d in render(overlay) for c in containers(d)}
    images.discard(
        one(render(overlay), "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    assert images == {f"mvg-dask:{__version__}"}


def test_the_image_is_set_in_one_place(tmp_path):
    """Only cluster/image/kustomization.yaml names the image's tag; changing its one line
    changes every mvg-dask container of every overlay, and the ephemeral cluster's image."""
    named = [
        p.relative_to(CLUSTER).as_posix()
        for p in CLUSTER.rglob("*.yaml")
        if __version__ in p.read_text() or "newTag" in p.read_text()
    ]
    assert named == ["image/kustomization.yaml"]
    assert "image" not in yaml.safe_load((CLUSTER / "base" / "cluster.yaml").read_text())
    shutil.copytree(CLUSTER, tmp_path / "cluster")
    component = tmp_path / "cluster" / "image" / "kustomization.yaml"
    text = component.read_text()
    assert text.count("newName: mvg-dask\n") == 1
    component.write_text(
        text.replace("newName: mvg-dask\n", "newName: registry.example.org/team/mvg-dask\n")
    )
    want = f"registry.example.org/team/mvg-dask:{__version__}"
    for overlay in OVERLAYS:
        docs = _render_dir(tmp_path / "cluster" / "overlays" / overlay)
        images = {c["image"] for d in docs for c in containers(d)} - {_postgres_image(docs)}
        assert images == {want}, overlay
    (c,) = containers(one(_render_dir(tmp_path / "cluster" / "overlays" / "scheduled"), "CronJob"))
    assert {e["name"]: e.get("value") for e in c["env"]}["MVG_DASK_IMAGE"] == want


def _postgres_image(docs: list[dict[str, Any]]) -> str:
    (c,) = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return str(c["image"])


def test_the_ephemeral_cluster_runs_the_job_pods_image(monkeypatch, tmp_path):
    from mvg_dask.engine.kube import IMAGE_ENV

    f = tmp_path / "cluster.yaml"
    f.write_text(_configmap(render("scheduled"))["data"]["cluster.yaml"])
    monkeypatch.setenv(IMAGE_ENV, "registry.example.org/mvg-dask:9.9")
    assert load_cluster_options(f).image == "registry.example.org/mvg-dask:9.9"
    monkeypatch.delenv(IMAGE_ENV)
    assert load_cluster_options(f).image == DEFAULT_IMAGE


# --- the ledger's PostgreSQL and its migration ------------------------------------------------


def _release_pods(overlay: str) -> list[dict[str, Any]]:
    docs = render(overlay)
    kind = {"scheduled": "CronJob", "stream": "CronJob", "one-off": "DaskJob", "long-lived": "Job"}[
        overlay
    ]
    doc = one(docs, kind)
    if kind == "CronJob":
        return [doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    if kind == "DaskJob":
        return [doc["spec"]["job"]["spec"]]
    return [doc["spec"]["template"]["spec"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_release_pod_migrates_the_ledger_first(overlay):
    url = _configmap_spec(render(overlay))["ledger"]["url"]
    for pod in _release_pods(overlay):
        (init,) = pod["initContainers"]
        assert init["args"] == ["mvg-dask", "ledger", "migrate", "--ledger", url]
        env = {e["name"]: e for e in init["env"]}
        assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "mvg-dask-ledger"


def test_the_ledger_database_matches_the_ledger_url():
    docs = render("scheduled")
    url = urlsplit(_configmap_spec(docs)["ledger"]["url"])
    service = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == url.hostname]
    (svc,) = service
    assert [p["port"] for p in svc["spec"]["ports"]] == [url.port]
    sts = one(docs, "StatefulSet")
    pod = sts["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POSTGRES_USER"]["value"] == url.username  # the role
    assert env["POSTGRES_DB"]["value"] == url.path.lstrip("/")  # the database
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "mvg-dask-ledger",
        "key": "PGPASSWORD",
    }
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] in {m["name"] for m in c["volumeMounts"]}
    assert claim["spec"]["resources"]["requests"]["storage"]


# --- certificates: cert-manager ---------------------------------------------------------------

CERT_MANAGER_CRDS = {"Certificate": "certificates", "Issuer": "issuers"}


def _cert_manager_schema(kind: str) -> dict[str, Any]:
    import json

    from mvg_dask.engine.kube import _strict

    crd = json.loads(
        (CLUSTER / "crds" / f"cert-manager-{CERT_MANAGER_CRDS[kind]}.json").read_text()
    )
    schema = copy.deepcopy(crd["openAPIV3Schema"])
    schema["properties"].update(
        {
            "apiVersion": {"type": "string", "enum": [f"{crd['group']}/{crd['version']}"]},
            "kind": {"type": "string", "enum": [kind]},
            "metadata": {"type": "object"},
        }
    )
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return dict(_strict(schema))


def _validate_cert_manager(doc: dict[str, Any]) -> None:
    import jsonschema

    validator = jsonschema.Draft7Validator(_cert_manager_schema(doc["kind"]))
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        raise ValueError(f"{doc['kind']} {doc['metadata']['name']}: {error.message}")


@pytest.mark.parametrize("overlay", ["one-off", "long-lived"])
def test_certificates_pass_the_cert_manager_crd_schemas(overlay):
    docs = [d for d in render(overlay) if d["apiVersion"] == CERT_MANAGER]
    assert len(docs) == 4
    for doc in docs:
        _validate_cert_manager(doc)
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    tls = certs["mvg-dask-tls"]["spec"]
    assert tls["secretName"] == "mvg-dask-tls"
    assert {"server auth", "client auth"} <= set(tls["usages"])
    ca_issuer = issuers[tls["issuerRef"]["name"]]["spec"]["ca"]
    ca = [c for c in certs.values() if c["spec"]["secretName"] == ca_issuer["secretName"]]
    assert [c["spec"]["isCA"] for c in ca] == [True]


@pytest.mark.parametrize(
    ("kind", "path"),
    [("Certificate", ("spec", "secretName")), ("Issuer", ("spec", "ca", "secretName"))],
)
def test_the_cert_manager_check_fails_on_a_renamed_field(kind, path):
    name = {"Certificate": "mvg-dask-tls", "Issuer": "mvg-dask-ca"}[kind]
    (doc,) = [d for d in render("one-off") if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1] + "x"] = parent.pop(path[-1])
    with pytest.raises(ValueError, match=kind):
        _validate_cert_manager(doc)


def test_the_cronjob_runs_once_per_scheduled_time_and_resumes_on_retry():
    cron = one(render("scheduled"), "CronJob")
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] > 0
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] >= 1 and job["activeDeadlineSeconds"] > 0
    (c,) = job["template"]["spec"]["containers"]
    args = c["args"]
    # the release id is the Job's name: <cronjob>-<scheduled minute>, the same for every retry
    assert args[args.index("--release-id") + 1] == "$(JOB_NAME)"
    env = {e["name"]: e for e in c["env"]}
    ref = env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == "metadata.labels['batch.kubernetes.io/job-name']"
    assert "$(JOB_NAME)" in args[args.index("--output") + 1]
    assert args[args.index("--cluster") + 1] == "kubernetes"
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "mvg-dask-ledger"
    assert job["template"]["spec"]["serviceAccountName"] == "mvg-dask"


def _stream_period_args(job_name: str) -> list[str]:
    """The arguments the stream CronJob's shell hands to mvg-dask for a Job named ``job_name``
    (Kubernetes' ``$$`` escape expanded as the kubelet does, the shell run for real)."""
    (c,) = containers(one(render("stream"), "CronJob"))
    assert c["command"][-2:] == ["/bin/sh", "-c"]
    (script,) = c["args"]
    script = script.replace("$$", "$")
    assert script.startswith("exec mvg-dask release ")
    script = script.replace("exec mvg-dask", "exec printf '%s\\n'", 1)
    out = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"PATH": os.environ["PATH"], "JOB_NAME": job_name, "TZ": "Pacific/Kiritimati"},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def test_the_stream_cronjob_releases_one_period_per_night_labelled_by_its_scheduled_date():
    """Every pod of one scheduled run (a retry too) releases the same period label: the date of
    the run's scheduled time in UTC, computed from the Job's name, not from the clock."""
    import datetime as dt

    cron = one(render("stream"), "CronJob")
    spec = cron["spec"]
    assert spec["schedule"] == "0 2 * * *" and spec["timeZone"] == "Etc/UTC"
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["jobTemplate"]["spec"]["backoffLimit"] >= 1
    scheduled = dt.datetime(2027, 3, 14, 2, 0, tzinfo=dt.UTC)  # one night's run
    minutes = int(scheduled.timestamp()) // 60
    args = _stream_period_args(f"mvg-dask-stream-{minutes}")
    assert args[:2] == ["release", "/etc/mvg-dask/stream.yaml"]
    assert args[args.index("--period-label") + 1] == "2027-03-14"
    assert args[args.index("--cluster") + 1] == "kubernetes"
    assert "--release-id" not in args and "--output" not in args  # the stream's own, in its spec
    late = _stream_period_args(f"mvg-dask-stream-{minutes + 23 * 60 + 59}")  # 01:59 next day
    assert late[late.index("--period-label") + 1] == "2027-03-15"


def test_the_stream_spec_is_a_valid_stream_on_the_shared_budget():
    docs = render("stream")
    spec = yaml.safe_load(_configmap(docs, "mvg-dask-stream")["data"]["stream.yaml"])
    parsed = parse_spec(spec, source="ConfigMap stream.yaml")
    assert parsed.stream is not None and parsed.stream.horizon == 365
    base = parse_spec(_configmap_spec(docs))
    assert parsed.ledger is not None and base.ledger is not None
    # the stream and the one-off release charge the same dataset's one budget
    assert parsed.ledger == base.ledger
    (pod,) = _release_pods("stream")
    (volume,) = pod["volumes"]
    sources = [s["configMap"]["name"] for s in volume["projected"]["sources"]]
    assert sources == ["mvg-dask-release", "mvg-dask-stream"]


def test_the_role_has_exactly_the_rules_of_kubecluster():
    role = one(render("scheduled"), "Role")
    rules = {
        (tuple(r["apiGroups"]), tuple(sorted(r["resources"])), tuple(sorted(r["verbs"])))
        for r in role["rules"]
    }
    dask = ("daskautoscalers", "daskclusters", "daskjobs", "daskworkergroups",
            "daskworkergroups/scale")  # fmt: skip
    assert rules == {
        (("kubernetes.dask.org",), dask, ("create", "delete", "get", "list", "patch", "watch")),
        (("",), ("pods", "pods/status"), ("get", "list", "watch")),
        (("",), ("services",), ("get", "list", "watch")),
    }
    binding = one(render("scheduled"), "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mvg-dask", "namespace": "mvg-dask"}
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_configmap_secret_and_account_exists(overlay):
    docs = render(overlay)
    have = {(d["kind"], d["metadata"]["name"]) for d in docs}
    wanted = set()
    for node in _walk(docs):
        if "configMap" in node:
            wanted.add(("ConfigMap", node["configMap"]["name"]))
        if "secret" in node and "secretName" in node["secret"]:
            wanted.add(("Secret", node["secret"]["secretName"]))
        for key in ("secretRef", "secretKeyRef"):
            if key in node:
                wanted.add(("Secret", node[key]["name"]))
        if "serviceAccountName" in node:
            wanted.add(("ServiceAccount", node["serviceAccountName"]))
    # cert-manager makes the Secrets of its Certificates
    have |= {("Secret", d["spec"]["secretName"]) for d in docs if d["kind"] == "Certificate"}
    assert wanted and wanted <= have, wanted - have


@pytest.mark.parametrize(
    ("overlay", "kind"), [("one-off", "DaskJob"), ("long-lived", "DaskCluster")]
)
def test_dask_pods_use_tls_and_workers_have_resources_and_the_malloc_env(overlay, kind):
    doc = one(render(overlay), kind)
    cluster = doc["spec"]["cluster"]["spec"] if kind == "DaskJob" else doc["spec"]
    name = doc["metadata"]["name"]
    (worker,) = cluster["worker"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert {k: env[k] for k in WORKER_MALLOC_ENV} == WORKER_MALLOC_ENV
    assert env["DASK_SCHEDULER_ADDRESS"].startswith(f"tls://{name}-scheduler.")
    assert worker["resources"]["limits"]["memory"] and worker["resources"]["requests"]["cpu"]
    assert worker["args"][worker["args"].index("--nthreads") + 1] == "1"
    (sched,) = cluster["scheduler"]["spec"]["containers"]
    assert sched["args"][sched["args"].index("--protocol") + 1] == "tls"
    # the operator finds the scheduler port by this name
    assert "tcp-comm" in {p["name"] for p in cluster["scheduler"]["service"]["ports"]}
    if kind == "DaskJob":
        (job,) = doc["spec"]["job"]["spec"]["containers"]
        job_env = {e["name"]: e.get("value") for e in job["env"]}
        assert job_env["DASK_SCHEDULER_ADDRESS"] == env["DASK_SCHEDULER_ADDRESS"]
        assert "--tls-dir" in job["args"] and "--insecure-transport" not in job["args"]


# --- the Dockerfile --------------------------------------------------------------------------

DOCKERFILE = ROOT / "Dockerfile"


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True
    )


def test_the_dockerfile_is_clean_under_hadolint():
    out = _hadolint(DOCKERFILE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_fails_on_an_unpinned_package(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("tini=0.19.0-1+b3", "tini"))
    out = _hadolint(bad)
    assert out.returncode != 0 and "DL3008" in out.stdout


def test_the_dockerfile_pins_dask_runs_as_non_root_under_tini_and_installs_the_extras():
    text = DOCKERFILE.read_text()
    (dask_version,) = re.findall(r"^ARG DASK_VERSION=(\S+)$", text, re.M)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    assert reqs["dask"].specifier.contains(dask_version)
    assert reqs["distributed"].specifier.contains(dask_version)
    assert '"distributed==${DASK_VERSION}"' in text and '"dask[array]==${DASK_VERSION}"' in text
    (base,) = re.findall(r"^FROM (\S+)$", text, re.M)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base)
    assert re.findall(r"^USER (\S+)$", text, re.M)[-1].split(":")[0] not in ("root", "0")
    assert re.search(r'^ENTRYPOINT \["/usr/bin/tini"', text, re.M)
    assert _image_requirements() >= {"s3fs", "psycopg", "dask-kubernetes"}
    # the build context holds what the image copies, nothing else
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert ignore[ignore.index("*") - 1].startswith("#") or ignore[0] == "*"
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for copied in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for src in copied.split():
            assert src.rstrip("/") in kept, src
    # the image is the core only: the lab (experiments, baselines) is neither copied nor installed
    assert "mvg_dask_lab" not in _image_requirements() and not {"lab", "lab/mvg_dask_lab"} & kept


def _image_requirements(text: str | None = None) -> set[str]:
    """The names of what the Dockerfile's ``pip install`` of the package brings in directly:
    the core dependencies and those of the extras named in its install line."""
    text = DOCKERFILE.read_text() if text is None else text
    (extras,) = re.findall(r'"/opt/mvg-dask\[([a-z0-9,-]+)\]"', text)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    names = {Requirement(r).name for r in project["dependencies"]}
    for extra in extras.split(","):
        assert extra in optional, f"the Dockerfile installs an unknown extra [{extra}]"
        names |= {Requirement(r).name for r in optional[extra]}
    return names


def test_the_image_dependency_check_fails_without_the_s3_extra():
    text = DOCKERFILE.read_text().replace("[kubernetes,s3]", "[kubernetes]")
    assert "s3fs" not in _image_requirements(text)
    assert {"psycopg", "dask-kubernetes"} <= _image_requirements(text)


def test_the_image_dask_config_raises_the_malloc_thresholds_in_nanny_workers(tmp_path):
    """The nanny overrides the pod environment with its pre-spawn-environ: the image's dask
    config must carry the thresholds. A real nanny-spawned worker reads it."""
    from distributed import Client

    from tests.cluster_helpers import loopback_cluster, stop

    # a clean environment: a LocalCluster started earlier in this process leaves its config
    # (DASK_INTERNAL_INHERIT_CONFIG) and the nanny's malloc variables in os.environ
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "MALLOC_"))}
    env = {**clean, "DASK_CONFIG": str(CLUSTER / "dask.yaml")}
    with loopback_cluster(tmp_path, workers=1, env=clean) as address:
        dask_bin = str(Path(sys.executable).parent / "dask")
        worker = subprocess.Popen(
            [dask_bin, "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
             "--no-dashboard", "--name", "configured"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            with Client(address) as client:
                client.wait_for_workers(2, timeout=60)
                seen = client.run(lambda: {k: os.environ.get(k) for k in WORKER_MALLOC_ENV})
                names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
        finally:
            stop([worker])
    by_name = {str(names[a]): env for a, env in seen.items()}
    assert by_name.pop("configured") == WORKER_MALLOC_ENV
    # without it, the nanny's default disables the dynamic mmap threshold (cluster/dask.yaml)
    (default,) = by_name.values()
    assert default["MALLOC_TRIM_THRESHOLD_"] == "65536"
    text = DOCKERFILE.read_text()
    assert "COPY cluster/dask.yaml /etc/dask/" in text
    for k, v in WORKER_MALLOC_ENV.items():
        assert f"{k}={v}" in text
