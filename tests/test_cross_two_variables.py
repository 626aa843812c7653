"""The cross-covariance between two variables of one store, ``X_rows Y_cols^T / N``
(docs/concepts/queries.md, "Cross-covariance"): the Gram pass stacks ``[X_b; Y_b]`` per record
range. Huge epsilon equals numpy on the clipped data, bytes do not depend on the engine, bad
specs are refused before anything is written or charged, the dry run names both variables, and
a killed release resumes identically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.errors import DataError
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.spec import SpecError, parse_spec, spec_hash
from tests.pipeline_helpers import add_second_variable, data, make_input, write_spec

N = 3000
Y_BOX = {"lower": -1.0, "upper": 2.0}
HUGE = {"epsilon": 1e9, "delta": 1e-5}


def _y(n: int = N, seed: int = 5) -> np.ndarray:
    """Three features of ``Y``, some values outside ``Y_BOX`` (clipped)."""
    return np.random.default_rng(seed).uniform(-1.5, 2.5, (3, n))


def _store(tmp_path: Path, *, chunk: int = 512, y_chunk: int = 300, **kwargs: Any) -> str:
    store = make_input(tmp_path / "in.zarr", data(4, N, seed=3), chunk=chunk)
    return add_second_variable(store, _y(), chunk=y_chunk, **kwargs)


def _cols(**overrides: Any) -> dict[str, Any]:
    return {"variable": "Y", "features": ["g2", "g0"], "box": Y_BOX, **overrides}


def _spec(store: str, out: Path | str, **overrides: Any) -> dict[str, Any]:
    spec = {
        "name": "cross2",
        "input": {"store": store, "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": {"cross-covariance": {"rows": ["f0", "f2"], "cols": _cols()}},
        "privacy": {"epsilon": 1.0, "delta": 1e-5},
        "output": {"store": str(out)},
    }
    spec.update(overrides)
    return spec


def _query(**cols: Any) -> dict[str, Any]:
    return {"cross-covariance": {"rows": ["f0", "f2"], "cols": _cols(**cols)}}


@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_huge_epsilon_is_numpy_on_the_clipped_variables(tmp_path, client, noise):
    """``X_a Y_b^T / N`` of the clipped data (``Y`` clipped to its own box, its record chunking
    different from ``X``'s), labels from each variable's coordinate, the clipped values of
    ``Y`` counted as ``X``'s are."""
    store = _store(tmp_path)
    from mvg_dask.engine.ledger import open_ledger

    spec = _spec(store, tmp_path / "out.zarr", privacy=HUGE, mechanism={"noise": noise})
    ledger = str(tmp_path / "l.sqlite")  # unseeded: charged, with its clipped count
    spec["ledger"] = {"path": ledger, "dataset": "d", "budget": {"epsilon": 1e10, "delta": 1e-4}}
    res = api.release(spec, client=client, progress=False)
    ds = api.open_release(res.output)
    X, Y = np.clip(data(4, N, seed=3), 0, 1), np.clip(_y(), -1, 2)
    want = X[[0, 2]] @ Y[[2, 0]].T / N
    got = ds["cross_covariance"]
    assert got.dims == ("feature_row", "feature_col")
    assert list(got["feature_row"].values) == ["f0", "f2"]
    assert list(got["feature_col"].values) == ["g2", "g0"]
    assert np.allclose(got.values, want, rtol=1e-6, atol=1e-9)
    assert ds.attrs["mvg_dask_query"] == "cross-covariance"
    clipped = int(np.count_nonzero(data(4, N, seed=3) != X) + np.count_nonzero(_y() != Y))
    with open_ledger(ledger) as book:
        (entry,) = book.releases()
    assert entry.clipped == clipped > 0
    std = ds.mvg.noise_std()
    assert std.shape == (2, 2)


def test_column_labels_that_collide_are_prefixed_and_positions_work(tmp_path, client):
    """``Y``'s labels that are also ``X``'s become ``Y/<label>``; a ``Y`` without a feature
    coordinate is addressed by positions; and a column allocation names ``Y``'s labels."""
    store = _store(tmp_path, names=["f0", "f1", "f2"])
    query = _query(features=["f2", "f0"])
    query["cross-covariance"]["col_allocation"] = {"strategy": "binary", "important": ["f0"]}
    spec = _spec(store, tmp_path / "a.zarr", privacy=HUGE, query=query)
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    assert list(ds["cross_covariance"]["feature_col"].values) == ["Y/f2", "Y/f0"]
    X, Y = np.clip(data(4, N, seed=3), 0, 1), np.clip(_y(), -1, 2)
    assert np.allclose(ds["cross_covariance"].values, X[[0, 2]] @ Y[[2, 0]].T / N, rtol=1e-6)
    bare = make_input(tmp_path / "bare.zarr", data(4, N, seed=3), chunk=512)
    add_second_variable(bare, _y(), names=[], chunk=512)
    spec = _spec(bare, tmp_path / "b.zarr", privacy=HUGE, query=_query(features=[1]))
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    assert list(ds["cross_covariance"]["feature_col"].values) == [1]
    assert np.allclose(ds["cross_covariance"].values, X[[0, 2]] @ Y[[1]].T / N, rtol=1e-6)


def test_same_bytes_in_process_and_on_the_cluster(tmp_path, client, monkeypatch):
    """In process and on the LocalCluster, partials summed on the client or folded on the
    workers: the same bytes of every published variable (canonical blocks of 64 records: 47
    blocks in 10 tasks)."""
    from mvg_dask.engine.stages import gram
    from mvg_dask.plan import input_metadata

    monkeypatch.setattr(input_metadata, "CANONICAL_BLOCK_ELEMENTS", 2**9)
    store = _store(tmp_path, chunk=100, y_chunk=70)

    def release(tag: str, **kwargs: Any) -> bytes:
        spec = _spec(store, tmp_path / f"{tag}.zarr", release_id="same")
        ds = api.open_release(api.release(spec, seed=5, progress=False, **kwargs).output)
        return b"".join(ds[v].values.tobytes() for v in sorted(ds.data_vars))

    first = release("in-process")
    assert first == release("cluster", client=client)
    monkeypatch.setattr(gram, "CLIENT_REDUCE_BYTES", 0)
    assert first == release("folded", client=client)


def test_the_gram_reads_both_variables_and_the_one_variable_path_is_unchanged(tmp_path):
    """The stacked Gram's ``rows x cols`` block is what the query finalizes; a one-variable
    spec plans without ``cols_input`` and reads the input alone."""
    from mvg_dask.engine.records import StackedMatrix, ZarrMatrix
    from mvg_dask.engine.stages.context import clipper_for, gram_source_of

    store = _store(tmp_path)
    rplan = api.dry_run(_spec(store, tmp_path / "o.zarr"))
    source = gram_source_of(rplan)
    assert isinstance(source, StackedMatrix)
    block, clipped = clipper_for(rplan)(source.read(100, 400), 100)
    X, Y = np.clip(data(4, N, seed=3), 0, 1), np.clip(_y(), -1, 2)
    assert np.array_equal(block, np.vstack([X[:, 100:400], Y[:, 100:400]]))
    raw = np.vstack([data(4, N, seed=3), _y()])[:, 100:400]
    assert clipped == np.count_nonzero(raw != block) > np.count_nonzero(raw[:4] != block[:4])
    assert rplan.query.rows == (0, 2) and rplan.query.cols == (4 + 2, 4 + 0)
    one = {"cross-covariance": {"rows": ["f0"], "cols": ["f1"]}}
    single = api.dry_run(_spec(store, tmp_path / "o.zarr", query=one))
    assert single.input.cols_input is None and "cols_input" not in single.to_dict()["input"]
    assert isinstance(gram_source_of(single), ZarrMatrix)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"query": _query(variable="Z")}, r"cols\.variable: 'Z' is not a variable"),
        ({"query": _query(features=["g0", "nope"])}, r"cols\.features: 'nope' is not a value"),
        ({"query": _query(box={"lower": [0, 0], "upper": 1})}, r"cols\.box: "),
        ({"query": _query(variable="W")}, r"'W' has 2999 records along 'record'"),
        ({"query": _query(variable="V")}, r"'V' has dims \('target', 'item'\)"),
    ],
)
def test_bad_specs_are_refused_before_anything_is_written_or_charged(tmp_path, change, match):
    store = _store(tmp_path)
    add_second_variable(store, _y(N - 1), name="W", feature_dim="w")
    add_second_variable(store, _y(N), name="V", feature_dim="target", record_dim="item")
    spec = _spec(store, tmp_path / "o.zarr", **change)
    spec["ledger"] = {
        "path": str(tmp_path / "l.sqlite"),
        "dataset": "d",
        "budget": {"epsilon": 5.0, "delta": 1e-4},
    }
    with pytest.raises(DataError, match=match) as err:
        api.release(spec, progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "o.zarr").exists() and not (tmp_path / "l.sqlite").exists()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"domain": {"l2_norm": 1.0}}, "a box for each variable"),
        ({"query": _query(variable="X")}, "is the input variable"),
        ({"query": {"cross-covariance": {"rows": ["f0"], "cols": {"variable": "Y"}}}}, "features"),
        ({"query": _query(features=["g0", "g0"])}, "repeat"),
    ],
)
def test_the_spec_refuses_a_bad_second_variable(change, match):
    with pytest.raises(SpecError, match=match):
        parse_spec(_spec("in.zarr", "out.zarr", **change))


def test_the_spec_form_and_its_hash():
    spec = parse_spec(_spec("in.zarr", "out.zarr"))
    assert spec.cols_variable == "Y" and spec.query.cross_covariance.col_labels == ["g2", "g0"]
    one = parse_spec(
        _spec("in.zarr", "out.zarr", query={"cross-covariance": {"rows": ["f0"], "cols": ["f1"]}})
    )
    assert one.cols_variable is None and spec_hash(one) != spec_hash(spec)


def test_nan_and_out_of_domain_values_in_y_are_refused(tmp_path, client):
    """``Y``'s records are checked as ``X``'s: NaN is refused, and with on_violation: error a
    value outside ``Y``'s box is an error naming its box."""
    X = np.clip(data(4, 600, seed=3), 0, 1)  # inside X's box: only Y is checked here
    store = make_input(tmp_path / "in.zarr", X, chunk=200)
    Y = np.clip(_y(600), -1, 2)
    Y[1, 450] = np.nan
    add_second_variable(store, Y, chunk=200)
    with pytest.raises(DataError, match=r"NaN or infinite values in records 400\.\.599"):
        api.release(_spec(store, tmp_path / "a.zarr"), client=client, seed=1, progress=False)
    store = make_input(tmp_path / "in2.zarr", X, chunk=200)
    Y[1, 450] = 3.0
    add_second_variable(store, Y, chunk=200)
    strict = {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "error"}  # Y's: [-1, 2]
    spec = _spec(store, tmp_path / "b.zarr", domain=strict)
    with pytest.raises(DataError, match=r"1 values of records 400..599 .*cols\.box"):
        api.release(spec, client=client, seed=1, progress=False)


def test_the_dry_run_names_both_variables(tmp_path):
    """The summary and the JSON plan name ``X`` and ``Y``; the plan round-trips; under
    add-remove ``Y``'s record count is hidden as ``X``'s."""
    from mvg_dask.plan.presentation import plan_rows, render_text

    store = _store(tmp_path)
    rplan = api.dry_run(_spec(store, tmp_path / "out.zarr"))
    text = render_text("plan", plan_rows(rplan)) + rplan.summary()
    assert "rows of 'X' (4 features), cols of 'Y' (3 features" in text
    assert "variables 'X' (4 features) and 'Y' (3 features)" in text
    public = rplan.public_dict()
    second = public["input"]["cols_input"]
    assert second["variable"] == "Y" and second["feature_dim"] == "target"
    assert second["feature_names"] == ["g0", "g1", "g2"] and second["record_chunk"] == 300
    assert public["plan"]["query"]["cols"] == [6, 4]
    back = ReleasePlan.from_dict(json.loads(json.dumps(rplan.to_dict())))
    assert back.to_dict() == rplan.to_dict() and back.input.cols_input is not None
    privacy = {"epsilon": 1.0, "delta": 1e-5, "neighbours": "add-remove", "records": 2000}
    hidden = api.dry_run(_spec(store, tmp_path / "out.zarr", privacy=privacy)).public_dict()
    assert hidden["input"]["cols_input"]["records"] is None
    assert hidden["input"]["cols_input"]["shape"] is None
    assert not (tmp_path / "out.zarr").exists()


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    from tests.cluster_helpers import loopback_cluster

    with loopback_cluster(tmp_path_factory.mktemp("cluster")) as address:
        yield address


@pytest.mark.slow
def test_a_killed_release_resumes_identically(tmp_path, loopback):
    """SIGKILL after the skeleton is written (the Gram pass has no markers: it runs again), then
    the same command: the bytes of an uninterrupted run, charged once."""

    from tests.test_crash import finish_after_a_kill

    store = _store(tmp_path, chunk=500, y_chunk=400)
    outs = []
    for name, crash in (("ref", None), ("crashed", "skeleton")):
        out, ledger = tmp_path / f"{name}.zarr", str(tmp_path / f"{name}.sqlite")
        spec = _spec(store, out, release_id=f"cross2-{name}")
        spec["ledger"] = {"path": ledger, "dataset": "d", "budget": {"epsilon": 5.0, "delta": 1e-4}}
        spec_path = write_spec(tmp_path / f"{name}.yaml", spec)
        finish_after_a_kill(spec_path, loopback, ledger, crash)
        outs.append(api.open_release(str(out))["cross_covariance"].values.tobytes())
    assert outs[0] == outs[1]


def test_the_accessor_releases_a_second_variable_and_refuses_a_bad_one(tmp_path, client):
    """``ds.mvg.release`` on a Dataset holding ``X`` and ``Y``: ``Y`` is copied beside the data
    (float64, in the data's record chunks) and the release is ``X_a Y_b^T / N`` of the clipped
    data at a huge epsilon, the data variable chosen besides ``Y``; a DataArray, a ``Y`` of
    another record count or a ``Y`` of strings is refused before anything is written."""
    import xarray as xr

    n = 600
    X, Y = data(4, n, seed=3), _y(n)
    ds = xr.Dataset(
        {"X": (("feature", "record"), X), "Y": (("record", "target"), Y.T)},
        coords={"feature": ["f0", "f1", "f2", "f3"], "target": ["g0", "g1", "g2"]},
    )
    fields: dict[str, Any] = {
        "query": _query(),
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "privacy": HUGE,
    }
    rel = ds.mvg.release(tmp_path / "rel", client=client, seed=1, progress=False, **fields)
    a = np.clip(X, 0, 1)[[0, 2]]
    b = np.clip(Y, Y_BOX["lower"], Y_BOX["upper"])[[2, 0]]
    np.testing.assert_allclose(rel["cross_covariance"].values, a @ b.T / n, atol=1e-6)
    assert list(rel["feature_col"].values) == ["g2", "g0"]
    copy = xr.open_zarr(next((tmp_path / "rel").glob("*.input.zarr")), consolidated=False)
    assert copy["Y"].dtype == np.float64 and copy["Y"].dims == ("record", "target")
    bad = tmp_path / "bad"
    with pytest.raises(ValueError, match="a variable beside the data"):
        ds["X"].mvg.release(bad, client=client, progress=False, **fields)
    short = ds.assign(Y=(("other", "target"), Y.T[:10]))
    with pytest.raises(DataError, match="two dims, one of them"):
        short.mvg.release(bad, variable="X", client=client, progress=False, **fields)
    words = ds.assign(Y=(("record", "target"), np.full((n, 3), "a")))
    with pytest.raises(DataError, match="need real numbers"):
        words.mvg.release(bad, variable="X", client=client, progress=False, **fields)
    assert not bad.exists() or not any(bad.iterdir())


def test_the_plan_meets_its_mu_by_brute_force_over_the_stacked_box(tmp_path):
    """Independent check of the two boxes' use: ``X`` in ``[0, 1]^4``, ``Y`` in ``[-1, 2]^3``,
    a binary column allocation; the largest whitened change ``||A^-1 (a b^T - a' b'^T)
    B^-T||_F / N`` over every pair of corners of the stacked box (and 2,000 random pairs
    inside it, seed 4) is at most the plan's ``Delta_M`` (``<= mu``), and at least half of it
    (the factor-2 bound is attained up to ``sqrt(2)`` here)."""
    import itertools

    from mvg_dask.privacy import calibration as cal

    store = _store(tmp_path)
    query = _query(features=["g0", "g2"])
    query["cross-covariance"]["col_allocation"] = {"strategy": "binary", "important": ["g2"]}
    rplan = api.dry_run(
        _spec(store, tmp_path / "o.zarr", mechanism={"noise": "float"}, query=query)
    )
    plan, q = rplan.noise_plan(), rplan.query
    lo, hi = rplan.domain.lower, rplan.domain.upper
    assert np.array_equal(lo, [0, 0, 0, 0, -1, -1, -1]) and np.array_equal(hi, [1] * 4 + [2] * 3)
    w_rows = 1.0 / np.sqrt(plan.row_variances)  # A^-1 = diag(w_rows): standard directions
    w_cols = 1.0 / np.sqrt(q.column_noise_variances)
    rows, cols = list(q.rows), list(q.cols)

    def change(z: np.ndarray, zp: np.ndarray) -> float:
        u, v = z[rows] * w_rows, z[cols] * w_cols
        up, vp = zp[rows] * w_rows, zp[cols] * w_cols
        return float(np.linalg.norm(np.outer(u, v) - np.outer(up, vp))) / q.records

    pts = [np.where(np.array(c), hi, lo) for c in itertools.product((0, 1), repeat=7)]
    found = max(change(z, zp) for z in pts for zp in pts)
    rng = np.random.default_rng(4)
    inner = rng.uniform(lo, hi, (2000, 2, 7))
    found = max(found, *(change(a, b) for a, b in inner))
    mu = cal.analytic_gaussian_mu(1.0, 1e-5)
    assert plan.mahalanobis_sensitivity <= mu * (1 + 1e-12)
    assert 0.5 * plan.mahalanobis_sensitivity <= found <= plan.mahalanobis_sensitivity * (1 + 1e-9)


def test_a_copy_of_x_as_y_plans_as_the_one_variable_query(tmp_path):
    """``Y`` holding three of ``X``'s features with ``X``'s box plans the noise of the
    one-variable query on those features: the same sensitivities, variances and lattice."""
    X = data(5, 800, seed=2)
    store = make_input(tmp_path / "in.zarr", X, chunk=200)
    add_second_variable(store, X[[1, 2, 4]], names=["h1", "h2", "h4"], chunk=200)
    box = {"lower": 0.0, "upper": 1.0}
    two = _query(features=["h1", "h2", "h4"], box=box)
    two["cross-covariance"]["rows"] = ["f0", "f3"]
    one = {"cross-covariance": {"rows": ["f0", "f3"], "cols": ["f1", "f2", "f4"]}}
    plans = [
        api.dry_run(_spec(store, tmp_path / "o.zarr", query=q)).noise_plan() for q in (two, one)
    ]
    a, b = (p.to_dict() for p in plans)
    for name in ("mahalanobis_sensitivity", "row_variances", "lattice", "implied_epsilon"):
        assert a[name] == b[name], name
    assert a["query"]["cols"] == [5, 6, 7] and b["query"]["cols"] == [1, 2, 4]


def test_add_remove_with_a_public_normaliser(tmp_path, client):
    """Add-remove neighbours with a declared ``N0``: huge epsilon gives ``X_a Y_b^T / N0``."""
    store = _store(tmp_path)
    privacy = {**HUGE, "neighbours": "add-remove", "records": 2000}
    spec = _spec(store, tmp_path / "o.zarr", privacy=privacy)
    ds = api.open_release(api.release(spec, client=client, seed=1, progress=False).output)
    X, Y = np.clip(data(4, N, seed=3), 0, 1), np.clip(_y(), -1, 2)
    assert np.allclose(ds["cross_covariance"].values, X[[0, 2]] @ Y[[2, 0]].T / 2000, rtol=1e-6)
