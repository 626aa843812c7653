"""The ``moment`` stage: the augmented second moment ``Z Z^T / N`` of ``z = [x - c; s]``,
privatized on the client, written with the mean and the covariance around it
(post-processing). A grouped release privatizes every group's moment, each with its own noise
(docs/concepts/queries.md, "Grouped releases")."""

from __future__ import annotations

import numpy as np

from mvg_dask.engine.faults import crash_point
from mvg_dask.engine.lattice import square_release as lattice_square_release
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.covariance import covariance_noise
from mvg_dask.engine.stages.gram import wait_for_gram
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.queries.moment import (
    centered_from_moment,
    grouped_centered_from_moment,
    scale_constant,
)
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_format import COVARIANCE, MEAN, MOMENT


def run_moment(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``moment`` stage: the skeleton and the float noise (while a Gram pass without DP-PCA
    still runs), then ``Z Z^T / N`` plus noise, and the ``mean`` and ``covariance`` computed from
    the noisy moment (:func:`~mvg_dask.plan.queries.moment.centered_from_moment`), written.

    A grouped release (``group_by``) privatizes each group's ``M_g = Z_g Z_g^T / N`` with the
    same noise plan and the independent key ``release / group-<i>`` (``i`` the group's position
    among the declared labels); its ``mean`` and ``covariance`` divide by the group's noisy share
    ``M_g[m, m]`` (:func:`~mvg_dask.plan.queries.moment.grouped_centered_from_moment`).

    Parameters
    ----------
    ctx : RunContext
        The run (after its ``gram`` stage, whose pass sums the augmented records).
    rplan : ReleasePlan
        The resolved plan of a centered-covariance or regression release.

    Returns
    -------
    ReleasePlan
        ``rplan``.
    """
    ctx.target.write_matrix_skeleton(rplan, MOMENT)
    crash_point("skeleton")
    release_key = ctx.key.derive("release")
    groups = rplan.query.groups
    centre = getattr(rplan.query, "centre_vector", None)
    scale = getattr(rplan.query, "scale", 1.0)
    if groups is None:
        noise = _float_noise(rplan, release_key)
        noisy = _privatize(rplan, _moment(ctx, rplan, scale), release_key, noise)
        mean, covariance = centered_from_moment(noisy, centre, scale)
    else:
        keys = [release_key.derive(f"group-{i}") for i in range(len(groups))]
        noises = [_float_noise(rplan, key) for key in keys]
        query = _moment(ctx, rplan, scale)
        noisy = np.stack(
            [
                _privatize(rplan, query[i], key, n)
                for i, (key, n) in enumerate(zip(keys, noises, strict=True))
            ]
        )
        mean, covariance = grouped_centered_from_moment(noisy, centre, scale)
    ctx.target.write_matrix_values({MOMENT: noisy, MEAN: mean, COVARIANCE: covariance})
    return rplan


def _moment(ctx: RunContext, rplan: ReleasePlan, scale: float) -> np.ndarray:
    """The exact query: the Gram pass's sums of ``[x - c; 1]`` divided by ``N``, the constant
    coordinate then scaled to ``s`` (a power of two: exactly the moment of ``[x - c; s]``,
    :func:`~mvg_dask.plan.queries.moment.scale_constant`)."""
    return scale_constant(rplan.query.gram_pass().finalize(wait_for_gram(ctx, rplan)), scale)


def _float_noise(rplan: ReleasePlan, key: NoiseKey) -> np.ndarray | None:
    """The float noise of one moment (``None`` for lattice noise, drawn with the value)."""
    return None if rplan.noise_kind == "lattice" else covariance_noise(rplan.noise_plan(), key)


def _privatize(
    rplan: ReleasePlan, query: np.ndarray, key: NoiseKey, noise: np.ndarray | None
) -> np.ndarray:
    """One moment plus its noise: exactly a lattice point (lattice noise), or ``query +
    noise``."""
    if noise is None:
        return lattice_square_release(query, rplan.noise_plan(), key)
    return query + noise
