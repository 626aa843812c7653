"""Record domains the plan cannot compute with are refused in one line naming the field.

A declared domain's widths and radius lie in ``[2^-64, 2^64]``, its bounds are 0 or normal floats
of absolute value at most ``2^64`` (docs/guide/specs.md, "The record domain"): a degenerate box
(``lower == upper``, ``lower > upper``), a non-finite bound, a huge or a tiny width, a subnormal
bound, and an ``l2_norm`` that is zero, subnormal, tiny, huge or non-finite are refused by the
spec or by the plan (from metadata: nothing is read, written or charged) with one ``SpecError``
or ``DataError`` line naming the field, for every query kind, calibration, noise kind and
neighbour relation; the CLI exits 2 without a traceback. Any box in a wide range of widths and
offsets either plans with finite, positive noise or is refused that way, never with another
exception.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from mvg_dask import api
from mvg_dask.engine.ledger import open_ledger
from mvg_dask.errors import DataError
from mvg_dask.plan.domain import MAX_SCALE, MIN_SCALE
from mvg_dask.plan.release_plan import ReleasePlan, resolve_about_mean
from mvg_dask.spec import SpecError
from tests.pipeline_helpers import (
    add_group_variable,
    add_second_variable,
    data,
    make_input,
    run_cli,
)

M, N = 3, 200
TINY = 2.0**-65  # below the range: refused
SUBNORMAL = 5e-324
INF = math.inf

#: Every query kind and calibration, both noise kinds and both neighbour relations (valid
#: combinations only): id -> the spec's query, mechanism and privacy (and group_by).
CONFIGS: dict[str, dict[str, Any]] = {
    "identity": {"query": "identity", "mechanism": {"algorithm": "unimodal"}},
    "identity-thm2-float": {
        "query": "identity",
        "mechanism": {"algorithm": "unimodal", "calibration": "mvg-thm2", "noise": "float"},
    },
    "covariance": {"query": "covariance"},
    "covariance-float": {"query": "covariance", "mechanism": {"noise": "float"}},
    "covariance-add-remove": {
        "query": "covariance",
        "privacy": {"neighbours": "add-remove"},
    },
    "covariance-add-remove-N0-float": {
        "query": "covariance",
        "mechanism": {"noise": "float"},
        "privacy": {"neighbours": "add-remove", "records": N},
    },
    "covariance-thm2": {"query": "covariance", "mechanism": {"calibration": "mvg-thm2"}},
    "covariance-thm3": {
        "query": "covariance",
        "mechanism": {"calibration": "mvg-thm3", "algorithm": "equi-modal"},
    },
    "covariance-mgm": {"query": "covariance", "mechanism": {"calibration": "mgm"}},
    "covariance-mgm-udn-add-remove": {
        "query": "covariance",
        "mechanism": {"calibration": "mgm-udn"},
        "privacy": {"neighbours": "add-remove"},
    },
    "covariance-mgm-idn-float": {
        "query": "covariance",
        "mechanism": {"calibration": "mgm-idn", "noise": "float"},
    },
    "covariance-dp-pca": {
        "query": "covariance",
        "mechanism": {"directions": {"method": "dp-pca", "k": 2}},
    },
    "centered": {"query": "centered-covariance"},
    "centered-float-equi-modal": {
        "query": "centered-covariance",
        "mechanism": {"algorithm": "equi-modal", "noise": "float"},
    },
    "centered-thm2": {"query": "centered-covariance", "mechanism": {"calibration": "mvg-thm2"}},
    "centered-auto": {"query": {"centered-covariance": {"route": "auto"}}},
    "centered-mean-first": {
        "query": {"centered-covariance": {"route": "mean-first"}},
        "box_only": True,
    },
    "centered-mean-first-float": {
        "query": {"centered-covariance": {"route": "mean-first"}},
        "mechanism": {"noise": "float"},
        "box_only": True,
    },
    "regression": {"query": {"regression": {"target": "f2"}}},
    "regression-mgm-float": {
        "query": {"regression": {"target": "f2"}},
        "mechanism": {"calibration": "mgm", "noise": "float"},
    },
    "cross": {"query": {"cross-covariance": {"rows": ["f0"], "cols": ["f1", "f2"]}}},
    "cross-add-remove-mgm-udn": {
        "query": {"cross-covariance": {"rows": ["f0", "f1"], "cols": ["f2"]}},
        "mechanism": {"calibration": "mgm-udn"},
        "privacy": {"neighbours": "add-remove", "records": N},
    },
    "cross-two-variables": {
        "query": {
            "cross-covariance": {
                "rows": ["f0", "f2"],
                "cols": {"variable": "Y", "features": ["g1"], "box": {"lower": -1, "upper": 2}},
            }
        },
        "box_only": True,
    },
    "cross-two-variables-float": {
        "query": {
            "cross-covariance": {
                "rows": ["f1"],
                "cols": {
                    "variable": "Y",
                    "features": ["g0", "g1"],
                    "box": {"lower": 0, "upper": 1},
                },
            }
        },
        "mechanism": {"noise": "float"},
        "box_only": True,
    },
    "grouped": {
        "query": "centered-covariance",
        "group_by": {"variable": "site", "groups": [0, 1]},
    },
    "grouped-regression-float": {
        "query": {"regression": {"target": "f0"}},
        "mechanism": {"noise": "float"},
        "group_by": {"variable": "site", "groups": [0, 1]},
    },
}
TWO_VARIABLES = [k for k in CONFIGS if k.startswith("cross-two-variables")]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``X`` (3 features, labels f0..f2), a second variable ``Y`` (labels g0, g1) and a group
    variable ``site``: planning reads their metadata only."""
    path = make_input(tmp_path_factory.mktemp("degenerate") / "in.zarr", data(M, N), chunk=64)
    add_second_variable(path, data(2, N, seed=1), chunk=64)
    add_group_variable(path, np.arange(N) % 2)
    return path


def _spec(store: str, config: str, domain: dict[str, Any], out: str = "out.zarr") -> dict:
    c = copy.deepcopy(CONFIGS[config])
    spec: dict[str, Any] = {
        "name": "degenerate",
        "input": {"store": store, "variable": "X"},
        "domain": domain,
        "query": c["query"],
        "mechanism": c.get("mechanism", {}),
        "privacy": {"epsilon": 1.0, "delta": 1e-5, **c.get("privacy", {})},
        "output": {"store": out},
    }
    if "group_by" in c:
        spec["group_by"] = c["group_by"]
    return spec


def _with_cols_box(spec: dict[str, Any], box: dict[str, Any]) -> dict[str, Any]:
    spec["query"]["cross-covariance"]["cols"]["box"] = box
    return spec


def _box(lower: Any, upper: Any) -> dict[str, Any]:
    return {"box": {"lower": lower, "upper": upper}}


#: Degenerate domains -> the field the one-line error names. The spec refuses what it can see
#: alone (scalar bounds out of order, non-finite numbers, a radius <= 0); the plan the rest.
DEGENERATE: dict[str, tuple[dict[str, Any], str]] = {
    "equal": (_box(1.0, 1.0), "domain.box:"),
    "equal-one-feature": (_box([0.0, 0.5, 0.0], [1.0, 0.5, 1.0]), "domain.box.upper:"),
    "reversed": (_box(1.0, 0.0), "domain.box:"),
    "reversed-one-feature": (_box([0.0, 2.0, 0.0], 1.0), "domain.box.upper:"),
    "upper-inf": (_box(0.0, INF), "domain.box:"),
    "lower-nan": (_box(math.nan, 1.0), "domain.box:"),
    "lower--inf-one-feature": (_box([0.0, -INF, 0.0], 1.0), "domain.box:"),
    "width-1e-300": (_box(0.0, 1e-300), "domain.box.upper:"),
    "width-subnormal": (_box(0.0, SUBNORMAL), "domain.box.upper:"),
    "width-2^-65": (_box(0.0, TINY), "domain.box.upper:"),
    "width-2^-66-one-feature": (  # bounds in range, the width not
        _box([0.0, 2.0**-60, 0.0], [1.0, 2.0**-60 + 2.0**-66, 1.0]),
        "domain.box.upper:",
    ),
    "width-tiny-far-from-0": (_box(1.0, 1.0 + 2.0**-52), None),  # in range: may plan
    "subnormal-bound": (_box(SUBNORMAL, 1.0), "domain.box.lower:"),
    "subnormal-bounds": (_box(SUBNORMAL, 2 * SUBNORMAL), "domain.box.lower:"),
    "upper-1e150": (_box(0.0, 1e150), "domain.box.upper:"),
    "upper-2^65": (_box(0.0, 2.0**65), "domain.box.upper:"),
    "bounds-1e308": (_box(-1e308, 1e308), "domain.box.lower:"),
    "width-2^65": (_box(-(2.0**64), 2.0**64), "domain.box.upper:"),
    "huge-far-from-0": (_box(1e300, 1e300 * (1 + 1e-15)), "domain.box.lower:"),
    "l2-zero": ({"l2_norm": 0.0}, "domain.l2_norm:"),
    "l2-negative": ({"l2_norm": -1.0}, "domain.l2_norm:"),
    "l2-subnormal": ({"l2_norm": SUBNORMAL}, "domain.l2_norm:"),
    "l2-1e-300": ({"l2_norm": 1e-300}, "domain.l2_norm:"),
    "l2-2^-65": ({"l2_norm": TINY}, "domain.l2_norm:"),
    "l2-1e150": ({"l2_norm": 1e150}, "domain.l2_norm:"),
    "l2-2^65": ({"l2_norm": 2.0**65}, "domain.l2_norm:"),
    "l2-inf": ({"l2_norm": INF}, "domain.l2_norm:"),
    "l2-nan": ({"l2_norm": math.nan}, "domain.l2_norm:"),
}


def _refusal(spec: dict[str, Any]) -> str:
    """The dry run's one-line refusal (a ``SpecError`` or ``DataError``)."""
    with pytest.raises((SpecError, DataError)) as info:
        api.dry_run(spec)
    message = str(info.value)
    assert "\n" not in message
    return message


def _assert_planned(plan: ReleasePlan) -> None:
    """Finite, positive, normal noise wherever the plan fixes it (and a finite public plan)."""

    def finite(value: Any) -> None:
        if isinstance(value, float):
            assert math.isfinite(value), plan.public_dict()
        elif isinstance(value, dict):
            for v in value.values():
                finite(v)
        elif isinstance(value, list | tuple):
            for v in value:
                finite(v)

    finite(plan.public_dict())
    noise = plan.noise
    if plan.mean_first is not None:
        assert np.finfo(float).tiny <= plan.mean_first.std < math.inf
        centre = (plan.domain.lower + plan.domain.upper) / 2  # type: ignore[union-attr]
        noise = resolve_about_mean(plan, centre).noise  # the covariance step, planned later
    if noise is not None:
        std = np.asarray(noise.entry_std())
        assert np.all(np.isfinite(std)) and np.all(std >= np.finfo(float).tiny), std


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize(
    "domain",
    [
        _box(0.0, 1.0),
        _box(-1.0, 1.0),
        _box(0.0, 0.01),
        _box(0.0, 100.0),
        _box([0.0, -5.0, 10.0], [1.0, 5.0, 1e6]),
        _box(0.0, MIN_SCALE),  # the range's ends are accepted
        _box(-MAX_SCALE, 0.0),
        _box(1e-300, 1.0),  # a tiny (normal) bound: the width sets the scale
        _box(2.0**-60, 2.0**-60 + MIN_SCALE),
        {"l2_norm": 1.0},
        {"l2_norm": MIN_SCALE},
        {"l2_norm": MAX_SCALE},
    ],
    ids=str,
)
def test_sensible_and_extreme_domains_in_range_plan(store, config, domain):
    if "l2_norm" in domain and CONFIGS[config].get("box_only"):
        pytest.skip("this query takes a box")
    _assert_planned(api.dry_run(_spec(store, config, domain)))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", DEGENERATE)
def test_a_degenerate_domain_is_refused_in_one_line_naming_its_field(store, config, case):
    domain, field = DEGENERATE[case]
    if "l2_norm" in domain and CONFIGS[config].get("box_only"):
        pytest.skip("this query takes a box (refused as such: tests/test_mean_first.py)")
    spec = _spec(store, config, domain)
    if field is None:  # in range: a plan, or a refusal naming the domain (the float error)
        try:
            plan = api.dry_run(spec)
        except (SpecError, DataError) as exc:
            assert "domain.box" in str(exc) and "\n" not in str(exc)
        else:
            _assert_planned(plan)
        return
    assert field in _refusal(spec)


@pytest.mark.parametrize("config", TWO_VARIABLES)
@pytest.mark.parametrize(
    "case",
    [c for c, (_, field) in DEGENERATE.items() if field and field.startswith("domain.box.")],
)
def test_a_second_variables_degenerate_box_names_cols_box(store, config, case):
    spec = _spec(store, config, _box(0.0, 1.0))
    box = {  # Y's two features: a per-feature case keeps its degenerate feature (position 1)
        key: value[1:] if isinstance(value, list) else value
        for key, value in DEGENERATE[case][0]["box"].items()
    }
    field = DEGENERATE[case][1].removeprefix("domain.box")
    spec = _with_cols_box(spec, box)
    assert f"query.cross-covariance.cols.box{field}" in _refusal(spec)


@pytest.mark.parametrize(
    ("box", "match"),
    [
        ({"lower": 1.0, "upper": 1.0}, "must be < upper"),
        ({"lower": 0.0, "upper": INF}, "must be finite"),
    ],
)
def test_a_second_variables_box_refused_by_the_spec_names_cols_box(store, box, match):
    spec = _with_cols_box(_spec(store, "cross-two-variables", _box(0.0, 1.0)), box)
    message = _refusal(spec)
    assert "query.cross-covariance.cols.box: " in message and match in message
    assert ";" not in message  # the cross-covariance member's error only, not every member's


def _width_or_bound() -> st.SearchStrategy[float]:
    """Positive floats from the smallest subnormal to the largest float, log-uniform, half of
    them near the accepted range ``[2^-64, 2^64]``."""
    exponents = st.one_of(st.integers(-1074, 1023), st.integers(-80, 80))
    return exponents.flatmap(
        lambda e: st.floats(0.5, 1.0).map(lambda f: math.ldexp(f, e) or math.ldexp(1.0, -1074))
    )


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # the store is read-only
@given(
    config=st.sampled_from(sorted(CONFIGS)),
    width=_width_or_bound(),
    offset=_width_or_bound(),
    sign=st.sampled_from([-1.0, 0.0, 1.0]),
    ball=st.booleans(),
    on_cols=st.booleans(),
)
@example(config="covariance", width=1e-300, offset=1.0, sign=0.0, ball=False, on_cols=False)
@example(config="centered", width=5e-324, offset=1.0, sign=0.0, ball=False, on_cols=False)
@example(config="centered", width=1e150, offset=1.0, sign=0.0, ball=False, on_cols=False)
@example(config="covariance", width=1e150, offset=1.0, sign=0.0, ball=True, on_cols=False)
@example(config="covariance-thm2", width=1.0, offset=2.0**63, sign=1.0, ball=False, on_cols=False)
@example(config="cross-two-variables", width=1e-300, offset=1.0, sign=0.0, ball=False, on_cols=True)
def test_any_box_plans_with_finite_noise_or_is_refused_naming_the_domain(
    store, config, width, offset, sign, ball, on_cols
):
    """Box ``[sign * offset, sign * offset + width]`` (or an L2 ball of radius ``width``; or
    the box of a second variable) over widths and offsets from 2^-1074 to 2^1023: a plan with
    finite positive noise, or one ``SpecError``/``DataError`` line naming a domain field; never
    another exception."""
    box_only = CONFIGS[config].get("box_only")
    lower = sign * offset
    domain = {"l2_norm": width} if ball and not box_only else _box(lower, lower + width)
    if on_cols and config in TWO_VARIABLES:
        spec = _with_cols_box(_spec(store, config, _box(0.0, 1.0)), domain["box"])
        fields: tuple[str, ...] = ("query.cross-covariance.cols.box",)
    else:
        spec = _spec(store, config, domain)
        fields = ("domain.box", "domain.l2_norm")
    try:
        plan = api.dry_run(spec)
    except (SpecError, DataError) as exc:
        message = str(exc)
        assert "\n" not in message
        assert any(f in message for f in fields), message
        event(f"refused: {type(exc).__name__}")
    else:
        _assert_planned(plan)
        event("planned")


@pytest.mark.parametrize(
    ("config", "domain", "field", "existing_ledger", "dry_run"),
    [
        ("covariance", _box(0.0, 1e-300), "domain.box.upper:", False, False),
        ("centered", _box(0.0, 1e150), "domain.box.upper:", True, False),
        ("centered-mean-first", _box(SUBNORMAL, 1.0), "domain.box.lower:", True, False),
        ("regression", {"l2_norm": 5e-324}, "domain.l2_norm:", False, True),
        ("identity", _box(1.0, 1.0), "domain.box:", True, False),
    ],
)
def test_the_cli_exits_2_in_one_line_and_changes_nothing(
    tmp_path, store, config, domain, field, existing_ledger, dry_run
):
    """Exit 2, one ``mvg-dask: error:`` line on stderr (no traceback), no output store, and
    the SQLite ledger of the spec unchanged (not created, or the same bytes)."""
    import yaml

    ledger = tmp_path / "ledger.sqlite"
    if existing_ledger:  # keeps its bytes
        with open_ledger(ledger, create=True):
            pass
    before = ledger.read_bytes() if ledger.exists() else None
    spec = _spec(store, config, domain, out=str(tmp_path / "out.zarr"))
    spec["release_id"] = "r1"
    spec["ledger"] = {"path": str(ledger), "dataset": "d", "budget": {"epsilon": 4, "delta": 1e-4}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = run_cli(tmp_path, "release", "spec.yaml", "--quiet", *(["--dry-run"] if dry_run else []))
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("mvg-dask: error: ") and field in line, line
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not (tmp_path / "out.zarr").exists()
    assert (ledger.read_bytes() if ledger.exists() else None) == before


@pytest.mark.parametrize(
    ("domain", "message"),
    [
        (["--bounds", "0", "1e-300"], "--bounds: upper: feature 0 has width"),
        (["--bounds", "5e-324", "1"], "--bounds: lower: feature 0 has lower=5e-324"),
        (["--l2-norm", "1e150"], "--l2-norm: got 1e+150"),
    ],
)
def test_calibrate_refuses_a_degenerate_domain_naming_its_option(capsys, domain, message):
    from mvg_dask.cli import main

    args = ["calibrate", "--query", "covariance", "--features", "3", "--records", "100"]
    args += ["--epsilon", "1", "--delta", "1e-5", "--algorithm", "unimodal"]
    assert main([*args, "--calibration", "exact", *domain]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"mvg-dask: error: {message}"), line
