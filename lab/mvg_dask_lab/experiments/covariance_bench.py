"""The covariance benchmark: the product's covariance release against the modern DP baselines.

``mvg-dask experiments covariance-bench`` releases ``S = X^T X / N`` of synthetic records in the
unit ``l2`` ball (``d`` features, ``N`` records, rows here) and measures the relative errors
``||S~ - S||_F / ||S||_F`` and ``||S~ - S||_2 / ||S||_2`` over seeded trials, for:

* the product: the default covariance release (exact calibration, symmetric noise, the declared
  domain ``||x|| <= 1``), raw (``mvg``), projected onto the PSD cone (``mvg-psd``), with the
  spiked-Wigner eigenvalue shrinker and the bulk set to its mean (``mvg-shrink``), or shrunk
  toward a multiple of the identity (``mvg-identity``), projected onto the PSD matrices of
  trace at most the declared domain's bound ``sup ||x||^2 = 1`` (``mvg-nuclear``) or the
  release's own trace (``mvg-nuclear-trace``), and the estimator that chooses among all of these
  from the release by Stein's unbiased risk estimate (``mvg-auto``), all free post-processing
  with the plan's public noise law
  (:func:`~mvg_dask.plan.estimators.psd_projection`,
  :func:`~mvg_dask.plan.estimators.spiked_shrinkage`,
  :func:`~mvg_dask.plan.estimators.identity_shrinkage`,
  :func:`~mvg_dask.plan.covariance_selection.nuclear_norm_projection`,
  :func:`~mvg_dask.plan.covariance_selection.select_covariance`);
* the baselines of :mod:`mvg_dask_lab.baselines.covariance`: Analyze Gauss, SeparateCov and
  AdaptiveCov (Dong et al. 2022), CoinPress (Biswas et al. 2020) and, up to 100 features, Amin et
  al. (2019).

Privacy is matched exactly where it can be: the product and every zCDP baseline run at the same
``(epsilon, delta)``. The product's release is a Gaussian mechanism calibrated exactly
(``mu = analytic_gaussian_mu(epsilon, delta)``, Balle and Wang); each zCDP baseline gets
``rho = mu^2 / 2``, which is exactly ``(epsilon, delta)`` for a composition of Gaussian
mechanisms and more than its due for AdaptiveCov's sparse-vector step (which the zCDP budget
treats as Gaussian): the comparison never favours the product. Amin et al. run at
``(epsilon, delta)`` by their own accounting (Laplace plus advanced composition).

The product's design is fixed in advance and the same for every setting: ``mvg-auto``, which
picks its estimator from the release alone. (Before it, the design was chosen per benchmark
from the spectrum: the spiked shrinker for the spiked benchmark, the shrinkage toward the
identity for the full-rank one; :data:`FORMER_DESIGN` keeps that choice for comparison.)
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import numpy as np

from mvg_dask.noise import NoiseKey
from mvg_dask.plan.covariance_selection import sure_risks
from mvg_dask.plan.domain import L2BallDomain
from mvg_dask.plan.queries import CovarianceQuery
from mvg_dask.privacy import analytic_gaussian_mu
from mvg_dask_lab.baselines.covariance import (
    adaptive_cov,
    clipped_gram,
    coinpress_cov,
    em_cov,
    gauss_cov,
    separate_cov,
)

__all__ = [
    "BENCHMARKS",
    "DEFAULT_EPSILONS",
    "DEFAULT_FEATURES",
    "DEFAULT_RECORDS",
    "METHODS",
    "BenchResult",
    "SyntheticRecords",
    "run_covariance_bench",
    "write_bench_files",
]

Benchmark = Literal["spiked", "full-rank"]
BENCHMARKS: Final[tuple[Benchmark, ...]] = ("spiked", "full-rank")
DEFAULT_FEATURES: Final = (20, 100, 500)
DEFAULT_RECORDS: Final = (10_000, 1_000_000)
DEFAULT_EPSILONS: Final = (0.1, 0.3, 1.0, 3.0)
#: Dong et al.'s synthetic tests use this delta.
DEFAULT_DELTA: Final = 1e-10
#: Amin et al. draw one Bingham vector per feature, each after a null-space SVD: O(d^4) work.
EM_MAX_FEATURES: Final = 100
#: CoinPress re-reads every record twice per trial (whitened, clipped Gram matrices), so a
#: trial costs O(N d^2) per step. It runs up to this many elements (d = 20 at N = 10^6); where
#: it runs it is never the best baseline.
COINPRESS_MAX_ELEMENTS: Final = 20_000_000
TRACE: Final = 0.5
SPIKES: Final = (5.0, 4.0, 3.0, 2.0, 1.0)
SPIKE_SHARE: Final = 0.9
_CHUNK_ELEMENTS: Final = 1 << 22

PRODUCT: Final = (
    "mvg",
    "mvg-psd",
    "mvg-shrink",
    "mvg-identity",
    "mvg-nuclear",
    "mvg-nuclear-trace",
    "mvg-auto",
)
#: Each product method's candidate of :func:`~mvg_dask.plan.covariance_selection.sure_risks`.
_CANDIDATE: Final[dict[str, str]] = {
    "mvg": "raw",
    "mvg-psd": "psd",
    "mvg-shrink": "spiked",
    "mvg-identity": "identity",
    "mvg-nuclear": "nuclear-domain",
    "mvg-nuclear-trace": "nuclear-trace",
}
BASELINES: Final = ("gauss", "separate", "adaptive", "coinpress", "amin")
METHODS: Final = PRODUCT + BASELINES
#: The product's design, fixed in advance and the same for every setting.
DESIGNED_METHOD: Final[dict[str, str]] = {"spiked": "mvg-auto", "full-rank": "mvg-auto"}
#: The former design, chosen per benchmark from the spectrum (for comparison only).
FORMER_DESIGN: Final[dict[str, str]] = {"spiked": "mvg-shrink", "full-rank": "mvg-identity"}
#: The targets: the design's error over the best baseline's.
TARGET: Final[dict[str, float]] = {"spiked": 0.8, "full-rank": 1.0}


@dataclass
class SyntheticRecords:
    """Seeded synthetic records in the unit ball, generated chunk by chunk on every read.

    ``x = Sigma^(1/2) g`` with ``g ~ N(0, I_d)``, scaled to norm 1 where longer. ``tr Sigma =
    0.5``. Spiked: 90 % of the trace on 5 random directions in the ratio 5:4:3:2:1, the rest
    isotropic. Full-rank: eigenvalues evenly spaced over ``[1, 2]`` (up to scale) in a random
    basis.

    Parameters
    ----------
    kind : {"spiked", "full-rank"}
        The benchmark.
    d, n : int
        Features and records.
    seed : int
        Seed of the data (not of any noise).
    """

    kind: Benchmark
    d: int
    n: int
    seed: int
    _factor: np.ndarray = field(init=False, repr=False)
    _norms: np.ndarray | None = field(default=None, init=False, repr=False)
    _grams: dict[float | None, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, self.d, 0])
        Q, _ = np.linalg.qr(rng.standard_normal((self.d, self.d)))
        if self.kind == "spiked":
            k = min(len(SPIKES), self.d)
            spikes = np.asarray(SPIKES[:k]) / sum(SPIKES[:k]) * SPIKE_SHARE * TRACE
            rest = (1.0 - SPIKE_SHARE) * TRACE / self.d
            lam = np.full(self.d, rest)
            lam[:k] += spikes
        else:
            lam = np.linspace(1.0, 2.0, self.d)
            lam *= TRACE / lam.sum()
        self._factor = Q * np.sqrt(lam)  # x = factor @ g

    def chunks(self) -> Iterator[np.ndarray]:
        """The records, ``rows x d`` chunks in a fixed order (regenerated on every call)."""
        rows = max(1, _CHUNK_ELEMENTS // self.d)
        for j, lo in enumerate(range(0, self.n, rows)):
            rng = np.random.default_rng([self.seed, self.d, 1, j])
            X = rng.standard_normal((min(rows, self.n - lo), self.d)) @ self._factor.T
            norms = np.linalg.norm(X, axis=1)
            yield X / np.maximum(norms, 1.0)[:, None]

    def norms(self) -> np.ndarray:
        """``||x_i||`` of every record."""
        if self._norms is None:
            self._norms = np.concatenate([np.linalg.norm(X, axis=1) for X in self.chunks()])
        return self._norms

    def gram(self, transform: np.ndarray | None = None, clip: float | None = None) -> np.ndarray:
        """``sum_i w_i w_i^T`` (:class:`mvg_dask_lab.baselines.covariance.Records`)."""
        cacheable = transform is None
        if cacheable and clip in self._grams:
            return self._grams[clip]
        total = np.zeros((self.d, self.d))
        norms = []
        for X in self.chunks():
            total += clipped_gram(X, transform, clip)
            if self._norms is None:
                norms.append(np.linalg.norm(X, axis=1))
        if self._norms is None:
            self._norms = np.concatenate(norms)
        if cacheable:
            self._grams[clip] = total
        return total


@dataclass(frozen=True)
class BenchRow:
    """Mean relative errors of one method at one setting."""

    benchmark: str
    d: int
    n: int
    epsilon: float
    method: str
    trials: int
    frobenius: float
    frobenius_se: float
    spectral: float
    spectral_se: float
    seconds: float


@dataclass
class BenchResult:
    """Every row of a benchmark run and its settings."""

    rows: list[BenchRow]
    delta: float
    trials: int
    seed: int
    elapsed: float
    #: ``mvg-auto``'s choice in every trial, per ``(benchmark, d, n, epsilon)``.
    choices: dict[tuple[str, int, int, float], list[str]] = field(default_factory=dict)
    #: Where the baselines' rows came from, when reused (:func:`read_bench_rows`).
    baselines_from: str | None = None
    #: Reused runs: how many of the earlier run's product rows this run reproduced (the same
    #: mean error to 6 significant digits), and how many it had.
    reproduced: tuple[int, int] = (0, 0)

    def value(self, benchmark: str, d: int, n: int, epsilon: float, method: str) -> float:
        """Mean relative Frobenius error of one method at one setting (NaN if not run)."""
        for row in self.rows:
            if (row.benchmark, row.d, row.n, row.epsilon, row.method) == (
                benchmark,
                d,
                n,
                epsilon,
                method,
            ):
                return row.frobenius
        return math.nan

    def settings(self) -> list[tuple[str, int, int, float]]:
        """The ``(benchmark, d, n, epsilon)`` settings, in run order."""
        seen: dict[tuple[str, int, int, float], None] = {}
        for row in self.rows:
            seen[(row.benchmark, row.d, row.n, row.epsilon)] = None
        return list(seen)

    def best_baseline(self, benchmark: str, d: int, n: int, epsilon: float) -> tuple[str, float]:
        """The baseline with the smallest mean relative Frobenius error at a setting."""
        scored = [(self.value(benchmark, d, n, epsilon, m), m) for m in BASELINES]
        err, name = min((e, m) for e, m in scored if not math.isnan(e))
        return name, err


def _relative_errors(estimate: np.ndarray, S: np.ndarray) -> tuple[float, float]:
    diff = estimate - S
    fro = float(np.linalg.norm(diff) / np.linalg.norm(S))
    spec = float(np.linalg.norm(diff, 2) / np.linalg.norm(S, 2))
    return fro, spec


def _product_estimators(
    S: np.ndarray, n: int, epsilon: float, delta: float
) -> Callable[[NoiseKey], tuple[dict[str, np.ndarray], str]]:
    """The product's release, its post-processed estimates and ``mvg-auto``'s choice."""
    from mvg_dask_lab.experiments.mechanisms import symmetric_plan

    d = S.shape[0]
    plan = symmetric_plan(CovarianceQuery(d, n), L2BallDomain(1.0, d), epsilon=epsilon, delta=delta)
    std = plan.released_entry_std()
    bound = plan.domain.sup_norm_sq()  # tr S <= sup ||x||^2: public

    def draw(key: NoiseKey) -> tuple[dict[str, np.ndarray], str]:
        released = S + plan.draw(key)
        # one eigendecomposition for every candidate (each the named estimator exactly:
        # tests/test_covariance_selection.py); mvg-auto takes the smallest risk estimate
        risks, estimates = sure_risks(released, std, trace_bound=bound)
        out = {name: estimates[c] for name, c in _CANDIDATE.items()}
        choice = min(risks, key=lambda c: risks[c])
        out["mvg-auto"] = estimates[choice]
        return out, choice

    return draw


def run_covariance_bench(
    *,
    benchmarks: Sequence[Benchmark] = BENCHMARKS,
    features: Sequence[int] = DEFAULT_FEATURES,
    records: Sequence[int] = DEFAULT_RECORDS,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    delta: float = DEFAULT_DELTA,
    trials: int = 5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    baseline_rows: Sequence[BenchRow] | None = None,
    baselines_from: str | None = None,
) -> BenchResult:
    """Run the covariance benchmark over every setting.

    The baselines' errors are a deterministic function of the seed (their noise comes from
    seeded keys, their data from the seed), so ``baseline_rows`` from an earlier run of the
    same seed and trials (:func:`read_bench_rows`) can stand in for re-running them: the
    product's rows are measured afresh, and the earlier run's product rows that this run
    measures again are compared (:attr:`BenchResult.reproduced`).

    Parameters
    ----------
    benchmarks : sequence of {"spiked", "full-rank"}
        Which synthetic spectra.
    features, records, epsilons : sequence
        The grid of ``d``, ``N`` and ``epsilon``.
    delta : float, default 1e-10
        The ``delta`` of every method.
    trials : int, default 5
        Seeded trials per method and setting.
    seed : int, default 0
        Seed of the data and of the noise keys (reproducible, not private).
    progress : callable, optional
        Receives one line per setting.
    baseline_rows : sequence of BenchRow, optional
        The baselines' rows of an earlier run with the same seed and trials.
    baselines_from : str, optional
        Where they came from (recorded in the Markdown file).

    Returns
    -------
    BenchResult
        One row per (benchmark, d, N, epsilon, method).
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    start = time.perf_counter()
    root = NoiseKey.from_seed(seed)
    rows: list[BenchRow] = []
    choices: dict[tuple[str, int, int, float], list[str]] = {}
    earlier = {(r.benchmark, r.d, r.n, r.epsilon, r.method): r for r in baseline_rows or ()}
    same = [0, 0]
    for bench in benchmarks:
        for d in features:
            for n in records:
                data = SyntheticRecords(bench, d, n, seed)
                S = data.gram() / n
                for eps in epsilons:
                    tick = time.perf_counter()
                    reuse = None
                    if baseline_rows is not None:
                        reuse = _reused(earlier, (bench, d, n, eps), trials)
                        same[1] += len(_earlier_product_rows(earlier, (bench, d, n, eps)))
                    mine, picked = _run_setting(data, S, eps, delta, trials, root, reuse)
                    if baseline_rows is not None:
                        for r in mine:
                            old = earlier.get((bench, d, n, eps, r.method))
                            if old is not None and r.method in PRODUCT:
                                same[0] += f"{old.frobenius:.6g}" == f"{r.frobenius:.6g}"
                    rows.extend(mine)
                    choices[(bench, d, n, eps)] = picked
                    if progress is not None:
                        best = DESIGNED_METHOD[bench]
                        errs = {r.method: r.frobenius for r in mine}
                        base = min(errs[m] for m in BASELINES if m in errs)
                        progress(
                            f"[{bench} d={d} N={n:,} eps={eps:g}] {best} {errs[best]:.4g}, "
                            f"best baseline {base:.4g} (ratio {errs[best] / base:.3f}), "
                            f"chose {','.join(picked)}, "
                            f"{time.perf_counter() - tick:.1f} s"
                        )
    elapsed = time.perf_counter() - start
    result = BenchResult(rows, delta, trials, seed, elapsed, choices)
    if baseline_rows is not None:
        result.baselines_from = baselines_from or "an earlier run"
        result.reproduced = (same[0], same[1])
    return result


def _earlier_product_rows(
    earlier: dict[tuple[str, int, int, float, str], BenchRow], setting: tuple[str, int, int, float]
) -> list[BenchRow]:
    """The earlier run's product rows at a setting (which this run measures again)."""
    return [r for m in PRODUCT if (r := earlier.get((*setting, m))) is not None]


def _reused(
    earlier: dict[tuple[str, int, int, float, str], BenchRow],
    setting: tuple[str, int, int, float],
    trials: int,
) -> list[BenchRow]:
    found = [r for m in BASELINES if (r := earlier.get((*setting, m))) is not None]
    if not found or any(r.trials != trials for r in found):
        bench, d, n, eps = setting
        raise ValueError(
            f"the reused rows have no baselines with {trials} trials at {bench} d={d} N={n} "
            f"eps={eps:g}: re-run the baselines (no --baselines-from)"
        )
    return found


def read_bench_rows(path: Path) -> list[BenchRow]:
    """The rows of a ``covariance_bench.csv`` (:func:`write_bench_files`).

    Parameters
    ----------
    path : pathlib.Path
        The CSV.

    Returns
    -------
    list of BenchRow
        Its rows.
    """
    with path.open(newline="") as fh:
        return [
            BenchRow(
                r["benchmark"],
                int(r["d"]),
                int(r["N"]),
                float(r["epsilon"]),
                r["method"],
                int(r["trials"]),
                float(r["rel_frobenius"]),
                float(r["rel_frobenius_se"]),
                float(r["rel_spectral"]),
                float(r["rel_spectral_se"]),
                float(r["seconds_per_trial"]),
            )
            for r in csv.DictReader(fh)
        ]


def _run_setting(
    data: SyntheticRecords,
    S: np.ndarray,
    eps: float,
    delta: float,
    trials: int,
    root: NoiseKey,
    reuse: list[BenchRow] | None = None,
) -> tuple[list[BenchRow], list[str]]:
    n, d = data.n, data.d
    rho = analytic_gaussian_mu(eps, delta) ** 2 / 2.0
    product = _product_estimators(S, n, eps, delta)
    baselines: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
        "gauss": lambda rng: gauss_cov(S, n, rho, rng),
        "separate": lambda rng: separate_cov(S, n, rho, rng),
        "adaptive": lambda rng: adaptive_cov(data, rho, rng),
    }
    if d * n <= COINPRESS_MAX_ELEMENTS:
        baselines["coinpress"] = lambda rng: coinpress_cov(data, rho, rng)
    if d <= EM_MAX_FEATURES:
        baselines["amin"] = lambda rng: em_cov(S, n, eps, delta, rng)
    if reuse is not None:
        baselines = {}
    errors: dict[str, list[tuple[float, float]]] = {m: [] for m in METHODS}
    seconds: dict[str, float] = dict.fromkeys(METHODS, 0.0)
    picked: list[str] = []
    for t in range(trials):
        key = root.derive(f"{data.kind}/{d}/{n}/{eps!r}/trial/{t}")
        tick = time.perf_counter()
        estimates, choice = product(key.derive("mvg"))
        picked.append(choice)
        for name, est in estimates.items():
            errors[name].append(_relative_errors(est, S))
            seconds[name] += (time.perf_counter() - tick) / len(estimates)
        for name, fn in baselines.items():
            tick = time.perf_counter()
            est = fn(key.derive(name).generator())
            seconds[name] += time.perf_counter() - tick
            errors[name].append(_relative_errors(est, S))
    out: list[BenchRow] = []
    for name in METHODS:
        if not errors[name]:
            out.extend(r for r in reuse or () if r.method == name)
            continue
        arr = np.asarray(errors[name])
        se = arr.std(axis=0, ddof=1) / math.sqrt(len(arr)) if len(arr) > 1 else np.zeros(2)
        out.append(
            BenchRow(
                data.kind,
                d,
                n,
                eps,
                name,
                len(arr),
                float(arr[:, 0].mean()),
                float(se[0]),
                float(arr[:, 1].mean()),
                float(se[1]),
                seconds[name] / len(arr),
            )
        )
    return out, picked


@dataclass(frozen=True)
class BenchFiles:
    """The files :func:`write_bench_files` wrote."""

    csv: Path
    markdown: Path
    plot: Path


def _choice_text(picked: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for c in picked:
        counts[c] = counts.get(c, 0) + 1
    return ", ".join(f"{c} ×{k}" for c, k in counts.items()) if counts else "–"


def summary_lines(result: BenchResult) -> list[str]:
    """The Markdown table: the product's design against the best baseline, per setting (with
    what ``mvg-auto`` chose in each trial and the former per-benchmark design's ratio)."""
    lines = [
        "| benchmark | d | N | ε | product design | its error | best baseline | its error "
        "| ratio | target | `mvg-auto` chose | former design's ratio |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---|---|---:|",
    ]
    for bench, d, n, eps in result.settings():
        design = DESIGNED_METHOD[bench]
        mine = result.value(bench, d, n, eps, design)
        name, base = result.best_baseline(bench, d, n, eps)
        ratio = mine / base
        ok = "met" if ratio <= TARGET[bench] else "**not met**"
        former = result.value(bench, d, n, eps, FORMER_DESIGN[bench]) / base
        chose = _choice_text(result.choices.get((bench, d, n, eps), []))
        lines.append(
            f"| {bench} | {d} | {n:,} | {eps:g} | `{design}` | {mine:.4g} | `{name}` | {base:.4g} "
            f"| {ratio:.3f} | ≤ {TARGET[bench]:g}: {ok} | {chose} | {former:.3f} |"
        )
    return lines


def write_bench_files(result: BenchResult, out_dir: Path, *, command: str) -> BenchFiles:
    """Write ``covariance_bench.csv``, ``.md`` (with the command that made it) and ``.png``.

    Parameters
    ----------
    result : BenchResult
        The run.
    out_dir : pathlib.Path
        Directory (created if missing).
    command : str
        The command line, recorded in the Markdown file.

    Returns
    -------
    BenchFiles
        The three paths.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = BenchFiles(
        out_dir / "covariance_bench.csv",
        out_dir / "covariance_bench.md",
        out_dir / "covariance_bench.png",
    )
    with paths.csv.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["benchmark", "d", "N", "epsilon", "method", "trials", "rel_frobenius",
             "rel_frobenius_se", "rel_spectral", "rel_spectral_se", "seconds_per_trial"]
        )  # fmt: skip
        for r in result.rows:
            writer.writerow(
                [r.benchmark, r.d, r.n, f"{r.epsilon:g}", r.method, r.trials,
                 f"{r.frobenius:.6g}", f"{r.frobenius_se:.3g}", f"{r.spectral:.6g}",
                 f"{r.spectral_se:.3g}", f"{r.seconds:.4g}"]
            )  # fmt: skip
    detail = [
        "| benchmark | d | N | ε | " + " | ".join(f"`{m}`" for m in METHODS) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(METHODS),
    ]
    for bench, d, n, eps in result.settings():
        cells = []
        for m in METHODS:
            v = result.value(bench, d, n, eps, m)
            cells.append("–" if math.isnan(v) else f"{v:.4g}")
        detail.append(f"| {bench} | {d} | {n:,} | {eps:g} | " + " | ".join(cells) + " |")
    text = [
        "# Covariance benchmark: the product's release against the modern DP baselines",
        "",
        f"Made by `{command}` in {result.elapsed:.0f} s: {result.trials} seeded trials per "
        f"method and setting, δ = {result.delta:g}, seed {result.seed}. Errors are the mean "
        "relative Frobenius error ‖S̃ − S‖_F / ‖S‖_F of S = XᵀX/N (the spectral error is in the "
        "CSV).",
        *(
            [
                "",
                f"The baselines' rows are those of {result.baselines_from} (same seed and "
                "trials: their errors are a deterministic function of the seed); the product's "
                f"rows were measured afresh, and {result.reproduced[0]} of the "
                f"{result.reproduced[1]} product rows that run also had came out the same to "
                "6 significant digits.",
            ]
            if result.baselines_from
            else []
        ),
        "",
        "## The product's design against the best baseline",
        "",
        *summary_lines(result),
        "",
        "## Every method",
        "",
        *detail,
        "",
    ]
    paths.markdown.write_text("\n".join(text))
    _plot(result, paths.plot)
    return paths


def _plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(b, d, n) for b, d, n, _ in result.settings()}, key=lambda p: p)
    cols = max(1, len({(d, n) for _, d, n in panels}))
    rows = len({b for b, _, _ in panels})
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    layout = {
        b: i for i, b in enumerate(dict.fromkeys(b for b, _, _ in panels))
    }  # benchmark -> row
    sizes = {s: j for j, s in enumerate(sorted({(d, n) for _, d, n in panels}))}
    for bench, d, n in panels:
        ax = axes[layout[bench]][sizes[(d, n)]]
        eps = sorted({e for b, dd, nn, e in result.settings() if (b, dd, nn) == (bench, d, n)})
        for method in METHODS:
            ys = [result.value(bench, d, n, e, method) for e in eps]
            if all(math.isnan(y) for y in ys):
                continue
            style = "-" if method in PRODUCT else "--"
            width = 2.0 if method == DESIGNED_METHOD[bench] else 1.0
            ax.plot(eps, ys, style, marker="o", ms=3, lw=width, label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{bench}, d={d}, N={n:,}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("ε", fontsize=7)
    axes[0][0].set_ylabel("relative Frobenius error", fontsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
