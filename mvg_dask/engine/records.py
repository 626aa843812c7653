"""Record reading on a worker: the input's variables (and a grouped release's labels) read by record
ranges, and the canonical record blocks that the Gram and panel tasks sum."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask.engine.zarr_io.chunks import layout, read_rows, write_rows
from mvg_dask.errors import ReleaseError
from mvg_dask.plan.input_metadata import PANEL_RECORDS

if TYPE_CHECKING:
    from mvg_dask.engine.clipping import Clipper


@dataclass(frozen=True)
class ZarrMatrix:
    """A 2-D Zarr array seen as ``features x records``, read and written by record ranges.

    Attributes
    ----------
    store : str
        Store path or URL.
    path : str
        Array path inside the store (the variable name).
    records_first : bool
        True when the stored array is ``records x features``.
    storage_options : dict or None
        fsspec options.
    """

    store: str
    path: str
    records_first: bool
    storage_options: dict[str, Any] | None = None

    def _open(self, mode: str) -> Any:
        import zarr

        return zarr.open_array(
            store=self.store, path=self.path, mode=mode, storage_options=self.storage_options
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        """Records ``[start, stop)`` as an ``M x b`` array; a failed read is a ReleaseError."""
        try:
            lay = layout(self.store, self.path, self.storage_options)
            if lay is not None:  # whole stored chunks of a local array: decoded directly
                direct = read_rows(lay, 0 if self.records_first else 1, start, stop)
                if direct is not None:
                    return direct.T if self.records_first else direct
            arr = self._open("r")
            if self.records_first:
                return np.asarray(arr[start:stop, :]).T
            return np.asarray(arr[:, start:stop])
        except Exception as exc:
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise ReleaseError(
                f"input chunk with records {start}..{stop - 1} of {self.store}/{self.path} "
                f"cannot be read ({type(exc).__name__}: {detail}); restore the input store"
            ) from None

    def write(self, start: int, stop: int, values: np.ndarray) -> None:
        """Write records ``[start, stop)`` from an ``M x b`` array (whole chunks only)."""
        lay = layout(self.store, self.path, self.storage_options)
        stored = values.T if self.records_first else values
        if lay is not None and write_rows(lay, 0 if self.records_first else 1, start, stop, stored):
            return  # one whole uncompressed chunk of a local array, written directly
        arr = self._open("r+")
        if self.records_first:
            arr[start:stop, :] = values.T
        else:
            arr[:, start:stop] = values


@dataclass(frozen=True)
class StackedMatrix:
    """Two variables of one store along the same record dimension, read by record ranges as
    one ``(M + M_Y) x b`` block ``[X_b; Y_b]`` (a two-variable cross-covariance's Gram pass;
    docs/concepts/queries.md, "Cross-covariance").

    Attributes
    ----------
    first, second : ZarrMatrix
        ``X`` (the input variable) and ``Y``.
    """

    first: ZarrMatrix
    second: ZarrMatrix

    def read(self, start: int, stop: int) -> np.ndarray:
        """Records ``[start, stop)`` of both variables, stacked (a fresh float64 buffer)."""
        x, y = self.first.read(start, stop), self.second.read(start, stop)
        out = np.empty((x.shape[0] + y.shape[0], x.shape[1]), dtype=np.float64)
        out[: x.shape[0]] = x
        out[x.shape[0] :] = y
        return out


@dataclass(frozen=True)
class ZarrLabels:
    """The group variable of a grouped release (a 1-D Zarr array along the record dimension,
    in the input's store), read by record ranges as group indices (docs/concepts/queries.md,
    "Grouped releases").

    Attributes
    ----------
    store : str
        Store path or URL (the input's).
    path : str
        The group variable.
    groups : tuple of (str or int)
        The declared labels: a record's index is its label's position here, ``-1`` for a
        label that is not declared (the record is dropped).
    storage_options : dict or None
        fsspec options.
    """

    store: str
    path: str
    groups: tuple[str | int, ...]
    storage_options: dict[str, Any] | None = None

    def read(self, start: int, stop: int) -> np.ndarray:
        """The group index of records ``[start, stop)`` (int64; ``-1``: undeclared)."""
        import zarr

        try:
            arr = zarr.open_array(
                store=self.store, path=self.path, mode="r", storage_options=self.storage_options
            )
            raw = np.asarray(arr[start:stop])
        except Exception as exc:
            detail = str(exc).splitlines()[0] if str(exc) else ""
            raise ReleaseError(
                f"group labels of records {start}..{stop - 1} of {self.store}/{self.path} "
                f"cannot be read ({type(exc).__name__}: {detail}); restore the input store"
            ) from None
        return group_indices(raw, self.groups)


def group_indices(raw: np.ndarray, groups: tuple[str | int, ...]) -> np.ndarray:
    """Each label's position among the declared ``groups`` (``-1`` where it is not one).

    Parameters
    ----------
    raw : ndarray
        Labels (integers, or strings of any numpy form).
    groups : tuple of (str or int)
        The declared labels (all integers or all strings).

    Returns
    -------
    ndarray
        int64 indices, ``raw``'s length.
    """
    if isinstance(groups[0], int):
        declared = np.asarray(groups, dtype=np.int64)
        values = np.asarray(raw).astype(np.int64, copy=False)
        lo, span = int(declared.min()), int(declared.max() - declared.min())
        if span < 2**20:  # a lookup table over the declared labels' range
            table = np.full(span + 1, -1, dtype=np.int64)
            table[declared - lo] = np.arange(len(groups))
            shifted = values - lo
            inside = (shifted >= 0) & (shifted <= span)
            return np.where(inside, table[np.where(inside, shifted, 0)], -1)
    else:  # numpy's variable-width strings (Zarr v3 strings) compared as they are
        values = np.asarray(raw)
        if values.dtype.kind != "T":
            values = values.astype(object).astype(str)
        declared = np.asarray(groups, dtype=values.dtype if values.dtype.kind == "T" else str)
    order = np.argsort(declared, kind="stable")
    ranked = declared[order]
    pos = np.minimum(np.searchsorted(ranked, values), len(ranked) - 1)
    return np.where(ranked[pos] == values, order[pos], -1).astype(np.int64)


def canonical_blocks(
    source: ZarrMatrix | StackedMatrix,
    clipper: Clipper,
    start: int,
    stop: int,
    step: int,
    block: int,
) -> Iterator[tuple[int, np.ndarray, int]]:
    """Records ``[start, stop)`` (``start`` a multiple of ``block``), clipped, as canonical
    blocks: ``(a, x, clipped)`` per block ``[a, min(a + block, stop))``, ``x`` a C-contiguous
    ``m x b`` float64 array, so each block's product is computed in one memory layout whatever
    the stored chunk grid and layout (docs/bounds.md Sec. 11); ``clipped`` counts the clipped
    values of the pieces read since the previous block.

    The range is read in pieces cut at the stored chunk boundaries (multiples of ``step``), each
    decoded once per task and checked and clipped as it is read (clipping acts on each value or
    record alone, so the values do not depend on the pieces; a data error names the stored
    chunk's records). A piece that is exactly a C-contiguous block is used as it is, the others
    are copied into a block buffer. A yielded block is valid until the next one is asked for
    (the buffer is reused).
    """
    spare: np.ndarray | None = None
    out: np.ndarray | None = None
    clipped = 0
    p = start
    while p < stop:
        q = min((p // step + 1) * step, stop)
        x, c = clipper(source.read(p, q), p)
        clipped += c
        i = p
        while i < q:
            lo = i - (i - start) % block
            hi = min(lo + block, stop)
            j = min(hi, q)
            if (p, q) == (lo, hi) and x.flags.c_contiguous:
                yield lo, x, clipped
                clipped, i = 0, j
                continue
            if out is None:
                reuse = spare is not None and spare.shape[1] == hi - lo
                fresh = None if reuse else np.empty((x.shape[0], hi - lo), dtype=np.float64)
                out = spare if fresh is None else fresh
            assert out is not None
            out[:, i - lo : j - lo] = x[:, i - p : j - p]
            if j == hi:
                yield lo, out, clipped
                spare, out, clipped = out, None, 0  # consumed: the next block reuses the buffer
            i = j
        p = q


@dataclass(frozen=True)
class PanelReads:
    """How a panel task streams the records: all ``records`` of them, read one stored chunk
    (``step`` records) at a time, and summed in canonical groups of ``PANEL_RECORDS`` records
    (:func:`canonical_blocks`). The groups, and so the panel's bytes and its summation depth
    (:func:`mvg_dask.plan.lattice.panel_depth`), depend on the record count only, never on the
    stored chunk grid or layout.

    Attributes
    ----------
    records : int
        ``N``.
    step : int
        Records per stored chunk.
    """

    records: int
    step: int

    def groups(
        self, source: ZarrMatrix | StackedMatrix, clipper: Clipper
    ) -> Iterator[tuple[int, np.ndarray, int]]:
        """``(start, x, clipped)`` per canonical group (``x`` valid until the next one)."""
        return canonical_blocks(source, clipper, 0, self.records, self.step, PANEL_RECORDS)
