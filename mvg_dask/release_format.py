"""The release format in one place: names, dimensions, completeness and the progress directory.

A release is a Zarr v3 group that xarray reads (:mod:`mvg_dask.engine.output` writes it; the
accessor, :mod:`mvg_dask.interactive` and the engine's resume read it). Everything a writer and
a reader must agree on is named here, and only here:

* the attribute prefix :data:`PREFIX` and every attribute a release carries (:data:`ATTRS`,
  :func:`attr`);
* the variables it writes (:data:`COVARIANCE`, :data:`GRAM`, :data:`RECORD_COUNT`, the noise
  description :data:`ROW_COV`, :data:`COL_COV`, :data:`DIRECTIONS`, :data:`NOISE_VARIANCES`,
  :data:`SYMMETRIC_RATIO`, :data:`DP_PCA_EIGENVALUES`);
* the dimensions of square outputs (:func:`dims_for` builds ``{feature}_row``/``{feature}_col``,
  :func:`feature_dim` parses the feature dimension back) and of the directions
  (:data:`DIRECTION_DIM`, :data:`COMPONENT_DIM`);
* whether a release is complete (:func:`is_complete`, :func:`check_complete`);
* which variable carries the plan's Gaussian noise (:func:`gaussian_variable`);
* how stored DP-PCA directions are read back (:func:`stored_directions`);
* the progress directory of an output being written: per-chunk markers, the abort marker, the
  saved plan, the claim and scratch groups (:class:`ProgressLog`).

This module imports the standard library and numpy only (an import-linter contract holds it):
the dry run's checks and any reader can use it without dask, zarr or xarray.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask.errors import IncompleteReleaseError

if TYPE_CHECKING:
    from mvg_dask.plan.directions import Directions
    from mvg_dask.plan.queries import MatrixQuery

__all__ = [
    "ABORT_FILE",
    "ATTRS",
    "CENTRE",
    "CLAIM_FILE",
    "COL_COV",
    "COMPLETE",
    "COMPONENT_DIM",
    "CONSTANT_TERM",
    "COVARIANCE",
    "CROSS_COVARIANCE",
    "CROSS_COVARIANCE_QUERY",
    "DIRECTIONS",
    "DIRECTION_DIM",
    "DP_PCA_EIGENVALUES",
    "GRAM",
    "GROUP_DIM",
    "INCOMPLETE",
    "INPUT_VARIABLE_ATTR",
    "KEEP_FILE",
    "MEAN",
    "MEAN_STEP_ATTR",
    "MOMENT",
    "NOISE_MATRICES",
    "NOISE_VARIANCES",
    "PLAN_ATTR",
    "PLAN_FILE",
    "PREFIX",
    "PROGRESS_DIR",
    "QUERY_ATTR",
    "RECORD_COUNT",
    "RELEASE_ID_ATTR",
    "ROUTE_ATTR",
    "ROW_COV",
    "SEEDED_ATTR",
    "STATUS_ATTR",
    "SYMMETRIC_RATIO",
    "TARGET_ATTR",
    "TERM_DIM",
    "ProgressLog",
    "attr",
    "check_complete",
    "cross_col_noise_dims",
    "cross_noise_dims",
    "describe",
    "dims_for",
    "feature_dim",
    "gaussian_variable",
    "is_complete",
    "provenance_attrs",
    "released_query_type",
    "released_variable",
    "stored_directions",
]

# -- attributes ---------------------------------------------------------------------------------
#: The prefix of every attribute a release writes on its root group.
PREFIX = "mvg_dask_"
#: Every provenance attribute a release carries (without the prefix), in writing order.
ATTRS = (
    "release_id",
    "name",
    "version",
    "created",
    "query",
    "algorithm",
    "calibration",
    "epsilon",
    "delta",
    "neighbours",
    "sensitivity",
    "gamma",
    "mahalanobis_sensitivity",
    "precision_budget",
    "composition",
    "noise",
    "lattice_log2_grid",
    "record_domain",
    "on_violation",
    "missing",
    "seeded",
    "seeded_note",
    "tile_records",
    "input_store",
    "input_variable",
    "plan",
    "target",
    "route",
    "mean_step",
)


def attr(name: str) -> str:
    """The attribute ``name`` as a release stores it (with :data:`PREFIX`).

    Examples
    --------
    >>> attr("status")
    'mvg_dask_status'
    """
    return f"{PREFIX}{name}"


#: The release's status: :data:`INCOMPLETE` while it is written, :data:`COMPLETE` from its last
#: metadata write on.
STATUS_ATTR = attr("status")
#: The release id.
RELEASE_ID_ATTR = attr("release_id")
#: The public noise plan, a JSON string.
PLAN_ATTR = attr("plan")
#: The query kind: ``identity``, ``covariance``, ``centered-covariance`` or ``regression``.
QUERY_ATTR = attr("query")
#: A regression release's target: the label (or position) of the response feature.
TARGET_ATTR = attr("target")
#: A centered covariance's route when it is ``mean-first`` (absent for the moment route).
ROUTE_ATTR = attr("route")
#: The mean-first route's mean step (JSON: its share, ``mu``, sensitivity, std, lattice).
MEAN_STEP_ATTR = attr("mean_step")
#: The input's variable: the name of an identity release's privatized variable.
INPUT_VARIABLE_ATTR = attr("input_variable")
#: True for noise derived from a user seed (reproducible, not private).
SEEDED_ATTR = attr("seeded")
#: The status of a complete release.
COMPLETE = "complete"
#: The status of a release being written (or one that stopped).
INCOMPLETE = "incomplete"


def provenance_attrs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The root attributes of ``values`` (named as in :data:`ATTRS`): prefixed, in the order
    of :data:`ATTRS`, ``None`` values left out."""
    return {attr(name): values[name] for name in ATTRS if values[name] is not None}


# -- variables and dimensions ---------------------------------------------------------------------
#: A covariance release's privatized matrix.
COVARIANCE = "covariance"
#: A cross-covariance release's privatized matrix ``X_rows X_cols^T / N`` (``m_a x m_b``, dims
#: ``{feature}_row`` and ``{feature}_col``, their coordinates the row and the column labels).
CROSS_COVARIANCE = "cross_covariance"
#: The query kind (:data:`QUERY_ATTR`) of a cross-covariance release.
CROSS_COVARIANCE_QUERY = "cross-covariance"
#: The noisy sum ``X X^T + noise`` beside ``covariance`` when the release has a noisy count.
GRAM = "gram"
#: The noisy record count (add-remove covariance releases).
RECORD_COUNT = "record_count"
#: The noise's row covariance ``Sigma`` (``m x m``).
ROW_COV = "row_cov"
#: The noise's column covariance (equi-modal and symmetric noise; a cross-covariance's ``Psi``,
#: ``m_b x m_b`` over its column features, when its column allocation makes ``Psi != I``).
COL_COV = "col_cov"
#: The noise's directions ``W`` (``m x m``), or DP-PCA's top ``k`` (``m x k``).
DIRECTIONS = "directions"
#: The noise variance of each direction.
NOISE_VARIANCES = "noise_variances"
#: The off-diagonal variance ratio of a symmetric published noise ``B S B^T``.
SYMMETRIC_RATIO = "symmetric_ratio"
#: DP-PCA's noisy eigenvalues.
DP_PCA_EIGENVALUES = "dp_pca_eigenvalues"
#: The noise-description matrices (``m x m``, ``directions`` ``m x k``).
NOISE_MATRICES = (ROW_COV, COL_COV, DIRECTIONS)
#: The dimension of the noise's directions: the columns of a square ``directions`` (``m x m``)
#: and the entries of ``noise_variances`` (one variance per direction), and of
#: ``dp_pca_eigenvalues`` beside a square ``directions``.
DIRECTION_DIM = "direction"
#: The dimension of a low-rank ``directions`` (``m x k``, DP-PCA's top ``k`` of a wide, blocked
#: release) and of its ``dp_pca_eigenvalues``. It is not :data:`DIRECTION_DIM` because
#: ``noise_variances`` keeps that dimension with another length (the top ``k`` and their
#: complement's one variance).
COMPONENT_DIM = "component"
#: The second moment ``Z Z^T / N`` of the augmented records ``z = [x - c; s]`` (centered-covariance
#: and regression releases): the variable that carries their Gaussian noise.
MOMENT = "moment"
#: The mean ``M[:m, m]`` beside :data:`MOMENT` (post-processing).
MEAN = "mean"
#: The mean-first route's centre: the released mean clamped into the box (a noisy, public
#: value; the covariance is the second moment about it).
CENTRE = "centre"
#: The dimension of the augmented record's terms (the features and the constant): the axes of
#: :data:`MOMENT` and of the noise description of a moment release.
TERM_DIM = "term"
#: The label of the augmented record's constant term.
CONSTANT_TERM = "1"
#: The dimension of a grouped release's groups (``group_by``): the first axis of
#: :data:`MOMENT`, :data:`MEAN` and :data:`COVARIANCE`, its coordinate the declared labels.
GROUP_DIM = "group"

#: The fixed names of a release's output variables and dimensions. An input dimension may not
#: take one (its coordinate or its axes would clash with them in the output); the queries'
#: own output variables are added where the input is checked
#: (:func:`mvg_dask.engine.metadata.check_dimension_names`).
OUTPUT_NAMES = frozenset(
    [
        COVARIANCE,
        CROSS_COVARIANCE,
        GRAM,
        RECORD_COUNT,
        ROW_COV,
        COL_COV,
        DIRECTIONS,
        NOISE_VARIANCES,
        SYMMETRIC_RATIO,
        DP_PCA_EIGENVALUES,
        MOMENT,
        MEAN,
        CENTRE,
        DIRECTION_DIM,
        COMPONENT_DIM,
        TERM_DIM,
        GROUP_DIM,
    ]
)

_ROW_SUFFIX, _COL_SUFFIX = "_row", "_col"


def dims_for(feature: str) -> tuple[str, str]:
    """The two dimensions of a square (``m x m``) output over the feature dimension ``feature``.

    Examples
    --------
    >>> dims_for("feature")
    ('feature_row', 'feature_col')
    """
    return f"{feature}{_ROW_SUFFIX}", f"{feature}{_COL_SUFFIX}"


def cross_noise_dims(feature: str) -> tuple[str, str]:
    """The dimensions of a cross-covariance's noise matrices (``row_cov``, ``m_a x m_a``, over
    the row features on both sides): the output's row dimension and a second one, so that no
    dimension takes two lengths (the output's columns are ``m_b`` other features).

    Examples
    --------
    >>> cross_noise_dims("feature")
    ('feature_row', 'feature_row2')
    """
    rows = dims_for(feature)[0]
    return rows, f"{rows}2"


def cross_col_noise_dims(feature: str) -> tuple[str, str]:
    """The dimensions of a cross-covariance's column covariance ``col_cov`` (``Psi``,
    ``m_b x m_b``, published when ``Psi != I``): the output's column dimension and a second one.

    Examples
    --------
    >>> cross_col_noise_dims("feature")
    ('feature_col', 'feature_col2')
    """
    cols = dims_for(feature)[1]
    return cols, f"{cols}2"


def feature_dim(dims: Sequence[Hashable]) -> str:
    """The feature dimension of a square output's dimensions (as :func:`dims_for` names them).

    Examples
    --------
    >>> feature_dim(("feature_row", "feature_col"))
    'feature'
    """
    return str(dims[0]).removesuffix(_ROW_SUFFIX)


# -- reading ------------------------------------------------------------------------------------
def is_complete(attrs: Mapping[str, Any], release_id: str | None = None) -> bool:
    """True when root attributes ``attrs`` are those of a complete release (of ``release_id``,
    when given)."""
    if attrs.get(STATUS_ATTR) != COMPLETE:
        return False
    return release_id is None or attrs.get(RELEASE_ID_ATTR) == release_id


def check_complete(attrs: Mapping[str, Any]) -> None:
    """Refuse the root attributes of anything but a complete release.

    Raises
    ------
    IncompleteReleaseError
        Naming the status found.
    """
    if not is_complete(attrs):
        status = attrs.get(STATUS_ATTR)
        raise IncompleteReleaseError(f"not a complete mvg_dask release (status: {status!r})")


def describe(attrs: Mapping[str, Any], *, status: bool = True) -> str:
    """What a store with root attributes ``attrs`` holds, for a refusal's message: a release (and
    its status unless complete, when ``status``), or other data."""
    rid = attrs.get(RELEASE_ID_ATTR)
    if not rid:
        return "data that is not an mvg_dask release"
    if not status or attrs.get(STATUS_ATTR) == COMPLETE:
        return f"release {rid!r}"
    return f"release {rid!r}, {attrs.get(STATUS_ATTR)}"


def released_query_type(attrs: Mapping[str, Any]) -> type[MatrixQuery]:
    """The query type of a release (its :data:`QUERY_ATTR`; ``ValueError`` for a name that is
    not a registered query: a reader never guesses).

    Parameters
    ----------
    attrs : mapping
        The release's root attributes.

    Returns
    -------
    type
        The :class:`~mvg_dask.plan.MatrixQuery` subclass.
    """
    from mvg_dask.plan.queries import query_type

    return query_type(attrs.get(QUERY_ATTR))  # type: ignore[arg-type]


def released_variable(attrs: Mapping[str, Any]) -> str:
    """The query's output: its type's ``output_variable`` (:data:`COVARIANCE` of a covariance,
    centered-covariance or regression release, :data:`CROSS_COVARIANCE`...), or an identity
    release's input variable; ``ValueError`` for a release of an unknown query."""
    name = released_query_type(attrs).output_variable
    return str(attrs[INPUT_VARIABLE_ATTR]) if name is None else name


def gaussian_variable(attrs: Mapping[str, Any], variables: Collection[Hashable]) -> str:
    """The released variable whose noise is the plan's Gaussian noise: the query type's
    ``sum_variable`` (:data:`GRAM` of a covariance) when the release has a noisy record count
    (the output is then a ratio of two noisy values),
    the query type's ``noisy_variable`` (:data:`MOMENT` for a moment query: ``mean`` and
    ``covariance`` are derived from it), else :func:`released_variable`.

    Parameters
    ----------
    attrs : mapping
        The release's root attributes.
    variables : collection
        The names of its variables.
    """
    qtype = released_query_type(attrs)
    if qtype.sum_variable in variables and RECORD_COUNT in variables:
        return qtype.sum_variable
    noisy = qtype.noisy_variable
    if noisy is not None and noisy in variables:
        return noisy
    return released_variable(attrs)


def stored_directions(release: Mapping[Any, Any], public: Mapping[str, Any]) -> Directions:
    """DP-PCA directions read back from a release: its noisy :data:`DIRECTIONS` and (if there)
    :data:`DP_PCA_EIGENVALUES` variables, the important ones the first ``k`` of its public plan.

    Parameters
    ----------
    release : mapping
        The release's variables by name (an ``xarray.Dataset``, or arrays).
    public : mapping
        The release's public plan (:data:`PLAN_ATTR` decoded).

    Returns
    -------
    Directions
        ``dp-pca`` directions.
    """
    from mvg_dask.plan.directions import Directions

    k = len(public["directions"]["important"])
    eigenvalues = release[DP_PCA_EIGENVALUES] if DP_PCA_EIGENVALUES in release else None
    return Directions(
        "dp-pca",
        np.asarray(release[DIRECTIONS], dtype=np.float64),
        tuple(range(k)),
        None if eigenvalues is None else np.asarray(eigenvalues, dtype=np.float64),
    )


# -- the progress directory ---------------------------------------------------------------------
#: An output store's progress directory (completion markers, the saved plan, the claim, scratch
#: groups), removed at the commit.
PROGRESS_DIR = ".mvg_dask_progress"
#: The object an object-store output is claimed with, in the progress directory.
CLAIM_FILE = "claim"
#: The marker that tells the remaining tasks of a failed release to do nothing.
ABORT_FILE = "ABORT"
#: The plan a resumable release saves for a resume.
PLAN_FILE = "plan.json"
#: An object store has no directories: this key keeps the progress directory.
KEEP_FILE = ".keep"


class ProgressLog:
    """The progress directory of an output being written, ``{root}/.mvg_dask_progress``.

    It holds a marker per written chunk (``{start}.json``), the abort marker, the saved plan, the
    claim of an object-store output and scratch Zarr groups; the commit and an abort remove it.
    Paths are plain strings under ``root``; the methods that read or write take an fsspec
    filesystem ``fs`` (the caller's: this module imports none).

    Parameters
    ----------
    root : str
        The output's location being written (a path or URL, as the filesystem ``fs`` names it).
    fs : fsspec.AbstractFileSystem, optional
        Needed by the methods that read or write.
    local : bool
        True for a local filesystem (the plan is written to a temporary file renamed into place).
    """

    def __init__(self, root: str, fs: Any = None, *, local: bool = False) -> None:
        self.root = root.rstrip("/")
        self.fs = fs
        self.local = local

    @property
    def path(self) -> str:
        """The progress directory."""
        return f"{self.root}/{PROGRESS_DIR}"

    def entry(self, name: str) -> str:
        """The path of ``name`` in the progress directory (a scratch group's, for one)."""
        return f"{self.path}/{name}"

    def chunk_marker(self, start: int) -> str:
        """The marker that says the chunk (or panel) starting at ``start`` is written."""
        return self.entry(f"{start}.json")

    @property
    def abort_marker(self) -> str:
        """The marker that tells the remaining tasks of a failed release to do nothing."""
        return self.entry(ABORT_FILE)

    @property
    def claim_file(self) -> str:
        """The claim of an object-store output."""
        return self.entry(CLAIM_FILE)

    @property
    def plan_file(self) -> str:
        """The plan saved for a resume."""
        return self.entry(PLAN_FILE)

    # -- reading and writing (with ``fs``) --------------------------------------------------------
    def make(self) -> None:
        """Create the directory (on an object store, a key that keeps it)."""
        self.fs.makedirs(self.path, exist_ok=True)
        if not self.local:
            self.fs.pipe_file(self.entry(KEEP_FILE), b"")

    def remove(self, name: str | None = None) -> None:
        """Remove the directory, or its entry ``name``, if there."""
        path = self.path if name is None else self.entry(name)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def claim(self, release_id: str) -> str | None:
        """Claim the output for ``release_id`` unless claimed (a conditional PUT). Returns the
        owner: ``release_id`` when the claim is (now) ours, another id, or ``None`` when the
        claim was removed meanwhile (by its owner's commit or abort)."""
        try:
            self.fs.pipe_file(self.claim_file, release_id.encode(), mode="create")
            return release_id
        except FileExistsError:
            pass
        return self.claim_owner()

    def claim_owner(self) -> str | None:
        """The release id that claimed the output, if any."""
        try:
            return bytes(self.fs.cat_file(self.claim_file)).decode()
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def restore_claim(self, release_id: str) -> None:
        """Write the claim again (after the output it was in was cleared)."""
        self.fs.pipe_file(self.claim_file, release_id.encode())

    def unclaim(self, release_id: str) -> None:
        """Remove the claim if it is ``release_id``'s."""
        if self.claim_owner() == release_id:
            try:
                self.fs.rm_file(self.claim_file)
            except FileNotFoundError:
                pass

    def mark_aborted(self) -> None:
        """Tell the release's remaining tasks to do nothing (they check before reading)."""
        self.fs.pipe_file(self.abort_marker, b"")

    def clear_abort(self) -> None:
        """Remove an abort marker a failed run left."""
        if self.fs.exists(self.abort_marker):
            self.fs.rm_file(self.abort_marker)

    def save_plan(self, plan: Mapping[str, Any]) -> None:
        """Save a plan (its dict) for a resume: never half-written (a local temporary file
        renamed into place; an object store's PUT is whole)."""
        payload = json.dumps(plan).encode()
        if self.local:
            tmp = Path(f"{self.plan_file}.{os.getpid()}.tmp")
            tmp.write_bytes(payload)
            os.replace(tmp, self.plan_file)
        else:
            self.fs.pipe_file(self.plan_file, payload)

    def load_plan(self) -> dict[str, Any] | None:
        """The saved plan, if any (``None`` too when unreadable: a disk that filled up)."""
        try:
            saved = json.loads(self.fs.cat_file(self.plan_file))
        except (FileNotFoundError, ValueError):
            return None
        return dict(saved) if isinstance(saved, dict) else None
