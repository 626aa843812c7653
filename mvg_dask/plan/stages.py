"""The stages of a release: which passes the engine runs, in order, as plan data.

A release plan (:class:`~mvg_dask.plan.release_plan.ReleasePlan`) carries its stages, a tuple
of the names below, in its ``stages`` field; the dry run prints them and the engine
(``mvg_dask.engine.stages``) walks them, one function per name. They follow from the plan alone
(query, neighbours, direction step, wide panels, noise kind), never from the data.

``noisy-count``
    The record count with Gaussian noise (add-remove neighbours without a public ``N0``).
``gram``
    One pass over the records: the Gram matrix ``X X^T`` of the clipped records, summed by a
    fixed tree (the query of a covariance, the input of DP-PCA).
``dp-pca``
    DP-PCA on the Gram matrix (Analyze Gauss): the directions of the noise.
``dp-pca-panels``
    DP-PCA of a wide release, panel by panel on the workers, without an ``m x m`` matrix.
``identity``
    Read, clip, add noise to and write every chunk of the records (the identity query).
``covariance``
    Add the noise to ``X X^T / N`` and write it (with a noisy count: also the noisy sum).
``moment``
    Add the noise to the augmented second moment ``Z Z^T / N`` (``z = [x - c; s]``) and write it
    with the mean and the covariance around it (centered-covariance and regression releases).
``mean``
    The mean-first route's step 1: the mean of the Gram pass's records with Gaussian noise; the
    covariance's noise plan is made from it (docs/bounds.md, Sec. 14).
``covariance-about-mean``
    Its step 2: a second pass summing ``(x - centre)(x - centre)^T`` about the released mean
    clamped into the box, plus noise, written with the mean.
``cross-covariance``
    Add the noise to the ``rows x cols`` block of ``X X^T / N`` and write it.
``query``
    Add the plan's (rectangular) noise to the query's own finalize of the Gram pass's total and
    write it as the query's output variable (with a noisy count: the noisy sum and the ratio);
    the stage of a query that needs no engine code of its own (the mean).
``covariance-panels``
    A wide covariance, one row panel of ``X X^T`` plus noise per task.
``low-rank-lattice-panels``
    A wide lattice covariance with DP-PCA's low-rank directions, in four passes over panels.
"""

from __future__ import annotations

from typing import Final, Protocol

NOISY_COUNT: Final = "noisy-count"
GRAM: Final = "gram"
DP_PCA: Final = "dp-pca"
DP_PCA_PANELS: Final = "dp-pca-panels"
IDENTITY: Final = "identity"
COVARIANCE: Final = "covariance"
MOMENT: Final = "moment"
COVARIANCE_PANELS: Final = "covariance-panels"
CROSS_COVARIANCE: Final = "cross-covariance"
MEAN: Final = "mean"
COVARIANCE_ABOUT_MEAN: Final = "covariance-about-mean"
LOW_RANK_LATTICE_PANELS: Final = "low-rank-lattice-panels"
QUERY: Final = "query"

#: every stage name, in the order they can run
STAGES: Final = (
    NOISY_COUNT,
    GRAM,
    DP_PCA,
    DP_PCA_PANELS,
    IDENTITY,
    COVARIANCE,
    MOMENT,
    MEAN,
    COVARIANCE_ABOUT_MEAN,
    CROSS_COVARIANCE,
    QUERY,
    COVARIANCE_PANELS,
    LOW_RANK_LATTICE_PANELS,
)


class StagedQuery(Protocol):
    """A query as :func:`release_stages` sees it (a :class:`~mvg_dask.plan.MatrixQuery`)."""

    def release_stages(
        self, *, noisy_count: bool, dp_pca: bool, panels: bool, lattice: bool
    ) -> tuple[str, ...]:
        """Its stages."""


def release_stages(
    query: StagedQuery,
    *,
    noisy_count: bool,
    dp_pca: bool,
    panels: bool,
    lattice: bool,
    mean_first: bool = False,
) -> tuple[str, ...]:
    """The stages a release runs, in order: the query type's own
    (``MatrixQuery.release_stages``; a query the engine does not run raises
    ``ValueError``), or the mean-first route's.

    Parameters
    ----------
    query : MatrixQuery
        The query.
    noisy_count : bool
        The release adds a noisy record count.
    dp_pca : bool
        DP-PCA chooses the directions at run time.
    panels : bool
        A covariance computed blockwise on the workers (``matrix_chunk``).
    lattice : bool
        Lattice noise.
    mean_first : bool, default False
        A centered covariance by the mean-first route.

    Returns
    -------
    tuple of str
        Stage names (see the module's description).
    """
    if mean_first:  # box, replace-one, fixed directions (the spec refuses the others)
        return (GRAM, MEAN, COVARIANCE_ABOUT_MEAN)
    return query.release_stages(
        noisy_count=noisy_count, dp_pca=dp_pca, panels=panels, lattice=lattice
    )
