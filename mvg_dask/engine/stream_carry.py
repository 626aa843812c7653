"""What a stream keeps between its periods: the curator-side state (docs/guide/streams.md,
"What is curator-side").

Format 2 writes, with the commit of period ``t``, the parts the later periods still use and
drops, in the same transaction, the parts no later period uses:

* ``format``: ``b"2"``, the state's format;
* ``open`` (the tree): its open nodes' exact sums after ``t``, superseded by the next period's;
* ``increment`` (the square root): ``g̃_t`` while a later encoder row uses it (the last
  ``width - 1`` periods: every period for the full square root, ``band - 1`` banded);
* ``outputs`` (the tree, the full square root): the noisy outputs of ``t`` while a later
  decoder row uses them. Honaker's decoder and the full square root's use every output up to the
  horizon, so these are kept until the last period;
* ``z`` and ``prefix`` (the banded square root): its decoder as a recursion,
  ``z_t = y_t - Σ_{j ≥ 1} c̃_j z_{t-j}`` (``C̃⁻¹ y``, float) and ``x̂_t = x̂_{t-1} + z_t``: the
  last ``band - 1`` ``z`` and the running ``x̂``.

The last period drops everything (the key is erased with it). Format 1 (the first streams) kept
one part ``arrays`` per period (the increment and the outputs, and the count's): it still loads,
its periods' parts are kept as they are.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mvg_dask.engine.stream_noise import decode_period
from mvg_dask.errors import ReleaseError
from mvg_dask.plan.stream import last_uses
from mvg_dask.privacy.continual import (
    Factorization,
    ToeplitzFactorization,
    TreeFactorization,
    TreeState,
    encode_period,
    tree_advance,
)

FORMAT = b"2"
PARTS = ("format", "open", "increment", "outputs", "z", "prefix")


def encode_arrays(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` as ``.npz`` bytes."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def decode_arrays(data: bytes) -> dict[str, np.ndarray]:
    """:func:`encode_arrays`' inverse."""
    with np.load(io.BytesIO(data)) as npz:
        return {k: npz[k] for k in npz.files}


def _banded(f: Factorization) -> bool:
    return isinstance(f, ToeplitzFactorization) and f.band is not None


@dataclass
class Carry:
    """The state a period reads (of the periods before it) and the state it leaves.

    Attributes
    ----------
    increments, outputs, z : dict
        ``{period: {channel: array}}``, channel ``release`` or ``count``.
    prefix : dict
        ``{channel: x̂_{t-1}}`` (banded).
    open : dict
        ``{channel: TreeState}`` after ``t - 1`` (tree).
    new : dict
        What period ``t`` adds: ``{part: {channel: array}}``.
    """

    increments: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    outputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    z: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    prefix: dict[str, np.ndarray] = field(default_factory=dict)
    open: dict[str, TreeState] = field(default_factory=dict)
    new: dict[str, dict[str, Any]] = field(default_factory=dict)


def _format_one(carry: Carry, s: int, data: bytes) -> None:
    a = decode_arrays(data)
    carry.increments[s] = {"release": a["increment"]}
    carry.outputs[s] = {"release": a["outputs"]}
    if "count" in a:
        carry.increments[s]["count"] = a["count"]
        carry.outputs[s]["count"] = a["count_outputs"]


def _open_nodes(data: bytes, period: int) -> dict[str, TreeState]:
    nodes: dict[str, list[tuple[int, np.ndarray]]] = {}
    for name, arr in decode_arrays(data).items():
        channel, level = name.rsplit("-", 1)
        nodes.setdefault(channel, []).append((int(level), arr))
    return {c: TreeState(period, tuple(sorted(v, key=lambda n: n[0]))) for c, v in nodes.items()}


def load_carry(book: Any, stream_id: str, f: Factorization, t: int) -> Carry:
    """The state period ``t`` reads, from the book (format 2, or format 1's full history).

    Raises
    ------
    ReleaseError
        A period's state is in a format this version cannot read.
    """
    carry = Carry()
    for s, parts in book.stream_state(stream_id, through=t - 1).items():
        if "arrays" in parts:
            _format_one(carry, s, parts["arrays"])
            continue
        if parts.get("format") != FORMAT:
            raise ReleaseError(
                f"stream {stream_id!r}: period {s}'s state has format "
                f"{parts.get('format', b'?').decode(errors='replace')!r}, which this version "
                "cannot read; finish the stream with the version that started it, or start a "
                "new stream"
            )
        for name, into in (("increment", carry.increments), ("outputs", carry.outputs)):
            if name in parts:
                into[s] = decode_arrays(parts[name])
        if "z" in parts:
            carry.z[s] = decode_arrays(parts["z"])
        if s == t - 1 and "prefix" in parts:
            carry.prefix = decode_arrays(parts["prefix"])
        if s == t - 1 and "open" in parts:
            carry.open = _open_nodes(parts["open"], s)
    if isinstance(f, TreeFactorization) and t > 1 and not carry.open:
        _replay_tree(f, carry, t)
    return carry


def _replay_tree(f: TreeFactorization, carry: Carry, t: int) -> None:
    """The tree's open nodes from format 1's increments."""
    for channel in carry.increments.get(1, {}):
        state = TreeState()
        for s in range(1, t):
            _, state = tree_advance(f, state, carry.increments[s][channel])
        carry.open[channel] = state


def encode(
    f: Factorization, t: int, carry: Carry, channel: str, h: np.ndarray, bound: int
) -> np.ndarray:
    """Period ``t``'s exact encoder outputs of ``channel`` (``C_int[rows of t] g̃``)."""
    h = np.asarray(h, dtype=np.int64)
    if isinstance(f, TreeFactorization):
        released, state = tree_advance(f, carry.open.get(channel, TreeState(t - 1)), h, bound=bound)
        carry.new.setdefault("open", {})[channel] = state
        return released
    if not isinstance(f, ToeplitzFactorization):
        raise ReleaseError(f"a stream cannot run the {f.name} factorization")
    k = min(t, f.width)
    history = [carry.increments[s][channel] for s in range(t - k + 1, t)]
    carry.new.setdefault("increment", {})[channel] = h
    return encode_period(f, t, np.stack([*history, h]), bound=bound)


def decode(f: Factorization, t: int, carry: Carry, channel: str, y: np.ndarray) -> np.ndarray:
    """``x̂_t`` of ``channel`` in grid units (float, post-processing)."""
    carry.new.setdefault("outputs", {})[channel] = y
    if not _banded(f):
        shape = y.shape[1:]
        outs = [
            carry.outputs[s][channel]
            if s in carry.outputs
            else np.zeros((f.outputs_at(s), *shape), dtype=np.int64)
            for s in range(1, t)
        ]
        return decode_period(f, t, [*outs, y])
    assert isinstance(f, ToeplitzFactorization)
    c = np.ldexp(np.array(f.coefficients, dtype=np.float64), -f.bits)
    z = np.asarray(y[0], dtype=np.float64)
    for j in range(1, min(t, f.width)):
        z = z - c[j] * carry.z[t - j][channel]
    x = z + carry.prefix[channel] if channel in carry.prefix else z
    carry.new.setdefault("z", {})[channel] = z
    carry.new.setdefault("prefix", {})[channel] = x
    return np.asarray(np.ldexp(x, -f.bits))


def commit_parts(
    f: Factorization, t: int, carry: Carry
) -> tuple[dict[str, bytes], list[tuple[int, str]]]:
    """The parts period ``t`` writes and the ``(period, part)`` it drops (module text)."""
    T = f.horizon
    if t >= T:  # the last period: nothing is used again
        return {"format": FORMAT}, [(s, p) for s in range(1, T) for p in PARTS]
    new, parts = carry.new, {"format": FORMAT}
    drop: list[tuple[int, str]] = []
    if "open" in new:
        parts["open"] = encode_arrays(
            {f"{c}-{lvl}": a for c, st in new["open"].items() for lvl, a in st.open}
        )
        drop.append((t - 1, "open"))
    width = f.width if isinstance(f, ToeplitzFactorization) else 1
    window = ["increment", "z"] if _banded(f) else ["increment"]
    for name in window:
        if width > 1 and name in new:
            parts[name] = encode_arrays(new[name])
        drop.append((t + 1 - width, name))
    if _banded(f):
        parts["prefix"] = encode_arrays(new["prefix"])
        drop.append((t - 1, "prefix"))
    else:
        uses = last_uses(f)
        if uses[t - 1] > t:
            parts["outputs"] = encode_arrays(new["outputs"])
        drop += [(s, "outputs") for s in range(1, t) if uses[s - 1] == t]
    return parts, [(s, p) for s, p in drop if 1 <= s < t]


def state_payload(book: Any, stream_id: str) -> int:
    """The bytes of the arrays a stream's book keeps now (without the containers' headers)."""
    total = 0
    for parts in book.stream_state(stream_id).values():
        for name, data in parts.items():
            if name == "format":
                continue
            total += sum(a.nbytes for a in decode_arrays(data).values())
    return total


__all__ = [
    "FORMAT",
    "Carry",
    "commit_parts",
    "decode",
    "decode_arrays",
    "encode",
    "encode_arrays",
    "load_carry",
    "state_payload",
]
