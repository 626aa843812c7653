"""The curator-side data check (``mvg-dask check``): what a release would meet in its input.

One pass over the records of a release spec's input, by the tasks' record ranges
(:meth:`~mvg_dask.plan.input_metadata.InputMetadata.task_ranges`), each task reading stored chunks
with the engine's :class:`~mvg_dask.engine.records.ZarrMatrix` and counting, per feature, the NaN
and infinite values and the values outside the declared box (or the records outside the declared
L2 ball); with a second variable (a two-variable cross-covariance) the same against its own box,
and with ``group_by`` the records whose label is not declared. The partial counts are summed on
the client as the tasks finish.

The counts are exact functions of the data, **not** differentially private: they are for the
curator's eyes only (docs/guide/privacy.md, "Trust model"). A check charges nothing and
publishes nothing: it opens no ledger and writes no output store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from distributed import Client, as_completed

from mvg_dask.engine.cluster import Progress, stop_tasks
from mvg_dask.engine.metadata import check_chunks_present
from mvg_dask.engine.records import ZarrLabels, ZarrMatrix
from mvg_dask.engine.tasks.outcome import Outcome
from mvg_dask.errors import MvgDaskError
from mvg_dask.plan.domain import BoxDomain, L2BallDomain
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.planning import declared_domains
from mvg_dask.spec import ReleaseSpec

__all__ = ["NOTICE", "CheckReport", "CheckSetup", "VariableCounts", "run_check", "setup_check"]

#: The line every check's output carries (the text report ends with it; the JSON holds it).
NOTICE = (
    "curator-side check: nothing charged, nothing published; these counts are not "
    "differentially private, do not share them"
)

#: Features listed by name in each line of :meth:`CheckReport.summary` (the rest are counted).
LISTED_FEATURES = 10


@dataclass(frozen=True)
class CheckedVariable:
    """One variable of the check as its tasks see it: where to read it and its domain.

    Attributes
    ----------
    source : ZarrMatrix
        The variable, read by record ranges.
    features : int
        Its feature count ``M``.
    lower, upper : ndarray or None
        A box domain's bounds (``None`` for an L2 ball).
    radius : float or None
        An L2 ball's radius (``None`` for a box).
    """

    source: ZarrMatrix
    features: int
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    radius: float | None = None

    @property
    def size(self) -> int:
        """Length of its counts vector (:func:`variable_counts`)."""
        return 4 * self.features + 2

    def count(self, start: int, stop: int) -> np.ndarray:
        """The counts of records ``[start, stop)`` (:func:`variable_counts`)."""
        return variable_counts(self.source.read(start, stop), self.lower, self.upper, self.radius)


def variable_counts(
    block: np.ndarray,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
    radius: float | None = None,
) -> np.ndarray:
    """The check's counts of one block of records, as one int64 vector.

    The values are compared as float64, as a release's clipping compares them, so the counts
    are what a release would clip. NaN is never below, above or outside anything; an infinite
    value is counted as infinite *and* below or above the box (its record's norm is infinite).

    Parameters
    ----------
    block : ndarray
        ``M x b`` (features x records).
    lower, upper : ndarray, optional
        A box's per-feature bounds, shape ``(M,)``.
    radius : float, optional
        An L2 ball's radius.

    Returns
    -------
    ndarray
        ``4 M + 2`` int64: NaN per feature, infinite values per feature, values below ``lower``
        per feature, values above ``upper`` per feature (zeros without a box), the records with
        a NaN or infinite value, and the records whose L2 norm exceeds ``radius`` (0 without).
    """
    x = np.asarray(block, dtype=np.float64)
    m = x.shape[0]
    out = np.zeros(4 * m + 2, dtype=np.int64)
    nonfinite = ~np.isfinite(x)
    nan = np.count_nonzero(np.isnan(x), axis=1)
    out[:m] = nan
    out[m : 2 * m] = np.count_nonzero(nonfinite, axis=1) - nan
    if lower is not None and upper is not None:
        out[2 * m : 3 * m] = np.count_nonzero(x < lower[:, None], axis=1)
        out[3 * m : 4 * m] = np.count_nonzero(x > upper[:, None], axis=1)
    out[4 * m] = np.count_nonzero(nonfinite.any(axis=0))
    if radius is not None:  # the norm a release's L2 clipping computes
        norms = np.sqrt(np.einsum("ij,ij->j", x, x))
        out[4 * m + 1] = np.count_nonzero(norms > radius)
    return out


def check_task(
    start: int,
    stop: int,
    *,
    variables: tuple[CheckedVariable, ...],
    labels: ZarrLabels | None,
    step: int,
) -> Outcome:
    """The counts of records ``[start, stop)``, read one stored chunk (``step`` records) at a
    time: each variable's :func:`variable_counts`, concatenated, then the records whose group
    label is not declared (0 without ``labels``).

    Returns
    -------
    Outcome
        The int64 counts, or the read error met.
    """
    total = np.zeros(sum(v.size for v in variables) + 1, dtype=np.int64)
    try:
        for a in range(start, stop, step):
            b = min(a + step, stop)
            offset = 0
            for v in variables:
                total[offset : offset + v.size] += v.count(a, b)
                offset += v.size
        if labels is not None:
            total[-1] = np.count_nonzero(labels.read(start, stop) < 0)
    except MvgDaskError as exc:
        return Outcome.failure(exc)
    return Outcome(total)


@dataclass(frozen=True)
class VariableCounts:
    """What the check found in one variable.

    Attributes
    ----------
    variable : str
        The variable's name.
    domain_field : str
        The spec field that declares its domain.
    domain : str
        The declared domain in words.
    feature_names : tuple
        Its features' labels (their positions when the store has no feature coordinate).
    nan, inf : tuple of int
        NaN and infinite values per feature.
    below, above : tuple of int or None
        Values below the box's lower and above its upper bound, per feature (``None``: an L2
        ball).
    over_radius : int or None
        Records whose L2 norm exceeds the declared radius (``None``: a box).
    nonfinite_records : int
        Records with at least one NaN or infinite value.
    """

    variable: str
    domain_field: str
    domain: str
    feature_names: tuple[Any, ...]
    nan: tuple[int, ...]
    inf: tuple[int, ...]
    below: tuple[int, ...] | None
    above: tuple[int, ...] | None
    over_radius: int | None
    nonfinite_records: int

    @property
    def features(self) -> int:
        """The feature count."""
        return len(self.feature_names)

    @property
    def nan_total(self) -> int:
        """NaN values in all."""
        return sum(self.nan)

    @property
    def inf_total(self) -> int:
        """Infinite values in all."""
        return sum(self.inf)

    @property
    def outside(self) -> int:
        """Values (box) or records (L2 ball) outside the declared domain."""
        if self.over_radius is not None:
            return self.over_radius
        assert self.below is not None and self.above is not None
        return sum(self.below) + sum(self.above)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (per-feature lists in feature order, with the totals)."""
        out: dict[str, Any] = {
            "variable": self.variable,
            "features": self.features,
            "feature_names": list(self.feature_names),
            "domain": self.domain,
            "nan": self.nan_total,
            "nan_per_feature": list(self.nan),
            "inf": self.inf_total,
            "inf_per_feature": list(self.inf),
            "nonfinite_records": self.nonfinite_records,
        }
        if self.below is not None and self.above is not None:
            out["below_lower"] = sum(self.below)
            out["below_lower_per_feature"] = list(self.below)
            out["above_upper"] = sum(self.above)
            out["above_upper_per_feature"] = list(self.above)
        else:
            out["over_radius"] = self.over_radius
        return out

    def lines(self) -> list[str]:
        """The variable's lines of :meth:`CheckReport.summary`."""
        rows = [
            f"  NaN values: {self.nan_total}{self._listed(self.nan)}",
            f"  infinite values: {self.inf_total}{self._listed(self.inf)}",
            f"  records with a NaN or infinite value: {self.nonfinite_records}",
        ]
        if self.below is not None and self.above is not None:
            rows.append(f"  below the lower bound: {sum(self.below)}{self._listed(self.below)}")
            rows.append(f"  above the upper bound: {sum(self.above)}{self._listed(self.above)}")
        else:
            rows.append(f"  records with an L2 norm above the radius: {self.over_radius}")
        return rows

    def _listed(self, counts: tuple[int, ...]) -> str:
        """`` (f0: 3, f2: 1)``: the features with a count, the first ``LISTED_FEATURES``."""
        hit = [(name, n) for name, n in zip(self.feature_names, counts, strict=True) if n]
        if not hit:
            return ""
        text = ", ".join(f"{name}: {n}" for name, n in hit[:LISTED_FEATURES])
        more = len(hit) - LISTED_FEATURES
        return f" ({text}{f', and {more} more features' if more > 0 else ''})"


@dataclass(frozen=True)
class CheckReport:
    """What ``mvg-dask check`` (:func:`mvg_dask.api.check`) found in a release spec's input.

    Curator-side only: the counts are exact functions of the data, not differentially private
    (docs/guide/privacy.md); producing them charged nothing and published nothing.

    Attributes
    ----------
    store : str
        The input store.
    records : int
        The record count.
    input : VariableCounts
        The input variable's counts, against ``domain``.
    cols : VariableCounts or None
        The second variable's of a two-variable cross-covariance, against
        ``query.cross-covariance.cols.box``.
    group_variable : str or None
        ``group_by.variable``.
    groups : int or None
        The declared group count.
    undeclared_labels : int or None
        Records whose group label is not among the declared groups (a release drops them).
    on_violation : str
        ``domain.on_violation``: what a release does with out-of-domain values.
    fills_missing : bool
        ``domain.missing`` declares a fill: a release replaces each NaN by it.
    """

    store: str
    records: int
    input: VariableCounts
    cols: VariableCounts | None = None
    group_variable: str | None = None
    groups: int | None = None
    undeclared_labels: int | None = None
    on_violation: str = "clip"
    fills_missing: bool = False

    notice: ClassVar[str] = NOTICE

    @property
    def features(self) -> int:
        """The input variable's feature count."""
        return self.input.features

    @property
    def variables(self) -> tuple[VariableCounts, ...]:
        """The input variable's counts, then the second variable's if any."""
        return (self.input,) if self.cols is None else (self.input, self.cols)

    @property
    def clean(self) -> bool:
        """True when nothing was found: no NaN or infinite value, nothing outside the declared
        domains, no undeclared group label."""
        found = sum(v.nan_total + v.inf_total + v.outside for v in self.variables)
        return found == 0 and not self.undeclared_labels

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``mvg-dask check --json``), with the notice line as ``notice``."""
        out: dict[str, Any] = {
            "notice": NOTICE,
            "store": self.store,
            "records": self.records,
            "features": self.features,
            "on_violation": self.on_violation,
            "input": self.input.to_dict(),
        }
        if self.cols is not None:
            out["cols"] = self.cols.to_dict()
        if self.group_variable is not None:
            out["group_by"] = {
                "variable": self.group_variable,
                "groups": self.groups,
                "undeclared_labels": self.undeclared_labels,
            }
        out["clean"] = self.clean
        return out

    def summary(self) -> str:
        """The report as text (what ``mvg-dask check`` prints), ending with the notice line."""
        lines = [f"input {self.store}: {self.records} records"]
        for v in self.variables:
            lines.append(
                f"variable {v.variable!r}: {v.features} features, {v.domain_field}: {v.domain}"
            )
            lines += v.lines()
        if self.group_variable is not None:
            lines.append(
                f"group_by {self.group_variable!r}: {self.undeclared_labels} records with a "
                f"label not among the {self.groups} declared groups (a release drops them)"
            )
        lines += self._verdict()
        lines.append(NOTICE)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _verdict(self) -> list[str]:
        """What a release of this data would do, in words."""
        if self.clean:
            return ["nothing found: no NaN or infinite value, every value in the declared domain"]
        out = []
        nan = sum(v.nan_total for v in self.variables)
        inf = sum(v.inf_total for v in self.variables)
        if inf or (nan and not self.fills_missing):
            what = "infinite value" if self.fills_missing else "NaN or infinite value"
            remedy = (
                "replace them first"
                if self.fills_missing
                else "remove or impute them first, or declare domain.missing: {fill: ...}"
            )
            out.append(
                f"a release would stop at the first {what} after its budget is charged: {remedy}"
            )
        if nan and self.fills_missing:
            out.append("a release would replace each NaN by the declared domain.missing fill")
        if any(v.outside for v in self.variables):
            if self.on_violation == "error":
                out.append(
                    "a release would stop at the first value outside the domain after its "
                    "budget is charged (domain.on_violation: error)"
                )
            else:
                out.append("a release would clip the values outside the domain")
        return out


@dataclass(frozen=True)
class CheckSetup:
    """A check, decided from the spec and metadata before anything is read.

    Attributes
    ----------
    spec : ReleaseSpec
        The spec.
    metadata : InputMetadata
        Its input's metadata.
    variables : tuple of CheckedVariable
        The input variable, then the second variable of a two-variable cross-covariance.
    domains : tuple of (str, BoxDomain or L2BallDomain)
        Each variable's domain field and declared domain.
    labels : ZarrLabels or None
        The group variable of a ``group_by`` spec.
    """

    spec: ReleaseSpec
    metadata: InputMetadata
    variables: tuple[CheckedVariable, ...]
    domains: tuple[tuple[str, BoxDomain | L2BallDomain], ...]
    labels: ZarrLabels | None


def setup_check(spec: ReleaseSpec, metadata: InputMetadata) -> CheckSetup:
    """Validate the declared domains against the metadata and check that every stored chunk is
    present (metadata only: nothing is read, no cluster is needed).

    Parameters
    ----------
    spec : ReleaseSpec
        The release spec.
    metadata : InputMetadata
        Its input's metadata (:func:`mvg_dask.engine.metadata.read_input_metadata`).

    Returns
    -------
    CheckSetup
        What :func:`run_check` runs.

    Raises
    ------
    DataError
        A domain that does not fit the data (naming its field), or missing chunks.
    """
    inp, second = metadata, metadata.cols_input
    x_domain, y_domain = declared_domains(spec, metadata)  # the release's own rule
    variables = [_checked(inp, x_domain)]
    domains: list[tuple[str, BoxDomain | L2BallDomain]] = [
        ("domain.box" if isinstance(x_domain, BoxDomain) else "domain.l2_norm", x_domain)
    ]
    if second is not None:
        assert y_domain is not None
        variables.append(_checked(second, y_domain))
        domains.append(("query.cross-covariance.cols.box", y_domain))
    for meta in (inp, second):
        if meta is not None:  # Zarr would read a missing chunk as fill values
            check_chunks_present(
                meta.store,
                meta.variable,
                meta.storage_options,
                fills_missing=spec.domain.missing != "error",
            )
    labels = None
    if spec.group_by is not None:
        g = spec.group_by
        labels = ZarrLabels(inp.store, g.variable, tuple(g.groups), inp.storage_options)
    return CheckSetup(spec, metadata, tuple(variables), tuple(domains), labels)


def _checked(inp: InputMetadata, domain: BoxDomain | L2BallDomain) -> CheckedVariable:
    source = ZarrMatrix(inp.store, inp.variable, inp.records_first, inp.storage_options)
    if isinstance(domain, BoxDomain):
        return CheckedVariable(source, inp.features, lower=domain.lower, upper=domain.upper)
    return CheckedVariable(source, inp.features, radius=domain.radius)


def run_check(setup: CheckSetup, client: Client, *, progress: bool = True) -> CheckReport:
    """Run a check on ``client``: one task per record range of the input
    (:meth:`~mvg_dask.plan.input_metadata.InputMetadata.task_ranges`), their counts summed on the
    client as they finish. Opens no ledger, writes nothing.

    Parameters
    ----------
    setup : CheckSetup
        From :func:`setup_check`.
    client : distributed.Client
        Where to compute.
    progress : bool, default True
        Show progress (as a release does).

    Returns
    -------
    CheckReport
        The counts.

    Raises
    ------
    ReleaseError
        A chunk that cannot be read (the first one met).
    """
    from mvg_dask.engine.kube import check_versions

    check_versions(client)  # the workers must run the same code as the client
    meta = setup.metadata
    ranges = meta.task_ranges()
    futures = []
    if ranges:
        starts, stops = zip(*ranges, strict=True)
        futures = client.map(
            check_task,
            starts,
            stops,
            variables=setup.variables,
            labels=setup.labels,
            step=meta.record_chunk,
            pure=False,
        )
    total = np.zeros(sum(v.size for v in setup.variables) + 1, dtype=np.int64)
    pending = set(futures)
    bar = Progress(len(futures), "check", enabled=progress)
    try:
        for fut in as_completed(futures):
            # raises a task's own (unexpected) exception, or its read error as one line
            total += fut.result().unwrap()
            pending.discard(fut)
            fut.release()  # each task's counts are summed and let go at once
            bar.update()
    except BaseException:
        stop_tasks(client, list(pending))
        raise
    finally:
        bar.close()
    return _report(setup, total)


def _report(setup: CheckSetup, total: np.ndarray) -> CheckReport:
    """Unpack the summed counts vector into the report."""
    counts = []
    offset = 0
    metas = [setup.metadata] + ([setup.metadata.cols_input] if setup.metadata.cols_input else [])
    for v, (field, domain), meta in zip(setup.variables, setup.domains, metas, strict=True):
        m = v.features
        part = [int(n) for n in total[offset : offset + v.size]]
        offset += v.size
        box = isinstance(domain, BoxDomain)
        names = meta.feature_names if meta.feature_names is not None else tuple(range(m))
        counts.append(
            VariableCounts(
                variable=meta.variable,
                domain_field=field,
                domain=domain.describe(),
                feature_names=tuple(names),
                nan=tuple(part[:m]),
                inf=tuple(part[m : 2 * m]),
                below=tuple(part[2 * m : 3 * m]) if box else None,
                above=tuple(part[3 * m : 4 * m]) if box else None,
                over_radius=None if box else part[4 * m + 1],
                nonfinite_records=part[4 * m],
            )
        )
    g = setup.spec.group_by
    return CheckReport(
        store=setup.metadata.store,
        records=setup.metadata.records,
        input=counts[0],
        cols=counts[1] if len(counts) > 1 else None,
        group_variable=None if g is None else g.variable,
        groups=None if g is None else len(g.groups),
        undeclared_labels=None if g is None else int(total[-1]),
        on_violation=setup.spec.domain.on_violation,
        fills_missing=setup.spec.domain.missing != "error",
    )
