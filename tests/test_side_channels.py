"""The engine at its edges: add-remove covariance, retries, one-line data errors, the scheduler
address from the environment."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.errors import ReleaseError
from mvg_dask.plan import BoxDomain, Directions, L2BallDomain, build_noise_plan
from mvg_dask.plan.queries import CovarianceQuery
from mvg_dask.privacy import calibration as cal
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec


def _ledger(tmp_path, budget: float = 10.0) -> dict:
    return {
        "path": str(tmp_path / "l.sqlite"),
        "dataset": "d",
        "budget": {"epsilon": budget, "delta": 1e-4},
    }


# -- add-remove covariance ------------------------------------------------------------------
def _rotation(m: int, seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(m, m)))
    return q


@pytest.mark.parametrize(("seed", "n0"), list(itertools.product(range(4), [1, 250])))
def test_add_remove_delta_m_bounds_the_added_record(seed, n0):
    """f(X) = X X^T / N0 changes by x x^T / N0 when x is added; whitened by Sigma (equi-modal
    noise) its Frobenius norm is x^T Sigma^-1 x / N0, a convex function of x: over a box its
    maximum is at a vertex (brute force, an independent check of the plan's bound)."""
    m = 4
    rng = np.random.default_rng(seed)
    lo = -rng.uniform(0, 1, m)
    hi = rng.uniform(0.1, 1, m)
    dom = BoxDomain.create(lo, hi, m)
    q = CovarianceQuery(features=m, records=n0, records_known=False)
    plan = build_noise_plan(
        q,
        dom,
        epsilon=1.0,
        delta=1e-5,
        algorithm="equi-modal",
        directions=Directions.from_matrix(_rotation(m, seed)),
        neighbours="add-remove",
    )
    P = plan.row_precision
    A_inv = np.linalg.cholesky(P).T  # A^-1 with A A^T = Sigma
    worst = 0.0
    for v in itertools.product(*zip(lo, hi, strict=True)):
        x = np.asarray(v)[:, None]
        shift = A_inv @ (x @ x.T / n0) @ A_inv.T
        worst = max(worst, float(np.linalg.norm(shift)))
    assert worst <= plan.mahalanobis_sensitivity * (1 + 1e-9)
    # the bound is the composition's release share: delta_AG(eps, mu_total) <= delta
    assert plan.theorem_check()[0] <= plan.theorem_check()[1]


def test_add_remove_noisy_count_composes_as_gaussian_dp():
    q = CovarianceQuery(features=3, records=1, records_known=False)
    plan = build_noise_plan(
        q,
        L2BallDomain(1.0, 3),
        epsilon=1.0,
        delta=1e-6,
        algorithm="equi-modal",
        neighbours="add-remove",
        count_share=0.1,
    )
    budgets = plan.budgets
    mu = cal.analytic_gaussian_mu(1.0, 1e-6)
    assert budgets.count_mu == pytest.approx(math.sqrt(0.1) * mu)
    assert plan.mahalanobis_sensitivity <= math.sqrt(0.9) * mu * (1 + 1e-12)
    total = math.hypot(plan.mahalanobis_sensitivity, budgets.count_mu)
    assert cal.analytic_gaussian_delta(1.0, total) <= 1e-6


def test_add_remove_paper_calibration_needs_declared_gamma():
    q = CovarianceQuery(features=3, records=1, records_known=False)
    with pytest.raises(ValueError, match=r"declare mechanism\.gamma"):
        build_noise_plan(
            q,
            BoxDomain.create(0, 1, 3),
            epsilon=1.0,
            delta=1e-6,
            algorithm="equi-modal",
            calibration="mvg-thm2",
            neighbours="add-remove",
        )


@pytest.mark.parametrize("n0", [None, 3000])
def test_add_remove_covariance_release(tmp_path, client, n0):
    X = data(4, 3000, seed=21, low=0, high=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=700)
    privacy = {"epsilon": 1e7, "delta": 1e-5, "neighbours": "add-remove"}
    if n0 is not None:
        privacy["records"] = n0
    spec = spec_dict(store, str(tmp_path / "o.zarr"), query="covariance", privacy=privacy)
    res = api.release(spec, client=client, seed=3, progress=False)
    ds = api.open_release(res.output)
    truth = X @ X.T / 3000
    assert np.allclose(ds["covariance"].values, truth, rtol=1e-4)
    if n0 is None:
        assert abs(float(ds["record_count"]) - 3000) < 0.01  # noisy, tiny noise at this epsilon
        assert np.allclose(ds["gram"].values, X @ X.T, rtol=1e-4)
        assert np.allclose(
            ds["covariance"].values, ds["gram"].values / float(ds["record_count"]), rtol=1e-12
        )
    else:
        assert "record_count" not in ds and "gram" not in ds
    assert "3000" not in ds.attrs["mvg_dask_plan"] or n0 == 3000
    dry = api.dry_run(spec).public_dict()
    assert dry["input"]["records"] is None


def test_records_is_refused_under_replace_one(tmp_path):
    from mvg_dask.spec import SpecError, parse_spec

    spec = spec_dict("in.zarr", "o.zarr", query="covariance", privacy={"records": 10})
    with pytest.raises(SpecError, match="records is a public normaliser for add-remove"):
        parse_spec(spec)


# -- retries ---------------------------------------------------------------------------------
def test_retry_of_a_complete_dp_pca_max_pnr_release_exits_cleanly(tmp_path, client):
    X = data(5, 2000, seed=22, low=0, high=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=500)
    spec = spec_dict(
        store,
        str(tmp_path / "o.zarr"),
        query="covariance",
        release_id="nightly-1",
        mechanism={
            "directions": {"method": "dp-pca", "k": 2},
            "allocation": {"strategy": "max-pnr"},
        },
        ledger=_ledger(tmp_path),
    )
    first = api.release(spec, client=client, progress=False)  # a ledger: unseeded
    before = (tmp_path / "l.sqlite").read_bytes()
    again = api.release(spec, client=client, progress=False)  # a scheduled job's retry
    assert again.release_id == first.release_id
    np.testing.assert_array_equal(again.plan.row_variances, first.plan.row_variances)
    np.testing.assert_array_equal(again.plan.directions.matrix, first.plan.directions.matrix)
    from mvg_dask.engine.ledger import open_ledger

    with open_ledger(tmp_path / "l.sqlite") as book:
        assert len(book.releases()) == 1  # charged once
    assert (tmp_path / "l.sqlite").exists() and before


# -- one line for a data error ------------------------------------------------------------------
def test_cli_data_error_is_one_line_without_worker_traceback(tmp_path):
    X = data(3, 600, seed=23)
    X[2, 345] = np.nan
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = write_spec(tmp_path / "s.yaml", spec_dict(store, str(tmp_path / "o.zarr")))
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(spec), "--quiet"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "Compute Failed" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "records 300..399" in errors[0], out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.zarr", "s.yaml"]


# -- DASK_SCHEDULER_ADDRESS ------------------------------------------------------------------------
# a release through DASK_SCHEDULER_ADDRESS on a loopback scheduler: tests/test_kube.py


def test_unreachable_scheduler_address_is_a_clear_error(tmp_path, monkeypatch):
    store = make_input(tmp_path / "in.zarr", data(3, 100, seed=25), chunk=100)
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:9")  # nothing listens there
    import dask

    dask.config.refresh()
    try:
        with pytest.raises(
            ReleaseError, match=r"tcp://127.0.0.1:9 \(from DASK_SCHEDULER_ADDRESS\)"
        ):
            api.release(spec_dict(store, str(tmp_path / "o.zarr")), progress=False)
    finally:
        monkeypatch.delenv("DASK_SCHEDULER_ADDRESS")
        dask.config.refresh()
    assert not (tmp_path / "o.zarr").exists()
