"""The experiment loop shared by the three paper experiments: methods x epsilon x trials.

An experiment (:class:`Experiment`) knows its data set, its query, its metric and how to run one
method at one ``epsilon`` for ``trials`` independent trials. This module runs every method over
the epsilon grid at ``delta = 1/N``, sweeps the binary allocation share ``tau`` where the paper
does (and keeps the best ``tau``, as the paper reports it), and summarises each setting by its
mean and the half-width of its 95 % confidence interval.

Noise: ``noise="float"`` (the default, the papers' path) adds float noise matrices to the query
values; ``noise="lattice"`` makes every MVG row built on a :class:`~mvg_dask.plan.NoisePlan`
publish exactly what a lattice release publishes (docs/lattice.md;
:func:`mvg_dask_lab.experiments.mechanisms.plan_release`). The rows that are not MVG releases of a
plan (the references, the iid baselines, the literature's mechanisms, Analyze Gauss and the
traceless symmetric row of Exp. II) are the same under both.

Randomness: every draw comes from a keyed AES-CTR generator (:class:`mvg_dask.noise.NoiseKey`)
derived from ``(seed, experiment, method, epsilon)``; never the global NumPy state. The ``tau``
values of one method share the same standard normals (common random numbers), so the sweep
compares allocations on the same noise.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import numpy as np
from scipy import stats

from mvg_dask.datasets import PaperDataset
from mvg_dask.noise import NoiseKey
from mvg_dask.plan import BoxDomain, MatrixQuery, NoisePlan
from mvg_dask.plan.lattice import NOISE_KINDS, NoiseKind
from mvg_dask.privacy.calibration import Algorithm
from mvg_dask_lab.baselines import BASELINES, iid_baseline
from mvg_dask_lab.experiments.literature import LITERATURE
from mvg_dask_lab.experiments.mechanisms import (
    binary_plan,
    iid_implied_epsilon,
    iid_noise,
    plan_implied_epsilon,
    plan_release,
    plan_std_range,
)
from mvg_dask_lab.experiments.methods import Evaluation, Method

__all__ = [
    "CONFIDENCE",
    "EPSILONS",
    "LATTICE_SETTING",
    "REFERENCE_EPSILON",
    "TAUS",
    "Experiment",
    "ExperimentResult",
    "PaperExperiment",
    "Row",
    "confidence_half_width",
    "run_experiment",
]

#: The epsilon grid of the plots and sweep tables (``delta = 1/N`` throughout).
EPSILONS: Final[tuple[float, ...]] = (0.1, 0.3, 1.0, 3.0)
#: The epsilon of the paper's tables.
REFERENCE_EPSILON: Final = 1.0
#: The binary allocation shares the paper sweeps (Sec. 8.1.3: tau in {55, 65, ..., 95} %).
TAUS: Final[tuple[float, ...]] = (0.55, 0.65, 0.75, 0.85, 0.95)
#: Confidence level of the reported intervals (Sec. 8: "average and 95% confidence interval").
CONFIDENCE: Final = 0.95
#: What the results say about a lattice run (the settings line of its report).
LATTICE_SETTING: Final = (
    "lattice (every MVG row built on a noise plan publishes what a lattice release publishes: "
    "whitened query rounded to the grid 2^k plus exact rounded-Gaussian integers, "
    "effective sensitivity charged; covariances summed with depth L = N)"
)


def confidence_half_width(errors: np.ndarray, confidence: float = CONFIDENCE) -> float:
    """Half-width of the Student-t confidence interval of the mean.

    Parameters
    ----------
    errors : numpy.ndarray
        Per-trial values.
    confidence : float, default 0.95
        Confidence level.

    Returns
    -------
    float
        ``t_{(1+c)/2, n-1} s / sqrt(n)``; 0 for fewer than two values or no spread.
    """
    x = np.asarray(errors, dtype=np.float64)
    n = x.size
    if n < 2 or float(np.ptp(x)) == 0.0:
        return 0.0
    s = float(np.std(x, ddof=1))
    if s == 0.0 or not math.isfinite(s):
        return 0.0 if s == 0.0 else math.inf
    return float(stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * s / math.sqrt(n)


@dataclass(frozen=True, kw_only=True, eq=False)
class Row:
    """The result of one method at one ``epsilon`` (best ``tau`` where swept).

    Attributes
    ----------
    method : Method
        The method.
    epsilon, delta : float or None
        Privacy parameters (``None`` for reference rows).
    tau : float or None
        Chosen binary share (best mean error over :data:`TAUS`), or ``None``.
    evaluation : Evaluation
        Errors and noise description of the chosen setting.
    sweep : tuple of (float, float, float)
        ``(tau, mean, ci)`` for every swept ``tau`` (empty when not swept).
    """

    method: Method
    epsilon: float | None
    delta: float | None
    tau: float | None
    evaluation: Evaluation
    sweep: tuple[tuple[float, float, float], ...] = ()

    @property
    def errors(self) -> np.ndarray:
        """Per-trial errors."""
        return self.evaluation.errors

    @property
    def mean(self) -> float:
        """Mean error over trials."""
        return float(np.mean(self.errors))

    @property
    def ci(self) -> float:
        """Half-width of the 95 % confidence interval of the mean."""
        return confidence_half_width(self.errors)

    @property
    def std(self) -> float:
        """Sample standard deviation over trials."""
        if self.errors.size < 2 or float(np.ptp(self.errors)) == 0.0:
            return 0.0
        return float(np.std(self.errors, ddof=1))


@dataclass(frozen=True, kw_only=True, eq=False)
class ExperimentResult:
    """All rows of one experiment.

    Attributes
    ----------
    name, title, metric : str
        Experiment identifier (``"regression"``...), title and metric name.
    dataset : str
        Data set name.
    features, records : int
        ``M`` and ``N`` of the private data.
    delta : float
        ``1/N``.
    trials, seed : int
        Number of trials and the seed of the noise keys.
    rows : tuple of Row
        Every (method, epsilon) row, references first.
    settings : Mapping of str to str
        Fixed design choices worth printing (hyper-parameters, sample, sensitivities).
    output_range : tuple of float
        Declared range of one entry of the query output (for scale comparisons).
    elapsed : float
        Wall-clock seconds of the run.
    important : tuple of str
        The domain-knowledge features of the binary allocation.
    held_out : int
        Number of held-out (non-private test) records, 0 if none.
    noise : {"float", "lattice"}
        The noise of the MVG rows.
    """

    name: str
    title: str
    metric: str
    dataset: str
    features: int
    records: int
    delta: float
    trials: int
    seed: int
    rows: tuple[Row, ...]
    settings: Mapping[str, str] = field(default_factory=dict)
    output_range: tuple[float, float] = (0.0, 1.0)
    elapsed: float = 0.0
    important: tuple[str, ...] = ()
    held_out: int = 0
    noise: NoiseKind = "float"

    @property
    def methods(self) -> tuple[Method, ...]:
        """The methods in row order (each once)."""
        seen: dict[str, Method] = {}
        for r in self.rows:
            seen.setdefault(r.method.key, r.method)
        return tuple(seen.values())

    @property
    def epsilons(self) -> tuple[float, ...]:
        """The epsilon grid of the run."""
        return tuple(sorted({r.epsilon for r in self.rows if r.epsilon is not None}))

    def row(self, key: str, epsilon: float | None = None) -> Row:
        """The row of method ``key`` at ``epsilon`` (reference rows ignore ``epsilon``).

        Parameters
        ----------
        key : str
            Method key.
        epsilon : float, optional
            Privacy parameter.

        Returns
        -------
        Row
            The row.

        Raises
        ------
        KeyError
            If there is no such row.
        """
        for r in self.rows:
            if r.method.key != key:
                continue
            if r.epsilon is None or epsilon is None or math.isclose(r.epsilon, epsilon):
                return r
        raise KeyError(f"{self.name}: no row {key!r} at epsilon={epsilon!r}")

    def rows_at(self, epsilon: float) -> list[Row]:
        """Reference rows plus every row at ``epsilon``, in method order."""
        out = []
        for m in self.methods:
            try:
                out.append(self.row(m.key, epsilon))
            except KeyError:
                continue
        return out


class Experiment(Protocol):
    """What an experiment module provides to :func:`run_experiment`."""

    name: str
    title: str
    metric: str
    dataset: PaperDataset
    methods: tuple[Method, ...]
    settings: Mapping[str, str]
    output_range: tuple[float, float]
    noise: NoiseKind

    def evaluate(
        self,
        method: Method,
        epsilon: float | None,
        tau: float | None,
        trials: int,
        key: NoiseKey,
    ) -> Evaluation:
        """Run ``method`` at ``(epsilon, delta = 1/N)`` (and ``tau``) for ``trials`` trials."""
        ...


class PaperExperiment(ABC):
    """The :meth:`evaluate` shared by the three experiments.

    It runs the rows every experiment has: the references, the binary-allocation MVG rows
    (``sweep_tau``) and the iid baselines, each noise drawn from ``key.generator()``. A subclass
    sets ``name``, ``dataset``, ``query``, ``domain`` and ``noise``, says how its metric sees
    the noise and the released matrices, and runs its other rows in :meth:`_evaluate_extra`.
    """

    name: str
    dataset: PaperDataset
    query: MatrixQuery
    domain: BoxDomain
    #: The noise of the MVG rows built on a plan: ``float`` or ``lattice``.
    noise: NoiseKind = "float"

    def _set_noise(self, noise: NoiseKind) -> None:
        """Check and set :attr:`noise` (the subclasses' constructors call this)."""
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {', '.join(NOISE_KINDS)}, got {noise!r}")
        self.noise = noise

    @abstractmethod
    def _non_private_error(self) -> float:
        """The error of the true query output."""

    @abstractmethod
    def _random_guess_errors(self, rng: np.random.Generator, trials: int) -> np.ndarray:
        """The errors of ``trials`` random guesses drawn from ``rng``."""

    @abstractmethod
    def _noisy_errors(self, noise: np.ndarray) -> np.ndarray:
        """The errors of the query output plus each noise matrix of ``(T, *query.shape)``."""

    @abstractmethod
    def _released_errors(self, released: np.ndarray) -> np.ndarray:
        """The errors of released query outputs ``(T, *query.shape)``."""

    @abstractmethod
    def _query_value(self) -> np.ndarray:
        """The true value of :attr:`query`."""

    def _binary_value(self, method: Method) -> np.ndarray:
        """The true value of a binary row's query (by default :meth:`_query_value`)."""
        return self._query_value()

    def _binary_query(self, method: Method) -> tuple[MatrixQuery, Algorithm]:
        """The query (declared sensitivities) and MVG algorithm of a binary row."""
        return self.query, "unimodal"

    def _binary_domain(self, method: Method) -> tuple[BoxDomain, tuple[int, ...]]:
        """The record domain and the domain-knowledge features of a binary row."""
        return self.domain, tuple(self.dataset.important)

    def _binary_plan(self, method: Method, epsilon: float, delta: float, tau: float) -> NoisePlan:
        """The noise plan of a binary row at ``(epsilon, delta)`` and share ``tau``: by default
        :func:`~mvg_dask_lab.experiments.mechanisms.binary_plan` on :meth:`_binary_query` and
        :meth:`_binary_domain` (a row planned as a product release plans it overrides this)."""
        assert method.calibration is not None
        query, algorithm = self._binary_query(method)
        domain, important = self._binary_domain(method)
        return binary_plan(
            query,
            domain,
            epsilon=epsilon,
            delta=delta,
            algorithm=algorithm,
            calibration=method.calibration,
            important=important,
            tau=tau,
            noise=self.noise,
        )

    def _plan_errors(self, method: Method, plan: NoisePlan, released: np.ndarray) -> np.ndarray:
        """The errors of a binary MVG row's ``released`` matrices (by default
        :meth:`_released_errors`).

        A row whose analyst uses the plan after the release (e.g. to remove the noise's known
        bias) overrides this.
        """
        return self._released_errors(released)

    def _synthetic_errors(self, records: np.ndarray) -> np.ndarray:
        """The errors of synthetic record sets ``(T, m, d)`` (one record per row) as releases."""
        raise NotImplementedError(f"{self.name}: no metric for synthetic records")

    def _vector_errors(self, vectors: np.ndarray) -> np.ndarray:
        """The errors of released first principal components ``(T, d)``."""
        raise NotImplementedError(f"{self.name}: no metric for released vectors")

    def _evaluate_extra(
        self, method: Method, epsilon: float, delta: float, trials: int, key: NoiseKey
    ) -> Evaluation:
        """Run a row that is neither a reference, a binary MVG row nor an iid baseline."""
        evaluator = LITERATURE.get(method.key)
        if evaluator is None:
            raise ValueError(f"{self.name}: unknown method {method.key!r}")
        return evaluator(self, epsilon, delta, trials, key)

    def evaluate(
        self,
        method: Method,
        epsilon: float | None,
        tau: float | None,
        trials: int,
        key: NoiseKey,
    ) -> Evaluation:
        """Run one method (see :class:`Experiment`)."""
        if method.key == "non-private":
            return Evaluation(errors=np.full(trials, self._non_private_error()))
        if method.key == "random-guess":
            return Evaluation(errors=self._random_guess_errors(key.generator(), trials))
        assert epsilon is not None
        delta = 1.0 / self.dataset.n_records
        if method.sweep_tau:
            assert tau is not None and method.calibration is not None
            plan = self._binary_plan(method, epsilon, delta, tau)
            released = plan_release(plan, self._binary_value(method), key, trials)
            return Evaluation(
                errors=self._plan_errors(method, plan, released),
                noise_std=plan_std_range(plan),
                implied_epsilon=plan_implied_epsilon(plan),
            )
        if method.key in BASELINES:
            mech = iid_baseline(
                method.key,
                self.query,
                self.domain,
                epsilon=epsilon,
                delta=delta,
            )
            Z = iid_noise(mech, key.generator(), (trials, *self.query.shape))
            return Evaluation(
                errors=self._noisy_errors(Z),
                noise_std=(mech.entry_std, mech.entry_std),
                implied_epsilon=iid_implied_epsilon(mech),
                valid=mech.valid,
            )
        return self._evaluate_extra(method, epsilon, delta, trials, key)


def _best_tau(evaluations: Mapping[float, Evaluation]) -> float:
    """The ``tau`` with the smallest mean error (ties: the smallest ``tau``)."""
    means = {tau: float(np.mean(ev.errors)) for tau, ev in evaluations.items()}
    finite = {t: m for t, m in means.items() if math.isfinite(m)}
    pool = finite or means
    return min(sorted(pool), key=lambda t: pool[t])


def _epsilon_row(
    experiment: Experiment,
    method: Method,
    epsilon: float,
    delta: float,
    taus: Sequence[float],
    trials: int,
    key: NoiseKey,
) -> Row:
    """The row of ``method`` at ``epsilon``: the best ``tau`` of the sweep where it sweeps."""
    if not method.sweep_tau:
        ev = experiment.evaluate(method, epsilon, None, trials, key)
        return Row(method=method, epsilon=epsilon, delta=delta, tau=None, evaluation=ev)
    evs = {
        float(tau): experiment.evaluate(method, epsilon, float(tau), trials, key) for tau in taus
    }
    best = _best_tau(evs)
    sweep = tuple(
        (tau, float(np.mean(ev.errors)), confidence_half_width(ev.errors))
        for tau, ev in evs.items()
    )
    return Row(
        method=method,
        epsilon=epsilon,
        delta=delta,
        tau=best,
        evaluation=evs[best],
        sweep=sweep,
    )


def run_experiment(
    experiment: Experiment,
    *,
    trials: int,
    seed: int,
    epsilons: Sequence[float] = EPSILONS,
    taus: Sequence[float] = TAUS,
    progress: Callable[[str], None] | None = None,
) -> ExperimentResult:
    """Run every method of ``experiment`` over the epsilon grid.

    Parameters
    ----------
    experiment : Experiment
        The experiment.
    trials : int
        Trials per setting (the paper uses 100), at least 2.
    seed : int
        Seed of the noise keys (reproducible, not private).
    epsilons : sequence of float, optional
        Epsilon grid; ``delta = 1/N``.
    taus : sequence of float, optional
        Binary allocation shares swept for ``sweep_tau`` methods.
    progress : callable, optional
        Receives one line per finished method.

    Returns
    -------
    ExperimentResult
        All rows.
    """
    if trials < 2:
        raise ValueError(f"trials must be at least 2 (for a confidence interval), got {trials}")
    if not epsilons:
        raise ValueError("need at least one epsilon")
    ds = experiment.dataset
    noise = experiment.noise
    settings = dict(experiment.settings)
    if noise == "lattice":
        settings["MVG noise"] = LATTICE_SETTING
    delta = 1.0 / ds.n_records
    root = NoiseKey.from_seed(seed).derive(f"mvg_dask/experiments/{experiment.name}")
    start = time.perf_counter()
    rows: list[Row] = []
    for method in experiment.methods:
        t0 = time.perf_counter()
        if method.kind == "reference":
            ev = experiment.evaluate(method, None, None, trials, root.derive(method.key))
            rows.append(Row(method=method, epsilon=None, delta=None, tau=None, evaluation=ev))
        else:
            for eps in epsilons:
                key = root.derive(f"{method.key}/epsilon={float(eps)!r}")
                rows.append(_epsilon_row(experiment, method, float(eps), delta, taus, trials, key))
        if progress is not None:
            progress(f"[{experiment.name}] {method.key}: done in {time.perf_counter() - t0:.1f} s")
    return ExperimentResult(
        name=experiment.name,
        title=experiment.title,
        metric=experiment.metric,
        dataset=ds.name,
        features=ds.n_features,
        records=ds.n_records,
        delta=delta,
        trials=trials,
        seed=seed,
        rows=tuple(rows),
        settings=settings,
        output_range=experiment.output_range,
        elapsed=time.perf_counter() - start,
        important=tuple(ds.feature_names[i] for i in ds.important),
        held_out=0 if ds.X_test is None else int(ds.X_test.shape[1]),
        noise=noise,
    )
