"""The identity release's task: each chunk of records read, clipped, noised and written."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.records import ZarrMatrix
from mvg_dask.engine.store import Store
from mvg_dask.engine.tasks.outcome import (
    Outcome,
    read_marker,
    write_marker,
)
from mvg_dask.errors import MvgDaskError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.tiles import record_noise

if TYPE_CHECKING:
    from mvg_dask.engine.lattice import RecordLattice


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

    target = Store(sink.store, sink.storage_options)
    fs, abort_path = target.fs, target.abort_marker
    step = stop - start if step is None else step
    total = np.zeros(2, dtype=np.int64)
    for a in range(start, stop, step):
        b = min(a + step, stop)
        marker = target.chunk_marker(a)
        done = read_marker(fs, marker)
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
            # x is this chunk's own block: the release may write into it
            y = lattice.release(x, noise_key, a, b, tile=tile, n_total=n_total, overwrite=True)
        else:
            y = record_noise(noise_key, factor, a, b, tile=tile, n_total=n_total, diagonal=diagonal)
            y += x
        sink.write(a, b, y)
        write_marker(fs, marker, json.dumps({"clipped": clipped, "records": b - a}).encode())
        total += [clipped, b - a]
    return Outcome(total)
