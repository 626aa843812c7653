"""Specs as people write them (docs/guide/specs.md, "Numbers in YAML" and "Errors"): scientific
notation without a dot or an exponent sign is a number (YAML 1.2), a quoted number is refused
naming what was written, and an enumerated field's error names the bad word, the nearest word
and the choices the code declares."""

from __future__ import annotations

import datetime
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask.engine.kube import KubernetesError, load_cluster_options
from mvg_dask.privacy.allocation import AllocationStrategy
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.spec import (
    CenteredRoute,
    SimpleQuery,
    SpecError,
    load_spec,
    parse_spec,
    parse_yaml,
    spec_hash,
)
from tests.pipeline_helpers import make_input, run_cli

SPEC = """\
name: sci
input: {{store: in.zarr, variable: X}}
domain: {{box: {{lower: 0.0, upper: 1.0}}}}
query: covariance
privacy:
  epsilon: {epsilon}
  delta: {delta}
output: {{store: out.zarr}}
"""


def _write(tmp_path: Path, epsilon: str = "1.0", delta: str = "1.0e-6") -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(epsilon=epsilon, delta=delta))
    return path


# --- numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("1e-6", 1e-6),
        ("1e6", 1e6),
        ("1E+3", 1e3),
        ("2.5e3", 2500.0),
        (".5e-3", 5e-4),
        (".5e3", 500.0),
        ("3E-2", 0.03),
        ("+2e0", 2.0),
        ("1.0e+6", 1e6),  # YAML 1.1's form, as before
    ],
)
def test_scientific_notation_is_a_float(tmp_path: Path, written: str, value: float) -> None:
    spec = load_spec(_write(tmp_path, epsilon=written))
    assert type(spec.privacy.epsilon) is float and spec.privacy.epsilon == value
    if value < 1:
        spec = load_spec(_write(tmp_path, delta=written))
        assert spec.privacy.delta == value


def test_the_same_number_written_either_way_is_the_same_spec(tmp_path: Path) -> None:
    old = load_spec(_write(tmp_path, epsilon="1.0e+6", delta="1.0e-6"))
    new = load_spec(_write(tmp_path, epsilon="1e6", delta="1e-6"))
    assert new == old and spec_hash(new) == spec_hash(old)


@pytest.mark.parametrize("quoted", ['"1.0"', "'1e-6'", '"1E+3"', "' 2.5e3'", '"7"'])
def test_a_quoted_number_is_refused_naming_what_was_written(tmp_path: Path, quoted: str) -> None:
    text = quoted.strip("'\"")
    message = (
        f"privacy.epsilon: a number, not the quoted string '{text}': "
        f"write {text.strip()} without quotes"
    )
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, epsilon=quoted))
    assert message in str(info.value)


def test_a_word_for_a_number_is_not_called_quoted(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, epsilon="one"))
    assert str(info.value).endswith("privacy.epsilon: a number, not the string 'one'")


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("10", 10),
        ("010", 8),  # YAML 1.1's octal, as before
        ("0x1f", 31),
        ("1_000", 1000),
        ("09", "09"),  # not a YAML 1.1 integer, and no dot or exponent: a string still
        ("12:30", 750),  # YAML 1.1's base 60, as before
        ("1.", 1.0),
        ("yes", True),
        ("off", False),
        ("2024-01-01", datetime.date(2024, 1, 1)),
        ("1e", "1e"),
        ("e3", "e3"),
        ("1.2.3", "1.2.3"),
        ("'1e-6'", "1e-6"),
        ("'1.0'", "1.0"),
    ],
)
def test_other_resolutions_are_yaml_1_1s(written: str, value: object) -> None:
    parsed = parse_yaml(f"v: {written}", "t.yaml")
    assert isinstance(parsed, dict)
    assert parsed["v"] == value and type(parsed["v"]) is type(value)


def test_inf_and_nan_are_refused_as_before(tmp_path: Path) -> None:
    for written in (".inf", "-.inf", ".nan", "1e400"):
        with pytest.raises(SpecError, match=r"privacy\.epsilon: Input should be a finite number"):
            load_spec(_write(tmp_path, epsilon=written))
    with pytest.raises(SpecError, match=r"privacy\.delta: Input should be less than 1"):
        load_spec(_write(tmp_path, delta=".inf"))


def test_cluster_specs_use_the_spec_loader(tmp_path: Path) -> None:
    p = tmp_path / "cluster.yaml"
    p.write_text("workers: 2\nresource_timeout: 6e2\n")
    assert load_cluster_options(p).resource_timeout == 600
    p.write_text("workers: 2\nworkers: 3\n")
    with pytest.raises(KubernetesError, match="duplicate key 'workers'"):
        load_cluster_options(p)


# --- enumerated fields -----------------------------------------------------------------------


def _spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "enum",
        "input": {"store": "in.zarr"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": "covariance",
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "output": {"store": "out.zarr"},
    }
    for key, value in overrides.items():
        spec[key] = {**spec[key], **value} if isinstance(spec.get(key), dict) else value
    return spec


def _words(literal: Any) -> str:
    return ", ".join(typing.get_args(literal))


CROSS = {"rows": [0], "cols": [1]}


@pytest.mark.parametrize(
    ("overrides", "field", "noun", "nouns", "bad", "near", "choices"),
    [
        (
            {"query": "covarience"},
            "query",
            "query",
            "queries",
            "covarience",
            "covariance",
            _words(SimpleQuery),
        ),
        (
            {"mechanism": {"algorithm": "unimodl"}},
            "mechanism.algorithm",
            "algorithm",
            "algorithms",
            "unimodl",
            "unimodal",
            _words(Algorithm),
        ),
        (
            {"mechanism": {"calibration": "mgm-ud"}},
            "mechanism.calibration",
            "calibration",
            "calibrations",
            "mgm-ud",
            "mgm-udn",
            _words(Calibration),
        ),
        (
            {"mechanism": {"noise": "latice"}},
            "mechanism.noise",
            "noise kind",
            "noise kinds",
            "latice",
            "lattice",
            "lattice, float",
        ),
        (
            {"mechanism": {"directions": {"method": "dp_pca"}}},
            "mechanism.directions.method",
            "method",
            "methods",
            "dp_pca",
            "dp-pca",
            "standard, matrix, dp-pca",
        ),
        (
            {"mechanism": {"allocation": {"strategy": "maxpnr"}}},
            "mechanism.allocation.strategy",
            "strategy",
            "strategies",
            "maxpnr",
            "max-pnr",
            _words(AllocationStrategy),
        ),
        (
            {"privacy": {"neighbours": "add_remove"}},
            "privacy.neighbours",
            "neighbour relation",
            "neighbour relations",
            "add_remove",
            "add-remove",
            "replace-one, add-remove",
        ),
        (
            {"domain": {"on_violation": "clipp"}},
            "domain.on_violation",
            "value",
            "values",
            "clipp",
            "clip",
            "clip, error",
        ),
        (
            {"output": {"codec": "zstdd"}},
            "output.codec",
            "codec",
            "codecs",
            "zstdd",
            "zstd",
            "none, zstd, lz4",
        ),
        (
            {"output": {"dtype": "float46"}},
            "output.dtype",
            "dtype",
            "dtypes",
            "float46",
            "float64",
            "auto, float64, float32",
        ),
        (
            {"query": {"centered-covariance": {"route": "meanfirst"}}},
            "query.centered-covariance.route",
            "route",
            "routes",
            "meanfirst",
            "mean-first",
            _words(CenteredRoute),
        ),
        (
            {"query": {"cross-covariance": {**CROSS, "col_allocation": {"strategy": "binar"}}}},
            "query.cross-covariance.col_allocation.strategy",
            "strategy",
            "strategies",
            "binar",
            "binary",
            "uniform, binary, custom",
        ),
    ],
)
def test_an_enumerated_field_names_the_word_the_nearest_and_the_choices(
    overrides: dict[str, Any], field: str, noun: str, nouns: str, bad: str, near: str, choices: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(**overrides))
    assert str(info.value) == (
        f"spec: {field}: unknown {noun} '{bad}'; did you mean '{near}'? The {nouns} are: {choices}"
    )


def test_query_covarience_reads_as_the_issue_asks() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(query="covarience"))
    assert str(info.value) == (
        "spec: query: unknown query 'covarience'; did you mean 'covariance'? "
        "The queries are: identity, covariance, centered-covariance, mean"
    )
    assert "RegressionSpec" not in str(info.value)


def test_a_word_near_nothing_gets_no_guess() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(mechanism={"noise": "gaussian"}))
    assert str(info.value) == (
        "spec: mechanism.noise: unknown noise kind 'gaussian'. The noise kinds are: lattice, float"
    )


def test_the_cli_reads_scientific_notation_and_names_a_typo(tmp_path: Path) -> None:
    make_input(tmp_path / "in.zarr", np.random.default_rng(0).random((3, 40)), chunk=20)
    spec = _write(tmp_path, epsilon="5e-1", delta="1e-6")
    out = run_cli(tmp_path, "release", spec.name, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "epsilon = 0.5, delta = 1e-06" in out.stdout
    assert not (tmp_path / "out.zarr").exists()
    spec.write_text(spec.read_text().replace("query: covariance", "query: covarience"))
    out = run_cli(tmp_path, "release", spec.name, "--dry-run")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "mvg-dask: error: spec.yaml: query: unknown query 'covarience'; did you mean "
        "'covariance'? The queries are: identity, covariance, centered-covariance, mean"
    ]
