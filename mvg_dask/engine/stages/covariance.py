"""The ``covariance`` stage: the whole ``m x m`` covariance, privatized on the client."""

from __future__ import annotations

import numpy as np

from mvg_dask.engine.lattice import square_release as lattice_square_release
from mvg_dask.engine.output import OutputTarget
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.gram import wait_for_gram
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan import NoisePlan
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_format import COVARIANCE, GRAM


def covariance_noise(plan: NoisePlan, key: NoiseKey) -> np.ndarray:
    """The noise a covariance release adds: symmetric noise, equi-modal noise averaged with its
    transpose (post-processing, docs/bounds.md Sec. 6) or unimodal noise — the plan's own draw
    (:meth:`NoisePlan.draw`), the one sampling path the experiments use too.

    Parameters
    ----------
    plan : NoisePlan
        The complete noise plan.
    key : NoiseKey
        The release's ``release`` sub-key.

    Returns
    -------
    ndarray
        The ``m x m`` noise.
    """
    return plan.draw(key)


def write_covariance_skeleton(
    target: OutputTarget, rplan: ReleasePlan, key: NoiseKey, count: float | None
) -> np.ndarray | None:
    """Write the covariance output's skeleton (:meth:`OutputTarget.write_matrix_skeleton`) and
    draw the float noise the release adds (``None`` for lattice noise, drawn with the query):
    functions of the resolved plan and the key only.

    Parameters
    ----------
    target : OutputTarget
        The output.
    rplan : ReleasePlan
        The resolved plan.
    key : NoiseKey
        The release key.
    count : float or None
        The noisy record count, when the release has one.

    Returns
    -------
    ndarray or None
        The noise.
    """
    target.write_matrix_skeleton(rplan, COVARIANCE, count=count)
    if rplan.noise_kind == "lattice":
        return None
    return covariance_noise(rplan.noise_plan(), key.derive("release"))


def write_covariance(
    target: OutputTarget,
    rplan: ReleasePlan,
    key: NoiseKey,
    gram: np.ndarray,
    noise: np.ndarray | None,
    count: float | None,
) -> None:
    """Privatize ``X X^T / N`` (``N`` public: replace-one, or a declared ``N0``) and write it;
    with a noisy count, write the noisy sum ``X X^T`` and the count, and their ratio as the
    covariance estimate (post-processing).

    Parameters
    ----------
    target : OutputTarget
        The output (its skeleton written by :func:`write_covariance_skeleton`).
    rplan : ReleasePlan
        The resolved plan.
    key : NoiseKey
        The release key.
    gram : ndarray
        ``X X^T`` of the clipped records.
    noise : ndarray or None
        From :func:`write_covariance_skeleton`.
    count : float or None
        The noisy record count, when the release has one.
    """
    query = rplan.query.finalize(gram)  # X X^T / N (or / N0)
    if noise is None:  # lattice noise
        noisy = lattice_square_release(query, rplan.noise_plan(), key.derive("release"))
    else:
        noisy = query + noise
    if count is None:
        target.write_matrix_values({COVARIANCE: noisy})
    else:
        target.write_matrix_values({COVARIANCE: noisy / max(count, 1.0), GRAM: noisy})


def run_covariance(ctx: RunContext, rplan: ReleasePlan) -> ReleasePlan:
    """The ``covariance`` stage: the skeleton and the noise (while a Gram pass without DP-PCA
    still runs), then the Gram pass's sum plus noise, written.

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
    noise = write_covariance_skeleton(ctx.target, rplan, ctx.key, ctx.count)
    gram = wait_for_gram(ctx, rplan)
    write_covariance(ctx.target, rplan, ctx.key, gram, noise, ctx.count)
    return rplan
