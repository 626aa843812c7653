"""What the stages of one run share: the client, the key, the output and what the run has done."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from distributed import Client, Future

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.output import OutputTarget
from mvg_dask.engine.records import PanelReads, StackedMatrix, ZarrLabels, ZarrMatrix
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan import BoxDomain
from mvg_dask.plan.release_plan import ReleasePlan


@dataclass(frozen=True)
class GramPass:
    """A submitted Gram pass: its leaf tasks (for progress) and the root of its reduction on
    the workers (``None``: the client sums the leaves).

    Attributes
    ----------
    leaves : list of Future
        One partial ``X X^T`` per task.
    root : Future or None
        The sum, when the workers reduce.
    """

    leaves: list[Future]
    root: Future | None


@dataclass
class RunContext:
    """One run of a release, as its stages see it.

    Attributes
    ----------
    client : distributed.Client
        Where to compute.
    key : NoiseKey
        The release key (each stage derives its own sub-key).
    target : OutputTarget
        The output.
    progress : bool
        Show progress bars.
    resume : bool
        The run resumes a pending release (chunks already written are skipped).
    read_started : bool
        Whether any chunk of the input has been read (a failure after a read stays charged).
    clipped : int
        Values clipped so far (curator side only: the ledger keeps it, no output does).
    count : float or None
        The noisy record count, once the ``noisy-count`` stage has run.
    gram_pass : GramPass or None
        The submitted Gram pass, once the ``gram`` stage has run.
    gram : ndarray or None
        Its sum ``X X^T``, once a later stage has waited for it.
    mean : ndarray or None
        The mean-first route's released mean, once its ``mean`` stage has run.
    """

    client: Client
    key: NoiseKey
    target: OutputTarget
    progress: bool = True
    resume: bool = False
    read_started: bool = False
    clipped: int = 0
    count: float | None = None
    gram_pass: GramPass | None = None
    gram: np.ndarray | None = None
    mean: np.ndarray | None = None

    def private_total(self, rplan: ReleasePlan) -> bool:
        """Whether the progress bars must hide their totals (a private record count)."""
        return rplan.neighbours == "add-remove"

    def normaliser(self, rplan: ReleasePlan) -> float:
        """What DP-PCA divides the Gram matrix by: the public ``N`` (or ``N0``), or the noisy
        count (at least 1)."""
        return rplan.query.records if self.count is None else max(self.count, 1.0)


def clipper_for(rplan: ReleasePlan) -> Clipper:
    """The block clipper of a plan's record domain.

    Parameters
    ----------
    rplan : ReleasePlan
        The plan.

    Returns
    -------
    Clipper
        Box or L2-ball clipping, with the plan's ``on_violation`` and ``missing`` fill (and,
        for a moment query, the Gram pass summing the augmented records).
    """
    d, aug = rplan.domain, rplan.query.augmented
    centre = getattr(rplan.query, "centre_vector", None)
    fill = fill_column(rplan)
    if isinstance(d, BoxDomain):
        lo, hi = d.lower[:, None], d.upper[:, None]
        field = "domain.box"
        if rplan.input.cols_input is not None:  # the stacked record [x; y]
            field = "domain.box or query.cross-covariance.cols.box"
        return Clipper("box", lo, hi, None, rplan.on_violation, aug, centre, field, fill)
    return Clipper("l2", None, None, d.radius, rplan.on_violation, aug, centre, fill=fill)


def fill_column(rplan: ReleasePlan) -> np.ndarray | None:
    """The plan's ``domain.missing`` fill as the clipper takes it (a column vector over the
    record the tasks read), or ``None`` (``missing: error``)."""
    if rplan.missing_fill is None:
        return None
    cols = rplan.input.cols_input  # the stacked [x; y]: one number fills both
    m = rplan.input.features + (0 if cols is None else cols.features)
    return np.broadcast_to(np.asarray(rplan.missing_fill, dtype=np.float64), (m,))[:, None].copy()


def source_of(rplan: ReleasePlan) -> ZarrMatrix:
    """The plan's input, as the tasks read it."""
    inp = rplan.input
    return ZarrMatrix(inp.store, inp.variable, inp.records_first, inp.storage_options)


def panel_reads(rplan: ReleasePlan) -> PanelReads:
    """How the panel tasks stream the input: every record, one stored chunk at a time, summed
    in canonical groups (the same groups whatever the chunk grid)."""
    return PanelReads(rplan.input.records, rplan.input.record_chunk)


def gram_source_of(rplan: ReleasePlan) -> ZarrMatrix | StackedMatrix:
    """What the Gram pass reads: the plan's input, or with a second variable ``Y`` (a
    two-variable cross-covariance) both, stacked ``[X_b; Y_b]`` per record range."""
    second = rplan.input.cols_input
    if second is None:
        return source_of(rplan)
    y = ZarrMatrix(second.store, second.variable, second.records_first, second.storage_options)
    return StackedMatrix(source_of(rplan), y)


def labels_of(rplan: ReleasePlan) -> ZarrLabels | None:
    """The group variable of a grouped release, as the Gram tasks read it (``None``: not
    grouped)."""
    q, inp = rplan.query, rplan.input
    if q.groups is None:
        return None
    assert q.group_variable is not None
    return ZarrLabels(inp.store, q.group_variable, q.groups, inp.storage_options)


def mark_aborted(target: OutputTarget) -> None:
    """Tell the release's remaining tasks to do nothing (they check before reading)."""
    target.progress().mark_aborted()
