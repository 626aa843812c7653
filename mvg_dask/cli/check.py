"""``mvg-dask check``: the curator-side data check of a release spec's input."""

from __future__ import annotations

import json

import click

from mvg_dask.cli._common import cluster_options, fail, security_from, start_logging
from mvg_dask.errors import MvgDaskError

#: The exit codes of a check (``mvg-dask check --help`` shows this text).
CHECK_EXIT_CODES = """\b
Exit codes:
  0  the report was printed, whatever it found
  1  the input could not be read (a chunk), or the scheduler is unreachable
  2  invalid arguments, spec or input metadata (a missing store, a
     domain that does not fit, missing chunks)
Nothing is charged and nothing is published in any case.
"""


@click.command(epilog=CHECK_EXIT_CODES)
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report as JSON (the notice goes to stderr)."
)
@click.option(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help=(
        "Dask scheduler address (default: DASK_SCHEDULER_ADDRESS if set, else threads in this "
        "process for an input of at most 1 GiB and a LocalCluster sized to this machine above)."
    ),
)
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option(
    "--verbose",
    is_flag=True,
    help="Also dask's own log lines (a failed task's worker traceback, for instance).",
)
@cluster_options
def check(
    spec: str,
    as_json: bool,
    scheduler: str | None,
    quiet: bool,
    verbose: bool,
    cluster: str,
    cluster_spec: str | None,
    tls_ca_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_dir: str | None,
) -> None:
    """Count the NaN, infinite and out-of-domain values of the input of the YAML file SPEC.

    A curator-side check before a release, to fix the data before spending budget. It reads
    the input of the release spec SPEC (the file `mvg-dask release` takes) once and reports
    the record and feature counts, the NaN and infinite values (in all and per feature), the
    values below and above a box domain per feature or the records whose L2 norm exceeds an
    l2_norm domain; the same for the second variable of a two-variable cross-covariance against
    its own box; and with group_by, the records whose label is not declared.

    It charges nothing and publishes nothing: it opens no ledger and writes no output store.
    Its counts are NOT differentially private: they are for the curator's eyes only, do not
    share them.
    """
    from mvg_dask import api

    try:
        security = security_from(tls_ca_file, tls_cert, tls_key, tls_dir)
        start_logging(quiet, verbose)
        report = api.check(
            spec,
            scheduler=scheduler,
            progress=not quiet,
            cluster=cluster,
            cluster_spec=cluster_spec,
            security=security,
        )
    except (MvgDaskError, OSError, RuntimeError, ValueError) as exc:
        fail(exc)
        return
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        click.echo(report.notice, err=True)
    else:
        click.echo(report.summary())
