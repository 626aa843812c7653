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


# -- S3: a real S3 API server (moto's server mode) on loopback ---------------------------------
#
# The releases below read and write ``s3://`` through s3fs, with a fault proxy in front of the
# server (tests/s3_helpers.py). Those charged to a ledger run as ``mvg-dask release`` processes on
# a loopback cluster with a pinned key (tests/pipeline_helpers.py), so that an interrupted and
# resumed run can be compared byte for byte with an uninterrupted one.

S3_RECORDS, S3_CHUNK = 6000, 250  # 24 chunks, 8 tasks


@pytest.fixture(scope="module")
def s3():
    from tests.s3_helpers import direct_fs, s3_server

    with s3_server() as (endpoint, proxy):
        fs = direct_fs(proxy)
        for bucket in ("mvg-data", "mvg-releases"):
            fs.mkdir(bucket)
        yield endpoint, proxy, fs


@pytest.fixture(scope="module")
def s3_input(s3, tmp_path_factory):
    """An input in the S3 bucket (written locally, then uploaded)."""
    _, _, fs = s3
    local = make_input_local(tmp_path_factory.mktemp("s3in") / "in.zarr")
    fs.put(local, "mvg-data/in.zarr", recursive=True)
    return "s3://mvg-data/in.zarr"


def make_input_local(path):
    from tests.pipeline_helpers import data, make_input

    return make_input(path, data(4, S3_RECORDS, seed=21), chunk=S3_CHUNK)


@pytest.fixture(scope="module")
def s3_loopback(tmp_path_factory):
    from tests.cluster_helpers import loopback_cluster

    with loopback_cluster(tmp_path_factory.mktemp("s3cluster")) as address:
        yield address


def _s3_spec(tmp, endpoint, name, *, inp="s3://mvg-data/in.zarr", out=None, creds=True, **kw):
    from tests.pipeline_helpers import write_spec
    from tests.s3_helpers import storage_options

    options = storage_options(endpoint) if creds else None
    spec = spec_dict(
        inp,
        out or f"s3://mvg-releases/{name}.zarr",
        release_id=f"rel-{name}",
        ledger={
            "path": str(tmp / f"{name}.sqlite"),
            "dataset": "s3",
            "budget": {"epsilon": 10.0, "delta": 1e-4},
        },
        **kw,
    )
    if options is not None:
        spec["input"]["storage_options"] = options
        spec["output"]["storage_options"] = options
    return write_spec(tmp / f"{name}.yaml", spec)


def _cli(args, env=None, stop_at=None):
    """``mvg-dask`` with the pinned key; ``stop_at``: a crash point the process stops at
    (returns the running process, stopped)."""
    import os
    import subprocess

    from tests.pipeline_helpers import pinned_key_cli

    base = {k: v for k, v in os.environ.items() if not k.startswith(("MVG_DASK_CRASH", "AWS_"))}
    base |= env or {}
    if stop_at is not None:
        base |= {"MVG_DASK_CRASH_AT": stop_at, "MVG_DASK_CRASH_SIGNAL": "SIGSTOP"}
        proc = subprocess.Popen(
            [*pinned_key_cli(), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=base,
        )
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status
        return proc
    return subprocess.run(
        [*pinned_key_cli(), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=base,
    )


def _release_objects(fs, name):
    """A release's objects but its root ``zarr.json`` (which holds the release id)."""
    from tests.s3_helpers import objects

    return {k: v for k, v in objects(fs, f"mvg-releases/{name}.zarr").items() if k != "zarr.json"}


def _entries(tmp, name):
    from mvg_dask.engine.ledger import open_ledger

    with open_ledger(tmp / f"{name}.sqlite") as book:
        return [(e.status, e.noise_key is None) for e in book.releases()]


@pytest.fixture(scope="module")
def s3_reference(s3, s3_input, s3_loopback, tmp_path_factory):
    """An uninterrupted charged release from S3 to S3 (the pinned key)."""
    endpoint, _, fs = s3
    tmp = tmp_path_factory.mktemp("s3ref")
    run = _cli(["release", str(_s3_spec(tmp, endpoint, "reference")), "--scheduler", s3_loopback])
    assert run.returncode == 0, run.stderr
    want = _release_objects(fs, "reference")
    assert len([k for k in want if k.startswith("X/c/")]) == S3_RECORDS // S3_CHUNK
    assert not [k for k in want if ".mvg_dask_progress" in k]
    return want


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_s3_input_and_output(s3, s3_input, threaded_client, tmp_path, query):
    """The same bytes as a release of the same input from a local copy to a local store."""
    from tests.s3_helpers import storage_options

    endpoint, _, fs = s3
    options = storage_options(endpoint)
    spec = spec_dict(s3_input, f"s3://mvg-releases/plain-{query}.zarr", query=query)
    spec["input"]["storage_options"] = options
    spec["output"]["storage_options"] = options
    res = api.release(spec, client=threaded_client, seed=5, progress=False)
    ds = api.open_release(res.output, storage_options=options)
    assert ds.attrs["mvg_dask_status"] == "complete"
    local_in = make_input_local(tmp_path / "in.zarr")
    ref = api.release(
        spec_dict(local_in, str(tmp_path / "o.zarr"), query=query),
        client=threaded_client,
        seed=5,
        progress=False,
    )
    name = "X" if query == "identity" else "covariance"
    assert ds[name].values.tobytes() == api.open_release(ref.output)[name].values.tobytes()
    keys = fs.find(f"mvg-releases/plain-{query}.zarr")
    assert not [k for k in keys if ".mvg_dask_progress" in k]


def test_s3_crash_then_resume(s3, s3_loopback, s3_reference, tmp_path):
    import signal

    endpoint, _, fs = s3
    spec = _s3_spec(tmp_path, endpoint, "crashed")
    run = _cli(
        ["release", str(spec), "--scheduler", s3_loopback], env={"MVG_DASK_CRASH_AT": "chunk:3"}
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert fs.exists("mvg-releases/crashed.zarr/.mvg_dask_progress/plan.json")
    assert _entries(tmp_path, "crashed") == [("pending", False)]
    run = _cli(["release", str(spec), "--scheduler", s3_loopback])
    assert run.returncode == 0, run.stderr
    assert _release_objects(fs, "crashed") == s3_reference
    assert _entries(tmp_path, "crashed") == [("committed", True)]


@pytest.mark.parametrize(
    "action,what",
    [
        ("500", "the object store of s3://mvg-releases/mid-500.zarr is unreachable or failing"),
        ("drop", "the object store of s3://mvg-releases/mid-drop.zarr is unreachable or failing"),
        ("403", "the object store refused the credentials"),
    ],
    ids=["500", "drop", "403"],
)
def test_s3_error_mid_write_then_resume(s3, s3_loopback, s3_reference, tmp_path, action, what):
    """The store fails every chunk PUT after the 6th (or drops the connections, or refuses
    the credentials from then on); once it works again, the same release id resumes."""
    from tests.s3_helpers import Fault, chunk_puts

    endpoint, proxy, fs = s3
    name = f"mid-{action}"
    spec = _s3_spec(tmp_path, endpoint, name)
    match = chunk_puts() if action != "403" else (lambda method, path, body: True)
    counted = chunk_puts()
    if action == "403":  # refuse everything once 6 chunks are written

        def match(method, path, body, _n=[0]):  # noqa: B006 - a counter across calls
            _n[0] += counted(method, path, body)
            return _n[0] > 6

    proxy.inject(Fault(action, match, after=0 if action == "403" else 6))
    try:
        run = _cli(["release", str(spec), "--scheduler", s3_loopback])
    finally:
        injected = proxy.fault.injected if proxy.fault else 0
        proxy.heal()
    assert injected > 0
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr
    (line,) = [x for x in run.stderr.splitlines() if "error:" in x]
    assert what in line and f"budget charged; release rel-{name} pending" in line, line
    assert _entries(tmp_path, name) == [("pending", False)]
    written = [k for k in fs.find(f"mvg-releases/{name}.zarr") if "/X/c/" in k]
    assert 0 < len(written) < S3_RECORDS // S3_CHUNK  # mid-write
    run = _cli(["release", str(spec), "--scheduler", s3_loopback])
    assert run.returncode == 0, run.stderr
    assert _release_objects(fs, name) == s3_reference
    assert _entries(tmp_path, name) == [("committed", True)]


def test_s3_failed_commit_then_resume(s3, s3_loopback, s3_reference, tmp_path):
    """The commit's last write (the root ``zarr.json`` with ``status: complete``) fails: the
    release stays pending and incomplete, and the same release id completes it."""
    from tests.s3_helpers import Fault, final_commit

    endpoint, proxy, fs = s3
    spec = _s3_spec(tmp_path, endpoint, "commit")
    proxy.inject(Fault("500", final_commit("mvg-releases/commit.zarr")))
    try:
        run = _cli(["release", str(spec), "--scheduler", s3_loopback])
    finally:
        injected = proxy.fault.injected if proxy.fault else 0
        proxy.heal()
    assert injected >= 1
    assert run.returncode == 3, run.stderr
    assert "is unreachable or failing (" in run.stderr, run.stderr
    with pytest.raises(IncompleteReleaseError):
        api.open_release("s3://mvg-releases/commit.zarr", storage_options=_options(endpoint))
    assert _entries(tmp_path, "commit") == [("pending", False)]
    run = _cli(["release", str(spec), "--scheduler", s3_loopback])
    assert run.returncode == 0, run.stderr
    assert _release_objects(fs, "commit") == s3_reference
    assert _entries(tmp_path, "commit") == [("committed", True)]


def _options(endpoint):
    from tests.s3_helpers import storage_options

    return storage_options(endpoint)


def test_s3_abort_leaves_nothing(s3, s3_loopback, tmp_path):
    """A data error after reading: nothing is left under the output (claim and progress
    included), and the release is aborted (charged, not resumable)."""
    endpoint, _, fs = s3
    from tests.pipeline_helpers import data, make_input

    X = data(4, 1000, seed=3)
    X[2, 900] = np.nan
    fs.put(make_input(tmp_path / "nan.zarr", X, chunk=250), "mvg-data/nan.zarr", recursive=True)
    spec = _s3_spec(tmp_path, endpoint, "aborted", inp="s3://mvg-data/nan.zarr")
    run = _cli(["release", str(spec), "--scheduler", s3_loopback])
    assert run.returncode != 0 and "NaN" in run.stderr, run.stderr
    fs.invalidate_cache()
    assert not fs.exists("mvg-releases/aborted.zarr")
    assert fs.find("mvg-releases/aborted.zarr") == []
    assert [s for s, _ in _entries(tmp_path, "aborted")] == ["aborted"]


def test_s3_two_jobs_on_one_output(s3, s3_loopback, s3_reference, tmp_path):
    """Job A holds the output (stopped right after its reservation); job B, another release id
    on the same output, is refused and not charged; A then completes; B is still refused."""
    import os
    import signal

    endpoint, _, fs = s3
    out = "s3://mvg-releases/shared.zarr"
    spec_a = _s3_spec(tmp_path, endpoint, "job-a", out=out)
    spec_b = _s3_spec(tmp_path, endpoint, "job-b", out=out)
    a = _cli(["release", str(spec_a), "--scheduler", s3_loopback], stop_at="reserved")
    try:
        b = _cli(["release", str(spec_b), "--scheduler", s3_loopback])
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err
    assert b.returncode == 1, b.stderr
    assert "is being written by another release" in b.stderr
    assert "budget charged" not in b.stderr
    assert _entries(tmp_path, "job-a") == [("committed", True)]
    assert _entries(tmp_path, "job-b") == []  # not charged
    again = _cli(["release", str(spec_b), "--scheduler", s3_loopback])
    assert again.returncode == 1 and "already holds other data" in again.stderr, again.stderr
    assert _entries(tmp_path, "job-b") == []
    got = {k: v for k, v in _objects(fs, "mvg-releases/shared.zarr").items() if k != "zarr.json"}
    assert got == s3_reference


def _objects(fs, prefix):
    from tests.s3_helpers import objects

    return objects(fs, prefix)


def test_s3_retry_of_a_complete_release(s3, s3_loopback, s3_reference, tmp_path):
    endpoint, _, fs = s3
    spec = _s3_spec(tmp_path, endpoint, "retried")
    first = _cli(["release", str(spec), "--scheduler", s3_loopback])
    assert first.returncode == 0, first.stderr
    before = _objects(fs, "mvg-releases/retried.zarr")
    again = _cli(["release", str(spec), "--scheduler", s3_loopback])
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    assert _objects(fs, "mvg-releases/retried.zarr") == before  # nothing rewritten
    assert _entries(tmp_path, "retried") == [("committed", True)]  # charged once


@pytest.mark.parametrize("source", ["environment", "storage_options"])
def test_s3_credentials_never_published(s3, tmp_path, source):
    """Credentials from the environment (``AWS_*``, the cluster the CLI starts inherits them)
    or from the spec's ``storage_options``: the release succeeds (the proxy refuses any other
    key) and no byte of any object in the store, the ledger, the plan or the logs holds them,
    including those of a crashed run (its saved plan) and of a failed one (its error)."""
    import signal

    from tests.s3_helpers import ACCESS_KEY, REGION, SECRET_KEY, Fault, chunk_puts

    endpoint, proxy, fs = s3
    name = f"creds-{source}"
    env: dict[str, str] = {}
    if source == "environment":
        spec = _s3_spec(tmp_path, endpoint, name, creds=False)
        env |= {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": REGION,
        }
    else:
        spec = _s3_spec(tmp_path, endpoint, name)
    args = ["release", str(spec)]  # a LocalCluster of the CLI: its workers get the environment
    logs = []
    crashed = _cli(args, env={**env, "MVG_DASK_CRASH_AT": "chunk:2"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    logs.append(crashed.stdout + crashed.stderr)
    plan = fs.cat_file(f"mvg-releases/{name}.zarr/.mvg_dask_progress/plan.json")
    proxy.inject(Fault("500", chunk_puts(), after=0))
    try:
        failed = _cli(args, env=env)
    finally:
        proxy.heal()
    assert failed.returncode == 3, failed.stderr
    logs.append(failed.stdout + failed.stderr)
    done = _cli(args, env=env)
    assert done.returncode == 0, done.stderr
    logs.append(done.stdout + done.stderr)
    dry = _cli(["release", str(spec), "--dry-run", "--json"], env=env)
    assert dry.returncode == 0, dry.stderr
    logs.append(dry.stdout + dry.stderr)
    blobs = {"plan.json (crashed run)": plan}
    blobs |= {p.name: p.read_bytes() for p in tmp_path.glob(f"{name}.sqlite*")}  # the ledger
    blobs |= {f"log {i}": text.encode() for i, text in enumerate(logs)}
    blobs |= {f"object {k}": v for k, v in _objects(fs, f"mvg-releases/{name}.zarr").items()}
    assert len(blobs) > 10
    for secret in (ACCESS_KEY, SECRET_KEY):
        for what, blob in blobs.items():
            assert secret.encode() not in blob, (what, secret)
    assert (
        api.open_release(
            f"s3://mvg-releases/{name}.zarr", storage_options=_options(endpoint)
        ).attrs["mvg_dask_status"]
        == "complete"
    )


def test_s3_refused_credentials_before_anything_is_charged(s3, s3_loopback, tmp_path):
    """Wrong credentials from the start: refused (exit 1) before the reservation, nothing
    charged and nothing written."""
    from tests.pipeline_helpers import write_spec
    from tests.s3_helpers import storage_options

    endpoint, _, fs = s3
    spec = spec_dict(
        "s3://mvg-data/in.zarr",
        "s3://mvg-releases/refused.zarr",
        release_id="rel-refused",
        ledger={
            "path": str(tmp_path / "refused.sqlite"),
            "dataset": "s3",
            "budget": {"epsilon": 10.0, "delta": 1e-4},
        },
    )
    wrong = storage_options(endpoint, key="AKIAWRONGWRONGWRONG0")
    spec["input"]["storage_options"] = wrong
    spec["output"]["storage_options"] = wrong
    run = _cli(["release", str(write_spec(tmp_path / "s.yaml", spec)), "--scheduler", s3_loopback])
    assert run.returncode == 1, run.stderr
    assert "the object store refused the credentials" in run.stderr
    assert "budget charged" not in run.stderr and "Traceback" not in run.stderr
    assert _entries(tmp_path, "refused") == []
    fs.invalidate_cache()
    assert fs.find("mvg-releases/refused.zarr") == []
