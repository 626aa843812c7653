"""The printed examples of the README and the documentation are what the commands print.

Every ```console block of ``README.md`` and ``docs/**/*.md`` whose first line is
``$ mvg-dask calibrate ...`` or ``$ mvg-dask release SPEC --dry-run`` is run, and its output
compared with the block. A dry run reads the spec shipped in ``pipelines/`` from a scratch copy
of the repository's layout (the spec and ``data/ctg.zarr``); in the blocks the scratch directory
is written ``<repo>``, and the release id's time and random suffix may differ. The README's
example spec is the shipped file. Also: the README stays a front page (at most 250 lines, with
the Quickstart's two commands), and the notebooks name the kernel the README registers.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
EXAMPLE_SPEC = ROOT / "pipelines" / "ctg-symmetric.yaml"
_FENCE = re.compile(r"^```console\n(.*?)^```", re.MULTILINE | re.DOTALL)
_RELEASE_ID_SUFFIX = re.compile(r"-\d{8}T\d{6}Z-[0-9a-f]{6}\b")


def _console_blocks() -> list[tuple[str, str, str]]:
    """``(file, command, expected output)`` of every ``$ mvg-dask`` console block."""
    found = []
    for path in [README, *PAGES]:
        for block in _FENCE.findall(path.read_text()):
            first, _, rest = block.partition("\n")
            checked = first.startswith("$ mvg-dask calibrate ") or (
                first.startswith("$ mvg-dask release ") and first.endswith(" --dry-run")
            )
            if checked:
                found.append((str(path.relative_to(ROOT)), first[2:], rest))
    return found


BLOCKS = _console_blocks()


def _run(command: str, cwd: Path) -> str:
    args = shlex.split(command)
    assert args[0] == "mvg-dask"
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", *args[1:]],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's layout for the dry runs: ``pipelines/*.yaml`` and ``data/ctg.zarr``."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "pipelines", root / "pipelines", ignore=shutil.ignore_patterns("*.py"))
    _run("mvg-dask dataset ctg --out data/ctg.zarr", root)
    return root


def test_the_examples_are_found() -> None:
    commands = [c for _, c, _ in BLOCKS]
    assert any(c.startswith("mvg-dask release") for c in commands)
    assert sum(c.startswith("mvg-dask calibrate") for c in commands) >= 3
    assert any(f == "README.md" for f, _, _ in BLOCKS)


@pytest.mark.parametrize(("where", "command", "expected"), BLOCKS, ids=lambda v: str(v)[:60])
def test_printed_output_is_what_the_command_prints(
    where: str, command: str, expected: str, scratch_repo: Path
) -> None:
    printed = _run(command, scratch_repo).replace(str(scratch_repo), "<repo>")
    if " --dry-run" in command:
        printed = _RELEASE_ID_SUFFIX.sub("-<id>", printed)
        expected = _RELEASE_ID_SUFFIX.sub("-<id>", expected)
    assert printed == expected, f"{where}: regenerate the block with `{command}`"


def test_readme_example_spec_is_the_shipped_file() -> None:
    """The README's spec block is ``pipelines/ctg-symmetric.yaml`` without its header comment."""
    body = "".join(
        line for line in EXAMPLE_SPEC.read_text().splitlines(True) if not line.startswith("#")
    )
    assert f"```yaml\n{body}```" in README.read_text()


def test_readme_is_a_front_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = quickstart.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in block.splitlines()] == [
        ["make", "demo"],
        ["make", "test"],
    ]


def test_notebooks_declare_the_kernel_the_readme_registers() -> None:
    """The README and ``make kernel`` register the venv's kernel under the name every notebook
    declares."""
    match = re.search(r"ipykernel install --user --name (\S+)", README.read_text())
    assert match is not None
    assert f"ipykernel install --user --name {match.group(1)} " in (ROOT / "Makefile").read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        kernelspec = json.loads(nb.read_text())["metadata"]["kernelspec"]
        assert kernelspec["name"] == match.group(1), nb.name
        assert f"name: {match.group(1)}" in nb.with_suffix(".py").read_text(), nb.name


def test_ledger_page_numbers_are_the_ledgers_composition() -> None:
    """The ledger page's table: k releases at epsilon=1, delta=1e-6 in a budget at delta=1e-5."""
    from mvg_dask.ledger import spending
    from mvg_dask.privacy.calibration import analytic_gaussian_mu

    page = (ROOT / "docs" / "guide" / "ledger.md").read_text()
    mu1 = analytic_gaussian_mu(1.0, 1e-6)
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|$", page, re.MULTILINE)
    assert [int(k) for k, *_ in rows] == [1, 2, 3, 5, 9]
    for k, mu, eps, basic in rows:
        spent = spending([(1.0, 1e-6, "exact", mu1)] * int(k), 1e-5)
        assert spent.composition == "gaussian-dp" and spent.mu is not None
        assert (f"{spent.mu:.4f}", f"{spent.epsilon:.4g}", basic) == (mu, eps, k)
    assert spending([(1.0, 1e-6, "exact", mu1)] * 9, 1e-5).fits(3.0, 1e-5)
    assert not spending([(1.0, 1e-6, "exact", mu1)] * 10, 1e-5).fits(3.0, 1e-5)
    assert "spent epsilon=0.8725" in page and "Nine fit the budget of 3" in page
