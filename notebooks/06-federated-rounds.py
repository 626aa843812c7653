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
# # Federated learning with private rounds: one horizontal-FL model with `mgm-idn`
#
# Five participants each hold a fifth of the CTG records (2,126 cardiotocograms, 21
# attributes in [0, 1], label "suspect or pathologic"). In each communication round each
# participant samples its records (Poisson, rate 0.25), takes ten gradient steps from the
# global model, clips the accumulated gradient to `[-C, C]` entrywise and uploads it as a
# **round**: a matrix release of declared sensitivity from memory, with lattice noise from the
# keyed generator (docs/guide/rounds.md). The server averages the uploads.
#
# Each participant's training is one **run** of `api.training_run`: its total `(ε, δ)` is split
# over its rounds by dp-accounting's privacy-loss distributions (with the sampling's
# amplification) and charged to the ledger as *one* entry, before round 1. The total here is
# large (ε = 200 per participant) and still IDN's noise is about ten times the clip: compare the
# accuracy with the non-private ceiling and the majority class below, and see
# docs/guide/mgm-experiments.md for every mechanism at the same privacy.

# %%
import matplotlib.pyplot as plt
import numpy as np

from mvg_dask import api
from mvg_dask.errors import BudgetError
from mvg_dask.ledger import open_ledger
from mvg_dask_lab.experiments.fl import (
    HorizontalSetup,
    PackedMLP,
    horizontal_fl,
    load_ctg_binary,
)

data = load_ctg_binary()
setup = HorizontalSetup(hidden=4, rounds=8, local_steps=10, local_lr=2.0, clip=0.1)
model = PackedMLP(data.X.shape[1], setup.hidden, data.classes)
EPSILON, DELTA = 200.0, 1e-5
print(data.description)
print("upload shape:", model.shape, "rounds:", setup.rounds)

# %% [markdown]
# ## One ledger, five datasets, five runs charged before round 1
# Each participant's records are its own dataset with its own budget. A run that does not fit
# is refused here, and nothing is charged.

# %%
book = open_ledger("memory://federated-rounds")
runs = []
for p in range(setup.participants):
    book.ensure_dataset(f"participant-{p}", 250.0, DELTA, "add-remove")
    runs.append(
        api.training_run(
            shape=model.shape,
            rounds=setup.rounds,
            epsilon=EPSILON,
            delta=DELTA,
            calibration="mgm-idn",
            clip=setup.clip,
            sampling_probability=setup.sampling_probability,
            ledger=book,
            dataset=f"participant-{p}",
        )
    )
try:
    api.training_run(
        shape=model.shape, rounds=setup.rounds, epsilon=100.0, delta=DELTA, clip=setup.clip,
        sampling_probability=setup.sampling_probability, ledger=book, dataset="participant-0",
    )  # fmt: skip
except BudgetError as exc:
    print("refused before round 1:", exc)
print(runs[0])
print("per round:", runs[0].plan.loss)
print(f"noise std per entry: {runs[0].plan.std[0, 0]:.3g} (clip {setup.clip})")
book.summary()[0]["spent"]

# %% [markdown]
# ## Training: the participants' rounds
# `train` follows the paper's Type I loop; its `upload` hook is the participant's next round.

# %%
accuracy = horizontal_fl(
    data, setup, lambda p, t, g: runs[p].release(g), seed=0
)  # fmt: skip
ceiling = horizontal_fl(data, setup, None, seed=0)
for run in runs:
    run.close()
print(f"test accuracy with mgm-idn rounds: {accuracy:.3f}; non-private: {ceiling:.3f}; "
      f"majority class: {1 - data.y_test.mean():.3f}")  # fmt: skip

# %% [markdown]
# ## The ledger's spend, round by round
# The ledger holds one committed entry per participant: the run's composed loss. What the first
# `k` rounds spend is the same composition over `k` rounds (at the run's δ).

# %%
spent = [runs[0].spent_epsilon(k) for k in range(setup.rounds + 1)]
entry = book.releases("participant-0")[0]
print(entry.status, "charged epsilon:", round(book.summary()[0]["spent"]["epsilon"], 3))
fig, ax = plt.subplots(figsize=(5, 3))
ax.step(range(setup.rounds + 1), spent, where="post", label="composed (PLD, sampled)")
ax.plot(range(setup.rounds + 1), np.arange(setup.rounds + 1) * spent[1], ":", label="k x one round")
ax.axhline(EPSILON, color="black", lw=0.8, label="run total")
ax.set_xlabel("rounds released")
ax.set_ylabel("ε spent (δ = 1e-5)")
ax.legend(fontsize=8)
fig.tight_layout()
