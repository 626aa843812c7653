"""Execute the notebooks from their jupytext sources (``notebooks/*.py``, percent format).

``python -m tests.notebook_helpers [--out DIR]`` re-executes every source and writes the executed
``.ipynb`` beside it (what is committed); ``tests/test_notebooks.py`` executes them in a scratch
directory and checks that the committed ``.ipynb`` cells are the sources' cells.
"""

from __future__ import annotations

import argparse
import re
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


#: a link to a server of the run that made the outputs (its dashboard): dead once it has ended
_LOCAL_LINK = re.compile(
    r"<a\s[^>]*href=\"https?://(?:127\.0\.0\.1|localhost|\[::1\])[^\"]*\"[^>]*>(.*?)</a>", re.S
)
#: widget views need the widget state and a widget manager from a CDN; their text/plain stays
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _without(value: object, prefix: str) -> object:
    """``value`` with the scratch directory ``prefix`` removed: paths read relative to where the
    notebook ran, as the notebooks say (the committed outputs carry no path of the machine that
    ran them), and links to the run's own local servers kept as plain text."""
    if isinstance(value, str):
        value = value.replace(prefix.rstrip("/") + "/", "")
        return _LOCAL_LINK.sub(r"<code>\1</code>", value)
    if isinstance(value, list):
        return [_without(v, prefix) for v in value]
    if isinstance(value, dict):
        return {k: _without(v, prefix) for k, v in value.items()}
    return value


def _static(output: dict) -> dict:  # type: ignore[type-arg]
    """An output as a static page shows it: a widget view keeps only its text fallback."""
    data = output.get("data")
    if isinstance(data, dict) and _WIDGET_VIEW in data and len(data) > 1:
        output = dict(output, data={k: v for k, v in data.items() if k != _WIDGET_VIEW})
    return output


def scrub(nb, work: Path | str):  # type: ignore[no-untyped-def]
    """Make ``nb``'s outputs fit to commit and render (in place): no path of the scratch directory
    ``work``, no live link to the run's local servers, no widget state or widget views."""
    import nbformat

    for cell in nb.cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = [
                nbformat.from_dict(_static(_without(dict(o), str(work))))  # type: ignore[arg-type]
                for o in cell.get("outputs", [])
            ]
    nb.metadata.pop("widgets", None)
    return nb


def main() -> None:
    """Re-execute every notebook (or those named) and write its ``.ipynb`` beside its source."""
    import nbformat

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--workdir", default=None, help="where the notebooks run (a scratch dir)")
    parser.add_argument("names", nargs="*", help="only these notebooks (e.g. 07-streams)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mvg-dask-notebooks-"))
    work.mkdir(parents=True, exist_ok=True)
    for source in sources():
        if args.names and source.stem not in args.names:
            continue
        t0 = time.perf_counter()
        nb = scrub(execute(source, work), work)
        target = source.with_suffix(".ipynb")
        nbformat.write(nb, target)
        print(f"{target.name}: executed in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
