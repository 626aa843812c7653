"""The release plan: a plain, serialisable value that says everything a release will do.

:func:`~mvg_dask.plan.planning.plan_release` is pure: from a validated spec and the input's
metadata (:class:`~mvg_dask.plan.input_metadata.InputMetadata`, read by the engine without
touching a chunk) it builds a :class:`ReleasePlan` — input and output references, the
record domain, the query, the budget shares, the ledger charge and either a complete
:class:`~mvg_dask.plan.noise_plan.NoisePlan` or, when DP-PCA chooses the directions, a pending
plan whose directions the engine fills in at run time (:meth:`ReleasePlan.resolve`). The engine
only executes a plan. A plan round-trips through :meth:`ReleasePlan.to_dict` /
:meth:`ReleasePlan.from_dict`; the output stores the public part, and resume and retry reload it.

Nothing in a plan depends on the data: it is byte-identical for neighbouring datasets (under
add-remove neighbours the record count is not part of the published form).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mvg_dask.noise.tiles import TILE_RECORDS
from mvg_dask.plan.budget import Allocation, StepBudgets
from mvg_dask.plan.directions import Directions
from mvg_dask.plan.domain import BoxDomain, Neighbours, RecordDomain
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.lattice import LatticeContext
from mvg_dask.plan.mean_first import MeanStep
from mvg_dask.plan.noise_plan import NoisePlan, build_noise_plan
from mvg_dask.plan.pending import PendingCentre, PendingDirections, PendingNoise
from mvg_dask.plan.plan_json import plan_fields, violation_dict
from mvg_dask.plan.queries import MatrixQuery
from mvg_dask.plan.release_parts import DpPcaStep, LedgerCharge
from mvg_dask.plan.stages import release_stages
from mvg_dask.privacy.registry import get_calibration
from mvg_dask.spec import SpecError


@dataclass(frozen=True, kw_only=True, eq=False)
class ReleasePlan:
    """A release, fully planned from its spec and the input's metadata.

    Attributes
    ----------
    release_id, name : str
        Identity of the release.
    created : str
        When the plan was made (ISO 8601, UTC): before any data is read.
    spec_hash : str
        Hash of the spec (recognises a resume).
    input : InputMetadata
        The input.
    output_store, output_storage_options : str, dict or None
        Where the release is written, and its fsspec options (not serialised).
    output_codec : {"none", "zstd", "lz4"}
        Compression of the released values.
    output_dtype : {"float64", "float32"}
        Stored dtype of an identity release's values (``auto`` resolved from the input's).
    matrix_chunk : int or None
        Features per chunk of a covariance computed blockwise on the workers (``None``: one).
    ledger : LedgerCharge or None
        The budget charge.
    query : MatrixQuery
        The query.
    domain : BoxDomain or L2BallDomain
        The declared record domain.
    on_violation, missing_fill : {"clip", "error"}, and float, tuple of float or None
        Values outside the domain; the public value(s) a NaN becomes (``None``: an error).
    epsilon, delta : float
        The total guarantee.
    neighbours : str
        Neighbouring relation.
    algorithm, calibration : str
        The mechanism.
    allocation : Allocation
        Precision allocation.
    budgets : StepBudgets
        The budget shares of the DP-PCA step, the noisy count and the release.
    dp_pca : DpPcaStep or None
        The direction step, when directions are chosen at run time.
    noise : NoisePlan or None
        The noise plan; ``None`` while DP-PCA's directions (or the mean-first centre) pend.
    tile_records : int
        Records per noise tile.
    noise_kind : {"lattice", "float"}
        How the noise is added (:mod:`mvg_dask.plan.lattice`).
    lattice_context : LatticeContext or None
        How the engine sums the query, for the float-error bound of a lattice release.
    stages : tuple of str
        The passes the engine runs, in order (:mod:`mvg_dask.plan.stages`), implied by the rest.
    mean_first : MeanStep or None
        The mean step of a centered covariance by the mean first (docs/bounds.md Sec. 14).
    """

    release_id: str
    name: str
    created: str
    spec_hash: str
    input: InputMetadata
    output_store: str
    output_storage_options: dict[str, Any] | None = None
    output_codec: str = "none"
    output_dtype: str = "float64"
    matrix_chunk: int | None = None
    ledger: LedgerCharge | None
    query: MatrixQuery
    domain: RecordDomain
    on_violation: str
    epsilon: float
    delta: float
    neighbours: str
    algorithm: str
    calibration: str
    allocation: Allocation
    budgets: StepBudgets
    dp_pca: DpPcaStep | None
    noise: NoisePlan | None
    tile_records: int = TILE_RECORDS
    noise_kind: str = "float"
    lattice_context: LatticeContext | None = None
    stages: tuple[str, ...] = ()
    mean_first: MeanStep | None = None
    missing_fill: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        implied = self.implied_stages()
        if not self.stages:
            object.__setattr__(self, "stages", implied)
        elif tuple(self.stages) != implied:
            raise ValueError(
                f"stages: this plan runs {', '.join(implied)}, not {', '.join(self.stages)}"
            )

    def implied_stages(self) -> tuple[str, ...]:
        """The stages the plan's fields imply (:func:`~mvg_dask.plan.stages.release_stages`)."""
        return release_stages(
            self.query,
            noisy_count=self.releases_count,
            dp_pca=self.uses_dp_pca,
            panels=self.matrix_chunk is not None,
            lattice=self.noise_kind == "lattice",
            mean_first=self.mean_first is not None,
        )

    # -- state -------------------------------------------------------------------------------
    @property
    def uses_dp_pca(self) -> bool:
        """True when DP-PCA picks the directions at run time."""
        return self.dp_pca is not None

    @property
    def releases_count(self) -> bool:
        """True when the release adds a noisy record count (add-remove, no public ``N0``)."""
        return self.budgets.count_share > 0

    @property
    def is_resolved(self) -> bool:
        """True when the noise plan is complete."""
        return self.noise is not None

    def build(self, directions: Directions) -> NoisePlan:
        """The noise plan for DP-PCA's ``directions``."""
        if not isinstance(pending := self.pending_noise(), PendingDirections):
            raise ValueError("this release has fixed directions; its noise plan is `noise`")
        return pending.resolve(directions)

    def resolve(self, directions: Directions) -> ReleasePlan:
        """This plan with DP-PCA's directions filled in."""
        return replace(self, noise=self.build(directions))

    def noise_plan(self) -> NoisePlan:
        """The complete noise plan (raises while it is pending)."""
        if self.noise is None:
            raise ValueError("the noise plan is pending until DP-PCA has chosen the directions")
        return self.noise

    # -- serialisation -----------------------------------------------------------------------
    def pending_noise(self) -> PendingNoise | None:
        """The noise plan waiting for DP-PCA's directions or the mean-first centre
        (:mod:`mvg_dask.plan.pending`); ``None`` for a noise plan the spec fixes."""
        if self.mean_first is not None:
            assert isinstance(self.domain, BoxDomain)
            return PendingCentre(
                query=self.query,
                box=self.domain,
                records=self.input.records,
                epsilon=self.epsilon,
                delta=self.delta,
                share=self.mean_first.share,
                algorithm=self.algorithm,  # type: ignore[arg-type]
                allocation=self.allocation,
                noise=self.noise_kind,  # type: ignore[arg-type]
                lattice_context=self.lattice_context,
            )
        if self.dp_pca is None:
            return None  # the directions the spec fixes
        return PendingDirections(
            query=self.query,
            domain=self.query.record_domain(self.domain),  # what one record contributes through
            neighbours=self.neighbours,  # type: ignore[arg-type]
            epsilon=self.epsilon,
            delta=self.delta,
            algorithm=self.algorithm,  # type: ignore[arg-type]
            calibration=self.calibration,  # type: ignore[arg-type]
            allocation=self.allocation,
            direction_share=self.budgets.share,
            count_share=self.budgets.count_share,
            noise=self.noise_kind,  # type: ignore[arg-type]
            lattice_context=self.lattice_context,
            k=self.dp_pca.k,
            low_rank=self.matrix_chunk is not None,  # a wide release keeps the top k
        )

    def public_noise_dict(self) -> dict[str, Any]:
        """The noise plan as published: while it waits, :meth:`pending_noise`'s form."""
        pending = self.pending_noise()
        return self.noise_plan().to_dict() if pending is None else pending.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (never a key, storage options or the ledger's location).

        ``plan`` is the noise plan as published (:meth:`public_noise_dict`); ``resolved`` is a
        DP-PCA release's complete one once its directions are known (curator side: data-dependent).
        """
        out: dict[str, Any] = {
            "release_id": self.release_id,
            "name": self.name,
            "created": self.created,
            "spec_hash": self.spec_hash,
            "input": self.input.to_dict(),
            "output": {
                "store": self.output_store,
                "codec": self.output_codec,
                "dtype": self.output_dtype,
                "matrix_chunk": self.matrix_chunk,
            },
            "ledger": None if self.ledger is None else self.ledger.to_dict(),
            **violation_dict(self.on_violation, self.missing_fill),
            "tile_records": self.tile_records,
            "stages": list(self.stages),
            "dp_pca": None if self.dp_pca is None else self.dp_pca.to_dict(),
            "plan": self.public_noise_dict(),
        } | ({} if self.mean_first is None else {"mean_first": self.mean_first.to_dict()})
        if (self.dp_pca is not None or self.mean_first is not None) and self.noise is not None:
            out["resolved"] = self.noise.to_dict()
        return out

    def public_dict(self) -> dict[str, Any]:
        """What the dry run prints and the output may carry: :meth:`to_dict` without anything
        that depends on the data. Under add-remove neighbours the record count, the input's shape
        and its record chunk size (which is the record count in a one-chunk store) are private."""
        out = self.to_dict()
        out.pop("resolved", None)
        if self.neighbours == "add-remove":  # N, the shape and the chunk grid tell N
            private = {"records": None, "shape": None, "record_chunk": None}
            out["input"] = {**out["input"], **private}
            if "cols_input" in out["input"]:
                out["input"]["cols_input"] |= private
        return out

    @classmethod
    def from_dict(
        cls,
        data: dict[str, Any],
        *,
        input_storage_options: dict[str, Any] | None = None,
        output_storage_options: dict[str, Any] | None = None,
        ledger_location: str | None = None,
        ledger_password_file: str | None = None,
    ) -> ReleasePlan:
        """Rebuild a plan from :meth:`to_dict` (the noise plan is recomputed and checked; the
        stages are checked, and implied when a plan saved without them is read back).

        Parameters
        ----------
        data : dict
            A plan dictionary.
        input_storage_options, output_storage_options : dict, optional
            fsspec options (not part of the serialised plan).
        ledger_location : str, optional
            The ledger's path or URL (required when the plan charges a ledger).
        ledger_password_file : str, optional
            The ledger's PostgreSQL password file.

        Returns
        -------
        ReleasePlan
            The plan.
        """
        return cls(
            input=InputMetadata.from_dict(data["input"], input_storage_options),
            output_storage_options=output_storage_options,
            **plan_fields(
                data, ledger_location=ledger_location, ledger_password_file=ledger_password_file
            ),
        )

    def check_seed(self, seed: int | None) -> None:
        """Refuse a user seed for a release charged to a privacy ledger.

        A seeded release is not private: its noise is a function of the seed, and a search over
        seeds recovers it (and so the data) from the output. A ledger is the data owner's account
        of what has been disclosed about a dataset, so such a release can be neither charged (the
        budget would claim a guarantee that does not hold) nor left out of it (the disclosure
        would be invisible). Seeds are for test and demo data, released without a ledger.

        Parameters
        ----------
        seed : int or None
            The seed of :func:`mvg_dask.api.release` (``--seed``).

        Raises
        ------
        SpecError
            When ``seed`` is given and the spec has a ledger.
        """
        if seed is None or self.ledger is None:
            return
        raise SpecError(
            f"seed: a seeded release is not private (its noise follows from the seed, which a "
            f"search over seeds recovers from the output), so it cannot be charged to the "
            f"privacy ledger of dataset {self.ledger.dataset!r}; release without a seed, or "
            "remove ledger from the spec for test or demo data"
        )

    # -- presentation ------------------------------------------------------------------------
    def declared_bounds_text(self) -> str | None:
        """What declared bounds above the proved ones cost (:func:`declared_bounds_text`)."""
        return declared_bounds_text(self)

    def summary(self) -> str:
        """Human-readable lines: input, output and the noise plan (:func:`plan_summary`)."""
        return plan_summary(self)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(self.summary()) + "</pre>"


def resolve_about_mean(rplan: ReleasePlan, centre: np.ndarray) -> ReleasePlan:
    """A mean-first plan with step 2's noise plan about ``centre`` (the released mean clamped
    into the box: public), made after step 1 as DP-PCA's plan is after its step.

    Parameters
    ----------
    rplan : ReleasePlan
        A plan with a ``mean_first`` step.
    centre : ndarray
        :func:`~mvg_dask.plan.mean_first.centre_from_mean` of the released mean.

    Returns
    -------
    ReleasePlan
        The resolved plan.
    """
    pending = rplan.pending_noise()
    assert isinstance(pending, PendingCentre)
    return replace(rplan, noise=pending.resolve(centre))


def plan_summary(rplan: ReleasePlan) -> str:
    """Human-readable lines: input, output and the noise plan.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    str
        The lines (the first one names the release, its input and its output).
    """
    inp = rplan.input
    records = "?" if rplan.neighbours == "add-remove" else str(inp.records)
    second = inp.cols_input
    variables = (
        ""
        if second is None
        else f" variables {inp.variable!r} ({inp.features} features) and {second.variable!r} "
        f"({second.features} features),"
    )
    head = (
        f"release {rplan.release_id}: {rplan.query.kind} of {inp.store}{variables} "
        f"({inp.features} features x {records} records) -> {rplan.output_store}"
    )
    declared = rplan.declared_bounds_text()
    tail = "" if declared is None else f"\n  {declared}"
    if rplan.mean_first is not None and rplan.noise is None:
        step = rplan.mean_first
        return (
            f"{head}\n  route mean-first: the mean with noise std {step.std:.4g} "
            f"({step.share:.0%} of the squared Gaussian-DP budget), then the covariance about "
            f"it, its noise planned after the mean; calibration {rplan.calibration}{tail}"
        )
    if rplan.dp_pca is None:
        return f"{head}\n{rplan.noise_plan().summary()}{tail}"
    assert rplan.dp_pca is not None
    return (
        f"{head}\n  directions by DP-PCA at run time ({rplan.budgets.share:.0%} of the budget, "
        f"{rplan.budgets.composition} composition); calibration {rplan.calibration}{tail}"
    )


def declared_bounds_text(rplan: ReleasePlan) -> str | None:
    """What declared bounds above the proved ones cost, in one line (``None``: none).

    A declared ``sensitivity`` (``gamma``, ``entry_range``) of a built-in query is at least the
    bound the record domain proves (smaller ones are refused by
    :func:`~mvg_dask.plan.planning.plan_release`) and is used as declared. With ``exact`` the
    noise grows by exactly ``declared s2 / proved s2`` (``Delta_M`` is scaled by that factor);
    with a paper calibration the factor is measured against the plan the proved bounds give (for
    fixed directions). A function of the spec and public metadata only.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    str or None
        The line, or ``None`` when no bound is declared above the proved one.
    """
    q, nb = rplan.query, rplan.neighbours
    domain = q.record_domain(rplan.domain)
    neighbours: Neighbours = "add-remove" if nb == "add-remove" else "replace-one"
    parts: list[str] = []
    drop: dict[str, None] = {}
    s2 = q.joint_l2_sensitivity(domain, neighbours)  # a grouped release's joint bound
    if q.sensitivity is not None and s2 is not None:
        parts.append(f"s2 = {q.sensitivity:.4g} (proved bound {s2:.4g})")
        drop["sensitivity"] = None
    gamma = q.proved_sup_frobenius(domain)
    uses = get_calibration(rplan.calibration)
    if q.gamma is not None and gamma is not None:
        unused = "" if uses.uses_gamma else f", not used by {rplan.calibration}"
        parts.append(f"gamma = {q.gamma:.4g} (proved bound {gamma:.4g}{unused})")
        drop["gamma"] = None
    span = q.proved_entry_range(domain)
    if q.entry_range is not None and span is not None:
        a, b = q.entry_range
        unused = "" if uses.uses_entry_range else f", not used by {rplan.calibration}"
        parts.append(
            f"entry range [{a:.4g}, {b:.4g}] (proved [{span[0]:.4g}, {span[1]:.4g}]{unused})"
        )
        drop["entry_range"] = None
    if not parts:
        return None
    text = "declared " + ", ".join(parts)
    factor: float | None = None
    if rplan.calibration == "exact":
        factor = q.sensitivity_excess(domain, neighbours)
    elif rplan.noise is not None and rplan.dp_pca is None:
        base = build_noise_plan(
            replace(q, **drop),  # type: ignore[arg-type]
            domain,
            epsilon=rplan.epsilon,
            delta=rplan.delta,
            algorithm=rplan.algorithm,  # type: ignore[arg-type]
            calibration=rplan.calibration,  # type: ignore[arg-type]
            directions=rplan.noise.directions,
            allocation=rplan.allocation,
            neighbours=neighbours,
            direction_share=rplan.budgets.share,
            count_share=rplan.budgets.count_share,
        )
        factor = float(np.max(rplan.noise.entry_std()) / np.max(base.entry_std()))
    if factor is None:
        return f"{text}: used as declared by {rplan.calibration}"
    return f"{text}: noise x{factor:.3g} against the proved bounds"
