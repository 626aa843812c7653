"""The ``mvg-dask calibrate`` contract, run as a real subprocess."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

BASE = [
    "calibrate",
    "--query",
    "identity",
    "--features",
    "6",
    "--records",
    "248",
    "--epsilon",
    "1",
    "--delta",
    str(1 / 248),
    "--algorithm",
    "unimodal",
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mvg_dask", *args], capture_output=True, text=True, check=False
    )


def test_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("mvg-dask ")


def test_paper_setup_through_the_cli():
    out = run(
        *BASE,
        "--calibration",
        "mvg-thm2",
        "--bounds",
        "0",
        "1",
        "--sensitivity",
        str(math.sqrt(6)),
        "--gamma",
        str(math.sqrt(6 * 248)),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    for key in (
        "calibration",
        "algorithm",
        "epsilon",
        "delta",
        "sensitivity",
        "gamma",
        "precision_budget",
        "row_variances",
        "col_variances",
        "mahalanobis_sensitivity",
    ):
        assert key in plan
    assert plan["col_variances"] is None
    assert len(plan["row_variances"]) == 6
    assert all(v == pytest.approx(9.04e7, rel=5e-3) for v in plan["row_variances"])


def test_exact_has_no_precision_budget_and_equimodal_has_col_variances():
    out = run(
        "calibrate",
        "--query",
        "covariance",
        "--features",
        "4",
        "--records",
        "10176",
        "--epsilon",
        "1",
        "--delta",
        "1e-4",
        "--algorithm",
        "equi-modal",
        "--calibration",
        "exact",
        "--bounds",
        "-1",
        "1",
        "--allocation",
        "binary",
        "--important",
        "0,3",
        "--share",
        "0.9",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["precision_budget"] is None and plan["gamma"] is None
    assert plan["col_variances"] == plan["row_variances"]
    v = plan["row_variances"]
    assert v[0] == v[3] < v[1] == v[2]  # more budget, less noise on the important directions


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--calibration", "exact", "--bounds", "1", "0"], "lower must be < upper"),
        (["--calibration", "exact"], "exactly one record domain"),
        (["--calibration", "exact", "--bounds", "0", "1", "--l2-norm", "1"], "exactly one"),
        (["--calibration", "mvg-thm3", "--bounds", "0", "1"], "symmetric PSD"),
        (["--calibration", "bogus", "--bounds", "0", "1"], "--calibration"),
        (
            [
                "--calibration",
                "exact",
                "--bounds",
                "0",
                "1",
                "--allocation",
                "binary",
                "--important",
                "9",
            ],
            "out of range",
        ),
        (
            ["--calibration", "exact", "--bounds", "0", "1", "--neighbours", "add-remove"],
            "replace-one",
        ),
        (
            [
                "--calibration",
                "exact",
                "--bounds",
                "0",
                "1",
                "--allocation",
                "binary",
                "--important",
                "a,b",
            ],
            "comma-separated",
        ),
    ],
)
def test_invalid_arguments_give_one_line_and_no_traceback(args, needle):
    out = run(*BASE, *args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("mvg-dask: error: ")
    assert needle in lines[0]
    assert "Traceback" not in out.stderr


def test_bad_epsilon_and_delta():
    base = [a for a in BASE]
    i = base.index("--epsilon")
    for eps, delta, needle in [
        ("0", "0.1", "epsilon"),
        ("1", "1.5", "delta"),
        ("nan", "0.1", "epsilon"),
    ]:
        args = base.copy()
        args[i + 1] = eps
        args[i + 3] = delta
        out = run(*args, "--calibration", "exact", "--bounds", "0", "1")
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr
