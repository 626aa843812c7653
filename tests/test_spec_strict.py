"""A release spec is read strictly: YAML errors name their line and column, a repeated key is
refused (PyYAML keeps the last value silently), and a number given as a string is refused
rather than coerced; nothing is read, written or charged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.spec import SpecError, load_spec
from tests.pipeline_helpers import make_input

SPEC = """\
name: strict
input: {{store: in.zarr, variable: X}}
domain: {{box: {{lower: 0.0, upper: 1.0}}}}
query: covariance
privacy:
  epsilon: {epsilon}
  delta: 1.0e-6
output: {{store: out.zarr}}
{extra}"""


def _write(tmp_path: Path, epsilon: str = "1.0", extra: str = "") -> Path:
    if not (tmp_path / "in.zarr").exists():
        make_input(tmp_path / "in.zarr", np.random.default_rng(0).random((3, 50)), chunk=25)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(epsilon=epsilon, extra=extra))
    return path


def test_the_valid_spec_loads(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path))
    assert spec.privacy.epsilon == 1.0
    assert load_spec(_write(tmp_path, epsilon="2")).privacy.epsilon == 2.0  # an int is a number


def test_a_repeated_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, extra="query: identity\n")
    with pytest.raises(
        SpecError, match=r"spec\.yaml:9:1: .*duplicate key 'query' \(first at line 4\)"
    ):
        load_spec(path)
    nested = _write(tmp_path, epsilon="1.0\n  epsilon: 3.0")
    with pytest.raises(SpecError, match=r":7:3: .*duplicate key 'epsilon' \(first at line 6\)"):
        load_spec(nested)


def test_invalid_yaml_names_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, extra="mechanism: {algorithm: symmetric\n")
    with pytest.raises(SpecError, match=r"spec\.yaml:\d+:\d+: not valid YAML: "):
        load_spec(path)


def test_a_number_given_as_a_string_is_refused(tmp_path: Path) -> None:
    quoted = r"privacy\.epsilon: a number, not the quoted string '1\.0'"
    with pytest.raises(SpecError, match=quoted):
        load_spec(_write(tmp_path, epsilon='"1.0"'))
    with pytest.raises(SpecError, match=r"privacy\.epsilon"):
        api.dry_run({**_dict(tmp_path), "privacy": {"epsilon": "1.0", "delta": 1e-6}})
    box = {"box": {"lower": [0.0, "0", 0.0], "upper": 1.0}}
    with pytest.raises(SpecError, match=r"domain\.box\.lower: a number, not the quoted string '0'"):
        api.dry_run({**_dict(tmp_path), "domain": box})
    # numpy scalars are numbers (a notebook's values)
    ok = {**_dict(tmp_path), "privacy": {"epsilon": np.float64(1.0), "delta": 1e-6}}
    assert api.dry_run(ok).epsilon == 1.0


def _dict(tmp_path: Path) -> dict:
    return {
        "name": "strict",
        "input": {"store": str(tmp_path / "in.zarr"), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": "covariance",
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "output": {"store": str(tmp_path / "out.zarr")},
    }


def test_the_cli_says_it_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    path = _write(tmp_path, extra="query: identity\n")
    run = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr
    (line,) = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert line.startswith("mvg-dask: error: ") and "duplicate key 'query'" in line
    assert not (tmp_path / "out.zarr").exists()


def test_a_pair_written_as_a_yaml_list_is_a_pair(tmp_path: Path) -> None:
    """``entry_range: [lo, hi]`` (YAML has no tuples) validates as the pair it is."""
    spec = load_spec(_write(tmp_path, extra="mechanism: {entry_range: [-1, 2]}\n"))
    assert spec.mechanism.entry_range == (-1.0, 2.0)


def test_the_spec_package_keeps_its_public_paths() -> None:
    """``mvg_dask.spec`` is a package of modules by concern; its public classes keep the path
    ``mvg_dask.spec.<name>`` (the reference docs link their fields there) and their annotations
    resolve there (the docs print the field types from them)."""
    import pickle
    import typing

    import mvg_dask.spec as spec

    classes = [c for n in spec.__all__ if isinstance(c := getattr(spec, n), type)]
    assert len(classes) == 24
    for cls in classes:
        assert cls.__module__ == "mvg_dask.spec" and getattr(spec, cls.__name__) is cls
        assert pickle.loads(pickle.dumps(cls)) is cls
        typing.get_type_hints(cls)  # raises NameError on a name the namespace lacks
    assert "BoxSpec" in str(typing.get_type_hints(spec.DomainSpec)["box"])
