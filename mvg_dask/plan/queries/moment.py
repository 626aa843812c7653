"""The moment queries: the second moment ``M = Z Z^T / N`` of the augmented records
``z = [x; 1]`` (``(m + 1) x (m + 1)``, symmetric PSD), released as one covariance query.

``M`` holds every statistic of the records up to second order: its last column is the mean
``x_bar = X 1 / N`` (and its corner the constant ``1``), its top-left block the second moment
``X X^T / N``, so the covariance around the mean is ``M[:m, :m] - x_bar x_bar^T``
(``numpy.cov(X, bias=True)``). Both are post-processing of the one noisy ``M``.

* ``centered-covariance`` publishes ``moment``, ``mean`` and ``covariance``.
* ``regression`` is the same release with a declared response feature ``y`` among the
  records' features: ``M`` holds ``X^T X / N``, ``X^T y / N`` and the means, the sufficient
  statistics of a linear regression with or without an intercept (``ds.mvg.regression``).

Per record: ``z z^T``; per task: the Gram matrix of the block with a row of ones appended
(:func:`augmented_gram`: ``X X^T``, the row sums and the count, without forming ``Z``); the
fixed-tree combine and the finalize step are the covariance's. Sensitivity: the covariance
bounds of the augmented domain (``mvg_dask.plan.domain.augmented_domain``; docs/bounds.md
Sec. 13). A declared box is shifted by its centre ``c`` first, ``z = [x - c; 1]`` (its
``R = sup ||x - c||^2`` is about a quarter of ``sup ||x||^2`` on ``[0, 1]^m``, and the noise
with it; docs/bounds.md Sec. 14): the mean adds ``c`` back and the covariance does not depend
on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan.domain import RecordDomain, augmented_domain
from mvg_dask.plan.queries.covariance import CovarianceQuery

__all__ = [
    "CenteredCovarianceQuery",
    "RegressionQuery",
    "augmented_gram",
    "centered_from_moment",
    "grouped_centered_from_moment",
]


def augmented_gram(block: np.ndarray, centre: np.ndarray | None = None) -> np.ndarray:
    """``Z Z^T`` of the augmented records ``z = [x - c; 1]`` of a block, without forming ``Z``:
    ``[[X_c X_c^T, X_c 1], [1^T X_c^T, b]]`` with ``X_c = fl(X - c)``. Each entry is a sum of
    products ``z_i z_j`` over the block's records, as docs/bounds.md Sec. 11 bounds them (the
    query is defined on the computed ``fl(x - c)``, a function of one record whose range is
    the shifted box: rounding is monotone).

    Parameters
    ----------
    block : ndarray
        ``m x b`` records (features x records), float64.
    centre : ndarray, optional
        ``c`` (``m``), the public centre the records are shifted by; none by default.

    Returns
    -------
    ndarray
        ``(m + 1) x (m + 1)``.
    """
    if centre is not None:
        block = block - centre.reshape(-1, 1)
    m, b = block.shape
    out = np.empty((m + 1, m + 1), dtype=np.float64)
    out[:m, :m] = block @ block.T
    sums = block.sum(axis=1)
    out[:m, m] = sums
    out[m, :m] = sums
    out[m, m] = b
    return out


def centered_from_moment(
    moment: np.ndarray, centre: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The mean and the covariance around it, from a (noisy) augmented second moment.

    Parameters
    ----------
    moment : ndarray
        ``(m + 1) x (m + 1)``: ``Z Z^T / N`` of ``z = [x - c; 1]``, plus noise.
    centre : ndarray, optional
        ``c`` (``m``); none by default.

    Returns
    -------
    mean : ndarray
        ``M[:m, m] + c``, ``(m,)``.
    covariance : ndarray
        ``M[:m, :m] - M[:m, m] M[:m, m]^T`` (``numpy.cov(X, bias=True)`` without noise: the
        covariance does not depend on ``c``), symmetric when ``M`` is.
    """
    m = moment.shape[0] - 1
    shifted = np.array(moment[:m, m], dtype=np.float64)
    covariance = np.asarray(moment[:m, :m] - np.outer(shifted, shifted))
    return (shifted if centre is None else shifted + centre), covariance


def grouped_centered_from_moment(
    moments: np.ndarray, centre: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Every group's mean and covariance around it, from a grouped release's noisy moments.

    A group's moment ``M_g = Z_g Z_g^T / N`` (``z = [x - c; 1]``) divides by the global ``N``:
    its corner ``M_g[m, m]`` is the group's (noisy) share ``N_g / N``, so the mean about ``c`` is
    ``m_g = M_g[:m, m] / M_g[m, m]``, the mean ``m_g + c`` and the covariance
    ``M_g[:m, :m] / M_g[m, m] - m_g m_g^T`` (``numpy.cov`` of the group's records,
    ``bias=True``, without noise). A group whose noisy corner is not positive (an empty or tiny
    group) gets NaN for both.

    Parameters
    ----------
    moments : ndarray
        ``G x (m + 1) x (m + 1)``.
    centre : ndarray, optional
        ``c`` (``m``); none by default.

    Returns
    -------
    mean : ndarray
        ``G x m``.
    covariance : ndarray
        ``G x m x m``.
    """
    m = moments.shape[-1] - 1
    share = np.asarray(moments[:, m, m], dtype=np.float64)
    ok = share > 0
    safe = np.where(ok, share, 1.0)
    shifted = moments[:, :m, m] / safe[:, None]
    covariance = (
        moments[:, :m, :m] / safe[:, None, None] - shifted[:, :, None] * shifted[:, None, :]
    )
    mean = shifted if centre is None else shifted + centre
    mean[~ok] = np.nan
    covariance[~ok] = np.nan
    return mean, covariance


@dataclass(frozen=True)
class CenteredCovarianceQuery(CovarianceQuery):
    """The augmented second moment ``Z Z^T / N`` of ``z = [x - c; 1]``, published with the mean
    and the covariance around it (parameters of :class:`~mvg_dask.plan.MatrixQuery`, and the
    following; ``features`` counts the augmented terms, ``m + 1``).

    Parameters
    ----------
    centre : tuple of float, optional
        ``c``, public: the centre of a declared box (the plan's choice, docs/bounds.md
        Sec. 14: the shifted box's ``R = sup ||x - c||^2`` is about a quarter of the unshifted
        one on ``[0, 1]^m``); ``None`` (an L2 ball, centred at 0): no shift.
    """

    kind: ClassVar[str] = "centered-covariance"
    augmented: ClassVar[bool] = True

    centre: tuple[float, ...] | None = None

    def _check_fields(self) -> None:
        if self.features < 2:
            raise ValueError("a moment query needs at least one feature besides the constant")
        if not self.records_known:
            raise ValueError(f"a {self.kind} release divides by the public record count")

    @property
    def data_features(self) -> int:
        """``m``, the records' features (without the constant)."""
        return self.features - 1

    @property
    def centre_vector(self) -> np.ndarray | None:
        """``c`` as an array (``None``: no shift)."""
        return None if self.centre is None else np.asarray(self.centre, dtype=np.float64)

    def record_domain(self, domain: RecordDomain) -> RecordDomain:
        """The augmented records' domain (``mvg_dask.plan.domain.augmented_domain``, shifted
        by the centre): what the query sums."""
        return augmented_domain(domain, self.centre_vector)

    def partial(self, block: np.ndarray) -> np.ndarray:
        """``Z_b Z_b^T`` of the augmented block (:func:`augmented_gram`, as the engine forms
        it)."""
        return augmented_gram(np.asarray(block, dtype=np.float64), self.centre_vector)

    def _extra_dict(self) -> dict[str, object]:
        return {} if self.centre is None else {"centre": list(self.centre)}

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """:meth:`~mvg_dask.plan.MatrixQuery.fields_from_dict` with the centre."""
        centre = data.get("centre")
        return {
            **super().fields_from_dict(data),
            "centre": None if centre is None else tuple(float(v) for v in centre),
        }


@dataclass(frozen=True)
class RegressionQuery(CenteredCovarianceQuery):
    """The regression sufficient statistics: the centered-covariance release of the records
    with a declared response feature (parameters of :class:`CenteredCovarianceQuery` and the
    following).

    Parameters
    ----------
    target : int
        The response's position among the records' ``m`` features.
    target_label : str or int, optional
        Its label (the spec's ``target``), published as the release's ``target`` attribute.
    """

    kind: ClassVar[str] = "regression"

    target: int = -1
    target_label: str | int | None = None

    def _check_fields(self) -> None:
        super()._check_fields()
        if not 0 <= self.target < self.data_features:
            raise ValueError(
                f"regression target: position {self.target} is not one of the "
                f"{self.data_features} features"
            )
        if self.data_features < 2:
            raise ValueError("a regression needs a predictor besides the target feature")

    def _extra_dict(self) -> dict[str, object]:
        label = self.target if self.target_label is None else self.target_label
        return {**super()._extra_dict(), "target": self.target, "target_label": label}

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """:meth:`~mvg_dask.plan.MatrixQuery.fields_from_dict` with the target."""
        return {
            **super().fields_from_dict(data),
            "target": int(data["target"]),
            "target_label": data.get("target_label"),
        }
