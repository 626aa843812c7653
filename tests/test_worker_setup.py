"""The embedded cluster's worker processes load the task modules (and, for an identity release
with lattice noise, numba's kernels) as they start; one embedded cluster serves several
releases (:func:`mvg_dask.api.embedded_client`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mvg_dask import api
from mvg_dask.engine.worker_setup import TASK_MODULES
from tests.pipeline_helpers import data, make_input, run_cli, spec_dict, write_spec


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


def _openblas_threads() -> list[int]:
    """Each OpenBLAS library mapped into this process: its thread count, asked of OpenBLAS
    itself through its own getter (independently of threadpoolctl, which the code uses)."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if ".so" in line}
    counts = []
    for path in sorted(p for p in paths if "openblas" in Path(p).name.lower()):
        lib = ctypes.CDLL(path)
        names = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads")
        getter = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
        if getter is not None:
            counts.append(int(getter()))
    return counts


def _worker_settings() -> tuple[int, str, list[int]]:
    """On a worker: (how many OpenBLAS libraries it has loaded, its start method's name and
    OPENBLAS_NUM_THREADS, each loaded OpenBLAS's thread count)."""
    import multiprocessing
    import os

    counts = _openblas_threads()
    method = multiprocessing.get_start_method(allow_none=True) or ""
    return len(counts), method + ":" + os.environ.get("OPENBLAS_NUM_THREADS", ""), counts


_FORK_PROBE = """
import sys
from distributed import Client
from mvg_dask import _startup
from mvg_dask.engine.cluster import fork_workers, local_cluster, worker_memory_limit
from tests.test_worker_setup import _worker_settings
if __name__ == "__main__":
    _startup.FORK_WORKERS = sys.argv[1] == "1"  # as the command line sets it
    with local_cluster(1, kernels=True) as cluster, Client(cluster) as c:
        (found, env, counts), *_ = c.run(_worker_settings).values()
    print(fork_workers(worker_memory_limit(1)), found, env, counts)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="worker processes are forked on Linux")
def test_forked_workers_apply_the_nannys_environment() -> None:
    """In a process that allows it (the command line's), the workers are forked; a worker
    forked from a process that may run several BLAS threads runs one, as a worker spawned with
    the nanny's ``OPENBLAS_NUM_THREADS=1`` does. A library process (this test runner, whose
    other threads could hold a lock at the fork) spawns them. Each case in a fresh process."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    for allowed, method in (("1", "fork"), ("0", "spawn")):
        done = subprocess.run(
            [sys.executable, "-c", _FORK_PROBE, allowed],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        forked, found, env, counts = done.stdout.strip().split(maxsplit=3)
        assert forked == str(allowed == "1")
        assert env == f"{method}:1"
        assert int(found) >= 1 and counts == str([1] * int(found))


def test_a_large_process_spawns_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resident above ``FORK_MAX_SHARE`` of a worker's memory limit, this process spawns the
    workers (a forked worker would count its pages against that limit), with the same
    environment. The limits given are far above and below any process's size, so the test does
    not depend on this one's (a long test session passes 1 GiB)."""
    from distributed import Client

    from mvg_dask import _startup
    from mvg_dask.engine import cluster as cluster_module

    monkeypatch.setattr(_startup, "FORK_WORKERS", True)  # as the command line sets it
    assert cluster_module.fork_workers(2**62)
    assert not cluster_module.fork_workers(2**10)
    # the default limit is the machine's memory shared among the workers
    one, two = (cluster_module.worker_memory_limit(n) for n in (1, 2))
    assert one > 0 and abs(one - 2 * two) <= 2
    assert cluster_module.worker_memory_limit(2, "3GiB") == 3 * 2**30
    monkeypatch.setattr(cluster_module, "FORK_MAX_SHARE", 0.0)
    with cluster_module.local_cluster(1) as cluster, Client(cluster) as c:
        (found, env, counts), *_ = c.run(_worker_settings).values()
    assert env == "spawn:1"
    assert found >= 1 and counts == [1] * found


def test_a_worker_that_hangs_at_start_fails_the_release_in_one_line_before_any_charge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker process whose start hangs (here a preload that sleeps) fails the release with
    one line after ``START_TIMEOUT``, exit 1, before anything is charged: no ledger entry, no
    output."""
    import dask

    from mvg_dask.cli import main
    from mvg_dask.engine import cluster as cluster_module
    from mvg_dask.engine.ledger import open_ledger

    hang = tmp_path / "hang.py"
    hang.write_text("import time\n\n\ndef dask_setup(worker):\n    time.sleep(600)\n")
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=4), chunk=100)
    budget = {"epsilon": 3.0, "delta": 1e-4}
    ledger = {"path": str(tmp_path / "ledger.sqlite"), "dataset": "d", "budget": budget}
    spec = spec_dict(store, str(tmp_path / "out.zarr"), query="covariance", ledger=ledger)
    write_spec(tmp_path / "s.yaml", spec)
    monkeypatch.setattr(api, "IN_PROCESS_MAX_BYTES", 0)  # worker processes for this input
    monkeypatch.setattr(cluster_module, "START_TIMEOUT", 3.0)
    with dask.config.set({"distributed.worker.preload": [str(hang)]}):
        started = time.monotonic()
        rc = main(["release", str(tmp_path / "s.yaml"), "--quiet"])
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err
    assert rc == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "did not start within 3 s" in lines[0], err
    assert "nothing was charged" in lines[0]
    assert not (tmp_path / "out.zarr").exists()
    if (tmp_path / "ledger.sqlite").exists():
        with open_ledger(tmp_path / "ledger.sqlite", create=False) as book:
            assert list(book.releases()) == []


def test_the_embedded_cluster_outside_a_notebook_imports_no_dashboard() -> None:
    """A cluster of worker processes started from a script imports no bokeh (its dashboard,
    0.5-0.7 s of CPU, would serve a port nobody is shown)."""
    import subprocess

    probe = (
        "import sys\n"
        "from mvg_dask.engine.cluster import local_cluster\n"
        "if __name__ == '__main__':\n"
        "    with local_cluster(1) as cluster:\n"
        "        assert cluster.processes\n"
        "    assert 'bokeh' not in sys.modules, 'bokeh imported'\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_forking_start_runs_while_starting_first() -> None:
    """With forked workers, ``while_starting`` has returned before the cluster starts (no fork
    while another thread imports); with threads both run at once."""
    import threading

    from mvg_dask.engine.cluster import _start_meanwhile

    order: list[str] = []
    done = threading.Event()

    def meanwhile() -> None:
        order.append("meanwhile")
        done.set()

    def start() -> Any:
        order.append("start" if done.is_set() else "start-before")
        return "cluster"

    assert _start_meanwhile(start, meanwhile, overlap=False) == "cluster"
    assert order == ["meanwhile", "start"]


@pytest.mark.slow
def test_a_cli_release_on_forked_workers_exits_cleanly(tmp_path: Path) -> None:
    """``mvg-dask release`` on worker processes (add-remove neighbours: ``max_records`` is by
    default 2**32, so processes): exit 0, nothing else on stderr (no worker traceback, no
    ``Future exception was never retrieved``), and the bytes of the same seeded release on a
    cluster of threads."""
    from mvg_dask.engine.cluster import connect

    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=4), chunk=100)
    privacy = {"neighbours": "add-remove"}
    spec = spec_dict(store, str(tmp_path / "cli.zarr"), query="covariance", privacy=privacy)
    write_spec(tmp_path / "cli.yaml", spec)
    done = run_cli(tmp_path, "release", "cli.yaml", "--seed", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    # the one line on stderr says the release has no ledger
    assert [line for line in done.stderr.splitlines() if "has no ledger" not in line] == []
    with connect(processes=False) as threads:
        api.release(spec, client=threads, seed=1, progress=False, output=str(tmp_path / "t.zarr"))
    outs = [
        {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        for root in (tmp_path / "cli.zarr", tmp_path / "t.zarr")
    ]
    assert outs[0].keys() == outs[1].keys()
    arrays = [k for k in outs[0] if k.name != "zarr.json"]
    assert arrays and all(outs[0][k] == outs[1][k] for k in arrays)


def test_the_preloads_heap_touch_runs_in_the_workers_task_thread() -> None:
    """A worker process's preload submits :func:`touch_heap` to the thread that runs its tasks
    (the default executor of a one-thread worker), so that its pages are that thread's; the
    release's bytes are unchanged (checked by the tests above)."""
    from distributed import Client

    from mvg_dask.engine.cluster import local_cluster

    def touched() -> list[str]:
        from mvg_dask.engine import worker_setup

        return worker_setup.touched

    def thread_name() -> str:
        import threading

        return threading.current_thread().name

    with local_cluster(1) as cluster, Client(cluster) as c:
        task_thread = c.submit(thread_name, pure=False).result()
        (ran_in, *_) = c.run(touched).values()
    assert ran_in == [task_thread] and "Dask-Default-Threads" in task_thread


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_a_cluster_of_threads_shares_the_cores_with_its_blas_and_restores_it() -> None:
    """While an embedded cluster of threads runs, each BLAS call runs ``cores // tasks``
    threads (one per task, as in a worker process), and the count this process had is back
    after the close. Read with OpenBLAS's own getter."""
    import os

    from threadpoolctl import threadpool_limits

    from mvg_dask.engine.cluster import connect

    cores = os.cpu_count() or 1
    with threadpool_limits(3, user_api="blas"):
        before = _openblas_threads()
        assert before and set(before) == {3}
        with connect(processes=False) as c:  # one single-threaded worker per core
            inside = c.submit(_openblas_threads, pure=False).result()
        with connect(processes=False, n_workers=1) as c:
            alone = c.submit(_openblas_threads, pure=False).result()
        after = _openblas_threads()
    assert inside == [1] * len(before)
    assert alone == [cores] * len(before)
    assert after == before


def _environ(name: str) -> str | None:
    """On a worker: its environment variable ``name``."""
    import os

    return os.environ.get(name)


def test_the_embedded_cluster_leaves_this_process_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dask nanny writes its ``pre-spawn-environ`` (one BLAS thread, malloc thresholds) into
    the environment of the process that starts it, and again when it restarts its worker; the
    embedded cluster's workers get it, and this process's environment is as it was, while the
    cluster runs and after its close (here after a restart of the workers)."""
    import os

    from mvg_dask.engine.cluster import connect

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    names = ("OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")
    with connect(n_workers=1) as c:
        during = [os.environ.get(name) for name in names]
        workers = c.run(_environ, "OPENBLAS_NUM_THREADS")
        c.restart()
        restarted = c.run(_environ, "OPENBLAS_NUM_THREADS")
    assert list(workers.values()) == ["1"] and list(restarted.values()) == ["1"]
    assert during == [None, None, "7"]
    assert [os.environ.get(name) for name in names] == [None, None, "7"]


_CLOSE_PROBE = """
from mvg_dask.engine.cluster import connect
for _ in range(20):
    with connect(processes=False) as c:
        assert c.submit(sum, [1, 2], pure=False).result() == 3
"""


def test_closing_a_cluster_of_threads_leaves_nothing_on_the_terminal() -> None:
    """The cluster restores dask's log level as it closes; a comm's batched sender cut off by
    the close then logged ``Batched Comm Closed`` with a traceback, at INFO, to the terminal of
    a script or a notebook, after one close in two to eight. Twenty clusters of threads, each
    with a task, in a fresh process (dask's own log handler, on its stderr), print nothing."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_PROBE], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == "", done.stderr[-2000:]
