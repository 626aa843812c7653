"""Every covariance estimator on every covariance-like release (docs/guide/python.md, "Reading
a release").

``psd_covariance``, ``shrunk_covariance``, ``correlation``, ``noise_std``, ``regression`` and
the derived intervals work on a covariance release, an add-remove one (``gram`` with a noisy
count), a centered-covariance one and a grouped regression one (one result per group), each
checked against the same estimator applied by hand to the released values; anything else is
refused with what the release is and what would work. ``correlation`` never returns NaN or a
value outside ``[-1, 1]`` (a hypothesis test over noisy covariances with negative variances)
and warns where the noise dominates. The draws of the published noise the intervals' bootstrap
uses have the plan's law (chi-square test at ``ALPHA``, Bonferroni over the entries).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from scipy import stats

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.interactive.read import gaussian_variable
from mvg_dask.plan.derived_stats import (
    NoiseDominatedWarning,
    correlation_matrix,
    published_noise_draws,
)
from mvg_dask.plan.estimators import identity_shrinkage, psd_projection
from tests.pipeline_helpers import add_group_variable, make_input, spec_dict

M, N = 4, 3000
GROUPS = [0, 1, 2]
SEED = 4100
ALPHA = 0.001
KINDS = ("covariance", "add-remove", "centered", "grouped")


def _records() -> np.ndarray:
    rng = np.random.default_rng(7)
    f = rng.standard_normal(N)
    X = 0.5 + 0.15 * np.outer(np.linspace(1.0, -0.5, M), f) + 0.1 * rng.standard_normal((M, N))
    return np.clip(X, 0.0, 1.0)


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory, client: Any) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("every")
    store = make_input(root / "in.zarr", _records(), chunk=500)
    add_group_variable(store, np.random.default_rng(1).choice(GROUPS, N))

    def release(name: str, query: Any, *, moment: bool = False, **over: Any) -> Any:
        spec = spec_dict(store, str(root / f"{name}.zarr"), query="covariance", **over)
        spec["query"] = query
        if moment:  # the default of a moment release: symmetric noise
            spec["mechanism"].pop("algorithm")
        out = api.release(spec, client=client, seed=SEED, progress=False).output
        return api.open_release(out)

    return {
        "covariance": release("cov", "covariance"),
        "add-remove": release("ar", "covariance", privacy={"neighbours": "add-remove"}),
        "centered": release("cen", "centered-covariance", moment=True),
        "grouped": release(
            "grp",
            {"regression": {"target": "f0"}},
            moment=True,
            group_by={"variable": "site", "groups": GROUPS},
        ),
        "identity": release("ident", "identity", mechanism={"algorithm": "unimodal"}),
    }


def _matrices(ds: Any) -> np.ndarray:
    """The released covariance(s) as ``(G, M, M)``."""
    return np.asarray(ds["covariance"].values).reshape(-1, M, M)


@pytest.mark.parametrize("kind", KINDS)
def test_psd_and_shrunk_covariance(kind: str, releases: dict[str, Any]) -> None:
    ds = releases[kind]
    C = _matrices(ds)
    psd = ds.mvg.psd_covariance()
    assert psd.dims == ds["covariance"].dims and psd.name == "covariance_psd"
    for g, got in enumerate(psd.values.reshape(-1, M, M)):
        np.testing.assert_allclose(got, psd_projection(C[g]), atol=1e-14)
    std = ds.mvg.noise_std().values.reshape(-1, M, M)
    shrunk = ds.mvg.shrunk_covariance("identity").values.reshape(-1, M, M)
    if kind != "add-remove":  # the add-remove shrinker takes gram and its own std
        for g in range(C.shape[0]):
            np.testing.assert_allclose(shrunk[g], identity_shrinkage(C[g], std[g]), atol=1e-14)
    spiked = ds.mvg.shrunk_covariance("spiked")
    assert spiked.dims == ds["covariance"].dims
    assert np.all(np.isfinite(spiked.values)) and np.all(np.array(spiked.attrs["noise_edge"]) > 0)
    for g in spiked.values.reshape(-1, M, M):
        assert np.linalg.eigvalsh(g).min() >= -1e-12


@pytest.mark.parametrize("kind", KINDS)
def test_noise_std_and_intervals_default_to_the_covariance(
    kind: str, releases: dict[str, Any]
) -> None:
    ds = releases[kind]
    std = ds.mvg.noise_std()
    assert std.dims == ds["covariance"].dims
    ci = ds.mvg.confidence_intervals()
    assert ci.attrs["variable"] == "covariance"
    np.testing.assert_array_equal(ci["value"].values, ds["covariance"].values)
    if kind in ("centered", "grouped", "add-remove"):  # a derived value: the delta method
        assert ci.attrs["approximate"].startswith("delta method")
        np.testing.assert_array_equal(std.values, ds.mvg.noise_std("covariance").values)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["floor", "psd"])
def test_correlation(kind: str, method: str, releases: dict[str, Any]) -> None:
    """Values in [-1, 1] with a unit diagonal; where the noise is small against the variances
    (every entry but those of a grouped release's small groups: 1,000 records each) they are
    ``C_ij / sqrt(C_ii C_jj)``, clipped (``floor``) or unchanged when that is already a
    correlation matrix (``psd``); the noise-dominated ones have the interval [-1, 1] and a
    warning counts them."""
    ds = releases[kind]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        corr = ds.mvg.correlation(method=method)
    r = corr["value"].values.reshape(-1, M, M)
    dominated = corr["noise_dominated"].values.reshape(-1, M, M)
    assert corr["value"].dims == ds["covariance"].dims and corr.attrs["method"] == method
    assert np.all(np.isfinite(r)) and np.all(np.abs(r) <= 1.0)
    warned = [w for w in caught if issubclass(w.category, NoiseDominatedWarning)]
    assert len(warned) == int(dominated.any())
    assert (kind == "grouped") == bool(dominated.any())
    for g, rg in enumerate(r):
        np.testing.assert_array_equal(np.diag(rg), 1.0)
        if dominated[g].any():
            assert np.all(corr["lower"].values.reshape(-1, M, M)[g][dominated[g]] == -1.0)
            continue
        C = _matrices(ds)[g]
        d = np.sqrt(np.diag(C))
        raw = C / np.outer(d, d)
        if method == "floor":  # a noisy covariance beyond its variances: clipped
            np.testing.assert_allclose(rg, np.clip(raw, -1, 1), atol=1e-12)
        elif np.linalg.eigvalsh(raw).min() >= 0:  # already a correlation matrix: unchanged
            np.testing.assert_allclose(rg, raw, atol=1e-12)
    assert np.all(corr["lower"].values <= corr["value"].values)
    assert np.all(corr["value"].values <= corr["upper"].values)


@pytest.mark.filterwarnings("ignore::mvg_dask.plan.derived_stats.NoiseDominatedWarning")
@pytest.mark.parametrize("kind", KINDS)
def test_regression_and_derived_intervals(kind: str, releases: dict[str, Any]) -> None:
    ds = releases[kind]
    grouped = kind == "grouped"
    fit = ds.mvg.regression(target="f1")
    assert fit.dims == (("group", "term") if grouped else ("term",))
    assert list(fit["term"].values) == ["f0", "f2", "f3"]
    moment = kind in ("centered", "grouped")
    ci = ds.mvg.regression_intervals(target="f1", intercept=moment, draws=200)
    assert list(ci["term"].values) == ["f0", "f2", "f3", *(["1"] if moment else [])]
    assert np.all(ci["lower"].values <= ci["upper"].values) and ci.attrs["ridge"] == (
        [0.0] * 3 if grouped else 0.0
    )
    ev = ds.mvg.explained_variance(draws=200)
    assert ev["value"].dims == (("group", "component") if grouped else ("component",))
    np.testing.assert_allclose(ev["value"].sum("component").values, 1.0)
    angle = ds.mvg.subspace_angle(1, draws=200)
    assert angle["components"].shape[-2:] == (M, 1)
    assert np.all((angle["angle_upper"].values >= 0) & (angle["angle_upper"].values <= np.pi / 2))


def test_refusals_name_the_release_and_what_works(releases: dict[str, Any]) -> None:
    ident = releases["identity"]
    for method in ("psd_covariance", "shrunk_covariance", "correlation", "regression"):
        with pytest.raises(ValueError, match=r"this is an identity release.*covariance") as err:
            getattr(ident.mvg, method)()
        assert "needs a covariance, centered-covariance or regression release" in str(err.value)
    with pytest.raises(ValueError, match="an intercept needs the released means"):
        releases["covariance"].mvg.regression(target="f1", intercept=True)
    with pytest.raises(ValueError, match="regression needs a target"):
        releases["centered"].mvg.regression()
    with pytest.raises(ValueError, match="without its 'moment' variable"):
        releases["centered"].drop_vars("moment").mvg.psd_covariance()


def test_correlation_of_a_noise_dominated_release_warns(releases: dict[str, Any]) -> None:
    """A release whose first variance came out negative: no NaN, nothing outside [-1, 1], the
    first feature's correlations marked noise-dominated with the interval [-1, 1], and a
    warning that counts them."""
    ds = releases["covariance"].load().copy(deep=True)
    C = ds["covariance"].values.copy()
    C[0, 0] = -abs(C[0, 0])
    C[1, 2] = C[2, 1] = 5 * np.sqrt(C[1, 1] * C[2, 2])  # beyond any correlation
    ds["covariance"] = ds["covariance"].copy(data=C)
    with pytest.warns(NoiseDominatedWarning, match=r"1 noisy variance.*3 of 6 correlations"):
        corr = ds.mvg.correlation()
    r = corr["value"].values
    assert np.all(np.isfinite(r)) and np.all(np.abs(r) <= 1.0) and r[1, 2] == 1.0
    assert corr["noise_dominated"].values[0, 1:].all()
    assert (corr["lower"].values[0, 1:] == -1).all() and (corr["upper"].values[0, 1:] == 1).all()


@settings(max_examples=300, deadline=None)
@given(
    m=hst.integers(2, 6),
    seed=hst.integers(0, 2**32 - 1),
    noise=hst.floats(1e-4, 10.0),
    method=hst.sampled_from(["floor", "psd"]),
)
def test_correlation_is_a_correlation(m: int, seed: int, noise: float, method: str) -> None:
    """Over noisy releases of random covariances, at noise levels from negligible to far above
    the variances (many negative noisy variances): values in [-1, 1], a unit diagonal, no NaN;
    ``psd`` gives a PSD matrix."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, m))
    S = A @ A.T / m
    W = rng.standard_normal((m, m)) * noise
    C = S + (W + W.T) / 2
    r, sd, dominated = correlation_matrix(C, np.full((m, m), noise), method=method)  # type: ignore[arg-type]
    assert np.all(np.isfinite(r)) and np.all(np.isfinite(sd))
    assert np.all(np.abs(r) <= 1.0) and np.all(np.diag(r) == 1.0)
    weak = ~(np.diag(C) > 1.959963984540054 * noise)
    np.testing.assert_array_equal(
        dominated, (weak[:, None] | weak[None, :]) & ~np.eye(m, dtype=bool)
    )
    if method == "psd":
        assert np.linalg.eigvalsh(r).min() >= -1e-9


@pytest.mark.parametrize("kind", ["covariance", "centered", "grouped"])
def test_bootstrap_draws_have_the_published_law(kind: str, releases: dict[str, Any]) -> None:
    """The bootstrap's noise draws: symmetric when the published noise is, each entry's mean
    square against the plan's ``released_entry_std`` in its chi-square interval (``ALPHA``
    family-wise, Bonferroni over the upper triangle); the real published noise has that std
    (tests/test_accuracy.py)."""
    plan = releases[kind].mvg.noise_plan()
    trials = 4000
    draws = published_noise_draws(plan, np.random.default_rng(SEED), trials)
    np.testing.assert_array_equal(draws, np.swapaxes(draws, 1, 2))
    std = np.broadcast_to(plan.released_entry_std(), draws.shape[1:])
    keep = np.triu(np.ones(std.shape, dtype=bool))
    ratio = (np.mean(draws**2, axis=0) / std**2)[keep]
    a = ALPHA / keep.sum()
    lo, hi = stats.chi2.ppf([a / 2, 1 - a / 2], trials) / trials
    assert np.all((lo <= ratio) & (ratio <= hi)), ratio.round(3)


def test_unimodal_draws_are_not_symmetric(tmp_path: Path, releases: dict[str, Any]) -> None:
    """Unimodal noise on a covariance is ``B N``, as the engine draws it: not symmetric."""
    import dataclasses

    plan = releases["covariance"].mvg.noise_plan()
    uni = dataclasses.replace(plan, algorithm="unimodal")
    draws = published_noise_draws(uni, np.random.default_rng(SEED), 2000)
    assert not np.allclose(draws, np.swapaxes(draws, 1, 2))
    std = np.broadcast_to(uni.released_entry_std(), draws.shape[1:])
    np.testing.assert_allclose(draws.std(axis=0), std, rtol=0.12)


def test_a_group_without_a_fit_gets_no_interval(releases: dict[str, Any]) -> None:
    """A group whose released moment is not finite (as a group without records would be) has
    no fit: NaN coefficients, NaN interval ends and std, not resolved, and it is not counted
    among the intervals the noise leaves unbounded. The other groups are unchanged."""
    ds = releases["grouped"].load().copy(deep=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoiseDominatedWarning)
        whole = ds.mvg.regression_intervals(target="f1", intercept=True, draws=200)
    name = gaussian_variable(ds)
    values = ds[name].values.copy()
    values[1] = np.nan
    ds[name] = ds[name].copy(data=values)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ci = ds.mvg.regression_intervals(target="f1", intercept=True, draws=200)
    assert ci.attrs["method"] == whole.attrs["method"] == "Anderson-Rubin pivot"
    for var in ("value", "lower", "upper", "std"):
        assert np.all(np.isnan(ci[var].values[1])), var
        np.testing.assert_array_equal(ci[var].values[[0, 2]], whole[var].values[[0, 2]])
    assert not ci["resolved"].values[1].any()
    unbounded = int(np.sum(~whole["resolved"].values[[0, 2]]))
    counted = [str(w.message) for w in seen if issubclass(w.category, NoiseDominatedWarning)]
    assert all(f"{unbounded} of 8 coefficients" in m for m in counted)
    assert bool(counted) == (unbounded > 0)
