"""The words of a tile's AES-CTR stream, computed with AES-NI in compiled code.

:meth:`mvg_dask.noise.rng.NoiseKey.generator` reads its words from ``randomgen``'s
``AESCounter``: word ``2 i`` and ``2 i + 1`` of tile ``t`` are the low and high 64 bits of the
AES-128 encryption of the 128-bit counter ``t 2^64 + i`` (little endian), under the round keys
``randomgen`` expands from the key. ``AESCounter.random_raw`` returns them one call per word,
four blocks encrypted at a time (about 2.2 ns a word); :func:`tile_words` encrypts eight
independent blocks per step with the same instructions (``aesenc``, ``aesenclast``), about
0.8 ns a word, and stores them straight into an array: the same words
(``tests/test_lattice_sampler.py`` compares them with ``random_raw``), hence the same noise.

This module imports numba: the sampler imports it only with its compiled kernel, and only when
the CPU has AES-NI (:func:`available`); otherwise it reads ``random_raw``.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from collections.abc import Callable
from typing import Any, cast

import numba
import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_V2 = ir.VectorType(_I64, 2)


@functools.cache
def available() -> bool:
    """True when this CPU (x86-64) has AES-NI and numba compiles for it, so the compiled
    encryption can run (numba compiling for another CPU, ``NUMBA_CPU_NAME``, needs ``+aes``
    in ``NUMBA_CPU_FEATURES``: LLVM would otherwise abort the process on the instruction)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    target = getattr(numba.config, "CPU_NAME", None)
    features = getattr(numba.config, "CPU_FEATURES", None) or ""
    if target and target != "host" and "+aes" not in features:
        return False
    import llvmlite.binding as llvm

    return bool(llvm.get_host_cpu_features().get("aes", False))


def _declare(module: ir.Module, name: str) -> ir.Function:
    try:
        found: ir.Function = module.get_global(name)
        return found
    except KeyError:
        return ir.Function(module, ir.FunctionType(_V2, [_V2, _V2]), name=name)


def _pair(builder: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    v = builder.insert_element(ir.Constant(_V2, ir.Undefined), lo, ir.Constant(_I32, 0))
    return builder.insert_element(v, hi, ir.Constant(_I32, 1))


@intrinsic
def _encrypt(typingctx: Any, lo: Any, hi: Any, rk: Any) -> Any:
    """AES-128 encryption of the block ``(lo, hi)`` (the two 64-bit halves, low first) under
    the round keys ``rk[0:22]`` (round ``r`` is ``(rk[2r], rk[2r + 1])``): ``(lo', hi')``."""
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64, rk)

    def codegen(context: Any, builder: ir.IRBuilder, signature: Any, args: Any) -> Any:
        lo_v, hi_v, rk_v = args
        enc = _declare(builder.module, "llvm.x86.aesni.aesenc")
        last = _declare(builder.module, "llvm.x86.aesni.aesenclast")
        data = context.make_array(signature.args[2])(context, builder, rk_v).data

        def key(r: int) -> ir.Value:
            a = builder.load(builder.gep(data, [ir.Constant(_I64, 2 * r)]))
            b = builder.load(builder.gep(data, [ir.Constant(_I64, 2 * r + 1)]))
            return _pair(builder, a, b)

        v = builder.xor(_pair(builder, lo_v, hi_v), key(0))
        for r in range(1, 10):
            v = builder.call(enc, [v, key(r)])
        v = builder.call(last, [v, key(10)])
        a = builder.extract_element(v, ir.Constant(_I32, 0))
        b = builder.extract_element(v, ir.Constant(_I32, 1))
        return context.make_tuple(builder, signature.return_type, [a, b])

    return sig, codegen


#: ``_encrypt`` as compiled code calls it (numba supplies the typing context).
_block = cast(Callable[[np.uint64, np.uint64, Any], tuple[np.uint64, np.uint64]], _encrypt)


@numba.njit(cache=True, nogil=True)
def _fill(
    rk: npt.NDArray[np.uint64], hi: np.uint64, block: np.uint64, out: npt.NDArray[np.uint64]
) -> None:
    """``out[2 i], out[2 i + 1]`` = the encryption of the counter ``(block + i, hi)``, eight
    independent blocks per step (the CPU overlaps their rounds); all counters unsigned."""
    n = out.shape[0] // 2
    i = 0
    while i + 8 <= n:
        for u in range(8):
            a, b = _block(block + np.uint64(i + u), hi, rk)
            out[2 * (i + u)] = a
            out[2 * (i + u) + 1] = b
        i += 8
    while i < n:
        a, b = _block(block + np.uint64(i), hi, rk)
        out[2 * i] = a
        out[2 * i + 1] = b
        i += 1


def tile_words(
    round_keys: npt.NDArray[np.uint64], tile: int, first: int, count: int
) -> npt.NDArray[np.uint64]:
    """Words ``[first, first + count)`` of tile ``tile``'s stream (``first`` even).

    Parameters
    ----------
    round_keys : ndarray
        The 22 uint64 of ``randomgen``'s expanded key (``AESCounter.state["s"]["seed"]``).
    tile : int
        Tile index, ``0 <= tile < 2**64`` (the counter's high half).
    first, count : int
        The words, ``first`` even and ``first + count <= 2**64``.

    Returns
    -------
    ndarray
        ``count`` uint64: what ``random_raw(count)`` returns after ``first`` words are read.
    """
    if first % 2 or first < 0 or count < 0 or (first + count + 1) // 2 >= 1 << 64:
        raise ValueError(f"words [{first}, {first + count}) are not a block-aligned range")
    out = np.empty(count + count % 2, dtype=np.uint64)
    _fill(round_keys, np.uint64(tile), np.uint64(first // 2), out)
    return out[:count]


_agreed: dict[bytes, bool] = {}


def agrees(round_keys: npt.NDArray[np.uint64], generator: Callable[[int], Any]) -> bool:
    """True when :func:`tile_words` gives the words of ``generator(tile).bit_generator`` for
    these round keys: checked once per key and process, on the first and the last tile (so a
    ``randomgen`` that laid its key out otherwise would be read through ``random_raw``, never
    draw other noise).

    Parameters
    ----------
    round_keys : ndarray
        The key's round keys.
    generator : callable
        ``NoiseKey.generator`` of the same key.

    Returns
    -------
    bool
        Whether the compiled words may be used for this key.
    """
    known = hashlib.sha256(round_keys.tobytes()).digest()  # no key kept in this process
    ok = _agreed.get(known)
    if ok is None:
        ok = all(
            np.array_equal(
                tile_words(round_keys, t, 0, 16), generator(t).bit_generator.random_raw(16)
            )
            for t in (0, 2**64 - 1)
        )
        _agreed[known] = ok
    return ok
