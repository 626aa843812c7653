"""The noise plan: everything about a release's privacy, built from metadata only.

A :class:`NoisePlan` is built from (query, record domain, privacy parameters, algorithm,
calibration, directions, allocation) without touching data. It carries the row/column noise
covariances, the precision budget (paper calibrations), ``s_2``, ``gamma``, the Mahalanobis
sensitivity ``Delta_M`` and the ``(epsilon, delta)`` it guarantees. Executing it is a separate step.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import (
    TILE_RECORDS,
    matrix_noise,
    record_noise,
    symmetric_query_noise,
)
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.domain import (
    NEIGHBOURS,
    BoxDomain,
    Neighbours,
    RecordDomain,
    domain_from_dict,
)
from mvg_dask.plan.lattice import Lattice, LatticeContext, NoiseKind, choose_log2_grid
from mvg_dask.plan.low_rank import LowRankPrecision, dense_low_rank, low_rank_factor
from mvg_dask.plan.query import QuerySpec
from mvg_dask.privacy import allocation as alloc
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm, Calibration
from mvg_dask.privacy.registry import CalibrationRule, check_compatible, get_calibration

Composition = Literal["none", "basic", "gaussian-dp"]


@dataclass(frozen=True, kw_only=True)
class AllocationSpec:
    """How to split the precision budget over the directions.

    Parameters
    ----------
    strategy : {"uniform", "binary", "custom", "max-pnr", "mgm-optimal"}
        Strategy name.
    important : sequence of int, optional
        Important directions (``binary``); defaults to the directions' own (DP-PCA top-k).
    share : float, optional
        ``tau`` of the binary strategy (default 0.8).
    theta : sequence of float, optional
        Explicit shares (``custom``).
    eigenvalues : sequence of float, optional
        Query variance along each direction (``max-pnr``); defaults to DP-PCA's noisy ones.
    utility : ndarray, optional
        ``W_1`` of a linear utility subspace (``mgm-optimal``).
    """

    strategy: alloc.AllocationStrategy = "uniform"
    important: Sequence[int] | None = None
    share: float | None = None
    theta: Sequence[float] | None = None
    eigenvalues: Sequence[float] | None = None
    utility: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description."""
        out: dict[str, Any] = {"strategy": self.strategy}
        if self.important is not None:
            out["important"] = [int(i) for i in self.important]
        if self.share is not None:
            out["share"] = self.share
        return out


@dataclass(frozen=True, kw_only=True)
class BudgetSplit:
    """How ``(epsilon, delta)`` is shared between the DP-PCA direction step and the release.

    Attributes
    ----------
    composition : {"none", "basic", "gaussian-dp"}
        ``basic``: ``(s eps, s delta)`` + ``((1-s) eps, (1-s) delta)``. ``gaussian-dp``: both steps
        are Gaussian mechanisms after whitening, so ``mu^2 = mu_1^2 + mu_2^2`` exactly, with
        ``mu = mu*(eps, delta)`` of the analytic Gaussian mechanism (``exact`` only).
    share : float
        Fraction given to the direction step.
    step_mu : float or None
        The step's Gaussian ratio ``Delta / sigma``.
    release_epsilon, release_delta : float
        What the paper calibration of the release is given.
    release_mu : float or None
        ``mu`` available to the release (``exact``).
    count_share : float
        Fraction given to a noisy record count (add-remove covariance without a public
        normaliser): a Gaussian mechanism of sensitivity 1 with ratio ``count_mu``, or the basic
        share ``(count_epsilon, count_delta)``.
    """

    composition: Composition
    share: float
    step_mu: float | None
    step_epsilon: float | None
    step_delta: float | None
    release_epsilon: float
    release_delta: float
    release_mu: float | None
    count_share: float = 0.0
    count_mu: float | None = None
    count_epsilon: float | None = None
    count_delta: float | None = None


def split_budget(
    calibration: Calibration,
    epsilon: float,
    delta: float,
    share: float = 0.0,
    count_share: float = 0.0,
) -> BudgetSplit:
    """Split the budget between an optional DP-PCA step, an optional noisy count and the release.

    Parameters
    ----------
    calibration : str
        Release calibration.
    epsilon, delta : float
        Total privacy parameters.
    share : float, default 0
        Fraction for the direction step, ``0 <= share < 1``.
    count_share : float, default 0
        Fraction for a noisy record count, ``0 <= count_share``, ``share + count_share < 1``.

    Returns
    -------
    BudgetSplit
        The split. ``gaussian-dp`` (``exact``): each step is a Gaussian mechanism after whitening,
        so ``mu^2 = mu_step^2 + mu_count^2 + mu_release^2`` with each ``mu_i^2`` its share of
        ``mu*(epsilon, delta)^2``. ``basic``: each step gets its share of ``epsilon`` and
        ``delta``.
    """
    cal._check_privacy(epsilon, delta)
    if not 0 <= share < 1:
        raise ValueError(f"directions budget_share must lie in [0, 1), got {share!r}")
    if not 0 <= count_share < 1 or share + count_share >= 1:
        raise ValueError(
            f"the count's share ({count_share!r}) and the directions' share ({share!r}) must "
            "leave a positive share for the release"
        )
    gaussian_dp = get_calibration(calibration).gaussian_dp
    mu = cal.analytic_gaussian_mu(epsilon, delta) if gaussian_dp else None
    if share == 0 and count_share == 0:
        return BudgetSplit(
            composition="none",
            share=0.0,
            step_mu=None,
            step_epsilon=None,
            step_delta=None,
            release_epsilon=epsilon,
            release_delta=delta,
            release_mu=mu,
        )
    rest = 1.0 - share - count_share
    if mu is not None:  # exact: every step is a Gaussian mechanism, mu^2 adds up
        return BudgetSplit(
            composition="gaussian-dp",
            share=share,
            step_mu=math.sqrt(share) * mu if share else None,
            step_epsilon=None,
            step_delta=None,
            release_epsilon=epsilon,
            release_delta=delta,
            release_mu=math.sqrt(rest) * mu,
            count_share=count_share,
            count_mu=math.sqrt(count_share) * mu if count_share else None,
        )
    e1, d1 = share * epsilon, share * delta
    ec, dc = count_share * epsilon, count_share * delta
    return BudgetSplit(
        composition="basic",
        share=share,
        step_mu=cal.analytic_gaussian_mu(e1, d1) if share else None,
        step_epsilon=e1 if share else None,
        step_delta=d1 if share else None,
        release_epsilon=rest * epsilon,
        release_delta=rest * delta,
        release_mu=None,
        count_share=count_share,
        count_mu=cal.analytic_gaussian_mu(ec, dc) if count_share else None,
        count_epsilon=ec if count_share else None,
        count_delta=dc if count_share else None,
    )


def _check_compatible(
    query: QuerySpec, algorithm: Algorithm, calibration: Calibration, directions: Directions
) -> CalibrationRule:
    m, n = query.shape
    rule = check_compatible(
        calibration,
        algorithm,
        query_kind=query.kind,
        psd=query.is_psd,
        square=m == n,
        standard_directions=directions.is_standard,
        symmetric=query.is_symmetric,
    )
    if directions.dim != m:
        raise ValueError(f"directions are {directions.dim}-dimensional but the query has {m} rows")
    return rule


def paper_budget(
    query: QuerySpec,
    domain: RecordDomain,
    neighbours: Neighbours,
    algorithm: Algorithm,
    calibration: Calibration,
    epsilon: float,
    delta: float,
) -> cal.PrecisionBudget:
    """The precision budget of a paper calibration for this query and domain.

    Parameters
    ----------
    query : QuerySpec
        The query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    algorithm : {"unimodal", "equi-modal"}
        Noise type.
    calibration : str
        One of the paper calibrations (not ``exact``).
    epsilon, delta : float
        Privacy parameters of the release step.

    Returns
    -------
    PrecisionBudget
        The budget.
    """
    rule = get_calibration(calibration)
    if not rule.has_precision_budget:
        raise ValueError(f"{rule.label} is not a paper calibration: it has no precision budget")
    m, n = query.shape
    return rule.budget(
        m=m,
        n=n,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,
        sensitivity=query.l2_sensitivity(domain, neighbours),
        gamma=query.sup_frobenius(domain) if rule.uses_gamma else None,
        entry_range=query.output_entry_range(domain) if rule.uses_entry_range else None,
    )


def _resolve_allocation(
    spec: AllocationSpec,
    directions: Directions,
    *,
    kind: str,
    total_precision: float,
    weights: np.ndarray | None,
) -> np.ndarray:
    m = directions.dim
    if directions.is_low_rank and spec.strategy in ("max-pnr", "mgm-optimal"):
        raise ValueError(
            f"allocation strategy {spec.strategy} needs every direction, but these directions "
            f"keep only the top {directions.matrix.shape[1]} (a wide release's DP-PCA): use "
            "strategy uniform or binary"
        )
    if spec.strategy == "uniform":
        return alloc.uniform(m)
    if spec.strategy == "binary":
        important = spec.important if spec.important is not None else directions.important
        if not important:
            raise ValueError(
                "binary allocation needs important directions: list them in allocation.important "
                "or use directions: dp-pca with k"
            )
        return alloc.binary(m, important, 0.8 if spec.share is None else spec.share)
    if spec.strategy == "custom":
        if spec.theta is None:
            raise ValueError("custom allocation needs allocation.theta (one share per direction)")
        return alloc.check_allocation(spec.theta, m)
    if spec.strategy == "max-pnr":
        eig = spec.eigenvalues if spec.eigenvalues is not None else directions.eigenvalues
        if eig is None:
            raise ValueError(
                "max-pnr needs the query's variance along each direction from a DP estimate: use "
                "directions: dp-pca (or give allocation.eigenvalues from a DP source)"
            )
        if len(eig) != m:
            raise ValueError(f"max-pnr got {len(eig)} eigenvalues for {m} directions")
        return alloc.max_pnr(eig, total_precision=total_precision, kind=kind)
    if spec.strategy == "mgm-optimal":
        if spec.utility is None:
            raise ValueError("mgm-optimal allocation needs the utility subspace W_1 (m' x m)")
        return alloc.mgm_optimal(spec.utility, directions.matrix, kind=kind, weights=weights)
    raise ValueError(
        f"allocation strategy must be one of {', '.join(alloc.ALLOCATIONS)}, got {spec.strategy!r}"
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class NoisePlan:
    """A fully calibrated MVG noise plan (no data inside).

    Attributes
    ----------
    query : QuerySpec
        The query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    epsilon, delta : float
        The total guarantee (direction step + release).
    algorithm : {"unimodal", "equi-modal", "symmetric"}
        Alg. 1 (``Psi = I``), Alg. 2 (``Psi = Sigma``) or symmetric noise ``A S A^T``
        (``A = W diag(sqrt(v))``, ``S_ii ~ N(0, 1)``, ``S_ij = S_ji ~ N(0, r)``).
    calibration : str
        Calibration name.
    directions : Directions
        Noise directions ``W``.
    theta : ndarray
        The allocation.
    row_variances : ndarray
        Variances of the row noise along each direction (eigenvalues of ``Sigma``).
    precision_budget : float or None
        The paper's ``P`` (``None`` for ``exact``).
    budget_kind : str or None
        ``"squared"`` or ``"linear"``.
    sensitivity : float
        ``s_2``.
    gamma : float or None
        ``sup ||f(X)||_F`` where the calibration uses it.
    mahalanobis_sensitivity : float
        ``Delta_M`` of the release step.
    split : BudgetSplit
        How the budget was shared with the direction step.
    symmetric_ratio : float or None
        ``r = b^2 / a^2`` of symmetric noise (``None`` for the other noise types).
    noise : {"lattice", "float"}
        ``lattice``: the floating-point-safe release (:mod:`mvg_dask.plan.lattice`), whose
        effective sensitivity ``Delta_M + 2 E + 2^k sqrt(c)`` is calibrated; ``float``: the
        noise drawn and added in floating point (not floating-point safe).
    lattice : Lattice or None
        The release's lattice (``noise: lattice``).
    lattice_context : LatticeContext or None
        How the engine computes the query (what the float-error bound needs).
    """

    query: QuerySpec
    domain: RecordDomain
    neighbours: Neighbours
    epsilon: float
    delta: float
    algorithm: Algorithm
    calibration: Calibration
    directions: Directions
    allocation: AllocationSpec
    theta: np.ndarray
    row_variances: np.ndarray
    precision_budget: float | None
    budget_kind: str | None
    sensitivity: float
    gamma: float | None
    mahalanobis_sensitivity: float
    split: BudgetSplit
    budget_detail: cal.PrecisionBudget | None = field(default=None, repr=False)
    symmetric_ratio: float | None = None
    noise: NoiseKind = "float"
    lattice: Lattice | None = None
    lattice_context: LatticeContext | None = None

    # -- derived quantities ------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """Output shape ``(m, n)``."""
        return self.query.shape

    @property
    def col_variances(self) -> np.ndarray | None:
        """Column noise variances (equi-modal and symmetric: the row variances, ``A`` multiplies
        the noise on both sides; unimodal: ``None``)."""
        return None if self.algorithm == "unimodal" else self.row_variances

    @property
    def row_cov(self) -> np.ndarray:
        """``Sigma = W diag(v) W^T`` (``diag(v)`` for standard directions, in O(m^2); ``v_c I +
        U diag(v_U - v_c) U^T`` for low-rank directions)."""
        if self.directions.is_standard:
            return np.diag(self.row_variances)
        if self.directions.is_low_rank:
            U = self.directions.matrix
            k = U.shape[1]
            v = self.row_variances
            return dense_low_rank(U, v[:k], float(v[k]))
        W = self.directions.matrix
        return np.asarray((W * self.row_variances) @ W.T)

    @property
    def col_cov(self) -> np.ndarray | None:
        """``Psi`` (``None`` means ``I_n``); symmetric noise ``A S A^T``: ``A A^T`` as well."""
        return None if self.algorithm == "unimodal" else self.row_cov

    @property
    def output_symmetric_ratio(self) -> float | None:
        """``r`` of the noise a covariance release really adds: the plan's ratio for symmetric
        noise, ``1/2`` for equi-modal noise (the engine publishes ``(Z + Z^T) / 2``, which is
        ``A S A^T`` with ``S = (N + N^T) / 2``: ``S_ii ~ N(0, 1)``, ``S_ij ~ N(0, 1/2)``),
        ``None`` for unimodal noise or a non-symmetric query."""
        if self.algorithm == "symmetric":
            return self.symmetric_ratio
        if self.algorithm == "equi-modal" and self.query.is_symmetric:
            return 0.5
        return None

    @property
    def row_precision(self) -> np.ndarray:
        """``Sigma^-1 = W diag(1/v) W^T``."""
        if self.directions.is_standard:
            return np.diag(1.0 / self.row_variances)
        if self.directions.is_low_rank:
            U = self.directions.matrix
            k = U.shape[1]
            p = 1.0 / self.row_variances
            return dense_low_rank(U, p[:k], float(p[k]))
        W = self.directions.matrix
        return np.asarray((W / self.row_variances) @ W.T)

    @property
    def row_factor(self) -> np.ndarray:
        """``B_Sigma = W diag(sqrt(v))``, the affine sampler's factor (low-rank directions: the
        symmetric square root ``Sigma^(1/2) = a I + U diag(delta) U^T``, see
        :func:`~mvg_dask.plan.low_rank.low_rank_factor`)."""
        if self.directions.is_low_rank:
            U = self.directions.matrix
            a, delta = low_rank_factor(U, self.row_variances)
            return dense_low_rank(U, a + delta, a)
        return np.asarray(self.directions.matrix * np.sqrt(self.row_variances)[None, :])

    def entry_std(self) -> np.ndarray:
        """Standard deviation of each noise entry of the ``m x n`` output (``m x n'`` view).

        Unimodal: ``sqrt(diag Sigma)`` per row (every column alike, shape ``(m, 1)``);
        equi-modal: ``sqrt(diag(Sigma) diag(Sigma)^T)``; symmetric noise ``B S B^T``
        (``B = W diag(sqrt(v))``): ``Var Z_kl = r (Sigma_kk Sigma_ll + Sigma_kl^2) +
        (1 - 2r) sum_i B_ki^2 B_li^2`` (docs/bounds.md, Sec. 1).
        """
        if self.algorithm == "symmetric":
            return self._symmetric_std(float(self.symmetric_ratio or 0.5))
        d = self._row_cov_diagonal()
        if self.algorithm == "equi-modal":
            return np.asarray(np.sqrt(np.outer(d, d)))
        return np.asarray(np.sqrt(d)[:, None])

    def _row_cov_diagonal(self) -> np.ndarray:
        """``diag(Sigma)`` (O(m k) for low-rank directions)."""
        v = self.row_variances
        if self.directions.is_standard:
            return v
        if self.directions.is_low_rank:
            U = self.directions.matrix
            k = U.shape[1]
            return np.asarray(v[k] + (U * U) @ (v[:k] - v[k]))
        return np.diag(self.row_cov)

    def draw(self, key: NoiseKey, *, tile: int = TILE_RECORDS) -> np.ndarray:
        """The whole noise matrix this plan adds under ``key``, from the canonical tile grid.

        The same function of the key as a release's (whose identity tasks draw the same tiles
        record range by record range): ``B_Sigma N`` (unimodal), and for a symmetric query the
        noise :func:`~mvg_dask.noise.tiles.symmetric_query_noise` publishes (symmetric noise,
        or equi-modal noise averaged with its transpose).

        Parameters
        ----------
        key : NoiseKey
            The key of this noise (a release uses its ``derive("release")`` sub-key).
        tile : int
            Records per tile (the release's ``tile_records``).

        Returns
        -------
        ndarray
            ``m x n`` noise.
        """
        B = self.row_factor
        m, n = self.shape
        if self.algorithm == "unimodal" and (self.query.kind == "identity" or m != n):
            standard = self.directions.is_standard
            return record_noise(key, B, 0, n, tile=tile, n_total=n, diagonal=standard)
        standard = self.directions.is_standard
        if self.query.is_symmetric:
            return symmetric_query_noise(
                key, B, self.algorithm, self.symmetric_ratio, diagonal=standard
            )
        return matrix_noise(key, B, B if self.algorithm == "equi-modal" else None)

    def released_entry_std(self) -> np.ndarray:
        """Standard deviation of each entry of the noise a release publishes.

        Equal to :meth:`entry_std` except for equi-modal noise on a symmetric query, which the
        engine symmetrises (``(Z + Z^T) / 2``: :attr:`output_symmetric_ratio` ``= 1/2``).
        """
        r = self.output_symmetric_ratio
        if self.algorithm == "equi-modal" and r is not None:
            return self._symmetric_std(r)
        return self.entry_std()

    def released_std_ranges(
        self,
    ) -> tuple[tuple[float, float], tuple[float, float] | None]:
        """``(min, max)`` of :meth:`released_entry_std` on the diagonal (every entry of a
        non-square output) and off it (``None`` for a non-square output); O(m) for standard
        directions, whose stds are ``v_i`` on the diagonal and ``sqrt(r v_i v_j)`` off it
        (symmetric noise and the symmetrised equi-modal noise), ``sqrt(v_i v_j)`` (equi-modal
        noise on a non-symmetric query) or ``sqrt(v_i)`` (unimodal noise)."""
        m, n = self.shape
        square = self.query.kind != "identity" and m == n and m > 1
        if not self.directions.is_standard:
            std = np.broadcast_to(self.released_entry_std(), (m, n) if square else (m, 1))
            if not square:
                return (float(std.min()), float(std.max())), None
            on, off = np.diag(std), std[~np.eye(m, dtype=bool)]
            return (float(on.min()), float(on.max())), (float(off.min()), float(off.max()))
        v = np.sort(np.asarray(self.row_variances, dtype=np.float64))
        if self.algorithm == "unimodal":
            rows = (float(np.sqrt(v[0])), float(np.sqrt(v[-1])))
            return rows, (rows if square else None)
        r = self.output_symmetric_ratio
        factor = 1.0 if r is None else float(r)
        diag = (float(v[0]), float(v[-1]))
        if not square:
            return diag, None
        return diag, (float(np.sqrt(factor * v[0] * v[1])), float(np.sqrt(factor * v[-1] * v[-2])))

    def _symmetric_std(self, ratio: float) -> np.ndarray:
        """:func:`symmetric_entry_std` of ``B S B^T``; for standard directions in O(m^2):
        ``Var Z_kl = r v_k v_l`` off the diagonal and ``v_k^2`` on it; for ``r = 1/2`` (the
        symmetrised equi-modal noise) from ``Sigma`` alone, whatever the factor:
        ``Var Z_kl = (Sigma_kk Sigma_ll + Sigma_kl^2) / 2``."""
        if not self.directions.is_standard and ratio == 0.5:
            Sigma = self.row_cov
            d = np.diag(Sigma)
            return np.asarray(np.sqrt(0.5 * (np.outer(d, d) + Sigma * Sigma)))
        if not self.directions.is_standard:
            return symmetric_entry_std(self.row_factor, ratio)
        v = self.row_variances
        var = ratio * np.outer(v, v)
        np.fill_diagonal(var, v * v)
        return np.asarray(np.sqrt(var))

    @property
    def release_sensitivity(self) -> float:
        """The Gaussian-DP ``mu`` the release step really has: ``Delta_M``, or for a lattice
        release its effective sensitivity ``Delta_M + 2 E + 2^k sqrt(c)``."""
        if self.lattice is not None:
            return self.lattice.effective_sensitivity
        return self.mahalanobis_sensitivity

    def implied_epsilon(self) -> float:
        """Smallest ``epsilon`` the release step really has at its ``delta`` (analytic Gaussian).

        For a paper calibration this shows how conservative its sufficient condition is.
        """
        return cal.analytic_gaussian_epsilon(self.release_sensitivity, self.split.release_delta)

    def theorem_check(self) -> tuple[float, float]:
        """The calibration's own inequality evaluated on ``Sigma``/``Psi``: ``(lhs, rhs)``.

        Computed from the covariance matrices (eigenvalues of ``Sigma``), independently of the
        variances the plan was built with. ``lhs <= rhs`` must hold. For ``exact`` it is
        ``(delta_AG(eps, Delta_M), delta)``.
        """
        rule = get_calibration(self.calibration)
        if not rule.has_precision_budget:  # exact: the analytic Gaussian on Delta_M
            mu = math.hypot(
                self.release_sensitivity, self.split.step_mu or 0.0, self.split.count_mu or 0.0
            )
            return cal.analytic_gaussian_delta(self.epsilon, mu), self.delta
        budget = self.budget_detail
        assert budget is not None
        eig = (
            np.sort(self.row_variances)
            if self.directions.is_standard or self.directions.is_low_rank
            else np.linalg.eigvalsh(self.row_cov)
        )
        return rule.theorem_lhs(eig, n=self.shape[1], algorithm=self.algorithm), budget.bound

    # -- presentation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plan (the key is never part of a plan)."""
        col = self.col_variances
        return {
            "query": self.query.to_dict(),
            "domain": self.domain.to_dict(),
            "neighbours": self.neighbours,
            "calibration": self.calibration,
            "algorithm": self.algorithm,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "sensitivity": self.sensitivity,
            "gamma": self.gamma,
            "precision_budget": self.precision_budget,
            "budget_kind": self.budget_kind,
            "row_variances": self.row_variances.tolist(),
            "col_variances": None if col is None else col.tolist(),
            "mahalanobis_sensitivity": self.mahalanobis_sensitivity,
            "implied_epsilon": self.implied_epsilon(),
            **({} if self.symmetric_ratio is None else {"symmetric_ratio": self.symmetric_ratio}),
            "noise": self.noise,
            **(
                {}
                if self.lattice is None
                else {
                    "lattice": self.lattice.to_dict(),
                    "lattice_context": (
                        None
                        if self.lattice_context is None
                        else {
                            "records": self.lattice_context.records,
                            "depth": self.lattice_context.depth,
                        }
                    ),
                }
            ),
            "directions": {
                "method": self.directions.method,
                "important": list(self.directions.important),
                "matrix": None if self.directions.is_standard else self.directions.matrix.tolist(),
                "eigenvalues": (
                    None
                    if self.directions.eigenvalues is None
                    else np.asarray(self.directions.eigenvalues).tolist()
                ),
            },
            "allocation": {**self.allocation.to_dict(), "theta": self.theta.tolist()},
            "composition": {
                "method": self.split.composition,
                "direction_share": self.split.share,
                "direction_step_mu": self.split.step_mu,
                "direction_step_epsilon": self.split.step_epsilon,
                "direction_step_delta": self.split.step_delta,
                "release_epsilon": self.split.release_epsilon,
                "release_delta": self.split.release_delta,
                "release_mu": self.split.release_mu,
                "count_share": self.split.count_share,
                "count_mu": self.split.count_mu,
                "count_epsilon": self.split.count_epsilon,
                "count_delta": self.split.count_delta,
            },
        }

    def to_json(self, **kwargs: Any) -> str:
        """The plan as JSON."""
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        """A few human-readable lines."""
        m, n = self.shape
        std = np.sqrt(self.row_variances)
        lines = [
            f"MVG noise plan: {self.query.kind} query {m}x{n}, {self.algorithm} noise, "
            f"calibration {self.calibration}",
            f"  privacy: epsilon={self.epsilon:g}, delta={self.delta:g} ({self.neighbours}); "
            f"s2={self.sensitivity:.6g}, Delta_M={self.mahalanobis_sensitivity:.6g}",
            f"  noise std along directions: min {std.min():.4g}, max {std.max():.4g}",
        ]
        if self.precision_budget is not None:
            lines.append(f"  precision budget ({self.budget_kind}): {self.precision_budget:.6g}")
        if self.symmetric_ratio is not None:
            lines.append(
                f"  symmetric noise A S A^T: off-diagonal / diagonal variance r = "
                f"{self.symmetric_ratio:.6g}"
            )
        elif self.output_symmetric_ratio is not None:
            lines.append("  published symmetrised: (Z + Z^T) / 2, i.e. A S A^T with r = 0.5")
        if self.lattice is not None:
            lines.append("  " + self.lattice.summary())
        else:
            lines.append(
                "  float noise: drawn and added in floating point (not floating-point safe)"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(self.summary()) + "</pre>"


def build_noise_plan(
    query: QuerySpec,
    domain: RecordDomain,
    *,
    epsilon: float,
    delta: float,
    algorithm: Algorithm = "unimodal",
    calibration: Calibration = "exact",
    directions: Directions | None = None,
    allocation: AllocationSpec | None = None,
    neighbours: Neighbours = "replace-one",
    direction_share: float = 0.0,
    count_share: float = 0.0,
    symmetric_ratio: float | None = None,
    noise: NoiseKind = "float",
    lattice_context: LatticeContext | None = None,
) -> NoisePlan:
    """Build and check a noise plan from metadata only.

    Parameters
    ----------
    query : QuerySpec
        The query.
    domain : BoxDomain or L2BallDomain
        Declared record domain (its dimension must equal ``query.features``).
    epsilon, delta : float
        Total privacy parameters (including a DP-PCA direction step, if any).
    algorithm : {"unimodal", "equi-modal", "symmetric"}
        Alg. 1, Alg. 2 or symmetric noise ``A S A^T`` (symmetric queries, ``exact``).
    calibration : str
        One of :data:`mvg_dask.privacy.CALIBRATIONS`.
    directions : Directions, optional
        Noise directions; the standard basis by default.
    allocation : AllocationSpec, optional
        Budget split over the directions; uniform by default.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    direction_share : float, default 0
        Fraction of the budget already spent by a DP-PCA step that chose ``directions``.
    count_share : float, default 0
        Fraction of the budget spent on a noisy record count (add-remove covariance).
    symmetric_ratio : float, optional
        ``r = b^2 / a^2 >= 1/2`` of symmetric noise; by default the ``r`` that minimises the
        expected squared error of a uniform allocation (:func:`best_symmetric_ratio`).
    noise : {"float", "lattice"}, default "float"
        ``lattice``: calibrate the floating-point-safe release, whose effective sensitivity
        (``Delta_M`` plus twice the float error plus the grid's rounding) must meet the
        release's ``mu`` (:mod:`mvg_dask.plan.lattice`).
    lattice_context : LatticeContext, optional
        How the engine sums the query (required for a lattice covariance).

    Returns
    -------
    NoisePlan
        The plan. Its :meth:`NoisePlan.theorem_check` holds by construction.
    """
    cal._check_privacy(epsilon, delta)
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be one of {', '.join(NEIGHBOURS)}, got {neighbours!r}")
    dim = domain.m
    if dim != query.features:
        raise ValueError(f"the domain has {dim} features but the data has {query.features}")
    m, _ = query.shape
    directions = directions or Directions.standard(m)
    allocation = allocation or AllocationSpec()
    rule = _check_compatible(query, algorithm, calibration, directions)
    split = split_budget(calibration, epsilon, delta, direction_share, count_share)
    s2 = query.l2_sensitivity(domain, neighbours)
    ratio: float | None = None
    if algorithm == "symmetric":
        if symmetric_ratio is None:
            # low-rank directions take uniform or binary allocations, which do not depend on the
            # ratio: the ratio is chosen for the allocation the plan will have
            theta0 = (
                _resolve_allocation(
                    allocation,
                    directions,
                    kind=rule.allocation_kind,
                    total_precision=1.0,
                    weights=None,
                )
                if directions.is_low_rank
                else None
            )
            ratio = best_symmetric_ratio(query, domain, neighbours, directions, theta=theta0)
        else:
            ratio = float(symmetric_ratio)
            if not (math.isfinite(ratio) and ratio >= 0.5):
                raise ValueError(
                    f"symmetric_ratio must be a finite number >= 0.5, got {symmetric_ratio!r}"
                )
    elif symmetric_ratio is not None:
        raise ValueError("symmetric_ratio is only used with algorithm: symmetric")

    if not rule.has_precision_budget:  # exact: scale the precisions to Delta_M = mu*
        assert split.release_mu is not None
        weights = None
        if query.kind == "identity" and directions.is_standard and isinstance(domain, BoxDomain):
            weights = domain.widths**2
        # the linear precision a uniform plan would get: the water level for max-pnr
        uniform_total = _exact_scale(
            query,
            domain,
            neighbours,
            algorithm,
            directions,
            alloc.uniform(m),
            split.release_mu,
            ratio,
        )
        theta = _resolve_allocation(
            allocation,
            directions,
            kind=rule.allocation_kind,
            total_precision=uniform_total,
            weights=weights,
        )
        c = _exact_scale(
            query, domain, neighbours, algorithm, directions, theta, split.release_mu, ratio
        )
        # round toward more privacy on the matrices the release really uses
        for _ in range(200):
            row_variances = 1.0 / (c * theta)
            d_m = _mahalanobis(
                query, domain, neighbours, algorithm, directions, row_variances, ratio
            )
            if d_m <= split.release_mu:
                break
            c *= 1.0 - 1e-13
        budget = None
        gamma = None
    else:
        budget = paper_budget(
            query,
            domain,
            neighbours,
            algorithm,
            calibration,
            split.release_epsilon,
            split.release_delta,
        )
        total = math.sqrt(budget.budget) if budget.kind == "squared" else budget.budget
        theta = _resolve_allocation(
            allocation, directions, kind=budget.kind, total_precision=total, weights=None
        )
        row_variances = budget.variances(theta)
        gamma = query.sup_frobenius(domain) if rule.uses_gamma else None
    d_m = _mahalanobis(query, domain, neighbours, algorithm, directions, row_variances, ratio)
    lattice = None
    if noise == "lattice":
        mu = split.release_mu
        if mu is None:  # a paper calibration: the lattice's Gaussian must meet its (eps, delta)
            mu = cal.analytic_gaussian_mu(split.release_epsilon, split.release_delta)
        row_variances, d_m, lattice = _calibrate_lattice(
            query,
            domain,
            neighbours,
            algorithm,
            directions,
            np.asarray(row_variances),
            ratio,
            mu,
            lattice_context,
        )
    elif noise != "float":
        raise ValueError(f"noise must be lattice or float, got {noise!r}")
    return NoisePlan(
        query=query,
        domain=domain,
        neighbours=neighbours,
        epsilon=epsilon,
        delta=delta,
        algorithm=algorithm,
        calibration=calibration,
        directions=directions,
        allocation=allocation,
        theta=theta,
        row_variances=np.asarray(row_variances),
        precision_budget=None if budget is None else budget.budget,
        budget_kind=rule.allocation_kind if budget is None else budget.kind,
        sensitivity=s2,
        gamma=gamma,
        mahalanobis_sensitivity=d_m,
        split=split,
        budget_detail=budget,
        symmetric_ratio=ratio,
        noise=noise,
        lattice=lattice,
        lattice_context=lattice_context,
    )


def lattice_coordinates(query: QuerySpec, algorithm: Algorithm) -> int:
    """``c``: how many lattice coordinates one record can move (the identity: one record's
    column; symmetric noise: ``vech``; the other square noises: every entry)."""
    m, n = query.shape
    if query.kind == "identity":
        return m
    if algorithm == "symmetric":
        return m * (m + 1) // 2
    return m * n


def whitening_of(directions: Directions, variances: np.ndarray) -> ferr.Whitening:
    """The whitening ``A^-1`` of noise with these directions and variances."""
    if directions.is_standard:
        return ferr.Whitening.diagonal(variances)
    if directions.is_low_rank:
        # A = Sigma^(1/2) = a I + U diag(delta) U^T (the engine's factor of the wide release)
        a, delta = low_rank_factor(directions.matrix, variances)
        return ferr.Whitening.low_rank(directions.matrix, a, delta)
    return ferr.Whitening.dense(directions.matrix, variances)


def domain_abs_max(domain: RecordDomain) -> np.ndarray:
    """``sup |x_i|`` over the domain, per feature."""
    if isinstance(domain, BoxDomain):
        return np.asarray(domain.abs_max, dtype=np.float64)
    return np.full(domain.m, float(domain.radius))


def domain_norm_max(domain: RecordDomain) -> float | None:
    """``sup ||x||`` of an L2-ball domain (``None`` for a box: the bound uses ``||a||``)."""
    return None if isinstance(domain, BoxDomain) else float(domain.radius)


def gram_step_lattice(
    domain: RecordDomain,
    sensitivity: float,
    mu: float,
    context: LatticeContext,
) -> Lattice:
    """The lattice of a Gaussian step on ``vech(X X^T)`` (Analyze Gauss, iid noise on the
    upper triangle): whitened by ``1 / sigma``, with ``sigma`` the smallest for which the
    effective sensitivity ``(Delta + 2 E_G) / sigma + 2^k sqrt(c)`` meets ``mu``. The noise's
    standard deviation is ``sensitivity / lattice.sensitivity``.

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        The record domain.
    sensitivity : float
        ``Delta``: the L2 sensitivity of ``vech(X X^T)``.
    mu : float
        The step's Gaussian-DP ``mu``.
    context : LatticeContext
        How the Gram matrix is summed.

    Returns
    -------
    Lattice
        In whitened units (``sensitivity`` is ``Delta / sigma``).
    """
    m = domain.m
    c = m * (m + 1) // 2
    abs_max = domain_abs_max(domain)

    def error(sigma: float) -> float:
        # noise sigma S on X X^T: whitened by 1 / sqrt(sigma) on both sides (variances sigma)
        white = ferr.Whitening.diagonal(np.full(m, sigma))
        return ferr.covariance_error_bound(
            abs_max,
            context.records,
            context.depth,
            1.0,
            white,
            "symmetric",
            1.0,
            norm_max=domain_norm_max(domain),
        )

    sigma = sensitivity / mu
    err = error(sigma)
    k = choose_log2_grid(mu, c, err)
    room = mu - math.ldexp(math.sqrt(c), k)
    for _ in range(60):
        if sensitivity / sigma + 2.0 * err <= room:
            break
        sigma *= (sensitivity / sigma + 2.0 * err) / room * (1.0 + 1e-12)
        err = error(sigma)
    else:  # pragma: no cover - the scaling is exact up to rounding
        raise ValueError("could not calibrate the lattice of the DP-PCA step")
    return Lattice(log2_grid=k, coordinates=c, float_error=err, sensitivity=sensitivity / sigma)


def release_float_error(
    query: QuerySpec,
    domain: RecordDomain,
    algorithm: Algorithm,
    directions: Directions,
    variances: np.ndarray,
    ratio: float | None,
    context: LatticeContext | None,
) -> float:
    """``E``: the worst-case floating-point error of the computed whitened query, over the
    domain (docs/bounds.md, Sec. 11)."""
    whitening = whitening_of(directions, variances)
    abs_max = domain_abs_max(domain)
    if query.kind == "identity":
        return ferr.identity_error(abs_max, whitening=whitening, norm_max=domain_norm_max(domain))
    if query.kind != "covariance":
        raise ValueError(f"lattice noise is not available for a {query.kind} query")
    if context is None:
        raise ValueError("a lattice covariance needs its summation context (LatticeContext)")
    return ferr.covariance_error_bound(
        abs_max,
        context.records,
        context.depth,
        float(query.records),
        whitening,
        algorithm,
        ratio,
        norm_max=domain_norm_max(domain),
    )


def _calibrate_lattice(
    query: QuerySpec,
    domain: RecordDomain,
    neighbours: Neighbours,
    algorithm: Algorithm,
    directions: Directions,
    variances: np.ndarray,
    ratio: float | None,
    mu: float,
    context: LatticeContext | None,
) -> tuple[np.ndarray, float, Lattice]:
    """Scale the variances until the lattice's effective sensitivity meets ``mu``.

    ``Delta_M`` and ``E`` are both linear in the whitening, so scaling every variance by ``t``
    scales them by ``t^(-1/2)`` (unimodal noise) or ``t^(-1)`` (two-sided noise); the grid is
    chosen once, from ``mu`` and the first ``E``, and its term is fixed.
    """
    c = lattice_coordinates(query, algorithm)
    degree = 0.5 if algorithm == "unimodal" else 1.0

    def measure(v: np.ndarray) -> tuple[float, float]:
        d_m = _mahalanobis(query, domain, neighbours, algorithm, directions, v, ratio)
        return d_m, release_float_error(query, domain, algorithm, directions, v, ratio, context)

    d_m, err = measure(variances)
    k = choose_log2_grid(mu, c, err)
    room = mu - math.ldexp(math.sqrt(c), k)
    if not room > 0:
        # the grid's floor (a share of E, which keeps the integers in range) alone exceeds mu
        raise ValueError(
            f"lattice noise cannot absorb this release's floating-point error (E <= {err:.3g} "
            f"in whitened units over {c} coordinates, against mu = {mu:.3g}): declare a "
            "smaller privacy.max_records (add-remove), use standard directions, or "
            "mechanism.noise: float (not floating-point safe)"
        )
    for _ in range(60):
        if d_m + 2.0 * err <= room:
            break
        # variances * t scale (d_m + 2 err) by t^-degree: aim just below the room
        t = ((d_m + 2.0 * err) / room) ** (1.0 / degree) * (1.0 + 1e-12)
        variances = variances * t
        d_m, err = measure(variances)
    else:  # pragma: no cover - the scaling is exact up to rounding
        raise ValueError("could not calibrate the lattice release")
    return variances, d_m, Lattice(log2_grid=k, coordinates=c, float_error=err, sensitivity=d_m)


def _mahalanobis(
    query: QuerySpec,
    domain: RecordDomain,
    neighbours: Neighbours,
    algorithm: Algorithm,
    directions: Directions,
    variances: np.ndarray,
    ratio: float | None,
) -> float:
    """``Delta_M`` of noise with ``Sigma = W diag(variances) W^T``: with standard directions from
    the precision vector (O(m), no ``m x m`` matrix), otherwise from the dense precision."""
    if directions.is_standard:
        return query.mahalanobis_sensitivity(
            domain, neighbours, 1.0 / np.asarray(variances), algorithm, ratio=ratio
        )
    if directions.is_low_rank:
        precision = LowRankPrecision.from_variances(directions.matrix, np.asarray(variances))
        return query.mahalanobis_sensitivity(domain, neighbours, precision, algorithm, ratio=ratio)
    W = directions.matrix
    return query.mahalanobis_sensitivity(
        domain, neighbours, (W / variances) @ W.T, algorithm, directions=W, ratio=ratio
    )


def _exact_scale(
    query: QuerySpec,
    domain: RecordDomain,
    neighbours: Neighbours,
    algorithm: Algorithm,
    directions: Directions,
    theta: np.ndarray,
    mu: float,
    ratio: float | None = None,
) -> float:
    """The scale ``c`` with precisions ``c theta`` whose ``Delta_M`` equals ``mu``.

    ``Delta_M`` is homogeneous in the precision scale: degree 1/2 for unimodal noise (only
    ``A^-1`` scales) and 1 for equi-modal and symmetric noise (``A^-1`` and ``A^-T`` both
    scale).
    """
    d1 = _mahalanobis(query, domain, neighbours, algorithm, directions, 1.0 / theta, ratio)
    degree = 0.5 if algorithm == "unimodal" else 1.0
    return float((mu / d1) ** (1.0 / degree))


def lattice_context_from_dict(data: dict[str, Any]) -> LatticeContext | None:
    """The ``lattice_context`` of a plan as published (:meth:`NoisePlan.to_dict`), or ``None``
    (float noise, or a plan written before lattice releases)."""
    ctx = data.get("lattice_context")
    if ctx is None:
        return None
    return LatticeContext(records=int(ctx["records"]), depth=int(ctx["depth"]))


def noise_plan_from_dict(data: dict[str, Any]) -> NoisePlan:
    """Rebuild a :class:`NoisePlan` from :meth:`NoisePlan.to_dict`.

    The plan is recomputed from what the dictionary records (query, domain, privacy, algorithm,
    calibration, directions and the resolved allocation ``theta``), and the recomputed noise
    variances must equal the recorded ones: a stored plan is never trusted blindly.

    Parameters
    ----------
    data : dict
        A plan dictionary.

    Returns
    -------
    NoisePlan
        The plan.

    Raises
    ------
    ValueError
        When the dictionary is a pending plan (directions chosen at run time) or does not
        reproduce its own noise variances.
    """
    d = data["directions"]
    if data.get("row_variances") is None:
        raise ValueError("this plan is pending: its directions are chosen by DP-PCA at run time")
    query = QuerySpec.from_dict(data["query"])
    domain = domain_from_dict(data["domain"], query.features)
    m = query.shape[0]
    eig = d.get("eigenvalues")
    directions = Directions(
        d["method"],
        # None: the standard basis, not formed (Directions.matrix)
        None if d["matrix"] is None else np.asarray(d["matrix"], dtype=np.float64),
        tuple(int(i) for i in d["important"]),
        None if eig is None else np.asarray(eig, dtype=np.float64),
        m,
    )
    a = data["allocation"]
    described = AllocationSpec(
        strategy=a["strategy"], important=a.get("important"), share=a.get("share")
    )
    comp = data["composition"]
    plan = build_noise_plan(
        query,
        domain,
        epsilon=float(data["epsilon"]),
        delta=float(data["delta"]),
        algorithm=data["algorithm"],
        calibration=data["calibration"],
        directions=directions,
        allocation=AllocationSpec(strategy="custom", theta=[float(t) for t in a["theta"]]),
        neighbours=data["neighbours"],
        direction_share=float(comp["direction_share"]),
        count_share=float(comp.get("count_share", 0.0)),
        symmetric_ratio=data.get("symmetric_ratio"),
        noise=data.get("noise", "float"),
        lattice_context=lattice_context_from_dict(data),
    )
    stored = np.asarray(data["row_variances"], dtype=np.float64)
    if not np.allclose(plan.row_variances, stored, rtol=1e-12, atol=0.0):
        raise ValueError(
            "the stored plan does not reproduce its own noise variances (made by another "
            "version of mvg_dask?)"
        )
    return replace(plan, allocation=described)


def symmetric_entry_std(factor: np.ndarray, ratio: float) -> np.ndarray:
    """Entry standard deviations of ``B S B^T``, ``S_ii ~ N(0, 1)``, ``S_ij = S_ji ~ N(0, r)``.

    ``Var Z_kl = r (Sigma_kk Sigma_ll + Sigma_kl^2) + (1 - 2r) sum_i B_ki^2 B_li^2`` with
    ``Sigma = B B^T`` (docs/bounds.md, Sec. 1).

    Parameters
    ----------
    factor : ndarray
        ``B`` (``m x m``).
    ratio : float
        ``r``.

    Returns
    -------
    ndarray
        ``m x m`` standard deviations.
    """
    B = np.asarray(factor, dtype=np.float64)
    Sigma = B @ B.T
    d = np.diag(Sigma)
    B2 = B * B
    var = ratio * (np.outer(d, d) + Sigma**2) + (1.0 - 2.0 * ratio) * (B2 @ B2.T)
    return np.asarray(np.sqrt(np.maximum(var, 0.0)))


def symmetric_error_factors(theta: np.ndarray, ratios: Sequence[float]) -> list[float]:
    """``E ||B S B^T||_F^2`` for precisions ``theta`` (``v = 1 / theta``) and each ratio ``r``:
    ``sum v_i^2 + r sum_{i != j} v_i v_j`` (as ``||B S B^T||_F = ||diag(sqrt v) S diag(sqrt
    v)||_F``)."""
    v = 1.0 / np.asarray(theta, dtype=np.float64)
    sq = float(v @ v)
    cross = float(v.sum()) ** 2 - sq
    return [sq + float(r) * cross for r in ratios]


def best_symmetric_ratio(
    query: QuerySpec,
    domain: RecordDomain,
    neighbours: Neighbours,
    directions: Directions | np.ndarray,
    *,
    theta: np.ndarray | None = None,
) -> float:
    """The ratio ``r = b^2 / a^2`` that minimises the expected squared error of symmetric noise.

    With a uniform allocation (precisions ``c``), ``Delta_M(r) = c Delta_1(r)`` and the noise's
    expected squared Frobenius norm is ``(m + r m (m - 1)) / c^2``; calibrated to
    ``Delta_M = mu`` it is ``Delta_1(r)^2 (m + r m (m - 1)) / mu^2``. This is minimised over a
    fixed grid of ``r`` in ``[1/2, 2 (m + 1)]`` (log-spaced, plus the closed-form optima
    ``1/2``, ``1/sqrt(2)`` and ``(m + 1)/2`` of docs/bounds.md Sec. 4). Metadata only.

    Parameters
    ----------
    query : QuerySpec
        A symmetric query.
    domain : BoxDomain or L2BallDomain
        Declared record domain.
    neighbours : {"replace-one", "add-remove"}
        Neighbouring relation.
    directions : Directions or ndarray
        Directions (a matrix ``W`` is wrapped as given).
    theta : ndarray, optional
        The allocation (low-rank directions: their uniform or binary one), for which the error
        ``r ((tr Sigma)^2 + tr Sigma^2) + (1 - 2r) sum_i Sigma_ii^2`` of ``B S B``, ``B =
        Sigma^(1/2)``, is minimised (docs/bounds.md, Sec. 10); uniform by default.

    Returns
    -------
    float
        ``r``.
    """
    dirs = directions if isinstance(directions, Directions) else Directions("matrix", directions)
    m = dirs.dim
    if theta is not None and dirs.is_low_rank:
        return _best_low_rank_ratio(query, domain, neighbours, dirs, np.asarray(theta, float))
    theta = alloc.uniform(m)
    grid = _ratio_grid(m)
    if dirs.is_standard or dirs.is_low_rank:
        # uniform precisions: Sigma^-1 = c I whatever the directions, and B = Sigma^(1/2) of a
        # low-rank set is diagonal too
        d1s = query.mahalanobis_sensitivities(
            domain, neighbours, theta, directions=None, ratios=list(grid)
        )
    else:
        W = dirs.matrix
        d1s = query.mahalanobis_sensitivities(
            domain, neighbours, (W * theta) @ W.T, directions=W, ratios=list(grid)
        )
    best_r, best_err = 0.5, math.inf
    for r, d1, factor in zip(grid, d1s, symmetric_error_factors(theta, list(grid)), strict=True):
        err = d1 * d1 * factor
        if err < best_err * (1.0 - 1e-12):
            best_r, best_err = float(r), err
    return best_r


def _ratio_grid(m: int) -> np.ndarray:
    """The candidate ratios of :func:`best_symmetric_ratio`."""
    return np.unique(
        np.concatenate(
            [np.geomspace(0.5, 2.0 * (m + 1), 241), [0.5, 1.0 / math.sqrt(2.0), (m + 1) / 2.0]]
        )
    )


def _best_low_rank_ratio(
    query: QuerySpec,
    domain: RecordDomain,
    neighbours: Neighbours,
    directions: Directions,
    theta: np.ndarray,
) -> float:
    """:func:`best_symmetric_ratio` for low-rank directions and their allocation ``theta``:
    ``Delta_1(r)^2`` times the expected squared error of ``B S B`` at precisions ``theta``."""
    U = directions.matrix
    k = U.shape[1]
    v = 1.0 / theta
    precision = LowRankPrecision.from_variances(U, v)
    grid = _ratio_grid(U.shape[0])
    d1s = query.mahalanobis_sensitivities(
        domain, neighbours, precision, directions=None, ratios=list(grid)
    )
    trace, trace_sq = float(v.sum()), float(v @ v)
    diag = v[k] + (U * U) @ (v[:k] - v[k])
    diag_sq = float(diag @ diag)
    best_r, best_err = 0.5, math.inf
    for r, d1 in zip(grid, d1s, strict=True):
        err = d1 * d1 * (r * (trace**2 + trace_sq) + (1.0 - 2.0 * r) * diag_sq)
        if err < best_err * (1.0 - 1e-12):
            best_r, best_err = float(r), err
    return best_r
