"""The ``.mvg`` accessor on released xarray Datasets: provenance, plan and noise, in a notebook.

Importing :mod:`mvg_dask.xarray` (or :func:`mvg_dask.api.open_release`) registers it::

    ds = mvg_dask.api.open_release("out/ctg-covariance.zarr")
    ds.mvg.provenance          # the mvg_dask_* attributes, typed
    ds.mvg.plan                # the full noise plan (dict)
    ds.mvg.noise_std()         # standard deviation of the noise of every released entry
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import xarray as xr

from mvg_dask.errors import IncompleteReleaseError

_PREFIX = "mvg_dask_"


@xr.register_dataset_accessor("mvg")
class MvgAccessor:
    """Read-side helpers for a dataset written by an mvg_dask release.

    Parameters
    ----------
    ds : xarray.Dataset
        A released dataset.
    """

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def check(self) -> xr.Dataset:
        """Return the dataset if it is a complete release, else raise IncompleteReleaseError."""
        status = self._ds.attrs.get(f"{_PREFIX}status")
        if status != "complete":
            raise IncompleteReleaseError(f"not a complete mvg_dask release (status: {status!r})")
        return self._ds

    @property
    def provenance(self) -> dict[str, Any]:
        """The ``mvg_dask_*`` attributes without their prefix (JSON strings decoded)."""
        out: dict[str, Any] = {}
        for key, value in self._ds.attrs.items():
            if not key.startswith(_PREFIX) or key == f"{_PREFIX}plan":
                continue
            name = key.removeprefix(_PREFIX)
            if isinstance(value, str) and value[:1] in "{[":
                value = json.loads(value)
            out[name] = value
        return out

    @property
    def plan(self) -> dict[str, Any]:
        """The noise plan the release was made with."""
        self.check()
        return dict(json.loads(self._ds.attrs[f"{_PREFIX}plan"]))

    @property
    def variable(self) -> str:
        """Name of the privatized variable."""
        query = self._ds.attrs.get(f"{_PREFIX}query")
        if query == "covariance":
            return "covariance"
        return str(self._ds.attrs[f"{_PREFIX}input_variable"])

    def noise_std(self) -> xr.DataArray:
        """Standard deviation of the noise added to each released entry.

        Unimodal noise: ``sqrt(Sigma_ii)`` for every record of feature ``i``; equi-modal noise:
        ``sqrt(Sigma_ii Sigma_jj)``.

        Returns
        -------
        xarray.DataArray
            Broadcastable against the released variable.
        """
        self.check()
        ds = self._ds
        d = np.sqrt(np.diag(ds["row_cov"].values))
        rows, cols = ds["row_cov"].dims
        if "col_cov" in ds:
            c = np.sqrt(np.diag(ds["col_cov"].values))
            return xr.DataArray(
                np.outer(d, c),
                dims=(rows, cols),
                coords={k: ds.coords[k] for k in (rows, cols) if k in ds.coords},
            )
        var = ds[self.variable]
        feature_dim = str(rows).removesuffix("_row")
        coords = {feature_dim: ds.coords[feature_dim]} if feature_dim in ds.coords else {}
        return xr.DataArray(d, dims=(feature_dim,), coords=coords).broadcast_like(var)
