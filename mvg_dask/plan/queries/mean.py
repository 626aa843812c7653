"""The mean query ``f(X) = X 1 / N``: the column means of the records (``m`` entries).

Per record: ``x``. Per task: the row sums of each canonical block (:meth:`MeanQuery.partial`),
added in record order and along the Gram pass's fixed tree (:meth:`MeanQuery.combine`);
finalize: divide by ``N`` (public under replace-one; under add-remove a declared ``N0``, or ``1``
with a noisy record count: the sum ``X 1`` is released, and ``mean = sum / count``, as the
covariance's add-remove path does). Sensitivity: ``sup ||x - x'|| / N`` (replace-one),
``sup ||x|| / N`` (add-remove); whitened, ``sqrt(sup (x - x')^T Sigma^-1 (x - x')) / N`` and
``sqrt(sup x^T Sigma^-1 x) / N``. Noise: rectangular ``m x 1``, ``Sigma`` on the features
(``algorithm: unimodal``), published as the ``mean`` vector over the feature dimension
(docs/concepts/queries.md, "The mean").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan import stages as st
from mvg_dask.plan.domain import BoxDomain, L2BallDomain, Neighbours, RecordDomain
from mvg_dask.plan.queries.base import MatrixQuery, summed
from mvg_dask.plan.queries.whitened import Whitened
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm

__all__ = ["MeanQuery"]

#: A relative margin on the float-error bounds (as the Gram lemma's).
_UP = 1.0 + 2.0**-20
#: Sums beyond this could overflow: the bound is infinite.
_OVERFLOW = 2.0**1000


@dataclass(frozen=True)
class MeanQuery(MatrixQuery):
    """The column means ``X 1 / N`` (``m x 1``; parameters of :class:`MatrixQuery`)."""

    kind: ClassVar[str] = "mean"
    output_variable: ClassVar[str | None] = "mean"
    sum_variable: ClassVar[str] = "sum"
    output_vector: ClassVar[bool] = True

    @property
    def shape(self) -> tuple[int, int]:
        """``(M, 1)``."""
        return (self.features, 1)

    def partial(self, block: np.ndarray) -> np.ndarray:
        """The row sums of a block of records (``m x 1``)."""
        return np.asarray(block.sum(axis=1, keepdims=True))

    def combine(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """The sum."""
        return summed(left, right)

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """``X 1 / N``."""
        return np.asarray(total / self.records)

    # -- release -------------------------------------------------------------------------
    def release_stages(
        self, *, noisy_count: bool, dp_pca: bool, panels: bool, lattice: bool
    ) -> tuple[str, ...]:
        """``[noisy-count,] gram, query`` (fixed directions only)."""
        if dp_pca:
            raise ValueError("DP-PCA directions are not offered for a mean; use standard or matrix")
        return self.gram_stages(st.QUERY, noisy_count=noisy_count, dp_pca=False)

    def dry_run_text(self, rplan: Any) -> str:
        """The means, their normaliser (or the sum and a noisy count)."""
        m = rplan.input.features
        if rplan.neighbours != "add-remove":
            return f"mean X 1 / N ({m} features), N = {rplan.input.records} (public)"
        if not rplan.releases_count:
            return f"mean X 1 / N0 ({m} features), N0 = {self.records} declared public"
        return (
            f"sum X 1 ({m} features) and a noisy record count "
            f"({rplan.budgets.count_share:.0%} of the budget); mean = sum / count"
        )

    # -- sensitivities -------------------------------------------------------------------
    def proved_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """``sup ||x - x'|| / N`` (replace-one), ``sup ||x|| / N`` (add-remove)."""
        self.check_neighbours(neighbours)
        if neighbours == "add-remove":
            return math.sqrt(domain.sup_norm_sq()) / self.records
        return domain.diff_norm() / self.records

    def l1_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``sup ||x - x'||_1 / N`` or ``sup ||x||_1 / N``."""
        self.check_neighbours(neighbours)
        if neighbours == "replace-one":
            return domain.diff_l1() / self.records
        if isinstance(domain, L2BallDomain):
            return domain.radius * math.sqrt(domain.m) / self.records
        assert isinstance(domain, BoxDomain)
        return float(np.sum(domain.abs_max)) / self.records

    def _undeclared_sup_frobenius(self, domain: RecordDomain) -> float:
        return math.sqrt(domain.sup_norm_sq())

    def proved_sup_frobenius(self, domain: RecordDomain) -> float | None:
        """``sup ||x||`` (``None`` when the record count is private)."""
        return math.sqrt(domain.sup_norm_sq()) if self.records_known else None

    def proved_entry_range(self, domain: RecordDomain) -> tuple[float, float] | None:
        """The domain's entry range (``None`` when the record count is private)."""
        return domain.entry_range() if self.records_known else None

    def _undeclared_entry_range(self, domain: RecordDomain) -> tuple[float, float]:
        if not self.records_known:
            raise ValueError(
                "the entries of X 1 / N0 grow with the private record count: declare "
                "mechanism.entry_range or use calibration: exact"
            )
        return domain.entry_range()

    def whitened_bounds(
        self,
        domain: RecordDomain,
        neighbours: Neighbours,
        white: Whitened,
        algorithm: Algorithm,
        bounds: list[float],
        ratios: list[float | None],
    ) -> list[float]:
        """``sqrt(sup (x - x')^T Sigma^-1 (x - x')) / N`` (replace-one) or ``sqrt(sup x^T
        Sigma^-1 x) / N`` (add-remove); unimodal noise only (one column)."""
        if algorithm != "unimodal":
            raise ValueError(
                f"the mean is one column: its noise is Sigma on the features (algorithm: "
                f"unimodal), not {algorithm}"
            )
        if neighbours == "add-remove":
            own = math.sqrt(white.sup_quadratic(domain))
        else:
            own = math.sqrt(white.sup_quadratic_diff(domain))
        least = float(min([*bounds, own / self.records]))
        return [least for _ in ratios]

    # -- lattice noise -------------------------------------------------------------------
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
        """``E`` of the whitened means (docs/bounds.md, Sec. 11 without the products): each
        sum passes through at most ``depth`` additions and the division by ``N`` one rounding
        (Higham, Lemma 3.1), ``|f_hat_i - f_i| <= gamma_n rho a_i`` with ``rho = records / N``,
        then the row whitening (:func:`~mvg_dask.privacy.float_error.whitened_error`)."""
        if context is None:
            raise ValueError("a lattice mean needs its summation context (LatticeContext)")
        a = np.abs(np.asarray(abs_max, dtype=np.float64)).reshape(-1, 1)
        rho = float(context.records) / float(self.records)
        if float(context.records) * float(a.max(initial=0.0)) > _OVERFLOW:
            return math.inf
        n = int(context.depth) + (0 if float(self.records) == 1.0 else 1)
        g = ferr.gamma(n)
        err, mag = g * rho * a * _UP, (1.0 + g) * rho * a * _UP
        err_g, mag_g = ferr.whitened_error(err, mag, whitening=whitening, two_sided=False)
        return ferr.lattice_coordinates_error(err_g, mag_g, algorithm="unimodal", ratio=None)
