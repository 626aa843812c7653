"""The moment queries (centered-covariance, regression): the second moment of ``z = [x; 1]``.

At a huge epsilon the release equals numpy on the clipped data; its bytes do not depend on the
input's chunking; the dry run names its stages; bad targets are refused before anything is
written; the accuracy of ``mean`` and ``covariance`` is checked against the measured noise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.errors import DataError
from mvg_dask.noise import NoiseKey
from mvg_dask.plan.domain import augmented_domain
from mvg_dask.plan.queries import CenteredCovarianceQuery, query_from_dict
from mvg_dask.plan.queries.moment import centered_from_moment
from mvg_dask.spec import SpecError
from tests.pipeline_helpers import (
    add_group_variable,
    assert_same_bytes_whatever_the_engine,
    data,
    make_input,
    spec_dict,
    write_spec,
)

HUGE = {"epsilon": 1e9, "delta": 1e-5}
REGRESSION = {"regression": {"target": "f4"}}


def _spec(store: str, out: Path, query: Any, **overrides: Any) -> dict[str, Any]:
    spec = spec_dict(store, str(out), query="covariance", **overrides)
    spec["query"] = query
    spec["mechanism"].pop("algorithm")  # the default of an exact moment release: symmetric
    return spec


@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_centered_covariance_at_a_huge_epsilon_is_numpy(tmp_path, client, noise):
    X = data(5, 3000, seed=3)
    store = make_input(tmp_path / "in.zarr", X, chunk=512)
    spec = _spec(store, tmp_path / "c.zarr", "centered-covariance", privacy=HUGE)
    spec["mechanism"]["noise"] = noise
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    Xc = np.clip(X, 0, 1)
    Z = np.vstack([Xc - 0.5, np.ones(3000)])  # about the box's centre
    assert ds.attrs["mvg_dask_query"] == "centered-covariance"
    assert json.loads(ds.attrs["mvg_dask_plan"])["query"]["centre"] == [0.5] * 5
    assert ds["moment"].dims == ("term_row", "term_col")
    assert list(ds["term_row"].values) == ["f0", "f1", "f2", "f3", "f4", "1"]
    assert ds["mean"].dims == ("feature",) and ds["covariance"].dims == (
        "feature_row",
        "feature_col",
    )
    np.testing.assert_allclose(ds["moment"].values, Z @ Z.T / 3000, atol=1e-6)
    np.testing.assert_allclose(ds["mean"].values, Xc.mean(axis=1), atol=1e-6)
    np.testing.assert_allclose(ds["covariance"].values, np.cov(Xc, bias=True), atol=1e-6)
    assert "mvg_dask_target" not in ds.attrs


@pytest.mark.parametrize(
    ("domain", "factor", "scale"),
    [
        ({"box": {"lower": 0.0, "upper": 0.1}}, 0.1, 2.0**-4),
        ({"box": {"lower": -20.0, "upper": 20.0}}, 40.0, 32.0),
        ({"l2_norm": 0.5}, 0.25, 0.5),
    ],
    ids=["narrow", "wide", "ball"],
)
def test_the_constant_follows_the_domains_scale(tmp_path, client, domain, factor, scale):
    """A narrow box, a wide box and an l2 ball: the plan's constant ``s`` (a power of two from
    the domain alone), the release at a huge epsilon equal to numpy (the moment of ``[x - c;
    s]``, the mean, ``np.cov(bias=True)``) and the accessor's regression to ``lstsq``."""
    X = data(3, 2000, seed=12) * factor
    if "box" in domain:
        X = X - (20.0 if factor == 40.0 else 0.0)
    store = make_input(tmp_path / "in.zarr", X, chunk=512)
    spec = _spec(store, tmp_path / "c.zarr", {"regression": {"target": "f2"}}, privacy=HUGE)
    spec["domain"] = domain
    plan = api.dry_run(spec)
    assert plan.query.scale == scale  # type: ignore[attr-defined]
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    assert json.loads(ds.attrs["mvg_dask_plan"])["query"]["scale"] == scale
    if "box" in domain:  # the records as the release clips them
        X = np.clip(X, domain["box"]["lower"], domain["box"]["upper"])
    else:
        X = X * np.minimum(1.0, 0.5 / np.linalg.norm(X, axis=0))
    centre = np.asarray(plan.query.centre or np.zeros(3))  # type: ignore[attr-defined]
    Z = np.vstack([X - centre[:, None], np.full(2000, scale)])
    tol = 1e-6 * max(factor, 1.0) ** 2
    np.testing.assert_allclose(ds["moment"].values, Z @ Z.T / 2000, atol=tol)
    np.testing.assert_allclose(ds["mean"].values, X.mean(axis=1), atol=tol)
    np.testing.assert_allclose(ds["covariance"].values, np.cov(X, bias=True), atol=tol)
    fit = ds.mvg.regression(intercept=True, ridge=0.0)
    want = np.linalg.lstsq(np.vstack([X[:2], np.ones(2000)]).T, X[2], rcond=None)[0]
    np.testing.assert_allclose(fit.values, want, rtol=1e-4, atol=1e-4)


def test_regression_moments_give_least_squares(tmp_path, client):
    """The released moment holds ``X^T X / N``, ``X^T y / N`` and the means (about the box's
    centre): the accessor's fit without a ridge is numpy's least squares on the clipped data,
    with and without an intercept."""
    X = data(5, 4000, seed=8)
    X[4] = 0.3 * X[0] - 0.2 * X[2] + 0.1 + 0.05 * np.random.default_rng(2).standard_normal(4000)
    store = make_input(tmp_path / "in.zarr", X, chunk=700)
    spec = _spec(store, tmp_path / "r.zarr", REGRESSION, privacy=HUGE)
    ds = api.open_release(api.release(spec, client=client, seed=2, progress=False).output)
    assert ds.attrs["mvg_dask_query"] == "regression"
    assert ds.attrs["mvg_dask_target"] == "f4"
    assert json.loads(ds.attrs["mvg_dask_plan"])["query"]["target"] == 4
    Xc = np.clip(X, 0, 1)
    for intercept in (False, True):
        fit = ds.mvg.regression(intercept=intercept, ridge=0.0)
        rows = [Xc[:4], np.ones(4000)] if intercept else [Xc[:4]]
        want = np.linalg.lstsq(np.vstack(rows).T, Xc[4], rcond=None)[0]
        np.testing.assert_allclose(fit.values, want, atol=1e-5)
        assert list(fit["term"].values) == ["f0", "f1", "f2", "f3"] + ["1"] * intercept
    assert ds.mvg.regression(intercept=True).attrs["ridge"] > 0  # the AdaSSP rule


def test_same_bytes_whatever_the_engine_partition_and_cluster(tmp_path, client, monkeypatch):
    """The summation tree is fixed by the record and feature counts (canonical blocks), never by
    the engine: the same bytes from the embedded in-process cluster and from the LocalCluster,
    and with the partial Gram matrices summed on the client or folded on the workers (blocks of
    128 records, one task per block: 56 leaves, two tree levels)."""
    from mvg_dask.plan import input_metadata

    monkeypatch.setattr(input_metadata, "CANONICAL_BLOCK_ELEMENTS", 2**9)
    store = make_input(tmp_path / "in.zarr", data(4, 7100, seed=9), chunk=100)
    query = {"regression": {"target": "f1"}}

    def release(tag: str, **kwargs: Any) -> bytes:
        spec = _spec(store, tmp_path / f"{tag}.zarr", query)
        ds = api.open_release(api.release(spec, seed=5, progress=False, **kwargs).output)
        return b"".join(ds[v].values.tobytes() for v in ("moment", "mean", "covariance"))

    assert_same_bytes_whatever_the_engine(release, client, monkeypatch)


@pytest.mark.parametrize("grouped", [False, True], ids=["one", "grouped"])
@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_bytes_do_not_depend_on_the_input_chunking(tmp_path, client, noise, grouped):
    """Dyadic data (multiples of 1/4: ``x - c`` with ``c = 1/2``, every product and every
    partial sum is exact) in two record chunkings, one records-first; same seed: the same bytes,
    for one moment and for grouped moments (any data: tests/test_canonical_blocks.py)."""
    N = 2000
    rng = np.random.default_rng(14)
    X = rng.integers(0, 5, (4, N)) / 4.0
    labels = rng.integers(0, 3, N)
    chunks = (250, 333)
    outs = []
    for i, chunk in enumerate(chunks):
        store = make_input(tmp_path / f"in{i}.zarr", X, chunk=chunk, records_first=i == 1)
        spec = _spec(store, tmp_path / f"out{i}.zarr", "centered-covariance")
        spec["mechanism"]["noise"] = noise
        if grouped:
            add_group_variable(store, labels)
            spec["group_by"] = {"variable": "site", "groups": [0, 1, 2]}
        ds = api.open_release(api.release(spec, client=client, seed=5, progress=False).output)
        outs.append(b"".join(ds[v].values.tobytes() for v in ("moment", "mean", "covariance")))
    assert chunks[0] != chunks[1]
    assert outs[0] == outs[1]
    s = api.dry_run(spec).query.scale  # type: ignore[attr-defined]
    assert s == 0.5  # the constant's scale for [0, 1]^4 (augmented_scale)
    Z = np.vstack([X - 0.5, np.full(N, s)])[:, labels == 0 if grouped else slice(None)]
    first = np.frombuffer(outs[0][: 25 * 8])  # the (first group's) moment
    assert not np.allclose(first, (Z @ Z.T / N).ravel(), atol=1e-6)  # noisy
    assert np.allclose(first, (Z @ Z.T / N).ravel(), atol=0.5)  # of these data


def test_dry_run_names_the_stages_and_the_moment(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(4, 600, seed=1), chunk=200)
    spec = _spec(store, tmp_path / "o.zarr", REGRESSION | {"regression": {"target": "f2"}})
    plan = api.dry_run(spec)
    assert plan.stages == ("gram", "moment")
    assert plan.query.shape == (5, 5) and plan.query.features == 5
    text = api.dry_run(spec).__repr__() + str(api.dry_run(spec).summary())
    assert "regression query 5x5" in text
    path = write_spec(tmp_path / "s.yaml", spec)
    out = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path), "--dry-run", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    public = json.loads(out)
    table = subprocess.run(
        [sys.executable, "-m", "mvg_dask", "release", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        "regression on 'f2': second moment Z Z^T / N of z = [x - c; s] (5 x 5), c = the box's "
        "centre, s = 0.5" in table
    )
    routes = next(line for line in table.splitlines() if line.strip().startswith("routes"))
    assert routes.endswith(
        "smaller in the worst case: the centred moment; taken: the centred moment"
    ), routes
    assert "gram -> moment" in table
    assert public["stages"] == ["gram", "moment"]
    assert public["plan"]["query"]["kind"] == "regression"
    assert not (tmp_path / "o.zarr").exists()


def test_the_routes_line_is_the_route_errors_at_the_centre_and_a_corner(tmp_path):
    """The dry run's routes line: both routes' expected errors with the data's mean at the box's
    centre and at a corner (:func:`centered_route_errors`, itself checked by Monte Carlo in
    tests/test_centered_bounds.py), the centred moment's worst case the smaller; no such line
    for the covariance, an l2 ball or add-remove neighbours."""
    from mvg_dask.plan.presentation import centered_routes_text
    from mvg_dask.privacy.sensitivity import centered_route_errors

    store = make_input(tmp_path / "in.zarr", data(3, 800, seed=1), chunk=200)
    spec = _spec(store, tmp_path / "o.zarr", "centered-covariance")
    spec["domain"] = {"box": {"lower": [0.0, -1.0, 0.0], "upper": [1.0, 1.0, 4.0]}}
    rplan = api.dry_run(spec)
    text = centered_routes_text(rplan)
    assert text is not None
    lo, hi = np.array([0.0, -1.0, 0.0]), np.array([1.0, 1.0, 4.0])
    mu = rplan.budgets.release_mu
    s = rplan.query.scale  # type: ignore[attr-defined]
    at_centre = centered_route_errors(lo, hi, 800, mu, scale=s)
    at_corner = centered_route_errors(lo, hi, 800, mu, mean=lo, scale=s)  # every corner alike
    numbers = [float(v) for v in re.findall(r"(\d\.\d+(?:e-?\d+)?) \.\. ", text)]
    worst = [float(v) for v in re.findall(r"\.\. (\d\.\d+(?:e-?\d+)?)", text)]
    assert numbers == pytest.approx(
        [at_centre.totals()["centred"], at_centre.totals()["mean-first"]], rel=5e-3
    )
    assert worst[0] == pytest.approx(at_corner.centred_covariance + at_corner.centred_mean, 5e-3)
    assert worst[0] > numbers[0] and worst[1] > worst[0]
    cov = dict(spec, query="covariance")
    ball = dict(spec, domain={"l2_norm": 1.0})
    assert centered_routes_text(api.dry_run(cov)) is None
    assert centered_routes_text(api.dry_run(ball)) is None


def test_query_round_trips_and_the_augmented_domain_holds_every_record():
    q = query_from_dict(
        {"kind": "regression", "features": 6, "records": 10, "target": 2, "target_label": "y"}
    )
    assert q.to_dict()["target_label"] == "y" and query_from_dict(q.to_dict()) == q
    from mvg_dask.plan import BoxDomain, L2BallDomain

    declared = BoxDomain.create([-1.0, 0.0], [2.0, 1.0], 2)
    cq = CenteredCovarianceQuery(3, 100, centre=(0.5, 0.5))
    box = cq.record_domain(declared)  # about the centre, the constant's interval [1, 1]
    assert list(box.lower) == [-1.5, -0.5, 1.0] and list(box.upper) == [1.5, 0.5, 1.0]
    assert query_from_dict(cq.to_dict()) == cq
    ball = augmented_domain(L2BallDomain(3.0, 2))
    assert ball.m == 3 and ball.radius == pytest.approx(np.sqrt(10.0))
    # the query's sensitivity is the covariance's over the augmented domain (mixed signs)
    assert cq.l2_sensitivity(box, "replace-one") == pytest.approx(
        np.sqrt(2) * (2.25 + 0.25 + 1) / 100
    )


@pytest.mark.parametrize(
    "query,neighbours,error,needle",
    [
        ({"regression": {"target": "y"}}, "replace-one", DataError, "'y' is not a feature"),
        ({"regression": {"target": 9}}, "replace-one", DataError, "9 is not a feature"),
        ("centered-covariance", "add-remove", SpecError, "divides by the public record count"),
        ({"regression": {"targte": "f1"}}, "replace-one", SpecError, "targte"),
    ],
)
def test_bad_queries_are_refused_before_anything_is_written(
    tmp_path, query, neighbours, error, needle
):
    store = make_input(tmp_path / "in.zarr", data(4, 300, seed=1), chunk=100)
    spec = _spec(store, tmp_path / "o.zarr", query, privacy={"neighbours": neighbours})
    with pytest.raises(error, match=needle):
        api.release(spec, progress=False)
    assert not (tmp_path / "o.zarr").exists()
    assert not list(tmp_path.glob("*.staging-*"))


def test_noise_std_of_mean_and_covariance_match_the_measured_noise(tmp_path, client):
    """``noise_std("mean")`` (exact) and ``noise_std("covariance")`` (delta method) against the
    spread of ``centered_from_moment`` over 4,000 draws of the release's own noise plan (float
    noise, seeds 0..3999). Each std is a sample std of 4,000 values: relative SE about 1.1 %;
    checked within 5 SE per entry (alpha about 1e-5 per entry)."""
    X = data(4, 800, seed=5)
    store = make_input(tmp_path / "in.zarr", X, chunk=400)
    spec = _spec(store, tmp_path / "o.zarr", "centered-covariance", privacy={"epsilon": 2.0})
    spec["mechanism"]["noise"] = "float"
    ds = api.open_release(api.release(spec, client=client, seed=0, progress=False).output)
    plan = api.dry_run(spec).noise_plan()
    Xc = np.clip(X, 0, 1)
    scale = json.loads(ds.attrs["mvg_dask_plan"])["query"]["scale"]
    Z = np.vstack([Xc - 0.5, np.full(800, scale)])  # the moment about the box's centre
    truth = Z @ Z.T / 800
    c = np.full(4, 0.5)
    draws = [
        centered_from_moment(truth + plan.draw(NoiseKey.from_seed(s)), c, scale)
        for s in range(4000)
    ]
    means = np.stack([d[0] for d in draws])
    covs = np.stack([d[1] for d in draws])
    rel_se = 1 / np.sqrt(2 * 3999)
    np.testing.assert_allclose(
        means.std(axis=0, ddof=1), ds.mvg.noise_std("mean").values, rtol=5 * rel_se
    )
    cov_std = ds.mvg.noise_std("covariance")
    assert "approximate" in cov_std.attrs
    # the delta method is evaluated at the released mean; the draws' spread at the true one
    np.testing.assert_allclose(covs.std(axis=0, ddof=1), cov_std.values, rtol=5 * rel_se + 0.02)
    # and the noise of the released moment is the plan's (a chi-square check of one entry)
    s = ds.mvg.noise_std("moment").values
    e = np.stack([plan.draw(NoiseKey.from_seed(10_000 + t))[0, 4] for t in range(2000)]) / s[0, 4]
    assert stats.chi2.sf(float(e @ e), 2000) > 1e-3 and stats.chi2.cdf(float(e @ e), 2000) > 1e-3


def test_regression_accessor_without_feature_names(tmp_path, client):
    """An input without feature names: the target by position, the terms by position, and the
    constant's label the estimators' (one label on both sides of the format)."""
    from mvg_dask import release_format
    from mvg_dask.data import write_matrix
    from mvg_dask.plan import estimators

    assert release_format.CONSTANT_TERM == estimators.CONSTANT_TERM
    X = data(3, 3000, seed=4)
    X[2] = 0.5 * X[0] + 0.25
    store = write_matrix(X, tmp_path / "in.zarr", record_chunk=1000)
    spec = _spec(store, tmp_path / "o.zarr", {"regression": {"target": 2}}, privacy=HUGE)
    ds = api.open_release(api.release(spec, client=client, seed=3, progress=False).output)
    assert "term_row" not in ds.coords and ds.attrs["mvg_dask_target"] == 2
    fit = ds.mvg.regression(intercept=True, ridge=0.0)
    assert list(fit["term"].values) == ["#0", "#1", "1"] and fit.attrs["target"] == "#2"
    Xc = np.clip(X, 0, 1)
    want = np.linalg.lstsq(np.vstack([Xc[:2], np.ones(3000)]).T, Xc[2], rcond=None)[0]
    np.testing.assert_allclose(fit.values, want, atol=1e-5)
