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
    # the notebooks declare the kernel `mvg-dask` (`make kernel` registers this venv's under
    # that name); here they run in the interpreter that runs the tests, registered or not
    client = NotebookClient(
        nb,
        timeout=TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return nb


def _without(value: object, prefix: str) -> object:
    """``value`` with the scratch directory ``prefix`` written as ``<scratch>`` (the committed
    outputs carry no path of the machine that ran them)."""
    if isinstance(value, str):
        return value.replace(prefix, "<scratch>")
    if isinstance(value, list):
        return [_without(v, prefix) for v in value]
    if isinstance(value, dict):
        return {k: _without(v, prefix) for k, v in value.items()}
    return value


def scrub(nb, work: Path):  # type: ignore[no-untyped-def]
    """Remove the scratch directory's path from every output of ``nb`` (in place)."""
    import nbformat

    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = [
                nbformat.from_dict(_without(dict(o), str(work))) for o in cell.get("outputs", [])
            ]
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
        nb = scrub(execute(source, work), work)
        target = source.with_suffix(".ipynb")
        nbformat.write(nb, target)
        print(f"{target.name}: executed in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
