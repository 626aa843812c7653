"""The command line package: no import cycle, no heavy import for metadata commands, demo specs."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
import yaml

import mvg_dask.cli
from mvg_dask.cli import COMMANDS, app, main
from mvg_dask.cli.demo import demo_spec_text
from mvg_dask.spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]
CLI_DIR = Path(mvg_dask.cli.__file__).parent
MODULES = sorted(f"mvg_dask.cli.{p.stem}" for p in CLI_DIR.glob("*.py") if p.stem != "__init__")
HEAVY = ("dask", "distributed", "xarray", "zarr")
DEMO_SPECS = sorted(p.stem for p in (ROOT / "pipelines" / "demo").glob("*.yaml"))


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )


def test_command_families_are_the_modules():
    assert MODULES == [
        "mvg_dask.cli._common",
        "mvg_dask.cli.calibrate",
        "mvg_dask.cli.check",
        "mvg_dask.cli.dataset",
        "mvg_dask.cli.demo",
        "mvg_dask.cli.experiments",
        "mvg_dask.cli.ledger",
        "mvg_dask.cli.release",
    ]
    assert app.list_commands(click.Context(app)) == [
        "calibrate",
        "check",
        "dataset",
        "demo",
        "experiments",
        "ledger",
        "release",
    ]


@pytest.mark.parametrize("module", ["mvg_dask.cli", *MODULES])
def test_every_module_imports_alone_in_a_fresh_process(module):
    out = _python(f"import {module}")
    assert out.returncode == 0, out.stderr


def test_command_modules_do_not_import_the_group():
    # registration happens in mvg_dask/cli/__init__.py only, never as an import side effect
    for path in CLI_DIR.glob("*.py"):
        if path.name == "__init__.py":
            continue
        text = path.read_text()
        assert "from mvg_dask.cli import" not in text and "add_command" not in text, path.name


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["calibrate", "--help"],
        [
            "calibrate",
            "--query",
            "covariance",
            "--features",
            "3",
            "--records",
            "100",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--algorithm",
            "equi-modal",
            "--calibration",
            "mvg-thm3",
            "--bounds",
            "0",
            "1",
            "--json",
        ],
    ],
)
def test_metadata_commands_import_no_dask(args):
    code = (
        "import json, sys\n"
        "from mvg_dask.cli import main\n"
        f"rc = main({args!r})\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})\n"
        "print(json.dumps({'rc': rc, 'heavy': heavy}))\n"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "heavy": []}


@pytest.mark.parametrize("args", [["--help"], ["release", "--help"], ["check", "--help"]])
def test_help_imports_no_library_but_click(args):
    code = (
        "import json, sys\n"
        "from mvg_dask.cli import main\n"
        f"rc = main({args!r})\n"
        "top = {m.split('.')[0] for m in sys.modules if not m.startswith('_')}\n"
        "third = top - set(sys.stdlib_module_names) - {'mvg_dask', 'click'}\n"
        "print(json.dumps({'rc': rc, 'third': sorted(third)}))\n"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "third": []}


def test_listed_help_is_each_commands_own_first_sentence():
    ctx = click.Context(app)
    for name, (_, short) in COMMANDS.items():
        command = app.get_command(ctx, name)
        assert command is not None and command.get_short_help_str(limit=1000) == short, name


def test_unknown_command_is_one_line_exit_2(capsys):
    assert main(["bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mvg-dask: error: ") and "bogus" in err[0]


def test_calibration_choices_come_from_the_registry():
    from mvg_dask.privacy import CALIBRATIONS

    command = app.get_command(click.Context(app), "calibrate")
    assert command is not None
    option = next(p for p in command.params if p.name == "calibration")
    assert tuple(option.type.choices) == CALIBRATIONS  # type: ignore[attr-defined]


def test_packages_listed_in_pyproject_match_the_tree():
    from setuptools import find_namespace_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_namespace_packages(where=str(ROOT), include=["mvg_dask*"]))
    assert set(config["packages"]) == found | {"mvg_dask.cli.demo_specs"}
    assert config["package-dir"] == {"mvg_dask.cli.demo_specs": "pipelines/demo"}


@pytest.mark.parametrize("name", DEMO_SPECS)
def test_demo_spec_templates_fill_into_valid_specs(name):
    text = demo_spec_text(name, delta=1 / 2126, budget_delta=4 / 2126, important=[0, 7, 9])
    assert "$" not in text
    # the comments stay readable: no field is substituted in them
    template = (ROOT / "pipelines" / "demo" / f"{name}.yaml").read_text()
    comments = [line for line in template.splitlines() if line.startswith("#")]
    assert comments and comments == [line for line in text.splitlines() if line.startswith("#")]
    assert text == demo_spec_text(
        name, delta=1 / 2126, budget_delta=4 / 2126, important=[0, 7, 9], unused=1
    )
    spec = parse_spec(yaml.safe_load(text), source=name)
    assert spec.name == name
    assert not Path(spec.input.store).is_absolute() and not Path(spec.output.store).is_absolute()
    assert spec.ledger is not None and spec.ledger.path == "ledger.sqlite"
    if name.startswith("ctg-"):
        assert spec.privacy.delta == 1 / 2126 and spec.ledger.budget.delta == 4 / 2126
    if name == "ctg-identity":
        assert spec.mechanism.allocation.important == [0, 7, 9]


def test_demo_templates_are_the_shipped_package_data():
    from importlib import resources

    shipped = resources.files("mvg_dask.cli.demo_specs")
    assert (
        sorted(p.name.removesuffix(".yaml") for p in shipped.iterdir() if p.name.endswith(".yaml"))
        == DEMO_SPECS
    )
    assert DEMO_SPECS == [
        "ctg-covariance",
        "ctg-identity",
        "synthetic-covariance",
        "synthetic-identity",
    ]
    with pytest.raises(KeyError, match="delta"):
        demo_spec_text("ctg-covariance")


def test_the_demo_explains_its_numbers(tmp_path):
    """``mvg-dask demo`` (what ``make demo`` runs): each delta with its reason, each error beside
    the data's scale, the error without noise and the i.i.d. Gaussian baseline, and the ledger
    line pointing at the page that explains composition."""
    from tests.pipeline_helpers import run_cli

    run = run_cli(tmp_path, "demo", "--out", "demo")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "delta = 1e-06" in out and "far below one record's share 1/N = 0.00047" in out
    for line in ("relative Frobenius error vs the non-private XX^T/N", "RMSE per entry"):
        (text,) = [x for x in out.splitlines() if line in x]
        assert "without noise" in text and "i.i.d. Gaussian noise at the same privacy" in text
        assert "nan" not in text
    assert "docs/guide/ledger.md" in out
    assert (tmp_path / "demo" / "ledger.sqlite").is_file()
