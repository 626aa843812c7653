"""Where a stream's curator-side state lives: the ledger, or a local directory without one.

A stream's state is its key (a secret), its committed periods, the record watermark and each
period's exact integers (docs/guide/streams.md, "What is curator-side"). With a ledger it is kept
by the ledger's stream tables (:class:`~mvg_dask.ledger.Ledger`'s ``open_stream``,
``begin_period``, ``commit_period``, ``stream_state``, ``stream_key``); a stream without a
ledger (tests, demos: never charged) keeps the same state in :class:`FileStreamBook`, a
directory beside the output (``<output>.stream-state``), never inside it. Both speak
:class:`StreamBook`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from mvg_dask.errors import BudgetError, ReleaseError
from mvg_dask.noise.rng import NoiseKey


@dataclass(frozen=True)
class BookStream:
    """A stream as the book holds it (the fields the engine reads of the ledger's entry)."""

    stream_id: str
    spec_hash: str
    horizon: int
    periods: int
    watermark: int
    status: str


@dataclass(frozen=True)
class BookPeriod:
    """A period as the book holds it (the fields the engine reads of the ledger's entry)."""

    stream_id: str
    period: int
    label: str
    status: str
    watermark_before: int
    watermark_after: int | None = None


class StreamBook(Protocol):
    """The stream methods the engine calls (the ledger's, docs/guide/streams.md)."""

    def open_stream(self, **kwargs: Any) -> tuple[Any, bool]:
        """Create the stream and its one charge, or return the existing one."""
        ...

    def stream_key(self, stream_id: str) -> str:
        """The stream's key (hex)."""
        ...

    def begin_period(
        self, stream_id: str, period: int, label: str, *, target: int | None = None
    ) -> Any:
        """Claim the next period (in order; past the horizon refused), reading through
        ``target`` records (kept with the claim: a resumed period reads the same records)."""
        ...

    def commit_period(
        self,
        stream_id: str,
        period: int,
        *,
        watermark: int,
        state: dict[str, bytes],
        clipped: int | None = None,
        drop: Sequence[tuple[int, str]] = (),
    ) -> None:
        """Commit a period with its state, dropping ``(period, part)`` no later period uses;
        the stream advances."""
        ...

    def stream_state(
        self, stream_id: str, *, through: int | None = None
    ) -> dict[int, dict[str, bytes]]:
        """The committed state parts per period."""
        ...


def past_horizon(stream_id: str, horizon: int) -> BudgetError:
    """The refusal of a period past a stream's horizon, with its remedy."""
    return BudgetError(
        f"stream {stream_id!r} has released all {horizon} periods of its horizon; start a new "
        "stream (a new release_id or name, charged once for its own horizon)"
    )


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole, readable by its owner only (the state holds the stream's key)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)  # a leftover temporary file keeps its old mode
        fh.write(data)
    os.replace(tmp, path)


class FileStreamBook:
    """A stream's state in a local directory (a stream without a ledger: never charged).

    Parameters
    ----------
    directory : str or Path
        The state directory (curator-side; never published).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    @classmethod
    def beside(cls, output: str) -> FileStreamBook:
        """The book of the stream written to the local store ``output``."""
        if "://" in output and not output.startswith("file://"):
            raise ReleaseError(
                "a stream without a ledger keeps its state beside a local output; declare a "
                "ledger for an output in an object store"
            )
        return cls(output.removeprefix("file://").rstrip("/") + ".stream-state")

    def _meta_path(self) -> Path:
        return self.directory / "stream.json"

    def _meta(self) -> dict[str, Any] | None:
        path = self._meta_path()
        return json.loads(path.read_text()) if path.exists() else None

    def _save(self, meta: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)  # the key: like the ledger's file, its owner's only
        _write_atomic(self._meta_path(), json.dumps(meta, sort_keys=True).encode())

    def _entry(self, meta: dict[str, Any]) -> BookStream:
        return BookStream(
            meta["stream_id"],
            meta["spec_hash"],
            meta["horizon"],
            meta["periods"],
            meta["watermark"],
            meta["status"],
        )

    def open_stream(
        self, *, stream_id: str, horizon: int, spec_hash: str, seed: int | None = None, **_: Any
    ) -> tuple[BookStream, bool]:
        """Create the stream (a fresh key, or the seed's), or return it (same spec only)."""
        meta = self._meta()
        if meta is not None:
            if meta["stream_id"] != stream_id or meta["spec_hash"] != spec_hash:
                raise ReleaseError(
                    f"the output's stream {meta['stream_id']!r} was started by another spec; "
                    "give the new stream another output (and release_id)"
                )
            return self._entry(meta), False
        key = NoiseKey.from_seed(seed) if seed is not None else NoiseKey.fresh()
        meta = {
            "stream_id": stream_id,
            "spec_hash": spec_hash,
            "horizon": horizon,
            "periods": 0,
            "watermark": 0,
            "status": "open",
            "key": key.to_hex(),
            "seeded": seed is not None,
            "created": time.time(),
            "pending": None,
        }
        self._save(meta)
        return self._entry(meta), True

    def stream(self, stream_id: str) -> BookStream | None:
        """The stream, if this book holds it."""
        meta = self._meta()
        return None if meta is None or meta["stream_id"] != stream_id else self._entry(meta)

    def stream_key(self, stream_id: str) -> str:
        """The stream's key (hex)."""
        meta = self._meta()
        assert meta is not None and meta["stream_id"] == stream_id
        if meta["key"] is None:
            raise ReleaseError(f"stream {stream_id!r} is complete: its key is erased")
        return str(meta["key"])

    def seeded(self) -> bool:
        """The key came from a user seed (NOT private)."""
        meta = self._meta()
        return bool(meta and meta.get("seeded"))

    def begin_period(
        self, stream_id: str, period: int, label: str, *, target: int | None = None
    ) -> BookPeriod:
        """Claim ``period`` (the next one) through ``target`` records; a pending one is resumed
        with the target it was claimed with."""
        meta = self._meta()
        assert meta is not None and meta["stream_id"] == stream_id
        if period > meta["horizon"]:
            raise past_horizon(stream_id, meta["horizon"])
        if period != meta["periods"] + 1:
            raise ReleaseError(
                f"stream {stream_id!r}: period {period} is out of order (next is "
                f"{meta['periods'] + 1})"
            )
        pending = meta["pending"]
        if pending is not None and pending["period"] == period:
            if pending["label"] != label:
                raise ReleaseError(
                    f"stream {stream_id!r}: period {period} is pending with label "
                    f"{pending['label']!r}, not {label!r}; re-run it with that label"
                )
            return BookPeriod(**pending)
        entry = BookPeriod(stream_id, period, label, "pending", meta["watermark"], target)
        meta["pending"] = asdict(entry)
        self._save(meta)
        return entry

    def commit_period(
        self,
        stream_id: str,
        period: int,
        *,
        watermark: int,
        state: dict[str, bytes],
        clipped: int | None = None,
        drop: Sequence[tuple[int, str]] = (),
    ) -> None:
        """Write the period's state, then advance the stream (one atomic metadata write), then
        remove the parts ``drop`` names (unused by any later period: a crash leaves extra
        files, never missing ones)."""
        meta = self._meta()
        assert meta is not None and meta["stream_id"] == stream_id
        if meta["periods"] >= period:
            return  # committed already (a retry)
        for part, data in state.items():
            _write_atomic(self.directory / f"p{period:04d}.{part}", data)
        pending = meta["pending"] or {}
        meta.update(periods=period, watermark=watermark, pending=None)
        meta.setdefault("labels", []).append(pending.get("label", str(period)))
        if period >= meta["horizon"]:
            meta.update(status="complete", key=None)
        self._save(meta)
        for old, part in drop:
            (self.directory / f"p{old:04d}.{part}").unlink(missing_ok=True)

    def stream_state(
        self, stream_id: str, *, through: int | None = None
    ) -> dict[int, dict[str, bytes]]:
        """The committed state parts per period."""
        meta = self._meta()
        if meta is None:
            return {}
        last = meta["periods"] if through is None else min(through, meta["periods"])
        out: dict[int, dict[str, bytes]] = {}
        for t in range(1, last + 1):
            parts = sorted(self.directory.glob(f"p{t:04d}.*"))
            out[t] = {p.suffix[1:]: p.read_bytes() for p in parts if not p.name.endswith(".tmp")}
        return out
