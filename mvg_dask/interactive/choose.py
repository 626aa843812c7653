"""The covariance estimate that chooses for itself, behind ``ds.mvg.estimate_covariance()``.

It reads a complete covariance release and its published plan only
(:func:`mvg_dask.plan.covariance_selection.select_covariance`): post-processing, no privacy
cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from mvg_dask.interactive import read
from mvg_dask.plan.covariance_selection import DEFAULT_PROBES, select_covariance
from mvg_dask.release_format import COVARIANCE

__all__ = ["estimate_covariance"]


def _trace_bound(ds: xr.Dataset, divisor: float) -> float | None:
    """``sup ||x||^2`` of the declared domain, a bound on ``tr(X X^T / N)`` of a covariance
    release; none for other queries and for a noisy-count ``gram`` (a sum)."""
    plan = read.release_noise_plan(ds)
    if divisor != 1.0:
        return None
    return plan.query.trace_bound(plan.domain)


def estimate_covariance(
    ds: xr.Dataset,
    *,
    candidates: Sequence[str] | None = None,
    probes: int = DEFAULT_PROBES,
    seed: int = 0,
) -> xr.DataArray:
    """The covariance estimate with the smallest unbiased risk estimate, from the release alone.

    The candidates are the raw release, its PSD projection, the spiked shrinker (homogeneous
    noise only), the shrinkage toward the identity and the nuclear-norm projections with the
    declared domain's trace bound or the release's own trace
    (:data:`~mvg_dask.plan.covariance_selection.CANDIDATES`). Each one's Frobenius risk is
    estimated by Stein's unbiased risk estimate under the published noise law
    (:func:`~mvg_dask.plan.covariance_selection.sure_risks`, which treats the entries' noises
    as independent up to symmetry: exact for standard directions), and the smallest wins. With
    a noisy record count ``gram`` is estimated and then divided by the count.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance release.
    candidates : sequence of str, optional
        A subset of the candidates.
    probes : int, default 4
        Probes of the divergence.
    seed : int, default 0
        Public seed of the probes (the choice is a deterministic function of the release, its
        plan and this seed).

    Returns
    -------
    xarray.DataArray
        ``covariance_estimate``, with its provenance, the ``chosen`` candidate and every
        candidate's ``sure_risk`` (in the units of ``covariance`` squared) as attributes.
    """
    source, std, divisor = read._covariance_source(ds)
    like = ds[COVARIANCE]
    if source.ndim != 2:
        raise ValueError(
            f"estimate_covariance needs one released matrix, got dims {source.dims}; select "
            "one group first (ds.isel(...))"
        )
    choice = select_covariance(
        np.asarray(source.values),
        np.asarray(std.values),
        trace_bound=_trace_bound(ds, divisor),
        candidates=candidates,
        probes=probes,
        seed=seed,
    )
    names = list(choice.risks)
    return read._post_processed(
        choice.estimate / divisor,
        like,
        "covariance_estimate",
        ds,
        chosen=choice.name,
        candidates=names,
        sure_risk=[choice.risks[c] / divisor**2 for c in names],
        selection="Stein's unbiased risk estimate under the published noise law",
        probe_seed=seed,
    )
