"""Exp. I's ``exact-regression`` row is the product's regression release.

Its plan is what ``api.dry_run`` gives for the spec a data owner writes
(``query: {regression: {target: drinks}}`` on the Liver store), its moment is what a real
release of that spec publishes, and its fit is ``ds.mvg.regression(intercept=True)``'s. The
rows that were there before are unchanged: the ``exact-moments`` row reproduces the committed
results file bit for bit at 300 trials.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.noise import NoiseKey
from mvg_dask.plan.lattice import NoiseKind
from mvg_dask_lab.experiments.regression import METHODS, REGRESSION_RELEASE, RegressionExperiment

SEED = 20261126
TAU = 0.75
REPO = Path(__file__).resolve().parents[1]


def _method(key: str) -> Any:
    (method,) = [m for m in METHODS if m.key == key]
    return method


def _liver_store(tmp_path: Path, exp: RegressionExperiment) -> Path:
    """The private Liver records in a Zarr store, records along ``record``, one chunk."""
    ds = exp.dataset
    names = [str(v) for v in ds.feature_names]
    return Path(
        write_matrix(ds.X, tmp_path / "liver.zarr", record_chunk=ds.n_records, feature_names=names)
    )


def _owner_spec(store: Path, out: Path, epsilon: float, noise: NoiseKind) -> dict[str, Any]:
    """The spec a data owner writes for the release (written out here, not taken from the
    experiment): the regression query on the declared box, the binary allocation on ALT
    (feature 2), the target (feature 5) and the constant term (the moment's last, 6)."""
    return {
        "name": "liver",
        "input": {"store": str(store), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": {"regression": {"target": "drinks"}},
        "mechanism": {
            "allocation": {"strategy": "binary", "important": [2, 5, 6], "share": TAU},
            "noise": noise,
        },
        "privacy": {"epsilon": epsilon, "delta": 1 / 248},
        "output": {"store": str(out)},
    }


@pytest.mark.parametrize("noise", ["float", "lattice"])
def test_row_is_planned_as_the_dry_run_plans_the_owners_spec(tmp_path: Path, noise) -> None:
    exp = RegressionExperiment(noise=noise)
    delta = 1 / exp.dataset.n_records
    spec = _owner_spec(_liver_store(tmp_path, exp), tmp_path / "out.zarr", 1.0, noise)
    theirs = api.dry_run(spec)
    ours = exp.regression_release_plan(1.0, delta, TAU)
    assert ours.query == theirs.query == exp.regression_query
    assert ours.query.kind == "regression" and ours.query.target == 5
    assert ours.query.centre == (0.5,) * 6  # the declared box's centre
    np.testing.assert_array_equal(ours.domain.lower, theirs.domain.lower)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(ours.domain.upper, theirs.domain.upper)  # type: ignore[attr-defined]
    assert ours.algorithm == theirs.algorithm == "symmetric"
    assert ours.lattice_context == theirs.lattice_context
    assert ours.public_noise_dict() == theirs.public_noise_dict()
    # the runner releases with exactly that noise plan
    used = exp._binary_plan(_method(REGRESSION_RELEASE), 1.0, delta, TAU)
    assert used.to_dict() == theirs.noise_plan().to_dict()
    # centred: a smaller sensitivity than the exact-moments row's uncentred [x; y; 1]
    uncentred = exp._binary_plan(_method("exact-moments"), 1.0, delta, TAU)
    assert used.release_sensitivity == pytest.approx(uncentred.release_sensitivity)  # both mu
    assert np.max(used.released_entry_std()) < np.max(uncentred.released_entry_std())


def test_row_moment_and_fit_are_the_releases(tmp_path: Path) -> None:
    """A real float release of the owner's spec: at epsilon = 1e9 its moment is the row's
    (to its noise, std < 1e-6); at epsilon = 1 the row's fit of the published moment is
    ``ds.mvg.regression(intercept=True)`` of that release, and the published moment lies
    within 6 noise std of the row's moment in every entry (alpha < 1e-7 for Gaussian noise,
    seed fixed)."""
    exp = RegressionExperiment()
    store = _liver_store(tmp_path, exp)
    delta = 1 / exp.dataset.n_records
    for epsilon, name in ((1e9, "huge"), (1.0, "one")):
        spec = _owner_spec(store, tmp_path / f"{name}.zarr", epsilon, "float")
        api.release(spec, seed=SEED, progress=False)
        rel = api.open_release(str(tmp_path / f"{name}.zarr"))
        published = rel["moment"].values
        plan = exp._binary_plan(_method(REGRESSION_RELEASE), epsilon, delta, TAU)
        std = plan.released_entry_std()
        np.testing.assert_array_equal(rel.mvg.noise_std("moment").values, std)
        assert np.all(np.abs(published - exp.regression_moment) <= 6 * std)
        if epsilon > 1:  # the moments agree to a few 1e-6 (the noise's std)
            assert np.max(std) < 1e-6
            continue
        coef = rel.mvg.regression(intercept=True)
        assert list(coef["term"].values) == [*exp.dataset.feature_names[:5], "1"]
        pred = exp.test_x @ coef.values[:-1] + coef.values[-1]
        rmse = float(np.sqrt(np.mean((pred - exp.test_y) ** 2)))
        assert exp._plan_errors(_method(REGRESSION_RELEASE), plan, published[None])[0] == (
            pytest.approx(rmse, rel=1e-12)
        )


def test_exact_moments_row_reproduces_the_committed_results() -> None:
    """The row that was there before is untouched: at epsilon = 1, 300 trials, seed 0 (the
    committed run), every tau's mean RMSE is the committed file's to its 12 digits."""
    exp = RegressionExperiment()
    path = REPO / "notebooks" / "paper" / "regression_tau_sweep.csv"
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    committed = {
        float(r["tau"]): float(r["mean"])
        for r in rows
        if r["method"] == "exact-moments" and float(r["epsilon"]) == 1.0
    }
    assert len(committed) == 5
    key = (
        NoiseKey.from_seed(0)
        .derive("mvg_dask/experiments/regression")
        .derive("exact-moments/epsilon=1.0")
    )
    method = _method("exact-moments")
    for tau, mean in committed.items():
        ev = exp.evaluate(method, 1.0, tau, 300, key)
        assert float(f"{np.mean(ev.errors):.12g}") == pytest.approx(mean, rel=1e-11), tau
