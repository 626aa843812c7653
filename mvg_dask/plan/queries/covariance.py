"""The covariance (second moment) query ``f(X) = X X^T / N`` (``m x m``, symmetric PSD).

Per record: ``x x^T``. Per task: the Gram ``X_b X_b^T`` of a block of records, summed along a
fixed tree (the engine's ``gram_depth`` fan-in), finalized by dividing by ``N`` (public under
replace-one; a declared ``N0``, or the noisy count, under add-remove). Sensitivity: ``sqrt(2) R /
N`` (replace-one), ``R / N`` (add-remove or a sign-definite box), ``R = sup ||x||^2``; whitened:
docs/bounds.md Thm. 1 and 2. Noise: symmetric ``m x m``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan import stages as st
from mvg_dask.plan.domain import L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.queries.base import MatrixQuery, summed
from mvg_dask.plan.queries.whitened import Whitened, symmetric_bounds
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy import sensitivity as sens
from mvg_dask.privacy.calibration import Algorithm

__all__ = ["CovarianceQuery"]


@dataclass(frozen=True)
class CovarianceQuery(MatrixQuery):
    """The covariance query ``f(X) = X X^T / N`` (parameters of :class:`MatrixQuery`)."""

    kind: ClassVar[str] = "covariance"
    blocked_output: ClassVar[bool] = True
    second_moment: ClassVar[bool] = True
    output_variable: ClassVar[str | None] = "covariance"

    @property
    def shape(self) -> tuple[int, int]:
        """``(M, M)``."""
        return (self.features, self.features)

    @property
    def is_symmetric(self) -> bool:
        """Always."""
        return True

    @property
    def is_psd(self) -> bool:
        """Always."""
        return True

    def partial(self, block: np.ndarray) -> np.ndarray:
        """``X_b X_b^T``."""
        return np.asarray(block @ block.T)

    def combine(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """The sum (:func:`~mvg_dask.plan.queries.base.summed`: in a writeable operand)."""
        return summed(left, right)

    def release_stages(
        self, *, noisy_count: bool, dp_pca: bool, panels: bool, lattice: bool
    ) -> tuple[str, ...]:
        """``[noisy-count,] gram, [dp-pca,] covariance``; a wide one by row panels:
        ``[noisy-count,] [dp-pca-panels,] covariance-panels`` (``low-rank-lattice-panels`` for
        DP-PCA's low-rank directions on the lattice)."""
        if not panels:
            return self.gram_stages(st.COVARIANCE, noisy_count=noisy_count, dp_pca=dp_pca)
        count = (st.NOISY_COUNT,) if noisy_count else ()
        if not dp_pca:
            return (*count, st.COVARIANCE_PANELS)
        last = st.LOW_RANK_LATTICE_PANELS if lattice else st.COVARIANCE_PANELS
        return (*count, st.DP_PCA_PANELS, last)  # a wide DP-PCA keeps its top k: low rank

    def dry_run_text(self, rplan: Any) -> str:
        """``X X^T / N`` (public ``N``), ``/ N0`` (declared), or the sum and a noisy count."""
        m = rplan.input.features
        if rplan.neighbours != "add-remove":
            n = rplan.input.records
            return f"covariance X X^T / N ({m} x {m}), N = {n} (public under replace-one)"
        if not rplan.releases_count:
            return f"covariance X X^T / N0 ({m} x {m}), N0 = {self.records} declared public"
        return (
            f"sum X X^T ({m} x {m}) and a noisy record count "
            f"({rplan.budgets.count_share:.0%} of the budget); covariance = sum / count"
        )

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """``X X^T / N``."""
        return np.asarray(total / self.records)

    def trace_bound(self, domain: RecordDomain) -> float | None:
        """``tr(X Xᵀ / N) <= sup ||x||²`` over the declared domain."""
        return float(domain.sup_norm_sq())

    def proved_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """``sqrt(2) R / N`` (replace-one; ``||xx^T - x'x'^T||_F^2 = ||x||^4 + ||x'||^4 - 2
        (x^T x')^2``), ``R / N`` (add/remove), ``R = sup ||x||^2``. On a sign-definite box
        (every feature's interval on one side of 0, e.g. ``[0, 1]^m``) the replace-one value is
        ``R / N`` too (docs/bounds.md, Thm. 2 and Cor. 3; attained by ``x`` the far corner,
        ``x'`` the near one). The MVG paper used the looser ``2 R / N``; declare
        ``sensitivity`` to reproduce it."""
        self.check_neighbours(neighbours)
        R = domain.sup_norm_sq()
        one_sided = neighbours == "add-remove" or domain.sign_definite
        return (1.0 if one_sided else math.sqrt(2.0)) * R / self.records

    def l1_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``2 (sum_i a_i)^2 / N`` (replace-one) or ``(sum_i a_i)^2 / N`` (add/remove), since
        ``||x x^T||_1 = ||x||_1^2``."""
        self.check_neighbours(neighbours)
        if isinstance(domain, L2BallDomain):
            l1 = domain.radius**2 * domain.m  # ||x||_1^2 <= m ||x||_2^2
        else:
            l1 = float(np.sum(domain.abs_max)) ** 2
        return (2.0 if neighbours == "replace-one" else 1.0) * l1 / self.records

    def _undeclared_sup_frobenius(self, domain: RecordDomain) -> float:
        return domain.sup_norm_sq()

    def proved_sup_frobenius(self, domain: RecordDomain) -> float | None:
        """``R`` (``||X X^T||_F / N <= sum ||x_j||^2 / N``; ``None`` when the record count is
        private)."""
        if not self.records_known:
            return None
        return domain.sup_norm_sq()

    def proved_entry_range(self, domain: RecordDomain) -> tuple[float, float] | None:
        """The range of ``x_i x_j`` (``None`` when the record count is private)."""
        if not self.records_known:
            return None
        return self._outer_range(domain)

    @staticmethod
    def _outer_range(domain: RecordDomain) -> tuple[float, float]:
        if isinstance(domain, L2BallDomain):
            return -(domain.radius**2), domain.radius**2
        return sens.box_outer_entry_range(domain.lower, domain.upper)

    def _undeclared_entry_range(self, domain: RecordDomain) -> tuple[float, float]:
        if not self.records_known:
            raise ValueError(
                "the entries of X X^T / N0 grow with the private record count: declare "
                "mechanism.entry_range or use calibration: exact"
            )
        return self._outer_range(domain)

    def whitened_bounds(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        white: Whitened,
        algorithm: Algorithm,
        bounds: list[float],
        ratios: list[float | None],
    ) -> list[float]:
        """Unimodal: ``2 sqrt(S R) / N`` (replace-one), ``sqrt(S R) / N`` (add/remove);
        equi-modal: ``sqrt(2) S / N`` (``S / N``) and docs/bounds.md Thm. 1/2 at ``r = 1/2``;
        symmetric: ``sqrt(Q*(r) / r) / N``, ``S = sup x^T Sigma^-1 x``."""
        S = white.sup_quadratic(domain)
        N = self.records
        if algorithm == "unimodal":
            factor = 2.0 if neighbours == "replace-one" else 1.0
            least = float(min([*bounds, factor * math.sqrt(S * domain.sup_norm_sq()) / N]))
            return [least for _ in ratios]
        inputs = white.symmetric_inputs(domain)
        return symmetric_bounds(bounds, inputs, S, algorithm, neighbours, N, ratios)

    def float_error(
        self,
        abs_max: np.ndarray,
        whitening: ferr.Whitening,
        *,
        norm_max: float | None,
        algorithm: Algorithm,
        ratio: float | None,
        context: Any,
    ) -> float:
        """:func:`~mvg_dask.privacy.float_error.covariance_error_bound` of the summation tree
        ``context`` (a :class:`~mvg_dask.plan.lattice.LatticeContext`)."""
        if context is None:
            raise ValueError("a lattice covariance needs its summation context (LatticeContext)")
        return ferr.covariance_error_bound(
            abs_max,
            context.records,
            context.depth,
            float(self.records),
            whitening,
            algorithm,
            ratio,
            norm_max=norm_max,
        )
