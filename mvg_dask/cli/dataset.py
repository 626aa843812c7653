"""``mvg-dask dataset``: write a shipped paper dataset to a Zarr store."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("name", type=click.Choice(["ctg", "liver", "movement"]))
@click.option("--out", required=True, type=click.Path(), help="Zarr store to create.")
@click.option("--records-first", is_flag=True, help="Store as records x features.")
@click.option(
    "--chunk", type=click.IntRange(min=1), default=512, show_default=True, help="Records per chunk."
)
def dataset(name: str, out: str, records_first: bool, chunk: int) -> None:
    """Write a shipped paper dataset (scaled to its declared domain) to a Zarr store."""
    import numpy as np

    from mvg_dask.data import write_matrix
    from mvg_dask.datasets import load_ctg, load_liver, load_movement

    ds = {"ctg": load_ctg, "liver": load_liver, "movement": load_movement}[name]()
    if Path(out).exists():
        raise click.UsageError(f"--out {out} already exists; choose another path")
    write_matrix(
        ds.X, out, feature_names=ds.feature_names, record_chunk=chunk, records_first=records_first
    )
    lo, hi = float(np.min(ds.lower)), float(np.max(ds.upper))
    click.echo(
        f"{name}: {ds.X.shape[0]} features x {ds.X.shape[1]} records in [{lo:g}, {hi:g}] -> {out}"
    )
