"""The release writer: where a release is written, what it contains, commit and abort.

A release is an xarray-readable Zarr v3 group in the format of :mod:`mvg_dask.release_format`
(names, dimensions, completeness, the progress directory): the privatized variable (identity:
the input's name, dims and coordinates; covariance: ``covariance`` over
``{feature}_row``/``{feature}_col``), the noise description as variables (``row_cov``,
``col_cov`` for equi-modal and symmetric noise, ``symmetric_ratio`` for a symmetric published
noise ``B S B^T`` (symmetric noise, and equi-modal covariance noise, which is published averaged
with its transpose), ``directions``, ``noise_variances``, and ``dp_pca_eigenvalues`` for DP-PCA
directions) and the provenance attributes named in :data:`~mvg_dask.release_format.ATTRS`. Every
attribute is a function of the plan, never of the data (the README's trust model); values that
depend on the data are noisy data variables.

Local stores are written to a staging directory and renamed into place; object stores are
written in place with ``status = incomplete`` until the last metadata write. The commit writes
consolidated metadata into the root ``zarr.json`` (first with the status still ``incomplete``,
then, in the one last write, together with the final attributes), so a plain
``xr.open_zarr(path)`` opens a release without a warning. Zarr's byte-level shortcuts live in
:mod:`mvg_dask.engine.zarr_io`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask.engine.output_arrays import (
    MATRIX_CHUNK,
    NOISE_MATRIX_CHUNK,
    Skeleton,
    SkeletonVariable,
    compressors,
    eager_noise_matrices,
    noise_matrix_encoding,
    output_dataset,
    output_variable,
    placeholder,
)
from mvg_dask.engine.provenance import provenance, store_name
from mvg_dask.engine.store import Store
from mvg_dask.engine.zarr_io.arrays import create_scratch_matrix, write_arrays
from mvg_dask.engine.zarr_io.consolidated import write_consolidated_root
from mvg_dask.engine.zarr_io.skeleton import write_skeleton
from mvg_dask.errors import IncompleteReleaseError, ReleaseError
from mvg_dask.plan.covariance import Diagonal, LowRank
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.noise_plan import NoisePlan
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.release_codec import PlanMismatchError, ReleaseCodec
from mvg_dask.release_format import (
    ATTRS,
    CENTRE,
    COL_COV,
    COMPLETE,
    COMPONENT_DIM,
    CONSTANT_TERM,
    COVARIANCE,
    DIRECTION_DIM,
    DIRECTIONS,
    DP_PCA_EIGENVALUES,
    GROUP_DIM,
    INCOMPLETE,
    MEAN,
    MOMENT,
    NOISE_MATRICES,
    NOISE_VARIANCES,
    PLAN_ATTR,
    PLAN_FILE,
    PREFIX,
    RECORD_COUNT,
    RELEASE_ID_ATTR,
    ROW_COV,
    STATUS_ATTR,
    SYMMETRIC_RATIO,
    TERM_DIM,
    ProgressLog,
    cross_col_noise_dims,
    cross_noise_dims,
    describe,
    dims_for,
    is_complete,
)

if TYPE_CHECKING:
    import xarray as xr

__all__ = [
    "ATTRS",
    "MATRIX_CHUNK",
    "NOISE_MATRICES",
    "NOISE_MATRIX_CHUNK",
    "PLAN_ATTR",
    "PLAN_FILE",
    "PREFIX",
    "RELEASE_ID_ATTR",
    "STATUS_ATTR",
    "OutputTarget",
    "compressors",
    "eager_noise_matrices",
    "noise_matrix_encoding",
    "noise_variables",
    "open_release",
    "placeholder",
    "provenance",
    "small_coords",
    "store_name",
    "stored_plan",
]

MAX_EAGER_COORD = 10_000_000


def _ratio_variable(plan: NoisePlan) -> dict[str, SkeletonVariable]:
    ratio = plan.output_symmetric_ratio
    if ratio is None:
        return {}
    # the published noise is B S B^T, B = directions * sqrt(noise_variances), S symmetric with
    # S_ii ~ N(0, 1), S_ij ~ N(0, ratio): symmetric noise, or equi-modal noise averaged with its
    # transpose (ratio 1/2); row_cov = col_cov = B B^T
    return {
        SYMMETRIC_RATIO: output_variable(
            ratio,
            attrs={
                "description": "published noise B S B^T, B = directions * sqrt(noise_variances),"
                " S symmetric, S_ii ~ N(0, 1), S_ij = S_ji ~ N(0, symmetric_ratio)"
            },
        )
    }


def noise_variables(rplan: ReleasePlan, plan: NoisePlan) -> dict[str, SkeletonVariable]:
    """The noise description as data variables (they depend on the data through DP-PCA only, and
    then only through its noisy output). Unless
    :func:`~mvg_dask.engine.output_arrays.eager_noise_matrices`, the matrices ``row_cov``,
    ``col_cov`` and ``directions`` are lazy placeholders whose values
    :meth:`OutputTarget.write_noise_matrices` writes after the metadata (no ``m x m`` matrix for
    standard directions); their encoding:
    :func:`~mvg_dask.engine.output_arrays.noise_matrix_encoding`."""
    rows, cols = _noise_dims(rplan)
    m, k = plan.directions.shape
    eager = eager_noise_matrices(plan)
    sigma = plan.row_cov if eager else placeholder((m, m))
    out = {
        ROW_COV: output_variable(sigma, dims=(rows, cols)),
        DIRECTIONS: output_variable(
            plan.directions.matrix if eager else placeholder((m, k)), dims=(rows, DIRECTION_DIM)
        ),
        NOISE_VARIANCES: output_variable(plan.row_variances, dims=(DIRECTION_DIM,)),
    }
    if plan.algorithm != "unimodal":
        out[COL_COV] = output_variable(sigma, dims=(rows, cols))
    elif plan.col_cov is not None:  # a cross-covariance's Psi, over its column features
        out[COL_COV] = output_variable(
            plan.col_cov, dims=cross_col_noise_dims(rplan.input.feature_dim)
        )
    out |= _ratio_variable(plan)
    if rplan.uses_dp_pca and plan.directions.eigenvalues is not None:
        out[DP_PCA_EIGENVALUES] = output_variable(
            plan.directions.eigenvalues, dims=(DIRECTION_DIM,)
        )
    return out


def matrix_dims(rplan: ReleasePlan) -> tuple[str, str]:
    """The dimensions of the query's square matrices and of the noise description: the
    feature dimension's, or the augmented terms' (:data:`TERM_DIM`) of a moment query."""
    moment = rplan.query.augmented and rplan.mean_first is None
    return dims_for(TERM_DIM if moment else rplan.input.feature_dim)


def _noise_dims(rplan: ReleasePlan) -> tuple[str, str]:
    """The dimensions of the noise matrices: :func:`matrix_dims`, or a cross-covariance's
    (:func:`~mvg_dask.release_format.cross_noise_dims`)."""
    if rplan.query.feature_sides is not None:  # rows and cols are two sets of features
        return cross_noise_dims(rplan.input.feature_dim)
    return matrix_dims(rplan)


def _cross_coords(rplan: ReleasePlan) -> dict[str, Any]:
    """A cross-covariance's coordinates: its row and column labels (positions when the input
    has no feature coordinate), the row labels on the noise matrices' second dimension too."""
    labels = _labels(rplan.input)
    second = rplan.input.cols_input
    if second is not None:  # the stacked record [x; y]: Y's labels after X's
        labels += _second_labels(labels, second)
    sides = rplan.query.feature_sides
    assert sides is not None
    rows = _label_array([labels[i] for i in sides[0]])
    cols = _label_array([labels[i] for i in sides[1]])
    row_dim, col_dim = dims_for(rplan.input.feature_dim)
    coords = {row_dim: rows, col_dim: cols, cross_noise_dims(rplan.input.feature_dim)[1]: rows}
    if rplan.query.column_noise_variances is not None:  # col_cov's second dimension
        coords[cross_col_noise_dims(rplan.input.feature_dim)[1]] = cols
    return coords


def _labels(inp: InputMetadata) -> list[Any]:
    """A variable's feature labels: its coordinate's values, or positions."""
    return list(range(inp.features)) if inp.feature_names is None else list(inp.feature_names)


def _second_labels(first: list[Any], second: InputMetadata) -> list[Any]:
    """The second variable's feature labels as output coordinates: its own, or all of them
    prefixed ``"<Y>/"`` when one of them is also a label of the input variable (so a row and a
    column label never read as the same feature)."""
    own = _labels(second)
    if set(own) & set(first):
        return [f"{second.variable}/{label}" for label in own]
    return own


def _label_array(labels: list[Any]) -> np.ndarray:
    """Labels as a coordinate (strings as objects: Zarr v3 variable-length strings)."""
    return np.asarray(labels, dtype=object if isinstance(labels[0], str) else None)


def _feature_coords(rplan: ReleasePlan) -> dict[str, Any]:
    if rplan.query.feature_sides is not None:
        return _cross_coords(rplan)
    names = rplan.input.feature_names
    if names is None:
        return {}
    # strings as objects: xarray stores them as Zarr v3 variable-length strings
    values = np.asarray(names, dtype=object if isinstance(names[0], str) else None)
    coords = dict.fromkeys(dims_for(rplan.input.feature_dim), values)
    if rplan.query.output_vector:
        coords[rplan.input.feature_dim] = values
    if rplan.query.augmented:
        coords[rplan.input.feature_dim] = values
        if isinstance(names[0], str):  # the constant term's label beside the feature names
            terms = np.asarray([*names, CONSTANT_TERM], dtype=object)
            coords |= dict.fromkeys(dims_for(TERM_DIM), terms)
    return coords


def small_coords(variable: xr.DataArray) -> dict[str, xr.DataArray]:
    """Coordinates small enough to copy eagerly into the output."""
    return {
        str(name): coord.load()
        for name, coord in variable.coords.items()
        if coord.size <= MAX_EAGER_COORD
    }


def _identity_dataset(
    rplan: ReleasePlan, variable: xr.DataArray
) -> tuple[Skeleton, dict[str, dict[str, Any]]]:
    """The identity output's skeleton and encoding (see :meth:`OutputTarget.
    write_identity_skeleton`)."""
    info = rplan.input
    rec = info.record_chunk
    chunks = (rec, info.features) if info.records_first else (info.features, rec)
    out = output_dataset(
        {
            info.variable: output_variable(
                placeholder(info.shape, np.dtype(rplan.output_dtype)), dims=info.dims
            ),
            **noise_variables(rplan, rplan.noise_plan()),
        },
        coords={**small_coords(variable), **_feature_coords(rplan)},
    )
    encoding = {info.variable: {"chunks": chunks, "compressors": compressors(rplan)}}
    return out, encoding | noise_matrix_encoding(out)


def _matrix_dataset(
    rplan: ReleasePlan, name: str, count: float | None
) -> tuple[Skeleton, dict[str, dict[str, Any]]]:
    """A whole-matrix output's skeleton and encoding (see :meth:`OutputTarget.
    write_matrix_skeleton`): a covariance (``m x m``) or a cross-covariance (``m_a x m_b``)."""
    if rplan.mean_first is not None:
        return _mean_first_dataset(rplan)
    m, q = rplan.input.features, rplan.query
    # (m, m), a cross-covariance's (m_a, m_b), or a vector over the features (the mean)
    shape: tuple[int, ...] = (m, m) if q.augmented else q.shape
    dims: tuple[str, ...] = dims_for(rplan.input.feature_dim)
    if q.output_vector:
        shape, dims = (q.shape[0],), (rplan.input.feature_dim,)
    names = [name] if count is None else [name, q.sum_variable]
    variables = {k: output_variable(placeholder(shape), dims=dims) for k in names}
    coords = _feature_coords(rplan)
    if rplan.query.augmented:  # the noisy moment, and the mean and covariance derived from it
        names = [MOMENT, MEAN, COVARIANCE]
        variables, groups = _moment_variables(rplan)
        coords |= groups
    if count is not None:
        variables[RECORD_COUNT] = output_variable(count)
    ds = output_dataset({**variables, **noise_variables(rplan, rplan.noise_plan())}, coords=coords)
    encoding = {
        k: {"chunks": _matrix_chunks(variables[k]), "compressors": compressors(rplan)}
        for k in names
    }
    return ds, encoding | noise_matrix_encoding(ds)


def _mean_first_dataset(rplan: ReleasePlan) -> tuple[Skeleton, dict[str, dict[str, Any]]]:
    """A mean-first release's skeleton and encoding: ``mean`` and ``centre`` (features),
    ``covariance`` (features x features) and the noise description of step 2's resolved plan
    (about the released centre: noisy values, data variables, never attributes)."""
    m, fd = rplan.input.features, rplan.input.feature_dim
    variables = {
        MEAN: output_variable(placeholder((m,)), dims=(fd,)),
        CENTRE: output_variable(placeholder((m,)), dims=(fd,)),
        COVARIANCE: output_variable(placeholder((m, m)), dims=dims_for(fd)),
    }
    coords = _feature_coords(rplan)
    ds = output_dataset({**variables, **noise_variables(rplan, rplan.noise_plan())}, coords=coords)
    encoding = {
        k: {"chunks": _matrix_chunks(v), "compressors": compressors(rplan)}
        for k, v in variables.items()
    }
    return ds, encoding | noise_matrix_encoding(ds)


def _matrix_chunks(variable: SkeletonVariable) -> tuple[int, ...]:
    """Chunks of :data:`MATRIX_CHUNK` along a matrix's axes; a grouped release's groups in
    runs of at most ``MATRIX_CHUNK**2`` values per chunk (at least one group)."""
    shape = variable.shape
    if variable.dims[0] != GROUP_DIM:
        return tuple(min(MATRIX_CHUNK, n) for n in shape)
    inner = tuple(min(MATRIX_CHUNK, n) for n in shape[1:])
    return (max(1, min(shape[0], MATRIX_CHUNK**2 // math.prod(inner))), *inner)


def _moment_variables(
    rplan: ReleasePlan,
) -> tuple[dict[str, SkeletonVariable], dict[str, np.ndarray]]:
    """The skeleton of a moment release's ``moment``, ``mean`` and ``covariance``, each with a
    leading :data:`GROUP_DIM` for a grouped release, and the group coordinate (the declared
    labels of the plan, never of the data; strings as objects)."""
    m = rplan.input.features
    lead: tuple[int, ...] = ()
    dims: tuple[str, ...] = ()
    coords: dict[str, np.ndarray] = {}
    groups = rplan.query.groups
    if groups is not None:
        lead, dims = (len(groups),), (GROUP_DIM,)
        coords[GROUP_DIM] = np.asarray(groups, dtype=object if isinstance(groups[0], str) else None)
    variables = {
        MOMENT: output_variable(placeholder((*lead, m + 1, m + 1)), dims=dims + matrix_dims(rplan)),
        MEAN: output_variable(placeholder((*lead, m)), dims=(*dims, rplan.input.feature_dim)),
        COVARIANCE: output_variable(
            placeholder((*lead, m, m)), dims=dims + dims_for(rplan.input.feature_dim)
        ),
    }
    return variables, coords


class OutputTarget:
    """Where a release is written: a staging directory renamed into place (local stores), or the
    final location with ``status = incomplete`` until the end (object stores).

    Parameters
    ----------
    store : str
        Final output store.
    release_id : str
        Release id (names the staging directory).
    storage_options : dict, optional
        fsspec options for object stores.
    """

    def __init__(
        self, store: str, release_id: str, storage_options: dict[str, Any] | None = None
    ) -> None:
        self.store = store
        self.release_id = release_id
        self.storage_options = storage_options
        #: the final output store, and where the release writes (its staging directory, for a
        #: local store: :meth:`~mvg_dask.engine.store.Store.staging`)
        self.output = Store(store, storage_options)
        self.writing = self.output.staging(release_id)
        self.local = self.output.local
        self.final: Path | None = self.output.path if self.local else None
        self.write_store = self.writing.url

    @classmethod
    def for_plan(cls, rplan: ReleasePlan) -> OutputTarget:
        """The target of a planned release."""
        return cls(rplan.output_store, rplan.release_id, rplan.output_storage_options)

    def _fs(self) -> tuple[Any, str]:
        return self.writing.fs, self.writing.root

    def progress(self) -> ProgressLog:
        """The progress directory of the output being written (markers, saved plan, claim)."""
        return self.writing.progress()

    def _open(self) -> xr.Dataset | None:
        import xarray as xr

        try:
            return xr.open_zarr(
                self.store, consolidated=False, storage_options=self.storage_options
            )
        except Exception:
            return None

    def check_free(self) -> None:
        """Refuse an output location that already holds something else."""
        if self.local:
            assert self.final is not None
            if self.final.exists():
                raise ReleaseError(
                    f"output.store: {self.store} already exists "
                    f"({_describe_existing(self.store)}); choose another output.store or remove it"
                )
            return
        ds = self._open()
        if ds is not None and ds.attrs.get(RELEASE_ID_ATTR) != self.release_id:
            raise ReleaseError(
                f"output.store: {self.store} already holds other data; choose another store"
            )

    def is_complete(self) -> bool:
        """True when the final location holds this release, complete."""
        ds = self._open()
        return ds is not None and is_complete(ds.attrs, self.release_id)

    def has_skeleton(self) -> bool:
        """True when an earlier run of this release created the whole output skeleton: its
        root ``zarr.json`` and the saved plan, the last file a skeleton writes (a run
        interrupted before it, or one that left a half-written plan, starts over)."""
        return self.writing.exists("zarr.json") and self.load_plan() is not None

    def claim(self) -> None:
        """Claim an object-store output for this release before anything is charged: a claim
        object made only if none exists (a conditional PUT), so that of two jobs on one output
        one wins and the other is refused. Local outputs need none (each job writes its own
        staging directory; the final rename refuses a taken name). The commit or an abort
        removes the claim with the progress directory.

        Raises
        ------
        ReleaseError
            When another release claimed the output.
        """
        if self.writing.claim(self.release_id) != self.release_id:
            raise ReleaseError(
                f"output.store: {self.store} is being written by another release; choose "
                "another output.store"
            )

    def unclaim(self) -> None:
        """Remove this release's claim (its reservation was refused: nothing was written)."""
        self.writing.unclaim(self.release_id)

    def clear_abort(self) -> None:
        """Remove the abort marker a failed run of this release left (a disk that filled up, a
        lost scheduler): the resumed run's tasks must write their chunks, not skip them."""
        self.progress().clear_abort()

    def make_progress_dir(self) -> None:
        """Create the directory of per-chunk completion markers."""
        self.progress().make()

    def save_plan(self, rplan: ReleasePlan) -> None:
        """Keep the plan beside the progress markers (removed at commit), for a resume."""
        self.progress().save_plan(rplan.to_dict())

    def load_plan(self) -> dict[str, Any] | None:
        """The plan an interrupted run of this release saved, if any."""
        return self.progress().load_plan()

    def scratch_matrix(self, name: str, m: int, chunk: int) -> str:
        """Create (afresh) a scratch Zarr group ``name`` with an ``m x m`` float64 array ``gram``
        of ``chunk x chunk`` raw chunks, inside the progress directory: an abort removes it
        with the rest, and :meth:`remove_scratch` once it has served. Returns its location."""
        path = ProgressLog(self.write_store).entry(name)
        self.remove_scratch(name)
        create_scratch_matrix(path, m, chunk, self.storage_options)
        return path

    def remove_scratch(self, name: str) -> None:
        """Remove the scratch group ``name``, if any."""
        self.progress().remove(name)

    def clear_staging(self) -> None:
        """Remove a leftover staging directory of this release id; in an object store, a
        leftover incomplete output of this release id (a run that stopped before its skeleton
        was whole), keeping the claim."""
        if self.local:
            if Path(self.write_store).exists():
                shutil.rmtree(self.write_store)
            return
        fs, root = self._fs()
        try:
            attrs = json.loads(fs.cat_file(f"{root}/zarr.json")).get("attributes", {})
        except (FileNotFoundError, ValueError):
            attrs = None
        ours = attrs is not None and attrs.get(RELEASE_ID_ATTR) == self.release_id
        if ours and attrs.get(STATUS_ATTR) == INCOMPLETE:
            fs.rm(root, recursive=True)
            self.progress().restore_claim(self.release_id)

    def abort(self) -> None:
        """Remove everything this release wrote: the staging directory (local stores) or the
        in-place output (object stores; :meth:`check_free` made sure it held nothing else)."""
        if self.local:
            shutil.rmtree(self.write_store, ignore_errors=True)
            return
        fs, root = self._fs()
        if fs.exists(root):
            fs.rm(root, recursive=True)

    # -- writing -------------------------------------------------------------------------------
    def write_identity_skeleton(self, rplan: ReleasePlan, variable: xr.DataArray) -> None:
        """Create the identity output: same name, dims and (small) coords as the input, the
        input's record chunks, the noise variables (the values of the noise matrices are
        written by :meth:`write_noise_matrices`), ``status = incomplete``."""
        self.clear_staging()
        self._write_skeleton(rplan, *_identity_dataset(rplan, variable))

    def write_matrix_skeleton(
        self, rplan: ReleasePlan, name: str, *, count: float | None = None
    ) -> None:
        """Create a square (whole-matrix covariance) output before its values exist: the noise
        variables, the noisy ``record_count`` when there is one, ``status = incomplete``, and
        ``name`` (with the noisy sum ``gram`` beside it when there is a count) declared in
        chunks of :data:`MATRIX_CHUNK`. Everything here is a function of the plan (and of the
        key, for the count), so a release writes it while its Gram pass runs; the values follow
        with :meth:`write_matrix_values`."""
        ds, encoding = _matrix_dataset(rplan, name, count)
        self.clear_staging()
        # no progress markers or saved plan: a resumed covariance release starts over
        self._write_skeleton(rplan, ds, encoding, resumable=False)
        self.write_noise_matrices(rplan.noise_plan())

    def write_matrix_values(self, values: dict[str, np.ndarray]) -> None:
        """Write the privatized square matrices declared by :meth:`write_matrix_skeleton`."""
        write_arrays(self.write_store, values, self.storage_options)

    def write_blocked_skeleton(
        self, rplan: ReleasePlan, names: tuple[str, ...], scalars: dict[str, float]
    ) -> None:
        """Create a blocked covariance output: the ``names`` matrices (``m x m``, chunks of
        ``matrix_chunk``) and the noise description, whose values the panel tasks write, plus
        the small variables and ``status = incomplete``; the plan is saved for a resume."""
        from zarr.codecs import ZstdCodec

        plan = rplan.noise_plan()
        m, fb = rplan.input.features, rplan.matrix_chunk
        assert fb is not None
        fd = rplan.input.feature_dim
        rows, cols = dims_for(fd)

        def lazy(dims: tuple[str, str]) -> SkeletonVariable:
            return output_variable(placeholder((m, m)), dims=dims)

        variables = {name: lazy((rows, cols)) for name in names}
        variables[ROW_COV] = lazy((rows, cols))
        if plan.algorithm != "unimodal":
            variables[COL_COV] = lazy((rows, cols))
        low_rank = isinstance(plan.covariance, LowRank)
        if low_rank:  # DP-PCA's top k, published whole (m x k)
            variables[DIRECTIONS] = output_variable(
                plan.directions.matrix, dims=(rows, COMPONENT_DIM)
            )
            if plan.directions.eigenvalues is not None:
                variables[DP_PCA_EIGENVALUES] = output_variable(
                    plan.directions.eigenvalues, dims=(COMPONENT_DIM,)
                )
        else:
            variables[DIRECTIONS] = lazy((rows, DIRECTION_DIM))
        variables[NOISE_VARIANCES] = output_variable(plan.row_variances, dims=(DIRECTION_DIM,))
        variables |= _ratio_variable(plan)
        variables |= {k: output_variable(v) for k, v in scalars.items()}
        ds = output_dataset(variables, coords=_feature_coords(rplan))
        encoding: dict[str, dict[str, Any]] = {
            name: {"chunks": (fb, fb), "compressors": compressors(rplan)} for name in names
        }
        for name in NOISE_MATRICES:
            if name in variables and not (low_rank and name == DIRECTIONS):
                # fill value 0: the zero blocks the panel tasks write are not stored
                encoding[name] = {
                    "chunks": (fb, fb),
                    "compressors": (ZstdCodec(),),
                    "fill_value": 0.0,
                }
        self.clear_staging()
        self._write_skeleton(rplan, ds, encoding)

    def write_noise_matrices(self, plan: NoisePlan) -> None:
        """Write the values of ``row_cov``, ``col_cov`` and ``directions``, declared by the
        skeleton (:func:`noise_variables`): for standard directions only the diagonal blocks
        (the others are the fill value 0, not stored), else the whole matrices. Idempotent:
        a resumed release writes them again (an interrupted write is made whole)."""
        if eager_noise_matrices(plan):
            return  # written with the metadata
        import zarr

        group = zarr.open_group(self.write_store, mode="r+", storage_options=self.storage_options)
        names = [ROW_COV, DIRECTIONS] + ([COL_COV] if plan.algorithm != "unimodal" else [])
        sigma = None if isinstance(plan.covariance, Diagonal) else plan.row_cov
        m = plan.directions.dim
        for name in names:
            arr = group[name]
            assert isinstance(arr, zarr.Array)
            if sigma is not None:  # dense directions: whole matrices (zero chunks not stored)
                arr[...] = plan.directions.matrix if name == DIRECTIONS else sigma
                continue
            diagonal = np.ones(m) if name == DIRECTIONS else plan.row_variances
            c = arr.chunks[0]
            for b0 in range(0, m, c):
                b1 = min(b0 + c, m)
                arr[b0:b1, b0:b1] = np.diag(diagonal[b0:b1])

    def _write_skeleton(
        self,
        rplan: ReleasePlan,
        ds: Skeleton,
        encoding: dict[str, dict[str, Any]],
        *,
        resumable: bool = True,
    ) -> None:
        """Write an output's metadata and small variables with ``status = incomplete`` (the
        large arrays' chunks are written later), and for a ``resumable`` release the progress
        directory and the plan."""
        ds.attrs[STATUS_ATTR] = INCOMPLETE
        ds.attrs[RELEASE_ID_ATTR] = rplan.release_id
        # the files `ds.to_zarr(mode="w-", compute=False)` writes, in one batch
        write_skeleton(
            ds, self.write_store, encoding=encoding, storage_options=self.storage_options
        )
        if resumable:
            self.make_progress_dir()
            self.save_plan(rplan)

    def commit(self, attrs: dict[str, Any]) -> None:
        """Write the final attrs with ``status = complete`` last, then move into place: one
        metadata write, the last of the release, carries the final attributes and the
        consolidated metadata (:func:`~mvg_dask.engine.zarr_io.consolidated.
        write_consolidated_root`)."""
        fs, root = self._fs()
        self.progress().remove()
        if self.local:  # leftovers of writes interrupted by a crash (zarr writes tmp + rename)
            for partial in Path(self.write_store).rglob("*.partial"):
                partial.unlink()
        write_consolidated_root(fs, root, {**attrs, STATUS_ATTR: COMPLETE})
        if self.local:
            assert self.final is not None
            os.replace(self.write_store, self.final)


def _describe_existing(store: str) -> str:
    import xarray as xr

    try:
        ds = xr.open_zarr(store, consolidated=False)
    except Exception:
        return "not a Zarr store of mvg_dask"
    return describe(ds.attrs, status=False)


def open_release(store: str, **kwargs: Any) -> xr.Dataset:
    """Open a released dataset, refusing one whose status is not ``complete``.

    Parameters
    ----------
    store : str
        Output store path or URL.
    **kwargs
        Passed to :func:`xarray.open_zarr`.

    Returns
    -------
    xarray.Dataset
        The release with its provenance attrs.

    Raises
    ------
    IncompleteReleaseError
        When the store is not a complete mvg_dask release.
    """
    try:
        ds = _open_consolidated_first(store, kwargs)
    except Exception as exc:
        raise IncompleteReleaseError(f"{store} is not a readable release ({exc})") from None
    if not is_complete(ds.attrs):
        raise IncompleteReleaseError(
            f"{store} is not a complete release (status: {ds.attrs.get(STATUS_ATTR)!r}); it may "
            "still be running, or it crashed: re-run the release with the same release_id to "
            "finish it"
        )
    return ds


def _open_consolidated_first(store: str, kwargs: dict[str, Any]) -> xr.Dataset:
    """A complete release has consolidated metadata; a store without it (an incomplete release,
    or one written before consolidation) is opened from its node metadata, without a warning."""
    import xarray as xr

    if "consolidated" in kwargs:
        return xr.open_zarr(store, **kwargs)
    try:
        return xr.open_zarr(store, consolidated=True, **kwargs)
    except Exception:
        return xr.open_zarr(store, consolidated=False, **kwargs)


def stored_plan(rplan: ReleasePlan, ds: xr.Dataset) -> ReleasePlan:
    """The plan a complete release was made with, reloaded from the release itself.

    The published plan is checked against ``rplan`` (planned again from the same spec); a
    pending plan is resolved with the release's DP-PCA directions and eigenvalues, or its
    mean-first centre, from its noisy data variables, as the readers resolve it
    (:meth:`ReleaseCodec.plan_for <mvg_dask.release_codec.ReleaseCodec.plan_for>`).
    """
    try:
        noise = ReleaseCodec(ds.attrs, ds).plan_for(rplan)
    except PlanMismatchError as exc:
        raise ReleaseError(str(exc)) from None
    return rplan if noise is rplan.noise else replace(rplan, noise=noise)
