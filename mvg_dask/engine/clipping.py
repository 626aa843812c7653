"""The record domain on a worker: a block of records checked against the declared domain, its NaN
filled with the declared public value, and its values clipped into the domain (or refused)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mvg_dask.errors import DataError


@dataclass(frozen=True, eq=False)
class Clipper:
    """Checks a block against the declared record domain and clips (or rejects) violations.

    Attributes
    ----------
    kind : {"box", "l2"}
        Domain kind.
    lower, upper : ndarray or None
        Box bounds (column vectors, shape ``(M, 1)``).
    radius : float or None
        L2-ball radius.
    on_violation : {"clip", "error"}
        What to do with values outside the domain.
    augment : bool
        The records are summed augmented, ``[x - c; 1]`` (a moment query):
        :func:`~mvg_dask.engine.tasks.gram.gram_task` forms their Gram matrix
        (:func:`mvg_dask.plan.queries.moment.augmented_gram`).
    centre : ndarray or None
        ``c`` of a moment query (``None``: no shift).
    box_field : str
        The spec field(s) that declare the box, for the error message.
    fill : ndarray or None
        The declared public value each NaN becomes before the domain check (a column vector,
        shape ``(M, 1)``; ``domain.missing: {fill: ...}``), or ``None``: a NaN is an error
        (``missing: error``). Infinite values are an error either way.
    """

    kind: str
    lower: np.ndarray | None
    upper: np.ndarray | None
    radius: float | None
    on_violation: str
    augment: bool = False
    centre: np.ndarray | None = None
    box_field: str = "domain.box"
    fill: np.ndarray | None = None

    def __call__(self, block: np.ndarray, start: int) -> tuple[np.ndarray, int]:
        """Return the block inside the domain (float64) and the number of values (box) or
        records (L2 ball) the transformation changed: filled (a NaN replaced by
        :attr:`fill`) or clipped, each counted once.

        The record transformation is: each NaN becomes its feature's fill, then the record is
        checked against the domain and clipped into it (or refused, ``on_violation: error``).
        Each value (box) or record (L2 ball) is transformed alone, so a block's values do not
        depend on how the records are cut into blocks. Clean data costs no extra pass: NaN
        show up in the per-feature extremes (box) or the norms (L2 ball) computed anyway.

        Parameters
        ----------
        block : ndarray
            ``M x b`` (features x records).
        start : int
            Index of the block's first record (for messages).

        Returns
        -------
        tuple
            ``(block, changed)``: changed counts values (box) or records (L2 ball) that were
            filled or clipped (a curator-side count, never published).

        Raises
        ------
        DataError
            For an infinite value, a NaN without a fill, or (``on_violation: error``) a
            value outside the domain.
        """
        x = np.asarray(block, dtype=np.float64)
        stop = start + x.shape[1]
        if self.kind == "box":
            assert self.lower is not None and self.upper is not None
            lo_seen = x.min(axis=1, keepdims=True)
            hi_seen = x.max(axis=1, keepdims=True)
            nan: np.ndarray | None = None
            if not (np.all(np.isfinite(lo_seen)) and np.all(np.isfinite(hi_seen))):
                x, nan = self._filled(x, start, stop)
                lo_seen = x.min(axis=1, keepdims=True)
                hi_seen = x.max(axis=1, keepdims=True)
            filled = 0 if nan is None else int(np.count_nonzero(nan))
            if np.all(lo_seen >= self.lower) and np.all(hi_seen <= self.upper):
                return x, filled
            # a NaN compares false: the values outside are those of the data, a filled value
            # outside the box is counted once, as filled
            outside = (x < self.lower) | (x > self.upper)
            if nan is not None:
                outside &= ~nan
            count = int(np.count_nonzero(outside))
            if self.on_violation == "error" and count:
                raise DataError(
                    f"{count} values of records {start}..{stop - 1} lie outside the declared "
                    f"domain box; fix the data, widen {self.box_field}, or set "
                    "domain.on_violation: clip"
                )
            return np.clip(x, self.lower, self.upper), count + filled
        assert self.radius is not None
        norms = np.sqrt(np.einsum("ij,ij->j", x, x))
        changed = np.zeros(x.shape[1], dtype=bool)
        if not np.all(np.isfinite(norms)):
            x, nan = self._filled(x, start, stop)
            changed = np.any(nan, axis=0)
            norms = np.sqrt(np.einsum("ij,ij->j", x, x))
        over = norms > self.radius
        if not over.any():
            return x, int(np.count_nonzero(changed))
        if self.on_violation == "error":
            raise DataError(
                f"{int(np.count_nonzero(over))} records in {start}..{stop - 1} have an L2 norm "
                "above the declared domain.l2_norm; fix the data, raise l2_norm, or set "
                "domain.on_violation: clip"
            )
        scale = np.where(over, self.radius / np.where(over, norms, 1.0), 1.0)
        return x * scale[None, :], int(np.count_nonzero(over | changed))

    def _filled(self, x: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``x`` with each NaN replaced by its feature's fill (a fresh array) and where the NaN
        were; a NaN without a fill, or an infinite value, is the data's error."""
        if self.fill is None:
            raise _nonfinite(start, stop)
        nan = np.isnan(x)
        if np.count_nonzero(nan) != np.count_nonzero(~np.isfinite(x)):
            raise _nonfinite(start, stop, infinite_only=True)
        return np.where(nan, self.fill, x), nan


def _nonfinite(start: int, stop: int, *, infinite_only: bool = False) -> DataError:
    if infinite_only:
        return DataError(
            f"the input has infinite values in records {start}..{stop - 1}; remove or replace "
            "them before a release (domain.missing fills NaN only; a record domain cannot "
            "bound an infinite value)"
        )
    return DataError(
        f"the input has NaN or infinite values in records {start}..{stop - 1}; remove or impute "
        "them before a release, or fill NaN with a public value (domain.missing: {fill: v}; a "
        "record domain cannot bound them)"
    )
