"""Exp. I of the MVG paper: regression on the Liver data through the identity query.

Setup (paper Sec. 8.1): the private data are the 6 x 248 matrix of the 5 blood tests and the
target ``drinks`` (all scaled to [0, 1]); 97 held-out patients form the test set. A mechanism
releases ``X + Z`` (identity query, Alg. 1: unimodal noise ``Z = B_Sigma N``); kernel ridge
regression (KRR) is trained on the *released* 5 features and *released* target, and the metric
is the RMSE of its predictions on the 97 non-private test records.

KRR (the paper names it but gives no hyper-parameters): Gaussian (RBF) kernel
``exp(-g ||x - x'||^2)`` with scikit-learn's defaults ``g = 1 / n_features = 0.2`` and ridge
``alpha = 1``, fixed before any run (nothing is tuned, on the test set or elsewhere). KRR has no
intercept, so the target is centred by its released mean and the mean added back to the
predictions (post-processing of the release). Predictions are not clipped.

Extra row ``exact-moments`` (the paper's rows stay as they are): the analyst who wants a
regressor asks for the statistics a regressor needs. The records are augmented by a constant,
``z = (x, y, 1)`` in ``[0, 1]^7``, and the second-moment matrix ``M = Z Z^T / N`` (means,
covariances and the cross-covariance with the target in one symmetric query) is released with
the product's exact symmetric mechanism (docs/bounds.md Sec. 1; Thm. 2: the box is
sign-definite), binary allocation on the domain-knowledge features and the constant. The
regressor is ridge regression from the released moments, ``b = (C~_xx + lambda I)^-1 c~_xy``,
``y^ = m~_y + b^T (x - m~_x)``, with ``lambda = 4 sqrt(E ||E_xx||_F^2)`` taken from the plan's
noise (public): by Weyl's inequality ``C~_xx + lambda I`` then stays positive definite unless the
noise's Frobenius norm exceeds four times its root mean square, so the fit never divides by the
noise. Nothing is tuned on the data or on the test set. The fit and the rule are the library's
post-processing estimator (:func:`mvg_dask.plan.estimators.moment_regression` with an intercept,
:func:`mvg_dask.plan.estimators.adassp_ridge`; AdaSSP, Wang 2018), the one behind
``ds.mvg.regression``.

Extra row ``exact-regression``: the product's own regression release,
``query: {regression: {target: drinks}}``. It releases the second moment of the *centred*
augmented records ``z = [x - c; 1]`` (``c`` the centre of the declared box, so ``R`` is about a
quarter of the uncentred one's; docs/bounds.md Sec. 13-14), planned by the product's release
planner from a spec (:meth:`RegressionExperiment.regression_spec`,
:func:`mvg_dask.plan.planning.plan_release`: the same query, domain and noise plan as
``mvg-dask release`` and ``api.dry_run``), the same binary allocation and ``tau`` sweep as the
``exact-moments`` row (ALT, Y and the constant). The fit is ``ds.mvg.regression(intercept=True)``'s:
:func:`~mvg_dask.plan.estimators.moment_regression` about the centre with the AdaSSP ridge of
the published noise std.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

from mvg_dask.datasets import PaperDataset, load_liver
from mvg_dask.engine.lattice import gram_step
from mvg_dask.experiments.literature import blr_method, jl_method
from mvg_dask.experiments.mechanisms import (
    lattice_context,
    noise_options,
    plan_implied_epsilon,
    plan_std_range,
    release_value,
)
from mvg_dask.experiments.methods import (
    Evaluation,
    Method,
    baseline_methods,
    binary_method,
    reference_methods,
)
from mvg_dask.experiments.runner import TAUS, PaperExperiment
from mvg_dask.noise import NoiseKey
from mvg_dask.plan import (
    Allocation,
    BoxDomain,
    MatrixQuery,
    NoisePlan,
    build_noise_plan,
    dp_pca,
    gram_sensitivity,
    share_budget,
)
from mvg_dask.plan.directions import directions_from_noisy_gram
from mvg_dask.plan.estimators import (
    ADASSP_RIDGE_FACTOR,
    CONSTANT_TERM,
    adassp_ridge,
    moment_regression,
)
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.lattice import NoiseKind
from mvg_dask.plan.noise_calibration import gram_step_lattice
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery, RegressionQuery
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.privacy.calibration import Algorithm
from mvg_dask.spec import ReleaseSpec, parse_spec

__all__ = [
    "KRR_ALPHA",
    "METHODS",
    "MOMENTS_RIDGE",
    "REGRESSION_RELEASE",
    "RegressionExperiment",
    "krr_rmse",
    "moments_ridge_rmse",
]

#: Ridge penalty of the KRR (scikit-learn's default).
KRR_ALPHA: Final = 1.0
#: Share of (epsilon, delta) spent on the DP-PCA directions (paper Sec. 8.1.3: 20 %).
DP_PCA_SHARE: Final = 0.2
#: Number of DP-PCA directions flagged important (conference version: "the two most
#: informative directions").
DP_PCA_K: Final = 2
_CHUNK: Final = 20
#: The ridge of the moments regressor, in units of the root mean square Frobenius norm of the
#: noise on the released feature covariance.
MOMENTS_RIDGE: Final = ADASSP_RIDGE_FACTOR
#: Directions whose share equals the smallest one, when that is below the largest by more than
#: this relative margin, are "starved": max-PNR's water level did not reach them and they only
#: got the allocation's floor.
_STARVED: Final = 1e-6

#: The key of the row released as the product's ``query: {regression: ...}``.
REGRESSION_RELEASE: Final = "exact-regression"

_ID = "identity query, Alg. 1 (unimodal), s2 = ||w|| = sqrt(6)"
_IMPORTANT = "ALT, Y"

METHODS: Final[tuple[Method, ...]] = (
    *reference_methods(
        non_private="KRR trained on the true 6 x 248 data",
        random_guess="predictions uniform on the target's declared domain [0, 1]",
    ),
    binary_method("mvg-thm2", _IMPORTANT, f"mvg-thm2 (Thm. 2 + Thm. 5), {_ID}, gamma = sqrt(6 N)"),
    Method(
        key="mvg-thm2-dppca",
        label="MVG, Thm. 2 (DP-PCA, max-PNR)",
        kind="paper-mvg",
        calibration="mvg-thm2",
        description="mvg-thm2; directions from Analyze Gauss with 20 % of (ε, δ) "
        "(basic composition), max-PNR allocation",
    ),
    binary_method("mgm-udn", _IMPORTANT, f"mgm-udn (MGM Thm. 2), {_ID}"),
    binary_method("mgm-idn", _IMPORTANT, "mgm-idn (MGM Thm. 3), entries in [0, 1]"),
    binary_method("exact", _IMPORTANT, f"exact (analytic Gaussian on the whitened query), {_ID}"),
    Method(
        key="exact-moments",
        label=f"MVG, exact, moments query (binary: {_IMPORTANT}, 1)",
        kind="exact",
        sweep_tau=True,
        calibration="exact",
        description="exact, symmetric noise on M = Z Z^T / N for z = (x, y, 1) in [0, 1]^7 "
        "(sensitivity Thm. 2), binary allocation on ALT, Y and the constant; ridge regression "
        "from the released moments with lambda = 4 x the RMS Frobenius norm of the noise on "
        "the feature covariance (from the plan)",
    ),
    Method(
        key=REGRESSION_RELEASE,
        label=f"MVG, exact, regression query (centred moments; binary: {_IMPORTANT}, 1)",
        kind="exact",
        sweep_tau=True,
        calibration="exact",
        description="the product's query: {regression: {target: drinks}} release, planned by "
        "its release planner: symmetric noise on M = Z Z^T / N for z = (x - c, 1), c = 0.5 the "
        "centre of the declared box (sensitivity of the shifted box), binary allocation on "
        "ALT, Y and the constant; ridge regression with an intercept about c from the released "
        "moments (ds.mvg.regression(intercept=True): AdaSSP lambda = 4 x the RMS Frobenius norm "
        "of the published noise on the predictors' block)",
    ),
    Method(
        key="exact-dppca",
        label="MVG, exact (DP-PCA, max-PNR)",
        kind="exact",
        calibration="exact",
        description="exact; directions from Analyze Gauss with 20 % of the Gaussian-DP "
        "budget (mu^2 = mu_1^2 + mu_2^2), max-PNR allocation",
    ),
    *baseline_methods(
        "b = s1 / ε, s1 = ||w||_1 = 6",
        classic="sigma = sqrt(2 ln(1.25/δ)) s2 / ε (Dwork & Roth; proof only for ε < 1)",
    ),
    jl_method("JL transform (BBDS, for Upadhyay [46])"),
    blr_method("Exponential (Blum et al. [104], public candidates)"),
)


def _centre_text(query: RegressionQuery) -> str:
    """The query's centre, as the settings print it."""
    centre = query.centre or ()
    values = sorted(set(centre))
    return f"{values[0]:g} per feature" if len(values) == 1 else ", ".join(f"{v:g}" for v in centre)


def _sq_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances between the rows of ``a`` and ``b`` (batched, >= 0)."""
    aa = np.sum(a * a, axis=-1)[..., :, None]
    bb = np.sum(b * b, axis=-1)[..., None, :]
    d = aa + bb - 2.0 * (a @ np.swapaxes(b, -1, -2))
    return np.maximum(d, 0.0)


def krr_rmse(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    alpha: float = KRR_ALPHA,
    gamma: float | None = None,
) -> np.ndarray:
    """RMSE of RBF kernel ridge regression, batched over trials.

    Fits ``coef = (K + alpha I)^-1 (y - mean(y))`` with ``K_ij = exp(-gamma ||x_i - x_j||^2)``
    per trial and predicts ``K_test coef + mean(y)``: scikit-learn's ``KernelRidge`` on a
    centred target.

    Parameters
    ----------
    train_x : numpy.ndarray
        Training inputs, shape ``(T, n, d)`` (one trial per leading index).
    train_y : numpy.ndarray
        Training targets, shape ``(T, n)``.
    test_x : numpy.ndarray
        Test inputs, shape ``(n_test, d)`` (the same for every trial).
    test_y : numpy.ndarray
        Test targets, shape ``(n_test,)``.
    alpha : float, default 1.0
        Ridge penalty.
    gamma : float, optional
        RBF parameter; ``1 / d`` by default (scikit-learn's default).

    Returns
    -------
    numpy.ndarray
        RMSE per trial, shape ``(T,)``.
    """
    tx = np.asarray(train_x, dtype=np.float64)
    ty = np.asarray(train_y, dtype=np.float64)
    ex = np.asarray(test_x, dtype=np.float64)
    ey = np.asarray(test_y, dtype=np.float64)
    trials, n, d = tx.shape
    g = 1.0 / d if gamma is None else float(gamma)
    out = np.empty(trials)
    eye = np.eye(n)
    for lo in range(0, trials, _CHUNK):
        hi = min(trials, lo + _CHUNK)
        x = tx[lo:hi]
        mean = ty[lo:hi].mean(axis=1)
        yc = ty[lo:hi] - mean[:, None]
        K = np.exp(-g * _sq_dist(x, x)) + alpha * eye
        coef = np.linalg.solve(K, yc[..., None])[..., 0]
        Kt = np.exp(-g * _sq_dist(np.broadcast_to(ex, (hi - lo, *ex.shape)), x))
        pred = np.einsum("tij,tj->ti", Kt, coef) + mean[:, None]
        out[lo:hi] = np.sqrt(np.mean((pred - ey[None, :]) ** 2, axis=1))
    return out


def moments_ridge_rmse(
    moments: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    target: int,
    ridge: float,
) -> np.ndarray:
    """RMSE of ridge regression fitted from released second moments, batched over trials.

    ``moments[t]`` estimates ``Z Z^T / N`` for records ``z = (x, y, 1)``: features
    ``0 .. target - 1``, the target at ``target`` and the constant last. The fit is
    :func:`mvg_dask.plan.estimators.moment_regression` with an intercept:
    ``b = (C_xx + ridge I)^-1 c_xy`` with ``C = M_xx - m_x m_x^T`` (symmetrised) and
    ``c_xy = M_xy - m_x m_y``; the prediction is ``m_y + b^T (x - m_x)``.

    Parameters
    ----------
    moments : numpy.ndarray
        Shape ``(T, d + 2, d + 2)`` with ``d = target``.
    test_x : numpy.ndarray
        Shape ``(n_test, d)``.
    test_y : numpy.ndarray
        Shape ``(n_test,)``.
    target : int
        Index of the target (the number of features ``d``).
    ridge : float
        Ridge penalty ``lambda >= 0``.

    Returns
    -------
    numpy.ndarray
        RMSE per trial, shape ``(T,)``.
    """
    labels = [*(f"x{i}" for i in range(target)), "y", CONSTANT_TERM]
    fit = moment_regression(moments, labels, "y", intercept=True, ridge=ridge)
    pred = fit.predict(test_x)
    return np.asarray(np.sqrt(np.mean((pred - test_y[None, :]) ** 2, axis=1)))


class RegressionExperiment(PaperExperiment):
    """Exp. I: KRR on the released Liver data, RMSE on the held-out patients.

    Parameters
    ----------
    dataset : PaperDataset, optional
        The Liver data (default :func:`mvg_dask.datasets.load_liver` with split seed 0).
    noise : {"float", "lattice"}, default "float"
        The noise of the MVG rows (:class:`~mvg_dask.experiments.runner.PaperExperiment`).
    """

    name = "regression"
    title = "Exp. I: regression (Liver, identity query, KRR, RMSE)"
    metric = "RMSE"
    methods = METHODS

    def __init__(self, dataset: PaperDataset | None = None, *, noise: NoiseKind = "float") -> None:
        self._set_noise(noise)
        ds = dataset if dataset is not None else load_liver()
        if ds.X_test is None:
            raise ValueError("the regression experiment needs held-out records (X_test)")
        self.dataset = ds
        m, n = ds.X.shape
        self.target = m - 1
        self.domain = BoxDomain.create(ds.lower, ds.upper, m)
        self.query = IdentityQuery(m, n)
        self.test_x = ds.X_test[: self.target].T
        self.test_y = ds.X_test[self.target]
        self.gram = ds.X @ ds.X.T
        Z = np.vstack([ds.X, np.ones((1, n))])
        self.moments = Z @ Z.T / n
        self.moments_query = CovarianceQuery(m + 1, n)
        self.moments_domain = BoxDomain.create(
            np.append(ds.lower, 0.0), np.append(ds.upper, 1.0), m + 1
        )
        self.release_metadata = InputMetadata(
            store="liver.zarr",
            variable="X",
            record_dim="record",
            feature_dim="feature",
            dims=("record", "feature"),
            shape=(n, m),
            dtype="float64",
            record_chunk=n,
            feature_names=tuple(ds.feature_names),
        )
        query = self.regression_release_plan(1.0, 1.0 / n, TAUS[0]).query
        assert isinstance(query, RegressionQuery)
        self.regression_query = query
        self.regression_moment = query.partial(ds.X) / n
        self.output_range = self.query.output_entry_range(self.domain)
        constant = float(np.sqrt(np.mean((ds.X[self.target].mean() - self.test_y) ** 2)))
        self.settings: Mapping[str, str] = {
            "private data": f"{m} x {n} ({', '.join(ds.feature_names)}), scaled to [0, 1]",
            "held-out": f"{ds.X_test.shape[1]} patients (loader split seed 0)",
            "regressor": f"RBF kernel ridge, gamma = 1/{m - 1}, alpha = {KRR_ALPHA:g} "
            "(scikit-learn defaults; target centred by its released mean)",
            "for scale": f"predicting the true training mean of the target for every patient "
            f"gives RMSE {constant:.4g} (no features, not private)",
            "important (binary)": ", ".join(ds.feature_names[i] for i in ds.important),
            "moments row": f"M = Z Z^T / N for z = (x, y, 1) in [0, 1]^{m + 1}, ridge regression "
            f"from M~ with lambda = {MOMENTS_RIDGE:g} x RMS ||noise on C_xx||_F",
            "regression-query row": f"the product's query: {{regression: {{target: "
            f"{ds.feature_names[self.target]}}}}} release (its release planner), the moment of "
            f"z = (x - c, 1), c = {_centre_text(query)}; ds.mvg.regression(intercept=True)",
            "DP-PCA": f"Analyze Gauss on X X^T, {DP_PCA_SHARE:.0%} of the budget, "
            f"k = {DP_PCA_K}, max-PNR allocation",
        }

    # -- the product's regression release -------------------------------------------------------
    def regression_spec(self, epsilon: float, delta: float, tau: float) -> ReleaseSpec:
        """The spec of the product's regression release of the private Liver data.

        ``query: {regression: {target: drinks}}`` on the declared box, ``exact`` calibration
        (whose default algorithm for a moment query is ``symmetric``), standard directions with
        the binary allocation on ALT, Y and the constant term (the moment's last), the
        experiment's noise kind.

        Parameters
        ----------
        epsilon, delta : float
            Privacy parameters.
        tau : float
            The binary allocation's share.

        Returns
        -------
        ReleaseSpec
            The validated spec (its input is :attr:`release_metadata`'s store, never read).
        """
        ds = self.dataset
        important = [*(int(i) for i in ds.important), ds.n_features]
        return parse_spec(
            {
                "name": "exp1-regression",
                "input": {"store": self.release_metadata.store, "variable": "X"},
                "domain": {"box": {"lower": ds.lower.tolist(), "upper": ds.upper.tolist()}},
                "query": {"regression": {"target": ds.feature_names[self.target]}},
                "mechanism": {
                    "calibration": "exact",
                    "allocation": {"strategy": "binary", "important": important, "share": tau},
                    "noise": self.noise,
                },
                "privacy": {"epsilon": epsilon, "delta": delta},
                "output": {"store": "exp1-regression.zarr"},
            },
            source="Exp. I regression release",
        )

    def regression_release_plan(self, epsilon: float, delta: float, tau: float) -> ReleasePlan:
        """The product's release plan of :meth:`regression_spec` for the private data's metadata
        (:func:`mvg_dask.plan.planning.plan_release`, what ``api.dry_run`` returns for a
        store holding them in one chunk).

        Parameters
        ----------
        epsilon, delta : float
            Privacy parameters.
        tau : float
            The binary allocation's share.

        Returns
        -------
        ReleasePlan
            The plan (query with its centre, domain, noise plan).
        """
        return plan_release(
            self.regression_spec(epsilon, delta, tau),
            self.release_metadata,
            release_id="exp1-regression",
            created="1970-01-01T00:00:00+00:00",
        )

    # -- metric -------------------------------------------------------------------------------
    def errors(self, released: np.ndarray) -> np.ndarray:
        """RMSE of KRR trained on each released matrix.

        Parameters
        ----------
        released : numpy.ndarray
            Shape ``(T, M, N)``: released data per trial.

        Returns
        -------
        numpy.ndarray
            RMSE per trial.
        """
        x = np.swapaxes(released[:, : self.target, :], 1, 2)
        y = released[:, self.target, :]
        return krr_rmse(x, y, self.test_x, self.test_y)

    # -- methods ------------------------------------------------------------------------------
    def _non_private_error(self) -> float:
        return float(self.errors(self.dataset.X[None])[0])

    def _random_guess_errors(self, rng: np.random.Generator, trials: int) -> np.ndarray:
        lo, hi = self.dataset.lower[self.target], self.dataset.upper[self.target]
        pred = rng.uniform(lo, hi, size=(trials, self.test_y.size))
        return np.sqrt(np.mean((pred - self.test_y[None, :]) ** 2, axis=1))

    def _noisy_errors(self, noise: np.ndarray) -> np.ndarray:
        return self.errors(self.dataset.X[None] + noise)

    def _released_errors(self, released: np.ndarray) -> np.ndarray:
        return self.errors(released)

    def _query_value(self) -> np.ndarray:
        return self.dataset.X

    def _binary_value(self, method: Method) -> np.ndarray:
        if method.key == "exact-moments":
            return self.moments
        if method.key == REGRESSION_RELEASE:
            return self.regression_moment
        return super()._binary_value(method)

    def _binary_plan(self, method: Method, epsilon: float, delta: float, tau: float) -> NoisePlan:
        if method.key != REGRESSION_RELEASE:
            return super()._binary_plan(method, epsilon, delta, tau)
        rplan = self.regression_release_plan(epsilon, delta, tau)
        if rplan.query != self.regression_query:  # the moment was computed for this query
            raise AssertionError("the release plan's query differs from the experiment's")
        return rplan.noise_plan()

    def _synthetic_errors(self, records: np.ndarray) -> np.ndarray:
        return self.errors(np.swapaxes(records, 1, 2))

    def _binary_query(self, method: Method) -> tuple[MatrixQuery, Algorithm]:
        if method.key == "exact-moments":
            return self.moments_query, "symmetric"
        return super()._binary_query(method)

    def _binary_domain(self, method: Method) -> tuple[BoxDomain, tuple[int, ...]]:
        if method.key == "exact-moments":
            return self.moments_domain, (*self.dataset.important, self.dataset.n_features)
        return super()._binary_domain(method)

    def _plan_errors(self, method: Method, plan: NoisePlan, released: np.ndarray) -> np.ndarray:
        if method.key == REGRESSION_RELEASE:
            return self._regression_release_rmse(plan, released)
        if method.key != "exact-moments":
            return super()._plan_errors(method, plan, released)
        k = self.target
        ridge = adassp_ridge(plan.released_entry_std()[:k, :k], factor=MOMENTS_RIDGE)
        return moments_ridge_rmse(released, self.test_x, self.test_y, target=k, ridge=ridge)

    def _regression_release_rmse(self, plan: NoisePlan, released: np.ndarray) -> np.ndarray:
        """RMSE of ``ds.mvg.regression(intercept=True)`` on each released moment: the fit about
        the query's centre with the AdaSSP ridge of the published noise std."""
        query = self.regression_query
        labels = [*(str(v) for v in self.dataset.feature_names), CONSTANT_TERM]
        fit = moment_regression(
            released,
            labels,
            labels[query.target],
            intercept=True,
            noise_std=plan.released_entry_std(),
            ridge="adassp",
            centre=query.centre,
            scale=query.scale,
        )
        pred = fit.predict(self.test_x)
        return np.asarray(np.sqrt(np.mean((pred - self.test_y[None, :]) ** 2, axis=1)))

    def _evaluate_extra(
        self, method: Method, epsilon: float, delta: float, trials: int, key: NoiseKey
    ) -> Evaluation:
        """The DP-PCA rows: MVG with DP-PCA directions, max-PNR allocation, a plan per trial.

        With lattice noise both steps are a lattice release's: the DP-PCA step is Analyze Gauss
        on the lattice (:func:`mvg_dask.engine.lattice.gram_step`, its lattice from
        :func:`mvg_dask.plan.gram_step_lattice` with the Gram's summation context), and the
        release of the identity query with the resulting dense directions is
        :func:`~mvg_dask.experiments.mechanisms.release_value`.
        """
        calibration = method.calibration
        if calibration is None:
            return super()._evaluate_extra(method, epsilon, delta, trials, key)
        split = share_budget(calibration, epsilon, delta, share=DP_PCA_SHARE)
        assert split.step_mu is not None
        sens = gram_sensitivity(self.domain, "replace-one")
        X = self.dataset.X
        released = np.empty((trials, *X.shape))
        lows, highs, implied, starved = [], [], [], []
        step = None
        if self.noise == "lattice":
            gram_query = CovarianceQuery(X.shape[0], X.shape[1])
            step = gram_step_lattice(self.domain, sens, split.step_mu, lattice_context(gram_query))
        for t in range(trials):
            if step is None:
                dirs = dp_pca(
                    self.gram,
                    records=X.shape[1],
                    k=DP_PCA_K,
                    mu=split.step_mu,
                    sensitivity=sens,
                    key=key.derive(f"dp-pca/{t}"),
                )
            else:
                noisy = gram_step(
                    self.gram, step, sens / step.sensitivity, key.derive(f"dp-pca/{t}")
                )
                dirs = directions_from_noisy_gram(noisy, records=X.shape[1], k=DP_PCA_K)
            plan = build_noise_plan(
                self.query,
                self.domain,
                epsilon=epsilon,
                delta=delta,
                algorithm="unimodal",
                calibration=calibration,
                directions=dirs,
                allocation=Allocation(strategy="max-pnr"),
                direction_share=DP_PCA_SHARE,
                **noise_options(self.query, self.noise),
            )
            released[t] = release_value(plan, X, key.derive(f"release/{t}"))
            lo, hi = plan_std_range(plan)
            lows.append(lo)
            highs.append(hi)
            implied.append(plan_implied_epsilon(plan))
            th = plan.theta
            at_floor = th.min() < th.max() * (1 - _STARVED)
            starved.append(int(np.sum(np.isclose(th, th.min(), rtol=1e-9))) if at_floor else 0)
        return Evaluation(
            errors=self._released_errors(released),
            noise_std=(float(np.median(lows)), float(np.median(highs))),
            implied_epsilon=float(np.median(implied)),
            details={
                "directions": float(X.shape[0]),
                "starved_directions_median": float(np.median(starved)),
                "starved_directions_min": float(np.min(starved)),
            },
        )
