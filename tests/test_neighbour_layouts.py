"""Neighbour invariance across record counts and chunk layouts.

tests/test_neighbours.py releases one worst-case pair per configuration, always from stores of
several 64-record chunks. Under add-remove neighbours the record count ``N``, the input's shape
and its chunk grid are private: a store that holds every record in one chunk (what
:func:`mvg_dask.data.write_matrix` writes for fewer than 100,000 records) has a chunk of ``N``
records, and a plan that takes anything from the stored chunk size (the lattice's float-error
depth, the noise it calibrates, the plan's ``input.record_chunk``) tells ``N`` from ``N + 1``.
This suite releases pairs across record counts and layouts:

* :func:`test_add_remove_pair_publishes_nothing_but_noise`: ``N`` against ``N + 1`` (the added
  record outside the domain, clipped) for every query that takes add-remove neighbours
  (covariance with a noisy count or a public ``N0``, cross-covariance with ``N0``; identity and
  the moment queries refuse add-remove in the spec), standard, DP-PCA and wide low-rank DP-PCA
  directions, the blocked (panel) path, lattice noise and float noise, on a single-chunk store
  (40 against 41 records) and at a chunk boundary (2,800 against 2,801 records in chunks of
  700, the second pair with one more chunk);
* :func:`test_any_count_any_layout_publishes_nothing_but_noise`: a property test over the record
  count, the chunk size (single-chunk included), the layout, every configuration of
  tests/test_neighbours.py's table under every neighbour relation its spec takes (and the small
  configurations above);
* :func:`test_same_bytes_whatever_the_chunk_grid`: the same non-dyadic data in chunks of 250
  and 333 records (and records-first), replace-one, publish the same store byte for byte
  (covariance, standard and DP-PCA directions, the blocked path, lattice and float noise); an
  identity release the same values and attributes, its ``X`` stored in the input's layout;
* :func:`test_planned_or_refused_never_depends_on_the_count`: a wide add-remove DP-PCA lattice
  release is planned, with one public plan, for every ``N`` up to ``privacy.max_records`` and
  refused above it, naming that bound (:func:`test_the_planned_outcome_is_the_stores`: the
  metadata it plans from are what real single-chunk stores give).

What is compared is every published file (the comparison walks the output store, so a new
output variable or attribute is covered without a new case), the dry run's plan JSON, the dry
run's text (what ``mvg-dask release --dry-run`` prints), the release result and the INFO log
lines. Both releases of a pair read the same input path, write the same output path and use the
same seed, release id and plan time.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.engine.release import execute_release
from mvg_dask.errors import DataError, MvgDaskError
from mvg_dask.plan.input_metadata import DEFAULT_MAX_RECORDS, InputMetadata
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.spec import parse_spec
from tests.pipeline_helpers import add_second_variable
from tests.pipeline_helpers import data as float_data
from tests.test_neighbours import (
    CASES,
    CREATED,
    N0,
    SEED,
    Case,
    M,
    assert_same_except_noisy,
    base_data,
    group_labels,
    log_lines,
    neighbouring_pair,
    noisy_variables,
    published_files,
    put_input,
    result_facts,
    second_pair,
    spec_for,
    write_directions,
)

WIDE = 300  # features of the wide configurations: a blocked covariance with panels of 256
WIDE_DP_PCA = {  # tests/test_low_rank.py's wide DP-PCA: top 3, binary allocation
    "directions": {"method": "dp-pca", "k": 3, "budget_share": 0.3},
    "allocation": {"strategy": "binary"},
}
#: the declared record bound of a wide add-remove DP-PCA lattice release (the default 2^32 is
#: refused: tests/test_low_rank.py)
WIDE_MAX_RECORDS = 100_000


# -- configurations ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """A configuration of tests/test_neighbours.py (``case``) with what its spec adds: more
    features, sections merged into the spec's ``mechanism``, ``privacy`` and ``output``."""

    name: str
    case: Case
    features: int = M
    mechanism: dict[str, Any] = field(default_factory=dict)
    privacy: dict[str, Any] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)

    def spec(self, root: Path) -> dict[str, Any]:
        """The spec of both releases of a pair."""
        raw = spec_for(self.case, root)
        raw["mechanism"] = {**raw["mechanism"], **self.mechanism}
        raw["privacy"] = {**raw["privacy"], **self.privacy}
        raw["output"] = {**raw["output"], **self.output}
        return raw

    def noisy(self) -> set[str]:
        """The variables allowed to differ: tests/test_neighbours.py's, and the symmetric
        noise's ratio where DP-PCA chooses it (it follows the noisy directions)."""
        out = noisy_variables(self.case)
        if self.case.directions == "dp-pca" and self.case.algorithm == "symmetric":
            out.add("symmetric_ratio")
        return out


def _ar(*args: Any, **kw: Any) -> Case:
    """An add-remove case (``args``: algorithm, normaliser, domain, directions, allocation)."""
    algorithm, normaliser, domain, *rest = args
    query = kw.pop("query", "covariance")
    return Case(query, algorithm, "exact", "add-remove", normaliser, domain, *rest, **kw)


#: every query and path that takes add-remove neighbours (identity and the moment queries refuse
#: them in the spec; a cross-covariance takes them with a public N0 only)
ADD_REMOVE = [
    Config("cov-count", _ar("symmetric", None, "box")),
    Config("cov-n0", _ar("symmetric", N0, "l2")),
    Config("cov-count-dp-pca", _ar("equi-modal", None, "box", "dp-pca")),
    Config("cov-n0-dp-pca-max-pnr", _ar("unimodal", N0, "l2", "dp-pca", "max-pnr")),
    Config("cov-count-float", _ar("symmetric", None, "box"), mechanism={"noise": "float"}),
    Config("cross-n0", _ar("unimodal", N0, "l2", query="cross-covariance")),
    Config("cross-n0-two", _ar("unimodal", N0, "box", query="cross-covariance", second=True)),
    Config("wide-blocked", _ar("symmetric", None, "box"), WIDE, output={"matrix_chunk": 256}),
    Config(
        "wide-dp-pca",
        _ar("symmetric", None, "box", "dp-pca", "binary"),
        WIDE,
        mechanism=WIDE_DP_PCA,
        privacy={"max_records": WIDE_MAX_RECORDS},
        output={"matrix_chunk": 256},
    ),
]


# -- data and layouts -------------------------------------------------------------------------
def records_inside(config: Config, records: int) -> np.ndarray:
    """``features x records`` records strictly inside the domain (nothing clipped)."""
    if config.features == M:
        return base_data(config.case.domain, records)
    assert config.case.domain == "box"
    return np.random.default_rng(7).uniform(-0.95, 0.95, (config.features, records))


def add_remove_pair(config: Config, records: int) -> tuple[np.ndarray, np.ndarray]:
    """A of ``records`` records inside the domain, B = A plus one record outside (clipped)."""
    a = records_inside(config, records)
    outside = np.resize([3.0, -3.0], config.features)  # outside the box and the ball
    return a, np.concatenate([a, outside[:, None]], axis=1)


Writer = Callable[[Path, np.ndarray], None]


def write_defaults(path: Path, X: np.ndarray) -> None:
    """:func:`mvg_dask.data.write_matrix` with its defaults: one chunk below 100,000 records."""
    write_matrix(X, path, feature_names=[f"f{i}" for i in range(X.shape[0])])


def write_chunked(chunk: int, records_first: bool) -> Writer:
    """A plain xarray write with record chunks of ``chunk``, stored ``features x records`` or
    ``records x features``."""

    def write(path: Path, X: np.ndarray) -> None:
        dims, values = ("feature", "record"), X
        if records_first:
            dims, values = ("record", "feature"), X.T
        chunks = {"feature": X.shape[0], "record": chunk}
        names = np.array([f"f{i}" for i in range(X.shape[0])], dtype=object)
        xr.Dataset({"X": (dims, values)}, coords={"feature": names}).to_zarr(
            str(path),
            mode="w-",
            zarr_format=3,
            consolidated=False,
            encoding={"X": {"chunks": tuple(chunks[d] for d in dims)}},
        )

    return write


# -- one release ------------------------------------------------------------------------------
def dry_run_facts(raw: dict[str, Any]) -> tuple[ReleasePlan, str, str]:
    """The dry run at the fixed plan time: the plan, its JSON and its text (what
    ``mvg-dask release --dry-run [--json]`` print)."""
    rplan = replace(api.dry_run(raw), created=CREATED)
    return rplan, json.dumps(rplan.public_dict()), api.preview(rplan).text()


def release_facts(
    raw: dict[str, Any],
    case: Case,
    client: Any,
    caplog: pytest.LogCaptureFixture,
    root: Path,
    tag: str,
) -> dict[str, Any]:
    """Plan and release ``raw`` (seed ``SEED``, plan time ``CREATED``, progress on); move the
    output to ``root/tag.zarr``. Returns what is published besides the output store."""
    rplan, plan_json, text = dry_run_facts(raw)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mvg_dask"):
        result = execute_release(rplan, client, seed=SEED, progress=True)
    logs = log_lines(caplog)
    shutil.move(root / "release.zarr", root / f"{tag}.zarr")
    return {
        "dry_run": plan_json,
        "text": text,
        "result": result_facts(result, case),
        "logs": logs,
    }


def assert_pair_publishes_nothing_but_noise(
    root: Path, ra: dict[str, Any], rb: dict[str, Any], noisy: set[str], query_variable: str
) -> None:
    """Same dry run (JSON and text), result and log lines; every file of the two output stores
    the same bytes but the chunks of ``noisy`` variables; the query's output does differ.
    Every difference is named in the one failure."""
    fa, fb = published_files(root / "a.zarr"), published_files(root / "b.zarr")
    leaks = [k for k in ("dry_run", "text", "result", "logs") if ra[k] != rb[k]]
    leaks += sorted(set(fa) ^ set(fb))
    for name in sorted(set(fa) & set(fb)):
        top = name.split("/", 1)[0]
        if fa[name] != fb[name] and (top not in noisy or name == f"{top}/zarr.json"):
            leaks.append(name)
    assert not leaks, f"differ between neighbouring datasets: {leaks}"
    differing = assert_same_except_noisy(root / "a.zarr", root / "b.zarr", noisy)
    assert query_variable in differing  # the pair really differs (same seed: same noise)


# -- 1. N against N + 1 under add-remove -------------------------------------------------------
#: A's records and its record chunk (``None``: ``write_matrix``'s defaults, one chunk); B has
#: one more record (at the boundary: one more chunk)
LAYOUTS = {"single-chunk": (40, None), "chunk-boundary": (2800, 700), "empty": (0, 1)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("config", ADD_REMOVE, ids=lambda c: c.name)
def test_add_remove_pair_publishes_nothing_but_noise(
    config: Config, layout: str, tmp_path: Path, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``N`` and ``N + 1`` records (the added one clipped) publish the same bytes but the noisy
    values: the plan attribute, ``row_cov``, ``col_cov``, ``noise_variances`` and the lattice's
    depth included; the same dry-run JSON (no record count, shape or chunk size) and text. At
    the chunk boundary every other configuration is stored records-first; ``empty`` is an input
    of no record against one of one record (the sum over no record is zero, not an error)."""
    records, chunk = LAYOUTS[layout]
    write = (
        write_defaults
        if chunk is None
        else write_chunked(chunk, records_first=ADD_REMOVE.index(config) % 2 == 1)
    )
    raw = config.spec(tmp_path)
    facts = []
    pairs = zip(
        "ab", add_remove_pair(config, records), second_pair(config.case, records), strict=True
    )
    for tag, X, Y in pairs:
        shutil.rmtree(tmp_path / "input.zarr", ignore_errors=True)
        write(tmp_path / "input.zarr", X)
        if Y is not None:  # a two-variable cross-covariance's Y, chunked as X
            add_second_variable(tmp_path / "input.zarr", Y, chunk=chunk)
        facts.append(release_facts(raw, config.case, client, caplog, tmp_path, tag))
    query_variable = "cross_covariance" if config.case.query == "cross-covariance" else "covariance"
    assert_pair_publishes_nothing_but_noise(
        tmp_path, facts[0], facts[1], config.noisy(), query_variable
    )
    plan = json.loads(facts[0]["dry_run"])
    assert plan["input"]["records"] is None and plan["input"]["record_chunk"] is None
    assert plan["output"]["matrix_chunk"] == config.output.get("matrix_chunk")  # blocked path
    lattice = plan["plan"].get("lattice_context")
    if config.mechanism.get("noise") == "float":
        assert lattice is None
    else:  # the float-error bound is over the declared bound on the records
        assert lattice["records"] == config.privacy.get("max_records", DEFAULT_MAX_RECORDS)


def test_an_absent_all_nan_chunk_is_filled_like_any_nan(
    tmp_path: Path, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``domain.missing: {fill: ...}`` a NaN is data. B is A plus one all-NaN record in a
    chunk of its own, which a plain xarray write leaves out of the store (a chunk equal to the
    NaN fill value is not written): B is released like A, the absent chunk read as the NaN it
    was written as and filled, never refused for "missing chunks" (a refusal that would depend
    on the data and tell the chunk count). Without a fill it is refused before anything is
    read."""
    config = ADD_REMOVE[0]
    a = records_inside(config, 320)
    b = np.concatenate([a, np.full((M, 1), np.nan)], axis=1)
    write = write_chunked(64, records_first=False)
    raw = config.spec(tmp_path)
    raw["domain"] = {**raw["domain"], "missing": {"fill": 0.5}}
    facts = []
    for tag, X in zip("ab", (a, b), strict=True):
        shutil.rmtree(tmp_path / "input.zarr", ignore_errors=True)
        write(tmp_path / "input.zarr", X)
        facts.append(release_facts(raw, config.case, client, caplog, tmp_path, tag))
    stored = [p.name for p in (tmp_path / "input.zarr" / "X" / "c" / "0").iterdir()]
    assert sorted(stored, key=int) == ["0", "1", "2", "3", "4"]  # B's sixth chunk is absent
    assert_pair_publishes_nothing_but_noise(
        tmp_path, facts[0], facts[1], config.noisy(), "covariance"
    )
    raw["domain"].pop("missing")
    with pytest.raises(DataError, match="chunks of 'X' are missing"):
        api.release(raw, client=client, seed=SEED, progress=False)
    assert not (tmp_path / "release.zarr").exists()


# -- 2. any record count, chunk size, layout and configuration ---------------------------------
RELATIONS: tuple[tuple[str, int | None], ...] = (
    ("replace-one", None),
    ("add-remove", N0),  # a public normaliser
    ("add-remove", None),  # a noisy count (covariance)
)


def _accepted(case: Case) -> bool:
    try:
        parse_spec(spec_for(case, Path("/nonexistent")))
    except (MvgDaskError, ValueError):
        return False
    return True


#: tests/test_neighbours.py's table of configurations under every neighbour relation their spec
#: accepts: a configuration added there (a new query, directions or output field) is drawn here
#: too, at any record count and chunk layout
TABLE: list[Case] = list(
    {
        c.id: c
        for c in (
            replace(case, neighbours=nb, normaliser=n0) for case in CASES for nb, n0 in RELATIONS
        )
        if _accepted(c)
    }.values()
)
#: what the property test draws from: the table, and this file's small add-remove
#: configurations (float noise among them)
POOL: list[Config] = [Config(c.id, c) for c in TABLE] + [c for c in ADD_REMOVE if c.features == M]


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: the failure names what differs
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    config=st.sampled_from(RELATIONS).flatmap(
        lambda r: st.sampled_from([c for c in POOL if (c.case.neighbours, c.case.normaliser) == r])
    ),
    records=st.integers(20, 110),
    # one chunk (write_matrix's default), or chunks of a few records to more than N
    chunk=st.one_of(st.sampled_from([100_000, 7, 64]), st.integers(5, 130)),
    records_first=st.booleans(),
)
@example(config=ADD_REMOVE[0], records=40, chunk=100_000, records_first=False)  # one chunk
def test_any_count_any_layout_publishes_nothing_but_noise(
    client: Any,
    caplog: pytest.LogCaptureFixture,
    config: Config,
    records: int,
    chunk: int,
    records_first: bool,
) -> None:
    """For a drawn configuration and neighbour relation, record count (20..110) and record chunk
    (100,000: one chunk), features-first or records-first: the worst-case pair of the relation
    (add-remove: one clipped record more; replace-one: one record replaced by a clipped one)
    publishes nothing but its noisy values (every file of the output store, the dry run's JSON
    and text, the result and the log lines)."""
    assert config in POOL  # the explicit example too
    case = config.case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_directions(root)
        raw = config.spec(root)
        facts = []
        for tag, X, labels, Y in zip(
            "ab",
            neighbouring_pair(case, records),
            group_labels(case, records),
            second_pair(case, records),
            strict=True,
        ):
            put_input(root, X, labels, Y, chunk=chunk, records_first=records_first)
            facts.append(release_facts(raw, case, client, caplog, root, tag))
        query_variable = {"cross-covariance": "cross_covariance", "identity": "X"}.get(
            case.query, "covariance"
        )
        noisy = config.noisy()
        assert_pair_publishes_nothing_but_noise(root, facts[0], facts[1], noisy, query_variable)


# -- 3. the same bytes whatever the chunk grid --------------------------------------------------
GRID_RECORDS = 1000
GRIDS = [(250, False), (333, False), (333, True)]  # (record chunk, records-first)
DP_PCA_2 = {"directions": {"method": "dp-pca", "k": 2}}
FLOAT = {"noise": "float"}
#: name: (query, features, mechanism, output). Lattice noise rounds the computed query to a grid
#: far coarser than a reordered sum's rounding, so a sum over the stored chunks would mostly
#: publish the same bytes; float noise publishes the sum's rounding itself.
GRID_CONFIGS: dict[str, tuple[str, int, dict[str, Any], dict[str, Any]]] = {
    "identity": ("identity", M, {"algorithm": "unimodal"}, {}),
    "identity-dp-pca": ("identity", M, {"algorithm": "unimodal", **DP_PCA_2}, {}),
    # B N of dense directions for the 333-record grid's one-record last chunk
    "identity-dp-pca-float": ("identity", M, {"algorithm": "unimodal", **DP_PCA_2, **FLOAT}, {}),
    "covariance": ("covariance", M, {"algorithm": "symmetric"}, {}),
    "covariance-dp-pca": ("covariance", M, {"algorithm": "equi-modal", **DP_PCA_2}, {}),
    "covariance-float": ("covariance", M, {"algorithm": "symmetric", **FLOAT}, {}),
    "covariance-dp-pca-float": ("covariance", M, {**DP_PCA_2, **FLOAT}, {}),
    # the blocked (panel) path
    "wide-blocked-float": ("covariance", WIDE, FLOAT, {"matrix_chunk": 256}),
}


@pytest.fixture(params=["canonical", "small-blocks"])
def block_size(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The canonical blocks as configured (8,192 records: the 1,000 are one block), or of 128
    records (tests/test_canonical_blocks.py's ``small_blocks``: blocks cut across the chunks)."""
    if request.param == "small-blocks":
        from mvg_dask.plan import input_metadata

        monkeypatch.setattr(input_metadata, "CANONICAL_BLOCK_ELEMENTS", 2**9)
    return str(request.param)


@pytest.mark.parametrize("name", list(GRID_CONFIGS))
def test_same_bytes_whatever_the_chunk_grid(
    name: str, block_size: str, tmp_path: Path, client: Any
) -> None:
    """1,000 records of non-dyadic floats (partly outside the box: clipped), replace-one, the
    same seed, in record chunks of 250 and 333 and records-first: a covariance publishes the same
    store, every file the same bytes (the published plan has no input block). An identity
    release publishes the same values and attributes, but its ``X`` is written in the input's
    dimension order and record chunks (public metadata under replace-one, the only relation
    identity takes), so only ``X``'s chunk files and its array metadata (in ``X/zarr.json`` and
    the root's consolidated metadata) differ. The dry run's JSON differs only in the input's
    chunk and layout, which are not published."""
    query, features, mechanism, output = GRID_CONFIGS[name]
    X = float_data(features, GRID_RECORDS, seed=31)
    raw = {
        "name": "grid",
        "release_id": f"grid-{name}",
        "input": {"store": str(tmp_path / "input.zarr"), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": query,
        "mechanism": mechanism,
        "privacy": {"epsilon": 1.0, "delta": 1e-5},
        "output": {"store": str(tmp_path / "release.zarr"), **output},
    }
    stores, plans, values = [], [], []
    for chunk, records_first in GRIDS:
        shutil.rmtree(tmp_path / "input.zarr", ignore_errors=True)
        write_chunked(chunk, records_first)(tmp_path / "input.zarr", X)
        rplan, plan_json, _ = dry_run_facts(raw)
        execute_release(rplan, client, seed=SEED, progress=False)
        ds = api.open_release(str(tmp_path / "release.zarr"))
        # every variable's values (an identity's X is stored in the input's dimension order)
        values.append({v: ds[v].transpose(*sorted(ds[v].dims)).values.tobytes() for v in ds})
        values[-1] |= {c: ds[c].values.tobytes() for c in ds.coords}
        ds.close()
        stores.append(published_files(tmp_path / "release.zarr"))
        shutil.rmtree(tmp_path / "release.zarr")
        plans.append(json.loads(plan_json))
    first = stores[0]
    for (chunk, _), other, got in zip(GRIDS[1:], stores[1:], values[1:], strict=True):
        assert got == values[0]  # every variable's values, coordinates included
        if query == "identity":  # X in the input's layout and record chunks; the rest the same
            names = [p for p in first if not p.startswith("X/c/")]
            assert sorted(p for p in other if not p.startswith("X/c/")) == sorted(names)
            differing = [path for path in names if other[path] != first[path]]
            assert set(differing) <= {"zarr.json", "X/zarr.json"}
            for path in ("zarr.json", "X/zarr.json"):  # the same attributes
                a, b = json.loads(first[path]), json.loads(other[path])
                assert a["attributes"] == b["attributes"], path
            meta = json.loads(other["X/zarr.json"])
            grid = meta["chunk_grid"]["configuration"]["chunk_shape"]
            assert grid == ([chunk, M] if meta["dimension_names"][0] == "record" else [M, chunk])
        else:
            assert sorted(other) == sorted(first)
            differing = [path for path in first if other[path] != first[path]]
            assert differing == [], f"{differing} depend on the input's chunk grid"
    root_attrs = json.loads(first["zarr.json"])["attributes"]
    assert "input" not in json.loads(root_attrs["mvg_dask_plan"])  # the published plan
    assert not any(b"record_chunk" in content for content in first.values())
    for plan in plans[1:]:
        assert {**plan, "input": None} == {**plans[0], "input": None}
        changed = {k for k in plan["input"] if plan["input"][k] != plans[0]["input"][k]}
        assert changed <= {"record_chunk", "dims", "records_first", "shape"}


# -- 4. planned or refused: never a function of N under add-remove ------------------------------
NO_STORE = "/nonexistent/wide.zarr"  # the plan reads nothing: metadata are given


def _wide_spec(store: str = NO_STORE, max_records: int | None = WIDE_MAX_RECORDS) -> dict[str, Any]:
    """The wide add-remove DP-PCA lattice covariance of tests/test_low_rank.py (``None``: no
    declared ``privacy.max_records``)."""
    bound = {} if max_records is None else {"max_records": max_records}
    return {
        "name": "wide-pca",
        "release_id": "wide-pca-1",
        "input": {"store": store, "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": "covariance",
        "mechanism": {"algorithm": "symmetric", **WIDE_DP_PCA},
        "privacy": {"epsilon": 1.0, "delta": 1e-6, "neighbours": "add-remove", **bound},
        "output": {"store": "/nonexistent/out.zarr", "matrix_chunk": 256},
    }


def single_chunk_metadata(records: int, store: str = NO_STORE) -> InputMetadata:
    """A ``300 x records`` float64 store in one chunk (what ``write_matrix`` writes)."""
    return InputMetadata(
        store=store,
        variable="X",
        record_dim="record",
        feature_dim="feature",
        dims=("feature", "record"),
        shape=(WIDE, records),
        dtype="float64",
        record_chunk=records,
        feature_names=tuple(f"f{i}" for i in range(WIDE)),
    )


def _outcome(
    records: int, store: str = NO_STORE, max_records: int | None = WIDE_MAX_RECORDS
) -> tuple[str, str]:
    """("planned", the dry run's JSON and text) or ("refused", the message)."""
    spec = parse_spec(_wide_spec(store, max_records))
    try:
        rplan = plan_release(spec, single_chunk_metadata(records, store), created=CREATED)
    except DataError as exc:
        return "refused", str(exc)
    return "planned", json.dumps(rplan.public_dict()) + "\n" + api.preview(rplan).text()


@pytest.mark.parametrize("max_records", [None, WIDE_MAX_RECORDS], ids=["default", "declared"])
def test_planned_or_refused_never_depends_on_the_count(max_records: int | None) -> None:
    """The wide add-remove DP-PCA lattice covariance (300 features, top 3, binary allocation,
    DP-PCA share 0.3, panels of 256) from a single-chunk store, with the default bound on the
    records (2^32) or a declared ``max_records = 100,000``: every ``N`` in 15,200..15,300 (where
    a depth taken from the chunk, ``N`` records, crossed what lattice noise absorbs under the
    default bound: 15,240 was planned, 15,241 refused) and a few far away, up to the bound, is
    planned with one public plan (JSON and text); above the bound every ``N`` is refused,
    naming ``privacy.max_records``."""
    bound = DEFAULT_MAX_RECORDS if max_records is None else max_records
    counts = [1, 2, 1000, *range(15_200, 15_301), 50_000, bound - 1, bound]
    outcomes = {n: _outcome(n, max_records=max_records) for n in counts}
    assert outcomes[1][0] == "planned", outcomes[1][1]
    assert [n for n, o in outcomes.items() if o != outcomes[1]] == []
    for n in (bound + 1, 2 * bound, 10**12):
        kind, message = _outcome(n, max_records=max_records)
        assert kind == "refused" and "privacy.max_records" in message, message


def test_the_planned_outcome_is_the_stores(tmp_path: Path) -> None:
    """The metadata above is what a real single-chunk store gives: ``api.dry_run`` of
    stores of 15,240 and 15,241 records (written as metadata only, no chunk) plans the same
    public plan as the constructed metadata; one record above the bound is refused."""
    import dask.array as da

    path = tmp_path / "wide.zarr"  # one path: the spec (and its hash) names it

    def store(records: int) -> dict[str, Any]:
        shutil.rmtree(path, ignore_errors=True)
        zeros = da.zeros((WIDE, records), chunks=(WIDE, records))
        names = np.array([f"f{i}" for i in range(WIDE)], dtype=object)
        xr.Dataset({"X": (("feature", "record"), zeros)}, coords={"feature": names}).to_zarr(
            str(path), mode="w-", zarr_format=3, consolidated=False, compute=False
        )
        return _wide_spec(str(path))

    want = _outcome(15_240, str(path))
    for n in (15_240, 15_241):
        rplan = replace(api.dry_run(store(n)), created=CREATED)
        assert rplan.input.record_chunk == n  # one chunk
        got = json.dumps(rplan.public_dict()) + "\n" + api.preview(rplan).text()
        assert ("planned", got) == want
    with pytest.raises(DataError, match=r"privacy\.max_records"):
        api.dry_run(store(WIDE_MAX_RECORDS + 1))
