"""Block functions: what one Dask task does to one chunk of records.

They are plain numpy (plus zarr for the region write) so they run on any worker, are easy to
test, and keep the graph small: one task per chunk reads, checks, clips, adds noise and writes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed.protocol import dask_deserialize, dask_serialize, deserialize, serialize

from mvg_dask.engine.zarr_io.chunks import layout, read_rows, write_rows
from mvg_dask.errors import DataError, MvgDaskError, ReleaseError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import record_noise
from mvg_dask.plan.covariance import CovarianceKind, NoiseCovariance, covariance_of
from mvg_dask.plan.queries.moment import augmented_gram
from mvg_dask.plan.release_plan import PANEL_RECORDS
from mvg_dask.release_format import ProgressLog

if TYPE_CHECKING:
    from mvg_dask.engine.lattice import LowRankSquareLattice, RecordLattice, StandardSquareLattice


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
        The records are summed augmented, ``[x - c; 1]`` (a moment query): :func:`gram_task`
        forms their Gram matrix (:func:`mvg_dask.plan.queries.moment.augmented_gram`).
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


def grouped_gram(
    x: np.ndarray, index: np.ndarray, groups: int, into: np.ndarray | None = None
) -> np.ndarray:
    """The stacked augmented Gram matrices of a block's groups: ``(G, m + 1, m + 1)``, entry
    ``g`` ``[[X_g X_g^T, X_g 1], [1^T X_g^T, b_g]]`` of the records of group ``g`` (as
    :func:`~mvg_dask.plan.queries.moment.augmented_gram`, each entry a sum of exact products).

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


def progress_marker(write_store: str, start: int) -> str:
    """Path of the marker that says the chunk starting at ``start`` is written."""
    return ProgressLog(write_store).chunk_marker(start)


def abort_marker(write_store: str) -> str:
    """Path of the marker that tells the remaining tasks of a failed release to do nothing."""
    return ProgressLog(write_store).abort_marker


@dataclass(frozen=True)
class Outcome:
    """What a task returns: its value, or the expected error it met.

    Tasks return expected failures (bad data, an unreadable chunk) as values instead of raising
    them, so that a worker never logs a traceback for a data problem; the client raises the
    error once, as a one-line message.
    """

    value: Any = None
    error: str | None = None
    error_type: str = "DataError"
    skipped: bool = False

    def unwrap(self) -> Any:
        """The value, or raise the task's error."""
        if self.error is not None:
            raise (ReleaseError if self.error_type == "ReleaseError" else DataError)(self.error)
        return self.value

    @classmethod
    def failure(cls, exc: MvgDaskError) -> Outcome:
        """The outcome of a task that met an expected error."""
        return cls(error=str(exc), error_type=type(exc).__name__)


@dask_serialize.register(Outcome)
def _serialize_outcome(outcome: Outcome) -> tuple[dict[str, Any], list[Any]]:
    """Dask's serializer for an :class:`Outcome`: its value through dask's own serializers, so
    an ``M x M`` partial Gram matrix travels as raw array frames. Pickled whole, the array was a
    two-dimensional pickle buffer that the receiver copies, several times slower to fetch to
    the client."""
    header, frames = serialize(outcome.value, on_error="raise")
    fields = {"error": outcome.error, "error_type": outcome.error_type, "skipped": outcome.skipped}
    return {"value": header, **fields}, frames


@dask_deserialize.register(Outcome)
def _deserialize_outcome(header: dict[str, Any], frames: list[Any]) -> Outcome:
    """Inverse of :func:`_serialize_outcome`."""
    return Outcome(
        deserialize(header["value"], frames),
        error=header["error"],
        error_type=header["error_type"],
        skipped=header["skipped"],
    )


def identity_task(
    start: int,
    stop: int,
    *,
    source: ZarrMatrix,
    sink: ZarrMatrix,
    clipper: Clipper,
    noise_key: NoiseKey,
    factor: np.ndarray,
    tile: int,
    n_total: int,
    diagonal: bool,
    step: int | None = None,
    lattice: RecordLattice | None = None,
) -> Outcome:
    """One task of the identity release: for each stored chunk of ``[start, stop)`` (``step``
    records each) read, check, clip, add MVG noise, write and mark it done. With ``lattice``
    the chunk is privatized on the lattice (:meth:`RecordLattice.release`) instead of having
    float noise added.

    A chunk whose marker exists (written by an earlier, interrupted run of the same release) is
    skipped: its bytes are already in place, identical to what this run would write. Once the
    release has failed (its abort marker exists) the task does nothing more.

    Returns
    -------
    Outcome
        ``[clipped_count, records]`` (int64) for the client's bookkeeping, or the error.
    """
    import json

    import fsspec

    fs, abort_path = fsspec.core.url_to_fs(abort_marker(sink.store), **(sink.storage_options or {}))
    step = stop - start if step is None else step
    total = np.zeros(2, dtype=np.int64)
    for a in range(start, stop, step):
        b = min(a + step, stop)
        _, marker = fsspec.core.url_to_fs(
            progress_marker(sink.store, a), **(sink.storage_options or {})
        )
        done = _read_marker(fs, marker)
        if done is not None:
            total += [done["clipped"], done["records"]]
            continue
        if fs.exists(abort_path):
            return Outcome(skipped=True)
        try:
            x, clipped = clipper(source.read(a, b), a)
        except MvgDaskError as exc:
            return Outcome.failure(exc)
        if lattice is not None:
            y = lattice.release(x, noise_key, a, b, tile=tile, n_total=n_total)
        else:
            y = record_noise(noise_key, factor, a, b, tile=tile, n_total=n_total, diagonal=diagonal)
            y += x
        sink.write(a, b, y)
        _write_marker(fs, marker, json.dumps({"clipped": clipped, "records": b - a}).encode())
        total += [clipped, b - a]
    return Outcome(total)


def _read_marker(fs: Any, path: str) -> dict[str, int] | None:
    """A chunk's completion marker, or ``None`` when there is none or it is unreadable (a worker
    killed while writing it): the chunk is then written again, with the same bytes."""
    import json

    try:
        done = json.loads(fs.cat_file(path))
        return {"clipped": int(done["clipped"]), "records": int(done["records"])}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _write_marker(fs: Any, path: str, payload: bytes) -> None:
    """Write a marker whole: on a local filesystem to a temporary name renamed into place (a
    worker killed mid-write leaves no truncated marker); an object store's PUT is whole."""
    import os

    if "file" in fs.protocol or "local" in fs.protocol:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
        return
    fs.pipe_file(path, payload)


def gram_task(
    start: int,
    stop: int,
    *,
    source: ZarrMatrix | StackedMatrix,
    clipper: Clipper,
    block: int,
    step: int | None = None,
    labels: ZarrLabels | None = None,
) -> Outcome:
    """Partial Gram matrix ``X_i X_i^T`` of the clipped records ``[start, stop)``.

    The range is read ``step`` records (one stored chunk; the whole range by default) at a time,
    and the products of its canonical record blocks of ``block`` records
    (:func:`canonical_blocks`) are added in record order, so a task over many chunks holds one
    chunk, one block and one ``M x M`` accumulator, never the whole range, and the products are
    the same whatever the chunk grid. With ``labels`` (a grouped release) the partial is the
    stack of the groups' augmented Gram matrices (:func:`grouped_gram`), and the records whose
    label is not declared are dropped and counted with the clipped values (curator side).
    With a :class:`StackedMatrix` source (a two-variable cross-covariance) each chunk is the
    stacked ``[X_b; Y_b]``, checked and clipped against the stacked box.
    """
    step = stop - start if step is None else step
    total: np.ndarray | None = None
    clipped = 0
    try:  # the task's group labels, read at once (one small 1-D read per task)
        indices = None if labels is None else labels.read(start, stop)
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    pieces = canonical_blocks(source, clipper, start, stop, step, block)
    try:
        for a, x, c in pieces:
            b = a + x.shape[1]
            if clipper.centre is not None:  # fl(x - c), in the block's own fresh buffer
                x = _shifted(x, clipper.centre)
            if indices is not None:  # added into the task's running sum, group by group
                assert labels is not None
                index = indices[a - start : b - start]
                total = grouped_gram(x, index, len(labels.groups), into=total)
                clipped += c + int(np.count_nonzero(index < 0))
                continue
            part = augmented_gram(x) if clipper.augment else x @ x.T
            if total is None:
                total = part
            else:
                total += part
            clipped += c
        if total is None:  # no record (an empty input): the sum over no record, zeros
            x = np.asarray(source.read(start, start), dtype=np.float64)  # m x 0
            if labels is not None:
                total = grouped_gram(x, np.empty(0, dtype=np.int64), len(labels.groups))
            else:
                total = augmented_gram(x) if clipper.augment else x @ x.T
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    return Outcome((total, clipped))


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


def _shifted(x: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``fl(x - c)`` of a clipped block (the values of
    :func:`~mvg_dask.plan.queries.moment.augmented_gram`'s shift), formed in place: the block is
    a fresh buffer of this task (a decoded chunk or its clipped copy), and a second ``m x b``
    array per chunk costs its page faults."""
    c = centre.reshape(-1, 1)
    if x.flags.writeable:
        return np.subtract(x, c, out=x)
    return x - c


def combine_grams(parts: list[Outcome]) -> Outcome:
    """Combine partial Gram matrices in the order given (the tree reduction's combine step);
    the first failure, in record order, wins."""
    for p in parts:
        if p.error is not None:
            return p
    total = parts[0].value[0].copy()
    count = parts[0].value[1]
    for p in parts[1:]:
        g, c = p.value
        total += g
        count += c
    return Outcome((total, count))


def add_grams(acc: Outcome, part: Outcome) -> Outcome:
    """One step of a left fold of partial Gram matrices: ``acc + part``.

    A fold over a group adds exactly what :func:`combine_grams` adds, in the same order, so the
    sum has the same bytes (``a + b`` and ``b + a`` are the same IEEE sum). ``acc`` covers the
    earlier records: its failure wins.

    The sum is formed in place, in whichever operand is writeable (a transferred one may be a
    read-only view of a network frame): in a fold each partial has exactly one consumer, this
    step, and a fresh ``M x M`` array per step costs its page faults (several times the
    addition's own cost at thousands of features).
    """
    for p in (acc, part):
        if p.error is not None:
            return p
    a, b = acc.value[0], part.value[0]
    out = a if a.flags.writeable else b if b.flags.writeable else None
    return Outcome((np.add(a, b, out=out), acc.value[1] + part.value[1]))


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


@dataclass(frozen=True, eq=False)
class PanelNoise:
    """What a covariance panel task needs to draw and describe its noise.

    Attributes
    ----------
    key : NoiseKey
        The noise key (a release's ``derive("release")`` sub-key, or DP-PCA's).
    variances : ndarray
        The ``m`` noise variances ``v``: ``B = diag(sqrt(v))`` for standard directions; for
        low-rank directions ``k`` along ``basis``, then the complement's.
    algorithm : str
        ``symmetric``, ``equi-modal`` or ``unimodal``.
    ratio : float or None
        ``r`` of symmetric noise.
    basis : ndarray or None
        ``U`` (``m x k``) of low-rank directions (``B = Sigma^(1/2)``); ``None``: standard.
    projection : ndarray or None
        The first pass's ``m x k`` projection (:func:`~mvg_dask.noise.tiles.
        low_rank_projection_block`), low-rank directions only.
    core : ndarray or None
        ``K = U^T G`` (``k x k``; symmetric and equi-modal low-rank noise).
    """

    key: NoiseKey
    variances: np.ndarray
    algorithm: str
    ratio: float | None
    basis: np.ndarray | None = None
    projection: np.ndarray | None = None
    core: np.ndarray | None = None

    @functools.cached_property
    def noise_covariance(self) -> NoiseCovariance:
        """``Sigma``: diagonal (standard directions) or low rank (``basis``)."""
        kind: CovarianceKind = "diagonal" if self.basis is None else "low-rank"
        return covariance_of(kind, self.basis, self.variances)

    def block(self, i: int, j: int) -> np.ndarray:
        """Block ``(i, j)`` of the published noise, on the grid of
        :func:`~mvg_dask.noise.tiles.feature_blocks`
        (:meth:`~mvg_dask.plan.covariance.NoiseCovariance.noise_block`)."""
        return self.noise_covariance.noise_block(
            self.key, self.algorithm, self.ratio, i, j, projection=self.projection, core=self.core
        )

    def region(self, rs: tuple[int, int], cs: tuple[int, int]) -> np.ndarray:
        """The published noise of the output region ``rs x cs`` (whole grid blocks)."""
        from mvg_dask.noise.tiles import NOISE_TILE_FEATURES

        tf = NOISE_TILE_FEATURES
        z = np.empty((rs[1] - rs[0], cs[1] - cs[0]))
        for i in range(rs[0] // tf, -(-rs[1] // tf)):
            for j in range(cs[0] // tf, -(-cs[1] // tf)):
                zb = self.block(i, j)
                a0, b0 = i * tf - rs[0], j * tf - cs[0]
                z[a0 : a0 + zb.shape[0], b0 : b0 + zb.shape[1]] = zb
        return z

    def covariance(self, rs: tuple[int, int], cs: tuple[int, int]) -> np.ndarray:
        """The region ``rs x cs`` of ``Sigma`` (the published ``row_cov``)."""
        return self.noise_covariance.block(rs, cs)


def _gram_panel(
    rows: tuple[int, int],
    m: int,
    source: ZarrMatrix,
    clipper: Clipper,
    reads: PanelReads,
    inner: int | None = None,
) -> tuple[np.ndarray, int] | Outcome:
    """The panel ``rows x [rows[0], m)`` of ``X X^T`` of the clipped records, its diagonal block
    mirrored from its upper triangle (exactly symmetric), and the number of clipped values; or
    the failure the data gave.

    With ``inner`` (lattice releases) the groups' products accumulate in an inner panel that is
    folded into the result every ``inner`` groups, the summation whose depth the plan bounds
    (:func:`mvg_dask.plan.lattice.panel_depth`); without, every group adds to the result."""
    from scipy.linalg.blas import dgemm

    r0, r1 = rows
    acc = np.zeros((r1 - r0, m - r0))
    part = acc if inner is None else np.zeros_like(acc)
    clipped = 0
    try:
        for n, (_, x, c) in enumerate(reads.groups(source, clipper)):
            # part += X[rows] X[r0:]^T in place (BLAS beta = 1 on part^T, Fortran-ordered): no
            # panel-sized temporary per group
            out = dgemm(1.0, x[r0:].T, x[r0:r1].T, beta=1.0, c=part.T, trans_a=1, overwrite_c=1)
            if not np.shares_memory(out, part):  # pragma: no cover - BLAS copied c
                part[...] = out.T
            clipped += c
            if inner is not None and (n + 1) % inner == 0:
                acc += part
                part[...] = 0.0
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    if inner is not None:
        acc += part
    h = r1 - r0
    acc[:, :h] = np.triu(acc[:, :h]) + np.triu(acc[:, :h], 1).T
    return acc, clipped


@dataclass(frozen=True)
class _PanelSinks:
    """The arrays a covariance panel task writes: the release (and the sum, with a noisy
    count), the noise description's blocks and, for standard directions, the directions'."""

    covariance: Any
    gram: Any
    described: list[Any]
    directions: Any

    @classmethod
    def open(
        cls,
        sink: str,
        storage_options: dict[str, Any] | None,
        noise: PanelNoise,
        *,
        gram: bool,
    ) -> _PanelSinks:
        """Open the arrays of the release skeleton at ``sink``."""
        import zarr

        def open_(name: str) -> Any:
            return zarr.open_array(
                store=sink, path=name, mode="r+", storage_options=storage_options
            )

        names = ["row_cov"] + (["col_cov"] if noise.algorithm != "unimodal" else [])
        # low-rank directions are published whole (m x k) with the skeleton
        diagonal = noise.noise_covariance.diagonal
        return cls(
            covariance=open_("covariance"),
            gram=open_("gram") if gram else None,
            described=[open_(n) for n in names],
            directions=open_("directions") if diagonal else None,
        )

    def put(
        self,
        rs: tuple[int, int],
        cs: tuple[int, int],
        noisy: np.ndarray,
        count: float | None,
        noise: PanelNoise,
    ) -> None:
        """Write the region ``rs x cs`` of the release and of its noise description."""

        def put(arr: Any, value: np.ndarray) -> None:
            arr[rs[0] : rs[1], cs[0] : cs[1]] = value

        put(self.covariance, noisy if count is None else noisy / max(count, 1.0))
        if self.gram is not None:
            put(self.gram, noisy)
        sigma = noise.noise_covariance.block(rs, cs)
        for arr in self.described:
            put(arr, sigma)
        if self.directions is not None:
            shape = (rs[1] - rs[0], cs[1] - cs[0])
            put(self.directions, np.eye(*shape) if rs == cs else np.zeros(shape))


def covariance_panel_task(
    rows: tuple[int, int],
    *,
    source: ZarrMatrix,
    sink: str,
    storage_options: dict[str, Any] | None,
    clipper: Clipper,
    reads: PanelReads,
    normaliser: float,
    count: float | None,
    noise: PanelNoise,
    block: int,
    lattice: StandardSquareLattice | None = None,
    inner: int | None = None,
) -> Outcome:
    """One row panel of a blocked covariance release: ``X[rows] X[rows:]^T``, privatized, written.

    With ``lattice`` each block is privatized on the lattice
    (:meth:`StandardSquareLattice.region`) instead of having float noise added, and the panel
    is summed with ``inner`` (:func:`_gram_panel`).

    The task streams every chunk of the input (full records: a record's clipping needs all its
    features), accumulates the panel ``rows x [rows[0], m)`` of the Gram matrix (the diagonal
    block mirrored from its upper triangle, so the output is exactly symmetric), adds the
    noise of each output block drawn from the noise grid (:meth:`PanelNoise.block`: the same
    bytes whatever ``block``) and writes the panel's blocks and their transposes, with the noise
    description's blocks. Memory: one input chunk and one ``block x m`` panel. A panel whose
    marker exists is skipped (resume); once the release failed (abort marker) the task does
    nothing.

    Returns
    -------
    Outcome
        ``[clipped values (first panel only), 0]`` (int64), or the error.
    """
    import json

    import fsspec

    r0 = rows[0]
    fs, marker = fsspec.core.url_to_fs(progress_marker(sink, r0), **(storage_options or {}))
    done = _read_marker(fs, marker)
    if done is not None:
        return Outcome(np.array([done["clipped"], done["records"]], dtype=np.int64))
    _, abort_path = fsspec.core.url_to_fs(abort_marker(sink), **(storage_options or {}))
    if fs.exists(abort_path):
        return Outcome(skipped=True)
    m = noise.variances.size
    panel = _gram_panel(rows, m, source, clipper, reads, inner)
    if isinstance(panel, Outcome):
        return panel
    acc, clipped = panel

    sinks = _PanelSinks.open(sink, storage_options, noise, gram=count is not None)
    symmetric_noise = noise.algorithm != "unimodal"
    for c0 in range(r0, m, block):
        cs = (c0, min(c0 + block, m))
        data = acc[:, c0 - r0 : cs[1] - r0] / normaliser
        upper = (
            data + noise.region(rows, cs)
            if lattice is None
            else lattice.region(np.ascontiguousarray(data), rows, cs)
        )
        regions = [(rows, cs, upper)]
        if c0 != r0:  # the mirrored block: the same data; symmetric noise is the transpose
            if symmetric_noise:
                lower = upper.T
            elif lattice is None:
                lower = data.T + noise.region(cs, rows)
            else:
                lower = lattice.region(np.ascontiguousarray(data.T), cs, rows)
            regions.append((cs, rows, lower))
        for rs, cs_, noisy in regions:
            sinks.put(rs, cs_, noisy, count, noise)
    first = r0 == 0
    _write_marker(
        fs, marker, json.dumps({"clipped": clipped if first else 0, "records": 0}).encode()
    )
    return Outcome(np.array([clipped if first else 0, 0], dtype=np.int64))


def noisy_gram_panel_task(
    rows: tuple[int, int],
    *,
    source: ZarrMatrix,
    sink: str,
    storage_options: dict[str, Any] | None,
    clipper: Clipper,
    reads: PanelReads,
    noise: PanelNoise,
    block: int,
    lattice: StandardSquareLattice | None = None,
    inner: int | None = None,
) -> Outcome:
    """One row panel of DP-PCA's noisy Gram matrix ``X X^T + sigma S`` (Analyze Gauss: ``S``
    symmetric with an iid upper triangle, from the noise grid), written with its mirrored
    blocks to the scratch array ``gram`` at ``sink``. With ``lattice`` (lattice releases: the
    step on the lattice of ``X X^T / sigma``, :func:`mvg_dask.engine.lattice.gram_step`) each
    block is privatized on the lattice and the panel is summed with ``inner``.

    Returns
    -------
    Outcome
        ``[clipped values (first panel only), 0]`` (int64), or the error.
    """
    import zarr

    r0, r1 = rows
    m = noise.variances.size
    panel = _gram_panel(rows, m, source, clipper, reads, inner)
    if isinstance(panel, Outcome):
        return panel
    acc, clipped = panel
    arr = zarr.open_array(store=sink, path="gram", mode="r+", storage_options=storage_options)
    for c0 in range(r0, m, block):
        cs = (c0, min(c0 + block, m))
        data = acc[:, c0 - r0 : cs[1] - r0]
        noisy = (
            data + noise.region(rows, cs)
            if lattice is None
            else lattice.region(np.ascontiguousarray(data), rows, cs)
        )
        arr[r0:r1, cs[0] : cs[1]] = noisy
        if c0 != r0:
            arr[cs[0] : cs[1], r0:r1] = noisy.T
    return Outcome(np.array([clipped if r0 == 0 else 0, 0], dtype=np.int64))


def panel_product_task(
    rows: tuple[int, int], *, sink: str, storage_options: dict[str, Any] | None, Q: np.ndarray
) -> np.ndarray:
    """``G[rows] @ Q`` for the scratch Gram matrix ``G`` at ``sink`` (one step of the top-``k``
    DP-PCA's subspace iteration)."""
    import zarr

    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES

    arr = zarr.open_array(store=sink, path="gram", mode="r", storage_options=storage_options)
    panel = np.asarray(arr[rows[0] : rows[1], :])
    # one product per grid block of rows: the same BLAS call (shapes and data) whatever the
    # release's blocking, so the directions' bytes do not depend on it
    step = NOISE_TILE_FEATURES
    return np.vstack([panel[a : a + step] @ Q for a in range(0, panel.shape[0], step)])


def projection_task(
    grid_blocks: tuple[int, int],
    *,
    noise_key: NoiseKey,
    U: np.ndarray,
    algorithm: str,
    ratio: float | None,
) -> np.ndarray:
    """Grid blocks ``[i0, i1)`` of the low-rank noise's first-pass projection, stacked."""
    from mvg_dask.noise.tiles import low_rank_projection_block

    return np.vstack(
        [low_rank_projection_block(noise_key, U, algorithm, ratio, i) for i in range(*grid_blocks)]
    )


# -- wide releases with low-rank directions on the lattice ---------------------------------------
def _grid_rows(rows: tuple[int, int]) -> list[tuple[int, int]]:
    """The noise grid's row blocks of a panel (a panel is whole grid blocks but for the last)."""
    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES

    step = NOISE_TILE_FEATURES
    return [(a, min(a + step, rows[1])) for a in range(rows[0], rows[1], step)]


def _gram_rows(
    rows: tuple[int, int],
    m: int,
    source: ZarrMatrix,
    clipper: Clipper,
    reads: PanelReads,
    inner: int,
) -> tuple[list[np.ndarray], int] | Outcome:
    """Full-width rows ``X[rows] X^T`` of the clipped records, one accumulator per grid block of
    rows (the same BLAS call for a grid block whatever the panel), summed as
    :func:`_gram_panel` sums a lattice panel (``inner`` groups per fold); or the data's error."""
    from scipy.linalg.blas import dgemm

    grid = _grid_rows(rows)
    acc = [np.zeros((b - a, m)) for a, b in grid]
    part = [np.zeros_like(x) for x in acc]
    clipped = 0
    try:
        for n, (_, x, c) in enumerate(reads.groups(source, clipper)):
            for (r0, r1), p in zip(grid, part, strict=True):
                out = dgemm(1.0, x.T, x[r0:r1].T, beta=1.0, c=p.T, trans_a=1, overwrite_c=1)
                if not np.shares_memory(out, p):  # pragma: no cover - BLAS copied c
                    p[...] = out.T
            clipped += c
            if (n + 1) % inner == 0:
                for s, p in zip(acc, part, strict=True):
                    s += p
                    p[...] = 0.0
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    for s, p in zip(acc, part, strict=True):
        s += p
    return acc, clipped


def low_rank_projection_task(
    rows: tuple[int, int],
    *,
    source: ZarrMatrix,
    clipper: Clipper,
    reads: PanelReads,
    normaliser: float,
    lattice: LowRankSquareLattice,
    inner: int,
) -> Outcome:
    """First pass of a wide low-rank lattice release: the panel's parts ``U[gb]^T f[gb]`` of
    ``P = U^T f``, one per grid block of its rows (``len x k x m``), for the client to sum in
    grid order."""
    m = lattice.basis.shape[0]
    got = _gram_rows(rows, m, source, clipper, reads, inner)
    if isinstance(got, Outcome):
        return got
    acc, _ = got
    parts = [
        lattice.projection(s / normaliser, slice(a, b))
        for (a, b), s in zip(_grid_rows(rows), acc, strict=True)
    ]
    return Outcome(np.stack(parts))


def low_rank_lattice_task(
    rows: tuple[int, int],
    *,
    source: ZarrMatrix,
    sink: str,
    storage_options: dict[str, Any] | None,
    clipper: Clipper,
    reads: PanelReads,
    normaliser: float,
    lattice: LowRankSquareLattice,
    inner: int,
    P: np.ndarray,
) -> Outcome:
    """Second pass: the panel's rows of the whitened query ``g`` (from ``P = U^T f``), rounded
    to the grid with the noise's integers added (``2^k t``, grid block by grid block), written
    to the scratch array ``gram`` at ``sink`` (symmetric noise: the blocks on and above the
    diagonal and their mirrors).

    Returns
    -------
    Outcome
        ``[clipped values (first panel only), 0]`` (int64), or the error.
    """
    import zarr

    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, feature_blocks

    m = lattice.basis.shape[0]
    got = _gram_rows(rows, m, source, clipper, reads, inner)
    if isinstance(got, Outcome):
        return got
    acc, clipped = got
    arr = zarr.open_array(store=sink, path="gram", mode="r+", storage_options=storage_options)
    blocks = feature_blocks(m)
    symmetric = lattice.algorithm == "symmetric"
    for (a, b), s in zip(_grid_rows(rows), acc, strict=True):
        g = lattice.whitened(s / normaliser, slice(a, b), P)
        i = a // NOISE_TILE_FEATURES
        first = i if symmetric else 0
        T = np.empty((b - a, m - blocks[first][0]))
        for j in range(first, len(blocks)):
            c, d = blocks[j]
            T[:, c - blocks[first][0] : d - blocks[first][0]] = lattice.lattice_block(
                np.ascontiguousarray(g[:, c:d]), i, j
            )
        arr[a:b, blocks[first][0] :] = T
        if symmetric and b < m:
            arr[b:, a:b] = T[:, b - a :].T
    return Outcome(np.array([clipped if rows[0] == 0 else 0, 0], dtype=np.int64))


def low_rank_products_task(
    rows: tuple[int, int],
    *,
    sink: str,
    storage_options: dict[str, Any] | None,
    basis: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Third pass: the panel's parts ``U[gb]^T T[gb]`` of ``R = U^T T`` (``len x k x m``) and its
    rows of ``T U``, grid block by grid block, from the scratch array."""
    import zarr

    arr = zarr.open_array(store=sink, path="gram", mode="r", storage_options=storage_options)
    parts, tu = [], []
    for a, b in _grid_rows(rows):
        T = np.asarray(arr[a:b, :])
        parts.append(basis[a:b].T @ T)
        tu.append(T @ basis)
    return np.stack(parts), np.vstack(tu)


def low_rank_publish_task(
    rows: tuple[int, int],
    *,
    scratch: str,
    sink: str,
    storage_options: dict[str, Any] | None,
    lattice: LowRankSquareLattice,
    R: np.ndarray,
    TU: np.ndarray,
    S: np.ndarray,
    count: float | None,
    noise: PanelNoise,
) -> Outcome:
    """Last pass: the panel's rows of the published ``A T A^T`` (equi-modal: symmetrised with
    its columns; unimodal: ``A T``), written with their mirrors for the symmetric noises, with
    the noise description's blocks. A panel whose marker exists is skipped (resume); once the
    release failed (abort marker) the task does nothing.

    Returns
    -------
    Outcome
        ``[0, 0]`` (int64): the clipped values were counted by the second pass.
    """
    import fsspec
    import zarr

    from mvg_dask.noise.tiles import NOISE_TILE_FEATURES, feature_blocks

    r0 = rows[0]
    fs, marker = fsspec.core.url_to_fs(progress_marker(sink, r0), **(storage_options or {}))
    if _read_marker(fs, marker) is not None:
        return Outcome(np.array([0, 0], dtype=np.int64))
    _, abort_path = fsspec.core.url_to_fs(abort_marker(sink), **(storage_options or {}))
    if fs.exists(abort_path):
        return Outcome(skipped=True)
    m = lattice.basis.shape[0]
    blocks = feature_blocks(m)
    T_arr = zarr.open_array(store=scratch, path="gram", mode="r", storage_options=storage_options)

    def open_(name: str) -> Any:
        return zarr.open_array(store=sink, path=name, mode="r+", storage_options=storage_options)

    cov = open_("covariance")
    gram = open_("gram") if count is not None else None
    names = ["row_cov"] + (["col_cov"] if lattice.algorithm != "unimodal" else [])
    described = [open_(n) for n in names]
    two_sided = lattice.algorithm != "unimodal"
    for a, b in _grid_rows(rows):
        i = a // NOISE_TILE_FEATURES
        out = lattice.published_rows(np.asarray(T_arr[a:b, :]), slice(a, b), R, TU[a:b], S)
        if lattice.algorithm == "equi-modal":
            cols = lattice.published_columns(np.asarray(T_arr[:, a:b]), slice(a, b), R, TU, S)
            out = (out + cols.T) / 2.0
        start = blocks[i][0] if two_sided else 0
        noisy = out[:, start:]
        if two_sided:  # the diagonal block from its upper triangle: exactly symmetric
            h = b - a
            noisy[:, :h] = np.triu(noisy[:, :h]) + np.triu(noisy[:, :h], 1).T
        # grid block by grid block: the noise description's diagonal blocks are (rs, rs)
        regions = []
        for c, d in blocks[i if two_sided else 0 :]:
            value = noisy[:, c - start : d - start]
            regions.append(((a, b), (c, d), value))
            if two_sided and c >= b:
                regions.append(((c, d), (a, b), value.T))
        for (p, q), (c, d), value in regions:
            cov[p:q, c:d] = value if count is None else value / max(count, 1.0)
            if gram is not None:
                gram[p:q, c:d] = value
            sigma = noise.covariance((p, q), (c, d))
            for arr in described:
                arr[p:q, c:d] = sigma
    _write_marker(fs, marker, b'{"clipped": 0, "records": 0}')
    return Outcome(np.array([0, 0], dtype=np.int64))
