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
# # The covariance around the mean, and a regression, from one release
#
# `numpy.cov` and `xarray.cov` centre the data; the MVG paper's covariance `X Xᵀ / N` does not.
# `query: centered-covariance` releases the second moment of the augmented records `[x − c; s]`
# (`c` the declared box's centre, `s` a public constant matched to its scale, here 1): its last
# column is the mean about `c` and the rest the second moment, so the mean and the covariance
# around it come from one noisy matrix, at the budget of one release. With a declared response
# feature, `query: {regression: {target: ...}}` is the same release, and `ds.mvg.regression`
# fits a linear model from it (a ridge whose λ comes from the public noise level).
#
# The data: the Liver disorders data (5 blood tests and the number of drinks, 248 patients,
# every feature scaled to [0, 1]).

# %%
import shutil
from pathlib import Path

import numpy as np
import xarray as xr
from distributed import Client

import mvg_dask.xarray  # noqa: F401  (registers the .mvg accessor)
from mvg_dask.datasets import load_liver
from mvg_dask.engine.cluster import local_cluster

WORK = Path("scratch/centered")
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

liver = load_liver()
ds = xr.Dataset(
    {"X": (("feature", "record"), liver.X)},
    coords={"feature": list(liver.feature_names), "record": np.arange(liver.n_records)},
)
common = {
    "domain": {"box": {"lower": 0.0, "upper": 1.0}},
    "privacy": {"epsilon": 4.0, "delta": 1.0 / liver.n_records**2},
    "ledger": {
        "path": str(WORK / "ledger.sqlite"),
        "dataset": "liver",
        "budget": {"epsilon": 8.0, "delta": 2.0 / liver.n_records**2},
    },
}

# %% [markdown]
# ## The plan
# Two stages: one Gram pass over the augmented records, then the noise on the
# `(m + 1) × (m + 1)` moment. Nothing is read, written or charged by the dry run.

# %%
centered = {"name": "liver-centered", "release_id": "liver-centered-1", **common}
ds.mvg.dry_run(WORK, query="centered-covariance", **centered)

# %% [markdown]
# ## The release: `moment`, `mean` and `covariance`

# %%
cluster = local_cluster(2)
client = Client(cluster)
rel = ds.mvg.release(WORK, query="centered-covariance", client=client, progress=False, **centered)
rel

# %% [markdown]
# The mean's noise std is exact (a column of the moment); the covariance's is the delta method's
# and says so. Against numpy on the data:

# %%
X = liver.X
mean_err = rel["mean"].values - X.mean(axis=1)
cov_err = rel["covariance"].values - np.cov(X, bias=True)
print("mean: error / std", np.round(mean_err / rel.mvg.noise_std("mean").values, 2))
cov_std = rel.mvg.noise_std("covariance")
print(cov_std.attrs["approximate"])
print("covariance: RMS of error / std", float(np.sqrt(np.mean((cov_err / cov_std.values) ** 2))))

# %%
import matplotlib.pyplot as plt

upper = np.triu_indices(X.shape[0])
fig, ax = plt.subplots(figsize=(5, 4))
ax.errorbar(
    np.cov(X, bias=True)[upper],
    rel["covariance"].values[upper],
    yerr=1.96 * cov_std.values[upper],
    fmt="o",
    ms=3,
)
lim = ax.get_xlim()
ax.plot(lim, lim, "k:", lw=1)
ax.set(xlabel="numpy.cov(X, bias=True)", ylabel="released covariance (± 1.96 std)")
ax.set_title("Liver, ε = 4: the covariance around the mean")
plt.show()

# %% [markdown]
# ## A regression of `drinks` on the blood tests
# Another release (it is charged too), with `drinks` the declared response. The coefficients
# are post-processing of the released moment, with or without an intercept.

# %%
reg = {"name": "liver-regression", "release_id": "liver-regression-1", **common}
rel_r = ds.mvg.release(
    WORK, query={"regression": {"target": "drinks"}}, client=client, progress=False, **reg
)
fit = rel_r.mvg.regression(intercept=True)
design = np.vstack([X[:5], np.ones(liver.n_records)]).T
exact = np.linalg.lstsq(design, X[5], rcond=None)[0]
xr.Dataset({"private": fit, "non-private least squares": ("term", exact)})

# %% [markdown]
# With 248 records the noise is large against `XᵀX / N`: the ridge, set from the public noise
# level so that the fit never divides by the noise, shrinks the coefficients towards zero. The
# paper's Exp. I measures the prediction error of this estimator on a release of this query (the
# `exact-regression` row of the results page, with a binary allocation on ALT, the target and the
# constant), where it beats every other private regressor of the comparison.

# %% [markdown]
# ## Two more queries, planned
# A cross-covariance of the blood tests with `drinks` (`5 × 1`, noise `Σ ⊗ Ψ` with `Σ` on the
# blood tests), and one centered release per site, for a public site label stored beside the
# data (here the first and second half of the records, for illustration). Both are dry runs:
# nothing is read or charged.

# %%
tests = [f for f in liver.feature_names if f != "drinks"]
ds.mvg.dry_run(
    WORK,
    query={"cross-covariance": {"rows": tests, "cols": ["drinks"]}},
    name="liver-cross",
    release_id="liver-cross-1",
    **common,
)

# %%
sites = ds.assign(site=("record", np.where(np.arange(liver.n_records) < 124, "north", "south")))
sites.mvg.dry_run(
    WORK,
    variable="X",
    query="centered-covariance",
    group_by={"variable": "site", "groups": ["north", "south"]},
    name="liver-sites",
    release_id="liver-sites-1",
    **common,
)

# %% [markdown]
# The ledger holds both releases (the dry runs charged nothing):

# %%
rel.mvg.budget(WORK / "ledger.sqlite")

# %%
client.close()
cluster.close()
