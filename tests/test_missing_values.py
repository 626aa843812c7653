"""Missing values (``domain.missing``; docs/howto/own-data.md, "Missing values").

``missing: error`` (the default) aborts a release at the first NaN read, charged, and the
Python error says what was charged to which ledger dataset. ``missing: {fill: v}`` replaces
each NaN by the declared public value before the domain check and clip: the transformed record
lies in the declared domain whatever its NaN and the fill (a hypothesis test against the plan's
own sensitivity and a direct bound), so the plan's sensitivity holds; the release completes and
equals numpy on the filled and clipped data at a huge epsilon on every read path. Bad fills are
refused before anything is read or charged; the default changes no spec hash or plan byte.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.engine.ledger import open_ledger
from mvg_dask.engine.metadata import InputMetadata
from mvg_dask.engine.stages.context import clipper_for
from mvg_dask.errors import DataError
from mvg_dask.plan import BoxDomain
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.presentation import plan_rows
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.spec import SpecError, parse_spec, spec_hash
from tests.pipeline_helpers import (
    add_group_variable,
    add_second_variable,
    data,
    make_input,
    spec_dict,
)

HUGE = {"epsilon": 1e9, "delta": 1e-5}
FILL = [0.5, 2.0, -1.0, 0.25]  # per feature of a 4-feature input: two fills outside [0, 1]


# -- the transformation: filled and clipped records lie in the domain ---------------------------
M, N = 3, 50


def _metadata(m: int = M, n: int = N) -> InputMetadata:
    return InputMetadata(
        store="in.zarr",
        variable="X",
        record_dim="record",
        feature_dim="feature",
        dims=("feature", "record"),
        shape=(m, n),
        dtype="float64",
        record_chunk=n,
        feature_names=tuple(f"f{i}" for i in range(m)),
    )


def _plan(query: str, domain: dict[str, Any], missing: Any = "error", **kw: Any) -> ReleasePlan:
    spec = parse_spec(
        {
            "name": "missing",
            "release_id": "missing-1",
            "input": {"store": "in.zarr"},
            "domain": {**domain, "missing": missing},
            "query": query,
            "mechanism": {"algorithm": "unimodal", "noise": "float"},
            "privacy": {"epsilon": 1.0, "delta": 1e-5},
            "output": {"store": "out.zarr"},
            **kw,
        }
    )
    return plan_release(spec, _metadata(), created="2026-11-27T00:00:00+00:00")


_PLANS: dict[tuple[str, str], ReleasePlan] = {}


def _cached_plan(query: str, kind: str) -> ReleasePlan:
    """A plan on ``[-1, 2] x [0, 1] x [-3, -2]`` or the ball of radius 2 (planned once)."""
    key = (query, kind)
    if key not in _PLANS:
        box = {"box": {"lower": [-1.0, 0.0, -3.0], "upper": [2.0, 1.0, -2.0]}}
        _PLANS[key] = _plan(query, box if kind == "box" else {"l2_norm": 2.0}, {"fill": 0.0})
    return _PLANS[key]


values = st.floats(-50.0, 50.0, allow_nan=False)
records = st.lists(values, min_size=M, max_size=M)
masks = st.lists(st.booleans(), min_size=M, max_size=M)
fills = st.one_of(values, st.lists(values, min_size=M, max_size=M))


@settings(max_examples=300, deadline=None)
@given(
    query=st.sampled_from(["identity", "covariance"]),
    kind=st.sampled_from(["box", "l2"]),
    x=records,
    xp=records,
    nan_x=masks,
    nan_xp=masks,
    fill=fills,
)
def test_a_filled_and_clipped_record_lies_in_the_domain_and_the_plans_bound_holds(
    query: str, kind: str, x, xp, nan_x, nan_xp, fill
) -> None:
    """Two records with NaN in any subset of their coordinates (all, none) and any finite
    fill, inside or far outside the domain: the engine's own transformation (the plan's
    clipper) maps both into the declared domain, so the change of the query between the two
    one-record datasets stays within the plan's L2 sensitivity, its whitened (Mahalanobis)
    sensitivity, and a direct bound computed here from the domain alone."""
    rplan = _cached_plan(query, kind)
    fill_value = tuple(fill) if isinstance(fill, list) else float(fill)
    rplan = replace(rplan, missing_fill=fill_value)
    block = np.array([x, xp], dtype=np.float64).T  # M x 2
    block[:, 0][np.array(nan_x)] = np.nan
    block[:, 1][np.array(nan_xp)] = np.nan
    out, changed = clipper_for(rplan)(block, 0)
    assert np.all(np.isfinite(out))
    assert changed >= (sum(nan_x) > 0) + (sum(nan_xp) > 0)  # a record with a NaN is changed
    y, yp = out[:, 0], out[:, 1]
    d = rplan.domain
    if isinstance(d, BoxDomain):
        assert np.all((d.lower <= out.T) & (out.T <= d.upper))
        direct_identity = float(np.linalg.norm(d.upper - d.lower))  # sup ||x - x'||
        sup_sq = float(np.sum(np.maximum(np.abs(d.lower), np.abs(d.upper)) ** 2))
    else:
        assert np.all(np.linalg.norm(out, axis=0) <= d.radius * (1 + 1e-12))
        direct_identity = 2 * d.radius
        sup_sq = d.radius**2
    noise = rplan.noise_plan()
    whiten = 1 / np.sqrt(noise.row_variances)  # standard directions: Sigma = diag(v)
    if query == "identity":  # one column of the m x N data matrix changes
        change = y - yp
        direct = direct_identity
    else:  # X X^T / N: ||y y^T - y' y'^T||_F <= ||y||^2 + ||y'||^2 <= 2 sup ||x||^2
        change = (np.outer(y, y) - np.outer(yp, yp)) / N
        direct = 2 * sup_sq / N
    size = float(np.linalg.norm(change))
    assert size <= noise.sensitivity * (1 + 1e-9)
    assert size <= direct * (1 + 1e-9)
    whitened = whiten[:, None] * change if change.ndim == 2 else whiten * change
    assert float(np.linalg.norm(whitened)) <= noise.mahalanobis_sensitivity * (1 + 1e-9)


def test_the_clipper_counts_and_refuses_as_documented() -> None:
    """Filled values count once (also when the fill lies outside the box and is clipped);
    infinite values are refused with a fill too; without a fill a NaN is refused as before."""
    rplan = _cached_plan("covariance", "box")
    block = np.array([[np.nan, 0.5, 7.0], [0.5, np.nan, 0.5], [-2.5, -2.5, np.nan]])
    out, changed = clipper_for(replace(rplan, missing_fill=(0.0, 0.5, 9.0)))(block, 0)
    np.testing.assert_array_equal(
        out, [[0.0, 0.5, 2.0], [0.5, 0.5, 0.5], [-2.5, -2.5, -2.0]]
    )  # the fill 9 of feature 2 is clipped to its upper bound -2
    assert changed == 4  # three filled, one clipped (7.0)
    block[0, 1] = np.inf
    with pytest.raises(DataError, match=r"infinite values in records 10\.\.12.*NaN only"):
        clipper_for(replace(rplan, missing_fill=0.0))(block, 10)
    with pytest.raises(DataError, match=r"NaN or infinite values .*domain\.missing"):
        clipper_for(replace(rplan, missing_fill=None))(block, 10)
    ball = replace(_cached_plan("covariance", "l2"), missing_fill=1.0)
    out, changed = clipper_for(ball)(np.array([[np.nan, 3.0], [0.0, 0.0], [0.0, 0.0]]), 0)
    np.testing.assert_allclose(out, [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
    assert changed == 2  # one record filled, one clipped (records, for a ball)


# -- the spec and the plan ------------------------------------------------------------------------
BOX = {"box": {"lower": 0.0, "upper": 1.0}}


def test_the_default_changes_no_spec_hash_or_plan_byte() -> None:
    """``missing: error`` written out is the default: the same spec hash and plan as a spec
    without it; a fill is part of the hash and of the plan (and round-trips)."""
    plain = _plan("covariance", BOX)
    explicit = _plan("covariance", BOX, "error")
    assert plain.spec_hash == explicit.spec_hash
    assert "missing" not in plain.to_dict() and plain.to_dict() == explicit.to_dict()
    filled = _plan("covariance", BOX, {"fill": [0.5, 0.25, 1.0]})
    assert filled.spec_hash != plain.spec_hash
    assert filled.to_dict()["missing"] == {"fill": [0.5, 0.25, 1.0]}
    back = ReleasePlan.from_dict(json.loads(json.dumps(filled.to_dict())))
    assert back.to_dict() == filled.to_dict() and back.missing_fill == (0.5, 0.25, 1.0)
    rows = dict(plan_rows(filled))
    assert rows["domain"].endswith("values outside: clip; NaN filled per feature with 0.25..1")
    assert dict(plan_rows(plain))["domain"].endswith("values outside: clip")
    scalar = _plan("covariance", BOX, {"fill": 0.5})
    assert dict(plan_rows(scalar))["domain"].endswith("; NaN filled with 0.5")


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ({"fill": float("nan")}, r"domain\.missing\.fill: fill values must be finite"),
        ({"fill": [0.5, float("inf"), 0.5]}, r"domain\.missing\.fill: fill values must be finite"),
        ({"fill": "0.5"}, r"domain\.missing\.fill: a number, not the quoted string '0\.5'"),
        ({"fill": []}, r"domain\.missing\.fill: give one number, or one per feature"),
        ("fill", r"domain\.missing: error or \{fill: "),
        ({"fil": 0.5}, r"domain\.missing\.fill: Field required"),
    ],
)
def test_bad_fills_are_refused_when_the_spec_is_read(missing: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _plan("covariance", BOX, missing)


def test_a_list_fill_is_refused_for_two_variables() -> None:
    cols = {"variable": "Y", "features": [0], "box": {"lower": 0.0, "upper": 1.0}}
    with pytest.raises(SpecError, match=r"domain\.missing\.fill: a two-variable .* one number"):
        _plan(
            {"cross-covariance": {"rows": ["f0"], "cols": cols}},  # type: ignore[arg-type]
            BOX,
            {"fill": [0.5, 0.5, 0.5]},
            mechanism={"algorithm": "unimodal"},
        )


def _ledger(tmp_path: Path) -> dict[str, Any]:
    budget = {"epsilon": 4.0, "delta": 1e-4}
    return {"path": str(tmp_path / "ledger.sqlite"), "dataset": "patients", "budget": budget}


def _entries(tmp_path: Path) -> list[tuple[str, str]]:
    path = tmp_path / "ledger.sqlite"
    if not path.exists():
        return []
    with open_ledger(path, create=False) as book:
        return [(e.release_id, e.status) for e in book.releases()]


@pytest.mark.parametrize(
    ("domain", "message"),
    [
        (
            {**BOX, "missing": {"fill": [0.5, 0.5]}},
            r"^domain\.missing\.fill: 2 values for 4 features; give one per feature",
        ),
        (
            {**BOX, "on_violation": "error", "missing": {"fill": [0.5, 0.5, 1.5, 0.5]}},
            r"^domain\.missing\.fill: feature 2's fill 1\.5 lies outside its box \[0, 1\]",
        ),
    ],
)
def test_a_fill_that_does_not_fit_is_refused_before_anything_is_read(
    tmp_path: Path, domain: dict[str, Any], message: str
) -> None:
    """A per-feature fill of the wrong length, or a fill outside the box under
    ``on_violation: error``: one line naming the field, nothing written or charged."""
    X = data(4, 200, seed=1)
    X[0, 5] = np.nan
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = spec_dict(store, str(tmp_path / "out.zarr"), query="covariance")
    spec |= {"domain": domain, "ledger": _ledger(tmp_path)}
    with pytest.raises(DataError, match=message) as info:
        api.release(spec, progress=False)
    assert len(str(info.value).splitlines()) == 1 and not info.value.charged
    assert _entries(tmp_path) == [] and not (tmp_path / "out.zarr").exists()


# -- the Python error of a charged abort --------------------------------------------------------
def test_the_python_error_says_what_was_charged_to_which_dataset(tmp_path: Path) -> None:
    """A NaN with ``missing: error`` aborts after the reservation: the DataError raised by
    :func:`api.release` says the budget was charged, how much and to which ledger dataset (as
    the CLI does); without a ledger it says nothing about a charge."""
    X = data(4, 300, seed=1)
    X[1, 150] = np.nan
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = spec_dict(store, str(tmp_path / "out.zarr"), query="covariance", release_id="r1")
    with pytest.raises(DataError) as info:
        api.release({**spec, "ledger": _ledger(tmp_path)}, progress=False)
    exc = info.value
    assert exc.charged and exc.release_id == "r1" and not exc.pending
    assert exc.charge == "epsilon=1, delta=1e-05 to dataset 'patients'"
    assert str(exc) == (
        "the input has NaN or infinite values in records 100..199; remove or impute them before "
        "a release, or fill NaN with a public value (domain.missing: {fill: v}; a record domain "
        "cannot bound them) (budget charged: epsilon=1, delta=1e-05 to dataset 'patients'; "
        "release r1 aborted after reading data: choose a new release id)"
    )
    assert _entries(tmp_path) == [("r1", "aborted")]
    with pytest.raises(DataError) as info:
        api.release({**spec, "release_id": "r2"}, seed=1, progress=False)  # no ledger
    assert not info.value.charged and "charged" not in str(info.value)
    assert str(info.value).startswith("the input has NaN or infinite values in records 100..199")


# -- releases with NaN filled, at a huge epsilon, on every read path ---------------------------
def _nan_data(m: int, n: int, seed: int) -> np.ndarray:
    """Records partly outside ``[0, 1]``, about 5 % of the values NaN and record 7 all NaN."""
    X = data(m, n, seed=seed)
    X[np.random.default_rng(seed + 1).random((m, n)) < 0.05] = np.nan
    X[:, 7] = np.nan
    return X


def _filled(X: np.ndarray, fill: Any, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """What the release sums: each NaN its feature's fill, then clipped into the box."""
    f = np.broadcast_to(np.asarray(fill, dtype=np.float64), (X.shape[0],))[:, None]
    return np.clip(np.where(np.isnan(X), f, X), lo, hi)


def _release(spec: dict[str, Any], client: Any) -> Any:
    return api.open_release(api.release(spec, client=client, seed=1, progress=False).output)


@pytest.mark.parametrize("fill", [0.5, FILL], ids=["scalar", "per-feature"])
@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_covariance_and_identity_with_nan_filled_are_numpy(tmp_path, client, fill, noise):
    X = _nan_data(4, 1000, seed=3)
    store = make_input(tmp_path / "in.zarr", X, chunk=256)
    Xf = _filled(X, fill)
    domain = {"missing": {"fill": fill}}
    for query in ("covariance", "identity"):
        spec = spec_dict(
            store, str(tmp_path / f"{query}.zarr"), query=query, privacy=HUGE, domain=domain
        )
        spec["mechanism"]["noise"] = noise
        ds = _release(spec, client)
        assert json.loads(ds.attrs["mvg_dask_missing"]) == {"fill": fill}
        assert not any("fill" in k or "clipped" in k for k in ds.attrs)  # no count published
        if query == "covariance":
            np.testing.assert_allclose(ds["covariance"].values, Xf @ Xf.T / 1000, atol=1e-6)
        else:
            np.testing.assert_allclose(ds["X"].values, Xf, atol=1e-3)  # noise std ~5e-5


@pytest.mark.parametrize("route", ["moment", "mean-first"])
def test_centered_covariance_with_nan_filled_is_numpy(tmp_path, client, route):
    X = _nan_data(4, 1000, seed=4)
    store = make_input(tmp_path / "in.zarr", X, chunk=256)
    spec = spec_dict(
        store, str(tmp_path / "c.zarr"), privacy=HUGE, domain={"missing": {"fill": FILL}}
    )
    spec["query"] = {"centered-covariance": {"route": route}}
    spec["mechanism"].pop("algorithm")
    ds = _release(spec, client)
    Xf = _filled(X, FILL)
    np.testing.assert_allclose(ds["mean"].values, Xf.mean(axis=1), atol=1e-6)
    np.testing.assert_allclose(ds["covariance"].values, np.cov(Xf, bias=True), atol=1e-6)


def test_grouped_release_with_nan_filled_is_numpy(tmp_path, client):
    X = _nan_data(4, 900, seed=5)
    labels = np.arange(900) % 3
    store = make_input(tmp_path / "in.zarr", X, chunk=256)
    add_group_variable(store, labels)
    spec = spec_dict(
        store, str(tmp_path / "g.zarr"), privacy=HUGE, domain={"missing": {"fill": 0.5}}
    )
    spec["query"] = "centered-covariance"
    spec["mechanism"].pop("algorithm")
    spec["group_by"] = {"variable": "site", "groups": [0, 1, 2]}
    ds = _release(spec, client)
    Xf = _filled(X, 0.5)
    for g in range(3):
        mine = Xf[:, labels == g]
        np.testing.assert_allclose(ds["mean"].values[g], mine.mean(axis=1), atol=1e-5)
        np.testing.assert_allclose(ds["covariance"].values[g], np.cov(mine, bias=True), atol=1e-5)


def test_two_variable_cross_covariance_fills_both_variables(tmp_path, client):
    """One fill for the stacked record ``[x; y]``: NaN of ``X`` and of ``Y`` become it, then
    each is clipped into its own box (``Y``'s ``[-1, 2]``)."""
    X = _nan_data(4, 900, seed=6)
    Y = np.random.default_rng(8).uniform(-1.5, 2.5, (3, 900))
    Y[np.random.default_rng(9).random(Y.shape) < 0.05] = np.nan
    store = make_input(tmp_path / "in.zarr", X, chunk=256)
    add_second_variable(store, Y, chunk=300)
    cols = {"variable": "Y", "features": ["g2", "g0"], "box": {"lower": -1.0, "upper": 2.0}}
    spec = {
        "name": "cross2",
        "input": {"store": store, "variable": "X"},
        "domain": {**BOX, "missing": {"fill": 1.5}},  # 1.5: clipped to 1 in X, kept in Y
        "query": {"cross-covariance": {"rows": ["f0", "f2"], "cols": cols}},
        "privacy": HUGE,
        "output": {"store": str(tmp_path / "x.zarr")},
    }
    ds = _release(spec, client)
    Xf, Yf = _filled(X, 1.5), _filled(Y, 1.5, -1.0, 2.0)
    want = Xf[[0, 2]] @ Yf[[2, 0]].T / 900
    np.testing.assert_allclose(ds["cross_covariance"].values, want, atol=1e-6)


def test_a_blocked_covariance_fills_in_its_panels(tmp_path, client):
    """``output.matrix_chunk`` (panels computed and written on the workers) reads through the
    same clipper."""
    X = _nan_data(512, 300, seed=7)
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = spec_dict(
        store,
        str(tmp_path / "p.zarr"),
        query="covariance",
        privacy=HUGE,
        domain={"missing": {"fill": 0.5}},
        output={"matrix_chunk": 256},
    )
    spec["mechanism"] = {"algorithm": "symmetric", "noise": "float"}
    assert "panels" in " ".join(api.dry_run(spec).stages)
    ds = _release(spec, client)
    Xf = _filled(X, 0.5)
    # 512 features: noise std ~5e-5 at this epsilon; a NaN counted as 0 would move entries ~1e-2
    np.testing.assert_allclose(ds["covariance"].values, Xf @ Xf.T / 300, atol=1e-3)


def test_without_a_fill_the_default_release_has_no_missing_attribute(tmp_path, client):
    X = data(4, 300, seed=2)
    store = make_input(tmp_path / "in.zarr", X, chunk=100)
    spec = spec_dict(store, str(tmp_path / "o.zarr"), query="covariance", privacy=HUGE)
    ds = _release(spec, client)
    assert "mvg_dask_missing" not in ds.attrs
    assert spec_hash(parse_spec(spec)) == spec_hash(
        parse_spec({**spec, "domain": {**spec["domain"], "missing": "error"}})
    )
