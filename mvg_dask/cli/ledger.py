"""``mvg-dask ledger``: inspect, export, migrate a privacy ledger, or abort a crashed release.

A thin click wrapper: the logic lives in :mod:`mvg_dask.ledger`.
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
    from mvg_dask.ledger import open_ledger

    try:
        return open_ledger(location, password_file=password_file, create=False)
    except MvgDaskError as exc:
        raise RunFailed(str(exc)) from None


@ledger.command("show")
@_ledger_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ledger_show(location: str, password_file: str | None, as_json: bool) -> None:
    """List releases (id, status, epsilon, delta, time) and the budget spent and left.

    Pending and aborted releases count as spent. The spent epsilon is that of the releases
    composed, which is not their sum: when every release is `exact` they compose as Gaussian
    DP (mu = sqrt of the sum of their mu^2), and the composed mu is stated as the epsilon at the
    budget's delta. That is why one release at epsilon=1, delta=1e-6 shows as spent epsilon
    0.8725 in a budget with delta=1e-5, and why releases of nominal total epsilon 5 fit a budget
    of 3. Delta is then not spent separately: the spent and the left epsilon are both stated at
    the budget's delta. A last line per dataset says which composition was used.
    """
    from mvg_dask.ledger import summary_text

    with _open_existing(location, password_file) as book:
        summary = book.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(summary_text(summary))
    for ds in summary:
        if ds["releases"]:
            click.echo(_composition_note(ds))


def _composition_note(ds: dict[str, Any]) -> str:
    """One line per dataset: how the spent epsilon was composed, and what happens to delta."""
    budget, spent, n = ds["budget"], ds["spent"], len(ds["releases"])
    head = f"dataset {ds['dataset']}: {n} release(s) composed by "
    if ds["composition"] == "gaussian-dp":
        return (
            head + f"Gaussian DP (all exact): mu = sqrt(sum mu_i^2) = {spent['mu']:.4g}, stated "
            f"as epsilon at the budget's delta={budget['delta']:.3g}; delta is not spent "
            "separately: the whole budget delta goes with the epsilon left"
        )
    if ds["composition"] == "pld":
        return (
            head + "privacy-loss distributions (dp-accounting), epsilon at the budget's "
            f"delta={budget['delta']:.3g}, below the sum of their epsilons; delta is not spent "
            "separately: the whole budget delta goes with the epsilon left"
        )
    return head + "basic composition: the sums of their epsilons and of their deltas"


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
    from mvg_dask.ledger import export_ledger

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
    from mvg_dask.ledger import migrate_ledger

    try:
        click.echo(migrate_ledger(location, password_file=password_file))
    except MvgDaskError as exc:
        raise RunFailed(str(exc)) from None
