"""The ``.mvg`` accessor on xarray DataArrays and Datasets: release, plan, budget and accuracy.

Importing :mod:`mvg_dask.xarray` registers it (:func:`mvg_dask.api.open_release` does not: the
front ends import downward only, ``cli > xarray > interactive > api``).
The accessor only normalises arguments; the work is done by the plain functions of
:mod:`mvg_dask.interactive`::

    import mvg_dask.xarray  # registers .mvg

    ds.mvg.dry_run("out", query="covariance", domain={"box": {"lower": 0, "upper": 1}},
                   privacy={"epsilon": 1, "delta": 1e-6})          # the plan, nothing written
    rel = ds.mvg.release("out", query=..., domain=..., privacy=..., client=client)
    rel.mvg.noise_std()                 # noise std of every released entry
    rel.mvg.confidence_intervals(0.95)  # value +- z std, per entry
    rel.mvg.confidence_intervals(0.95, simultaneous=True)  # one band for every entry
    rel.mvg.covariance()                # unbiased X X^T / N (identity or covariance release)
    rel.mvg.regression(intercept=True)  # ridge regression from a regression release's moment
    rel.mvg.budget("ledger.sqlite")     # spent and left per dataset
    rel.mvg.provenance, rel.mvg.plan    # the mvg_dask_* attributes, the noise plan

``release`` and ``dry_run`` take the spec's sections as keywords (``query``, ``domain``,
``privacy``, ``mechanism``, ``ledger``: the schema of :func:`mvg_dask.api.release_spec`, with its
errors); the input is the object itself, written to a new Zarr store in ``directory``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from mvg_dask.interactive import choose, read, write
from mvg_dask.plan.estimators import moment_regression
from mvg_dask.plan.queries.moment import scale_constant
from mvg_dask.release_format import (
    CONSTANT_TERM,
    GROUP_DIM,
    MOMENT,
    PLAN_ATTR,
    PREFIX,
    RELEASE_ID_ATTR,
    TARGET_ATTR,
    check_complete,
    released_variable,
)

if TYPE_CHECKING:
    import pandas as pd

    from mvg_dask.engine.preview import PlanPreview


class _ReleaseAccessor:
    """The methods that release an object, shared by both accessors: plan, release, budget."""

    _obj: xr.DataArray | xr.Dataset

    def dry_run(
        self, directory: str | Path | None = None, *, variable: str | None = None, **kwargs: Any
    ) -> PlanPreview:
        """Plan the release of this object: nothing is written, read or charged.

        Parameters
        ----------
        directory : path, optional
            Where :meth:`release` would write.
        variable : str, optional
            A Dataset's variable (default: its only one).
        **kwargs
            ``query``, ``domain``, ``privacy``, ``mechanism``, ``ledger``, ``name``,
            ``release_id``, ``record_dim``, ``feature_dim``, ``record_chunk``
            (:func:`mvg_dask.interactive.write.dry_run_xarray`).

        Returns
        -------
        PlanPreview
            The plan (``.plan``) and the budget left after it; a table in a notebook.
        """
        return write.dry_run_xarray(self._obj, directory, variable=variable, **kwargs)

    def release(
        self, directory: str | Path, *, variable: str | None = None, **kwargs: Any
    ) -> xr.Dataset:
        """Write this object to a new Zarr store in ``directory``, release it, open the release.

        Parameters
        ----------
        directory : path
            Where ``<release_id>.input.zarr`` (curator-side) and ``<release_id>.zarr`` go.
        variable : str, optional
            A Dataset's variable (default: its only one).
        **kwargs
            The spec's sections and names as for :meth:`dry_run`, and ``client``, ``scheduler``,
            ``seed``, ``progress``, ``performance_report`` (:func:`mvg_dask.api.release`).

        Returns
        -------
        xarray.Dataset
            The release.
        """
        return write.release_xarray(self._obj, directory, variable=variable, **kwargs)

    def budget(self, ledger: str | Path, dataset: str | None = None) -> pd.DataFrame:
        """Spent and left per dataset in ``ledger`` (read only).

        Parameters
        ----------
        ledger : str or Path
            The ledger's path or URL.
        dataset : str, optional
            Only this dataset.

        Returns
        -------
        pandas.DataFrame
            One row per dataset.
        """
        return read.budget_table(ledger, dataset)


@xr.register_dataarray_accessor("mvg")
class MvgDataArrayAccessor(_ReleaseAccessor):
    """``.mvg`` on a DataArray: release it, plan it, read the budget.

    Parameters
    ----------
    da : xarray.DataArray
        A ``record x feature`` (either order) array.
    """

    def __init__(self, da: xr.DataArray) -> None:
        self._obj = da

    def noise_std(self) -> xr.DataArray:
        """Refused: a DataArray does not carry the noise plan. Use the release Dataset's
        ``ds.mvg.noise_std()`` (``release`` returns it)."""
        raise TypeError(
            "noise_std needs the release's noise plan (row_cov), which a DataArray does not "
            "carry; call it on the release Dataset: ds.mvg.noise_std()"
        )


@xr.register_dataset_accessor("mvg")
class MvgAccessor(_ReleaseAccessor):
    """``.mvg`` on a Dataset: release a variable, or read a released Dataset's provenance,
    plan, noise and accuracy.

    Parameters
    ----------
    ds : xarray.Dataset
        Data to release, or a released dataset.
    """

    def __init__(self, ds: xr.Dataset) -> None:
        self._obj = ds
        self._ds = ds

    def check(self) -> xr.Dataset:
        """Return the dataset if it is a complete release, else raise IncompleteReleaseError."""
        check_complete(self._ds.attrs)
        return self._ds

    @property
    def provenance(self) -> dict[str, Any]:
        """The ``mvg_dask_*`` attributes without their prefix (JSON strings decoded)."""
        out: dict[str, Any] = {}
        for key, value in self._ds.attrs.items():
            if not key.startswith(PREFIX) or key == PLAN_ATTR:
                continue
            name = key.removeprefix(PREFIX)
            if isinstance(value, str) and value.startswith(("{", "[")):  # not "": a note
                value = json.loads(value)
            out[name] = value
        return out

    @property
    def plan(self) -> dict[str, Any]:
        """The plan as published (the release's plan attribute, a plain dict: what the dry run's
        JSON calls ``plan``); :meth:`noise_plan` gives the
        :class:`~mvg_dask.plan.noise_plan.NoisePlan` object rebuilt from it."""
        self.check()
        return dict(json.loads(self._ds.attrs[PLAN_ATTR]))

    @property
    def variable(self) -> str:
        """Name of the privatized variable: the query's output (``covariance``, or an identity
        release's input variable; :func:`mvg_dask.release_format.released_variable`). With a
        noisy record count the plan's Gaussian noise is that of ``gram`` instead
        (:func:`mvg_dask.release_format.gaussian_variable`)."""
        return released_variable(self._ds.attrs)

    def noise_std(self, variable: str | None = None) -> xr.DataArray:
        """Standard deviation of the noise of each released entry, as published
        (:func:`mvg_dask.interactive.read.noise_std`): unimodal noise ``sqrt(Sigma_ii)`` for every
        entry of row ``i``; a covariance's symmetric noise has its own std on and off the
        diagonal. With a noisy record count the Gaussian noise is that of ``gram`` (the
        default then).

        Returns
        -------
        xarray.DataArray
            Aligned with the released variable.
        """
        return read.noise_std(self._ds, variable)

    def confidence_intervals(
        self, level: float = 0.95, variable: str | None = None, *, simultaneous: bool = False
    ) -> xr.Dataset:
        """Intervals ``value +- z std`` that cover the non-private value with probability
        ``level``: per entry, or with ``simultaneous=True`` every entry at once
        (:func:`mvg_dask.interactive.read.confidence_intervals`)."""
        return read.confidence_intervals(self._ds, level, variable, simultaneous=simultaneous)

    def psd_covariance(self) -> xr.DataArray:
        """The nearest PSD matrix to the released covariance (a new variable; no privacy cost:
        :func:`mvg_dask.interactive.read.psd_covariance`)."""
        return read.psd_covariance(self._ds)

    def shrunk_covariance(self, target: str = "spiked", *, bulk: str = "zero") -> xr.DataArray:
        """The released covariance shrunk with the noise's public std (a new variable; the
        spiked shrinker helps a spiked spectrum and hurts a flat one, the identity target suits a
        flat one: :func:`mvg_dask.interactive.read.shrunk_covariance`)."""
        return read.shrunk_covariance(self._ds, target, bulk=bulk)

    def estimate_covariance(
        self, *, candidates: Sequence[str] | None = None, probes: int = 4, seed: int = 0
    ) -> xr.DataArray:
        """The covariance estimate that chooses for itself: the raw release, PSD projection,
        shrinkers or nuclear-norm projection with the smallest unbiased risk estimate under the
        published noise law (a new variable; no privacy cost:
        :func:`mvg_dask.interactive.choose.estimate_covariance`)."""
        return choose.estimate_covariance(self._ds, candidates=candidates, probes=probes, seed=seed)

    def correlation(self, level: float = 0.95) -> xr.Dataset:
        """Correlations with approximate per-entry intervals (new variables; no privacy cost:
        :func:`mvg_dask.interactive.read.correlation`)."""
        return read.correlation(self._ds, level)

    def noise_plan(self) -> Any:
        """The :class:`~mvg_dask.plan.noise_plan.NoisePlan` of this release (checked against
        its published ``row_cov``)."""
        return read.release_noise_plan(self._ds)

    def regression(self, intercept: bool = False, ridge: float | str = "adassp") -> xr.DataArray:
        """Ridge regression of the release's target on the other features from the released
        ``moment`` (:func:`mvg_dask.plan.estimators.moment_regression`; no privacy cost).

        Parameters
        ----------
        intercept : bool, default False
            Fit an intercept (the constant term ``"1"``, not penalised).
        ridge : float or "adassp", default "adassp"
            ``lambda >= 0``, or ``4 sqrt(E ||E_PP||_F^2)`` from the public noise std of the
            predictors' block (:func:`mvg_dask.plan.estimators.adassp_ridge`).

        Returns
        -------
        xarray.DataArray
            ``coefficients`` over ``term`` (the predictors, then ``"1"``; features by their
            labels, or ``"#i"`` by position when the input had no feature names), the ``ridge``
            used and the ``target`` as attributes. A grouped release (``group_by``) gets one fit
            per group, from the group's moment divided by its noisy share ``N_g / N`` (the
            corner): coefficients over ``group`` and ``term``, one ``ridge`` per group.
        """
        ds = self.check()
        target = ds.attrs.get(TARGET_ATTR)
        if MOMENT not in ds.data_vars or target is None:
            raise ValueError(
                "regression needs a second-moment release with a target (a 'moment' variable "
                f"and the {TARGET_ATTR} attribute: query {{regression: {{target: ...}}}})"
            )
        moment = ds[MOMENT]
        std = self.noise_std(MOMENT).values if ridge == "adassp" else None
        term_dim = moment.dims[-2]
        if term_dim in moment.coords:
            labels = [str(v) for v in moment[term_dim].values]
        else:  # an input without feature names: the features by position, "#0", "#1", ...
            labels = [*(f"#{i}" for i in range(moment.shape[-1] - 1)), CONSTANT_TERM]
            target = f"#{json.loads(ds.attrs[PLAN_ATTR])['query']['target']}"
        query = json.loads(ds.attrs[PLAN_ATTR])["query"]
        centre, scale = query.get("centre"), float(query.get("scale", 1.0))
        source = ds.attrs.get(RELEASE_ID_ATTR)
        if GROUP_DIM not in moment.dims:
            fit = moment_regression(
                moment.values,
                labels,
                str(target),
                intercept=intercept,
                noise_std=std,
                ridge=ridge,
                centre=centre,
                scale=scale,
            )
            attrs = {"estimator": "regression", "target": fit.target, "ridge": fit.ridge}
            attrs["source_release"] = source
            return xr.DataArray(
                fit.coefficients, dims=("term",), coords={"term": list(fit.terms)}, attrs=attrs
            ).rename("coefficients")
        # a grouped release: one fit per group, from that group's moment divided by its noisy
        # share N_g / N (the corner), i.e. the group's own second moment, and its noise std alike
        values = scale_constant(moment.values, 1.0 / scale)  # the moments of [x - c; 1]
        std = None if std is None else scale_constant(std, 1.0 / scale)
        shares = values[:, -1, -1]
        fits = [
            moment_regression(
                values[g] / shares[g] if shares[g] > 0 else np.full_like(values[g], np.nan),
                labels,
                str(target),
                intercept=intercept,
                noise_std=None if std is None else std[g] / abs(shares[g]),
                ridge=ridge,
                centre=centre,
            )
            for g in range(values.shape[0])
        ]
        attrs = {"estimator": "regression", "target": fits[0].target}
        attrs |= {"ridge": [f.ridge for f in fits], "source_release": source}
        return xr.DataArray(
            np.stack([f.coefficients for f in fits]),
            dims=(GROUP_DIM, "term"),
            coords={GROUP_DIM: moment[GROUP_DIM].values, "term": list(fits[0].terms)},
            attrs=attrs,
        ).rename("coefficients")

    def covariance(self) -> xr.DataArray:
        """Unbiased ``X X^T / N``: ``(Y Y^T - N Sigma) / N`` from an identity release, the
        released ``covariance`` from a covariance release."""
        return read.covariance_estimate(self._ds)
