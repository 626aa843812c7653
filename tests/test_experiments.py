"""Tests of the paper-experiment reproduction (``mvg_dask_lab.experiments``, the command
``mvg-dask experiments``).

A few trials only: the tests check that every table, plot and document is produced, that every
row the issue asks for is present, that the non-private error is exactly 0 where the metric
says so, that the run is reproducible for a fixed seed, and the building blocks (KRR, metrics,
the exact-versus-iid identity the results document relies on) against independent computations.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats
from sklearn.kernel_ridge import KernelRidge
from sklearn.linear_model import Ridge

from mvg_dask.datasets import load_ctg, load_liver, load_movement
from mvg_dask.engine.lattice import RecordLattice, square_release
from mvg_dask.noise import NoiseKey
from mvg_dask.noise.tiles import tile_records_for
from mvg_dask.plan import Allocation, BoxDomain, Directions, MatrixQuery, build_noise_plan
from mvg_dask.plan.lattice import LatticeContext, gram_depth
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery
from mvg_dask.privacy import analytic_gaussian_mu
from mvg_dask.privacy.calibration import Algorithm
from mvg_dask_lab.baselines import iid_baseline
from mvg_dask_lab.experiments import EPSILONS, EXPERIMENTS, run_experiment
from mvg_dask_lab.experiments.cli import experiments
from mvg_dask_lab.experiments.compare import compare_results
from mvg_dask_lab.experiments.covariance import CovarianceExperiment, residual_sum_of_squares
from mvg_dask_lab.experiments.first_pc import FirstPCExperiment, captured_variance_gap
from mvg_dask_lab.experiments.mechanisms import plan_noise, plan_release, traceless_noise
from mvg_dask_lab.experiments.paper_values import PAPER_TABLES
from mvg_dask_lab.experiments.regression import RegressionExperiment, krr_rmse, moments_ridge_rmse
from mvg_dask_lab.experiments.targets import check_targets

TRIALS = 3
SEED = 7

COMMON = {
    "non-private",
    "random-guess",
    "mvg-thm2",
    "mgm-udn",
    "mgm-idn",
    "exact",
    "gaussian-classic",
    "gaussian-analytic",
    "laplace",
    "jl",
}
EXPECTED_METHODS = {
    "regression": COMMON
    | {"mvg-thm2-dppca", "exact-dppca", "exact-moments", "exact-regression", "blr"},
    "first-pc": COMMON
    | {"mvg-thm3", "exact-symmetric", "exact-traceless", "analyze-gauss", "ppca"},
    "covariance": COMMON | {"exact-unbiased", "exact-covariance", "blr"},
}


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(experiments, args)


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


@pytest.fixture(scope="module")
def run_all(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small run of all three experiments through the command, with the results document."""
    root = tmp_path_factory.mktemp("experiments")
    out, doc = root / "out", root / "notebooks" / "results.md"
    before = np.random.get_state()  # noqa: NPY002  (checks the global RNG stays untouched)
    result = _invoke(
        [
            "all",
            "--trials",
            str(TRIALS),
            "--seed",
            str(SEED),
            "--out",
            str(out),
            "--results-doc",
            str(doc),
        ]
    )
    assert result.exit_code == 0, result.output
    after = np.random.get_state()  # noqa: NPY002
    assert str(before) == str(after), "the global NumPy RNG was used"
    stderr = root / "stderr.txt"
    stderr.write_text(result.stderr, encoding="utf-8")
    return {"out": out, "doc": doc, "stderr": stderr}


# -- outputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_output_file_is_written(run_all: dict[str, Path], name: str) -> None:
    out = run_all["out"]
    for suffix in (".csv", "_tau_sweep.csv", ".md", ".png"):
        path = out / f"{name}{suffix}"
        assert path.is_file() and path.stat().st_size > 0, path
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / f"{name}.md").read_text(encoding="utf-8")
    assert "ε = 1, δ = 1/N" in md and "Error versus ε" in md and f"]({name}.png)" in md


def test_progress_goes_to_stderr(run_all: dict[str, Path]) -> None:
    text = run_all["stderr"].read_text(encoding="utf-8")
    for name in EXPERIMENTS:
        assert f"[{name}] exact: done" in text
    assert "results document:" in text


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_all_rows_present_at_every_epsilon(run_all: dict[str, Path], name: str) -> None:
    rows = _rows(run_all["out"] / f"{name}.csv")
    methods = {r["method"] for r in rows}
    assert methods == EXPECTED_METHODS[name]
    for method in methods - {"non-private", "random-guess"}:
        eps = sorted(float(r["epsilon"]) for r in rows if r["method"] == method)
        assert eps == sorted(EPSILONS), method
    for r in rows:
        assert int(r["trials"]) == TRIALS
        if r["epsilon"]:
            assert math.isclose(
                float(r["delta"]),
                1.0 / {"regression": 248, "first-pc": 10_176, "covariance": 2_126}[name],
            )
        assert math.isfinite(float(r["mean"]))


@pytest.mark.parametrize("name", ["first-pc", "covariance"])
def test_non_private_error_is_exactly_zero(run_all: dict[str, Path], name: str) -> None:
    (row,) = [r for r in _rows(run_all["out"] / f"{name}.csv") if r["method"] == "non-private"]
    assert float(row["mean"]) == 0.0
    assert float(row["ci95"]) == 0.0


def test_regression_non_private_matches_sklearn(run_all: dict[str, Path]) -> None:
    (row,) = [r for r in _rows(run_all["out"] / "regression.csv") if r["method"] == "non-private"]
    ds = load_liver()
    y = ds.X[5]
    model = KernelRidge(alpha=1.0, kernel="rbf", gamma=0.2).fit(ds.X[:5].T, y - y.mean())
    pred = model.predict(ds.X_test[:5].T) + y.mean()  # type: ignore[index]
    rmse = float(np.sqrt(np.mean((pred - ds.X_test[5]) ** 2)))  # type: ignore[index]
    assert float(row["mean"]) == pytest.approx(rmse, rel=1e-9)
    assert 0 < rmse < 1


def test_classic_gaussian_marked_invalid_from_epsilon_one(run_all: dict[str, Path]) -> None:
    for name in EXPERIMENTS:
        for r in _rows(run_all["out"] / f"{name}.csv"):
            if r["method"] == "gaussian-classic":
                assert r["valid"] == ("true" if float(r["epsilon"]) < 1 else "false")
            else:
                assert r["valid"] == "true"


def test_tau_sweep_chooses_the_best(run_all: dict[str, Path]) -> None:
    rows = _rows(run_all["out"] / "regression_tau_sweep.csv")
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"]), []).append(r)
    assert {m for m, _ in groups} == {
        "mvg-thm2",
        "mgm-udn",
        "mgm-idn",
        "exact",
        "exact-moments",
        "exact-regression",
    }
    for group in groups.values():
        assert [float(r["tau"]) for r in group] == [0.55, 0.65, 0.75, 0.85, 0.95]
        (chosen,) = [r for r in group if r["chosen"] == "true"]
        assert float(chosen["mean"]) == min(float(r["mean"]) for r in group)


def test_results_document(run_all: dict[str, Path]) -> None:
    doc = run_all["doc"]
    text = doc.read_text(encoding="utf-8")
    for heading in (
        "## Summary at ε = 1",
        "## Exp. I",
        "## Exp. II",
        "## Exp. III",
        "## Why our numbers differ from the paper's",
        "## Reproduce",
    ):
        assert heading in text
    for table in ("Table 3", "Table 4", "Table 5"):
        assert table in text
    # the paper's reported numbers stand beside ours
    assert "1.624 ± 0.026" in text and "1.434 ± 0.192" in text and "6.657 ± 0.193" in text
    assert "ratio exact / baseline" in text and "ratio paper / exact" in text
    # the JL-transform and exponential rows stand beside the paper's values
    for paper_value in ("1.682 ± 0.015", "2.202 ± 0.721", "2.258 ± 0.186", "1.742 ± 0.188"):
        assert paper_value in text
    assert "6.718 ± 0.229" in text and "7.223 ± 0.211" in text
    assert "Paper rows without a counterpart" not in text
    assert "four basic mechanisms at ε = 1" in text
    for label in ("JL transform (BBDS, for Upadhyay [46])", "Exponential: PPCA (Chaudhuri"):
        assert label in text
    # every template variable was filled
    assert "$" not in text
    links = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text)
    assert len(links) == 3
    for link in links:
        assert (doc.parent / link).resolve().is_file(), link
    assert f"--trials {TRIALS} --seed {SEED}" in text


# -- reproducibility ------------------------------------------------------------------------------


def test_same_seed_same_tables_other_seed_other_noise(tmp_path: Path) -> None:
    texts = []
    for i, seed in enumerate((SEED, SEED, SEED + 1)):
        out = tmp_path / f"run{i}"
        result = _invoke(["first-pc", "--trials", "3", "--seed", str(seed), "--out", str(out)])
        assert result.exit_code == 0, result.output
        texts.append((out / "first-pc.csv").read_text(encoding="utf-8"))
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_trials_are_a_prefix_of_longer_runs() -> None:
    short = run_experiment(FirstPCExperiment(), trials=2, seed=3, epsilons=(1.0,))
    long = run_experiment(FirstPCExperiment(), trials=4, seed=3, epsilons=(1.0,))
    for key in ("gaussian-analytic", "laplace", "random-guess"):
        np.testing.assert_array_equal(short.row(key, 1.0).errors, long.row(key, 1.0).errors[:2])


# -- lattice noise: the same utility, the release's published values ---------------------------

#: The MVG rows built on a noise plan (lattice under ``noise="lattice"``) in Exp. II.
FIRST_PC_LATTICE_ROWS = {"mvg-thm2", "mvg-thm3", "mgm-udn", "mgm-idn", "exact", "exact-symmetric"}


def test_lattice_noise_leaves_first_pc_utility_unchanged() -> None:
    """Exp. II, every epsilon, 60 trials, seed 7, run with float and with lattice noise: every
    row's means agree within the rows' confidence intervals at a family-wise alpha = 0.01
    (Bonferroni over the rows: each row at confidence 1 - 0.01 / rows, half-widths combined by
    ``hypot``); the rows that are not MVG releases of a plan are identical."""
    trials, alpha = 60, 0.01
    runs = {
        noise: run_experiment(FirstPCExperiment(noise=noise), trials=trials, seed=SEED)
        for noise in ("float", "lattice")
    }
    assert runs["lattice"].noise == "lattice" and "MVG noise" in runs["lattice"].settings
    assert "MVG noise" not in runs["float"].settings
    count = len(runs["float"].rows)
    rows = compare_results(runs["float"], runs["lattice"], confidence=1.0 - alpha / count)
    assert len(rows) == count == 2 + 13 * len(EPSILONS)
    for row in rows:
        assert row.agrees, row
        if row.method in FIRST_PC_LATTICE_ROWS:
            assert row.difference != 0.0, row  # the lattice path really ran
        else:
            assert row.difference == 0.0, row


def _lattice_plan(query: MatrixQuery, domain: BoxDomain, **kwargs: Any) -> Any:
    """A lattice plan built directly (not through the experiments' helpers)."""
    n = query.records
    depth = 0 if query.kind == "identity" else gram_depth(n, n, 1, 8)
    return build_noise_plan(
        query,
        domain,
        noise="lattice",
        lattice_context=LatticeContext(records=n, depth=depth),
        **kwargs,
    )


@pytest.mark.parametrize("name", ["regression", "first-pc", "covariance", "covariance-query"])
def test_lattice_trial_publishes_what_the_release_publishes(name: str) -> None:
    """A lattice trial's errors are those of the values ``RecordLattice.release`` (identity) and
    ``square_release`` (square queries) publish under the trial's key: the experiment path is
    the release path. With float noise a trial publishes ``f + plan_noise`` bit for bit."""
    eps, tau, trials = 1.0, 0.75, 2
    key = NoiseKey.from_seed(SEED).derive("lattice-trial")
    exp: Any
    if name == "covariance-query":
        exp = CovarianceExperiment(noise="lattice")
        n = exp.dataset.n_records
        method = exp.methods[[m.key for m in exp.methods].index("exact-covariance")]
        plan = _lattice_plan(
            CovarianceQuery(exp.dataset.n_features, n),
            exp.domain,
            epsilon=eps,
            delta=1.0 / n,
            algorithm="symmetric",
            calibration="exact",
        )
        value = exp.dataset.X @ exp.dataset.X.T / n
        ours = exp.evaluate(method, eps, None, trials, key).errors
    else:
        exp = {"regression": RegressionExperiment, "first-pc": FirstPCExperiment}.get(
            name, CovarianceExperiment
        )(noise="lattice")
        n = exp.dataset.n_records
        method = exp.methods[[m.key for m in exp.methods].index("exact")]
        imp = tuple(exp.dataset.important)
        m = exp.query.shape[0]
        plan = _lattice_plan(
            exp.query,
            exp.domain,
            epsilon=eps,
            delta=1.0 / n,
            algorithm="equi-modal" if name == "first-pc" else "unimodal",
            calibration="exact",
            directions=Directions.standard(m, imp),
            allocation=Allocation(strategy="binary", important=imp, share=tau),
        )
        value = exp.dataset.X if exp.query.kind == "identity" else exp.S
        ours = exp.evaluate(method, eps, tau, trials, key).errors
    published = []
    for t in range(trials):
        k = key.derive(f"trial/{t}")
        if plan.query.kind == "identity":
            m, n = value.shape
            lattice = RecordLattice.for_plan(plan)
            published.append(lattice.release(value, k, 0, n, tile=tile_records_for(m), n_total=n))
        else:
            published.append(square_release(value, plan, k))
    released = np.stack(published)
    np.testing.assert_array_equal(plan_release(plan, value, key, trials), released)
    expected = (
        residual_sum_of_squares(exp.S, np.linalg.eigh(released)[1][..., ::-1])
        if name == "covariance-query"
        else exp._released_errors(released)
    )
    np.testing.assert_array_equal(ours, expected)
    # the published values are not the float path's f + Z
    float_plan = build_noise_plan(
        plan.query,
        plan.domain,
        epsilon=eps,
        delta=1.0 / n,
        algorithm=plan.algorithm,
        calibration="exact",
        directions=plan.directions,
        allocation=plan.allocation,
    )
    noise = plan_noise(float_plan, key, trials)
    np.testing.assert_array_equal(plan_release(float_plan, value, key, trials), value[None] + noise)
    assert not np.array_equal(released, value[None] + noise)


def test_command_runs_lattice_noise(tmp_path: Path) -> None:
    """``--noise lattice`` end to end: the report says so; the float default does not."""
    out = tmp_path / "lattice"
    result = _invoke(["first-pc", "--trials", "2", "--noise", "lattice", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "(lattice noise)" in result.stderr
    assert "MVG noise: lattice" in (out / "first-pc.md").read_text(encoding="utf-8")


def test_default_output_is_a_scratch_directory(tmp_path: Path, monkeypatch) -> None:
    """Without ``--out`` the files go to ``out/experiments`` under the working directory, never
    into the committed ``notebooks/paper``."""
    monkeypatch.chdir(tmp_path)
    result = _invoke(["first-pc", "--trials", "2"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "experiments" / "first-pc.csv").is_file()
    assert not (tmp_path / "notebooks").exists()
    assert "[default: out/experiments]" in " ".join(_invoke(["--help"]).output.split())


# -- command-line errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["everything"], "Invalid value"),
        (["first-pc", "--trials", "1"], "--trials"),
        (["first-pc", "--results-doc", "x.md"], "--results-doc needs all three"),
        (["first-pc", "--noise", "exact"], "--noise"),
    ],
)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = _invoke([*args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert message in result.output


# -- building blocks ----------------------------------------------------------------------------


def test_krr_matches_scikit_learn() -> None:
    rng = np.random.default_rng(0)
    tx, ty = rng.random((3, 40, 5)), rng.random((3, 40))
    ex, ey = rng.random((15, 5)), rng.random(15)
    ours = krr_rmse(tx, ty, ex, ey, alpha=0.5, gamma=0.7)
    for t in range(3):
        m = ty[t].mean()
        model = KernelRidge(alpha=0.5, kernel="rbf", gamma=0.7).fit(tx[t], ty[t] - m)
        ref = np.sqrt(np.mean((model.predict(ex) + m - ey) ** 2))
        assert ours[t] == pytest.approx(ref, rel=1e-10)


def test_moments_ridge_matches_scikit_learn() -> None:
    """Ridge from exact moments = scikit-learn's Ridge (intercept) with alpha = lambda N."""
    rng = np.random.default_rng(3)
    n, d, lam = 60, 4, 0.3
    x, y = rng.random((n, d)), rng.random(n)
    z = np.column_stack([x, y, np.ones(n)])
    moments = (z.T @ z / n)[None]
    ex, ey = rng.random((10, d)), rng.random(10)
    ours = moments_ridge_rmse(moments, ex, ey, target=d, ridge=lam)[0]
    model = Ridge(alpha=lam * n).fit(x, y)
    assert ours == pytest.approx(np.sqrt(np.mean((model.predict(ex) - ey) ** 2)), rel=1e-10)


def test_traceless_noise_calibration_and_law() -> None:
    """Exp. II's traceless row: sensitivity from an independent grid search, sigma = Delta / mu*,
    and the draws' entry variances (chi-square, two-sided, alpha = 0.001 each; key seed 5)."""
    m, n, eps, delta = 4, 100, 1.0, 1e-3
    tl = traceless_noise(
        BoxDomain.create(-1.0, 1.0, m),
        n,
        epsilon=eps,
        delta=delta,
        key=NoiseKey.from_seed(5),
        trials=3000,
    )
    grid = np.array(np.meshgrid(*[[-1.0, 0.0, 1.0]] * m)).reshape(m, -1).T
    best = 0.0
    for x in grid:
        for y in grid:
            D = np.outer(x, x) - np.outer(y, y)
            P = D - np.trace(D) / m * np.eye(m)
            iu = np.triu_indices(m, 1)
            best = max(best, float(np.sum(P[iu] ** 2) + tl.ratio * np.sum(np.diag(P) ** 2)))
    assert tl.sensitivity == pytest.approx(math.sqrt(best / tl.ratio) / n, rel=1e-9)
    assert tl.sensitivity / tl.sigma == pytest.approx(analytic_gaussian_mu(eps, delta), rel=1e-9)
    assert 2.5 < tl.ratio < 4.0  # beyond the symmetric mechanism's r* = 2.5, still Q* = 16
    Z = tl.noise
    assert np.array_equal(Z, np.swapaxes(Z, 1, 2))
    iu = np.triu_indices(m, 1)
    for values, var in (
        (np.diagonal(Z, axis1=1, axis2=2), tl.sigma**2),
        (Z[:, iu[0], iu[1]], tl.ratio * tl.sigma**2),
    ):
        k = values.size
        stat = float(np.sum(values**2) / var)
        assert stats.chi2.ppf(0.0005, k) < stat < stats.chi2.ppf(0.9995, k)


def test_metrics_against_definitions() -> None:
    rng = np.random.default_rng(1)
    A = rng.standard_normal((5, 5))
    S = A @ A.T
    lam, V = np.linalg.eigh(S)
    v = rng.standard_normal((4, 5))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    gap = captured_variance_gap(S, v)
    np.testing.assert_allclose(gap, lam[-1] - np.einsum("ti,ij,tj->t", v, S, v), rtol=1e-12)
    assert np.all(gap >= -1e-12)
    # RSS: 0 for the true basis in order, sum of squared eigen-gaps for a reversed basis
    true = V[None, :, ::-1]
    assert residual_sum_of_squares(S, true)[0] == 0.0
    expected = np.sum((lam[::-1] - lam) ** 2)
    assert residual_sum_of_squares(S, V[None])[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("loader", "kind", "algorithm"),
    [
        (load_liver, "identity", "unimodal"),
        (load_movement, "covariance", "equi-modal"),
        (load_ctg, "identity", "unimodal"),
    ],
)
def test_uniform_exact_plan_is_the_iid_analytic_gaussian(
    loader: Any, kind: str, algorithm: Algorithm
) -> None:
    """The claim of the results document: exact + uniform allocation = iid analytic Gaussian."""
    ds = loader()
    m, n = ds.X.shape
    domain = BoxDomain.create(ds.lower, ds.upper, m)
    query = IdentityQuery(m, n) if kind == "identity" else CovarianceQuery(m, n)
    for eps in EPSILONS:
        plan = build_noise_plan(
            query,
            domain,
            epsilon=eps,
            delta=1.0 / n,
            algorithm=algorithm,
            calibration="exact",
            allocation=Allocation(strategy="uniform"),
        )
        mech = iid_baseline("gaussian-analytic", query, domain, epsilon=eps, delta=1.0 / n)
        np.testing.assert_allclose(plan.entry_std(), mech.entry_std, rtol=1e-9)


def test_paper_values_map_to_methods() -> None:
    for name, table in PAPER_TABLES.items():
        keys = {m.key for m in EXPERIMENTS[name]().methods}
        for row in table.rows:
            assert row.ours in keys, (name, row.label)
        assert table.by_method()["non-private"].mean == (1.226 if name == "regression" else 0.0)


def test_targets_are_computed_from_the_rows() -> None:
    result = run_experiment(EXPERIMENTS["first-pc"](), trials=2, seed=0, epsilons=(1.0,))
    check = check_targets(result)
    exact_rows = [r for r in result.rows_at(1.0) if r.method.kind == "exact"]
    assert {r.method.key for r in exact_rows} == {"exact", "exact-symmetric", "exact-traceless"}
    assert check.exact.mean == min(r.mean for r in exact_rows)  # target 1: the best exact design
    assert check.exact_design.method.key == "exact"  # target 2 compares like with like
    assert check.baseline.method.kind == "baseline" and check.baseline.evaluation.valid
    assert check.paper.method.key in ("mvg-thm2", "mvg-thm3")
    assert check.ratio_exact_baseline == pytest.approx(check.exact.mean / check.baseline.mean)
    assert check.ratio_paper_exact == pytest.approx(check.paper.mean / check.exact_design.mean)
    assert check.met_paper == (check.ratio_paper_exact >= 10)


def test_report_templates_hold_no_measured_numbers() -> None:
    """Prose comes from templates; no decimal number (a measured value) is typed into them.

    Allowed: arXiv identifiers and the classic Gaussian's formula constant ``ln(1.25/δ)``.
    """
    from importlib import resources

    folder = resources.files("mvg_dask_lab.experiments").joinpath("templates")
    names = [p.name for p in folder.iterdir() if p.name.endswith(".md")]
    assert len(names) >= 8
    for name in names:
        text = folder.joinpath(name).read_text(encoding="utf-8")
        text = re.sub(r"arXiv:\d{4}\.\d{4,5}", "", text).replace("ln(1.25/δ)", "")
        assert not re.findall(r"\d+\.\d+", text), name
