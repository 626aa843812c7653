"""What a task returns (:class:`Outcome`, with dask's serializer for it) and the markers by which
tasks record a written chunk or panel (resume) and see a failed release (abort)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distributed.protocol import dask_deserialize, dask_serialize, deserialize, serialize

from mvg_dask.errors import DataError, MvgDaskError, ReleaseError
from mvg_dask.release_format import ProgressLog


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


def read_marker(fs: Any, path: str) -> dict[str, int] | None:
    """A chunk's completion marker, or ``None`` when there is none or it is unreadable (a worker
    killed while writing it): the chunk is then written again, with the same bytes."""
    import json

    try:
        done = json.loads(fs.cat_file(path))
        return {"clipped": int(done["clipped"]), "records": int(done["records"])}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def write_marker(fs: Any, path: str, payload: bytes) -> None:
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
