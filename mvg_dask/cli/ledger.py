"""``mvg-dask ledger``: inspect a privacy ledger (a thin wrapper around the engine's ledger)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group()
def ledger() -> None:
    """Inspect a privacy ledger."""


@ledger.command("show")
@click.option(
    "--ledger",
    "path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The ledger's SQLite file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ledger_show(path: str, as_json: bool) -> None:
    """List releases (id, status, epsilon, delta, time) and the budget spent and left."""
    from mvg_dask.engine.ledger import Ledger

    if not Path(path).exists():
        raise click.UsageError(f"--ledger {path} does not exist")
    with Ledger(path) as book:
        summary = book.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for ds in summary:
        b, s, left = ds["budget"], ds["spent"], ds["left"]
        mu = f", mu={s['mu']:.4g}" if s["mu"] is not None else ""
        left_delta = "shared" if left["delta"] is None else f"{left['delta']:.3g}"
        click.echo(
            f"dataset {ds['dataset']}: budget epsilon={b['epsilon']:g} delta={b['delta']:.3g}; "
            f"spent epsilon={s['epsilon']:.4g} delta={s['delta']:.3g} ({ds['composition']}{mu}); "
            f"left epsilon={left['epsilon']:.4g} delta={left_delta}"
        )
        for r in ds["releases"]:
            click.echo(
                f"  {r['release_id']:<48} {r['status']:<9} eps={r['epsilon']:<8g} "
                f"delta={r['delta']:<9.3g} {r['calibration']:<9} {r['created']}"
            )
    if not summary:
        click.echo("(empty ledger)")
