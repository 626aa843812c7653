"""The ``query`` stage: a query with no engine code of its own (the mean), released from the
Gram pass by its own blueprint.

The Gram tasks sum the query's ``partial`` with its ``combine`` (:func:`~mvg_dask.engine.stages.
gram.submit_gram`); this stage applies its ``finalize`` and adds the plan's rectangular noise
(``Sigma`` on the rows, drawn, or on the lattice as an identity release's is, the output's
columns in the place of records: :func:`~mvg_dask.engine.stages.cross.cross_covariance_release`),
then writes the query's ``output_variable`` (with a noisy record count: the noisy sum as its
``sum_variable`` and the ratio ``sum / count`` as the output, post-processing).
"""

from __future__ import annotations

import numpy as np

from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.cross import cross_covariance_release
from mvg_dask.engine.stages.gram import wait_for_gram
from mvg_dask.plan.release_plan import ReleasePlan

__all__ = ["run_query"]


def run_query(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``query`` stage: the skeleton (while the Gram pass runs), then the query's finalized
    value plus noise, written.

    Parameters
    ----------
    ctx : RunContext
        The run (after its ``gram`` stage, and its ``noisy-count`` stage when there is one).
    rplan : ReleasePlan
        The resolved plan.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    query = rplan.query
    name = query.output_variable
    assert name is not None, "the query stage writes a named output variable"
    ctx.target.write_matrix_skeleton(rplan, name, count=ctx.count)
    crash_point("skeleton")
    noisy = cross_covariance_release(rplan, ctx.key.derive("release"), wait_for_gram(ctx, rplan))
    shape = (query.shape[0],) if query.output_vector else query.shape
    noisy = np.reshape(noisy, shape)
    if ctx.count is None:
        ctx.target.write_matrix_values({name: noisy})
    else:
        ratio = noisy / max(ctx.count, 1.0)
        ctx.target.write_matrix_values({name: ratio, query.sum_variable: noisy})
    return rplan
