"""The keyed, counter-based CSPRNG every noise draw comes from.

A :class:`NoiseKey` holds a 128-bit AES key. Noise is produced on a canonical *tile grid*: tile
``t`` of a stream is drawn from ``AESCounter(key, counter = t * 2**64)``, so it depends only on the
key and ``t`` — never on Dask chunking, task order or retries. Independent purposes (the DP-PCA
step, the release noise) use sub-keys derived with HMAC-SHA256. The key is never printed: its
``repr`` shows only whether it is seeded.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from randomgen import AESCounter

_TILE_STRIDE = 1 << 64
_KEY_BITS = 128
_MASK64 = (1 << 64) - 1
#: Each thread keeps the bit generators of this many keys (the newest), repositioned per tile.
_KEPT_KEYS = 8
_kept = threading.local()


class NoiseKey:
    """A 128-bit AES-CTR key for noise generation.

    Parameters
    ----------
    key : int
        The key, ``0 <= key < 2**128``. Use :meth:`fresh` in production.
    seeded : bool, default False
        True when the key was derived from a user seed (reproducible, *not private*).

    Notes
    -----
    The key is deliberately absent from ``repr``/``str`` and from every serialised plan.
    """

    __slots__ = ("_key", "_seeded")

    def __init__(self, key: int, *, seeded: bool = False) -> None:
        if not 0 <= int(key) < 1 << _KEY_BITS:
            raise ValueError("a noise key must be a 128-bit non-negative integer")
        self._key = int(key)
        self._seeded = bool(seeded)

    @classmethod
    def fresh(cls) -> NoiseKey:
        """A new key from the operating system's CSPRNG (:mod:`secrets`)."""
        return cls(secrets.randbits(_KEY_BITS))

    @classmethod
    def from_seed(cls, seed: int) -> NoiseKey:
        """A reproducible key derived from ``seed``; flagged as not private.

        Parameters
        ----------
        seed : int
            Any integer.

        Returns
        -------
        NoiseKey
            ``seeded=True``.
        """
        digest = hashlib.sha256(b"mvg_dask/seed/" + str(int(seed)).encode()).digest()
        return cls(int.from_bytes(digest[:16], "big"), seeded=True)

    @classmethod
    def from_hex(cls, text: str, *, seeded: bool = False) -> NoiseKey:
        """Rebuild a key from :meth:`to_hex` (used only by the ledger's pending entry)."""
        return cls(int(text, 16), seeded=seeded)

    def to_hex(self) -> str:
        """The key as 32 hex digits. Only the ledger's 0600 pending entry may store this."""
        return f"{self._key:032x}"

    @property
    def seeded(self) -> bool:
        """True when derived from a user seed (not private)."""
        return self._seeded

    def derive(self, purpose: str) -> NoiseKey:
        """An independent sub-key for ``purpose`` (HMAC-SHA256 of the purpose under this key).

        Parameters
        ----------
        purpose : str
            A label such as ``"release"`` or ``"dp-pca"``.

        Returns
        -------
        NoiseKey
            The sub-key, with the same ``seeded`` flag.
        """
        mac = hmac.new(self._key.to_bytes(16, "big"), purpose.encode(), hashlib.sha256).digest()
        return NoiseKey(int.from_bytes(mac[:16], "big"), seeded=self._seeded)

    def generator(self, tile: int = 0) -> np.random.Generator:
        """A numpy Generator over tile ``tile`` of this key's counter space.

        Parameters
        ----------
        tile : int, default 0
            Tile index, ``0 <= tile < 2**64``; each tile owns ``2**64`` AES blocks.

        Returns
        -------
        numpy.random.Generator
            Backed by ``randomgen.AESCounter`` (AES-128-CTR, AES-NI when available).
        """
        if not 0 <= tile < _TILE_STRIDE:
            raise ValueError(f"tile index out of range: {tile}")
        from randomgen import AESCounter  # on first use: a dry run draws no noise

        return np.random.Generator(AESCounter(key=self._key, counter=tile * _TILE_STRIDE))

    def tile_bits(self, tile: int) -> AESCounter:
        """The bit generator of tile ``tile``: the same words as ``generator(tile)``'s, from
        this thread's own ``AESCounter`` of this key, moved to the tile's start.

        Building an ``AESCounter`` costs about 30 us (its key schedule), as much as drawing
        2,000 normals; moving a kept one to another counter costs about 5 us. The state set is
        the one a new generator of the tile starts in (the counter ``tile * 2^64`` and its next
        three, an empty output buffer), so the words are the same (checked by
        ``tests/test_lattice_sampler.py``).
        The generator is valid until this thread's next call for this key: a caller draws
        from it at once (a tile at a time), and anything that must outlive such a call (the
        exact path's side stream) uses :meth:`generator`.
        """
        if not 0 <= tile < _TILE_STRIDE:
            raise ValueError(f"tile index out of range: {tile}")
        bits, state = self._kept()
        base = tile * _TILE_STRIDE
        counter = [v for i in range(4) for v in ((base + i) & _MASK64, (base + i) >> 64)]
        bits.state = {
            **state,
            "s": {**state["s"], "counter": np.array(counter, dtype=np.uint64), "offset": 64},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return bits

    def _kept(self) -> tuple[AESCounter, dict[str, Any]]:
        """This thread's kept generator of this key and its initial state."""
        kept: dict[int, tuple[AESCounter, dict[str, Any]]] | None = getattr(_kept, "gens", None)
        if kept is None:
            kept = _kept.gens = {}
        entry = kept.get(self._key)
        if entry is None:
            if len(kept) >= _KEPT_KEYS:
                kept.pop(next(iter(kept)))
            from randomgen import AESCounter  # on first use, as in generator()

            bits = AESCounter(key=self._key, counter=0)
            entry = kept[self._key] = (bits, bits.state)
        return entry

    def round_keys(self) -> np.ndarray | None:
        """The AES-128 round keys of this key as ``randomgen`` expands them for AES-NI (22
        uint64, what :func:`mvg_dask.noise.aes.tile_words` encrypts with), or ``None`` when
        ``randomgen`` does not use AES-NI here."""
        bits, state = self._kept()
        return state["s"]["seed"] if bits.use_aesni else None

    def tile_normals(self, tile: int, shape: tuple[int, ...]) -> np.ndarray:
        """Standard normal draws of tile ``tile``, always generated whole and in C order."""
        return np.random.Generator(self.tile_bits(tile)).standard_normal(shape)

    def tile_lattice(self, tile: int, shape: tuple[int, ...], scale: float) -> np.ndarray:
        """Rounded-Gaussian integers ``floor(scale * N + 1/2)`` of tile ``tile``, drawn whole.

        See :func:`mvg_dask.noise.lattice.tile_rounded_gaussian` (exact law, int64, C order).
        """
        from mvg_dask.noise.lattice import tile_rounded_gaussian

        return tile_rounded_gaussian(self, tile, shape, scale)

    def __repr__(self) -> str:
        return f"NoiseKey(<hidden>, seeded={self._seeded})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        # pickled only to ship to dask workers of the same release; never written to an output
        return (NoiseKey, (self._key,), {"_seeded": self._seeded})

    def __setstate__(self, state: dict[str, bool]) -> None:
        self._seeded = state["_seeded"]
