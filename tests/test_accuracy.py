"""The accuracy a release states is the accuracy of the noise it publishes.

For each kind of covariance release, ``TRIALS`` releases of one dataset with seeds
``SEED + t`` (the audit's trial sampler: bit for bit what the cluster publishes for that seed,
``tests/test_audit.py::test_trial_sampler_is_the_release``) give the published noise
(published value minus the clipped non-private value). Checked against it, never against a
restated formula:

* the accessor's ``noise_std`` (on a real release of the same plan) is the empirical standard
  deviation of every entry of the published noise: each entry's sample variance lies in its
  two-sided chi-square interval at a family-wise ``ALPHA`` (Bonferroni over the entries and the
  release kinds);
* the 95 % intervals ``value +- 1.96 std`` cover the non-private entry 95 % of the time within
  3 standard errors, on the diagonal and off it separately (standard errors from the trials'
  own coverage fractions, which are independent across trials);
* the dry run's noise line is the measured std within 2 %.

The old rule (``sqrt(Sigma_ii Sigma_jj)`` for every square release) fails the first check for
the symmetrised equi-modal noise, symmetric noise on a box that straddles 0, DP-PCA and the
add-remove ``gram``: their off-diagonal stds differ from it by 15-60 %.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.plan.presentation import plan_rows
from tests.audit_helpers import covariance_trial
from tests.pipeline_helpers import make_input
from tests.test_audit import engine_gram

SEED = 9_100_000  # trial t uses SEED + t
TRIALS = 4000
ALPHA = 0.001  # family-wise, over every entry of every release kind below
M, N = 4, 60

#: kind -> (box lower, box upper, mechanism, privacy extras)
KINDS: dict[str, tuple[float, float, dict[str, Any], dict[str, Any]]] = {
    "equi-modal": (0.0, 1.0, {"algorithm": "equi-modal"}, {}),
    "unimodal": (0.0, 1.0, {"algorithm": "unimodal"}, {}),
    "symmetric-[0,1]": (0.0, 1.0, {"algorithm": "symmetric"}, {}),
    "symmetric-[-1,1]": (-1.0, 1.0, {"algorithm": "symmetric"}, {}),
    "symmetric-float": (-1.0, 1.0, {"algorithm": "symmetric", "noise": "float"}, {}),
    "dp-pca": (
        0.0,
        1.0,
        {"algorithm": "equi-modal", "directions": {"method": "dp-pca", "k": 2}},
        {},
    ),
    "add-remove-gram": (0.0, 1.0, {"algorithm": "equi-modal"}, {"neighbours": "add-remove"}),
}
#: entries checked per kind (the upper triangle of a symmetric release, else every entry)
ENTRIES = M * M


def _spec(root: Path, lo: float, hi: float, mech: dict[str, Any], priv: dict[str, Any]) -> Any:
    return {
        "name": "accuracy",
        "input": {"store": str(root / "in.zarr"), "variable": "X"},
        "domain": {"box": {"lower": lo, "upper": hi}, "on_violation": "clip"},
        "query": "covariance",
        "mechanism": {"calibration": "exact", **mech},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, **priv},
        "output": {"store": str(root / "out.zarr")},
    }


def _published_noise(kind: str, root: Path, client: Any, n: int = N) -> dict[str, Any]:
    lo, hi, mech, priv = KINDS[kind]
    X = np.random.default_rng(3).uniform(lo, hi, (M, n))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    make_input(root / "in.zarr", X, chunk=20)
    spec = _spec(root, lo, hi, mech, priv)
    rplan = api.dry_run(spec)
    gram = engine_gram(rplan, client)
    gaussian = "gram" if rplan.releases_count else "covariance"
    truth = gram if rplan.releases_count else gram / rplan.query.records
    noise, stds, ratios = [], [], []
    for t in range(TRIALS):
        out = covariance_trial(rplan, gram, SEED + t)
        value = out.extra["gram"] if rplan.releases_count else out.value
        noise.append(value - truth)
        if rplan.releases_count:
            ratios.append((out.value, out.extra["gram"], out.extra["record_count"]))
        assert out.rplan is not None
        stds.append(np.broadcast_to(out.rplan.noise_plan().released_entry_std(), (M, M)))
    # the accessor on a real release of the same plan states the same law
    ds = api.open_release(api.release(spec, client=client, seed=SEED, progress=False).output)
    stated = ds.mvg.noise_std(gaussian).values
    np.testing.assert_allclose(stated, stds[0], rtol=1e-9)
    # the default is the variable an analyst reads: covariance, also with a noisy count
    assert ds.mvg.confidence_intervals().attrs["variable"] == "covariance"
    band = ds.mvg.confidence_intervals(0.95, gaussian, simultaneous=True)
    np.testing.assert_allclose(band["half_width"].values, band.attrs["z"] * stated, rtol=1e-12)
    return {
        "truth": truth,
        "ds": ds,
        "band_z": band.attrs["z"],
        "band_entries": band.attrs["entries"],
        "noise": np.stack(noise),
        "std": np.stack(stds),
        "accessor": stated,
        "dry_run": ds.mvg.plan,
        "rplan": rplan,
        "ratios": ratios,
        "gram_truth": gram,
    }


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, client: Any) -> dict[str, Any]:
    return {
        kind: _published_noise(kind, tmp_path_factory.mktemp(kind.replace("[", "")), client)
        for kind in KINDS
    }


@pytest.mark.parametrize("kind", list(KINDS))
def test_noise_std_is_the_std_of_the_published_noise(kind: str, measured: dict[str, Any]) -> None:
    """Each entry's mean square against the stated variance: the noise has mean 0, so
    ``TRIALS * mean square / variance`` is chi-square with ``TRIALS`` degrees of freedom."""
    m = measured[kind]
    if kind == "dp-pca":  # the law changes with each trial's directions: standardise first
        z = m["noise"] / m["std"]
        second = np.mean(z * z, axis=0)
        target = np.ones((M, M))
    else:
        assert np.all(m["std"] == m["std"][0])  # one law for every trial
        second = np.mean(m["noise"] ** 2, axis=0)
        target = m["std"][0] ** 2
    a = ALPHA / (len(KINDS) * ENTRIES)
    lo_q, hi_q = stats.chi2.ppf([a / 2, 1 - a / 2], TRIALS) / TRIALS
    ratio = second / target
    assert np.all((lo_q <= ratio) & (ratio <= hi_q)), (
        f"{kind}: measured / stated variance {ratio.round(3)} outside [{lo_q:.3f}, {hi_q:.3f}]"
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_95_percent_intervals_cover_95_percent(kind: str, measured: dict[str, Any]) -> None:
    m = measured[kind]
    covered = np.abs(m["noise"]) <= 1.959963984540054 * m["std"]
    on = np.eye(M, dtype=bool)
    for name, mask in (("diagonal", on), ("off-diagonal", ~on)):
        per_trial = covered[:, mask].mean(axis=1)
        rate, se = per_trial.mean(), per_trial.std(ddof=1) / np.sqrt(TRIALS)
        assert abs(rate - 0.95) <= 3 * se, f"{kind} {name}: coverage {rate:.4f} +- {se:.4f}"


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "dp-pca"])
def test_the_dry_run_states_the_measured_std(kind: str, measured: dict[str, Any]) -> None:
    """The dry run's noise line within 2 % of the measured std. With standard directions and
    the uniform allocation every feature has one variance, so every diagonal entry shares one
    law and every off-diagonal entry another: the line prints ``x .. x`` for each, compared with
    the root mean square of the published noise pooled over those entries (relative standard
    error under 0.6 %, so 2 % is over 3.5 standard errors)."""
    m = measured[kind]
    line = next(text for label, text in plan_rows(m["rplan"]) if label == "noise std")
    on = np.eye(M, dtype=bool)
    ms = np.mean(m["noise"] ** 2, axis=0)
    if " off it" in line:
        diag_text, off_text = line.split(" on the diagonal, ")
        groups = [(diag_text, ms[on]), (off_text.split(" off it")[0], ms[~on])]
    else:
        groups = [(line.split(" on ")[0], ms.ravel())]
    for text, second in groups:
        lo, hi = (float(x) for x in text.split(".."))
        assert lo == hi, line  # one law per group
        rms = float(np.sqrt(np.mean(second)))
        assert abs(rms / lo - 1) <= 0.02, f"{kind}: measured {rms:.4g}, dry run says {line!r}"


@pytest.mark.parametrize("kind", list(KINDS))
def test_simultaneous_band_covers_all_entries(kind: str, measured: dict[str, Any]) -> None:
    """The 95 % band covers all the entries of a release at once in 95 % of the releases
    (within 3 standard errors): exact for the independent entries of standard directions,
    at least 95 % for DP-PCA's correlated ones (Sidak). Per-entry intervals do not: their
    simultaneous coverage is far below."""
    m = measured[kind]
    symmetric = m["band_entries"] == M * (M + 1) // 2
    assert m["band_entries"] == (M * (M + 1) // 2 if symmetric else M * M)
    keep = np.triu(np.ones((M, M), dtype=bool)) if symmetric else np.ones((M, M), dtype=bool)
    if symmetric:  # the published noise is symmetric: the lower triangle repeats the upper
        np.testing.assert_array_equal(m["noise"], np.swapaxes(m["noise"], 1, 2))
    ratio = np.abs(m["noise"][:, keep]) / m["std"][:, keep]
    rate = float(np.mean(np.all(ratio <= m["band_z"], axis=1)))
    se = float(np.sqrt(0.95 * 0.05 / TRIALS))
    if kind == "dp-pca":
        assert rate >= 0.95 - 3 * se, f"{kind}: band coverage {rate:.4f}"
    else:
        assert abs(rate - 0.95) <= 3 * se, f"{kind}: band coverage {rate:.4f} +- {se:.4f}"
    per_entry = float(np.mean(np.all(ratio <= 1.959963984540054, axis=1)))
    assert per_entry < 0.75, f"{kind}: per-entry intervals cover all at once in {per_entry:.3f}"


#: kinds for the correlation intervals, on N_LARGE records: the delta method needs noise small
#: against the diagonal
CORRELATION_KINDS = ("equi-modal", "unimodal", "symmetric-[0,1]", "add-remove-gram")
N_LARGE = 20_000


@pytest.fixture(scope="module")
def measured_large(tmp_path_factory: pytest.TempPathFactory, client: Any) -> dict[str, Any]:
    return {
        kind: _published_noise(
            kind, tmp_path_factory.mktemp("large-" + kind.replace("[", "")), client, N_LARGE
        )
        for kind in CORRELATION_KINDS
    }


@pytest.mark.parametrize("kind", CORRELATION_KINDS)
def test_correlation_intervals_cover_95_percent(kind: str, measured_large: dict[str, Any]) -> None:
    """The approximate (delta-method) 95 % intervals of the correlations cover the clipped
    data's correlations 95 % of the time within 3 standard errors, pooled over the
    off-diagonal entries (the accessor's own computation on every trial's release)."""
    from mvg_dask.plan.estimators import correlation_with_std

    m = measured_large[kind]
    truth = m["truth"]
    d = np.sqrt(np.diag(truth))
    r_true = truth / np.outer(d, d)
    off = ~np.eye(M, dtype=bool)
    hits = []
    for noise, std in zip(m["noise"], m["std"], strict=True):
        r, sd = correlation_with_std(truth + noise, std)
        hits.append((np.abs(r - r_true) <= 1.959963984540054 * sd)[off].mean())
    per_trial = np.array(hits)
    rate, se = per_trial.mean(), per_trial.std(ddof=1) / np.sqrt(TRIALS)
    assert abs(rate - 0.95) <= 3 * se, f"{kind}: correlation coverage {rate:.4f} +- {se:.4f}"


def test_add_remove_covariance_delta_method_intervals_cover_95_percent(
    measured_large: dict[str, Any],
) -> None:
    """Add-remove releases publish ``covariance = gram / record_count``, a ratio of two noisy
    values. The accessor's approximate (delta-method) 95 % intervals for it, computed on each
    trial's published ``covariance``, ``gram`` and ``record_count`` (N = 20,000, seeds
    ``SEED + t``), cover the clipped data's ``X X^T / N`` 95 % of the time within 3 standard
    errors, on and off the diagonal, and say they are approximate."""
    m = measured_large["add-remove-gram"]
    ds = m["ds"].load()  # in memory: each trial's copy then reads nothing from the store
    truth = m["gram_truth"] / N_LARGE
    on = np.eye(M, dtype=bool)
    ci = ds.mvg.confidence_intervals(0.95, variable="covariance")
    assert ci.attrs["approximate"].startswith("delta method")
    hits = []
    for cov, gram, count in m["ratios"]:
        trial = ds.copy()
        for name, value in (("covariance", cov), ("gram", gram), ("record_count", count)):
            trial[name] = ds[name].copy(data=np.asarray(value))
        std = trial.mvg.noise_std("covariance").values
        hits.append(np.abs(cov - truth) <= 1.959963984540054 * std)
    covered = np.stack(hits)
    for name, mask in (("diagonal", on), ("off-diagonal", ~on)):
        per_trial = covered[:, mask].mean(axis=1)
        rate, se = per_trial.mean(), per_trial.std(ddof=1) / np.sqrt(TRIALS)
        assert abs(rate - 0.95) <= 3 * se, f"{name}: coverage {rate:.4f} +- {se:.4f}"


def test_shrinkage_refuses_noise_not_of_the_form_s_a_i_a_j() -> None:
    """The scales are fitted exactly or not at all: a std matrix off the rank-one form (noise
    in rotated directions, say) gets ``None``, so the shrinkage refuses it."""
    from mvg_dask.plan.estimators import rank_one_scales

    a = np.array([0.5, 1.0, 2.0, 4.0])
    s, fitted = rank_one_scales(0.3 * np.outer(a, a))  # type: ignore[misc]
    np.testing.assert_allclose(s * np.outer(fitted, fitted), 0.3 * np.outer(a, a), rtol=1e-12)
    bent = 0.3 * np.outer(a, a)
    bent[1, 2] = bent[2, 1] = bent[1, 2] * 1.01
    assert rank_one_scales(bent) is None
    assert rank_one_scales(np.full((3, 3), np.inf)) is None


def test_post_processed_estimators_are_new_variables(measured_large: dict[str, Any]) -> None:
    """PSD projection, shrinkage and correlation on a real release: new variables with their
    provenance; the release is unchanged; shrinkage refuses heterogeneous noise and identity
    releases are refused."""
    ds = measured_large["equi-modal"]["ds"]
    before = ds["covariance"].values.copy()
    psd = ds.mvg.psd_covariance()
    assert psd.name == "covariance_psd" and psd.dims == ds["covariance"].dims
    assert psd.attrs["source_release"] == ds.attrs["mvg_dask_release_id"]
    assert np.linalg.eigvalsh(psd.values).min() >= -1e-12
    shrunk = ds.mvg.shrunk_covariance()
    assert shrunk.name == "covariance_shrunk" and shrunk.attrs["noise_edge"] > 0
    corr = ds.mvg.correlation()
    assert corr.attrs["approximate"] and corr["value"].dims == ds["covariance"].dims
    np.testing.assert_allclose(np.diag(corr["value"].values), 1.0)
    assert np.all(corr["lower"].values <= corr["value"].values)
    np.testing.assert_array_equal(ds["covariance"].values, before)
    assert "covariance_psd" not in ds and "correlation" not in ds
    gram = measured_large["add-remove-gram"]["ds"]
    assert gram.mvg.shrunk_covariance().shape == (M, M)
    assert gram.mvg.correlation()["value"].shape == (M, M)


def test_shrinkage_and_identity_releases_are_refused(tmp_path: Path, client: Any) -> None:
    """Shrinkage needs off-diagonal noise stds of the form ``s a_i a_j``: a binary allocation's
    are, so its release is rescaled by the public ``a``, shrunk and scaled back (checked against
    that computation done by hand from the published stds); the covariance estimators need a
    covariance release."""
    from mvg_dask.plan.estimators import spiked_shrinkage

    X = np.random.default_rng(4).uniform(0, 1, (M, N))
    make_input(tmp_path / "in.zarr", X, chunk=20)
    mech = {"algorithm": "equi-modal", "allocation": {"strategy": "binary", "important": [0]}}
    spec = _spec(tmp_path, 0.0, 1.0, mech, {})
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    shrunk = ds.mvg.shrunk_covariance()
    std = ds.mvg.noise_std("covariance").values
    a = np.empty(M)  # s^(1/2) a_i from three entries, then row 0 (std_0j = s a_0 a_j)
    a[0] = np.sqrt(std[0, 1] * std[0, 2] / std[1, 2])
    a[1:] = std[0, 1:] / a[0]
    w = np.outer(a, a)
    by_hand = spiked_shrinkage(ds["covariance"].values / w, 1.0) * w
    np.testing.assert_allclose(shrunk.values, by_hand, rtol=1e-9, atol=1e-12)
    assert len(shrunk.attrs["noise_scales"]) == M
    assert ds.mvg.psd_covariance().shape == (M, M)
    ident = {**spec, "query": "identity", "mechanism": {"algorithm": "unimodal"}}
    ident["output"] = {"store": str(tmp_path / "ident.zarr")}
    rel = api.open_release(api.release(ident, client=client, seed=1, progress=False).output)
    for method in ("psd_covariance", "shrunk_covariance", "correlation"):
        with pytest.raises(ValueError, match="needs a covariance, centered-covariance or regr"):
            getattr(rel.mvg, method)()
