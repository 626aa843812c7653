"""The ``cross-covariance`` stage: the ``rows x cols`` block of the Gram pass's ``X X^T / N``,
privatized with rectangular noise (``Sigma`` on the rows, a fixed diagonal ``Psi`` on the
columns, ``I`` by default) on the client.

The block's entries are entries of the Gram the covariance release computes, by the same fixed
summation tree, so the lattice release's float-error bound is the Gram lemma on the block
(docs/bounds.md, Sec. 16). Lattice noise is drawn as an identity release's is, the output's
``m_b`` columns in the place of records (:class:`~mvg_dask.engine.lattice.RecordLattice`).
"""

from __future__ import annotations

import numpy as np

from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.lattice import RecordLattice
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.gram import wait_for_gram
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_format import CROSS_COVARIANCE

__all__ = ["cross_covariance_release", "run_cross_covariance"]


def cross_covariance_release(rplan: ReleasePlan, key: NoiseKey, gram: np.ndarray) -> np.ndarray:
    """The published ``m_a x m_b`` matrix: the query's block of ``gram`` (finalized by the
    query) plus the plan's noise.

    Parameters
    ----------
    rplan : ReleasePlan
        The resolved plan of a cross-covariance release.
    key : NoiseKey
        The release's ``release`` sub-key.
    gram : ndarray
        ``X X^T`` of the clipped records (every feature).

    Returns
    -------
    ndarray
        The privatized ``X_a X_b^T / N``.
    """
    plan = rplan.noise_plan()
    query = np.ascontiguousarray(rplan.query.finalize(gram), dtype=np.float64)
    if plan.lattice is None:
        return np.asarray(query + plan.draw(key, tile=rplan.tile_records))
    n = query.shape[1]
    lattice = RecordLattice.for_plan(plan)
    psi = plan.query.column_noise_variances
    if psi is None:  # Psi = I
        return lattice.release(query, key, 0, n, tile=rplan.tile_records, n_total=n)
    # Psi = diag(psi): the columns whitened first, fl(f_ij u_j) with u = fl(1 / fl(sqrt(psi)))
    # (the sequence CrossCovarianceQuery.float_error bounds), the rows by the record lattice,
    # and the published value's columns scaled back by fl(sqrt(psi)): post-processing
    d = np.sqrt(psi)
    whitened = np.ascontiguousarray(query * (1.0 / d)[None, :])
    rows = lattice.release(whitened, key, 0, n, tile=rplan.tile_records, n_total=n)
    return np.asarray(rows * d[None, :])


def run_cross_covariance(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``cross-covariance`` stage: the skeleton (while the Gram pass runs), then the block
    of the Gram plus noise, written.

    Parameters
    ----------
    ctx : RunContext
        The run (after its ``gram`` stage).
    rplan : ReleasePlan
        The resolved plan.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    ctx.target.write_matrix_skeleton(rplan, CROSS_COVARIANCE)
    crash_point("skeleton")
    gram = wait_for_gram(ctx, rplan)
    noisy = cross_covariance_release(rplan, ctx.key.derive("release"), gram)
    ctx.target.write_matrix_values({CROSS_COVARIANCE: noisy})
    return rplan
