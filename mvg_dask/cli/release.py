"""``mvg-dask release``: run the release a YAML spec describes."""

from __future__ import annotations

import json

import click

from mvg_dask.cli._common import fail, setup_logging
from mvg_dask.errors import MvgDaskError


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help=(
        "Dask scheduler address (default: DASK_SCHEDULER_ADDRESS if set, else a LocalCluster "
        "sized to this machine)."
    ),
)
@click.option(
    "--release-id",
    default=None,
    metavar="ID",
    help="Release id (overrides the spec's); re-running an id resumes or finds it complete.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate, read metadata only and print the plan as JSON; compute nothing.",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Reproducible noise for tests and demos; recorded as NOT private.",
)
@click.option("--quiet", is_flag=True, help="No progress output.")
def release(
    spec: str,
    scheduler: str | None,
    release_id: str | None,
    dry_run: bool,
    seed: int | None,
    quiet: bool,
) -> None:
    """Run the release described by the YAML file SPEC."""
    from mvg_dask import api

    try:
        if dry_run:
            plan = api.dry_run(spec, release_id=release_id)
            click.echo(json.dumps(plan.public_dict(), indent=2))
            return
        if not quiet:
            setup_logging()
        result = api.release(
            spec, scheduler=scheduler, seed=seed, progress=not quiet, release_id=release_id
        )
    except (MvgDaskError, OSError, RuntimeError, ValueError) as exc:
        fail(exc)
        return
    note = " (seeded: NOT private)" if result.seeded else ""
    click.echo(
        f"release {result.release_id} complete: {result.output}{note}; {result.seconds:.1f} s"
    )
