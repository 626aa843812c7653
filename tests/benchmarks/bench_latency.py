"""How long the small commands take against a bare ``python -c "import numpy, yaml"``.

Run: ``make bench`` or ``.venv/bin/python -m tests.benchmarks.bench_latency [--repeats 7]``

Each command runs in a fresh process, interleaved with the baseline in every round (so that
the load of the machine affects both alike), in a scratch directory holding the CTG data
(``mvg-dask dataset ctg``) and the shipped ``pipelines/ctg-covariance.yaml``:

* ``baseline``: ``python -c "import numpy, yaml"``;
* ``help``: ``mvg-dask --help``;
* ``dry run``: ``mvg-dask release pipelines/ctg-covariance.yaml --dry-run``;
* ``CTG release``: the same spec released end to end (its SQLite ledger charged, its output
  written; both removed before the next round).

It prints the median wall and CPU seconds (the process and its children) of each and their
ratios to the baseline's. The targets (docs/guide/performance.md, "Start-up"): the dry run at
most 3x and the CTG release at most 8x the baseline. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = "pipelines/ctg-covariance.yaml"


def _cli() -> list[str]:
    return [sys.executable, "-m", "mvg_dask"]


def commands(other: Path | None = None) -> dict[str, tuple[list[str], Path]]:
    """The commands timed, by label (run in the scratch directory), each with the source tree
    it runs from; with ``other``, the dry run and the release from that tree too."""
    cmds = {
        "baseline": ([sys.executable, "-c", "import numpy, yaml"], ROOT),
        "help": ([*_cli(), "--help"], ROOT),
        "dry run": ([*_cli(), "release", SPEC, "--dry-run"], ROOT),
        "CTG release": ([*_cli(), "release", SPEC, "--quiet"], ROOT),
    }
    if other is not None:
        cmds["dry run, other"] = (cmds["dry run"][0], other)
        cmds["CTG release, other"] = (cmds["CTG release"][0], other)
    return cmds


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``cmd`` (it must succeed)."""
    cpu = _children_cpu()
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t, _children_cpu() - cpu


def scratch() -> Path:
    """A directory with the CTG data and the shipped spec, as the quickstart lays them out."""
    work = Path(tempfile.mkdtemp(prefix="mvg-latency-"))
    (work / "pipelines").mkdir()
    shutil.copy(ROOT / SPEC, work / SPEC)
    subprocess.run(
        [*_cli(), "dataset", "ctg", "--out", str(work / "data" / "ctg.zarr")],
        check=True,
        capture_output=True,
        env=_env(),
    )
    return work


def _env(root: Path = ROOT) -> dict[str, str]:
    """The commands' environment: ``root`` first on the path, and byte-code caching on (an
    inherited ``PYTHONDONTWRITEBYTECODE`` would time the compiling of every source file, which
    an installed package never pays)."""
    path = os.environ.get("PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else str(root)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--other",
        type=Path,
        default=None,
        metavar="TREE",
        help="Also time the dry run and the release from another source tree (an older commit).",
    )
    args = parser.parse_args()
    work = scratch()
    cmds = commands(args.other)
    wall: dict[str, list[float]] = {k: [] for k in cmds}
    cpu: dict[str, list[float]] = {k: [] for k in cmds}
    try:
        for cmd, root in cmds.values():  # byte-compiles the sources once, untimed
            shutil.rmtree(work / "out", ignore_errors=True)
            timed(cmd, work, _env(root))
        for r in range(args.repeats):
            order = list(cmds) if r % 2 == 0 else list(reversed(cmds))
            for label in order:
                shutil.rmtree(work / "out", ignore_errors=True)
                cmd, root = cmds[label]
                w, c = timed(cmd, work, _env(root))
                wall[label].append(w)
                cpu[label].append(c)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base_w, base_c = statistics.median(wall["baseline"]), statistics.median(cpu["baseline"])
    print(f"start-up latency, median of {args.repeats} interleaved runs, fresh processes")
    print(f"{'command':<20} {'wall s':>8} {'ratio':>7} {'CPU s':>8} {'ratio':>7}")
    for label in cmds:
        w, c = statistics.median(wall[label]), statistics.median(cpu[label])
        print(f"{label:<20} {w:>8.3f} {w / base_w:>6.1f}x {c:>8.3f} {c / base_c:>6.1f}x")
    if args.other is not None:
        print(f"other: {args.other}")
    print("targets: dry run <= 3x, CTG release <= 8x the baseline")


if __name__ == "__main__":
    main()
