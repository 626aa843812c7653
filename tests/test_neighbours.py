"""Neighbour invariance: a release publishes nothing about one record except its noisy values.

For each configuration (query x algorithm x calibration family x neighbour relation x domain
kind x directions) a worst-case neighbouring pair is released with the same seed, the same
release id, the same plan time and the same input and output paths, one after the other:

* replace-one: record ``REPLACED`` of dataset A is replaced in B by an out-of-domain record, so
  B clips a record and A does not (this is the pair that told ``mvg_dask_clipped_count`` 0
  from 1);
* add-remove: B is A plus one out-of-domain record appended. A has exactly ``CHUNK * 5``
  records and B one more, so B also has one more input chunk (one more Dask task): anything
  that counts chunks or records shows up;
* a ``missing`` case (``domain.missing: {fill: ...}``): B's replaced or added record has NaN
  (filled with the declared values, then clipped), so B fills values and A does not.

Then every published byte other than the chunks of the noisy variables (:func:`noisy_variables`,
the one list of what may differ) must be identical: every ``zarr.json`` (group and array
metadata, attributes, the published plan), every coordinate and non-noise variable. The dry run
(``public_dict()``), the :class:`~mvg_dask.engine.release.ReleaseResult` and the INFO log lines
(with progress reporting on) must be identical too, and so must the CLI's stdout and log lines
(``test_cli_output_is_identical``).

This suite is the project's guard against data-dependent output. It would have caught both
earlier leaks:

* the add-remove N leak: the published plan (``mvg_dask_plan``, the ``input`` block of the dry
  run) carried ``records`` and the noise variables (``row_cov``, ``noise_variances``, and the
  attributes ``mahalanobis_sensitivity``, ``sensitivity``) scaled with ``1 / N``; with N = 320
  against 321 those bytes differ, and only ``covariance`` may differ here;
* the clipped-count leak: ``mvg_dask_clipped_count`` was an attribute of the root
  ``zarr.json`` and a field of the result, 0 for A and 1 for B in every replace-one pair.

Both releases use ``created = CREATED``: :func:`mvg_dask.api.release` is
``plan_release(spec, read_input_metadata(...), directions_matrix=...)`` followed by
``execute_release``; the tests make that same composition with the ``created`` argument of
:func:`~mvg_dask.plan.planning.plan_release` fixed, so nothing is masked in the outputs. The
CLI test goes through ``api.release`` itself (the CLI has no option to fix the plan time) and
masks only ``mvg_dask_created`` and the wall time, which are clock readings.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from mvg_dask import api
from mvg_dask.engine.metadata import load_directions_matrix, read_input_metadata
from mvg_dask.engine.release import ReleaseResult, execute_release
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.queries import query_type
from mvg_dask.spec import ReleaseSpec, parse_spec, resolve_paths
from tests.pipeline_helpers import add_group_variable, add_second_variable, make_input

M = 4
CHUNK = 64
RECORDS = 5 * CHUNK  # A's records; add-remove B has one more (and one more chunk)
REPLACED = 150  # the record replaced by an out-of-domain one (replace-one)
OUTSIDE = np.array([3.0, -3.0, 3.0, -3.0])  # outside both domains: always clipped
SEED = 20261122
CREATED = "2026-11-22T07:00:00+00:00"
N0 = 300  # the public normaliser of add-remove releases that declare one
N_MAX = 400  # a public bound on the record count (declared gamma, entry range)

#: variables that are allowed to differ between the two releases of a pair; everything else
#: (every other file, and the zarr.json of these) must be byte-identical
QUERY_VARIABLE = {
    "identity": ("X",),
    "covariance": ("covariance",),
    # the noisy augmented moment, and the mean and covariance computed from it
    "centered-covariance": ("moment", "mean", "covariance"),
    "regression": ("moment", "mean", "covariance"),
    "cross-covariance": ("cross_covariance",),
    "mean": ("mean",),
}
#: the cross-covariance cases' query (the input's feature names f0..f3)
CROSS_QUERY = {"cross-covariance": {"rows": ["f0", "f2"], "cols": ["f1", "f2", "f3"]}}
# DP-PCA: the directions are the eigenvectors of the noisy Gram matrix (Analyze Gauss) and the
# eigenvalues its eigenvalues; the noise covariance (row_cov, col_cov) and the per-direction
# noise variances are computed from those directions (and max-pnr from the eigenvalues). They are
# post-processing of a noisy value, charged as the direction step.
DP_PCA_VARIABLES = ("row_cov", "col_cov", "directions", "noise_variances", "dp_pca_eigenvalues")
# add-remove covariance without a public N0: the noisy sum X X^T + Z (Gaussian, charged as the
# release) and the noisy record count N + z / mu_count (Gaussian, charged as the count's share)
COUNT_VARIABLES = ("gram", "record_count")
# the mean-first route: the noisy mean, the centre (the noisy mean clamped into the box: a DP
# output, published as a data variable, never an attribute) and the covariance about it; step
# 2's noise description is planned on the box shifted by the centre, so it is noise-dependent
# too (post-processing of the noisy mean, charged as the mean step)
MEAN_FIRST_VARIABLES = (
    "mean",
    "centre",
    "covariance",
    "row_cov",
    "col_cov",
    "noise_variances",
    "symmetric_ratio",
)


@dataclass(frozen=True)
class Case:
    """One configuration of the suite."""

    query: str
    algorithm: str
    calibration: str
    neighbours: str  # "replace-one" | "add-remove"
    normaliser: int | None  # privacy.records (N0) of an add-remove release
    domain: str  # "box" | "l2"
    directions: str = "standard"  # "standard" | "matrix" | "dp-pca"
    allocation: str = "uniform"
    output: str = "float64"  # "float64" | "float32-zstd": a float32 input, zstd-compressed output
    # a grouped release (group_by): "move" (integer labels: the replaced record also moves from
    # group 0 to group 1) or "drop" (string labels: it moves to an undeclared label, dropped)
    group: str = ""
    # a two-variable cross-covariance (rows of X, cols of a second variable Y): the replaced
    # record changes in Y only
    second: bool = False
    route: str = ""  # a centered covariance's declared route ("" for the plain query)
    # domain.missing: {fill: FILL}: B's replaced (or added) record has NaN (filled, then clipped)
    missing: bool = False

    @property
    def id(self) -> str:
        nb = {"replace-one": "r1", "add-remove": "ar"}[self.neighbours]
        if self.neighbours == "add-remove":
            nb += "-n0" if self.normaliser else "-count"
        return "-".join(
            [self.query[:3], self.algorithm[:4], self.calibration, nb, self.domain, self.directions]
            + ([self.allocation] if self.allocation != "uniform" else [])
            + ([self.output] if self.output != "float64" else [])
            + ([f"group-{self.group}"] if self.group else [])
            + (["two-variables"] if self.second else [])
            + ([self.route] if self.route else [])
            + (["missing"] if self.missing else [])
        )

    @property
    def count_released(self) -> bool:
        return self.neighbours == "add-remove" and self.normaliser is None


def noisy_variables(case: Case) -> set[str]:
    """The variables whose values may differ between neighbouring datasets (see above)."""
    out = set(QUERY_VARIABLE[case.query])  # the privatized query output: data + calibrated noise
    if case.directions == "dp-pca":
        out |= set(DP_PCA_VARIABLES)
    if case.count_released:  # the noisy sum is the query type's (a covariance's gram)
        out |= {query_type(case.query).sum_variable, *COUNT_VARIABLES[1:]}
    if case.route == "mean-first":
        out = set(MEAN_FIRST_VARIABLES)
    return out


#: the replaced (added) record of a ``missing`` case: NaN (filled with :data:`FILL`, whose third
#: value lies outside both domains) and values outside the domain
MISSING = np.array([np.nan, 3.0, np.nan, -3.0])
FILL = [0.5, -0.5, 3.0, 0.0]


def with_missing(case: Case, b: np.ndarray) -> np.ndarray:
    """B of a ``missing`` case: its replaced (or added) record is :data:`MISSING` instead."""
    if not case.missing:
        return b
    b = b.copy()
    b[:, REPLACED if case.neighbours == "replace-one" else -1] = MISSING
    return b


def _covariance_cases() -> list[Case]:
    """Every (algorithm, calibration family, neighbour relation) for the covariance, the domain
    kind alternating so that every pair of factor values with the domain is covered too."""
    out = []
    variants: list[tuple[str, int | None]] = [
        ("replace-one", None),
        ("add-remove", N0),
        ("add-remove", None),
    ]
    for i, algorithm in enumerate(("unimodal", "equi-modal")):
        mgm = "mgm-udn" if algorithm == "unimodal" else "mgm"
        for j, calibration in enumerate(("exact", "mvg-thm2", mgm)):
            for k, (nb, n0) in enumerate(variants):
                domain = ("box", "l2")[(i + j + k) % 2]
                out.append(Case("covariance", algorithm, calibration, nb, n0, domain))
    for k, (nb, n0) in enumerate(variants):  # MVG Thm. 3: equi-modal only
        out.append(Case("covariance", "equi-modal", "mvg-thm3", nb, n0, ("l2", "box")[k % 2]))
    return out


CASES: list[Case] = [
    # identity: unimodal only (equi-modal needs a square query), replace-one only (add-remove
    # changes the output's shape; the plan refuses it)
    Case("identity", "unimodal", "exact", "replace-one", None, "box"),
    Case("identity", "unimodal", "exact", "replace-one", None, "l2"),
    Case("identity", "unimodal", "mvg-thm2", "replace-one", None, "box"),
    Case("identity", "unimodal", "mvg-thm2", "replace-one", None, "l2"),
    Case("identity", "unimodal", "mgm-idn", "replace-one", None, "box"),
    Case("identity", "unimodal", "mgm-udn", "replace-one", None, "l2"),
    Case("identity", "unimodal", "exact", "replace-one", None, "box", "matrix", "binary"),
    Case("identity", "unimodal", "mgm-udn", "replace-one", None, "l2", "matrix"),
    Case("identity", "unimodal", "exact", "replace-one", None, "l2", "dp-pca", "binary"),
    Case("identity", "unimodal", "mvg-thm2", "replace-one", None, "box", "dp-pca"),
    *_covariance_cases(),
    Case("covariance", "equi-modal", "exact", "add-remove", None, "box", "matrix", "binary"),
    Case("covariance", "unimodal", "mvg-thm2", "replace-one", None, "l2", "matrix"),
    Case("covariance", "equi-modal", "exact", "replace-one", None, "box", "dp-pca"),
    Case("covariance", "unimodal", "exact", "add-remove", None, "l2", "dp-pca", "max-pnr"),
    Case("covariance", "equi-modal", "mvg-thm2", "add-remove", N0, "box", "dp-pca", "binary"),
    Case("covariance", "unimodal", "mgm-udn", "add-remove", None, "box", "dp-pca"),
    # the symmetric mechanism (the default of an exact covariance), every relation and both
    # domain kinds, rotated and DP-PCA directions
    Case("covariance", "symmetric", "exact", "replace-one", None, "box"),
    Case("covariance", "symmetric", "exact", "replace-one", None, "l2", "matrix", "binary"),
    Case("covariance", "symmetric", "exact", "add-remove", N0, "l2"),
    Case("covariance", "symmetric", "exact", "add-remove", None, "box"),
    Case("covariance", "symmetric", "exact", "replace-one", None, "box", "dp-pca"),
    # the moment queries (the second moment of [x; 1]): both relations they take (replace-one),
    # both domain kinds, every noise form, DP-PCA directions
    Case("centered-covariance", "symmetric", "exact", "replace-one", None, "box"),
    Case("centered-covariance", "equi-modal", "mvg-thm2", "replace-one", None, "l2"),
    Case("centered-covariance", "unimodal", "exact", "replace-one", None, "box", "dp-pca"),
    Case("regression", "symmetric", "exact", "replace-one", None, "l2"),
    Case("regression", "equi-modal", "exact", "replace-one", None, "box", "dp-pca", "binary"),
    # cross-covariance: unimodal (Sigma on the row features, Psi = I); add-remove with N0
    Case("cross-covariance", "unimodal", "exact", "replace-one", None, "box"),
    Case("cross-covariance", "unimodal", "exact", "replace-one", None, "l2", allocation="binary"),
    Case("cross-covariance", "unimodal", "mvg-thm2", "replace-one", None, "box"),
    Case("cross-covariance", "unimodal", "exact", "add-remove", N0, "l2"),
    # and its own column covariance Psi (col_allocation): the plan's col_variances, col_cov
    Case("cross-covariance", "unimodal", "exact", "replace-one", None, "box", allocation="psi"),
    # between two variables of one store: a record of Y changes, X does not
    Case("cross-covariance", "unimodal", "exact", "replace-one", None, "box", second=True),
    # grouped releases: the replaced record moves to another group, or out of the declared ones
    Case("centered-covariance", "symmetric", "exact", "replace-one", None, "box", group="move"),
    Case("regression", "symmetric", "exact", "replace-one", None, "l2", group="drop"),
    Case("centered-covariance", "unimodal", "exact", "replace-one", None, "l2", group="move"),
    # the mean-first route (a DP mean, then the covariance about it), on the lattice
    Case(
        "centered-covariance", "symmetric", "exact", "replace-one", None, "box", route="mean-first"
    ),
    # the mean (one module: plan/queries/mean.py): both relations, the sum with a noisy count
    Case("mean", "unimodal", "exact", "replace-one", None, "box"),
    Case("mean", "unimodal", "mvg-thm2", "replace-one", None, "l2"),
    Case("mean", "unimodal", "exact", "add-remove", None, "l2"),
    Case("mean", "unimodal", "exact", "add-remove", N0, "box"),
    # missing values filled with a declared value (published as mvg_dask_missing, from the
    # spec): B's record has NaN where A's has values
    Case("covariance", "symmetric", "exact", "replace-one", None, "box", missing=True),
    # the scale-aware allocation a box of features of different widths gets by default (its
    # shares are published in the plan): every query it applies to, both relations
    Case("covariance", "symmetric", "exact", "replace-one", None, "scaled-box"),
    Case("covariance", "symmetric", "exact", "add-remove", None, "scaled-box"),
    Case("centered-covariance", "symmetric", "exact", "replace-one", None, "scaled-box"),
    Case("identity", "unimodal", "exact", "replace-one", None, "scaled-box"),
    Case("mean", "unimodal", "exact", "add-remove", N0, "scaled-box"),
    Case(
        "centered-covariance",
        "symmetric",
        "exact",
        "replace-one",
        None,
        "scaled-box",
        route="mean-first",
    ),
    Case("identity", "unimodal", "exact", "replace-one", None, "l2", missing=True),
    Case("covariance", "unimodal", "exact", "add-remove", None, "l2", missing=True),
    # output encoding: a float32 input gives a float32, zstd-compressed output
    Case("identity", "unimodal", "exact", "replace-one", None, "box", output="float32-zstd"),
    Case("covariance", "symmetric", "exact", "add-remove", None, "l2", output="float32-zstd"),
]


# -- data -------------------------------------------------------------------------------------
def base_data(domain: str, records: int = RECORDS) -> np.ndarray:
    """``M x records`` records strictly inside the domain (nothing is clipped in A)."""
    rng = np.random.default_rng(7)
    if domain in ("box", "scaled-box"):  # [-1, 1]^4, inside the scaled box too
        return rng.uniform(-0.95, 0.95, (M, records))
    return rng.uniform(-0.9, 0.9, (M, records))  # norms <= 1.8 < 2 = l2_norm


def replaced_record(records: int) -> int:
    """The record a replace-one pair replaces: ``REPLACED``, or the middle one of fewer."""
    return REPLACED if records > REPLACED else records // 2


def neighbouring_pair(case: Case, records: int = RECORDS) -> tuple[np.ndarray, np.ndarray]:
    """The worst-case pair ``(A, B)`` of the case's neighbour relation, A of ``records``
    records (a two-variable case: under replace-one the same ``X``, its ``Y`` differs,
    :func:`second_pair`; under add-remove B's added record is outside in both)."""
    a = base_data(case.domain, records)
    if case.second and case.neighbours == "replace-one":
        return a, a
    if case.neighbours == "replace-one":
        b = a.copy()
        b[:, replaced_record(records)] = OUTSIDE
        return a, b
    return a, np.concatenate([a, OUTSIDE[:, None]], axis=1)


#: the second variable ``Y`` of a two-variable case: 3 features in [-2, 2], the replaced record
#: moved outside (clipped)
Y_BOX = {"lower": -2.0, "upper": 2.0}
Y_OUTSIDE = np.array([5.0, -5.0, 5.0])


def second_pair(case: Case, records: int = RECORDS) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``Y`` of A and B (``None``: one variable): B's replaced record changes in ``Y``, or B
    has one more record, outside (add-remove)."""
    if not case.second:
        return None, None
    a = np.random.default_rng(11).uniform(-1.9, 1.9, (3, records))
    if case.neighbours == "add-remove":
        return a, np.concatenate([a, Y_OUTSIDE[:, None]], axis=1)
    b = a.copy()
    b[:, replaced_record(records)] = Y_OUTSIDE
    return a, b


#: a box whose features have different widths (the default allocation is scale-aware): it holds
#: :func:`base_data`'s box records, not :data:`OUTSIDE`
SCALED_BOX = {"lower": [-1.0, -2.0, -1.0, -2.5], "upper": [1.0, 2.0, 1.5, 0.5 + 2.0]}

GROUP_LABELS = {"move": [0, 1, 2], "drop": ["a", "b", "c"]}


def group_labels(case: Case, records: int = RECORDS) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The group labels of A and B (``None``: not grouped): B's replaced record moves from the
    first declared group to the second ("move") or to an undeclared label ("drop")."""
    if not case.group:
        return None, None
    declared = np.array(GROUP_LABELS[case.group], dtype=object)
    r = replaced_record(records)
    a = declared[np.arange(records) % 3]
    a[r] = declared[0]
    b = a.copy()
    b[r] = declared[1] if case.group == "move" else "undeclared"
    if case.group == "move":
        return a.astype(np.int64), b.astype(np.int64)
    return a, b


def spec_for(case: Case, root: Path) -> dict[str, Any]:
    """The spec of the case; the same for both datasets of a pair (same paths, same id)."""
    R = 4.0  # sup ||x||^2 of both domains: [-1, 1]^4 and the ball of radius 2
    mech: dict[str, Any] = {"algorithm": case.algorithm, "calibration": case.calibration}
    if case.neighbours == "add-remove" and case.calibration != "exact":
        # sup ||X X^T / N0||_F and the entries grow with the private count: declared public
        # bounds (N_MAX records at most)
        bound = N_MAX * R / (case.normaliser or 1)
        mech["gamma"] = bound
        mech["entry_range"] = [-bound, bound]
    if case.directions == "matrix":
        mech["directions"] = {"method": "matrix", "path": str(root / "directions.npy")}
    elif case.directions == "dp-pca":
        mech["directions"] = {"method": "dp-pca", "k": 2, "budget_share": 0.25}
    if case.allocation in ("binary", "psi"):
        mech["allocation"] = {"strategy": "binary", "share": 0.7}
        if case.directions != "dp-pca":
            mech["allocation"]["important"] = [0]
    elif case.allocation != "uniform":
        mech["allocation"] = {"strategy": case.allocation}
    privacy: dict[str, Any] = {"epsilon": 0.9, "delta": 1e-5, "neighbours": case.neighbours}
    if case.normaliser is not None:
        privacy["records"] = case.normaliser
    domain: dict[str, Any] = (
        {"box": {"lower": -1.0, "upper": 1.0}} if case.domain == "box" else {"l2_norm": 2.0}
    )
    if case.domain == "scaled-box":  # features of different widths: scale-aware by default
        domain = {"box": SCALED_BOX}
    grouped = (
        {"group_by": {"variable": "site", "groups": GROUP_LABELS[case.group]}} if case.group else {}
    )
    return {
        **grouped,
        "name": "neighbours",
        "release_id": "nbr-" + case.id,
        "input": {"store": str(root / "input.zarr"), "variable": "X"},
        "domain": {
            **domain,
            "on_violation": "clip",
            **({"missing": {"fill": FILL}} if case.missing else {}),
        },
        "query": (
            {"centered-covariance": {"route": case.route}}
            if case.route
            else {"regression": {"target": "f2"}}
            if case.query == "regression"
            else _cross_query(case)
            if case.query == "cross-covariance"
            else case.query
        ),
        "mechanism": mech,
        "privacy": privacy,
        "output": {
            "store": str(root / "release.zarr"),
            **({"codec": "zstd"} if case.output == "float32-zstd" else {}),
        },
    }


def _cross_query(case: Case) -> dict[str, Any]:
    """:data:`CROSS_QUERY`, with a binary column allocation for the ``psi`` case; a
    two-variable case's columns are features of ``Y``."""
    if case.second:
        cols = {"variable": "Y", "features": ["g2", "g0"], "box": Y_BOX}
        return {"cross-covariance": {"rows": ["f0", "f2"], "cols": cols}}
    if case.allocation != "psi":
        return CROSS_QUERY
    col = {"strategy": "binary", "important": ["f3"], "share": 0.6}
    return {"cross-covariance": {**CROSS_QUERY["cross-covariance"], "col_allocation": col}}


def write_directions(root: Path) -> None:
    W = np.linalg.qr(np.random.default_rng(3).standard_normal((M, M)))[0]
    np.save(root / "directions.npy", W)


def put_input(
    root: Path,
    X: np.ndarray,
    labels: np.ndarray | None = None,
    Y: np.ndarray | None = None,
    *,
    chunk: int = CHUNK,
    records_first: bool = False,
) -> None:
    """(Re)write the input at the one input path both releases of a pair read (with the group
    variable ``site`` of a grouped case, the second variable ``Y`` of a two-variable case), in
    record chunks of ``chunk``, stored ``features x records`` or ``records_first``."""
    shutil.rmtree(root / "input.zarr", ignore_errors=True)
    make_input(root / "input.zarr", X, chunk=chunk, records_first=records_first)
    if labels is not None:
        add_group_variable(root / "input.zarr", labels)
    if Y is not None:
        add_second_variable(root / "input.zarr", Y, chunk=chunk)


# -- comparison -------------------------------------------------------------------------------
def published_files(store: Path) -> dict[str, bytes]:
    """Every file of a release (relative path -> bytes)."""
    return {
        p.relative_to(store).as_posix(): p.read_bytes()
        for p in sorted(store.rglob("*"))
        if p.is_file()
    }


def assert_same_except_noisy(a: Path, b: Path, noisy: set[str]) -> dict[str, list[str]]:
    """Same file list; same bytes for every file except the chunks of ``noisy`` variables.

    Returns the noisy chunk files of each noisy variable that differ (a sanity check that the
    pair really differs in its noisy values)."""
    fa, fb = published_files(a), published_files(b)
    assert sorted(fa) == sorted(fb), "the two releases have different files"
    assert "zarr.json" in fa
    differing: dict[str, list[str]] = {}
    for name in fa:
        top = name.split("/", 1)[0]
        if top in noisy and name != f"{top}/zarr.json":
            if fa[name] != fb[name]:
                differing.setdefault(top, []).append(name)
            continue
        assert fa[name] == fb[name], f"{name} differs between neighbouring datasets"
    # every variable of the output is either checked byte by byte or listed as noisy
    variables = {n.split("/", 1)[0] for n in fa if "/" in n}
    assert noisy <= variables | {"col_cov", "dp_pca_eigenvalues"}, noisy - variables
    return differing


def result_facts(result: ReleaseResult, case: Case) -> dict[str, Any]:
    """The result's fields; for DP-PCA the plan without
    the fields computed from the noisy directions."""
    plan = result.plan.to_dict()
    if case.route == "mean-first":  # step 2's plan about the noisy centre: its public form
        # (the symmetric ratio follows the box about the noisy centre: post-processing)
        for name in ("domain", "sensitivity", "gamma", "precision_budget", "symmetric_ratio"):
            plan.pop(name, None)
    if case.directions == "dp-pca" or case.route == "mean-first":
        for name in (
            "row_variances",
            "col_variances",
            "mahalanobis_sensitivity",
            "implied_epsilon",
            "directions",
            "lattice",  # the float error and grid follow the directions' whitening
        ):
            plan.pop(name, None)
        plan["allocation"].pop("theta")
    return {
        "release_id": result.release_id,
        "output": result.output,
        "seeded": result.seeded,
        "plan": plan,
    }


def log_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    """The captured records of the ``mvg_dask`` loggers at INFO and above (no timestamps)."""
    return [
        (r.name, r.levelname, r.getMessage())
        for r in caplog.records
        if r.name.startswith("mvg_dask") and r.levelno >= logging.INFO
    ]


def release_once(
    case: Case,
    root: Path,
    X: np.ndarray,
    client: Any,
    caplog: pytest.LogCaptureFixture,
    tag: str,
    labels: np.ndarray | None = None,
    Y: np.ndarray | None = None,
) -> dict[str, Any]:
    """Release ``X`` (with its group ``labels``, its second variable ``Y``) with the case's
    spec; move the output to ``root/tag.zarr``."""
    put_input(root, X.astype(np.float32) if case.output == "float32-zstd" else X, labels, Y)
    raw = spec_for(case, root)
    spec: ReleaseSpec = resolve_paths(parse_spec(raw), root)
    dry = api.dry_run(raw).public_dict()
    rplan = plan_release(
        spec,
        read_input_metadata(spec.input, cols_variable=spec.cols_variable),
        directions_matrix=load_directions_matrix(spec),
        created=CREATED,
    )
    # the fixed-clock plan is the API's plan (only the clock reading differs)
    assert {**dry, "created": CREATED} == rplan.public_dict()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mvg_dask"):
        result = execute_release(rplan, client, seed=SEED, progress=True)
    logs = log_lines(caplog)
    shutil.move(root / "release.zarr", root / f"{tag}.zarr")
    return {
        "dry_run": json.dumps(rplan.public_dict()),
        "api_dry_run": json.dumps({**dry, "created": None}),
        "result": result_facts(result, case),
        "logs": logs,
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_only_noisy_values_differ(case: Case, tmp_path: Path, client, caplog) -> None:
    write_directions(tmp_path)
    A, B = neighbouring_pair(case)
    B = with_missing(case, B)
    la, lb = group_labels(case)
    ya, yb = second_pair(case)
    ra = release_once(case, tmp_path, A, client, caplog, "a", la, ya)
    rb = release_once(case, tmp_path, B, client, caplog, "b", lb, yb)
    differing = assert_same_except_noisy(
        tmp_path / "a.zarr", tmp_path / "b.zarr", noisy_variables(case)
    )
    assert ra["dry_run"] == rb["dry_run"]
    assert ra["api_dry_run"] == rb["api_dry_run"]
    assert ra["result"] == rb["result"]
    assert ra["logs"] == rb["logs"]
    assert any("%" in line[2] for line in ra["logs"]), "progress was not reported"
    # the pair really differs, and only through the noisy query output (same seed: same noise)
    assert set(QUERY_VARIABLE[case.query]) - {"moment"} <= set(differing)
    if case.missing:  # the declared fill is published (the same for both); no filled count
        attrs = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())["attributes"]
        assert json.loads(attrs["mvg_dask_missing"]) == {"fill": FILL}
    if case.output == "float32-zstd":  # the encoding the case asks for is what was written
        meta = json.loads(
            (tmp_path / "a.zarr" / QUERY_VARIABLE[case.query][0] / "zarr.json").read_text()
        )
        want = "float32" if case.query == "identity" else "float64"
        assert meta["data_type"] == want
        assert any(c["name"] == "zstd" for c in meta["codecs"])


# -- the command line -------------------------------------------------------------------------
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "mvg_dask", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _cli_release(
    case: Case, root: Path, X: np.ndarray, scheduler: str, tag: str, chunk: int = CHUNK
) -> tuple[str, str, list[str]]:
    put_input(root, X, chunk=chunk)
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_for(case, root)))
    dry = _cli(["release", str(spec), "--dry-run", "--json"], root)
    assert dry.returncode == 0, dry.stderr
    summary = _cli(["release", str(spec), "--dry-run"], root)  # the human summary
    assert summary.returncode == 0, summary.stderr
    run = _cli(["release", str(spec), "--seed", str(SEED), "--scheduler", scheduler], root)
    assert run.returncode == 0, run.stderr
    shutil.move(root / "release.zarr", root / f"{tag}.zarr")
    dry_plan = json.loads(dry.stdout)
    dry_plan["created"] = None  # the clock at planning time
    stdout = run.stdout.strip()  # no clock reading: the wall time is a DEBUG log line only
    logs = [
        _TIMESTAMP.sub("", line)
        for line in run.stderr.splitlines()
        if _TIMESTAMP.match(line) and " mvg_dask " in line
    ]
    return json.dumps(dry_plan) + "\n" + summary.stdout, stdout, logs


def _mask_created(store: Path) -> None:
    """Blank the one attribute that is a clock reading (the plan time of ``api.release``)."""
    meta = json.loads((store / "zarr.json").read_text())
    assert "mvg_dask_created" in meta["attributes"]
    meta["attributes"]["mvg_dask_created"] = None
    (store / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [CHUNK, 100_000], ids=["chunks", "one-chunk"])
def test_cli_output_is_identical(tmp_path: Path, client, chunk: int) -> None:
    """``python -m mvg_dask release SPEC --seed S`` (release id in the spec: the CLI has no
    release-id option): same stdout, same log lines but the timestamps, same
    dry-run JSON but the plan time, same published bytes but the noisy chunks and the plan time.

    One configuration (four CLI processes): add-remove covariance with a noisy count and DP-PCA
    directions, whose B clips its added record and has one more input chunk than A (in
    ``CHUNK``-record chunks), or whose one chunk is one record longer (a one-chunk store)."""
    case = Case("covariance", "equi-modal", "exact", "add-remove", None, "box", "dp-pca")
    write_directions(tmp_path)
    A, B = neighbouring_pair(case)
    scheduler = client.scheduler.address
    dry_a, out_a, logs_a = _cli_release(case, tmp_path, A, scheduler, "a", chunk)
    dry_b, out_b, logs_b = _cli_release(case, tmp_path, B, scheduler, "b", chunk)
    assert "complete" in out_a
    assert out_a == out_b
    assert dry_a == dry_b
    assert logs_a and logs_a == logs_b
    for tag in ("a", "b"):
        _mask_created(tmp_path / f"{tag}.zarr")
    differing = assert_same_except_noisy(
        tmp_path / "a.zarr", tmp_path / "b.zarr", noisy_variables(case)
    )
    assert set(QUERY_VARIABLE[case.query]) <= set(differing)


def test_progress_lines_do_not_tell_the_chunk_count(caplog) -> None:
    """Under add-remove the number of chunks tells the record count to within a chunk; the
    progress log lines must be the same for any number of chunks (the lines of 5 and 6 chunks
    differed before: 10/30/50/70/90% against 10/20/40/60/70/90%)."""
    from mvg_dask.engine.cluster import Progress

    seen = set()
    for total in range(1, 41):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="mvg_dask"):
            progress = Progress(total, "gram", enabled=True, private_total=True)
            for _ in range(total):
                progress.update()
            progress.close()
        seen.add(tuple(log_lines(caplog)))
    assert seen == {tuple(("mvg_dask", "INFO", f"gram: {10 * i}%") for i in range(1, 11))}


# -- streams: every period of a stream -----------------------------------------------------
def _stream_periods(
    root: Path, X: np.ndarray, sizes: list[int], client: Any, band: int | None = None
) -> list[Any]:
    """Release one period of an add-remove covariance stream per entry of ``sizes``."""
    from tests.pipeline_helpers import make_input

    spec = {
        "name": "nightly",
        "input": {"store": str(root / "in.zarr"), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": "covariance",
        "privacy": {"epsilon": 1.0, "delta": 1e-6, "neighbours": "add-remove"},
        "output": {"store": str(root / "out")},
        "stream": {"horizon": 8, "factorization": "tree", "max_records": 10_000},
    }
    if band is not None:  # the banded square root (its description and its state line)
        spec["stream"] |= {"factorization": "square-root", "band": band}
    facts = []
    for n in sizes:
        shutil.rmtree(root / "in.zarr", ignore_errors=True)
        make_input(root / "in.zarr", X[:, :n], chunk=16)
        facts.append((api.stream_dry_run(spec).text, api.release(spec, client=client, seed=SEED)))
    return facts


@pytest.mark.slow
@pytest.mark.parametrize("band", [None, 4])
def test_stream_periods_publish_only_noisy_values(band: int | None, tmp_path: Path, client) -> None:
    """Add-remove: ``B`` is ``A`` with one record more in period 2. Every period's store, the
    stream's description, the results and the dry runs are byte-identical but for the noisy
    values: no watermark, record count, period size or input shape is published."""
    rng = np.random.default_rng(11)
    A = rng.uniform(0.0, 1.0, (4, 60))
    B = np.insert(A, 25, rng.uniform(0.0, 1.0, 4), axis=1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fa = _stream_periods(tmp_path / "a", A, [20, 40], client, band)
    fb = _stream_periods(tmp_path / "b", B, [20, 41], client, band)
    for (text_a, res_a), (text_b, res_b) in zip(fa, fb, strict=True):
        assert text_a == text_b
        assert res_a.plan.to_json() == res_b.plan.to_json()
        same = {"plan": None, "output": None}
        assert vars(res_a) | same == vars(res_b) | same
    a, b = tmp_path / "a" / "out", tmp_path / "b" / "out"
    assert (a / "stream.json").read_bytes() == (b / "stream.json").read_bytes()
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    differing = {}
    for t in (1, 2):
        name = f"period-{t:04d}"
        differing[t] = assert_same_except_noisy(
            a / name, b / name, {"covariance", "gram", "record_count"}
        )
    assert not differing[1] and differing[2]  # period 1 is the same data


@pytest.mark.parametrize("query", ["covariance", "mean"])
def test_a_streams_public_bytes_ignore_the_record_count_and_chunk_grid(query: str) -> None:
    """Add-remove: the record count, the input's shape and its chunk grid are private, so a
    stream's description, a period's provenance and stream attributes, the dry run's text and
    the period plan are the same for stores of 20 records in chunks of 16, 21 in chunks of 7
    and 2,000 in one chunk (planning only: nothing is read; the std factor as the engine
    writes it, with its replace-one rescaling)."""
    from mvg_dask.engine.provenance import provenance
    from mvg_dask.engine.stream import rescale
    from mvg_dask.engine.stream_store import stream_attrs, stream_description
    from mvg_dask.plan.input_metadata import InputMetadata
    from mvg_dask.plan.stream import one_shot_plan, plan_stream, preview_stream

    spec = ReleaseSpec.model_validate(
        {
            "name": "nightly",
            "input": {"store": "/data/in.zarr", "variable": "X"},
            "domain": {"box": {"lower": 0.0, "upper": 1.0}},
            "query": query,
            "privacy": {"epsilon": 1.0, "delta": 1e-6, "neighbours": "add-remove"},
            "output": {"store": "/data/out"},
            "stream": {"horizon": 8, "factorization": "tree", "max_records": 10_000},
        }
    )

    def public(records: int, chunk: int) -> tuple[str, ...]:
        meta = InputMetadata(
            store="/data/in.zarr", variable="X", record_dim="r", feature_dim="f",
            dims=("f", "r"), shape=(4, records), dtype="float64", record_chunk=chunk,
        )  # fmt: skip
        stream = plan_stream(spec, meta)
        text = preview_stream(stream, one_shot_plan(spec, meta), 2).text
        return (
            json.dumps(stream_description(stream), sort_keys=True),
            json.dumps(provenance(stream.plan, seeded=False), sort_keys=True, default=str),
            json.dumps(stream_attrs(stream, 2, "2", rescale(stream, records)), sort_keys=True),
            text,
            stream.plan.noise_plan().to_json(),
        )

    first = public(20, 16)
    assert public(21, 7) == first
    assert public(2000, 2000) == first
