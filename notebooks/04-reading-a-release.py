# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python (mvg-dask)
#     language: python
#     name: mvg-dask
# ---

# %% [markdown]
# # Reading a release elsewhere: plain xarray and zarr, and its provenance
#
# A release is an ordinary Zarr v3 group with consolidated metadata: any xarray or zarr reader
# opens it, without mvg_dask. This notebook first makes one (the curator's part), then reads it
# as an analyst would on another machine, with `xarray` and `zarr` only.

# %%
import shutil
from pathlib import Path

from distributed import Client

import mvg_dask.xarray  # noqa: F401  (registers the .mvg accessor)
from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.datasets import load_liver
from mvg_dask.engine.cluster import local_cluster

WORK = Path("scratch/reading")
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

# the curator: an identity release of the Liver data (6 features x 248 records in [0, 1])
liver = load_liver()
store = write_matrix(liver.X, WORK / "liver.zarr", feature_names=liver.feature_names)
spec = api.release_spec(
    name="liver-identity",
    input={"store": store},
    domain={"box": {"lower": 0.0, "upper": 1.0}},
    query="identity",
    privacy={"epsilon": 2.0, "delta": 1.0 / liver.n_records},
    output={"store": str(WORK / "liver-identity.zarr")},
    ledger={
        "path": str(WORK / "ledger.sqlite"),
        "dataset": "liver",
        "budget": {"epsilon": 4.0, "delta": 4.0 / liver.n_records},
    },
)
with local_cluster(2) as cluster, Client(cluster) as client:
    result = api.release(spec, client=client, progress=False)
release_path = WORK / "liver-identity.zarr"
sorted(p.name for p in release_path.iterdir())

# %% [markdown]
# ## The analyst: plain xarray
# `xr.open_zarr(path)` opens it directly, quietly (the release carries consolidated metadata).
# Check `mvg_dask_status` first: only `complete` releases are final.

# %%
import json

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

ds = xr.open_zarr(release_path)
assert ds.attrs["mvg_dask_status"] == "complete"
ds

# %% [markdown]
# ## Provenance
# The `mvg_dask_*` attributes say what was released and how: the query, mechanism and
# calibration, (ε, δ), the neighbour relation, the sensitivities, the declared record domain,
# whether the noise was seeded (a seeded release is **not** private), and the library version.
# None of them depends on the data. The key is never stored, nor any exact count.

# %%
{k.removeprefix("mvg_dask_"): v for k, v in ds.attrs.items() if k != "mvg_dask_plan"}

# %% [markdown]
# The full noise plan is JSON (`mvg_dask_plan`): the noise variances along each direction, the
# allocation, the composition of the budget.

# %%
plan = json.loads(ds.attrs["mvg_dask_plan"])
{
    key: plan[key]
    for key in (
        "calibration",
        "algorithm",
        "epsilon",
        "delta",
        "mahalanobis_sensitivity",
        "implied_epsilon",
        "row_variances",
    )
}

# %% [markdown]
# ## Accuracy from the published noise, by hand
# The noise of the identity release is `Z = A N` with row covariance `Σ = row_cov`: entry
# `(i, j)` has standard deviation `sqrt(Σ_ii)`, so `value ± 1.96 sqrt(Σ_ii)` is a 95 % interval
# for the non-private value.

# %%
sigma = ds["row_cov"].values
std = np.sqrt(np.diag(sigma))
X = ds["X"]
names = [str(name) for name in X["feature"].values]
fig, axes = plt.subplots(1, 2, figsize=(12, 4))
axes[0].bar(names, std)
axes[0].set_ylabel("noise std per entry")
axes[0].set_title(f"noise per feature (ε = {ds.attrs['mvg_dask_epsilon']:g})")
axes[0].tick_params(axis="x", rotation=45)
first = X.isel(record=slice(0, 40)).values
for i in range(first.shape[0]):
    axes[1].errorbar(
        np.arange(40) + i * 0.1,
        first[i],
        yerr=1.96 * std[i],
        fmt=".",
        capsize=1,
        alpha=0.6,
        label=names[i],
    )
axes[1].axhspan(0, 1, color="grey", alpha=0.15, label="record domain")
axes[1].set_title("first 40 released records with 95 % intervals")
axes[1].legend(fontsize=7, ncol=3)
fig.tight_layout()

# %% [markdown]
# ## The same with zarr alone

# %%
import zarr

group = zarr.open_group(release_path, mode="r")
print("status:", group.attrs["mvg_dask_status"], "| release:", group.attrs["mvg_dask_release_id"])
for name, arr in sorted(group.arrays()):
    print(f"{name:16} {arr.shape!s:12} {arr.dtype}")

# %% [markdown]
# ## With mvg_dask installed
# `api.open_release` refuses an incomplete release, and the `.mvg` accessor gives the same
# numbers as above, and an unbiased covariance estimate `(Y Yᵀ - N Σ) / N`: unbiased, but at
# this ε with 248 records its entries are noisy (a diagonal entry may even come out negative).

# %%
rel = api.open_release(result.output)
assert np.allclose(rel.mvg.noise_std().isel(record=0).values, std)
intervals = rel.mvg.confidence_intervals(0.95).isel(record=slice(0, 3))
intervals.to_dataframe()[["value", "lower", "upper"]]

# %%
rel.mvg.covariance().round(3).to_pandas()
