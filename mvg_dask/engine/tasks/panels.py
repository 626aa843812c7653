"""Row-panel tasks of the blocked (wide) releases: a covariance panel privatized and written,
DP-PCA's noisy Gram panel, and a panel's product with the subspace iteration's ``Q``."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.records import PanelReads, ZarrMatrix
from mvg_dask.engine.store import Store
from mvg_dask.engine.tasks.outcome import (
    Outcome,
    read_marker,
    write_marker,
)
from mvg_dask.errors import MvgDaskError
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.covariance import CovarianceKind, NoiseCovariance, covariance_of

if TYPE_CHECKING:
    from mvg_dask.engine.lattice import StandardSquareLattice


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

    r0 = rows[0]
    target = Store(sink, storage_options)
    fs, marker = target.fs, target.chunk_marker(r0)
    done = read_marker(fs, marker)
    if done is not None:
        return Outcome(np.array([done["clipped"], done["records"]], dtype=np.int64))
    if fs.exists(target.abort_marker):
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
    write_marker(
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
