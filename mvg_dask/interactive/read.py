"""The accessor's read side: what a complete release says about its noise, and the estimators
and tables computed from it (:mod:`mvg_dask.xarray`'s ``.mvg`` on a release).

* :func:`noise_std`, :func:`confidence_intervals`: accuracy from the known noise. Every
  released entry is the true value plus Gaussian noise of a standard deviation the plan states,
  so ``value +- z_(1 - alpha/2) std`` covers the non-private value with probability ``1 - alpha``
  (entry by entry; not simultaneously).
* :func:`release_noise_plan`, :func:`covariance_estimate`: the noise plan a release was made
  with (decoded by :class:`~mvg_dask.release_codec.ReleaseCodec`, as the engine's resume decodes
  it), and the unbiased covariance estimate from an identity release
  (:func:`mvg_dask.plan.estimators.covariance_from_identity`).
* :func:`psd_covariance`, :func:`shrunk_covariance`, :func:`correlation`: post-processing of a
  covariance release.
* :func:`budget_table`: spent and left per dataset, from the ledger (read only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import xarray as xr

from mvg_dask.plan.derived_stats import (
    centered_covariance_std,
    correlation_matrix,
    warn_noise_dominated,
)
from mvg_dask.plan.estimators import (
    covariance_from_identity,
    identity_shrinkage,
    psd_projection,
    rank_one_scales,
    spiked_shrinkage,
)
from mvg_dask.plan.noise_plan import (
    NoisePlan,
)
from mvg_dask.plan.queries.moment import scale_constant
from mvg_dask.release_codec import ReleaseCodec
from mvg_dask.release_format import (
    COVARIANCE,
    GROUP_DIM,
    MEAN,
    MEAN_STEP_ATTR,
    MOMENT,
    PLAN_ATTR,
    RECORD_COUNT,
    RELEASE_ID_ATTR,
    ROUTE_ATTR,
    ROW_COV,
    SYMMETRIC_RATIO,
    attr,
    check_complete,
    feature_dim,
    released_query_type,
    released_variable,
)
from mvg_dask.release_format import gaussian_variable as _gaussian_variable

if TYPE_CHECKING:
    import pandas as pd


#: A stream period's ``‖B[t]‖₂`` (an attribute of one period; a coordinate along ``period``).
STREAM_STD_FACTOR_ATTR = attr("stream_std_factor")
STREAM_STD_FACTOR_COORD = "noise_std_factor"

__all__ = [
    "COVARIANCE_RELEASES",
    "CovarianceSource",
    "analyst_variable",
    "budget_table",
    "check_noisy_variable",
    "confidence_intervals",
    "correlation",
    "covariance_estimate",
    "covariance_source",
    "describe_release",
    "distinct_noisy_entries",
    "gaussian_variable",
    "noise_std",
    "psd_covariance",
    "release_noise_plan",
    "shrunk_covariance",
]


def _check_complete(ds: xr.Dataset) -> None:
    check_complete(ds.attrs)


def gaussian_variable(ds: xr.Dataset) -> str:
    """The released variable whose noise is the plan's Gaussian noise: ``gram`` when the release
    has a noisy record count (``covariance`` is then a ratio of two noisy values), else the
    query's output (:func:`mvg_dask.release_format.gaussian_variable`, the format's one rule)."""
    return _gaussian_variable(ds.attrs, ds)


def analyst_variable(ds: xr.Dataset) -> str:
    """The variable an analyst reads, the default of :func:`noise_std` and
    :func:`confidence_intervals`: the query's output
    (:func:`mvg_dask.release_format.released_variable`; ``covariance`` of a centered-covariance
    or add-remove release, not the ``moment`` or ``gram`` it is computed from)."""
    name = released_variable(ds.attrs)
    return name if name in ds else gaussian_variable(ds)


def noise_std(ds: xr.Dataset, variable: str | None = None) -> xr.DataArray:
    """Standard deviation of the Gaussian noise of every entry of a released variable.

    The law of the noise as published (:meth:`NoisePlan.released_entry_std
    <mvg_dask.plan.noise_plan.NoisePlan.released_entry_std>`, the plan's one rule, rebuilt from
    the release by :func:`release_noise_plan`): unimodal noise ``sqrt(Sigma_ii)`` for every
    entry of row ``i``; the symmetrised equi-modal noise ``(Z + Z^T) / 2`` of a covariance
    ``sqrt((Sigma_ii Sigma_jj + Sigma_ij^2) / 2)``; symmetric noise ``B S B^T`` with ratio ``r``
    ``sqrt(r (Sigma_ii Sigma_jj + Sigma_ij^2) + (1 - 2r) sum_k B_ik^2 B_jk^2)``. An identity
    release's std is one value per feature, broadcast over the records.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete release.
    variable : str, optional
        Default: the variable an analyst reads, the query's output
        (:func:`~mvg_dask.interactive.read.analyst_variable`);
        :func:`gaussian_variable` names the one with the plan's Gaussian noise (``gram`` with a
        noisy count, a moment release's ``moment``). ``covariance`` of a release with a noisy count
        (``gram / record_count``, a ratio of two noisy values) gets the delta method's
        approximate std, ``sqrt(s_ij^2 + C_ij^2 s_N^2) / N~`` with ``s`` the ``gram``'s std and
        ``s_N`` the count's, marked ``approximate`` in its attributes. A moment release's
        (centered-covariance, regression) ``mean`` gets its exact std and its ``covariance``
        the delta method's, also marked ``approximate``. A mean-first release's ``mean`` and
        ``covariance`` get their noise's exact std (the covariance's bias ``d d^T`` about the
        released centre is not noise: docs/bounds.md, Sec. 14).

    Returns
    -------
    xarray.DataArray
        Aligned with the variable. A period of a stream (docs/guide/streams.md): the period
        plan's std times the period's ``‖B[t]‖₂`` (every output's noise, hence every entry's
        std and the delta method's, scales alike).
    """
    std = _noise_std(ds, variable)
    factor = ds.attrs.get(STREAM_STD_FACTOR_ATTR)
    if factor is not None:
        return std * float(factor)
    if STREAM_STD_FACTOR_COORD in ds.coords:  # a stream's periods along ``period``
        return std * ds.coords[STREAM_STD_FACTOR_COORD]
    return std


def _noise_std(ds: xr.Dataset, variable: str | None = None) -> xr.DataArray:
    _check_complete(ds)
    name = variable or analyst_variable(ds)
    sums = released_query_type(ds.attrs).sum_variable
    if name == released_variable(ds.attrs) and gaussian_variable(ds) == sums:
        return _ratio_std(ds)  # a ratio of two noisy values, output = sum / count
    if gaussian_variable(ds) == MOMENT and name in (MEAN, COVARIANCE):
        return _centered_std(ds, name)
    mean_first = ds.attrs.get(ROUTE_ATTR) == "mean-first"
    if mean_first and name == MEAN:  # the mean step's Gaussian noise, exact
        step_std = float(json.loads(ds.attrs[MEAN_STEP_ATTR])["std"])
        return xr.full_like(ds[MEAN], step_std, dtype=np.float64).rename("noise_std")
    if name != gaussian_variable(ds):
        raise ValueError(
            f"{name!r} is not a variable with the plan's Gaussian noise; use "
            f"{gaussian_variable(ds)!r}"
        )
    var = ds[name]
    std = release_noise_plan(ds).released_entry_std()
    if not released_query_type(ds.attrs).per_record_columns:  # one std per entry
        std = _entrywise(std, var.shape)
        return xr.DataArray(np.array(std), dims=var.dims, coords=var.coords, name="noise_std")
    d = std[:, 0]  # identity: one std per feature, alike for every record (broadcast below)
    fd = feature_dim(ds[ROW_COV].dims)
    out = xr.DataArray(d, dims=(fd,), name="noise_std")
    if fd in var.coords:
        out = out.assign_coords({fd: var.coords[fd].values})
    return out.broadcast_like(var)


def _entrywise(std: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The plan's entry stds on a released variable of ``shape``: the same entries (the ``m x 1``
    query of a vector output), or broadcast (a grouped release's groups)."""
    std = np.asarray(std)
    return np.broadcast_to(std.reshape(shape) if std.size == math.prod(shape) else std, shape)


def _ratio_std(ds: xr.Dataset) -> xr.DataArray:
    """The delta method's std of ``covariance = gram / record_count`` (add-remove releases; a
    mean's ``mean = sum / record_count`` alike).

    With ``gram = G + W`` (std ``s_ij``) and ``record_count = N + e`` (std ``s_N = 1 /
    count_mu``, independent of ``W``), to first order ``C - G / N ~ W / N - (G / N^2) e``, so
    ``Var C_ij ~ (s_ij^2 + C_ij^2 s_N^2) / N^2``, evaluated at the released values. Good when
    the count's noise is small against the count (always, for the record counts a covariance
    release needs); its coverage is measured in the tests.
    """
    plan = release_noise_plan(ds)
    count_mu = plan.budgets.count_mu
    if count_mu is None:
        raise ValueError("this release has no noisy record count to take a ratio with")
    cov = ds[released_variable(ds.attrs)]
    count = max(float(ds[RECORD_COUNT].values), 1.0)
    s = _entrywise(plan.released_entry_std(), cov.shape)
    c = cov.values
    std = np.sqrt(s * s + c * c / (count_mu * count_mu)) / count
    out = xr.DataArray(np.array(std), dims=cov.dims, coords=cov.coords, name="noise_std")
    sums = released_query_type(ds.attrs).sum_variable  # a covariance's gram, a mean's sum
    out.attrs["approximate"] = f"delta method: {cov.name} = {sums} / record_count"
    return out


def _centered_std(ds: xr.Dataset, name: str) -> xr.DataArray:
    """The noise std of a moment release's ``mean`` or ``covariance`` (the delta method; exact
    for an ungrouped release's ``mean``, else marked ``approximate``).

    Take the noisy moment of ``[x - c; 1]`` (a release's moment of ``[x - c; s]`` and its std
    are taken there first, exactly): ``B = M[:m, :m]``, ``a = M[:m, m]``, ``p = M[m, m]`` with
    entry stds ``s_ij``, ``s_i`` and ``s_p``, and ``u = a / p``, ``C = B / p - u u^T``. To first
    order ``du = (da - u dp) / p`` and ``dC_ij = (dB_ij - u_j da_i - u_i da_j + (u_i u_j -
    C_ij) dp) / p``, so

    ``Var u_i ~ (s_i^2 + u_i^2 s_p^2) / p^2``, ``Var C_ij ~ (s_ij^2 + u_j^2 s_i^2 + u_i^2 s_j^2
    + (u_i u_j - C_ij)^2 s_p^2) / p^2`` off the diagonal and ``(s_ii^2 + 4 u_i^2 s_i^2 + (u_i^2
    - C_ii)^2 s_p^2) / p^2`` on it, evaluated at the released values (the entries' noises taken
    as independent, as they are for standard directions). An ungrouped release divides by the
    public ``N``: ``p = 1`` and ``s_p = 0`` (the mean's std is then exact). A grouped release
    divides by the group's noisy share ``p = N_g / N`` (a group whose share is not positive
    gets NaN). Its coverage is measured in the tests.
    """
    query = json.loads(ds.attrs[PLAN_ATTR])["query"]
    scale = float(query.get("scale", 1.0))
    moment = ds[MOMENT]
    std = np.broadcast_to(release_noise_plan(ds).released_entry_std(), moment.shape[-2:])
    s = scale_constant(std, 1.0 / scale)  # of the moment of [x - c; 1]
    m = s.shape[-1] - 1
    grouped = GROUP_DIM in moment.dims
    values = scale_constant(moment.values, 1.0 / scale).reshape(-1, m + 1, m + 1)
    p = values[:, m, m] if grouped else np.ones(values.shape[0])
    s_p = s[m, m] if grouped else 0.0
    ok = p > 0
    p = np.where(ok, p, np.nan)[:, None]
    u = values[:, :m, m] / p  # (G, m) means about c
    s_a = s[:m, m]
    var = ds[name]
    if name == MEAN:
        sd = np.sqrt(s_a**2 + u**2 * s_p**2) / p
        out = xr.DataArray(sd.reshape(var.shape), dims=var.dims, coords=var.coords)
        if grouped:
            out.attrs["approximate"] = "delta method: mean = moment[:, 1] / moment[1, 1]"
        return out.rename("noise_std")
    sd = centered_covariance_std(values, s, grouped=grouped)
    out = xr.DataArray(sd.reshape(var.shape), dims=var.dims, coords=var.coords, name="noise_std")
    what = "moment_xx / share - mean mean^T" if grouped else "moment_xx - mean mean^T"
    out.attrs["approximate"] = f"delta method: covariance = {what}"
    return out


def _normal_quantile(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def distinct_noisy_entries(ds: xr.Dataset, variable: str | None = None) -> int:
    """How many entries of a released variable carry their own noise: the upper triangle with
    the diagonal when the published noise is symmetric (a covariance release with symmetric or
    symmetrised equi-modal noise: ``symmetric_ratio`` is published), else every entry."""
    var = ds[variable or gaussian_variable(ds)]
    if SYMMETRIC_RATIO in ds and var.ndim == 2 and var.shape[0] == var.shape[1]:
        m = int(var.shape[0])
        return m * (m + 1) // 2
    return int(var.size)


def confidence_intervals(
    ds: xr.Dataset,
    level: float = 0.95,
    variable: str | None = None,
    *,
    simultaneous: bool = False,
) -> xr.Dataset:
    """Confidence intervals from the known Gaussian noise: ``value +- z std``.

    Per entry (the default), ``z = Phi^-1((1 + level) / 2)`` and each interval covers the
    non-private entry with probability ``level``. With ``simultaneous=True`` the intervals form
    a band that covers *every* entry at once with probability at least ``level``:
    ``z = Phi^-1((1 + level^(1/n)) / 2)`` over the ``n`` entries with their own noise
    (:func:`distinct_noisy_entries`; Sidak's inequality, which holds for any correlated Gaussian
    noise and is exact when the entries' noises are independent, as with standard directions).
    For clipped records the non-private value is that of the clipped data. Post-processing of
    the release: no privacy cost. ``half_width`` is what smartnoise-sdk (PR #386) and OpenDP's
    accuracy utilities (PR #275) call the accuracy at level ``alpha = 1 - level``; it depends on
    ``level`` (smartnoise-sdk once reported a Gaussian accuracy that did not).

    Parameters
    ----------
    ds : xarray.Dataset
        A complete release.
    level : float
        Coverage, in (0, 1).
    variable : str, optional
        As for :func:`noise_std`.
    simultaneous : bool, default False
        One band for the whole variable instead of per-entry intervals.

    Returns
    -------
    xarray.Dataset
        ``value``, ``lower``, ``upper``, ``half_width`` (``z std``) and ``std``, with ``level``,
        ``z``, ``variable`` and ``simultaneous`` (and for a band ``entries``, its ``n``) as
        attributes.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    _check_complete(ds)
    name = variable or analyst_variable(ds)
    std = noise_std(ds, name)
    attrs: dict[str, Any] = {"level": level, "variable": name, "simultaneous": simultaneous}
    if "approximate" in std.attrs:
        attrs["approximate"] = std.attrs["approximate"]
    if simultaneous:
        n = distinct_noisy_entries(ds, name)
        # level^(1/n) = exp(log(level) / n), with 1 - level^(1/n) = -expm1(log(level) / n)
        from scipy.stats import norm

        z = float(norm.isf(-math.expm1(math.log(level) / n) / 2))
        attrs["entries"] = n
    else:
        z = _normal_quantile(0.5 + level / 2)
    attrs["z"] = z
    value = ds[name]
    half = z * std
    out = xr.Dataset(
        {
            "value": value,
            "lower": value - half,
            "upper": value + half,
            "half_width": half,
            "std": std,
        }
    )
    out.attrs.update(attrs)
    return out


def release_noise_plan(ds: xr.Dataset) -> NoisePlan:
    """The noise plan a complete release was made with, decoded from the release alone
    (:meth:`ReleaseCodec.noise_plan <mvg_dask.release_codec.ReleaseCodec.noise_plan>`: its
    published plan, resolved with DP-PCA's noisy directions or a mean-first release's centre, as
    the engine's resume resolves it) and checked against its published ``row_cov``.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete release.

    Returns
    -------
    NoisePlan
        The plan.
    """
    return ReleaseCodec(ds.attrs, ds).noise_plan()


def covariance_estimate(ds: xr.Dataset) -> xr.DataArray:
    """An unbiased estimate of ``X X^T / N`` from a release.

    Identity release: ``(Y Y^T - N Sigma) / N`` (:func:`covariance_from_identity`); covariance
    release with a public normaliser: the released ``covariance`` itself (zero-mean noise).

    Parameters
    ----------
    ds : xarray.Dataset
        A complete release.

    Returns
    -------
    xarray.DataArray
        ``feature_row x feature_col``.
    """
    _check_complete(ds)
    if RECORD_COUNT in ds:
        raise ValueError(
            "this release has a noisy record count (add-remove): `gram` is unbiased for X X^T, "
            "and covariance = gram / record_count is a ratio estimate (consistent, not unbiased)"
        )
    qtype = released_query_type(ds.attrs)
    if qtype.second_moment:  # the released X X^T / N itself
        return ds[COVARIANCE]
    if qtype.augmented:  # a moment release: its covariance around the mean, as released
        return ds[COVARIANCE]
    plan = release_noise_plan(ds)
    var = ds[released_variable(ds.attrs)]
    rows, cols = ds[ROW_COV].dims
    fd = feature_dim((rows, cols))
    Y = var.transpose(fd, ...).values
    est = covariance_from_identity(Y, plan)
    coords = {}
    if fd in var.coords:
        names = var.coords[fd].values
        coords = {rows: names, cols: names}
    return xr.DataArray(est, dims=(rows, cols), coords=coords, name=COVARIANCE)


def describe_release(ds: xr.Dataset) -> str:
    """What a release is, for a refusal's message: its query, and whether it is grouped, has a
    noisy record count (add-remove) or took the mean-first route."""
    qtype = released_query_type(ds.attrs)
    text = f"{'an' if qtype.kind[0] in 'aeiou' else 'a'} {qtype.kind} release"
    if GROUP_DIM in ds.dims:
        text += f" of {ds.sizes[GROUP_DIM]} groups"
    if RECORD_COUNT in ds:
        text += " with a noisy record count (add-remove)"
    if ds.attrs.get(ROUTE_ATTR) == "mean-first":
        text += " (mean-first route)"
    return text


#: What the covariance estimators take, for their refusals.
COVARIANCE_RELEASES = "a covariance, centered-covariance or regression release (grouped too)"


@dataclass(frozen=True)
class CovarianceSource:
    """What the covariance estimators take from a release (:func:`covariance_source`).

    Attributes
    ----------
    values, std : ndarray
        ``(G, m, m)`` (``G = 1`` ungrouped): the released matrix the estimators post-process
        (``covariance``, or ``gram`` with a noisy count) and its noise std (:func:`noise_std`).
    spread_std : ndarray
        ``(G, m, m)``: the std of the symmetric Gaussian part of its noise (a moment release's
        mean adds a rank-two term, which does not spread the spectrum): the spiked shrinker's.
    divisor : ndarray
        ``(G,)``: ``values / divisor`` is the covariance (the noisy count clipped at 1, or 1).
    like : xarray.DataArray
        The released ``covariance`` (its dimensions and coordinates).
    """

    values: np.ndarray
    std: np.ndarray
    spread_std: np.ndarray
    divisor: np.ndarray
    like: xr.DataArray

    @property
    def grouped(self) -> bool:
        """Whether the release has a group dimension."""
        return GROUP_DIM in self.like.dims

    def shaped(self, stack: np.ndarray) -> np.ndarray:
        """A ``(G, ...)`` stack as the released covariance's shape (no group axis when
        ungrouped)."""
        return stack if self.grouped else stack[0]


def covariance_source(ds: xr.Dataset, what: str = "this estimator") -> CovarianceSource:
    """The released covariance the estimators take, whatever covariance-like release it is.

    A covariance release's ``covariance`` (its noise the plan's), or with a noisy record count
    its ``gram`` and the count; a centered-covariance or regression release's ``covariance``
    around its mean (per group for a grouped release; its noise std the delta method's,
    :func:`noise_std`), or a mean-first release's. Anything else is refused with what it is and
    what would work.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete release.
    what : str
        The estimator's name, for the refusal.

    Returns
    -------
    CovarianceSource
        The matrices, their stds and divisors.
    """
    _check_complete(ds)
    qtype = released_query_type(ds.attrs)
    if not (qtype.second_moment or qtype.augmented) or COVARIANCE not in ds:
        hint = (
            "; its ds.mvg.covariance() is the unbiased X X^T / N (its noise is not Gaussian)"
            if qtype.per_record_columns
            else ""
        )
        raise ValueError(
            f"{what} needs {COVARIANCE_RELEASES}; this is {describe_release(ds)}{hint}. Release "
            "query 'covariance' or 'centered-covariance' for it"
        )
    check_noisy_variable(ds)
    like = ds[COVARIANCE]
    name = gaussian_variable(ds)
    if name == qtype.noisy_variable:  # a moment release: its covariance around the mean
        values = like.values
        std = noise_std(ds, COVARIANCE).values
        spread = _moment_block_std(ds)
        divisor = np.ones(values.shape[:-2])
    else:  # the plan's noise on covariance, or on gram with the noisy count
        values = ds[name].values
        std = noise_std(ds, name).values
        spread = std
        count = float(ds[RECORD_COUNT].values) if name == qtype.sum_variable else 1.0
        divisor = np.full(values.shape[:-2], max(count, 1.0))
    m = values.shape[-1]
    return CovarianceSource(
        values=np.asarray(values, dtype=np.float64).reshape(-1, m, m),
        std=np.broadcast_to(std, values.shape).reshape(-1, m, m),
        spread_std=np.broadcast_to(spread, values.shape).reshape(-1, m, m),
        divisor=np.asarray(divisor, dtype=np.float64).reshape(-1),
        like=like,
    )


def check_noisy_variable(ds: xr.Dataset) -> None:
    """Refuse a moment release without its noisy ``moment`` (the variable its noise law is
    stated for; a mean-first release has none)."""
    qtype = released_query_type(ds.attrs)
    noisy = qtype.noisy_variable
    if noisy is not None and noisy not in ds and ds.attrs.get(ROUTE_ATTR) != "mean-first":
        raise ValueError(
            f"this is {describe_release(ds)} without its {noisy!r} variable, which carries the "
            "noise the estimators take: open the whole release (api.open_release)"
        )


def _moment_block_std(ds: xr.Dataset) -> np.ndarray:
    """The std of the noise of a moment release's ``M[:m, :m]`` block, divided by each group's
    noisy share (``(G, m, m)``, or ``(m, m)`` ungrouped)."""
    scale = float(json.loads(ds.attrs[PLAN_ATTR])["query"].get("scale", 1.0))
    moment = ds[MOMENT]
    std = np.broadcast_to(release_noise_plan(ds).released_entry_std(), moment.shape[-2:])
    s = scale_constant(std, 1.0 / scale)
    m = s.shape[-1] - 1
    if GROUP_DIM not in moment.dims:
        return np.asarray(s[:m, :m])
    shares = scale_constant(moment.values, 1.0 / scale)[:, m, m]
    shares = np.where(shares > 0, shares, np.nan)
    return np.asarray(s[None, :m, :m] / shares[:, None, None])


def _covariance_source(ds: xr.Dataset) -> tuple[xr.DataArray, xr.DataArray, float]:
    """:func:`covariance_source` of an ungrouped release as ``(matrix, std, divisor)``."""
    src = covariance_source(ds)
    if src.grouped:
        raise ValueError(
            f"this needs an ungrouped release; this is {describe_release(ds)} (use "
            "covariance_source() for one matrix per group)"
        )
    like = src.like
    return (
        like.copy(data=src.values[0]),
        like.copy(data=src.std[0]).rename("noise_std"),
        float(src.divisor[0]),
    )


def _each_matrix(fn: Callable[[int], np.ndarray], src: CovarianceSource) -> np.ndarray:
    """``fn(g)`` for every group ``g`` whose released matrix is finite (NaN for the others: a
    group whose noisy share is not positive), stacked as the released covariance."""
    out = np.full(src.values.shape, np.nan)
    for g in range(src.values.shape[0]):
        if np.all(np.isfinite(src.values[g])) and np.all(np.isfinite(src.spread_std[g])):
            out[g] = fn(g)
    return src.shaped(out)


def _post_processed(
    values: np.ndarray, like: xr.DataArray, name: str, ds: xr.Dataset, **attrs: Any
) -> xr.DataArray:
    out = xr.DataArray(values, dims=like.dims, coords=like.coords, name=name)
    out.attrs.update(
        {
            "estimator": name,
            "source_release": ds.attrs.get(RELEASE_ID_ATTR),
            "post_processing": "computed from the release only: no privacy cost",
            **attrs,
        }
    )
    return out


def psd_covariance(ds: xr.Dataset) -> xr.DataArray:
    """The PSD matrix nearest (Frobenius) to a release's covariance
    (:func:`~mvg_dask.plan.estimators.psd_projection`): a new variable, the release unchanged.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance, centered-covariance or regression release (one matrix per
        group of a grouped release; an add-remove release's ``covariance``).

    Returns
    -------
    xarray.DataArray
        ``covariance_psd``, with its provenance as attributes.
    """
    src = covariance_source(ds, "psd_covariance")
    est = _each_matrix(lambda g: psd_projection(src.values[g] / src.divisor[g]), src)
    return _post_processed(est, src.like, "covariance_psd", ds)


def shrunk_covariance(
    ds: xr.Dataset, target: str = "spiked", *, bulk: str = "zero"
) -> xr.DataArray:
    """A release's covariance shrunk with the noise's public std: a new variable, the release
    unchanged.

    ``target="spiked"`` (:func:`~mvg_dask.plan.estimators.spiked_shrinkage`) shrinks the
    eigenvalues above the noise edge for a spiked truth; it helps a spectrum with a few
    eigenvalues far above the noise and hurts a flat one, so look at the spectrum first. It needs
    homogeneous noise (every off-diagonal entry with the same std: standard directions and a
    uniform allocation); noise whose std is ``s a_i a_j`` (a binary or scale-aware allocation)
    is made homogeneous by the public scales ``a`` first, shrunk, and scaled back
    (``noise_scales``). ``bulk="mean"`` keeps the mean of the eigenvalues below the edge
    instead of 0 (a few spikes above an isotropic floor). ``target="identity"``
    (:func:`~mvg_dask.plan.estimators.identity_shrinkage`) shrinks toward a multiple of the
    identity by the share of the spread that is noise: for a flat or full-rank spectrum where
    the noise dominates. With a noisy record count ``gram`` is shrunk and then divided by the
    count. A centered-covariance or regression release's covariance is shrunk with the noise
    of its moment's block (the mean's noise adds a rank-two term, which does not move the
    noise edge), one group at a time.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance, centered-covariance or regression release.
    target : {"spiked", "identity"}, default "spiked"
        The shrinker.
    bulk : {"zero", "mean"}, default "zero"
        For ``target="spiked"``: the eigenvalues below the noise edge.

    Returns
    -------
    xarray.DataArray
        ``covariance_shrunk``, with its provenance, ``shrinkage_target`` and (spiked)
        ``noise_edge`` (``2 s sqrt(m)`` in the units of the covariance; one per group) as
        attributes.
    """
    if target not in ("spiked", "identity"):
        raise ValueError(f"target must be 'spiked' or 'identity', got {target!r}")
    if bulk not in ("zero", "mean"):
        raise ValueError(f"bulk must be 'zero' or 'mean', got {bulk!r}")
    src = covariance_source(ds, "shrunk_covariance")
    if target == "identity":
        est = _each_matrix(
            lambda g: identity_shrinkage(src.values[g], src.std[g]) / src.divisor[g], src
        )
        return _post_processed(est, src.like, "covariance_shrunk", ds, shrinkage_target=target)
    m = src.values.shape[-1]
    scales = [rank_one_scales(src.spread_std[g]) for g in range(src.values.shape[0])]
    if m < 2 or any(a is None for a in scales):
        raise ValueError(
            "eigenvalue shrinkage needs noise whose off-diagonal std is s a_i a_j (standard "
            "directions: a uniform, binary or scale-aware allocation); use psd_covariance() or "
            "target='identity' instead"
        )
    fitted = [a for a in scales if a is not None]

    def shrink(g: int) -> np.ndarray:
        # rescaled by the public noise scales the noise is homogeneous (std s off the
        # diagonal): shrink there, then scale back
        s, a = fitted[g]
        w = np.outer(a, a)
        rescaled = spiked_shrinkage(src.values[g] / w, s, bulk=bulk)  # type: ignore[arg-type]
        return np.asarray(rescaled * w / src.divisor[g])

    est = _each_matrix(shrink, src)
    edge = [2.0 * s * math.sqrt(m) / d for (s, _), d in zip(fitted, src.divisor, strict=True)]
    attrs: dict[str, Any] = {
        "noise_edge": [float(e) for e in edge] if src.grouped else float(edge[0])
    }
    if any(np.ptp(a) > 1e-9 * np.max(a) for _, a in fitted):
        attrs["noise_scales"] = [float(v) for v in fitted[0][1]]
    return _post_processed(est, src.like, "covariance_shrunk", ds, shrinkage_target=target, **attrs)


def correlation(
    ds: xr.Dataset, level: float = 0.95, *, method: Literal["floor", "psd"] = "floor"
) -> xr.Dataset:
    """Correlations from a release's covariance, with approximate per-entry intervals (values
    in ``[-1, 1]``, a unit diagonal, never NaN): new variables, the release unchanged.

    Each noisy variance is floored at its noise std and the standardised covariance made a
    correlation by clipping (``method="floor"``) or by its PSD projection (``"psd"``: a
    correlation matrix; its intervals are conservative where the projection acts)
    (:func:`~mvg_dask.plan.derived_stats.correlation_matrix`). The intervals are the delta
    method's around the value, clipped to ``[-1, 1]``; their coverage is measured in the tests.
    Where a variance is not significantly above 0 (``C_ii <= z s_ii``, ``z`` of ``level``) the
    noise dominates its correlations: their interval is ``[-1, 1]``, ``noise_dominated`` marks
    them and a :class:`~mvg_dask.plan.derived_stats.NoiseDominatedWarning` says how many.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance, centered-covariance or regression release (one matrix per
        group of a grouped release; with a noisy count the count cancels).
    level : float
        Per-entry coverage of the intervals, in (0, 1).
    method : {"floor", "psd"}, default "floor"
        How the covariance is made a correlation's source.

    Returns
    -------
    xarray.Dataset
        ``value``, ``lower``, ``upper``, ``std`` and ``noise_dominated``, with ``level``,
        ``z``, ``method``, ``approximate`` and the provenance as attributes.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    src = covariance_source(ds, "correlation")  # a ratio: the count's scale cancels
    z = _normal_quantile(0.5 + level / 2)
    r, sd, dominated = correlation_matrix(src.values, src.std, method=method, z=z)
    m = r.shape[-1]
    lower = np.where(dominated, -1.0, np.clip(r - z * sd, -1.0, 1.0))
    upper = np.where(dominated, 1.0, np.clip(r + z * sd, -1.0, 1.0))
    value = _post_processed(src.shaped(r), src.like, "correlation", ds)
    out = xr.Dataset(
        {
            "value": value,
            "lower": value.copy(data=src.shaped(lower)),
            "upper": value.copy(data=src.shaped(upper)),
            "std": value.copy(data=src.shaped(sd)),
            "noise_dominated": value.copy(data=src.shaped(dominated)),
        }
    )
    out.attrs.update({**value.attrs, "level": level, "z": z, "method": method})
    out.attrs["approximate"] = True
    weak = int(
        np.sum(
            ~(
                np.diagonal(src.values, axis1=-2, axis2=-1)
                > z * np.diagonal(src.std, axis1=-2, axis2=-1)
            )
        )
    )
    pairs = int(np.sum(np.triu(dominated, 1)))
    total = src.values.shape[0] * m * (m - 1) // 2
    warn_noise_dominated(weak, pairs, total, f"correlation of {describe_release(ds)}")
    return out


# -- the ledger ---------------------------------------------------------------------------------
def budget_table(ledger: str | Path, dataset: str | None = None) -> pd.DataFrame:
    """Spent and left per dataset, read from a ledger (nothing is created or reserved).

    Parameters
    ----------
    ledger : str or Path
        The ledger's path or URL.
    dataset : str, optional
        Only this dataset.

    Returns
    -------
    pandas.DataFrame
        One row per dataset: budget, neighbours, composition, spent and left, and the number of
        releases by status.
    """
    import pandas as pd

    from mvg_dask.ledger import open_ledger

    with open_ledger(ledger, create=False) as book:
        summary = book.summary()
    rows = []
    for d in summary:
        if dataset is not None and d["dataset"] != dataset:
            continue
        statuses = [r["status"] for r in d["releases"]]
        left_delta = d["left"]["delta"]
        rows.append(
            {
                "dataset": d["dataset"],
                "neighbours": d["budget"]["neighbours"],
                "budget_epsilon": d["budget"]["epsilon"],
                "budget_delta": d["budget"]["delta"],
                "composition": d["composition"],
                "spent_epsilon": d["spent"]["epsilon"],
                "spent_delta": d["spent"]["delta"],
                "left_epsilon": d["left"]["epsilon"],
                "left_delta": math.nan if left_delta is None else left_delta,
                "releases": len(statuses),
                "committed": statuses.count("committed"),
                "pending": statuses.count("pending"),
                "aborted": statuses.count("aborted"),
            }
        )
    if dataset is not None and not rows:
        raise ValueError(f"dataset {dataset!r} is not in the ledger {ledger}")
    return pd.DataFrame(rows).set_index("dataset") if rows else pd.DataFrame(rows)
