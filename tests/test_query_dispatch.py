"""One query, one module: nothing outside ``mvg_dask/plan/queries/`` switches on a query's name,
and an unknown or unreleasable query is an error wherever a name test used to fall through
(docs/concepts/queries.md, "How to add a query")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mvg_dask
from mvg_dask.plan.queries import QUERY_TYPES, CustomQuery, query_type
from mvg_dask.plan.stages import release_stages
from mvg_dask.release_format import (
    INPUT_VARIABLE_ATTR,
    QUERY_ATTR,
    gaussian_variable,
    released_variable,
)

#: A test of a query's name against a value: ``query.kind ==``, ``query_kind in``, ``query !=``...
DISPATCH = re.compile(r"(query\.kind|query_kind|\bquery\b|\bq\.kind)\s*(==|!=|not in|in)\s")
#: Where a query's name may be tested: the query types themselves, and the experiments and
#: baselines (research code that names the methods it compares).
ALLOWED = ("plan/queries/", "experiments/", "baselines/")


def dispatch_hits() -> list[str]:
    """Every line of the package that tests a query's name, outside :data:`ALLOWED`."""
    root = Path(mvg_dask.__file__).parent
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(ALLOWED):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DISPATCH.search(line):
                hits.append(f"mvg_dask/{rel}:{number}: {line.strip()}")
    return hits


def test_no_dispatch_on_a_query_name_outside_the_query_package() -> None:
    assert dispatch_hits() == []


def test_the_rule_sees_a_dispatch(tmp_path: Path) -> None:
    """The pattern catches each form it forbids (and not a loop over names)."""
    for line in (
        'if rplan.query.kind == "identity":',
        "if spec.query_kind in MOMENT_QUERY_KINDS and x:",
        'if query != "covariance":',
        'if q.kind not in ("a", "b"):',
    ):
        assert DISPATCH.search(line), line
    assert not DISPATCH.search("query = make_query(kind)")


def test_the_registry_is_exhaustive() -> None:
    for kind, cls in QUERY_TYPES.items():
        assert query_type(kind) is cls and cls.kind == kind
    with pytest.raises(ValueError, match=r"query must be one of .*, got 'nope'"):
        query_type("nope")
    with pytest.raises(ValueError, match="query must be one of"):
        query_type(None)  # type: ignore[arg-type]


def test_release_stages_of_a_query_the_engine_does_not_run_is_an_error() -> None:
    custom = CustomQuery(3, 10, shape_=(3, 3), sensitivity=1.0)
    with pytest.raises(ValueError, match="custom query has no release stages"):
        release_stages(custom, noisy_count=False, dp_pca=False, panels=False, lattice=False)


def test_released_variable_of_an_unknown_query_is_an_error() -> None:
    attrs = {QUERY_ATTR: "nope", INPUT_VARIABLE_ATTR: "X"}
    with pytest.raises(ValueError, match="got 'nope'"):
        released_variable(attrs)
    with pytest.raises(ValueError, match="got 'nope'"):
        gaussian_variable(attrs, ["X"])
    with pytest.raises(ValueError, match="got None"):
        released_variable({INPUT_VARIABLE_ATTR: "X"})  # not a release: no query attribute


def test_the_dry_run_line_of_an_unreleased_query_is_an_error() -> None:
    custom = CustomQuery(3, 10, shape_=(3, 3), sensitivity=1.0)
    with pytest.raises(ValueError, match="custom query has no dry-run description"):
        custom.dry_run_text(None)


def test_every_released_query_answers_its_hooks() -> None:
    """Each registered query the engine runs has stages and a released variable."""
    for kind, cls in QUERY_TYPES.items():
        if cls is CustomQuery:
            continue
        attrs = {QUERY_ATTR: kind, INPUT_VARIABLE_ATTR: "X"}
        assert released_variable(attrs) == (cls.output_variable or "X")
