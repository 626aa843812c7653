"""Grouped releases (``group_by``): one moment release per declared group, in one pass, costing
one release's budget (docs/concepts/queries.md, "Grouped releases"; docs/bounds.md, Sec. 15
and 17).

At a huge epsilon every group's ``mean`` and ``covariance`` equal numpy on that group's clipped
records and undeclared labels are ignored; each group's noise is the plan's draw under its own
key; the joint sensitivity is checked against a brute force over the box's corners; the lattice
charges both changed groups; the bytes do not depend on the engine; bad specs are refused before
anything is written or charged.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.engine.records import group_indices
from mvg_dask.engine.stages.covariance import covariance_noise
from mvg_dask.engine.tasks.gram import grouped_gram
from mvg_dask.errors import DataError, ReleaseError
from mvg_dask.noise import NoiseKey
from mvg_dask.plan import BoxDomain, L2BallDomain
from mvg_dask.plan.queries import CenteredCovarianceQuery, query_from_dict
from mvg_dask.plan.queries.moment import (
    augmented_domain,
    augmented_gram,
    grouped_centered_from_moment,
)
from mvg_dask.spec import SpecError
from tests.pipeline_helpers import (
    add_group_variable,
    assert_same_bytes_whatever_the_engine,
    data,
    make_input,
    spec_dict,
)

HUGE = {"epsilon": 1e9, "delta": 1e-5}
GROUPS = [0, 1, 2]


def _spec(store: str, out: Path, query: Any = "centered-covariance", **overrides: Any) -> dict:
    group_by = overrides.pop("group_by", {"variable": "site", "groups": GROUPS})
    spec = spec_dict(store, str(out), query="covariance", **overrides)
    spec["query"] = query
    spec["mechanism"].pop("algorithm")  # the default of an exact moment release: symmetric
    spec["group_by"] = group_by
    return spec


def _grouped_input(tmp_path: Path, m: int, n: int, labels: np.ndarray, chunk: int) -> tuple:
    X = data(m, n, seed=11)
    store = make_input(tmp_path / "in.zarr", X, chunk=chunk)
    add_group_variable(store, labels)
    return X, store


@pytest.mark.parametrize("noise", ["lattice", "float"])
@pytest.mark.parametrize("labels", ["int", "str"])
def test_each_group_is_numpy_at_a_huge_epsilon(tmp_path, client, noise, labels):
    """Every group's mean and covariance are numpy's (``np.cov(bias=True)``) on that group's
    clipped records; records labelled 7 (not declared) are ignored; the moment of a group is
    ``Z_g Z_g^T / N`` with the global N (``z = [x - c; s]``, ``c`` the box's centre)."""
    n = 3000
    raw = np.random.default_rng(5).choice([0, 1, 2, 7], size=n, p=[0.3, 0.3, 0.3, 0.1])
    groups: list[Any] = GROUPS
    stored: np.ndarray = raw
    if labels == "str":
        groups = ["north", "south", "east"]
        names = {0: "north", 1: "south", 2: "east", 7: "elsewhere"}
        stored = np.array([names[int(v)] for v in raw], dtype=object)
    X, store = _grouped_input(tmp_path, 4, n, stored, chunk=256)
    spec = _spec(
        store,
        tmp_path / "g.zarr",
        privacy=HUGE,
        group_by={"variable": "site", "groups": groups},
        mechanism={"noise": noise},
    )
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    assert ds["moment"].dims == ("group", "term_row", "term_col")
    assert ds["mean"].dims == ("group", "feature")
    assert ds["covariance"].dims == ("group", "feature_row", "feature_col")
    assert list(ds["group"].values) == groups
    Xc = np.clip(X, 0, 1)
    scale = json.loads(ds.attrs["mvg_dask_plan"])["query"]["scale"]
    assert scale == 0.5  # [0, 1]^4's constant (augmented_scale)
    for g in range(3):
        mine = Xc[:, raw == g]
        Z = np.vstack([mine - 0.5, np.full(mine.shape[1], scale)])  # about the box's centre
        np.testing.assert_allclose(ds["moment"].values[g], Z @ Z.T / n, atol=1e-6)
        np.testing.assert_allclose(ds["mean"].values[g], mine.mean(axis=1), atol=1e-5)
        np.testing.assert_allclose(ds["covariance"].values[g], np.cov(mine, bias=True), atol=1e-5)
    plan = json.loads(ds.attrs["mvg_dask_plan"])
    assert plan["query"]["groups"] == groups and plan["query"]["group_variable"] == "site"
    # the curator-side count of dropped records reaches no attribute
    assert not any("drop" in k or "clipped" in k for k in ds.attrs)


def test_each_group_has_the_plans_noise_under_its_own_key(tmp_path, client, caplog):
    """Float noise, seed 3: group ``i``'s published moment is its ``Z_g Z_g^T / N`` plus the
    plan's draw under ``release / group-<i>`` (to the last bits of the sums); two groups with
    the same records get different noise (independent keys)."""
    n = 1200
    labels = np.arange(n) % 2
    X = data(3, n, seed=2)
    X[:, 1::2] = X[:, 0::2]  # both groups hold the same records
    store = make_input(tmp_path / "in.zarr", X, chunk=300)
    add_group_variable(store, labels)
    spec = _spec(
        store,
        tmp_path / "g.zarr",
        group_by={"variable": "site", "groups": [0, 1]},
        mechanism={"noise": "float"},
    )
    with caplog.at_level(logging.DEBUG, logger="mvg_dask"):
        result = api.release(spec, client=client, seed=3, progress=False)
    # the curator-side count (clipped values and dropped records) reaches no log line
    assert not any("clipped" in r.getMessage() for r in caplog.records)
    ds = api.open_release(result.output)
    plan = api.dry_run(spec).noise_plan()
    key = NoiseKey.from_seed(3).derive("release")
    Xc = np.clip(X, 0, 1)
    scale = json.loads(ds.attrs["mvg_dask_plan"])["query"]["scale"]
    for g in range(2):
        Z = np.vstack([Xc[:, labels == g] - 0.5, np.full(n // 2, scale)])  # about the centre
        want = Z @ Z.T / n + covariance_noise(plan, key.derive(f"group-{g}"))
        # the same draw; the sums differ from the chunked ones in their last bits only
        np.testing.assert_allclose(ds["moment"].values[g], want, rtol=0, atol=1e-15)
    assert not np.allclose(ds["moment"].values[0], ds["moment"].values[1])


@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_only_the_two_changed_groups_differ_between_neighbours(tmp_path, client, noise):
    """The premise of the lattice charge (docs/bounds.md, Sec. 15 and 17): between
    neighbouring datasets whose record 5 changes its value and moves from group 0 to group 1,
    with the same key, group 2's published values are byte-identical (its records, their order
    and its noise are the same), while groups 0 and 1 differ. Also a move to an undeclared
    label (dropped): only group 0 differs."""
    n = 2000
    X = data(3, n, seed=4)
    labels = np.arange(n) % 3
    labels[5] = 0

    def release(tag: str, values: np.ndarray, site: np.ndarray) -> list[bytes]:
        root = tmp_path / tag
        root.mkdir()
        store = make_input(root / "in.zarr", values, chunk=256)
        add_group_variable(store, site)
        spec = _spec(store, root / "o.zarr", mechanism={"noise": noise}, release_id="same-id")
        ds = api.open_release(api.release(spec, client=client, seed=9, progress=False).output)
        return [ds["moment"].values[g].tobytes() for g in range(3)]

    a = release("a", X, labels)
    Y = X.copy()
    Y[:, 5] = [1.7, -0.4, 0.9]
    moved = labels.copy()
    moved[5] = 1
    b = release("b", Y, moved)
    assert a[2] == b[2] and a[0] != b[0] and a[1] != b[1]
    dropped = labels.copy()
    dropped[5] = 7
    c = release("c", X, dropped)
    assert a[1] == c[1] and a[2] == c[2] and a[0] != c[0]


def test_grouped_gram_matches_the_groups_own_grams():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (3, 50))
    index = rng.integers(-1, 4, 50)
    out = grouped_gram(x, index, 5)  # group 4 is empty
    for g in range(5):
        np.testing.assert_allclose(out[g], augmented_gram(x[:, index == g]), rtol=1e-13)
        assert out[g, 3, 3] == np.count_nonzero(index == g)
    # a group's bytes are fixed by its own records: the others' may change
    other = index.copy()
    other[index == 0] = np.where(np.arange(np.count_nonzero(index == 0)) % 2, -1, 1)
    np.testing.assert_array_equal(grouped_gram(x, other, 5)[[2, 3]], out[[2, 3]])
    assert group_indices(np.array([2, 5, 0, 9]), (5, 0, 2)).tolist() == [2, 0, 1, -1]
    words = np.array(["b", "zz", "a"], dtype=object)
    assert group_indices(words, ("a", "b")).tolist() == [1, -1, 0]


def test_non_positive_corner_gives_nan():
    moments = np.zeros((2, 3, 3))
    moments[0] = [[0.5, 0.1, 0.4], [0.1, 0.4, 0.3], [0.4, 0.3, 0.5]]
    moments[1, 2, 2] = -1e-3
    mean, cov = grouped_centered_from_moment(moments)
    np.testing.assert_allclose(mean[0], [0.8, 0.6])
    np.testing.assert_allclose(cov[0], [[1.0 - 0.64, 0.2 - 0.48], [0.2 - 0.48, 0.8 - 0.36]])
    assert np.isnan(mean[1]).all() and np.isnan(cov[1]).all()


# -- the joint sensitivity --------------------------------------------------------------------
def _grouped(query: CenteredCovarianceQuery) -> CenteredCovarianceQuery:
    return CenteredCovarianceQuery(
        query.features, query.records, groups=("a", "b", "c"), group_variable="site"
    )


@pytest.mark.parametrize(
    "domain",
    [
        BoxDomain.create([0.0, 0.0], [1.0, 1.0], 2),  # sign-definite: replace-one = add-remove
        BoxDomain.create([-1.0, 0.0], [1.0, 2.0], 2),
        L2BallDomain(1.5, 2),
    ],
)
def test_joint_l2_sensitivity_against_a_brute_force(domain):
    """``s_2`` of a grouped release is ``max(s_replace-one, sqrt(2) s_add-remove)``; a brute
    force over pairs of augmented records (the box's corners, or 2,000 points of the sphere;
    seed 0) of both kinds of neighbour, a replacement within a group and a move between two
    groups, never exceeds it, and a move of a corner record comes within 1e-12 of it on the
    boxes (where the bound is attained)."""
    q = CenteredCovarianceQuery(3, 100)
    g = _grouped(q)
    aug = augmented_domain(domain)
    within = q.l2_sensitivity(aug, "replace-one")
    moved = q.l2_sensitivity(aug, "add-remove")
    joint = g.l2_sensitivity(aug, "replace-one")
    assert joint == max(within, math.sqrt(2.0) * moved)
    if isinstance(domain, BoxDomain):
        points = [
            np.array(c) for c in itertools.product(*zip(domain.lower, domain.upper, strict=True))
        ]
    else:
        rng = np.random.default_rng(0)
        u = rng.standard_normal((2000, 2))
        points = list(domain.radius * u / np.linalg.norm(u, axis=1, keepdims=True))
    zs = np.array([np.append(p, 1.0) for p in points])
    outer = np.einsum("pi,pj->pij", zs, zs) / 100  # every record's z z^T / N
    sq = np.einsum("pij,pij->p", outer, outer)
    worst = 0.0
    for start in range(0, len(outer), 250):  # every pair, 250 rows of pairs at a time
        a = outer[start : start + 250, None]
        replace = np.sqrt(np.einsum("abij,abij->ab", a - outer[None], a - outer[None]))
        move = np.sqrt(sq[start : start + 250, None] + sq[None, :])  # g loses z, g' gains w
        worst = max(worst, float(replace.max()), float(move.max()))
    assert worst <= joint * (1 + 1e-12)
    if isinstance(domain, BoxDomain):
        assert worst >= joint * (1 - 1e-12)


def test_joint_whitened_sensitivity_is_the_elementwise_max():
    """``Delta_M`` of a grouped release, for every noise form, is ``max(Delta_replace-one, sqrt(2)
    Delta_add-remove)`` of one group's query (ratio by ratio for symmetric noise), and a Monte
    Carlo over moves of random corner records (unimodal noise, 5,000 pairs, seed 1) stays below
    it."""
    q = CenteredCovarianceQuery(4, 50)
    g = _grouped(q)
    aug = augmented_domain(BoxDomain.create([-1.0, 0.0, 0.5], [1.0, 2.0, 1.0], 3))
    p = np.array([2.0, 1.0, 0.5, 3.0])
    for algorithm in ("unimodal", "equi-modal"):
        want = max(
            q.mahalanobis_sensitivity(aug, "replace-one", p, algorithm),
            math.sqrt(2.0) * q.mahalanobis_sensitivity(aug, "add-remove", p, algorithm),
        )
        assert g.mahalanobis_sensitivity(aug, "replace-one", p, algorithm) == want
    ratios = [0.5, 1.0, 2.0]
    a = q.mahalanobis_sensitivities(aug, "replace-one", p, directions=None, ratios=ratios)
    b = q.mahalanobis_sensitivities(aug, "add-remove", p, directions=None, ratios=ratios)
    got = g.mahalanobis_sensitivities(aug, "replace-one", p, directions=None, ratios=ratios)
    assert got == [max(x, math.sqrt(2.0) * y) for x, y in zip(a, b, strict=True)]
    bound = g.mahalanobis_sensitivity(aug, "replace-one", p, "unimodal")
    rng = np.random.default_rng(1)
    lo, hi = aug.lower, aug.upper
    for _ in range(5000):
        z, w = (np.where(rng.random(4) < 0.5, lo, hi) for _ in range(2))
        # unimodal noise A Z with A A^T = diag(1 / p): whitened by diag(sqrt(p)) on the left
        dz, dw = (
            np.sqrt(p)[:, None] * np.outer(z, z) / 50,
            np.sqrt(p)[:, None] * np.outer(w, w) / 50,
        )
        assert math.hypot(np.linalg.norm(dz), np.linalg.norm(dw)) <= bound * (1 + 1e-12)
    with pytest.raises(ValueError, match="replace-one"):
        g.l2_sensitivity(aug, "add-remove")


def test_a_declared_sensitivity_is_checked_against_the_joint_bound():
    """A declared ``s_2`` of a grouped query must be at least the joint bound (the ungrouped
    one is not enough), and ``exact`` scales ``Delta_M`` by ``declared / joint``."""
    from mvg_dask.plan.queries import DeclaredBoundError

    aug = augmented_domain(BoxDomain.create([0.0] * 3, [1.0] * 3, 3))
    g = _grouped(CenteredCovarianceQuery(4, 100))
    joint = g.l2_sensitivity(aug, "replace-one")
    one = g.ungrouped().l2_sensitivity(aug, "replace-one")
    assert joint == pytest.approx(math.sqrt(2.0) * one)  # sign-definite: s_r = s_a = R / N
    low = CenteredCovarianceQuery(
        4, 100, sensitivity=one, groups=("a", "b", "c"), group_variable="site"
    )
    with pytest.raises(DeclaredBoundError, match="below the bound"):
        low.check_declared(aug, "replace-one")
    high = CenteredCovarianceQuery(
        4, 100, sensitivity=2 * joint, groups=("a", "b", "c"), group_variable="site"
    )
    assert high.sensitivity_excess(aug, "replace-one") == pytest.approx(2.0)
    p = np.ones(4)
    assert high.mahalanobis_sensitivity(aug, "replace-one", p, "unimodal") == pytest.approx(
        2.0 * g.mahalanobis_sensitivity(aug, "replace-one", p, "unimodal")
    )


def test_the_lattice_charges_both_changed_groups(tmp_path):
    """A grouped lattice plan charges ``2 c`` coordinates and ``sqrt(2) E`` (its inflation is
    ``sqrt(2) (2 E + grid sqrt(c))``), against the same release ungrouped."""
    X = data(4, 2000, seed=1)
    store = make_input(tmp_path / "in.zarr", X, chunk=500)
    add_group_variable(store, np.arange(2000) % 3)
    grouped = api.dry_run(_spec(store, tmp_path / "o.zarr"))
    plain_spec = _spec(store, tmp_path / "o.zarr")
    plain_spec.pop("group_by")
    plain = api.dry_run(plain_spec)
    lg, lp = grouped.noise_plan().lattice, plain.noise_plan().lattice
    assert lg is not None and lp is not None
    assert lg.coordinates == 2 * lp.coordinates
    # E is linear in the whitening: compare at the same variances
    from mvg_dask.plan.noise_calibration import release_float_error

    q = grouped.query
    args = (
        grouped.query.record_domain(grouped.domain),
        "symmetric",
        grouped.noise_plan().directions,
    )
    v = grouped.noise_plan().row_variances
    ratio = grouped.noise_plan().symmetric_ratio
    e_g = release_float_error(q, *args, v, ratio, grouped.lattice_context)
    e_p = release_float_error(q.ungrouped(), *args, v, ratio, grouped.lattice_context)
    assert e_g == pytest.approx(math.sqrt(2.0) * e_p, rel=1e-12)
    # the joint sensitivity raises the noise: every variance is larger than ungrouped
    assert np.all(grouped.noise_plan().row_variances > plain.noise_plan().row_variances)


def test_query_round_trip_and_plan_bytes():
    q = query_from_dict(
        {
            "kind": "centered-covariance",
            "features": 4,
            "records": 10,
            "groups": ["a", "b"],
            "group_variable": "site",
        }
    )
    assert q.groups == ("a", "b") and query_from_dict(q.to_dict()) == q
    plain = CenteredCovarianceQuery(4, 10)
    assert "groups" not in plain.to_dict() and "group_variable" not in plain.to_dict()
    assert q.ungrouped() == plain
    with pytest.raises(ValueError, match="cannot be grouped"):
        query_from_dict(
            {
                "kind": "covariance",
                "features": 4,
                "records": 10,
                "groups": [1],
                "group_variable": "s",
            }
        )


def test_dry_run_names_the_groups(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(4, 600, seed=1), chunk=200)
    add_group_variable(store, np.arange(600) % 3)
    spec = _spec(store, tmp_path / "o.zarr", {"regression": {"target": "f2"}})
    plan = api.dry_run(spec)
    assert plan.stages == ("gram", "moment")
    from mvg_dask.plan.presentation import _query_text

    text = _query_text(plan)
    assert "3 declared groups" in text and "'site'" in text
    public = plan.public_dict()
    assert public["plan"]["query"]["groups"] == GROUPS
    assert not (tmp_path / "o.zarr").exists()
    # the keyword API takes the same section (a mapping or its model)
    from mvg_dask.spec import GroupBySpec

    fields = {k: v for k, v in spec.items() if k != "group_by"}
    keyword = api.release_spec(**fields, group_by=GroupBySpec(variable="site", groups=GROUPS))
    assert api.dry_run(keyword).public_dict()["plan"] == public["plan"]
    # the groups are part of the spec's hash (a resume with other groups is another release)
    from mvg_dask.spec import parse_spec, spec_hash

    other = {**spec, "group_by": {"variable": "site", "groups": [0, 1]}}
    assert len({spec_hash(parse_spec(s)) for s in (fields, spec, other)}) == 3


# -- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change,error,needle",
    [
        ({"query": "identity"}, SpecError, "use query: centered-covariance"),
        ({"query": "covariance"}, SpecError, "use query: centered-covariance"),
        ({"privacy": {"neighbours": "add-remove"}}, SpecError, "replace-one"),
        ({"mechanism": {"directions": {"method": "dp-pca", "k": 1}}}, SpecError, "DP-PCA"),
        (
            {"mechanism": {"calibration": "mvg-thm2", "algorithm": "equi-modal"}},
            SpecError,
            "calibration: exact",
        ),
        ({"group_by": {"variable": "site", "groups": []}}, SpecError, "at least one"),
        ({"group_by": {"variable": "site", "groups": [1, 1]}}, SpecError, "repeat"),
        ({"group_by": {"variable": "nope", "groups": [0]}}, DataError, "'nope' is not a"),
        ({"group_by": {"variable": "short", "groups": [0]}}, DataError, "one label per record"),
        ({"group_by": {"variable": "site", "groups": ["a"]}}, DataError, "declared groups are"),
        ({"group_by": {"variable": "X", "groups": [0]}}, DataError, "is not a variable"),
        ({"group_by": {"variable": "weight", "groups": [0]}}, DataError, "float64"),
    ],
)
def test_bad_group_by_is_refused_before_anything_is_written_or_charged(
    tmp_path, change, error, needle
):
    store = make_input(tmp_path / "in.zarr", data(4, 300, seed=1), chunk=100)
    add_group_variable(store, np.arange(300) % 3)
    import xarray as xr

    xr.Dataset(
        {"short": (("other",), np.arange(7)), "weight": (("record",), np.ones(300))}
    ).to_zarr(store, mode="a", zarr_format=3, consolidated=False)
    ledger = tmp_path / "ledger.sqlite"
    spec = _spec(
        store,
        tmp_path / "o.zarr",
        ledger={"path": str(ledger), "dataset": "d", "budget": {"epsilon": 5.0, "delta": 1e-4}},
    )
    for key, value in change.items():
        if isinstance(value, dict) and key in ("privacy", "mechanism"):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    with pytest.raises(error, match=needle):
        api.release(spec, progress=False)
    assert not (tmp_path / "o.zarr").exists()
    assert not list(tmp_path.glob("*.staging-*"))
    assert not ledger.exists()


def test_the_accessor_releases_groups_and_refuses_bad_labels(tmp_path, client):
    """``ds.mvg.release(..., group_by=...)`` on a Dataset holding the data and the labels: each
    group is numpy's at a huge epsilon (the labels copied beside the data, the data variable
    chosen besides them); a DataArray, labels of the wrong length or type are refused before
    anything is written."""
    import xarray as xr

    n = 1200
    labels = np.array(["a", "b", "c"])[np.arange(n) % 3]
    X = data(3, n, seed=31)
    ds = xr.Dataset(
        {"X": (("feature", "record"), X), "site": (("record",), labels)},
        coords={"feature": ["f0", "f1", "f2"]},
    )
    fields: dict[str, Any] = {
        "query": "centered-covariance",
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "privacy": HUGE,
        "group_by": {"variable": "site", "groups": ["a", "b", "c"]},
    }
    out = tmp_path / "rel"
    preview = ds.mvg.dry_run(out, **fields)
    assert "3 declared groups" in preview.text()
    rel = ds.mvg.release(out, client=client, seed=1, progress=False, **fields)
    assert list(rel["group"].values) == ["a", "b", "c"]
    Xc = np.clip(X, 0, 1)
    for g, label in enumerate("abc"):
        mine = Xc[:, labels == label]
        np.testing.assert_allclose(rel["mean"].values[g], mine.mean(axis=1), atol=1e-5)
        np.testing.assert_allclose(rel["covariance"].values[g], np.cov(mine, bias=True), atol=1e-5)
    # a retry of the release id must bring the labels of its input copy (the same labels pass
    # that check and meet the complete release, which has no ledger to find it in)
    rid = rel.attrs["mvg_dask_release_id"]
    with pytest.raises(ReleaseError, match="already exists"):
        ds.mvg.release(out, release_id=rid, client=client, seed=1, progress=False, **fields)
    moved = ds.assign(site=(("record",), np.roll(labels, 1)))
    with pytest.raises(ValueError, match="other data"):
        moved.mvg.release(out, release_id=rid, client=client, seed=1, progress=False, **fields)
    bad = tmp_path / "bad"
    with pytest.raises(ValueError, match="beside the data"):
        ds["X"].mvg.release(bad, client=client, seed=1, progress=False, **fields)
    short = ds.assign(site=(("other",), labels[:10]))
    with pytest.raises(DataError, match="one label per record"):
        short.mvg.release(bad, variable="X", client=client, seed=1, progress=False, **fields)
    ints = dict(fields, group_by={"variable": "site", "groups": [0, 1, 2]})
    with pytest.raises(DataError, match="declared groups are integers"):
        ds.mvg.release(bad, client=client, seed=1, progress=False, **ints)
    assert not bad.exists() or not any(bad.iterdir())


# -- engine invariance and the accessor -------------------------------------------------------
def test_same_bytes_whatever_the_engine_partition_and_cluster(tmp_path, client, monkeypatch):
    """In process and on the LocalCluster, the partials summed on the client or folded on the
    workers (canonical blocks of 128 records, one task per block: 25 leaves): the same bytes."""
    from mvg_dask.plan import input_metadata

    monkeypatch.setattr(input_metadata, "CANONICAL_BLOCK_ELEMENTS", 2**9)
    n = 3100
    store = make_input(tmp_path / "in.zarr", data(3, n, seed=9), chunk=100)
    add_group_variable(store, np.random.default_rng(4).integers(0, 5, n))

    def release(tag: str, **kwargs: Any) -> bytes:
        spec = _spec(store, tmp_path / f"{tag}.zarr", {"regression": {"target": "f1"}})
        ds = api.open_release(api.release(spec, seed=5, progress=False, **kwargs).output)
        return b"".join(ds[v].values.tobytes() for v in ("moment", "mean", "covariance"))

    assert_same_bytes_whatever_the_engine(release, client, monkeypatch)


def test_regression_and_noise_std_per_group(tmp_path, client):
    """``ds.mvg.regression`` fits every group from its own moment (numpy's least squares at a
    huge epsilon); ``noise_std('moment')`` is the plan's for every group."""
    n = 4000
    labels = np.arange(n) % 2
    X = data(3, n, seed=8)
    slope = np.where(labels == 0, 0.5, -0.25)
    X[2] = slope * X[0] + 0.3 + 0.01 * np.random.default_rng(2).standard_normal(n)
    store = make_input(tmp_path / "in.zarr", X, chunk=1000)
    add_group_variable(store, labels)
    spec = _spec(
        store,
        tmp_path / "r.zarr",
        {"regression": {"target": "f2"}},
        privacy=HUGE,
        group_by={"variable": "site", "groups": [0, 1]},
    )
    ds = api.open_release(api.release(spec, client=client, seed=2, progress=False).output)
    fit = ds.mvg.regression(intercept=True, ridge=0.0)
    assert fit.dims == ("group", "term") and list(fit["group"].values) == [0, 1]
    Xc = np.clip(X, 0, 1)
    for g in range(2):
        mine = Xc[:, labels == g]
        design = np.vstack([mine[:2], np.ones(mine.shape[1])]).T
        want = np.linalg.lstsq(design, mine[2], rcond=None)[0]
        np.testing.assert_allclose(fit.values[g], want, atol=1e-4)
    std = ds.mvg.noise_std("moment")
    assert std.shape == ds["moment"].shape
    np.testing.assert_array_equal(std.values[0], std.values[1])


def test_noise_std_of_grouped_mean_and_covariance_match_the_measured_noise(tmp_path, client):
    """A grouped release's ``noise_std("mean")`` and ``noise_std("covariance")`` (the delta
    method through the group's noisy share) against the spread of
    ``grouped_centered_from_moment`` over 3,000 draws of the release's own noise plan (float
    noise, seeds 0..2999, two groups of 70 % and 30 % of 1,500 records, [0, 1]^3 so s = 1/2).
    Each std is a sample std of 3,000 values (relative SE about 1.3 %); checked within 5 SE plus
    5 % (the delta method is evaluated at the released values, the draws spread about the true
    ones; alpha about 1e-5 per entry)."""
    n = 1500
    labels = (np.arange(n) % 10 >= 7).astype(int)
    X = data(3, n, seed=21)
    store = make_input(tmp_path / "in.zarr", X, chunk=500)
    add_group_variable(store, labels)
    spec = _spec(
        store,
        tmp_path / "g.zarr",
        privacy={"epsilon": 3.0, "delta": 1e-5},
        group_by={"variable": "site", "groups": [0, 1]},
        mechanism={"noise": "float"},
    )
    ds = api.open_release(api.release(spec, client=client, seed=0, progress=False).output)
    rplan = api.dry_run(spec)
    scale = rplan.query.scale  # type: ignore[attr-defined]
    assert scale == 0.5
    plan = rplan.noise_plan()
    Xc = np.clip(X, 0, 1)
    truth = np.stack(
        [
            rplan.query.partial(Xc[:, labels == g]) / n  # type: ignore[attr-defined]
            for g in range(2)
        ]
    )
    draws = [
        grouped_centered_from_moment(
            truth + np.stack([plan.draw(NoiseKey.from_seed(2 * t + g)) for g in range(2)]),
            np.full(3, 0.5),
            scale,
        )
        for t in range(3000)
    ]
    rel = 5 / np.sqrt(2 * 2999) + 0.05
    mean_std = ds.mvg.noise_std("mean")
    cov_std = ds.mvg.noise_std("covariance")
    assert mean_std.dims == ("group", "feature") and "approximate" in mean_std.attrs
    assert cov_std.dims == ("group", "feature_row", "feature_col")
    np.testing.assert_allclose(
        np.stack([d[0] for d in draws]).std(axis=0, ddof=1), mean_std, rtol=rel
    )
    np.testing.assert_allclose(
        np.stack([d[1] for d in draws]).std(axis=0, ddof=1), cov_std, rtol=rel
    )
    # the smaller group's share is smaller: its stds are the larger
    assert np.all(mean_std.values[1] > mean_std.values[0])
