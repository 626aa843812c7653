"""The shipped example specs work together: run in sequence, in either order, on one clean
checkout, every one is released and charged to the one budget they share.

``pipelines/ctg-symmetric.yaml`` (the README's), ``ctg-covariance.yaml`` and ``ctg-identity.yaml``
(the quickstart's) charge the dataset ``ctg`` in ``out/ledger.sqlite``; each declares the same
budget, so whichever runs first registers it and the others fit. The PostgreSQL spec runs against
a real server (its URL pointed at the test's).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.pipeline_helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
SQLITE_SPECS = ("ctg-symmetric.yaml", "ctg-covariance.yaml", "ctg-identity.yaml")


def _checkout(tmp_path: Path) -> Path:
    """A clean checkout's layout: the shipped specs and the CTG input made by the CLI."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "pipelines", root / "pipelines", ignore=shutil.ignore_patterns("*.py"))
    made = run_cli(root, "dataset", "ctg", "--out", "data/ctg.zarr")
    assert made.returncode == 0, made.stderr
    return root


def _release(root: Path, spec: str) -> str:
    out = run_cli(root, "release", f"pipelines/{spec}", "--quiet")
    assert out.returncode == 0, f"{spec}: {out.stderr}"
    return out.stdout


def test_the_sqlite_specs_declare_one_budget() -> None:
    ledgers = {
        spec: yaml.safe_load((ROOT / "pipelines" / spec).read_text())["ledger"]
        for spec in SQLITE_SPECS
    }
    assert len({repr(sorted(v.items())) for v in ledgers.values()}) == 1, ledgers


@pytest.mark.parametrize(
    "order",
    [
        pytest.param(SQLITE_SPECS, id="readme-first"),
        pytest.param(SQLITE_SPECS[::-1], id="quickstart-first", marks=pytest.mark.slow),
    ],
)
def test_every_shipped_sqlite_spec_runs_in_sequence(tmp_path: Path, order: tuple[str, ...]) -> None:
    root = _checkout(tmp_path)
    for spec in order:
        dry = run_cli(root, "release", f"pipelines/{spec}", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "refused" not in dry.stdout, dry.stdout
        _release(root, spec)
    shown = run_cli(root, "ledger", "show", "--ledger", "out/ledger.sqlite")
    assert shown.returncode == 0, shown.stderr
    for spec in order:
        assert re.search(rf"\b{spec.removesuffix('.yaml')}-\d{{8}}T", shown.stdout), shown.stdout
    for spec in order:
        assert (root / "out" / spec.replace(".yaml", ".zarr")).is_dir()


def test_the_postgres_spec_runs_against_a_real_server(tmp_path: Path, pg_server) -> None:  # type: ignore[no-untyped-def]
    root = _checkout(tmp_path)
    spec = root / "pipelines" / "ctg-covariance-postgres.yaml"
    text = spec.read_text()
    url = re.search(r"^  url: (\S+)", text, re.MULTILINE)
    assert url is not None
    ledger = pg_server.url(pg_server.new_database())
    password = tmp_path / "password"  # as a mounted secret: the spec's password_file
    password.write_text(pg_server.ledger_password + "\n")
    text = text.replace(url.group(1), ledger)
    text = text.replace(
        "# password_file: /var/run/secrets/mvg-ledger/password", f"password_file: {password}"
    )
    assert f"password_file: {password}" in text
    spec.write_text(text)
    migrated = run_cli(  # once per database
        root, "ledger", "migrate", "--ledger", ledger, "--password-file", str(password)
    )
    assert migrated.returncode == 0, migrated.stderr
    _release(root, "ctg-covariance-postgres.yaml")
    assert (root / "out" / "ctg-covariance-postgres.zarr").is_dir()
