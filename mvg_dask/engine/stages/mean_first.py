"""The ``mean`` and ``covariance-about-mean`` stages: a centered covariance by the mean-first
route (docs/bounds.md, Sec. 14; docs/concepts/queries.md, "Centered covariance").

Step 1 releases the mean of the clipped records from the Gram pass's sums of ``fl(x - c)``
(``c`` the box's centre) with Gaussian noise under the key's ``mean`` sub-key; the plan of step
2 is made from it (:func:`~mvg_dask.plan.release_plan.resolve_about_mean`). Step 2 is a second
pass over the records, ``sum fl(x - centre) fl(x - centre)^T / N`` about the released mean
clamped into the box, plus the noise of step 2's plan under the ``release`` sub-key. A resumed
run repeats both steps: from the same key and data they give the same bytes.
"""

from __future__ import annotations

import numpy as np

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.lattice import square_release as lattice_square_release
from mvg_dask.engine.lattice import vector_release
from mvg_dask.engine.stages.context import RunContext, fill_column
from mvg_dask.engine.stages.covariance import covariance_noise
from mvg_dask.engine.stages.gram import finish_gram, submit_gram, wait_for_gram
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan import BoxDomain
from mvg_dask.plan.mean_first import MeanStep, centre_from_mean
from mvg_dask.plan.release_plan import ReleasePlan, resolve_about_mean
from mvg_dask.release_format import CENTRE, COVARIANCE, MEAN


def released_mean(step: MeanStep, sums: np.ndarray, records: int, key: NoiseKey) -> np.ndarray:
    """Step 1: ``c + (sum fl(x - c) / N + N(0, std^2 I))``, the noise on the lattice of the
    step (or in float), drawn under ``key``.

    Parameters
    ----------
    step : MeanStep
        The plan's mean step.
    sums : ndarray
        ``sum_r fl(x_r - c)`` as the Gram pass computed it (``m``).
    records : int
        ``N``.
    key : NoiseKey
        The step's key (the release key's ``mean`` sub-key).

    Returns
    -------
    ndarray
        The released mean (``m``).
    """
    f = np.asarray(sums, dtype=np.float64) / records
    if step.lattice is not None:
        about = vector_release(f, step.std, step.lattice, key)
    else:
        about = f + step.std * key.tile_normals(0, f.shape)
    return np.asarray(step.centre) + about


def run_mean(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``mean`` stage: waits for the Gram pass (of ``[fl(x - c); 1]``), releases the mean
    (:func:`released_mean`) into ``ctx.mean`` and returns the plan resolved about its centre.

    Parameters
    ----------
    ctx : RunContext
        The run (after its ``gram`` stage).
    rplan : ReleasePlan
        A mean-first plan.

    Returns
    -------
    ReleasePlan
        The plan with step 2's noise plan.
    """
    step = rplan.mean_first
    assert step is not None and isinstance(rplan.domain, BoxDomain)
    m = rplan.input.features
    sums = wait_for_gram(ctx, rplan)[:m, m]
    ctx.mean = released_mean(step, sums, rplan.input.records, ctx.key.derive("mean"))
    crash_point("mean")  # between the steps: nothing is written yet
    return resolve_about_mean(rplan, centre_from_mean(ctx.mean, rplan.domain))


def run_covariance_about_mean(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``covariance-about-mean`` stage: the skeleton, then a second Gram pass of the records
    shifted by the centre, plus step 2's noise, written with the mean and the centre.

    Parameters
    ----------
    ctx : RunContext
        The run (after its ``mean`` stage).
    rplan : ReleasePlan
        The resolved mean-first plan.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    assert ctx.mean is not None and isinstance(rplan.domain, BoxDomain)
    d = rplan.domain
    centre = centre_from_mean(ctx.mean, d)
    ctx.target.write_matrix_skeleton(rplan, COVARIANCE)  # no plan saved: a resume starts over
    crash_point("skeleton")
    plan, key = rplan.noise_plan(), ctx.key.derive("release")
    clipper = Clipper(
        "box",
        d.lower[:, None],
        d.upper[:, None],
        None,
        rplan.on_violation,
        False,
        centre,
        fill=fill_column(rplan),
    )
    clipped = ctx.clipped  # the second pass clips the values the first one did
    gram = finish_gram(ctx, rplan, submit_gram(ctx, rplan, clipper))
    ctx.clipped = clipped
    query = gram / rplan.input.records
    if rplan.noise_kind == "lattice":
        noisy = lattice_square_release(query, plan, key)
    else:
        noisy = query + covariance_noise(plan, key)
    ctx.target.write_matrix_values({MEAN: ctx.mean, CENTRE: centre, COVARIANCE: noisy})
    return rplan
