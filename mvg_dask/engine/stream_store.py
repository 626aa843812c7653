"""A stream's store: one store per stream, a ``period`` dimension (docs/guide/streams.md).

The store holds ``stream.json`` (the stream's public description: its horizon, factorization,
budget and every period's std factor ``‖B[t]‖₂``) and one complete release per period,
``period-0001``, ``period-0002``, ... in the release format (:mod:`mvg_dask.release_format`):
each period is written like a one-shot release (staged and renamed into place for a local store,
``status = complete`` last for an object store), so a period appears atomically.
:func:`open_stream` reads the complete periods along a ``period`` dimension whose coordinate is
each period's label; a period that is not complete is refused.

Every byte here is a function of the plan and the noisy values: no record count, watermark or
input shape is published (the period plan is planned for the public bound ``max_records``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import xarray as xr

from mvg_dask.engine.store import Store
from mvg_dask.errors import IncompleteReleaseError
from mvg_dask.plan.stream import StreamPlan
from mvg_dask.release_format import attr, is_complete

#: The stream's description in its store.
STREAM_FILE = "stream.json"
#: A period's store inside the stream's.
PERIOD_RE = re.compile(r"^period-(\d{4,})$")
#: A period's attributes: the stream, the period's index and label, ``‖B[t]‖₂``.
STREAM_ATTR = attr("stream")
PERIOD_ATTR = attr("stream_period")
LABEL_ATTR = attr("stream_period_label")
STD_FACTOR_ATTR = attr("stream_std_factor")
#: The coordinate of ``‖B[t]‖₂`` along the ``period`` dimension of :func:`open_stream`.
STD_FACTOR_COORD = "noise_std_factor"
PERIOD_DIM = "period"


def period_store(store: str, period: int) -> str:
    """Where period ``period`` of the stream in ``store`` is written."""
    return f"{store.rstrip('/')}/period-{period:04d}"


def stream_description(stream: StreamPlan) -> dict[str, Any]:
    """The stream's public description (``stream.json``): a function of its plan only."""
    f = stream.factorization
    return {
        "format": "mvg_dask stream",
        **stream.to_dict(),
        "std_factors": [float(x) for x in f.period_std_factors()],
    }


def write_stream_root(
    store: str, stream: StreamPlan, storage_options: dict[str, Any] | None = None
) -> None:
    """Write ``stream.json`` (the same bytes on every period: a function of the plan)."""
    text = json.dumps(stream_description(stream), sort_keys=True)
    where = Store(store, storage_options)
    fs, root = where.fs, where.root
    fs.makedirs(root, exist_ok=True)
    path = where.key(STREAM_FILE)
    if fs.exists(path) and fs.cat_file(path).decode() == text:
        return
    with fs.open(path, "w") as fh:
        fh.write(text)


def stream_attrs(
    stream: StreamPlan, period: int, label: str, rescale: float = 1.0
) -> dict[str, Any]:
    """A period's stream attributes (public: the plan, the period's index and label, and the
    factor of its noise std over the period plan's: ``‖B[t]‖₂``, times ``rescale``, the
    replace-one query's public ``max_records / N_t``)."""
    return {
        STREAM_ATTR: json.dumps(stream.to_dict(), sort_keys=True),
        PERIOD_ATTR: period,
        LABEL_ATTR: label,
        STD_FACTOR_ATTR: stream.std_factor(period) * rescale,
    }


def is_stream_store(store: str, storage_options: dict[str, Any] | None = None) -> bool:
    """True when ``store`` is a stream's store (it holds ``stream.json``)."""
    try:
        return Store(store, storage_options).exists(STREAM_FILE)
    except Exception:
        return False


def _periods(store: str, storage_options: dict[str, Any] | None) -> list[int]:
    where = Store(store, storage_options)
    fs, root = where.fs, where.root
    found = []
    for path in fs.ls(root, detail=False):
        match = PERIOD_RE.match(str(path).rstrip("/").rsplit("/", 1)[-1])
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def open_period(
    store: str, period: int | str, *, storage_options: dict[str, Any] | None = None
) -> xr.Dataset:
    """One period of a stream, a complete release (``ds.mvg`` gives its accuracy, intervals
    and estimators, with the period's std).

    Parameters
    ----------
    store : str
        The stream's store.
    period : int or str
        The period's index (1-based) or label.
    storage_options : dict, optional
        fsspec options.

    Returns
    -------
    xarray.Dataset
        The period's release.

    Raises
    ------
    IncompleteReleaseError
        The period is not complete (still running, or crashed: re-run the stream to finish it).
    """
    if isinstance(period, str) and not period.isdigit():
        for t in _periods(store, storage_options):
            ds = _open_one(store, t, storage_options, strict=False)
            if ds is not None and ds.attrs.get(LABEL_ATTR) == period:
                return ds
        raise IncompleteReleaseError(f"{store} holds no complete period labelled {period!r}")
    ds = _open_one(store, int(period), storage_options, strict=True)
    assert ds is not None
    return ds


def _open_one(
    store: str, period: int, storage_options: dict[str, Any] | None, *, strict: bool
) -> xr.Dataset | None:
    path = period_store(store, period)
    try:
        ds = xr.open_zarr(path, consolidated=True, storage_options=storage_options)
    except Exception:
        ds = None
    if ds is None or not is_complete(ds.attrs):
        if not strict:
            return None
        raise IncompleteReleaseError(
            f"period {period} of the stream {store} is not complete; it may still be running, "
            "or it crashed: run the stream's release again to finish it"
        )
    return ds


def open_stream(store: str, *, storage_options: dict[str, Any] | None = None) -> xr.Dataset:
    """Every complete period of a stream along a ``period`` dimension (coordinate: the
    periods' labels), with ``noise_std_factor`` (``‖B[t]‖₂``) along it.

    Parameters
    ----------
    store : str
        The stream's store.
    storage_options : dict, optional
        fsspec options.

    Returns
    -------
    xarray.Dataset
        The periods, in order; only complete ones (a period being written is left out).

    Raises
    ------
    IncompleteReleaseError
        No period is complete.
    """
    periods = []
    for t in _periods(store, storage_options):
        ds = _open_one(store, t, storage_options, strict=False)
        if ds is None:
            break  # periods run in order: nothing after an incomplete one is complete
        periods.append(ds)
    if not periods:
        raise IncompleteReleaseError(f"{store} holds no complete period of a stream")
    labels = [ds.attrs[LABEL_ATTR] for ds in periods]
    factors = [float(ds.attrs[STD_FACTOR_ATTR]) for ds in periods]
    drop = {PERIOD_ATTR, LABEL_ATTR, STD_FACTOR_ATTR, attr("release_id")}
    attrs = {k: v for k, v in periods[0].attrs.items() if k not in drop}
    out = xr.concat(
        [ds.drop_attrs(deep=False) for ds in periods],
        dim=PERIOD_DIM,
        data_vars="different",
        coords="minimal",
        compat="equals",
        join="exact",
    )
    out = out.assign_coords(
        {
            PERIOD_DIM: np.asarray(labels, dtype=object),
            STD_FACTOR_COORD: (PERIOD_DIM, np.asarray(factors)),
        }
    )
    out.attrs = attrs
    return out
