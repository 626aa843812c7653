"""Plain functions behind the ``.mvg`` xarray accessor (:mod:`mvg_dask.xarray`).

The accessor only normalises its arguments and calls these (as pint-xarray's accessor calls
``conversion.py``). Its two sides are two modules that do not import each other:

* :mod:`mvg_dask.interactive.write`: release an xarray object
  (:func:`~mvg_dask.interactive.write.release_xarray`,
  :func:`~mvg_dask.interactive.write.dry_run_xarray`), its input written to a new Zarr store
  first;
* :mod:`mvg_dask.interactive.read`: read a complete release
  (:func:`~mvg_dask.interactive.read.noise_std`,
  :func:`~mvg_dask.interactive.read.confidence_intervals`,
  :func:`~mvg_dask.interactive.read.release_noise_plan`, the covariance estimators) and the
  ledger (:func:`~mvg_dask.interactive.read.budget_table`);
* :mod:`mvg_dask.interactive.derived`: what analysts derive (regression, PCA) with intervals
  from the release's noise law.
"""

from mvg_dask.interactive.read import (
    budget_table,
    confidence_intervals,
    correlation,
    covariance_estimate,
    distinct_noisy_entries,
    gaussian_variable,
    noise_std,
    psd_covariance,
    release_noise_plan,
    shrunk_covariance,
)
from mvg_dask.interactive.write import (
    DEFAULT_RECORD_CHUNK,
    dry_run_xarray,
    release_xarray,
    select_variable,
    write_input,
)

__all__ = [
    "DEFAULT_RECORD_CHUNK",
    "budget_table",
    "confidence_intervals",
    "correlation",
    "covariance_estimate",
    "distinct_noisy_entries",
    "dry_run_xarray",
    "gaussian_variable",
    "noise_std",
    "psd_covariance",
    "release_noise_plan",
    "release_xarray",
    "select_variable",
    "shrunk_covariance",
    "write_input",
]
