"""``mvg-dask release``: run the release a YAML spec describes."""

from __future__ import annotations

import json

import click

from mvg_dask.cli._common import (
    EXIT_CODES,
    cluster_options,
    fail,
    security_from,
    start_logging,
)
from mvg_dask.errors import MvgDaskError


@click.command(epilog=EXIT_CODES)
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help=(
        "Dask scheduler address (default: DASK_SCHEDULER_ADDRESS if set, else threads in this "
        "process for an input of at most 1 GiB (identity: 512 MiB) and a LocalCluster sized to "
        "this machine above)."
    ),
)
@click.option(
    "--release-id",
    default=None,
    metavar="ID",
    help="Release id (overrides the spec's); re-running an id resumes or finds it complete.",
)
@click.option("--output", default=None, metavar="STORE", help="Overrides the spec's output.store.")
@click.option(
    "--dry-run",
    is_flag=True,
    help=(
        "Validate, read metadata only and print the plan (and the budget the ledger would have "
        "left); compute, write and charge nothing. Exits 1, as the release would, when it "
        "would be refused."
    ),
)
@click.option(
    "--json", "as_json", is_flag=True, help="With --dry-run: print the full plan as JSON."
)
@click.option(
    "--performance-report",
    default=None,
    metavar="FILE",
    help=(
        "Write Dask's performance report (HTML) to FILE, or 'auto' for "
        "<output>.performance-report.html. Curator-side: do not publish it."
    ),
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help=(
        "Reproducible noise for tests and demos; NOT private, so refused for a spec with a ledger."
    ),
)
@click.option(
    "--period-label",
    default=None,
    metavar="LABEL",
    help=(
        "A stream's period label (its coordinate in the stream's store, e.g. a date); default: "
        "the period's index. Only for a spec with a stream section."
    ),
)
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option(
    "--verbose",
    is_flag=True,
    help="Also dask's own log lines (a failed task's worker traceback, for instance).",
)
@cluster_options
@click.option(
    "--insecure-transport",
    is_flag=True,
    help="Allow a private release key over plaintext tcp:// to a non-loopback scheduler.",
)
def release(
    spec: str,
    scheduler: str | None,
    release_id: str | None,
    output: str | None,
    dry_run: bool,
    as_json: bool,
    performance_report: str | None,
    seed: int | None,
    period_label: str | None,
    quiet: bool,
    verbose: bool,
    cluster: str,
    cluster_spec: str | None,
    tls_ca_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_dir: str | None,
    insecure_transport: bool,
) -> None:
    """Run the release described by the YAML file SPEC."""
    from mvg_dask._startup import imports_without_gc

    with imports_without_gc():
        from mvg_dask import api

    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run")
    if dry_run and performance_report is not None:
        raise click.UsageError("--performance-report needs a release, not a --dry-run")
    try:
        if dry_run and api.load(spec, output=output).stream is not None:
            preview = api.stream_dry_run(spec, release_id=release_id, output=output)
            click.echo(json.dumps(preview.to_dict(), indent=2) if as_json else preview.text)
            return
        if dry_run:
            plan = api.dry_run(spec, release_id=release_id, output=output)
            if as_json:
                click.echo(json.dumps(plan.public_dict(), indent=2))
            else:
                click.echo(api.preview(plan).text())
            # what the release would refuse before starting a cluster (exit 1)
            api.preflight(plan, scheduler=scheduler, probe=cluster == "local")
            return
        security = security_from(tls_ca_file, tls_cert, tls_key, tls_dir)
        start_logging(quiet, verbose)
        result = api.release(
            spec,
            scheduler=scheduler,
            seed=seed,
            progress=not quiet,
            release_id=release_id,
            output=output,
            cluster=cluster,
            cluster_spec=cluster_spec,
            security=security,
            insecure_transport=insecure_transport,
            performance_report=(
                True if performance_report == "auto" else performance_report or None
            ),
            period_label=period_label,
        )
    except (MvgDaskError, OSError, RuntimeError, ValueError) as exc:
        fail(exc)
        return
    note = " (seeded: NOT private)" if result.seeded else ""
    period = getattr(result, "period", None)
    if period is not None:  # a stream's period
        label = getattr(result, "label", "")
        click.echo(
            f"stream period {period} ({label}) {result.release_id} complete: {result.output}{note}"
        )
    else:
        click.echo(f"release {result.release_id} complete: {result.output}{note}")
    if performance_report is not None:
        report = api.performance_report_path(
            result.output, True if performance_report == "auto" else performance_report
        )
        click.echo(f"performance report (curator-side, do not publish): {report}", err=True)
