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
bounds of the augmented domain (:func:`augmented_domain`; docs/bounds.md, "The augmented
record"), every bound over a superset of the augmented records being a bound over them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan.domain import BoxDomain, L2BallDomain, RecordDomain
from mvg_dask.plan.queries.covariance import CovarianceQuery

__all__ = [
    "CenteredCovarianceQuery",
    "RegressionQuery",
    "augmented_domain",
    "augmented_gram",
    "centered_from_moment",
    "grouped_centered_from_moment",
]


def augmented_gram(block: np.ndarray) -> np.ndarray:
    """``Z Z^T`` of the augmented records ``z = [x; 1]`` of a block, without forming ``Z``:
    ``[[X X^T, X 1], [1^T X^T, b]]``. Each entry is a sum of exact products ``x_i x_j`` or
    ``x_i 1`` over the block's records, as docs/bounds.md Sec. 11 bounds them.

    Parameters
    ----------
    block : ndarray
        ``m x b`` records (features x records), float64.

    Returns
    -------
    ndarray
        ``(m + 1) x (m + 1)``.
    """
    m, b = block.shape
    out = np.empty((m + 1, m + 1), dtype=np.float64)
    out[:m, :m] = block @ block.T
    sums = block.sum(axis=1)
    out[:m, m] = sums
    out[m, :m] = sums
    out[m, m] = b
    return out


def augmented_domain(domain: RecordDomain) -> RecordDomain:
    """A domain holding every augmented record ``[x; 1]`` of ``domain``'s records.

    A box gains the coordinate ``[0, 1]`` (a box's intervals are not degenerate; ``[0, 1]``
    keeps the box sign-definite exactly when the records' box is); an L2 ball of radius ``r``
    becomes the ball of radius ``sqrt(r^2 + 1)`` in ``m + 1`` dimensions. Every sensitivity
    bound over the larger set bounds the augmented records (docs/bounds.md, "The augmented
    record").

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        The records' declared domain.

    Returns
    -------
    BoxDomain or L2BallDomain
        The augmented domain (``m + 1`` features).
    """
    if isinstance(domain, BoxDomain):
        return BoxDomain(np.append(domain.lower, 0.0), np.append(domain.upper, 1.0))
    assert isinstance(domain, L2BallDomain)
    return L2BallDomain(math.sqrt(domain.radius**2 + 1.0), domain.m + 1)


def centered_from_moment(moment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean and the covariance around it, from a (noisy) augmented second moment.

    Parameters
    ----------
    moment : ndarray
        ``(m + 1) x (m + 1)``: ``Z Z^T / N`` of ``z = [x; 1]``, plus noise.

    Returns
    -------
    mean : ndarray
        ``M[:m, m]``, ``(m,)``.
    covariance : ndarray
        ``M[:m, :m] - mean mean^T`` (``numpy.cov(X, bias=True)`` without noise), symmetric
        when ``M`` is.
    """
    m = moment.shape[0] - 1
    mean = np.array(moment[:m, m], dtype=np.float64)
    return mean, np.asarray(moment[:m, :m] - np.outer(mean, mean))


def grouped_centered_from_moment(moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every group's mean and covariance around it, from a grouped release's noisy moments.

    A group's moment ``M_g = Z_g Z_g^T / N`` divides by the global ``N``: its corner
    ``M_g[m, m]`` is the group's (noisy) share ``N_g / N``, so the mean is ``M_g[:m, m] /
    M_g[m, m]`` and the covariance ``M_g[:m, :m] / M_g[m, m] - mean mean^T`` (``numpy.cov`` of
    the group's records, ``bias=True``, without noise). A group whose noisy corner is not
    positive (an empty or tiny group) gets NaN for both.

    Parameters
    ----------
    moments : ndarray
        ``G x (m + 1) x (m + 1)``.

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
    mean = moments[:, :m, m] / safe[:, None]
    covariance = moments[:, :m, :m] / safe[:, None, None] - mean[:, :, None] * mean[:, None, :]
    mean[~ok] = np.nan
    covariance[~ok] = np.nan
    return mean, covariance


@dataclass(frozen=True)
class CenteredCovarianceQuery(CovarianceQuery):
    """The augmented second moment ``Z Z^T / N`` of ``z = [x; 1]``, published with the mean and
    the covariance around it (parameters of :class:`MatrixQuery`; ``features`` counts the
    augmented terms, ``m + 1``)."""

    kind: ClassVar[str] = "centered-covariance"
    augmented: ClassVar[bool] = True

    def _check_fields(self) -> None:
        if self.features < 2:
            raise ValueError("a moment query needs at least one feature besides the constant")
        if not self.records_known:
            raise ValueError(f"a {self.kind} release divides by the public record count")

    @property
    def data_features(self) -> int:
        """``m``, the records' features (without the constant)."""
        return self.features - 1

    def record_domain(self, domain: RecordDomain) -> RecordDomain:
        """:func:`augmented_domain` (its records are what the query sums)."""
        return augmented_domain(domain)

    def partial(self, block: np.ndarray) -> np.ndarray:
        """``Z_b Z_b^T`` of the augmented block (:func:`augmented_gram`, as the engine forms
        it)."""
        return augmented_gram(np.asarray(block, dtype=np.float64))


@dataclass(frozen=True)
class RegressionQuery(CenteredCovarianceQuery):
    """The regression sufficient statistics: the centered-covariance release of the records
    with a declared response feature (parameters of :class:`MatrixQuery` and the following).

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
        return {"target": self.target, "target_label": label}

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """:meth:`MatrixQuery.fields_from_dict` with the target."""
        return {
            **super().fields_from_dict(data),
            "target": int(data["target"]),
            "target_label": data.get("target_label"),
        }
