"""The lattice release: what a floating-point-safe release rounds, adds and charges.

A release computed in floating point is private only if what it publishes is a function of a DP
value computed exactly (docs/lattice.md; the float error: docs/bounds.md, Sec. 11). A lattice
release computes the whitened query ``g = A^-1 f(X) B^-T`` in float64 (its lattice coordinates:
every entry, or ``vech_r`` for symmetric noise), rounds each coordinate to the public grid
``2^k`` (``h = rint(g / 2^k)``, an exact integer), adds integer noise ``K`` drawn exactly from
the *rounded Gaussian* of scale ``s = 2^-k`` (:mod:`mvg_dask.noise.lattice`), and publishes
``A (2^k (h + K)) B^T`` computed in float: public, deterministic post-processing of the exact
lattice value ``h + K``.

Because ``h + K = rint(h + s N)`` for an integer ``h`` and ``N ~ N(0, I)``, the release is
post-processing of the continuous Gaussian mechanism on ``h``, whose sensitivity in whitened
units is at most ``Delta_M + 2 E + 2^k sqrt(c)``: ``Delta_M`` the exact-arithmetic sensitivity
the plan proves, ``E`` the worst-case floating-point error of the computed whitened query
(:mod:`mvg_dask.privacy.float_error`), ``c`` the number of coordinates one record can move. The
plan calibrates so that this *effective sensitivity* is at most the release's Gaussian-DP ``mu``:
the ledger's Gaussian-DP accounting stays exact.

The grid is chosen from public numbers only: ``2^k <= 2^-20 mu / sqrt(c)`` (the rounding's share
of the sensitivity), but no finer than ``2^-8 E``, below which a finer grid only adds integer
range, never accuracy (the float error already exceeds it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

NoiseKind = Literal["lattice", "float"]
NOISE_KINDS: tuple[NoiseKind, ...] = ("lattice", "float")

#: The rounding's share of the release's ``mu``: ``2^k sqrt(c) <= GRID_SHARE * mu``.
GRID_SHARE = 2.0**-20
#: No grid finer than ``FLOAT_ERROR_GRID * E``.
FLOAT_ERROR_GRID = 2.0**-8
#: Largest lattice coordinate (``|h + K|``) the int64 arithmetic admits with room to spare. The
#: grid's floor ``FLOAT_ERROR_GRID * E`` keeps ``|g| / 2^k`` below it: ``E >= u sup |g|``.
LATTICE_RANGE = 2.0**61


@dataclass(frozen=True, kw_only=True)
class LatticeContext:
    """How the engine computes the query: what the floating-point error bound needs (metadata).

    Attributes
    ----------
    records : int
        A public upper bound on the number of records summed (``N`` under replace-one; a
        declared bound under add-remove, where ``N`` is private).
    depth : int
        The most floating-point additions a product term of the Gram sum passes through
        (``0`` for the identity query, which sums nothing).
    min_log2_grid : int or None
        The coarsest grid's floor a stream needs (its periods' integers are summed with
        weights: docs/guide/streams.md); ``None`` for a one-shot release.
    """

    records: int
    depth: int
    min_log2_grid: int | None = None

    def to_dict(self) -> dict[str, int]:
        """JSON-ready form (``min_log2_grid`` only when set: a stream's coarser grid)."""
        out = {"records": self.records, "depth": self.depth}
        if self.min_log2_grid is not None:
            out["min_log2_grid"] = self.min_log2_grid
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatticeContext:
        """Inverse of :meth:`to_dict`."""
        floor = data.get("min_log2_grid")
        return cls(
            records=int(data["records"]),
            depth=int(data["depth"]),
            min_log2_grid=None if floor is None else int(floor),
        )


@dataclass(frozen=True, kw_only=True)
class Lattice:
    """The lattice of one Gaussian step (the release, the DP-PCA step or the record count).

    Attributes
    ----------
    log2_grid : int
        ``k``: the grid is ``2^k`` in whitened units.
    coordinates : int
        ``c``: how many lattice coordinates one record can move.
    float_error : float
        ``E``: bound on the floating-point error of the computed whitened query (L2, whitened
        units).
    sensitivity : float
        ``Delta_M``: the exact-arithmetic sensitivity (whitened units).
    """

    log2_grid: int
    coordinates: int
    float_error: float
    sensitivity: float

    @property
    def grid(self) -> float:
        """``2^k``."""
        return math.ldexp(1.0, self.log2_grid)

    @property
    def scale(self) -> float:
        """The rounded Gaussian's scale in grid units: ``s = 1 / 2^k`` (unit noise)."""
        return math.ldexp(1.0, -self.log2_grid)

    @property
    def inflation(self) -> float:
        """``2 E + 2^k sqrt(c)``: what floating point and rounding add to the sensitivity."""
        return 2.0 * self.float_error + self.grid * math.sqrt(self.coordinates)

    @property
    def effective_sensitivity(self) -> float:
        """``Delta_M + 2 E + 2^k sqrt(c)``: the sensitivity of the lattice value ``h``."""
        return self.sensitivity + self.inflation

    @property
    def relative_inflation(self) -> float:
        """The inflation as a share of ``Delta_M``."""
        return self.inflation / self.sensitivity if self.sensitivity > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "log2_grid": self.log2_grid,
            "coordinates": self.coordinates,
            "float_error": self.float_error,
            "sensitivity": self.sensitivity,
            "effective_sensitivity": self.effective_sensitivity,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lattice:
        """Inverse of :meth:`to_dict`."""
        return cls(
            log2_grid=int(data["log2_grid"]),
            coordinates=int(data["coordinates"]),
            float_error=float(data["float_error"]),
            sensitivity=float(data["sensitivity"]),
        )

    def summary(self) -> str:
        """One line for the dry run."""
        return (
            f"lattice noise: grid 2^{self.log2_grid}, float error E <= {self.float_error:.3g}, "
            f"sensitivity inflated by {self.relative_inflation:.3g} of Delta_M "
            "(2 E + grid sqrt(c), charged)"
        )


def choose_log2_grid(mu: float, coordinates: int, float_error: float) -> int:
    """``k`` of the grid ``2^k`` for a step of Gaussian-DP ``mu`` (see the module text).

    Parameters
    ----------
    mu : float
        The step's ``mu`` (public).
    coordinates : int
        ``c``.
    float_error : float
        ``E``.

    Returns
    -------
    int
        ``floor(log2(max(GRID_SHARE mu / sqrt(c), FLOAT_ERROR_GRID E)))``.
    """
    if not (mu > 0 and coordinates >= 1 and float_error >= 0):
        raise ValueError(f"invalid lattice inputs mu={mu!r}, c={coordinates!r}, E={float_error!r}")
    target = max(GRID_SHARE * mu / math.sqrt(coordinates), FLOAT_ERROR_GRID * float_error)
    return math.floor(math.log2(target))


def gram_depth(records: int, chunk: int, chunks_per_task: int, fan_in: int) -> int:
    """Most additions a product term of the Gram sum passes through (its ``gamma_L``'s ``L``).

    The Gram pass computes, per stored chunk of at most ``chunk`` records, ``x @ x.T`` (each
    entry an inner product: one rounded product and at most ``chunk - 1`` additions), adds the
    chunk partials of a task in sequence (at most ``chunks_per_task - 1`` additions), then sums
    the task partials with a fixed tree of groups of at most ``fan_in`` (``fan_in - 1``
    additions per level, ``ceil(log_fan_in(tasks))`` levels).

    Parameters
    ----------
    records : int
        Records (a public upper bound).
    chunk : int
        Records per stored chunk.
    chunks_per_task : int
        Chunks per task at most.
    fan_in : int
        The tree's group size.

    Returns
    -------
    int
        ``L`` (the product's rounding counted as one).
    """
    tasks = max(1, -(-records // (chunk * chunks_per_task)))
    levels = 0
    while tasks > 1:
        tasks = -(-tasks // fan_in)
        levels += 1
    return chunk + chunks_per_task - 1 + (fan_in - 1) * levels


def canonical_gram_depth(
    records: int, block: int, blocks_per_task: int, fan_in: int, min_tasks: int
) -> int:
    """``L`` of the Gram pass over canonical record blocks (docs/bounds.md Sec. 11): an inner
    product over at most ``min(block, records)`` records, at most ``min(blocks_per_task, n) - 1``
    additions of block products in a task, and the tree's levels over at most
    ``max(ceil(n / blocks_per_task), min(n, min_tasks * blocks_per_task))`` tasks, ``n`` the
    number of blocks (a task takes fewer blocks where that keeps ``min_tasks`` tasks). Every
    term is nondecreasing in ``records``, so the depth of a public bound on the record count
    bounds that of every smaller count.

    Parameters
    ----------
    records : int
        Records (a public upper bound).
    block : int
        Records per canonical block.
    blocks_per_task : int
        Blocks per task wanted (at most).
    fan_in : int
        The tree's group size.
    min_tasks : int
        The tasks kept where there are that many blocks.

    Returns
    -------
    int
        ``L`` (the product's rounding counted as one).
    """
    blocks = max(1, -(-records // block))
    tasks = max(-(-blocks // blocks_per_task), min(blocks, min_tasks * blocks_per_task))
    levels = 0
    while tasks > 1:
        tasks = -(-tasks // fan_in)
        levels += 1
    return min(block, records) + min(blocks_per_task, blocks) - 1 + (fan_in - 1) * levels


def panel_inner_groups(records: int, group: int) -> int:
    """How many record groups a lattice panel task accumulates before folding them into its
    panel (about the square root of the number of groups): the panel's summation depth then
    grows like ``2 sqrt(records / group)``, not like ``records / group``."""
    groups = max(1, -(-records // group))
    return max(1, math.isqrt(groups - 1) + 1)


def panel_depth(records: int, group: int) -> int:
    """``L`` of a blocked (panel) Gram of a lattice release: the records are summed in canonical
    groups of ``group`` records (:class:`~mvg_dask.engine.records.PanelReads`, whatever the
    stored chunk grid), each group's product added to an inner accumulator (BLAS ``beta = 1``),
    which is folded into the panel every :func:`panel_inner_groups` groups. Nondecreasing in
    ``records``, so the depth of a public bound on the record count bounds every smaller
    count's."""
    per_group = min(group, records)
    groups = max(1, -(-records // group))
    inner = panel_inner_groups(records, group)
    return per_group + inner + -(-groups // inner)
