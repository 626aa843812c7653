"""``mvg-dask release``'s exit codes say whether budget was spent: 0 released, 1 refused (nothing
charged), 2 bad input (nothing charged), 3 failed after the budget was charged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest

from mvg_dask.cli import main
from mvg_dask.cli._common import fail
from mvg_dask.engine.ledger import open_ledger
from mvg_dask.errors import ChargedFailure, DataError, ReleaseError
from tests.pipeline_helpers import data, make_input, run_cli, spec_dict, write_spec


def _entries(ledger: Path) -> list[tuple[str, str]]:
    if not ledger.exists():
        return []
    with open_ledger(ledger, create=False) as book:
        return [(e.release_id, e.status) for e in book.releases()]


def _setup(tmp_path: Path, X: np.ndarray, **overrides: Any) -> None:
    make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = spec_dict(
        "in.zarr",
        "out.zarr",
        release_id="r1",
        ledger={"path": "ledger.sqlite", "dataset": "d", "budget": {"epsilon": 4, "delta": 1e-4}},
        **overrides,
    )
    write_spec(tmp_path / "spec.yaml", spec)


def test_release_help_documents_the_exit_codes() -> None:
    out = run_cli(Path.cwd(), "release", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for line in (
        "Exit codes:",
        "0 released, or already complete",
        "1 refused, nothing read or charged",
        "2 invalid arguments, spec or input metadata; nothing charged",
        "3 failed after the budget was charged",
    ):
        assert line in text


def test_exit_0_released_and_0_again_for_the_complete_release(tmp_path: Path) -> None:
    _setup(tmp_path, data(3, 300, seed=1))
    for _ in range(2):
        out = run_cli(tmp_path, "release", "spec.yaml", "--quiet")
        assert out.returncode == 0, out.stderr
    assert _entries(tmp_path / "ledger.sqlite") == [("r1", "committed")]


def test_exit_1_refused_nothing_charged(tmp_path: Path) -> None:
    _setup(tmp_path, data(3, 300, seed=1))
    (tmp_path / "out.zarr").mkdir()
    out = run_cli(tmp_path, "release", "spec.yaml", "--quiet")
    assert out.returncode == 1, out.stderr
    assert "already exists" in out.stderr and "budget charged" not in out.stderr
    assert _entries(tmp_path / "ledger.sqlite") == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bogus": 1}, "bogus: unknown key"),
        ({"input": {"store": "missing.zarr", "variable": "X"}}, "missing.zarr does not exist"),
        ({"input": {"store": "in.zarr", "variable": "Y"}}, "'Y' is not in"),
    ],
)
def test_exit_2_bad_spec_or_input_nothing_charged(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    _setup(tmp_path, data(3, 300, seed=1), **change)
    out = run_cli(tmp_path, "release", "spec.yaml", "--quiet")
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert _entries(tmp_path / "ledger.sqlite") == []
    assert not (tmp_path / "out.zarr").exists()


def test_exit_3_data_abort_after_reading_is_charged(tmp_path: Path) -> None:
    X = data(3, 300, seed=1)
    X[1, 150] = np.nan  # found while the chunks are read: after the reservation
    _setup(tmp_path, X)
    out = run_cli(tmp_path, "release", "spec.yaml", "--quiet")
    assert out.returncode == 3, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "NaN or infinite values in records 100..199" in line
    assert line.endswith(
        "(budget charged: epsilon=1, delta=1e-05 to dataset 'd'; release r1 aborted after "
        "reading data: choose a new release id)"
    )
    assert line.count("budget charged") == 1  # stated once: by the error, not again by the CLI
    assert _entries(tmp_path / "ledger.sqlite") == [("r1", "aborted")]
    assert not (tmp_path / "out.zarr").exists()


def test_exit_3_for_a_pending_charged_failure_names_the_resume() -> None:
    exc = ChargedFailure("disk full while writing out.zarr")
    exc.release_id = "r7"
    with pytest.raises(click.ClickException) as info:
        fail(exc)
    assert info.value.exit_code == 3
    assert info.value.format_message() == (
        "disk full while writing out.zarr (budget charged; release r7 pending: re-run the same "
        "release id to resume)"
    )


def test_charged_flag_decides_the_code_for_any_error_type(capsys) -> None:
    for exc, code in (
        (DataError("bad"), 2),
        (ReleaseError("refused"), 1),
        (OSError("disk"), 1),
    ):
        with pytest.raises(click.ClickException) as info:
            fail(exc)
        assert info.value.exit_code == code, exc
    charged = DataError("NaN in records 0..9")
    charged.charged, charged.release_id, charged.pending = True, "r1", False
    with pytest.raises(click.ClickException) as info:
        fail(charged)
    assert info.value.exit_code == 3
    assert main(["release", "--json", "x.yaml"]) == 2  # a usage error
    assert "--json goes with --dry-run" in capsys.readouterr().err
