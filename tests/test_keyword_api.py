"""Keyword construction of a release (``api.release_spec``): the YAML schema and its errors;
and the performance report option."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mvg_dask import api
from mvg_dask.spec import DomainSpec, PrivacySpec, SpecError, load_spec
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec


def _message(exc: BaseException) -> str:
    """The message without its source (``release_spec: `` or ``path/spec.yaml: ``)."""
    return str(exc).split(": ", 1)[1]


def _yaml_error(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = write_spec(tmp_path / "bad.yaml", spec)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: ")
    return _message(info.value)


def _keyword_error(spec: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        api.release_spec(**spec)
    assert str(info.value).startswith("release_spec: ")
    return _message(info.value)


BAD = {
    "negative-epsilon": ("privacy", {"epsilon": -1.0, "delta": 1e-5}),
    "delta-one": ("privacy", {"epsilon": 1.0, "delta": 1.0}),
    "unknown-key-in-section": ("domain", {"box": {"lower": 0, "upper": 1}, "on_violaton": "clip"}),
    "lower-above-upper": ("domain", {"box": {"lower": 2.0, "upper": 1.0}}),
    "wrong-calibration": ("mechanism", {"calibration": "mvg-thm3", "algorithm": "unimodal"}),
    "wrong-query": ("query", "median"),
    "bad-name": ("name", "no spaces allowed"),
    "ledger-both": (
        "ledger",
        {
            "path": "l.sqlite",
            "url": "sqlite:///x",
            "dataset": "d",
            "budget": {"epsilon": 1, "delta": 1e-5},
        },
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_keyword_errors_equal_yaml_errors(tmp_path: Path, case: str) -> None:
    key, value = BAD[case]
    spec = spec_dict("in.zarr", "out.zarr")
    spec[key] = value
    yaml_msg = _yaml_error(tmp_path, copy.deepcopy(spec))
    assert _keyword_error(copy.deepcopy(spec)) == yaml_msg
    assert yaml_msg  # names the field, e.g. "privacy.epsilon: Input should be greater than 0"


def test_unknown_and_missing_keys_are_the_yaml_errors(tmp_path: Path) -> None:
    spec = spec_dict("in.zarr", "out.zarr")
    extra = {**spec, "privcy": {"epsilon": 1.0}}
    assert (
        _keyword_error(extra)
        == _yaml_error(tmp_path, extra)
        == ("privcy: unknown key (check its spelling)")
    )
    missing = {k: v for k, v in spec.items() if k != "query"}
    assert _keyword_error(missing) == _yaml_error(tmp_path, missing) == "query: Field required"


def test_keyword_spec_equals_the_yaml_spec(tmp_path: Path) -> None:
    """Sections as mappings or as the spec's models give the spec the YAML file gives."""
    store = make_input(tmp_path / "in.zarr", data(3, 100))
    spec = spec_dict(store, str(tmp_path / "out.zarr"), release_id="kw")
    from_yaml = load_spec(write_spec(tmp_path / "s.yaml", spec))
    assert api.release_spec(**spec) == from_yaml
    models = {
        **spec,
        "domain": DomainSpec.model_validate(spec["domain"]),
        "privacy": PrivacySpec.model_validate(spec["privacy"]),
    }
    assert api.release_spec(**models) == from_yaml
    assert (
        api.dry_run(api.release_spec(**spec)).public_dict()["plan"]
        == (api.dry_run(from_yaml).public_dict()["plan"])
    )


def test_performance_report_next_to_the_output(tmp_path: Path, client) -> None:
    store = make_input(tmp_path / "in.zarr", data(3, 400), chunk=100)
    out = tmp_path / "out.zarr"
    spec = api.release_spec(**spec_dict(store, str(out), release_id="perf"))
    inside = out / "report.html"
    with pytest.raises(ValueError, match="inside the output store"):
        api.release(spec, client=client, seed=1, progress=False, performance_report=inside)
    assert not out.exists()  # refused before anything ran
    res = api.release(spec, client=client, seed=1, progress=False, performance_report=True)
    report = tmp_path / "out.zarr.performance-report.html"
    assert report.is_file() and "<html" in report.read_text()[:2000].lower()
    assert not any(p.name.endswith(".html") for p in out.rglob("*"))  # not published
    api.open_release(res.output)


def test_cli_performance_report_flag(tmp_path: Path, client) -> None:
    """``--performance-report auto`` writes the report beside the output and says on stderr that
    it is curator-side; stdout (what an analyst may see) is unchanged."""
    import subprocess
    import sys

    store = make_input(tmp_path / "in.zarr", data(3, 200), chunk=100)
    path = write_spec(tmp_path / "spec.yaml", spec_dict(store, str(tmp_path / "o.zarr")))
    run = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path), "--seed", "1",
         "--scheduler", client.scheduler.address, "--quiet", "--performance-report", "auto"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "performance-report" not in run.stdout
    assert "curator-side, do not publish" in run.stderr
    assert (tmp_path / "o.zarr.performance-report.html").is_file()
    refused = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path), "--dry-run",
         "--performance-report", "auto"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "needs a release" in refused.stderr
