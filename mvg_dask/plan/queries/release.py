"""How a query is released: its stages, its output's layout and its dry-run line.

:class:`ReleasedQuery` holds the hooks every query type answers for the plan, the engine and the
readers (docs/concepts/queries.md, "How to add a query"), so that nothing outside
``mvg_dask/plan/queries/`` asks a query for its name: a hook a type does not answer raises (an
unknown or unreleasable query is an error, never a default).
"""

from __future__ import annotations

from typing import Any, ClassVar

from mvg_dask.plan import stages as st
from mvg_dask.plan.domain import RecordDomain

__all__ = ["ReleasedQuery"]


class ReleasedQuery:
    """The release side of a query type (a mixin of :class:`~mvg_dask.plan.MatrixQuery`)."""

    kind: ClassVar[str]
    #: Whether a wide output is computed blockwise, one row panel per task
    #: (``output.matrix_chunk``; the covariance).
    blocked_output: ClassVar[bool] = False
    #: Whether the released value is ``X X^T / N`` of the records themselves (the covariance):
    #: the accessor's covariance estimators take it as it is.
    second_moment: ClassVar[bool] = False
    #: The released variable holding the query's value (``None``: the input variable's name,
    #: the identity's one column per record).
    output_variable: ClassVar[str | None] = None
    #: The released variable carrying the plan's Gaussian noise when it is not
    #: ``output_variable`` (the moment queries' ``moment``; a noisy count's ``gram`` is
    #: the release's, not the query's).
    noisy_variable: ClassVar[str | None] = None
    #: The released variable holding the noisy sum when the release has a noisy record count
    #: (add-remove without a declared ``N0``; the output is then ``sum / count``).
    sum_variable: ClassVar[str] = "gram"
    #: Whether the output is one value per feature, a vector over the feature dimension
    #: (its value the ``m x 1`` query); otherwise a matrix over the feature dimension's row and
    #: column dimensions.
    output_vector: ClassVar[bool] = False
    #: The largest input (bytes) whose embedded cluster runs on threads in the releasing
    #: process, when below the release's default (``mvg_dask.api.IN_PROCESS_MAX_BYTES``):
    #: ``None`` keeps the default (docs/guide/performance.md, "Start-up").
    threads_max_bytes: ClassVar[int | None] = None

    def release_stages(
        self, *, noisy_count: bool, dp_pca: bool, panels: bool, lattice: bool
    ) -> tuple[str, ...]:
        """The stages a release of this query runs, in order (names of
        :mod:`mvg_dask.plan.stages`).

        Parameters
        ----------
        noisy_count : bool
            The release adds a noisy record count.
        dp_pca : bool
            DP-PCA chooses the directions at run time.
        panels : bool
            The output is computed blockwise on the workers (``matrix_chunk``).
        lattice : bool
            Lattice noise.

        Returns
        -------
        tuple of str
            Stage names.
        """
        raise ValueError(f"the {self.kind} query has no release stages: the engine does not run it")

    @staticmethod
    def gram_stages(last: str, *, noisy_count: bool, dp_pca: bool) -> tuple[str, ...]:
        """``[noisy-count,] gram, [dp-pca,] last``: a query summed by the Gram pass."""
        count = (st.NOISY_COUNT,) if noisy_count else ()
        return (*count, st.GRAM, *((st.DP_PCA,) if dp_pca else ()), last)

    def gram_pass(self) -> Any:
        """The query whose ``partial`` and ``combine`` the engine's Gram pass applies to the
        clipped records, block by canonical block, and along its fixed tree: this query, or
        another where the pass sums something else (DP-PCA's Gram of an identity release)."""
        return self

    def grouped_partial(self, block: Any, index: Any, into: Any = None) -> Any:
        """A grouped release's partial of a block of records, ``index`` each record's group
        (``-1``: dropped), added into the running sum ``into`` when given (a hook: a query
        that cannot be grouped refuses)."""
        raise ValueError(f"a {self.kind} query cannot be grouped")

    def trace_bound(self, domain: RecordDomain) -> float | None:
        """A public bound on the trace of the released matrix from the declared domain alone
        (the nuclear-norm projection's radius, :mod:`mvg_dask.plan.covariance_selection`);
        ``None``: the query has none."""
        return None

    @property
    def feature_sides(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The positions of the output's row features and column features when they are two
        chosen sets of the record's features (a cross-covariance: its output and its noise are
        labelled by them); ``None`` when the output is indexed by every feature (or record)."""
        return None

    def dry_run_text(self, rplan: Any) -> str:
        """The dry run's line saying what is released.

        Parameters
        ----------
        rplan : ReleasePlan
            The plan of a release of this query.

        Returns
        -------
        str
            One line.
        """
        raise ValueError(f"the {self.kind} query has no dry-run description: it is not released")

    @classmethod
    def check_matrix_chunk(cls, chunk: int | None, features: int) -> None:
        """Refuse an ``output.matrix_chunk`` the release cannot take (a hook: by default the
        output is assembled whole and ``matrix_chunk`` does not apply).

        Parameters
        ----------
        chunk : int or None
            The spec's ``output.matrix_chunk``.
        features : int
            ``M``, the input's features.
        """

    @classmethod
    def planned_fields(cls, domain: RecordDomain, features: int) -> dict[str, Any]:
        """Constructor fields the plan derives from the declared domain alone (a hook: none by
        default; the moment queries' constant term, centre and scale).

        Parameters
        ----------
        domain : BoxDomain or L2BallDomain
            The declared record domain.
        features : int
            ``M``, the input's features.

        Returns
        -------
        dict
            Keyword arguments of the type's constructor.
        """
        return {}
