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
# # Quickstart: a private covariance of the CTG data, from xarray
#
# The Cardiotocography data (21 features of 2,126 records, scaled to [0, 1]) ships with the
# package. We hold it as an `xarray.Dataset`, look at the release plan before anything runs,
# release its covariance `X Xᵀ / N` with the MVG mechanism on a local Dask cluster, and compare
# the release with the non-private answer. The release is charged to a privacy ledger.
#
# Everything is written under `scratch/quickstart/` (relative to where the notebook runs).

# %%
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from distributed import Client
from scipy import stats

import mvg_dask.xarray  # noqa: F401  (registers the .mvg accessor)
from mvg_dask.datasets import load_ctg
from mvg_dask.engine.cluster import local_cluster
from mvg_dask.engine.ledger import open_ledger, summary_text

WORK = Path("scratch/quickstart")
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

# %% [markdown]
# ## The data as an xarray Dataset
# Features along `feature`, records along `record` (either order works).

# %%
ctg = load_ctg()
ds = xr.Dataset(
    {"X": (("feature", "record"), ctg.X)},
    coords={"feature": list(ctg.feature_names), "record": np.arange(ctg.n_records)},
)
ds

# %% [markdown]
# ## The plan, before anything runs
# The spec's sections are keyword arguments (the schema and errors of a YAML spec). The record
# domain is declared, never computed from the data. `dry_run` writes, reads and charges nothing;
# it shows the mechanism, the sensitivity, the noise per entry and the budget left afterwards.

# %%
release_args = {
    "name": "ctg-covariance",
    "release_id": "ctg-covariance-1",  # a fixed id: re-running resumes or finds it complete
    "query": "covariance",
    "domain": {"box": {"lower": 0.0, "upper": 1.0}},
    "mechanism": {"algorithm": "equi-modal", "calibration": "exact"},
    "privacy": {"epsilon": 1.0, "delta": 1e-6},
    "ledger": {
        "path": str(WORK / "ledger.sqlite"),
        "dataset": "ctg",
        "budget": {"epsilon": 4.0, "delta": 1e-5},
    },
    "record_chunk": 250,  # 9 chunks of records: one task each
}
ds.mvg.dry_run(WORK, **release_args)

# %% [markdown]
# ## A local Dask cluster
# Two single-threaded worker processes on loopback; the client's summary links the dashboard.

# %%
cluster = local_cluster(2)
client = Client(cluster)
print("dashboard:", client.dashboard_link)
client

# %% [markdown]
# ## The release
# `release` writes the Dataset to a new Zarr store in `WORK` (the curator's copy of the private
# data), reserves the budget, computes on the cluster with a progress bar, commits and returns
# the opened release.

# %%
rel = ds.mvg.release(WORK, client=client, **release_args)
rel

# %% [markdown]
# ## How far is it from the non-private answer?
# The noise of every entry is Gaussian with a standard deviation the plan states
# (`rel.mvg.noise_std()`), so the error divided by it should look standard normal, and 95 %
# intervals `value ± 1.96 std` should cover the true entries about 95 % of the time.

# %%
truth = xr.DataArray(
    ctg.X @ ctg.X.T / ctg.n_records,
    dims=("feature_row", "feature_col"),
    coords=rel["covariance"].coords,
)
std = rel.mvg.noise_std()
error = rel["covariance"] - truth
ci = rel.mvg.confidence_intervals(0.95)
covered = float(((ci["lower"] <= truth) & (truth <= ci["upper"])).mean())
print(f"noise std per entry: {float(std.min()):.3g} .. {float(std.max()):.3g}")
print(
    f"largest |error|: {float(abs(error).max()):.3g}; entries of the covariance up to "
    f"{float(truth.max()):.3g}"
)
print(f"95% intervals cover {covered:.1%} of the {truth.size} entries")

fig, axes = plt.subplots(1, 3, figsize=(14, 4))
for ax, values, title, cmap in (
    (axes[0], truth.values, "non-private X Xᵀ / N", "viridis"),
    (axes[1], std.values, "noise std per entry", "magma"),
):
    fig.colorbar(ax.imshow(values, cmap=cmap), ax=ax)
    ax.set_title(title)
z = (error / std).values.ravel()
axes[2].hist(z, bins=30, density=True, alpha=0.7, label="error / std")
grid = np.linspace(-4, 4, 200)
axes[2].plot(grid, stats.norm.pdf(grid), label="N(0, 1)")
axes[2].set_title("standardised error")
axes[2].legend()
for ax in axes[:2]:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()

# %% [markdown]
# ## The ledger (curator side)
# The budget table is what an analyst may be told; the ledger's text is the curator's view (it
# also holds curator-side facts such as the exact clipped count, which no output carries).

# %%
rel.mvg.budget(WORK / "ledger.sqlite")

# %%
with open_ledger(WORK / "ledger.sqlite", create=False) as book:
    print(summary_text(book.summary()))

# %% [markdown]
# The next release's plan shows what it would leave:

# %%
next_release = {
    **release_args,
    "release_id": "ctg-covariance-2",
    "privacy": {"epsilon": 2.0, "delta": 1e-6},
}
ds.mvg.dry_run(WORK, **next_release)

# %%
client.close()
cluster.close()
