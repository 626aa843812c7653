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
# # A stream: 30 periods over a growing store on one budget
#
# A nightly job over a store that grows can release its query as a *stream*
# (docs/guide/streams.md): each run releases the next period, the query over every record so
# far, and the whole stream is one Gaussian mechanism, charged once. Here a synthetic store grows
# by 400 records a period for 30 periods, and the covariance `X Xᵀ / N` is released every period
# three ways, each at the same total budget (ε, δ) = (1, 10⁻⁶):
#
# * **the stream**, square-root factorization (and the binary tree with Honaker's estimator);
# * **naive re-release**: a one-shot release every period over all records so far, the budget
#   split across the 30 releases by Gaussian composition (μ / √30 each);
# * **one release at the whole budget**: what a single release would give, which a nightly job
#   cannot have every night; the floor.
#
# The releases are seeded (reproducible, so NOT private) and charged to no ledger: this is a
# demonstration of the accuracy.

# %%
import logging
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from scipy.optimize import brentq

import mvg_dask.xarray  # noqa: F401  (registers the .mvg accessor)
from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.privacy.calibration import analytic_gaussian_delta, analytic_gaussian_mu
from mvg_dask.privacy.continual import compare_at_budget

# 120 releases below, none charged: keep their "not charged to any budget" notices quiet
logging.getLogger("mvg_dask").setLevel(logging.ERROR)

WORK = Path("scratch/streams")
shutil.rmtree(WORK, ignore_errors=True)
WORK.mkdir(parents=True)

M, T, PER_PERIOD = 6, 30, 400
EPSILON, DELTA = 1.0, 1e-6
rng = np.random.default_rng(7)
# records in [0, 1] whose mean drifts slowly over the periods
drift = np.linspace(0.3, 0.6, T)
X = np.concatenate(
    [np.clip(rng.normal(drift[t], 0.15, (M, PER_PERIOD)), 0, 1) for t in range(T)], axis=1
)

# naive re-release: 30 Gaussian mechanisms of mu / sqrt(30) compose to mu (Gaussian DP)
mu = analytic_gaussian_mu(EPSILON, DELTA)
mu_each = mu / np.sqrt(T)
eps_each = brentq(lambda e: analytic_gaussian_delta(e, mu_each) - DELTA, 1e-9, EPSILON)
print(f"one release: mu = {mu:.3f}; naive: {T} releases of mu = {mu_each:.3f}")
print(f"each naive release at eps = {eps_each:.4f}, delta = {DELTA:g}")


def spec(name, out, epsilon, stream=None):
    s = {
        "name": name,
        "input": {"store": str(WORK / "in.zarr"), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": "covariance",
        "privacy": {"epsilon": epsilon, "delta": DELTA, "neighbours": "replace-one"},
        "output": {"store": str(WORK / out)},
    }
    if stream:
        s["stream"] = {"horizon": T, "factorization": stream, "max_records": T * PER_PERIOD}
    return s


# %% [markdown]
# ## The stream's plan, before anything runs
# The dry run of the stream prints its plan, this period's noise std and the comparison at the
# same budget; every number is computed from the plan and the factorizations.

# %%
write_matrix(X[:, :PER_PERIOD], WORK / "in.zarr", record_chunk=PER_PERIOD)
preview = api.stream_dry_run(spec("nightly", "sqrt", EPSILON, "square-root"))
print(preview.text)

# %% [markdown]
# ## Thirty nights
# Each night appends the day's records, then releases: the stream's next period (two
# factorizations), the naive re-release, and (for comparison only) one release at the whole
# budget. The error is the root mean square over the matrix's entries, against numpy's
# `X Xᵀ / N` of the clipped records so far.

# %%
errors = {"square root": [], "tree (Honaker)": [], "naive re-release": [], "one release": []}
stds = {"square root": [], "tree (Honaker)": []}
specs = {
    "square root": spec("nightly", "sqrt", EPSILON, "square-root"),
    "tree (Honaker)": spec("nightly-tree", "tree", EPSILON, "tree"),
}


def rmse(released, truth):
    return float(np.sqrt(np.mean((np.asarray(released) - truth) ** 2)))


for t in range(1, T + 1):
    n = t * PER_PERIOD
    shutil.rmtree(WORK / "in.zarr")
    write_matrix(X[:, :n], WORK / "in.zarr", record_chunk=PER_PERIOD)  # the night's append
    truth = X[:, :n] @ X[:, :n].T / n
    for name, s in specs.items():
        result = api.release(s, seed=t, period_label=f"night {t}", progress=False)
        night = api.open_release(s["output"]["store"], period=result.period)
        errors[name].append(rmse(night["covariance"], truth))
        stds[name].append(float(np.max(night.mvg.noise_std())))
    for name, eps in (("naive re-release", eps_each), ("one release", EPSILON)):
        out = f"{name.split()[0]}-{t}"
        seed = (1000 if name.startswith("naive") else 2000) + t  # independent noise
        api.release(spec(out, out, eps), seed=seed, progress=False)
        errors[name].append(rmse(api.open_release(str(WORK / out))["covariance"], truth))
print({k: f"{np.mean(v):.2e}" for k, v in errors.items()})

# %% [markdown]
# ## Error per period
# The stream's error stays a small factor above a single release's at the whole budget, every
# night, while naive re-release pays √30 in noise. The published std of each period (dotted)
# is a function of the plan: it is what the measured error scatters around.

# %%
fig, ax = plt.subplots(figsize=(8, 4.5))
nights = np.arange(1, T + 1)
style = {
    "square root": ("C0", "o"),
    "tree (Honaker)": ("C2", "^"),
    "naive re-release": ("C3", "s"),
    "one release": ("C7", "D"),
}
for name, values in errors.items():
    colour, marker = style[name]
    ax.plot(nights, values, marker=marker, color=colour, label=name, markersize=4)
for name, values in stds.items():
    ax.plot(nights, values, ":", color=style[name][0], label=f"{name}: published std (largest)")
ax.set_yscale("log")
ax.set_xlabel("period (night)")
ax.set_ylabel("RMSE of X Xᵀ / N (per entry)")
ax.set_title(f"{T} periods at (ε, δ) = ({EPSILON:g}, {DELTA:g}) in total")
ax.legend(fontsize=8, ncol=2)
fig.tight_layout()

# %% [markdown]
# ## The ratios, measured and planned
# Measured: the median over the nights of each method's error over a single release's. Planned:
# the dry run's worst-period std ratio at the same budget (the table above).

# %%
one = np.array(errors["one release"])
for name in ("square root", "tree (Honaker)", "naive re-release"):
    print(f"{name:>18}: median error ratio {np.median(np.array(errors[name]) / one):5.2f}")
print()
for row in compare_at_budget(T, EPSILON, DELTA):
    print(f"{row.method:>32}: worst-period std ratio {row.ratio:5.2f}")
print(f"{'this stream (with its lattice)':>32}: worst-period std ratio {preview.worst_ratio:5.2f}")
