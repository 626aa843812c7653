"""The mean-first route to a centered covariance (docs/bounds.md, Sec. 14): the spec form, the
plan's choice between routes, step 1 (the mean on the lattice) and step 2's noise plan on the
shifted box."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from scipy import stats

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.engine.lattice import vector_release
from mvg_dask.noise import NoiseKey
from mvg_dask.plan.domain import BoxDomain
from mvg_dask.plan.lattice import LatticeContext
from mvg_dask.plan.mean_first import (
    centre_from_mean,
    choose_route,
    plan_mean_step,
    second_step_domain,
    second_step_noise,
    step_mus,
)
from mvg_dask.privacy.calibration import analytic_gaussian_mu
from mvg_dask.privacy.float_error import mean_error
from mvg_dask.privacy.sensitivity import (
    box_symmetric_noise,
    centered_route_errors,
    mean_l2_sensitivity,
)
from mvg_dask.spec import SpecError, parse_spec, spec_hash
from tests.pipeline_helpers import (
    assert_same_bytes_whatever_the_engine,
    data,
    make_input,
    spec_dict,
)


def _spec(query: Any, **overrides: Any) -> dict[str, Any]:
    spec = spec_dict("in.zarr", "out.zarr", query="covariance", **overrides)
    spec["query"] = query
    spec["mechanism"].pop("algorithm")
    return spec


# -- spec ---------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"route": "moment"}, None])
def test_the_moment_route_is_the_plain_query_with_its_hash(params):
    plain = parse_spec(_spec("centered-covariance"))
    mapped = parse_spec(_spec({"centered-covariance": params}))
    assert mapped.query == "centered-covariance" and mapped.centered_route == "moment"
    assert spec_hash(mapped) == spec_hash(plain)


def test_the_mean_first_spec_reads_its_route_and_share():
    spec = parse_spec(_spec({"centered-covariance": {"route": "mean-first", "mean_share": 0.3}}))
    assert spec.query_kind == "centered-covariance"
    assert spec.centered_route == "mean-first" and spec.mean_share == 0.3
    assert spec.mechanism.algorithm == "symmetric"
    auto = parse_spec(_spec({"centered-covariance": {"route": "auto"}}))
    assert auto.centered_route == "auto" and auto.mean_share is None
    assert spec_hash(auto) != spec_hash(spec)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"domain": {"l2_norm": 1.0}}, "declare a box domain"),
        ({"privacy": {"neighbours": "add-remove", "records": 100}}, "replace-one"),
        ({"mechanism": {"calibration": "mvg-thm2", "algorithm": "unimodal"}}, "calibration: exact"),
        ({"mechanism": {"directions": {"method": "dp-pca"}}}, "standard directions"),
        ({"group_by": {"variable": "site", "groups": [0, 1]}}, "group_by"),
        ({"params": {"route": "moment", "mean_share": 0.2}}, "mean_share"),
        ({"params": {"route": "mean-first", "mean_share": 1.0}}, "mean_share"),
        ({"params": {"route": "mean-last"}}, "route"),
    ],
)
def test_bad_mean_first_specs_are_refused(change, message):
    params = change.pop("params", {"route": "mean-first"})
    spec = _spec({"centered-covariance": params})
    for key, value in change.items():
        if key == "group_by":
            spec[key] = value
        elif key == "domain":
            spec["domain"] = value
        else:
            spec[key] = {**spec[key], **value}
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


# -- the plan's choice ---------------------------------------------------------------------


@pytest.mark.parametrize(("m", "width"), [(1, 0.01), (5, 1.0), (20, 1.0), (3, 10.0)])
def test_auto_takes_the_route_with_the_smaller_worst_case(m, width):
    box = BoxDomain.create(0.0, width, m)
    mu = 1.0
    choice = choose_route("auto", box, 10_000, mu)
    # the worst cases, recomputed as the dry run's routes line does
    at_centre = centered_route_errors(box.lower, box.upper, 1e4, mu)
    at_corner = centered_route_errors(box.lower, box.upper, 1e4, mu, mean=box.upper)
    moment = at_corner.centred_covariance + at_corner.centred_mean
    first = at_centre.mean_first_worst_covariance + at_centre.mean_first_mean
    assert choice.moment_worst == pytest.approx(moment, rel=1e-12)
    assert choice.mean_first_worst == pytest.approx(first, rel=1e-12)
    assert choice.route == ("mean-first" if first < moment else "moment")
    forced = choose_route("mean-first", box, 10_000, mu)
    assert forced.route == "mean-first" and 0 < (forced.share or 0) < 1
    assert choose_route("moment", box, 10_000, mu).route == "moment"


def test_auto_on_the_tiny_single_feature_box_takes_the_mean_first():
    # docs/bounds.md Sec. 14: the one case found where the mean-first worst case is smaller
    choice = choose_route("auto", BoxDomain.create(0.0, 0.01, 1), 10_000, 1.0, scale=2.0**-7)
    assert choice.route == "mean-first" and choice.mean_first_worst < choice.moment_worst


def test_a_declared_share_is_kept():
    box = BoxDomain.create(0.0, 1.0, 4)
    assert choose_route("mean-first", box, 1000, 1.0, share=0.25).share == 0.25


def test_the_steps_compose_to_the_release_mu():
    mu = analytic_gaussian_mu(1.0, 1e-6)
    mu1, mu2 = step_mus(1.0, 1e-6, 0.3)
    assert mu1**2 + mu2**2 == pytest.approx(mu**2, rel=1e-12)
    assert mu1**2 == pytest.approx(0.3 * mu**2, rel=1e-12)


# -- step 1: the mean ----------------------------------------------------------------------


def test_the_float_mean_step_is_the_gaussian_mechanism():
    box = BoxDomain.create([0.0, -1.0, 2.0], [1.0, 3.0, 2.5], 3)
    step = plan_mean_step(box, 500, 0.7, 0.2)
    s1 = math.sqrt(1.0 + 16.0 + 0.25) / 500  # ||hi - lo|| / N, a second formula
    assert step.sensitivity == pytest.approx(s1, rel=1e-15)
    assert step.std == pytest.approx(s1 / 0.7, rel=1e-15)
    assert step.centre == (0.5, 1.0, 2.25) and step.lattice is None
    assert type(step).from_dict(step.to_dict()) == step


@pytest.mark.parametrize("m", [1, 7])
def test_the_lattice_mean_step_charges_its_float_error_and_grid(m):
    box = BoxDomain.create(-3.0, 5.0, m)
    context = LatticeContext(records=10**6, depth=4000)
    step = plan_mean_step(box, 10**6, 0.5, 0.4, context)
    assert step.lattice is not None
    assert step.lattice.effective_sensitivity <= 0.5
    assert step.lattice.sensitivity == pytest.approx(step.sensitivity / step.std, rel=1e-15)
    # the inflation is tiny: the std is within 1e-5 of the float step's
    assert step.std == pytest.approx(step.sensitivity / 0.5, rel=1e-5)
    assert step.std >= step.sensitivity / 0.5
    assert type(step).from_dict(step.to_dict()) == step


def test_the_mean_float_error_bound_holds_against_exact_arithmetic():
    rng = np.random.default_rng(11)
    m, n, chunk = 3, 600, 64
    c = np.array([0.5, -1.25, 1e3])
    X = rng.uniform([0, -3, 999], [1, 0.5, 1001], size=(n, m)).T
    Xs = X - c[:, None]  # the engine's fl(x - c)
    # the engine's sequence: per-chunk sums, then added in order; then / N; then * w
    sums = np.zeros(m)
    for j in range(0, n, chunk):
        sums = sums + Xs[:, j : j + chunk].sum(axis=1)
    sigma = 0.0123
    g_hat = (sums / n) * (1.0 / sigma)
    exact = [sum(Fraction(float(v)) for v in Xs[i]) / n / Fraction(sigma) for i in range(m)]
    err = math.sqrt(sum(float(Fraction(float(g_hat[i])) - exact[i]) ** 2 for i in range(m)))
    a = np.max(np.abs(Xs), axis=1)
    bound = mean_error(a, n, chunk + n // chunk, n) / sigma
    assert 0 < err <= bound


def test_the_lattice_mean_at_a_huge_mu_is_the_mean():
    box = BoxDomain.create(0.0, 1.0, 4)
    step = plan_mean_step(box, 1000, 1e9, 0.5, LatticeContext(records=1000, depth=1000))
    assert step.lattice is not None
    f = np.array([0.1, -0.2, 0.3, 0.0])
    out = vector_release(f, step.std, step.lattice, NoiseKey.from_seed(1).derive("mean"))
    np.testing.assert_allclose(out, f, atol=1e-8)


@pytest.mark.parametrize("lattice", [True, False])
def test_the_mean_noise_std_is_the_plans(lattice):
    """Chi-square on the released mean's noise over 400 keys (seeds 0..399), alpha = 0.01
    two-sided: sum((mean_hat - f)^2) / std^2 ~ chi2(400 m)."""
    box = BoxDomain.create(0.0, 1.0, 5)
    context = LatticeContext(records=200, depth=200) if lattice else None
    step = plan_mean_step(box, 200, 0.8, 0.3, context)
    f = np.linspace(-0.2, 0.3, 5)
    z = []
    for seed in range(400):
        key = NoiseKey.from_seed(seed).derive("mean")
        if step.lattice is not None:
            out = vector_release(f, step.std, step.lattice, key)
        else:
            out = f + step.std * key.tile_normals(0, (5,))
        z.append((out - f) / step.std)
    q = float(np.sum(np.square(z)))
    dof = 400 * 5
    assert stats.chi2.ppf(0.005, dof) < q < stats.chi2.ppf(0.995, dof)


# -- step 2: the covariance around the released mean ----------------------------------------


def test_the_centre_is_the_clamped_mean_and_the_box_shifts_by_it():
    box = BoxDomain.create([0.0, 0.0], [1.0, 2.0], 2)
    centre = centre_from_mean(np.array([1.3, 0.5]), box)
    np.testing.assert_array_equal(centre, [1.0, 0.5])
    shifted = second_step_domain(box, centre)
    np.testing.assert_array_equal(shifted.lower, [-1.0, -0.5])
    np.testing.assert_array_equal(shifted.upper, [0.0, 1.5])


@pytest.mark.parametrize("mean", [[0.5, 0.5, 0.5], [0.9, 0.1, 0.5], [1.0, 0.0, 1.0]])
def test_the_second_step_noise_is_the_shifted_box_covariance_at_mu_2(mean):
    box = BoxDomain.create(0.0, 1.0, 3)
    centre = centre_from_mean(np.array(mean), box)
    plan = second_step_noise(box, centre, 1000, epsilon=1.0, delta=1e-6, share=0.2)
    _, mu2 = step_mus(1.0, 1e-6, 0.2)
    lo, hi = box.lower - centre, box.upper - centre
    v, r = box_symmetric_noise(lo, hi, 1000, mu2)  # the route's error formula's noise
    assert plan.algorithm == "symmetric"
    np.testing.assert_allclose(plan.row_variances, v, rtol=1e-9)
    assert plan.symmetric_ratio == pytest.approx(r, rel=1e-9)
    # R of the shifted box: a mean at the corner keeps one sign (no sqrt(2))
    assert mean_l2_sensitivity(lo, hi, 1000) == pytest.approx(math.sqrt(3) / 1000)


# -- the release ----------------------------------------------------------------------------

HUGE = {"epsilon": 1e9, "delta": 1e-5}


def _release_spec(store: str, out: Any, **overrides: Any) -> dict[str, Any]:
    spec = spec_dict(store, str(out), query="covariance", **overrides)
    spec["query"] = {"centered-covariance": {"route": "mean-first", "mean_share": 0.3}}
    spec["mechanism"].pop("algorithm")
    return spec


@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_the_mean_first_release_at_a_huge_epsilon_is_numpy(tmp_path, client, noise):
    X = data(4, 2000, seed=5)
    store = make_input(tmp_path / "in.zarr", X, chunk=512)
    spec = _release_spec(store, tmp_path / "c.zarr", privacy=HUGE)
    spec["mechanism"]["noise"] = noise
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    Xc = np.clip(X, 0, 1)
    assert ds.attrs["mvg_dask_query"] == "centered-covariance"
    assert ds.attrs["mvg_dask_route"] == "mean-first"
    assert json.loads(ds.attrs["mvg_dask_mean_step"])["share"] == 0.3
    assert ds["mean"].dims == ("feature",) and "moment" not in ds
    np.testing.assert_allclose(ds["mean"].values, Xc.mean(axis=1), atol=1e-6)
    np.testing.assert_allclose(ds["centre"].values, Xc.mean(axis=1), atol=1e-6)
    # the bias d d^T with d = xbar - centre is ~0 here
    np.testing.assert_allclose(ds["covariance"].values, np.cov(Xc, bias=True), atol=1e-6)
    plan = json.loads(ds.attrs["mvg_dask_plan"])
    assert plan["row_variances"] is None and plan["domain"] == {
        "box": {"lower": [0.0] * 4, "upper": [1.0] * 4}
    }


def test_same_bytes_whatever_the_engine_partition(tmp_path, client, monkeypatch):
    """Both passes sum by the fixed tree of the input's metadata: the same bytes from the
    in-process cluster and the LocalCluster, and with the partials summed on the client or
    folded on the workers (one task per chunk: 61 leaves, two tree levels)."""

    store = make_input(tmp_path / "in.zarr", data(3, 6100, seed=9), chunk=100)

    def release(tag: str, **kwargs: Any) -> bytes:
        spec = _release_spec(store, tmp_path / f"{tag}.zarr")
        ds = api.open_release(api.release(spec, seed=5, progress=False, **kwargs).output)
        return b"".join(ds[v].values.tobytes() for v in ("mean", "centre", "covariance"))

    assert_same_bytes_whatever_the_engine(release, client, monkeypatch)


def test_the_dry_run_shows_the_route_and_the_stages(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(4, 600, seed=1), chunk=200)
    plan = api.dry_run(_release_spec(store, tmp_path / "o.zarr"))
    assert plan.stages == ("gram", "mean", "covariance-about-mean")
    assert plan.mean_first is not None and plan.mean_first.share == 0.3
    assert plan.noise is None  # planned after the mean
    text = plan.summary()
    assert "route mean-first" in text
    from mvg_dask.plan.presentation import centered_routes_text

    routes = centered_routes_text(plan)
    assert routes is not None and routes.endswith("taken: the mean first"), routes
    auto = _release_spec(store, tmp_path / "o.zarr")
    auto["query"] = {"centered-covariance": {"route": "auto"}}
    moment = api.dry_run(auto)
    assert moment.stages == ("gram", "moment") and moment.mean_first is None
    line = centered_routes_text(moment)
    assert line is not None and line.endswith(
        "smaller in the worst case: the centred moment; taken: the centred moment"
    ), line


def test_the_mean_first_plan_round_trips(tmp_path):
    from mvg_dask.plan.release_plan import ReleasePlan, resolve_about_mean

    store = make_input(tmp_path / "in.zarr", data(4, 600, seed=1), chunk=200)
    plan = api.dry_run(_release_spec(store, tmp_path / "o.zarr"))
    back = ReleasePlan.from_dict(plan.to_dict())
    assert back.to_dict() == plan.to_dict() and back.mean_first == plan.mean_first
    resolved = resolve_about_mean(plan, np.array([0.4, 0.5, 0.6, 1.0]))
    again = ReleasePlan.from_dict(resolved.to_dict())
    assert again.noise is not None and again.noise.to_dict() == resolved.noise_plan().to_dict()
    assert again.public_noise_dict() == plan.public_noise_dict()  # nothing of the centre


def test_noise_std_of_a_mean_first_release_is_its_plans(tmp_path, client):
    """``ds.mvg.noise_std``: the mean step's std for ``mean``; for ``covariance`` the std of
    step 2's plan about the published centre, rebuilt independently here from the dry run's
    plan (:func:`resolve_about_mean`)."""
    from mvg_dask.plan.release_plan import resolve_about_mean

    store = make_input(tmp_path / "in.zarr", data(3, 900, seed=2), chunk=300)
    spec = _release_spec(store, tmp_path / "o.zarr")
    spec["mechanism"]["allocation"] = {"strategy": "binary", "important": [1], "share": 0.6}
    ds = api.open_release(api.release(spec, client=client, seed=4, progress=False).output)
    plan = api.dry_run(spec)
    assert plan.mean_first is not None
    np.testing.assert_array_equal(ds.mvg.noise_std("mean").values, plan.mean_first.std)
    resolved = resolve_about_mean(plan, ds["centre"].values).noise_plan()
    want = np.broadcast_to(resolved.released_entry_std(), (3, 3))
    assert np.ptp(np.diag(want)) > 0  # the binary allocation: feature 1 gets more precision
    np.testing.assert_allclose(ds.mvg.noise_std("covariance").values, want, rtol=1e-12)
    np.testing.assert_allclose(ds.mvg.noise_std().values, want, rtol=1e-12)
    # the centre is the released mean clamped into [0, 1]
    np.testing.assert_array_equal(ds["centre"].values, np.clip(ds["mean"].values, 0, 1))


def test_a_complete_mean_first_release_run_again_is_reloaded(tmp_path, client):
    """Run again with its release id, a committed release is not recomputed: its plan is
    reloaded from the output, step 2's about the stored centre (charged once)."""
    from mvg_dask.engine.ledger import open_ledger

    store = make_input(tmp_path / "in.zarr", data(3, 600, seed=3), chunk=200)
    spec = _release_spec(store, tmp_path / "o.zarr", release_id="mf-again")
    spec["ledger"] = {
        "path": str(tmp_path / "l.sqlite"),
        "dataset": "d",
        "budget": {"epsilon": 5.0, "delta": 1e-4},
    }
    first = api.release(spec, client=client, progress=False)
    again = api.release(spec, client=client, progress=False)
    assert again.plan.to_dict() == first.plan.to_dict()
    with open_ledger(str(tmp_path / "l.sqlite")) as book:
        assert len(book.releases()) == 1
