"""What a release knows about its input before reading a chunk (:class:`InputMetadata`, from the
input's metadata only), the task grids that follow from it, and the public constants that size
the engine's passes (tasks, canonical record blocks, panels, the reduction tree).

All of it is a function of public metadata (shape, chunking, feature count), never of the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Covariances with more features than this are computed blockwise by default ...
WIDE_FEATURES = 8192
#: ... in panels of this many features (a multiple of the noise grid's block).
WIDE_BLOCK = 2048
#: A Gram task holds at least this many records per feature (see ``canonical_ranges``).
GRAM_RECORDS_PER_FEATURE = 8
#: A task of a pass over the records holds at least this many elements (runs of whole chunks):
#: a Dask task has a fixed scheduling cost whatever its size, which with one 8 MiB chunk per
#: task dominated a release on two workers (see ``task_ranges``) ...
TASK_ELEMENTS = 2**22
#: ... while keeping at least this many tasks where there are that many chunks.
GRAM_MIN_TASKS = 8
#: The fan-in of the Gram pass's reduction tree: it sums its task partials in fixed groups of
#: this many consecutive nodes, level by level.
TREE_FAN_IN = 8
#: A panel task reads at least this many records at a time (wide inputs have short chunks,
#: and the panel product is a matrix product over the records read).
PANEL_RECORDS = 256
#: Every Gram pass sums canonical record blocks (see ``canonical_block``) of at most this many
#: elements: its bytes and float-error depth never depend on the input's chunk grid ...
CANONICAL_BLOCK_ELEMENTS = 2**20
#: ... and at most this many records: a block's inner products are the longest sums of the
#: pass, so the block length sets the float-error depth of a lattice release (at a declared
#: ``max_records = 2^32``, 4 features: an inflation of 0.8 % of the sensitivity at 2^13
#: records, 25 % at the 2^18 records the element cap alone would give).
CANONICAL_BLOCK_RECORDS = 2**13
#: The public bound on the record count of an add-remove lattice covariance, by default.
DEFAULT_MAX_RECORDS = 2**32


def chunk_runs(records: int, chunk: int, want: int) -> list[tuple[int, int]]:
    """A task grid over ``records`` stored in chunks of ``chunk``: runs of ``want`` whole chunks,
    fewer where that keeps ``GRAM_MIN_TASKS`` tasks.

    Parameters
    ----------
    records, chunk : int
        Records and records per stored chunk.
    want : int
        Chunks per task wanted.

    Returns
    -------
    list of tuple
        ``[start, stop)`` per task, covering every record once, in order.
    """
    spread = max(1, -(-records // chunk) // GRAM_MIN_TASKS)  # chunks per task for busy workers
    step = max(1, min(want, spread)) * chunk
    return [(a, min(a + step, records)) for a in range(0, records, step)]


@dataclass(frozen=True, kw_only=True)
class InputMetadata:
    """What a release knows about its input, from metadata only (no chunk is read).

    Attributes
    ----------
    store, variable : str
        Zarr store (path or URL) and variable name.
    record_dim, feature_dim : str
        Dimension names.
    dims : tuple of str
        The stored order of the two dims.
    shape : tuple of int
        The stored shape.
    dtype : str
        Stored dtype.
    record_chunk : int
        Records per stored chunk (the release's task size).
    feature_names : tuple or None
        Values of the feature coordinate, when the store has one.
    storage_options : dict or None
        fsspec options (never serialised: they may hold credentials).
    cols_input : InputMetadata or None
        The second variable ``Y`` of a two-variable cross-covariance (same store, same record
        dimension and count): the Gram pass stacks its records under the input's,
        ``[X_b; Y_b]`` (docs/concepts/queries.md, "Cross-covariance"); ``None``: one variable.
    """

    store: str
    variable: str
    record_dim: str
    feature_dim: str
    dims: tuple[str, str]
    shape: tuple[int, int]
    dtype: str
    record_chunk: int
    feature_names: tuple[Any, ...] | None = None
    storage_options: dict[str, Any] | None = field(default=None, compare=False)
    cols_input: InputMetadata | None = None

    @property
    def stacked_features(self) -> int:
        """The features of the Gram pass's record: ``M``, or ``M + M_Y`` with a second
        variable."""
        return self.features + (0 if self.cols_input is None else self.cols_input.features)

    @property
    def records_first(self) -> bool:
        """True when the stored array is ``records x features``."""
        return self.dims[0] == self.record_dim

    @property
    def features(self) -> int:
        """``M``."""
        return self.shape[self.dims.index(self.feature_dim)]

    @property
    def records(self) -> int:
        """``N``."""
        return self.shape[self.dims.index(self.record_dim)]

    @property
    def nbytes(self) -> int:
        """The stored array's size in bytes (uncompressed; with ``cols_input``'s)."""
        own = self.shape[0] * self.shape[1] * np.dtype(self.dtype).itemsize
        return own + (0 if self.cols_input is None else self.cols_input.nbytes)

    def record_ranges(self) -> list[tuple[int, int]]:
        """One ``[start, stop)`` record range per stored chunk: the release's task grid."""
        c, n = self.record_chunk, self.records
        return [(a, min(a + c, n)) for a in range(0, n, c)]

    def _runs(self, want: int) -> list[tuple[int, int]]:
        return chunk_runs(self.records, self.record_chunk, want)

    def task_ranges(self) -> list[tuple[int, int]]:
        """The identity pass's task grid: runs of whole chunks of at least ``TASK_ELEMENTS``
        elements (each chunk is still read, written and marked done on its own).

        Metadata only: the noise of a record never depends on it (it comes from the tile grid).
        """
        return self._runs(-(-TASK_ELEMENTS // (self.features * self.record_chunk)))

    def canonical_block(self) -> int:
        """Records per canonical block of the Gram pass: the largest power of two ``B`` with
        ``B m <= CANONICAL_BLOCK_ELEMENTS`` (``m`` the stacked features) and
        ``B <= CANONICAL_BLOCK_RECORDS``, at least 1. A function of the public feature count
        only."""
        per = min(
            CANONICAL_BLOCK_RECORDS, max(1, CANONICAL_BLOCK_ELEMENTS // self.stacked_features)
        )
        return 1 << (per.bit_length() - 1)

    def canonical_blocks_per_task(self) -> int:
        """The canonical blocks per Gram task wanted (it takes fewer to keep ``GRAM_MIN_TASKS``
        tasks): a partial Gram matrix costs ``M^2`` to allocate, move and add whatever its
        record count, against ``M^2 b`` to compute, so a task holds at least
        ``GRAM_RECORDS_PER_FEATURE * M`` records and ``TASK_ELEMENTS`` elements. A function of
        the feature count only."""
        b, m = self.canonical_block(), self.stacked_features
        return max(-(-GRAM_RECORDS_PER_FEATURE * m // b), -(-TASK_ELEMENTS // (m * b)))

    def canonical_ranges(self) -> list[tuple[int, int]]:
        """The Gram pass's task grid: runs of whole canonical
        blocks (:meth:`canonical_block`), a function of the record and feature counts only, never
        of the stored chunk grid or layout (docs/bounds.md Sec. 11)."""
        return chunk_runs(self.records, self.canonical_block(), self.canonical_blocks_per_task())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without storage options; ``cols_input`` only when there is one)."""
        out = {
            "store": self.store,
            "variable": self.variable,
            "record_dim": self.record_dim,
            "feature_dim": self.feature_dim,
            "dims": list(self.dims),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "features": self.features,
            "records": self.records,
            "records_first": self.records_first,
            "record_chunk": self.record_chunk,
            "feature_names": None if self.feature_names is None else list(self.feature_names),
        }
        if self.cols_input is not None:
            out["cols_input"] = self.cols_input.to_dict()
        return out

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], storage_options: dict[str, Any] | None = None
    ) -> InputMetadata:
        """Inverse of :meth:`to_dict`."""
        names = data.get("feature_names")
        second = data.get("cols_input")
        return cls(
            store=data["store"],
            variable=data["variable"],
            record_dim=data["record_dim"],
            feature_dim=data["feature_dim"],
            dims=(data["dims"][0], data["dims"][1]),
            shape=(int(data["shape"][0]), int(data["shape"][1])),
            dtype=data["dtype"],
            record_chunk=int(data["record_chunk"]),
            feature_names=None if names is None else tuple(names),
            storage_options=storage_options,
            cols_input=None if second is None else cls.from_dict(second, storage_options),
        )
