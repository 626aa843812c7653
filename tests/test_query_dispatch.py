"""One query, one module: nothing outside ``mvg_dask/plan/queries/`` switches on a query's name,
and an unknown or unreleasable query is an error wherever a name test used to fall through
(docs/concepts/queries.md, "How to add a query")."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import mvg_dask
from mvg_dask.plan.queries import QUERY_TYPES, CovarianceQuery, CustomQuery, query_type
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


@dataclasses.dataclass(frozen=True)
class DoubledCovariance(CovarianceQuery):
    """A test-only covariance whose partial is twice the Gram (pickled to the workers by
    reference: ``tests`` is importable there)."""

    def partial(self, block: np.ndarray) -> np.ndarray:
        return np.asarray(2.0 * (block @ block.T))


def test_the_engine_runs_the_querys_own_partial(tmp_path: Path, client: object) -> None:
    """The Gram tasks call the plan's query's ``partial`` and ``combine`` (its ``finalize``
    divides by ``N``): a plan whose query doubles its partial releases twice the covariance,
    the same plan with the registered type releases the covariance (epsilon 1e7, seeded)."""
    from mvg_dask import api
    from mvg_dask.engine.metadata import read_input_metadata
    from mvg_dask.engine.release import execute_release
    from mvg_dask.plan.planning import plan_release
    from mvg_dask.spec import parse_spec
    from tests.pipeline_helpers import data, make_input, spec_dict

    X = data(3, 500, seed=5)  # values outside [0, 1]: clipped first
    store = make_input(tmp_path / "in.zarr", X, chunk=128)
    Xc = np.clip(X, 0.0, 1.0)
    truth = Xc @ Xc.T / 500
    for name, doubled in (("plain", False), ("doubled", True)):
        raw = spec_dict(store, str(tmp_path / f"{name}.zarr"), query="covariance")
        raw["privacy"] = {"epsilon": 1e7, "delta": 1e-5}
        spec = parse_spec(raw)
        rplan = plan_release(spec, read_input_metadata(spec.input))
        if doubled:
            query = DoubledCovariance(rplan.query.features, rplan.query.records)
            rplan = dataclasses.replace(rplan, query=query)
        execute_release(rplan, client, seed=3, progress=False)  # type: ignore[arg-type]
        released = api.open_release(str(tmp_path / f"{name}.zarr"))["covariance"].values
        np.testing.assert_allclose(released, (2.0 if doubled else 1.0) * truth, rtol=1e-4)
