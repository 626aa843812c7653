"""``mvg-dask ledger``: inspect, export, migrate a privacy ledger, or abort a crashed release.

A thin click wrapper: the logic lives in :mod:`mvg_dask.engine.ledger`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from mvg_dask.cli._common import RunFailed
from mvg_dask.errors import MvgDaskError

_LEDGER_HELP = (
    "The ledger: a SQLite file, sqlite:///path, or postgresql://user@host/db (no password in "
    "the URL: PGPASSWORD, a libpq passfile or --password-file)."
)


@click.group()
def ledger() -> None:
    """Inspect, export and migrate a privacy ledger (SQLite file or PostgreSQL URL)."""


def _ledger_options(f: Any) -> Any:
    f = click.option(
        "--password-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="PostgreSQL: a file holding the password (a mounted secret).",
    )(f)
    return click.option("--ledger", "location", required=True, help=_LEDGER_HELP)(f)


def _open_existing(location: str, password_file: str | None) -> Any:
    from mvg_dask.engine.ledger import open_ledger

    try:
        return open_ledger(location, password_file=password_file, create=False)
    except MvgDaskError as exc:
        raise RunFailed(str(exc)) from None


@ledger.command("show")
@_ledger_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ledger_show(location: str, password_file: str | None, as_json: bool) -> None:
    """List releases (id, status, epsilon, delta, time) and the budget spent and left."""
    from mvg_dask.engine.ledger import summary_text

    with _open_existing(location, password_file) as book:
        summary = book.summary()
    click.echo(json.dumps(summary, indent=2) if as_json else summary_text(summary))


@ledger.command("export")
@_ledger_options
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the JSON here (default: stdout).",
)
def ledger_export(location: str, password_file: str | None, out: str | None) -> None:
    """Write every budget and every entry as JSON (never a key)."""
    from mvg_dask.engine.ledger import export_ledger

    with _open_existing(location, password_file) as book:
        text = json.dumps(export_ledger(book), indent=2)
    if out is None:
        click.echo(text)
    else:
        Path(out).write_text(text + "\n")


@ledger.command("abort")
@_ledger_options
@click.argument("release_id")
@click.option("--reason", required=True, help="Why (kept in the ledger, curator-side).")
def ledger_abort(location: str, password_file: str | None, release_id: str, reason: str) -> None:
    """Abort a pending (crashed) release: it stays charged and its key is erased."""
    with _open_existing(location, password_file) as book:
        try:
            book.abort(release_id, reason)
        except MvgDaskError as exc:
            raise RunFailed(str(exc)) from None
    click.echo(f"release {release_id} aborted; it stays charged")


@ledger.command("migrate")
@_ledger_options
def ledger_migrate(location: str, password_file: str | None) -> None:
    """Create a ledger's schema, or upgrade it in place to this version's (back it up first)."""
    from mvg_dask.engine.ledger import migrate_ledger

    try:
        click.echo(migrate_ledger(location, password_file=password_file))
    except MvgDaskError as exc:
        raise RunFailed(str(exc)) from None
