"""Derived statistics of a covariance-like release and their intervals from its known noise law
(the ``.mvg`` accessor's :meth:`~mvg_dask.xarray.MvgAccessor.regression`,
:meth:`~mvg_dask.xarray.MvgAccessor.regression_intervals`,
:meth:`~mvg_dask.xarray.MvgAccessor.explained_variance` and
:meth:`~mvg_dask.xarray.MvgAccessor.subspace_angle`).

Every released entry is the non-private value plus Gaussian noise of a published law, so a
statistic's uncertainty follows by a *parametric bootstrap*: the release's noisy variables plus
independent draws of that law (:func:`~mvg_dask.plan.derived_stats.published_noise_draws`) give
draws of the statistic around its released value, and the basic bootstrap interval
(:func:`~mvg_dask.plan.derived_stats.basic_bootstrap_interval`) reflects them around it. The
draws use a local generator (``seed``): post-processing, no privacy cost. The intervals'
coverage is measured against the noise law in the tests (docs/guide/python.md, "Derived
statistics and their intervals").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xarray as xr

from mvg_dask.interactive.read import (
    COVARIANCE_RELEASES,
    check_noisy_variable,
    describe_release,
    gaussian_variable,
    release_noise_plan,
)
from mvg_dask.plan.derived_stats import (
    RESOLVED_FACTOR,
    NoiseDominatedWarning,
    basic_bootstrap_interval,
    explained_variance_fractions,
    largest_principal_angle,
    noise_norm_quantile,
    published_noise_draws,
    resolved_eigenvalues,
    top_subspace,
)
from mvg_dask.plan.estimators import CONSTANT_TERM, moment_regression
from mvg_dask.plan.noise_plan import NoisePlan
from mvg_dask.plan.queries.moment import scale_constant
from mvg_dask.plan.regression_pivot import pivot_intervals, pivot_problem
from mvg_dask.release_format import (
    COVARIANCE,
    GROUP_DIM,
    RECORD_COUNT,
    RELEASE_ID_ATTR,
    TARGET_ATTR,
    check_complete,
    released_query_type,
)

__all__ = [
    "COUNT",
    "DEFAULT_DRAWS",
    "PIVOT_METHOD",
    "VALUE",
    "NoisyRelease",
    "RegressionTerms",
    "angle_arrays",
    "angle_draws",
    "explained_variance",
    "fraction_interval_arrays",
    "fraction_intervals",
    "noisy_draws",
    "pivot_inputs",
    "pivot_regression",
    "regression",
    "regression_fits",
    "regression_interval_arrays",
    "regression_intervals",
    "ridges",
    "subspace_angle",
]

#: Bootstrap draws of the noise law behind an interval.
DEFAULT_DRAWS = 1000
#: The regression intervals' method where the exact pivot applies.
PIVOT_METHOD = "Anderson-Rubin pivot"
#: The key of a draw's Gaussian variable and of its noisy record count in a ``raw`` mapping.
VALUE, COUNT = "value", "count"


@dataclass(frozen=True)
class NoisyRelease:
    """What the derived statistics need of a covariance-like release besides its values: how
    its covariance follows from its noisy variables, and their noise law.

    Attributes
    ----------
    kind : {"moment", "ratio", "covariance"}
        The noisy variable is a moment of ``[x - c; s]`` (centered-covariance, regression),
        ``gram`` with a noisy record count, or the covariance itself.
    plan : NoisePlan
        The release's noise plan.
    grouped : bool
        One noisy variable per group (a moment's corner is then the group's noisy share).
    """

    kind: Literal["moment", "ratio", "covariance"]
    plan: NoisePlan
    grouped: bool = False

    @classmethod
    def of(cls, ds: xr.Dataset, what: str) -> NoisyRelease:
        """The model of a complete release; anything but a covariance-like one is refused with
        what it is and what would work."""
        check_complete(ds.attrs)
        qtype = released_query_type(ds.attrs)
        if not (qtype.second_moment or qtype.augmented) or COVARIANCE not in ds:
            raise ValueError(
                f"{what} needs {COVARIANCE_RELEASES}; this is {describe_release(ds)}. Release "
                "query 'covariance', 'centered-covariance' or 'regression' for it"
            )
        check_noisy_variable(ds)
        name = gaussian_variable(ds)
        kind: Literal["moment", "ratio", "covariance"] = "covariance"
        if name == qtype.noisy_variable:
            kind = "moment"
        elif name == qtype.sum_variable:
            kind = "ratio"
        return cls(kind, release_noise_plan(ds), GROUP_DIM in ds[COVARIANCE].dims)

    @staticmethod
    def released(ds: xr.Dataset) -> dict[str, np.ndarray]:
        """The release's noisy variables as one draw (a leading axis of 1)."""
        out = {VALUE: np.asarray(ds[gaussian_variable(ds)].values, dtype=np.float64)[None]}
        if RECORD_COUNT in ds:
            out[COUNT] = np.asarray(ds[RECORD_COUNT].values, dtype=np.float64).reshape(1)
        return out

    @property
    def scale(self) -> float:
        """A moment query's constant coordinate ``s``."""
        return float(getattr(self.plan.query, "scale", 1.0))

    @property
    def centre(self) -> np.ndarray | None:
        """A moment query's centre ``c``."""
        centre = getattr(self.plan.query, "centre", None)
        return None if centre is None else np.asarray(centre, dtype=np.float64)

    def draws(
        self, raw: dict[str, np.ndarray], draws: int, rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        """``draws`` draws of the noisy variables ``raw`` (one draw, as :meth:`released`)
        plus independent noise of the published law (a group's noise independent of another's;
        a noisy count's std ``1 / count_mu``)."""
        if draws < 2:
            raise ValueError(f"draws must be at least 2, got {draws!r}")
        value = raw[VALUE][0]
        noise = published_noise_draws(self.plan, rng, (draws, *value.shape[:-2]))
        out = {VALUE: value + noise}
        if COUNT in raw:
            count_mu = self.plan.budgets.count_mu
            assert count_mu is not None  # a noisy count has its mu
            out[COUNT] = raw[COUNT][0] + rng.standard_normal(draws) / count_mu
        return out

    def covariances(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        """The covariances of draws of the noisy variables, as the release computes them:
        ``(B, G, m, m)`` (``G = 1`` ungrouped; NaN for a group whose noisy share is not
        positive)."""
        value = raw[VALUE]
        if self.kind == "ratio":
            count = np.maximum(raw[COUNT], 1.0)
            return (value / count[:, None, None])[:, None]
        if self.kind == "covariance":
            return value if self.grouped else value[:, None]
        M = self._moments(value)
        m = M.shape[-1] - 1
        u = M[..., :m, m]
        return np.asarray(M[..., :m, :m] - u[..., :, None] * u[..., None, :])

    def _moments(self, value: np.ndarray) -> np.ndarray:
        """``(B, G, K, K)`` moments of ``[x - c; 1]``, each group's divided by its noisy share
        (NaN where it is not positive)."""
        M = scale_constant(value, 1.0 / self.scale)
        if not self.grouped:
            return M[:, None]
        p = M[..., -1, -1]
        return np.asarray(M / np.where(p > 0, p, np.nan)[..., None, None])

    def regression_moments(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        """The moments of ``[x - c; 1]`` a regression fits, ``(B, G, K, K)``; for a covariance
        release ``X X^T / N`` with a constant term that no fit without intercept uses."""
        if self.kind == "moment":
            return self._moments(raw[VALUE])
        C = self.covariances(raw)
        m = C.shape[-1]
        M = np.zeros((*C.shape[:-2], m + 1, m + 1))
        M[..., :m, :m] = C
        M[..., m, m] = 1.0
        return M

    def regression_std(self, raw: dict[str, np.ndarray]) -> np.ndarray:
        """The noise std of :meth:`regression_moments` of the release ``raw``, ``(G, K, K)``
        (a grouped moment's divided by its share; a ratio's by the count, its noise
        neglected): what the ridge rule takes."""
        s = np.asarray(self.plan.released_entry_std(), dtype=np.float64)
        if self.kind == "moment":
            s = scale_constant(np.broadcast_to(s, raw[VALUE].shape[-2:]), 1.0 / self.scale)
            if not self.grouped:
                return s[None]
            p = scale_constant(raw[VALUE][0], 1.0 / self.scale)[:, -1, -1]
            return np.asarray(s[None] / np.abs(np.where(p != 0, p, np.nan))[:, None, None])
        m = raw[VALUE].shape[-1]
        out = np.zeros((1, m + 1, m + 1))
        out[0, :m, :m] = np.broadcast_to(s, (m, m))
        if self.kind == "ratio":
            out /= max(float(raw[COUNT][0]), 1.0)
        return out


def noisy_draws(ds: xr.Dataset, draws: int, seed: int | None = 0) -> dict[str, np.ndarray]:
    """The release's noisy variables plus ``draws`` independent draws of its published noise
    (:meth:`~mvg_dask.interactive.derived.NoisyRelease.draws`): ``value`` (``covariance``,
    ``gram`` or ``moment``, one draw per group) and with a noisy record count ``count``.

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance-like release.
    draws : int
        How many.
    seed : int, optional
        Of the local generator.

    Returns
    -------
    dict
        ``value`` and ``count`` (if any), ``(draws, *shape)``.
    """
    model = NoisyRelease.of(ds, "noisy_draws")
    return model.draws(model.released(ds), draws, np.random.default_rng(seed))


def _provenance(ds: xr.Dataset, estimator: str, **attrs: Any) -> dict[str, Any]:
    return {
        "estimator": estimator,
        "source_release": ds.attrs.get(RELEASE_ID_ATTR),
        "post_processing": "computed from the release only: no privacy cost",
        **attrs,
    }


# -- regression ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegressionTerms:
    """What a regression fits: the term labels (features, then ``"1"``), the target's label,
    whether with an intercept, and the moment's centre."""

    labels: list[str]
    target: str
    intercept: bool
    centre: np.ndarray | None


def _regression_terms(
    ds: xr.Dataset, model: NoisyRelease, target: str | None, intercept: bool
) -> RegressionTerms:
    like = ds[COVARIANCE]
    fd = like.dims[-2]
    m = like.shape[-1]
    named = fd in like.coords
    labels = [str(v) for v in like[fd].values] if named else [f"#{i}" for i in range(m)]
    target = target if target is not None else ds.attrs.get(TARGET_ATTR)
    if target is None:
        raise ValueError(
            f"regression needs a target: this is {describe_release(ds)} without one; name it: "
            "ds.mvg.regression(target='feature')"
        )
    if not named and str(target) not in labels:  # a feature by position
        position = getattr(model.plan.query, "target", None)
        target = f"#{position if TARGET_ATTR in ds.attrs and position is not None else target}"
    if intercept and model.kind != "moment":
        raise ValueError(
            f"an intercept needs the released means; this is {describe_release(ds)} (X X^T / N "
            "only): fit without one (intercept=False), or release query 'regression' or "
            "'centered-covariance'"
        )
    centre = model.centre if model.kind == "moment" else None
    return RegressionTerms([*labels, CONSTANT_TERM], str(target), intercept, centre)


def regression_fits(
    M: np.ndarray, terms: RegressionTerms, lam: np.ndarray
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Coefficients ``(B, G, terms)`` of moments ``M`` (``(B, G, K, K)``, as
    :meth:`NoisyRelease.regression_moments`), ridge ``lam[g]`` for group ``g``; NaN where a
    group's moment is not finite or its system is singular."""
    labels, target = terms.labels, terms.target
    out = None
    names: tuple[str, ...] = ()
    for g in range(M.shape[1]):
        Mg = M[:, g]
        ok = np.all(np.isfinite(Mg), axis=(-2, -1))
        safe = np.where(ok[:, None, None], Mg, np.eye(Mg.shape[-1]))
        try:
            fit = moment_regression(
                safe,
                labels,
                target,
                intercept=terms.intercept,
                ridge=float(lam[g]),
                centre=terms.centre,
            )
            b = np.where(ok[:, None], fit.coefficients, np.nan)
            names = fit.terms
        except np.linalg.LinAlgError:
            b = np.full((Mg.shape[0], len(labels) - 1 - (not terms.intercept)), np.nan)
        if out is None:
            out = np.full((M.shape[0], M.shape[1], b.shape[-1]), np.nan)
        out[:, g] = b
    assert out is not None
    if not names:
        P = [n for n in labels[:-1] if n != target]
        names = (*P, CONSTANT_TERM) if terms.intercept else tuple(P)
    return out, names


def ridges(
    ridge: float | str, M: np.ndarray, std: np.ndarray, terms: RegressionTerms
) -> np.ndarray:
    """``lambda`` per group: the given value, or the AdaSSP rule as
    :func:`~mvg_dask.plan.estimators.moment_regression` sets it from the released moments
    ``M`` (``(G, K, K)``) and their std (``(G, K, K)``)."""
    groups = M.shape[0]
    if isinstance(ridge, str):
        if ridge != "adassp":
            raise ValueError(f"ridge must be a number >= 0 or 'adassp', got {ridge!r}")
        s = np.broadcast_to(std, (groups, *std.shape[-2:]))
        out = np.zeros(groups)
        for g in range(groups):
            if np.all(np.isfinite(s[g])) and np.all(np.isfinite(M[g])):
                fit = moment_regression(
                    M[g],
                    terms.labels,
                    terms.target,
                    intercept=terms.intercept,
                    noise_std=s[g],
                    centre=terms.centre,
                )
                out[g] = fit.ridge
        return out
    lam = float(ridge)
    if not (lam >= 0 and np.isfinite(lam)):
        raise ValueError(f"the ridge must be finite and non-negative, got {ridge!r}")
    return np.full(groups, lam)


def _predictor_matrices(M: np.ndarray, terms: RegressionTerms) -> np.ndarray:
    """The matrix each fit inverts (before its ridge): the predictors' covariance with an
    intercept, their moment about the centre without (``(..., p, p)``)."""
    P = [i for i, name in enumerate(terms.labels[:-1]) if name != terms.target]
    A = M[..., P, :][..., :, P]
    if terms.intercept:
        mx = M[..., P, -1]
        A = A - mx[..., :, None] * mx[..., None, :]
    return np.asarray(np.where(np.isfinite(A), A, 0.0))


def pivot_inputs(
    model: NoisyRelease, values: np.ndarray, terms: RegressionTerms, lam: np.ndarray
) -> dict[str, Any] | None:
    """:func:`~mvg_dask.plan.regression_pivot.pivot_problem` for the fits of ``values`` (the
    release's noisy variable with a leading axis of releases); ``None`` where the pivot is not
    exact (unimodal noise; a ridge on a moment divided by a noisy share or count)."""
    ratio = model.plan.output_symmetric_ratio
    normalised = model.kind == "ratio" or (model.kind == "moment" and model.grouped)
    if ratio is None or (normalised and np.any(lam != 0)):
        return None
    names = terms.labels[:-1]
    return pivot_problem(
        values,
        np.asarray(model.plan.row_factor, dtype=np.float64),
        ratio,
        lam,
        moment=model.kind == "moment",
        grouped=model.grouped,
        scale=model.scale,
        target=names.index(terms.target),
        intercept=terms.intercept,
        centre=terms.centre,
    )


def pivot_regression(
    model: NoisyRelease,
    values: np.ndarray,
    terms: RegressionTerms,
    lam: np.ndarray,
    level: float,
) -> dict[str, np.ndarray] | None:
    """Coefficients and their pivot intervals for each of ``R`` releases' noisy variable
    ``values`` (``(R, ...)``), each ``(R, G, terms)``: ``value``, ``lower``, ``upper``
    (``+-inf`` where the release does not bound it), ``std`` (the delta method's) and
    ``resolved`` (both ends finite); ``None`` where the pivot does not apply
    (:func:`pivot_inputs`)."""
    args = pivot_inputs(model, values, terms, lam)
    if args is None:
        return None
    res = pivot_intervals(
        args["Y"], args["B"], args["ratio"], args["L"], level, fixed_corner=args["fixed"]
    )
    out = {k: res[k] + (args["offset"] if k != "std" else 0.0) for k in res}
    out["resolved"] = np.isfinite(out["lower"]) & np.isfinite(out["upper"])
    return out


def regression_interval_arrays(
    model: NoisyRelease,
    raw: dict[str, np.ndarray],
    terms: RegressionTerms,
    lam: np.ndarray,
    level: float,
    drawn: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], tuple[str, ...], str]:
    """Coefficients of the release ``raw`` and their intervals, each ``(G, terms)``:
    ``value``, ``lower``, ``upper``, ``std`` and ``resolved``, the term names and the method.

    By the exact pivot (:func:`pivot_regression`) where it applies: ``resolved`` where the
    interval is bounded; NaN ends and ``std`` where there is no fit (a group without records,
    a singular system). Elsewhere by the basic bootstrap from ``drawn`` (draws around the
    release; required then): ``resolved`` where the predictors' matrix's smallest eigenvalue
    exceeds :data:`~mvg_dask.plan.derived_stats.RESOLVED_FACTOR` times the noise norm's
    ``level`` bound (elsewhere the noise dominates the fit and the coverage is not
    ``level``)."""
    M = model.regression_moments(raw)
    point, names = regression_fits(M, terms, lam)
    pivot = pivot_regression(model, raw[VALUE], terms, lam, level)
    if pivot is not None:
        out = {k: v[0] for k, v in pivot.items()}
        out["value"] = point[0]
        unfitted = np.isnan(point[0])  # an empty group, a singular system: no interval at all
        for k in ("lower", "upper", "std"):
            out[k] = np.where(unfitted, np.nan, out[k])
        out["resolved"] = out["resolved"] & ~unfitted
        return out, names, PIVOT_METHOD
    if drawn is None:
        raise ValueError("the bootstrap needs draws of the release's noise")
    Mb = model.regression_moments(drawn)
    boot, _ = regression_fits(Mb, terms, lam)
    lower, upper = basic_bootstrap_interval(point[0], boot, level)
    A, Ab = _predictor_matrices(M[0], terms), _predictor_matrices(Mb, terms)
    q = noise_norm_quantile(Ab, A, level)
    smallest = np.linalg.eigvalsh(A)[..., 0]
    resolved = np.broadcast_to((smallest > RESOLVED_FACTOR * q)[:, None], point[0].shape)
    out = {"value": point[0], "lower": lower, "upper": upper}
    out["std"] = np.nanstd(boot, axis=0, ddof=1)
    out["resolved"] = np.array(resolved)
    return out, names, "parametric bootstrap"


def _group_dims(
    ds: xr.Dataset, model: NoisyRelease, *dims: str
) -> tuple[tuple[str, ...], dict[str, Any]]:
    coords: dict[str, Any] = {}
    if model.grouped:
        coords[GROUP_DIM] = ds[GROUP_DIM].values
        return (GROUP_DIM, *dims), coords
    return dims, coords


def regression(
    ds: xr.Dataset,
    target: str | None = None,
    *,
    intercept: bool = False,
    ridge: float | str = "adassp",
) -> xr.DataArray:
    """Ridge regression of ``target`` on the other features from a release's second moment
    (:func:`~mvg_dask.plan.estimators.moment_regression`; no privacy cost).

    A regression or centered-covariance release's ``moment`` (with or without an intercept;
    per group, each group's moment divided by its noisy share ``N_g / N``), or a covariance
    release's ``X X^T / N`` (``gram / record_count`` with a noisy count; without an intercept:
    it has no means).

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance-like release.
    target : str, optional
        The target feature's label (default: a regression release's target).
    intercept : bool, default False
        Fit an intercept (not penalised).
    ridge : float or "adassp", default "adassp"
        ``lambda >= 0``, or the AdaSSP rule on the public noise std of the predictors' block.

    Returns
    -------
    xarray.DataArray
        ``coefficients`` over ``term`` (and ``group``), with ``target`` and ``ridge`` (one per
        group) as attributes.
    """
    model = NoisyRelease.of(ds, "regression")
    terms = _regression_terms(ds, model, target, intercept)
    raw = model.released(ds)
    M = model.regression_moments(raw)
    lam = ridges(ridge, M[0], model.regression_std(raw), terms)
    fit, names = regression_fits(M, terms, lam)
    attrs = _provenance(ds, "regression", target=terms.target)
    attrs["ridge"] = [float(v) for v in lam] if model.grouped else float(lam[0])
    dims, coords = _group_dims(ds, model, "term")
    coords["term"] = list(names)
    value = fit[0] if model.grouped else fit[0, 0]
    return xr.DataArray(value, dims=dims, coords=coords, name="coefficients", attrs=attrs)


def regression_intervals(
    ds: xr.Dataset,
    level: float = 0.95,
    target: str | None = None,
    *,
    intercept: bool = True,
    ridge: float | str = 0.0,
    draws: int = DEFAULT_DRAWS,
    seed: int | None = 0,
) -> xr.Dataset:
    """Regression coefficients with intervals from the release's noise law.

    At the true coefficients ``beta`` the released normal equations' residual
    ``Y_Qy - Y_QQ beta`` is exactly Gaussian with mean 0 and a covariance the published noise
    law gives, whatever the data (:mod:`mvg_dask.plan.regression_pivot`). Each coefficient's
    interval is the range of the ``beta`` that this pivot does not reject at ``level`` (a
    subvector Anderson-Rubin interval): it needs no estimate of the predictors' covariance,
    and where the noise swamps it the interval is wide or unbounded (``-inf`` or ``inf`` at
    that end, ``resolved`` False), as any valid interval must be there. With ``ridge=0``
    (the default: least squares) it covers the least-squares coefficients of the (clipped)
    records with probability about ``level`` where they are bounded and at least ``level``
    elsewhere (measured in the tests: docs/guide/python.md); a ridge fit's interval covers the
    ridge coefficients of the records. Where the pivot is not exact (unimodal noise; a ridge
    on a grouped moment or a ``gram`` divided by a noisy count) a parametric bootstrap serves
    (``draws`` draws with ``seed``; the ``method`` attribute says which).

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance-like release (as :func:`regression`).
    level : float
        Per-coefficient coverage, in (0, 1).
    target : str, optional
        As :func:`regression`.
    intercept : bool, default True
        Fit an intercept (a moment release only).
    ridge : float or "adassp", default 0
        As :func:`regression`.
    draws : int
        Bootstrap draws (where the bootstrap serves).
    seed : int, optional
        Of the bootstrap's generator (default 0: the same intervals every time).

    Returns
    -------
    xarray.Dataset
        ``value``, ``lower``, ``upper``, ``std`` (the delta method's, or the draws' std) and
        ``resolved`` over ``term`` (and ``group``), with ``level``, ``method``, ``draws``,
        ``seed``, ``target``, ``ridge`` and the provenance as attributes.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    model = NoisyRelease.of(ds, "regression_intervals")
    terms = _regression_terms(ds, model, target, intercept)
    raw = model.released(ds)
    M = model.regression_moments(raw)
    lam = ridges(ridge, M[0], model.regression_std(raw), terms)
    drawn = None
    if pivot_inputs(model, raw[VALUE][:0], terms, lam) is None:
        drawn = model.draws(raw, draws, np.random.default_rng(seed))
    res, names, method = regression_interval_arrays(model, raw, terms, lam, level, drawn)
    dims, coords = _group_dims(ds, model, "term")
    coords["term"] = list(names)
    sl = slice(None) if model.grouped else 0
    out = xr.Dataset({k: (dims, v[sl]) for k, v in res.items()}, coords=coords)
    out.attrs.update(_provenance(ds, "regression", target=terms.target))
    out.attrs |= {"level": level, "method": method, "draws": draws, "seed": seed}
    out.attrs["ridge"] = [float(v) for v in lam] if model.grouped else float(lam[0])
    if method == PIVOT_METHOD:
        fitted = ~np.isnan(res["value"])
        _warn_unbounded(int(np.sum(~res["resolved"] & fitted)), int(np.sum(fitted)))
    else:
        _warn_unresolved(
            int(np.sum(~res["resolved"][:, 0])),
            res["resolved"].shape[0],
            "regression (fits)",
            "the predictors' covariance is mostly noise, so are the coefficients, and their "
            "intervals do not cover as stated",
        )
    return out


def _warn_unbounded(count: int, total: int) -> None:
    if count:
        warnings.warn(
            f"regression: the noise leaves {count} of {total} coefficients without a bounded "
            "interval (the predictors' covariance is mostly noise): their interval is infinite "
            "on at least one side; a larger epsilon, more records or fewer predictors would help",
            NoiseDominatedWarning,
            stacklevel=3,
        )


# -- PCA ----------------------------------------------------------------------------------------
def _finite(C: np.ndarray) -> np.ndarray:
    """NaN matrices (a group without a positive share) as the identity, so that a batched
    eigendecomposition runs; the callers mask their results."""
    ok = np.all(np.isfinite(C), axis=(-2, -1))
    return np.where(ok[..., None, None], C, np.eye(C.shape[-1]))


def fraction_intervals(
    model: NoisyRelease,
    raw: dict[str, np.ndarray],
    drawn: dict[str, np.ndarray],
    level: float,
) -> dict[str, np.ndarray]:
    """Explained-variance fractions of the release ``raw`` and their intervals from ``drawn``
    (draws around it), each ``(G, m)``: :func:`fraction_interval_arrays` of their
    covariances."""
    return fraction_interval_arrays(model.covariances(raw)[0], model.covariances(drawn), level)


def fraction_interval_arrays(C: np.ndarray, Cb: np.ndarray, level: float) -> dict[str, np.ndarray]:
    """Explained-variance fractions of covariances ``C`` (``(..., m, m)``; NaN for a group
    without one) and their intervals from draws ``Cb`` around them (``(B, ..., m, m)``), each
    ``(..., m)``: ``value``, ``lower``, ``upper``, ``std`` and ``resolved``.

    A resolved component (its eigenvalue farther from its neighbours than
    :data:`~mvg_dask.plan.derived_stats.RESOLVED_FACTOR` times the noise norm's ``level``
    bound ``q``) gets the basic bootstrap interval. An unresolved one (an eigenvalue in a bulk
    of near-equal ones, which the noise reorders and spreads) gets Weyl's interval,
    ``(lambda +- q) / (tr C -+ t)`` with ``t`` the trace noise's ``level`` bound: wider, and
    covering at least ``level``.
    """
    bad = ~np.all(np.isfinite(C), axis=(-2, -1))
    C = _finite(C)
    Cb = _finite(Cb)
    point, boot = explained_variance_fractions(C), explained_variance_fractions(Cb)
    lower, upper = basic_bootstrap_interval(point, boot, level)
    q = noise_norm_quantile(Cb, C, level)  # (...)
    w = np.linalg.eigvalsh(0.5 * (C + np.swapaxes(C, -1, -2)))[..., ::-1]
    trace = np.trace(C, axis1=-2, axis2=-1)
    t = np.quantile(np.abs(np.trace(Cb, axis1=-2, axis2=-1) - trace), level, axis=0)
    resolved = resolved_eigenvalues(w, q) & ~bad[..., None]
    den_lo = np.maximum(trace + t, 1e-300)[..., None]
    den_hi = np.maximum(trace - t, 1e-300)[..., None]
    weyl_lo, weyl_hi = (w - q[..., None]) / den_lo, (w + q[..., None]) / den_hi
    nan = bad[..., None]
    return {
        "value": np.where(nan, np.nan, point),
        "lower": np.where(nan, 0.0, np.clip(np.where(resolved, lower, weyl_lo), 0.0, 1.0)),
        "upper": np.where(nan, 1.0, np.clip(np.where(resolved, upper, weyl_hi), 0.0, 1.0)),
        "std": np.where(nan, np.nan, np.std(boot, axis=0, ddof=1)),
        "resolved": resolved,
    }


def explained_variance(
    ds: xr.Dataset, level: float = 0.95, *, draws: int = DEFAULT_DRAWS, seed: int | None = 0
) -> xr.Dataset:
    """The explained-variance fractions ``lambda_k / tr C`` of a release's covariance with
    intervals from its noise law (a parametric bootstrap; the basic interval, clipped to
    ``[0, 1]``).

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance, centered-covariance or regression release.
    level : float
        Per-component coverage, in (0, 1).
    draws : int
        Bootstrap draws.
    seed : int, optional
        Of the bootstrap's generator.

    Returns
    -------
    xarray.Dataset
        ``value``, ``lower``, ``upper`` and ``std`` over ``component`` (0 the largest; and
        ``group``).
    """
    model = NoisyRelease.of(ds, "explained_variance")
    raw = model.released(ds)
    res = fraction_intervals(
        model, raw, model.draws(raw, draws, np.random.default_rng(seed)), level
    )
    dims, coords = _group_dims(ds, model, "component")
    coords["component"] = np.arange(res["value"].shape[-1])
    sl = slice(None) if model.grouped else 0
    out = xr.Dataset({k: (dims, v[sl]) for k, v in res.items()}, coords=coords)
    out.attrs.update(_provenance(ds, "explained_variance"))
    out.attrs |= {"level": level, "draws": draws, "seed": seed, "method": "parametric bootstrap"}
    _warn_unresolved(
        int(np.sum(~res["resolved"])),
        res["resolved"].size,
        "explained-variance fractions",
        "their intervals are Weyl's (wider)",
    )
    return out


def _warn_unresolved(count: int, total: int, what: str, consequence: str) -> None:
    if count:
        warnings.warn(
            f"{what}: the noise dominates {count} of {total} (a gap below "
            f"{RESOLVED_FACTOR:g} times the noise's norm): {consequence}; a larger epsilon or "
            "more records would help",
            NoiseDominatedWarning,
            stacklevel=3,
        )


def angle_draws(
    model: NoisyRelease, raw: dict[str, np.ndarray], k: int, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The released top-``k`` directions (``(G, m, k)``) and the largest principal angle
    between their span and that of each of ``draws`` draws around the release
    (``(draws, G)``; ``pi / 2`` for a group without a covariance): :func:`angle_arrays`."""
    drawn = model.covariances(model.draws(raw, draws, rng))
    return angle_arrays(model.covariances(raw)[0], drawn, k)


def angle_arrays(C: np.ndarray, Cb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-``k`` directions of covariances ``C`` (``(..., m, m)``) and the largest
    principal angle between their span and that of each draw ``Cb`` (``(B, ..., m, m)``)
    around them: ``(..., m, k)`` and ``(B, ...)`` (``pi / 2`` where ``C`` is NaN)."""
    V = top_subspace(_finite(C), k)
    boot = largest_principal_angle(V[None], top_subspace(_finite(Cb), k))
    bad = ~np.all(np.isfinite(C), axis=(-2, -1))
    return V, np.where(bad[None], np.pi / 2, boot)


def subspace_angle(
    ds: xr.Dataset,
    k: int = 1,
    level: float = 0.95,
    *,
    draws: int = DEFAULT_DRAWS,
    seed: int | None = 0,
) -> xr.Dataset:
    """The top-``k`` principal directions of a release's covariance and an upper bound, at
    ``level``, on the largest principal angle between their span and the non-private one's.

    The bound is the ``level`` quantile of the largest principal angle between the released
    top-``k`` subspace and that of the release plus independent draws of its noise (a
    parametric bootstrap; its coverage is measured in the tests).

    Parameters
    ----------
    ds : xarray.Dataset
        A complete covariance, centered-covariance or regression release.
    k : int
        The subspace's dimension, ``1 <= k < m``.
    level : float
        Coverage of the bound, in (0, 1).
    draws : int
        Bootstrap draws.
    seed : int, optional
        Of the bootstrap's generator.

    Returns
    -------
    xarray.Dataset
        ``components`` (``feature x component``, and ``group``), ``angle_upper`` and
        ``angle_median`` (radians; the bootstrap's median), with ``level``, ``k`` and the
        provenance as attributes.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    model = NoisyRelease.of(ds, "subspace_angle")
    V, boot = angle_draws(model, model.released(ds), k, draws, np.random.default_rng(seed))
    like = ds[COVARIANCE]
    fd = str(like.dims[-2])
    vdims, coords = _group_dims(ds, model, fd, "component")
    sdims, _ = _group_dims(ds, model)
    coords["component"] = np.arange(k)
    if fd in like.coords:
        coords[fd] = like[fd].values
    sl = slice(None) if model.grouped else 0
    out = xr.Dataset(
        {
            "components": (vdims, V[sl]),
            "angle_upper": (sdims, np.quantile(boot, level, axis=0)[sl]),
            "angle_median": (sdims, np.median(boot, axis=0)[sl]),
        },
        coords=coords,
    )
    out.attrs.update(_provenance(ds, "subspace_angle"))
    out.attrs |= {"level": level, "k": k, "draws": draws, "seed": seed}
    return out
