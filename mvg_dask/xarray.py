"""The ``.mvg`` accessor on xarray DataArrays and Datasets: release, plan, budget and accuracy.

Importing :mod:`mvg_dask.xarray` registers it (:func:`mvg_dask.api.open_release` does not: the
front ends import downward only, ``cli > xarray > interactive > api``).
The accessor only normalises arguments; the work is done by the plain functions of
:mod:`mvg_dask.interactive`::

    import mvg_dask.xarray  # registers .mvg

    ds.mvg.dry_run("out", query="covariance", domain={"box": {"lower": 0, "upper": 1}},
                   privacy={"epsilon": 1, "delta": 1e-6})          # the plan, nothing written
    rel = ds.mvg.release("out", query=..., domain=..., privacy=..., client=client)
    rel.mvg.noise_std()                 # noise std of every entry of the query's output
    rel.mvg.confidence_intervals(0.95)  # value +- z std, per entry
    rel.mvg.confidence_intervals(0.95, simultaneous=True)  # one band for every entry
    rel.mvg.covariance()                # unbiased X X^T / N (identity or covariance release)
    rel.mvg.psd_covariance(), rel.mvg.correlation()  # any covariance-like release
    rel.mvg.regression(intercept=True)  # ridge regression from a release's second moment
    rel.mvg.regression_intervals()      # least squares with intervals from the noise law
    rel.mvg.explained_variance(), rel.mvg.subspace_angle(k=2)  # PCA with intervals
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

import xarray as xr

from mvg_dask.interactive import choose, derived, read, write
from mvg_dask.release_format import (
    PLAN_ATTR,
    PREFIX,
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

    def correlation(self, level: float = 0.95, *, method: str = "floor") -> xr.Dataset:
        """Correlations in ``[-1, 1]`` (never NaN) from the floored (``method="floor"``) or
        PSD-projected (``"psd"``) covariance, with approximate per-entry intervals and a warning
        where the noise dominates (new variables; no privacy cost:
        :func:`mvg_dask.interactive.read.correlation`)."""
        return read.correlation(self._ds, level, method=method)  # type: ignore[arg-type]

    def noise_plan(self) -> Any:
        """The :class:`~mvg_dask.plan.noise_plan.NoisePlan` of this release (checked against
        its published ``row_cov``)."""
        return read.release_noise_plan(self._ds)

    def regression(
        self,
        intercept: bool = False,
        ridge: float | str = "adassp",
        *,
        target: str | None = None,
    ) -> xr.DataArray:
        """Ridge regression of a target on the other features from the release's second
        moment (:func:`mvg_dask.interactive.derived.regression`; no privacy cost).

        Parameters
        ----------
        intercept : bool, default False
            Fit an intercept (the constant term ``"1"``, not penalised): a regression or
            centered-covariance release (a covariance release has no means).
        ridge : float or "adassp", default "adassp"
            ``lambda >= 0``, or ``4 sqrt(E ||E_PP||_F^2)`` from the public noise std of the
            predictors' block (:func:`mvg_dask.plan.estimators.adassp_ridge`).
        target : str, optional
            The target feature (default: a regression release's target).

        Returns
        -------
        xarray.DataArray
            ``coefficients`` over ``term`` (the predictors, then ``"1"``; features by their
            labels, or ``"#i"`` by position when the input had no feature names), the ``ridge``
            used and the ``target`` as attributes. A grouped release (``group_by``) gets one fit
            per group, from the group's moment divided by its noisy share ``N_g / N`` (the
            corner): coefficients over ``group`` and ``term``, one ``ridge`` per group.
        """
        return derived.regression(self._ds, target, intercept=intercept, ridge=ridge)

    def regression_intervals(
        self,
        level: float = 0.95,
        *,
        target: str | None = None,
        intercept: bool = True,
        ridge: float | str = 0.0,
        draws: int = derived.DEFAULT_DRAWS,
        seed: int | None = 0,
    ) -> xr.Dataset:
        """Regression coefficients (least squares by default) with intervals from the
        release's noise law (an exact Gaussian pivot, test-inverted; unbounded where the noise
        swamps the predictors: :func:`mvg_dask.interactive.derived.regression_intervals`)."""
        return derived.regression_intervals(
            self._ds, level, target, intercept=intercept, ridge=ridge, draws=draws, seed=seed
        )

    def explained_variance(
        self, level: float = 0.95, *, draws: int = derived.DEFAULT_DRAWS, seed: int | None = 0
    ) -> xr.Dataset:
        """PCA's explained-variance fractions of the release's covariance with intervals
        (:func:`mvg_dask.interactive.derived.explained_variance`)."""
        return derived.explained_variance(self._ds, level, draws=draws, seed=seed)

    def subspace_angle(
        self,
        k: int = 1,
        level: float = 0.95,
        *,
        draws: int = derived.DEFAULT_DRAWS,
        seed: int | None = 0,
    ) -> xr.Dataset:
        """The top-``k`` principal directions and a ``level`` upper bound on their largest
        principal angle to the non-private ones
        (:func:`mvg_dask.interactive.derived.subspace_angle`)."""
        return derived.subspace_angle(self._ds, k, level, draws=draws, seed=seed)

    def covariance(self) -> xr.DataArray:
        """Unbiased ``X X^T / N``: ``(Y Y^T - N Sigma) / N`` from an identity release, the
        released ``covariance`` from a covariance release."""
        return read.covariance_estimate(self._ds)
