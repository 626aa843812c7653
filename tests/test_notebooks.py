"""The notebooks: the committed ``.ipynb`` are their jupytext sources, and every notebook runs
without an error (executed in a fresh kernel on the shipped small data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.notebook_helpers import execute, sources

jupytext = pytest.importorskip("jupytext", reason="extra [notebook]")
nbformat = pytest.importorskip("nbformat", reason="extra [notebook]")

SOURCES = sources()


def _cells(nb) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(c.cell_type, c.source) for c in nb.cells]


def test_there_are_seven_notebooks() -> None:
    assert [p.name for p in SOURCES] == [
        "01-quickstart.py",
        "02-privacy-utility.py",
        "03-existing-cluster.py",
        "04-reading-a-release.py",
        "05-centered-and-regression.py",
        "06-federated-rounds.py",
        "07-streams.py",
    ]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_is_its_source(source: Path) -> None:
    """Same cells, in the same order, with the same text; every code cell was executed (in
    order) and at least two notebooks carry figures."""
    committed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    assert _cells(committed) == _cells(jupytext.read(source))
    counts = [c.execution_count for c in committed.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), "re-run: python -m tests.notebook_helpers"
    for cell in committed.cells:
        for out in cell.get("outputs", []):
            assert out.output_type != "error", cell.source[:80]


def test_two_notebooks_have_figures() -> None:
    with_png = [
        p.stem
        for p in SOURCES
        if any(
            "image/png" in out.get("data", {})
            for cell in nbformat.read(p.with_suffix(".ipynb"), as_version=4).cells
            for out in cell.get("outputs", [])
        )
    ]
    assert len(with_png) >= 2, with_png


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_runs(source: Path, tmp_path: Path) -> None:
    """Executed from its source in a fresh kernel; any cell error fails the test. Opening a
    release never warns about consolidated metadata."""
    nb = execute(source, tmp_path)
    text = "\n".join(
        str(out.get("text", "")) for cell in nb.cells for out in cell.get("outputs", [])
    )
    assert "consolidated metadata" not in text
    assert any(
        "image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", [])
    ) or (source.stem == "03-existing-cluster")
