"""Execute the notebooks from their jupytext sources (``notebooks/*.py``, percent format).

``python -m tests.notebook_helpers [--out DIR]`` re-executes every source and writes the executed
``.ipynb`` beside it (what is committed); ``tests/test_notebooks.py`` executes them in a scratch
directory and checks that the committed ``.ipynb`` cells are the sources' cells.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TIMEOUT = 300  # seconds per cell


def sources() -> list[Path]:
    """Every notebook source: ``notebooks/*.py`` with a jupytext header."""
    return sorted(
        p for p in NOTEBOOKS.glob("*.py") if "jupytext:" in p.read_text().split("# ---", 2)[1]
    )


def execute(source: Path, cwd: Path):  # type: ignore[no-untyped-def]
    """The notebook of ``source``, executed in a fresh kernel with working directory ``cwd``.

    Raises nbclient's ``CellExecutionError`` on the first cell that raises.
    """
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(source)
    client = NotebookClient(
        nb,
        timeout=TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def main() -> None:
    """Re-execute every notebook and write its ``.ipynb`` beside its source."""
    import nbformat

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--workdir", default=None, help="where the notebooks run (a scratch dir)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mvg-dask-notebooks-"))
    work.mkdir(parents=True, exist_ok=True)
    for source in sources():
        t0 = time.perf_counter()
        nb = execute(source, work)
        target = source.with_suffix(".ipynb")
        nbformat.write(nb, target)
        print(f"{target.name}: executed in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
