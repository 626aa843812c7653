"""Refusals decided from metadata alone, before a cluster starts and before anything is charged.

A release is refused by the engine at its reservation too (the ledger's transaction is the
authority); :func:`preflight` says the same thing earlier, without dask, distributed or xarray,
so that a release that cannot run fails in a fraction of a second and a dry run reports it:

- the output store already holds something other than this release (a pending release of the
  same id is resumed, and a complete one is an idempotent retry: neither is refused);
- the ledger cannot be read (a file that is not an mvg_dask ledger, an unknown schema version);
- the spec's budget differs from the one the dataset is registered with, or this release would
  exceed it;
- a given Dask scheduler does not answer within :data:`SCHEDULER_PROBE_SECONDS`
  (:func:`probe_scheduler`).

Everything read here is public metadata or the ledger's own (data-independent) charges.
"""

from __future__ import annotations

import json
import socket
from typing import Any
from urllib.parse import urlsplit

from mvg_dask.engine.preview import budget_after, empty_or_missing
from mvg_dask.engine.store import Store
from mvg_dask.errors import BudgetError, ReleaseError
from mvg_dask.ledger import LedgerEntry, open_ledger
from mvg_dask.ledger.base import NoSchemaError, check_registered_budget
from mvg_dask.ledger.location import parse_location
from mvg_dask.plan.release_plan import LedgerCharge, ReleasePlan
from mvg_dask.release_format import RELEASE_ID_ATTR, describe, is_complete

__all__ = ["SCHEDULER_PROBE_SECONDS", "preflight", "probe_scheduler", "store_attributes"]

#: How long :func:`probe_scheduler` waits for a scheduler's port to accept a connection.
SCHEDULER_PROBE_SECONDS = 5.0
#: The port distributed uses when an address names none.
DEFAULT_SCHEDULER_PORT = 8786
#: Schemes whose address is a TCP host and port (the others are not probed).
_TCP_SCHEMES = ("tcp", "tls")


def store_attributes(
    store: str, storage_options: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The root attributes of a Zarr store, read from its metadata file alone.

    Parameters
    ----------
    store : str
        A local path or an fsspec URL.
    storage_options : dict, optional
        fsspec options of ``store``.

    Returns
    -------
    dict or None
        The attributes of a Zarr v3 group (or v2 ``.zattrs``); ``{}`` for a store that exists
        but holds no readable Zarr group metadata; ``None`` when nothing is there.
    """
    target = Store(store, storage_options)
    for name, key in (("zarr.json", "attributes"), (".zattrs", None)):
        try:  # a local file directly (no fsspec to import for a dry run)
            raw = (
                (target.path / name).read_bytes()
                if target.local
                else target.fs.cat_file(f"{target.root}/{name}")
            )
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            return {}
        attrs = doc.get(key, {}) if key is not None else doc
        return dict(attrs) if isinstance(attrs, dict) else {}
    if target.local:
        return {} if target.exists() else None
    fs, root = target.fs, target.root
    return {} if fs.exists(root) and fs.ls(root) else None


def _check_output_free(rplan: ReleasePlan) -> None:
    """As :meth:`~mvg_dask.engine.output.OutputTarget.check_free`, from the metadata file."""
    store = rplan.output_store
    attrs = store_attributes(store, rplan.output_storage_options)
    if attrs is None:
        return
    output = Store(store, rplan.output_storage_options)
    if output.local:
        raise ReleaseError(
            f"output.store: {store} already exists ({describe(attrs)}); choose another "
            "output.store or remove it"
        )
    owner = output.claim_owner()
    if owner is not None and owner != rplan.release_id:
        raise ReleaseError(
            f"output.store: {store} is being written by another release; choose another "
            "output.store"
        )
    if owner is None and attrs.get(RELEASE_ID_ATTR) != rplan.release_id:
        raise ReleaseError(
            f"output.store: {store} already holds other data ({describe(attrs)}); choose "
            "another store"
        )


def _is_complete(rplan: ReleasePlan) -> bool:
    attrs = store_attributes(rplan.output_store, rplan.output_storage_options) or {}
    return is_complete(attrs, rplan.release_id)


def _read_ledger(
    charge: LedgerCharge, release_id: str
) -> tuple[list[dict[str, Any]] | None, LedgerEntry | None]:
    """The ledger's summary and this release's entry (``None, None``: no ledger yet)."""
    if empty_or_missing(charge.location):
        return None, None  # the release creates it
    try:
        with open_ledger(charge.location, password_file=charge.password_file, create=False) as book:
            return book.summary(), book.lookup(release_id)
    except NoSchemaError:
        return None, None  # a database without the ledger's tables: the release creates them


def _check_entry(rplan: ReleasePlan, entry: LedgerEntry) -> None:
    """A release id already in the ledger: as the reservation decides (it refuses or resumes)."""
    assert rplan.ledger is not None
    rid = rplan.release_id
    if entry.spec_hash != rplan.spec_hash or entry.dataset != rplan.ledger.dataset:
        raise ReleaseError(
            f"release_id {rid!r} is already in the ledger with a different spec; a resume must "
            "use the same spec, otherwise choose a new release_id"
        )
    if entry.status == "committed" and not _is_complete(rplan):
        raise ReleaseError(
            f"release {rid!r} is committed in the ledger but its output {entry.output} is "
            "missing or incomplete; it was charged: choose a new release_id"
        )
    if entry.status == "aborted":
        raise ReleaseError(
            f"release {rid!r} was aborted after reading data and stays charged; choose a new "
            "release_id"
        )
    # pending: resumed; committed and complete: an idempotent retry


def _check_budget(rplan: ReleasePlan, summary: list[dict[str, Any]] | None) -> None:
    charge = rplan.ledger
    assert charge is not None
    mine = next((d for d in summary or [] if d["dataset"] == charge.dataset), None)
    if mine is not None:
        b = mine["budget"]
        check_registered_budget(
            charge.dataset,
            (float(b["epsilon"]), float(b["delta"]), str(b["neighbours"])),
            (charge.budget_epsilon, charge.budget_delta, charge.budget_neighbours),
            where=parse_location(charge.location).display(),
        )
    budget = budget_after(rplan, summary=summary or [])
    assert budget is not None
    if budget.refused is not None:
        raise BudgetError(budget.refused)
    if not budget.fits:
        raise BudgetError(
            f"privacy budget of dataset {charge.dataset!r} would be exceeded: spent "
            f"epsilon={budget.spent_epsilon:.6g}, delta={budget.spent_delta:.3g} of "
            f"epsilon={budget.budget_epsilon:g}, delta={budget.budget_delta:g}; this release "
            f"needs epsilon={budget.charge_epsilon:g}, delta={budget.charge_delta:.3g}. Nothing "
            "was read or charged"
        )


def preflight(rplan: ReleasePlan) -> None:
    """Refuse, from metadata and the ledger alone, a release the engine would refuse.

    Reads the output store's metadata file and the ledger (never creating either); imports
    neither dask nor xarray.

    Parameters
    ----------
    rplan : ReleasePlan
        The planned release.

    Raises
    ------
    ReleaseError
        The output store holds something else, or the release id is in the ledger with another
        spec, committed without its output, or aborted.
    BudgetError
        The spec's budget differs from the registered one, or the release would exceed it.
    LedgerError
        The ledger cannot be read (not an mvg_dask ledger, another schema version,
        unreachable).
    """
    charge = rplan.ledger
    summary, entry = (None, None) if charge is None else _read_ledger(charge, rplan.release_id)
    if entry is not None:
        _check_entry(rplan, entry)
        return
    _check_output_free(rplan)
    if charge is not None:
        _check_budget(rplan, summary)


def _host_port(address: str) -> tuple[str, int] | None:
    """Host and port of a TCP scheduler address (``None`` for other transports)."""
    text = address if "://" in address else f"tcp://{address}"
    parts = urlsplit(text)
    if parts.scheme not in _TCP_SCHEMES or not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None  # distributed reports a malformed address itself
    return parts.hostname, port or DEFAULT_SCHEDULER_PORT


def probe_scheduler(
    address: str, source: str = "--scheduler", *, timeout: float = SCHEDULER_PROBE_SECONDS
) -> None:
    """Refuse a scheduler whose port does not accept a TCP connection within ``timeout``.

    Distributed keeps retrying an unreachable address until its connect timeout (30 s); a
    plain socket answers at once for a refused connection and within ``timeout`` for an
    address that does not answer. Addresses of other transports are not probed.

    Parameters
    ----------
    address : str
        The scheduler address, such as ``tcp://10.0.0.5:8786`` or ``tls://host:8786``.
    source : str
        Where the address came from, for the message (``--scheduler``,
        ``DASK_SCHEDULER_ADDRESS``).
    timeout : float
        Seconds to wait.

    Raises
    ------
    ReleaseError
        Naming the address and why it cannot be reached.
    """
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except TimeoutError:
        reason = f"no answer within {timeout:g} s"
    except socket.gaierror:
        reason = f"unknown host {target[0]!r}"
    except ConnectionRefusedError:
        reason = "connection refused"
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    else:
        return
    raise ReleaseError(
        f"cannot reach the Dask scheduler at {address} (from {source}): {reason}; start it, "
        "fix the address, or unset it to run locally"
    )
