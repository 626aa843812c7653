"""The identity query ``f(X) = X``: the ``m x N`` data matrix itself, noise on every entry.

Per record: its own column. Per task: the block of columns, published as it is (no combine).
Sensitivity (replace-one only: adding a record adds a column): ``sup ||x - x'||``, whitened
``sqrt(sup (x - x')^T Sigma^-1 (x - x'))``. Noise: rectangular, ``Sigma`` on the rows (``Psi =
I`` or ``Sigma``), drawn record range by record range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan import stages as st
from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.queries.base import MatrixQuery
from mvg_dask.plan.queries.covariance import CovarianceQuery
from mvg_dask.plan.queries.whitened import Whitened
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.calibration import Algorithm

__all__ = ["IdentityQuery"]


@dataclass(frozen=True)
class IdentityQuery(MatrixQuery):
    """The identity query ``f(X) = X`` (``m x N``; parameters of :class:`MatrixQuery`)."""

    kind: ClassVar[str] = "identity"
    per_record_columns: ClassVar[bool] = True
    #: its noise and write of every record run faster on worker processes once warm, at
    #: 1 GB; up to 512 MiB threads are as fast warm and faster cold (docs/guide/performance.md,
    #: "Start-up")
    threads_max_bytes: ClassVar[int | None] = 512 * 2**20

    @property
    def shape(self) -> tuple[int, int]:
        """``(M, N)``."""
        return (self.features, self.records)

    def partial(self, block: np.ndarray) -> np.ndarray:
        """The block itself."""
        return np.asarray(block)

    def combine(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Blocks side by side."""
        return np.concatenate([left, right], axis=1)

    def finalize(self, total: np.ndarray) -> np.ndarray:
        """The data matrix."""
        return total

    def release_stages(
        self, *, noisy_count: bool, dp_pca: bool, panels: bool, lattice: bool
    ) -> tuple[str, ...]:
        """``identity``, after DP-PCA's ``gram, dp-pca`` when it picks the directions."""
        if dp_pca:
            return self.gram_stages(st.IDENTITY, noisy_count=noisy_count, dp_pca=True)
        return (*((st.NOISY_COUNT,) if noisy_count else ()), st.IDENTITY)

    def gram_pass(self) -> MatrixQuery:
        """DP-PCA's Gram pass sums ``x x^T``: the covariance's partial and combine."""
        return CovarianceQuery(self.features, self.records, records_known=self.records_known)

    def dry_run_text(self, rplan: Any) -> str:
        """The data matrix itself."""
        n = "N" if rplan.neighbours == "add-remove" else str(rplan.input.records)
        m = rplan.input.features
        return f"identity: the {m} x {n} data matrix itself, noise on every entry"

    def check_neighbours(self, neighbours: Neighbours) -> None:
        """Refuse add/remove neighbours (they change the output's shape)."""
        if neighbours == "add-remove":
            raise ValueError(
                "the identity query has one output column per record, so add/remove neighbours "
                "change its shape; use neighbours: replace-one"
            )

    def proved_l2_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float | None:
        """``sup ||x - x'||`` (``||w||`` for a box, ``2C`` for a ball)."""
        self.check_neighbours(neighbours)
        return domain.diff_norm()

    def l1_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``sup ||x - x'||_1``."""
        self.check_neighbours(neighbours)
        return domain.diff_l1()

    def _undeclared_sup_frobenius(self, domain: RecordDomain) -> float:
        return math.sqrt(self.records * domain.sup_norm_sq())

    def proved_sup_frobenius(self, domain: RecordDomain) -> float | None:
        """``sqrt(N R)`` (``None`` when the record count is private)."""
        if not self.records_known:
            return None
        return math.sqrt(self.records * domain.sup_norm_sq())

    def proved_entry_range(self, domain: RecordDomain) -> tuple[float, float] | None:
        """The domain's own entry range."""
        return domain.entry_range()

    def _undeclared_entry_range(self, domain: RecordDomain) -> tuple[float, float]:
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
        """Adds ``sqrt(sup (x - x')^T Sigma^-1 (x - x'))``."""
        least = float(min([*bounds, math.sqrt(white.sup_quadratic_diff(domain))]))
        return [least for _ in ratios]

    def lattice_coordinates(self, algorithm: Algorithm) -> int:
        """``m``: one record's column."""
        return self.shape[0]

    def float_error(
        self,
        abs_max: np.ndarray,
        whitening: ferr.Whitening,
        *,
        norm_max: float | None,
        algorithm: Algorithm,
        ratio: float | None,
        context: object,
    ) -> float:
        """The whitened column's error (:func:`~mvg_dask.privacy.float_error.identity_error`)."""
        return ferr.identity_error(abs_max, whitening=whitening, norm_max=norm_max)
