"""The modern DP covariance baselines, the identity shrinker and the covariance benchmark.

Each baseline is checked against what its paper says it does, by an independent route: its noise
level by Monte Carlo against the zCDP calibration written out by hand, its output at a huge
budget against the non-private answer. Statistical checks state their seed and alpha.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from mvg_dask_lab.baselines.covariance import (
    InMemoryRecords,
    adaptive_cov,
    advanced_composition_epsilon,
    coinpress_cov,
    em_cov,
    gauss_cov,
    separate_cov,
)


def _ball_records(seed: int, n: int, d: int, scale: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.linspace(0.5, 1.5, d) * scale
    return X / np.maximum(np.linalg.norm(X, axis=1), 1.0)[:, None]


def test_gauss_cov_noise_matches_the_zcdp_calibration() -> None:
    """Seed 0, 3,000 draws, alpha = 0.001 (two-sided chi-square on the variance of every entry).

    rho-zCDP Gaussian mechanism: sigma = Delta / sqrt(2 rho) with Delta = sqrt(2) r^2 / n
    (replace-one, ||x|| <= r): n = 1,000, rho = 0.5, r = 1 gives sigma = sqrt(2) / 1,000.
    """
    d, n, rho, draws = 3, 1000, 0.5, 3000
    rng = np.random.default_rng(0)
    S = np.zeros((d, d))
    Z = np.stack([gauss_cov(S, n, rho, rng, clip_eigen=False) for _ in range(draws)])
    sigma = math.sqrt(2.0) / 1000.0
    np.testing.assert_array_equal(Z, np.swapaxes(Z, 1, 2))
    for i in range(d):
        for j in range(i, d):
            stat = float(np.sum(Z[:, i, j] ** 2)) / sigma**2
            p = stats.chi2.cdf(stat, draws)
            assert 0.0005 < p < 0.9995, (i, j, p)


def test_separate_cov_eigenvalue_noise_matches_its_calibration() -> None:
    """Seed 1, 2,000 draws, alpha = 0.001: the eigenvalues of SeparateCov's output, when the
    eigenvalues of S are far apart (the noisy eigenvectors are then exact to 1e-6), carry noise of
    std sqrt(2) r^2 / (n sqrt(rho)) each (half the budget, the Hoffman-Wielandt bound)."""
    n, rho, draws = 1000, 0.5, 2000
    S = np.diag([0.5, 0.3, 0.1])
    rng = np.random.default_rng(1)
    lam = np.stack(
        [np.linalg.eigvalsh(separate_cov(S, n, rho, rng, clip_eigen=False)) for _ in range(draws)]
    )
    noise = lam[:, ::-1] - np.array([0.5, 0.3, 0.1])
    sigma = math.sqrt(2.0) / (n * math.sqrt(rho))
    for k in range(3):
        p = stats.chi2.cdf(float(np.sum(noise[:, k] ** 2)) / sigma**2, draws)
        assert 0.0005 < p < 0.9995, (k, p)


@pytest.mark.parametrize("estimator", ["gauss", "separate", "adaptive", "amin"])
def test_baselines_recover_the_truth_at_a_huge_budget(estimator: str) -> None:
    """Seed 2: with a budget of rho = 10^8 every estimator returns X^T X / n of the (clipped)
    records to 1e-3 relative, and a PSD matrix. Amin et al. (epsilon = 10^8) draw each
    eigenvector from a Bingham law whose spread falls only as one over the root of epsilon
    times the eigengap: 1e-2 relative."""
    X = _ball_records(2, 4000, 5, 0.2)
    records = InMemoryRecords(X)
    S = X.T @ X / X.shape[0]
    rng = np.random.default_rng(2)
    if estimator == "gauss":
        est = gauss_cov(S, records.n, 1e8, rng)
    elif estimator == "separate":
        est = separate_cov(S, records.n, 1e8, rng)
    elif estimator == "adaptive":
        est = adaptive_cov(records, 1e8, rng)
    else:
        est = em_cov(S, records.n, 1e8, 1e-10, rng)
    tol = 1e-2 if estimator == "amin" else 1e-3
    assert np.linalg.norm(est - S) < tol * np.linalg.norm(S)
    assert np.linalg.eigvalsh(est).min() > -1e-12


def test_adaptive_cov_clips_to_the_norms_it_finds() -> None:
    """Seed 3: records of norm at most 0.1 in a declared unit ball. At a large budget the sparse
    vector picks a radius of at most 2 * 0.1, so the output's eigenvalues are at most 0.2^2,
    well under the declared r^2 = 1 that Analyze Gauss would clip to."""
    X = _ball_records(3, 20_000, 4, 0.02)
    X = X * np.minimum(1.0, 0.1 / np.linalg.norm(X, axis=1))[:, None]
    est = adaptive_cov(InMemoryRecords(X), 1e4, np.random.default_rng(3))
    assert np.linalg.eigvalsh(est).max() <= 0.04 + 1e-12
    S = X.T @ X / X.shape[0]
    assert np.linalg.norm(est - S) < 0.05 * np.linalg.norm(S)


def test_coinpress_recovers_a_gaussian_covariance() -> None:
    """Seed 4: CoinPress is made for Gaussian data. 50,000 draws of N(0, Sigma) with
    eigenvalues in [0.2, 1] (u = 1), rho = 10: relative error under 5 %."""
    rng = np.random.default_rng(4)
    d = 5
    Sigma = np.diag(np.linspace(0.2, 1.0, d))
    X = rng.standard_normal((50_000, d)) @ np.sqrt(Sigma)
    est = coinpress_cov(InMemoryRecords(X), 10.0, rng)
    assert np.linalg.norm(est - Sigma) < 0.05 * np.linalg.norm(Sigma)
    with pytest.raises(ValueError, match="at least one step"):
        coinpress_cov(InMemoryRecords(X), 1.0, rng, steps=0)


@pytest.mark.parametrize(("epsilon", "k", "delta"), [(0.5, 20, 1e-10), (1.5, 500, 1e-6)])
def test_advanced_composition_epsilon_solves_its_equation(
    epsilon: float, k: int, delta: float
) -> None:
    """The root satisfies sqrt(2 k log(1/delta)) e0 + k e0^2 = epsilon (checked directly), and
    the exact advanced-composition bound with e^e0 - 1 stays within 1 % of epsilon."""
    e0 = advanced_composition_epsilon(epsilon, k, delta)
    assert math.isclose(math.sqrt(2 * k * math.log(1 / delta)) * e0 + k * e0 * e0, epsilon)
    exact = math.sqrt(2 * k * math.log(1 / delta)) * e0 + k * e0 * math.expm1(e0)
    assert exact == pytest.approx(epsilon, rel=0.01)


def test_baselines_refuse_bad_budgets() -> None:
    rng = np.random.default_rng(0)
    S = np.eye(2)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="rho"):
            gauss_cov(S, 10, bad, rng)
    with pytest.raises(ValueError, match="epsilon"):
        em_cov(S, 10, 1.0, 0.0, rng)


# -- the identity shrinker ------------------------------------------------------------------------


def test_identity_shrinkage_noise_term_matches_the_published_noise() -> None:
    """Seed 5, 2,000 releases of the product's default covariance plan (m = 8): the mean of
    ||W - (tr W / m) I||_F^2 over the published noise W is within 4 standard errors of
    nu = sum s_ij^2 - sum s_ii^2 / m from the plan's released_entry_std (alpha ~ 6e-5)."""
    from mvg_dask.noise import NoiseKey
    from mvg_dask.plan.domain import L2BallDomain
    from mvg_dask.plan.queries import CovarianceQuery
    from mvg_dask_lab.experiments.mechanisms import symmetric_plan

    m, n = 8, 1000
    plan = symmetric_plan(CovarianceQuery(m, n), L2BallDomain(1.0, m), epsilon=1, delta=1e-6)
    std = plan.released_entry_std()
    nu = float(np.sum(std**2) - np.sum(np.diag(std) ** 2) / m)
    root = NoiseKey.from_seed(5)
    vals = []
    for t in range(2000):
        W = plan.draw(root.derive(f"trial/{t}"))
        D = W - np.trace(W) / m * np.eye(m)
        vals.append(float(np.sum(D * D)))
    arr = np.asarray(vals)
    assert abs(arr.mean() - nu) < 4 * arr.std(ddof=1) / math.sqrt(arr.size)


def test_identity_shrinkage_helps_a_flat_spectrum_and_keeps_a_clean_one() -> None:
    """Seed 6: a flat truth 0.01 (I + small spread) under noise of std 0.01 per entry (m = 50):
    the shrunk estimate is at most half the raw error. Without noise (std 0) it is the PSD
    projection of the input, here the input itself."""
    from mvg_dask.plan.estimators import identity_shrinkage, psd_projection

    m = 50
    rng = np.random.default_rng(6)
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    T = 0.01 * (Q * np.linspace(0.9, 1.1, m)) @ Q.T
    Z = rng.standard_normal((m, m)) * 0.01
    W = np.triu(Z) + np.triu(Z, 1).T
    std = np.full((m, m), 0.01)
    est = identity_shrinkage(T + W, std)
    assert np.linalg.norm(est - T) < 0.5 * np.linalg.norm(W)
    assert np.linalg.norm(est - T) < 0.5 * np.linalg.norm(psd_projection(T + W) - T)
    np.testing.assert_allclose(identity_shrinkage(T, np.zeros((m, m))), T, atol=1e-15)
    with pytest.raises(ValueError, match="non-negative"):
        identity_shrinkage(T, -std)


def test_spiked_shrinkage_bulk_mean_keeps_the_floor() -> None:
    """Seed 7: two spikes above an isotropic floor 0.05 I (m = 200, noise std 0.002, edge
    0.057): bulk="mean" puts the floor back (trace within 2 %) and beats bulk="zero"."""
    from mvg_dask.plan.estimators import spiked_shrinkage

    m, s = 200, 0.002
    rng = np.random.default_rng(7)
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    lam = np.full(m, 0.05)
    lam[:2] += [1.0, 0.5]
    T = (Q * lam) @ Q.T
    Z = rng.standard_normal((m, m)) * s
    Y = T + np.triu(Z) + np.triu(Z, 1).T
    zero = spiked_shrinkage(Y, s)
    mean = spiked_shrinkage(Y, s, bulk="mean")
    assert np.trace(mean) == pytest.approx(np.trace(T), rel=0.02)
    assert np.linalg.norm(mean - T) < 0.5 * np.linalg.norm(zero - T)
    with pytest.raises(ValueError, match="bulk"):
        spiked_shrinkage(Y, s, bulk="median")  # type: ignore[arg-type]


# -- the benchmark ---------------------------------------------------------------------------------


def test_covariance_bench_runs_and_writes_its_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A small grid runs every method (Amin et al. and CoinPress included at d = 6), is
    reproducible from its seed, and writes the CSV, the Markdown table and the figure."""
    from mvg_dask.plan.covariance_selection import CANDIDATES
    from mvg_dask_lab.experiments.covariance_bench import (
        BASELINES,
        METHODS,
        PRODUCT,
        read_bench_rows,
        run_covariance_bench,
        write_bench_files,
    )

    kwargs = dict(features=(6,), records=(3000,), epsilons=(1.0,), trials=2, seed=11)
    result = run_covariance_bench(**kwargs)  # type: ignore[arg-type]
    again = run_covariance_bench(**kwargs)  # type: ignore[arg-type]
    assert [r.frobenius for r in result.rows] == [r.frobenius for r in again.rows]
    assert len(result.rows) == 2 * len(METHODS)
    for bench, d, n, eps in result.settings():
        name, err = result.best_baseline(bench, d, n, eps)
        assert name in BASELINES and err > 0
    files = write_bench_files(result, tmp_path / "bench", command="test")
    text = files.markdown.read_text()
    assert "| spiked | 6 | 3,000 | 1 | `mvg-auto` |" in text
    assert "| full-rank | 6 | 3,000 | 1 | `mvg-auto` |" in text
    for setting in result.settings():  # mvg-auto's choice in each trial is a candidate
        assert len(result.choices[setting]) == 2
        assert set(result.choices[setting]) <= set(CANDIDATES)
    assert files.csv.read_text().count("\n") == 1 + len(result.rows)
    assert files.plot.stat().st_size > 10_000
    # the baselines' rows of a run reused: the product's rows measured again, the same
    reused = run_covariance_bench(
        **kwargs,  # type: ignore[arg-type]
        baseline_rows=read_bench_rows(files.csv),
        baselines_from="earlier.csv",
    )
    as_written = {m: m in BASELINES for m in METHODS}  # the CSV keeps 6 significant digits
    assert [(r.method, r.frobenius) for r in reused.rows] == [
        (r.method, float(f"{r.frobenius:.6g}") if as_written[r.method] else r.frobenius)
        for r in result.rows
    ]
    assert reused.reproduced == (2 * len(PRODUCT), 2 * len(PRODUCT))
    text = write_bench_files(reused, tmp_path / "again", command="test").markdown.read_text()
    assert "The baselines' rows are those of earlier.csv" in text
    with pytest.raises(ValueError, match="no baselines with 3 trials"):
        run_covariance_bench(
            **{**kwargs, "trials": 3},  # type: ignore[arg-type]
            baseline_rows=read_bench_rows(files.csv),
        )


def test_covariance_bench_cli_refuses_a_results_doc(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from mvg_dask.cli import app

    out = CliRunner().invoke(
        app,
        ["experiments", "covariance-bench", "--out", str(tmp_path), "--results-doc", "x.md"],
    )
    assert out.exit_code == 2
    assert "--results-doc goes with the paper's experiments" in out.output


def test_baselines_from_goes_with_the_covariance_bench(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from mvg_dask.cli import app

    csv_path = tmp_path / "old.csv"
    csv_path.write_text("benchmark,d\n")
    out = CliRunner().invoke(
        app, ["experiments", "first-pc", "--out", str(tmp_path), "--baselines-from", str(csv_path)]
    )
    assert out.exit_code == 2 and "--baselines-from goes with covariance-bench" in out.output
    out = CliRunner().invoke(
        app,
        [
            "experiments",
            "covariance-bench",
            "--out",
            str(tmp_path),
            "--baselines-from",
            str(csv_path),
        ],
    )
    assert out.exit_code == 2 and "--baselines-from" in out.output
