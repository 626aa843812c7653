"""The moment queries: the second moment ``M = Z Z^T / N`` of the augmented records
``z = [x - c; s]`` (``(m + 1) x (m + 1)``, symmetric PSD), released as one covariance query.

``M`` holds every statistic of the records up to second order: its last column is ``s`` times
the mean about ``c`` (``u = M[:m, m] / s``, the mean ``c + u``; its corner the constant
``s^2``), its top-left block the second moment about ``c``, so the covariance around the mean is
``M[:m, :m] - u u^T`` (``numpy.cov(X, bias=True)``). Both are post-processing of the one noisy
``M``.

* ``centered-covariance`` publishes ``moment``, ``mean`` and ``covariance``.
* ``regression`` is the same release with a declared response feature ``y`` among the
  records' features: ``M`` holds ``X^T X / N``, ``X^T y / N`` and the means, the sufficient
  statistics of a linear regression with or without an intercept (``ds.mvg.regression``).

Per record: ``z z^T``; per task: the Gram matrix of the block with a row of ones appended
(:func:`augmented_gram`: ``X X^T``, the row sums and the count, without forming ``Z``); the
fixed-tree combine and the finalize step are the covariance's, then the last row and column are
multiplied by ``s`` (:func:`scale_constant`: a power of two, so exactly the moment of ``[x - c;
s]``). Sensitivity: the covariance bounds of the augmented domain
(``mvg_dask.plan.domain.augmented_domain``; docs/bounds.md Sec. 13). A declared box is shifted
by its centre ``c`` first (its ``R = sup ||x - c||^2`` is about a quarter of ``sup ||x||^2`` on
``[0, 1]^m``, and the noise with it), and the constant ``s`` matches the domain's scale
(``mvg_dask.privacy.sensitivity.augmented_scale``; docs/bounds.md Sec. 14): the mean adds ``c``
back and the covariance depends on neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from mvg_dask.plan import stages as st
from mvg_dask.plan.domain import BoxDomain, L2BallDomain, RecordDomain, augmented_domain
from mvg_dask.plan.queries.base import MatrixQuery
from mvg_dask.plan.queries.covariance import CovarianceQuery
from mvg_dask.privacy.sensitivity import augmented_scale

__all__ = [
    "CenteredCovarianceQuery",
    "RegressionQuery",
    "augmented_gram",
    "centered_from_moment",
    "grouped_centered_from_moment",
    "grouped_gram",
    "moment_scale",
    "scale_constant",
]


def augmented_gram(
    block: np.ndarray, centre: np.ndarray | None = None, scale: float = 1.0
) -> np.ndarray:
    """``Z Z^T`` of the augmented records ``z = [x - c; s]`` of a block, without forming ``Z``:
    ``[[X_c X_c^T, s X_c 1], [s 1^T X_c^T, s^2 b]]`` with ``X_c = fl(X - c)``. Each entry is a
    sum of products ``z_i z_j`` over the block's records, as docs/bounds.md Sec. 11 bounds them
    (the query is defined on the computed ``fl(x - c)``, a function of one record whose range
    is the shifted box: rounding is monotone; ``s`` is a power of two, so ``s`` times a float
    sum is the float sum of the ``s``-scaled terms, exactly).

    Parameters
    ----------
    block : ndarray
        ``m x b`` records (features x records), float64.
    centre : ndarray, optional
        ``c`` (``m``), the public centre the records are shifted by; none by default.
    scale : float, default 1
        ``s``, the constant coordinate.

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
    return out if scale == 1.0 else scale_constant(out, scale)


def moment_scale(domain: RecordDomain) -> float:
    """The constant coordinate ``s`` of a moment query's ``z = [x - c; s]``, from the declared
    domain alone (:func:`~mvg_dask.privacy.sensitivity.augmented_scale`): ``A = sup ||x - c||^2``
    is the box's squared half-diagonal about its centre, or the ball's squared radius.

    Parameters
    ----------
    domain : BoxDomain or L2BallDomain
        The declared record domain.

    Returns
    -------
    float
        ``s``, a power of two.
    """
    if isinstance(domain, BoxDomain):
        half = (domain.upper - domain.lower) / 2.0
        return augmented_scale(float(half @ half), domain.m)
    assert isinstance(domain, L2BallDomain)
    return augmented_scale(domain.radius**2, domain.m)


def grouped_gram(
    x: np.ndarray, index: np.ndarray, groups: int, into: np.ndarray | None = None
) -> np.ndarray:
    """The stacked augmented Gram matrices of a block's groups: ``(G, m + 1, m + 1)``, entry
    ``g`` ``[[X_g X_g^T, X_g 1], [1^T X_g^T, b_g]]`` of the records of group ``g`` (as
    :func:`augmented_gram`, each entry a sum of exact products).

    The block's kept records are gathered once, group after group in record order (a stable
    sort of the indices), so each group's records are one contiguous run of columns; its Gram
    product and its row sums (a sequential sum) read that run only, so a group's bytes are
    fixed by its own records.

    Parameters
    ----------
    x : ndarray
        ``m x b`` clipped records.
    index : ndarray
        Each record's group index (``-1``: dropped).
    groups : int
        ``G``.
    into : ndarray, optional
        A running ``(G, m + 1, m + 1)`` sum to add the block's matrices to, in place (each
        non-empty group's entries, the same additions as ``into + grouped_gram(x, ...)``).

    Returns
    -------
    ndarray
        ``(G, m + 1, m + 1)`` (``into``, when given).
    """
    m = x.shape[0]
    out = np.zeros((groups, m + 1, m + 1), dtype=np.float64) if into is None else into
    # int16 indices (G <= 10,000): numpy's stable sort is then a radix sort
    small = index.astype(np.int16 if groups < 2**15 else np.int64)
    order = np.argsort(small, kind="stable")
    starts = np.searchsorted(small[order], np.arange(groups + 1))
    kept = np.take(x, order[starts[0] :], axis=1)  # group after group, in record order
    starts -= starts[0]
    counts = np.diff(starts)
    filled = np.flatnonzero(counts)
    if filled.size == 0:
        return out
    sums = np.add.reduceat(kept, starts[filled], axis=1)  # one run per non-empty group
    for g in filled:
        run = kept[:, starts[g] : starts[g + 1]]
        out[g, :m, :m] += run @ run.T
    out[filled, :m, m] += sums.T
    out[filled, m, :m] += sums.T
    out[filled, m, m] += counts[filled]
    return out


def scale_constant(moment: np.ndarray, factor: float) -> np.ndarray:
    """A (stack of) augmented moment(s) with the constant coordinate multiplied by ``factor``:
    the last row and column times ``factor``, the corner times ``factor^2`` (exact for a power
    of two). ``scale_constant(M, s)`` turns the moment of ``[x - c; 1]`` into that of
    ``[x - c; s]``, ``scale_constant(M, 1 / s)`` back.

    Parameters
    ----------
    moment : ndarray
        ``(..., m + 1, m + 1)``.
    factor : float
        The factor.

    Returns
    -------
    ndarray
        A new array of the same shape.
    """
    out = np.array(moment, dtype=np.float64)
    if factor != 1.0:
        out[..., -1, :] *= factor
        out[..., :, -1] *= factor
    return out


def centered_from_moment(
    moment: np.ndarray, centre: np.ndarray | None = None, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """The mean and the covariance around it, from a (noisy) augmented second moment.

    Parameters
    ----------
    moment : ndarray
        ``(m + 1) x (m + 1)``: ``Z Z^T / N`` of ``z = [x - c; s]``, plus noise.
    centre : ndarray, optional
        ``c`` (``m``); none by default.
    scale : float, default 1
        ``s``.

    Returns
    -------
    mean : ndarray
        ``u + c``, ``u = M[:m, m] / s``, ``(m,)``.
    covariance : ndarray
        ``M[:m, :m] - u u^T`` (``numpy.cov(X, bias=True)`` without noise: the covariance does
        not depend on ``c`` or ``s``), symmetric when ``M`` is.
    """
    moment = scale_constant(moment, 1.0 / scale)
    m = moment.shape[0] - 1
    shifted = np.array(moment[:m, m], dtype=np.float64)
    covariance = np.asarray(moment[:m, :m] - np.outer(shifted, shifted))
    return (shifted if centre is None else shifted + centre), covariance


def grouped_centered_from_moment(
    moments: np.ndarray, centre: np.ndarray | None = None, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Every group's mean and covariance around it, from a grouped release's noisy moments.

    A group's moment ``M_g = Z_g Z_g^T / N`` (``z = [x - c; s]``, taken back to ``s = 1`` first
    by :func:`scale_constant`) divides by the global ``N``: its corner ``M_g[m, m]`` is the
    group's (noisy) share ``N_g / N``, so the mean about ``c`` is ``m_g = M_g[:m, m] /
    M_g[m, m]``, the mean ``m_g + c`` and the covariance ``M_g[:m, :m] / M_g[m, m] - m_g m_g^T``
    (``numpy.cov`` of the group's records, ``bias=True``, without noise). A group whose noisy
    corner is not positive (an empty or tiny group) gets NaN for both.

    Parameters
    ----------
    moments : ndarray
        ``G x (m + 1) x (m + 1)``.
    centre : ndarray, optional
        ``c`` (``m``); none by default.
    scale : float, default 1
        ``s``.

    Returns
    -------
    mean : ndarray
        ``G x m``.
    covariance : ndarray
        ``G x m x m``.
    """
    moments = scale_constant(moments, 1.0 / scale)
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
    """The augmented second moment ``Z Z^T / N`` of ``z = [x - c; s]``, published with the mean
    and the covariance around it (parameters of :class:`~mvg_dask.plan.MatrixQuery`, and the
    following; ``features`` counts the augmented terms, ``m + 1``).

    Parameters
    ----------
    centre : tuple of float, optional
        ``c``, public: the centre of a declared box (the plan's choice, docs/bounds.md
        Sec. 14: the shifted box's ``R = sup ||x - c||^2`` is about a quarter of the unshifted
        one on ``[0, 1]^m``); ``None`` (an L2 ball, centred at 0): no shift.
    scale : float, default 1
        ``s``, public: the constant coordinate, a power of two ``2^k``, ``|k| <= 64`` (the
        plan's choice, :func:`mvg_dask.privacy.sensitivity.augmented_scale`).
    """

    kind: ClassVar[str] = "centered-covariance"
    augmented: ClassVar[bool] = True
    blocked_output: ClassVar[bool] = False
    second_moment: ClassVar[bool] = False
    noisy_variable: ClassVar[str | None] = "moment"

    centre: tuple[float, ...] | None = None
    scale: float = 1.0

    def trace_bound(self, domain: RecordDomain) -> float | None:
        """None: the released moment is not ``X Xᵀ / N`` (its trace is not the domain's bound)."""
        return None

    def _check_fields(self) -> None:
        if self.features < 2:
            raise ValueError("a moment query needs at least one feature besides the constant")
        mantissa, exponent = math.frexp(self.scale) if math.isfinite(self.scale) else (0.0, 0)
        if mantissa != 0.5 or not -63 <= exponent <= 65:
            raise ValueError(
                f"a moment query's constant scale must be a power of two 2^k, |k| <= 64, got "
                f"{self.scale!r}"
            )
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
        return augmented_domain(domain, self.centre_vector, self.scale)

    def partial(self, block: np.ndarray) -> np.ndarray:
        """``Z_b Z_b^T`` of the augmented block (:func:`augmented_gram`, as the engine forms
        it)."""
        return augmented_gram(np.asarray(block, dtype=np.float64), self.centre_vector, self.scale)

    def gram_pass(self) -> MatrixQuery:
        """The Gram pass sums ``[x - c; 1]``: the engine's clipper forms ``fl(x - c)`` in the
        block's own buffer, so the pass's partial is this query's without its centre, and its
        scale ``s`` (a power of two: exactly the same values) is applied once to the total by
        the ``moment`` stage."""
        return replace(self, centre=None, scale=1.0)

    def grouped_partial(
        self, block: np.ndarray, index: np.ndarray, into: np.ndarray | None = None
    ) -> np.ndarray:
        """A grouped release's partial: every group's augmented Gram matrix of the block
        (:func:`grouped_gram`; ``index`` each record's group, ``-1`` dropped), added into the
        running sum ``into`` when given."""
        return grouped_gram(block, index, self.group_count, into=into)

    def release_stages(
        self, *, noisy_count: bool, dp_pca: bool, panels: bool, lattice: bool
    ) -> tuple[str, ...]:
        """``gram, [dp-pca,] moment`` (the mean-first route's stages are the plan's)."""
        return self.gram_stages(st.MOMENT, noisy_count=noisy_count, dp_pca=dp_pca)

    @classmethod
    def check_matrix_chunk(cls, chunk: int | None, features: int) -> None:
        """Refuse a ``matrix_chunk`` that would block the ``(m + 1) x (m + 1)`` moment."""
        if chunk is not None and chunk <= features:
            raise ValueError(
                f"output.matrix_chunk: a {cls.kind} release is assembled whole on the client "
                f"({features + 1} x {features + 1}); remove matrix_chunk"
            )

    @classmethod
    def planned_fields(cls, domain: RecordDomain, features: int) -> dict[str, Any]:
        """The constant term (``features = M + 1``), the scale ``s`` (:func:`moment_scale`) and,
        for a box, its centre ``c`` (docs/bounds.md Sec. 14)."""
        fields: dict[str, Any] = {"features": features + 1, "scale": moment_scale(domain)}
        if isinstance(domain, BoxDomain):
            fields["centre"] = tuple(float(c) for c in (domain.lower + domain.upper) / 2)
        return fields

    def dry_run_text(self, rplan: Any) -> str:
        """The moment of ``z = [x - c; s]`` (or the mean-first route's two steps), its
        regression target and its groups."""
        m = rplan.input.features
        n = "N" if rplan.neighbours == "add-remove" else str(rplan.input.records)
        if rplan.mean_first is not None:
            return (
                f"centered covariance by the mean first: the mean of the records about the box's "
                f"centre plus Gaussian noise, then sum (x - centre)(x - centre)^T / N ({m} x {m}) "
                f"about the released mean clamped into the box, N = {n} (public under replace-one)"
            )
        about = "c = the box's centre" if self.centre is not None else "c = 0 (an l2 ball)"
        moment = (
            f"second moment Z Z^T / N of z = [x - c; s] ({m + 1} x {m + 1}), {about}, "
            f"s = {self.scale:g}, N = {n} (public under replace-one); "
            "mean and covariance around it computed from it"
        )
        target = getattr(self, "target_label", None)
        moment = moment if target is None else f"regression on {target!r}: {moment}"
        return moment + self._groups_text()

    def _groups_text(self) -> str:
        """A grouped release's groups, from the spec alone (their count and variable, a few
        labels): empty for an ungrouped release."""
        if self.groups is None:
            return ""
        shown = ", ".join(map(repr, self.groups[:5])) + (", ..." if len(self.groups) > 5 else "")
        return (
            f"; one release per group of {self.group_variable!r}: {len(self.groups)} declared "
            f"groups ({shown}), M_g = Z_g Z_g^T / N, undeclared labels dropped; one release's "
            "budget"
        )

    def _extra_dict(self) -> dict[str, object]:
        out: dict[str, object] = {} if self.centre is None else {"centre": list(self.centre)}
        if self.scale != 1.0:
            out["scale"] = self.scale
        return out

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """:meth:`~mvg_dask.plan.MatrixQuery.fields_from_dict` with the centre."""
        centre = data.get("centre")
        return {
            **super().fields_from_dict(data),
            "centre": None if centre is None else tuple(float(v) for v in centre),
            "scale": float(data.get("scale", 1.0)),
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
