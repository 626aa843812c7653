"""The skeleton writer (``mvg_dask.engine.zarr_io.skeleton``) writes the files ``to_zarr`` writes.

An output's skeleton (metadata, attributes, small variables) is written in one batch instead of
xarray's per-variable Zarr calls. The oracle is xarray itself: the same dataset and encoding
written by ``to_zarr(mode="w-", compute=False, zarr_format=3, consolidated=False)`` must give the
same files, byte for byte, for the skeleton of every kind of release the product writes (caught
from real releases) and for random datasets (hypothesis).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import dask.array as da
import fsspec
import numpy as np
import pytest
import xarray as xr
from hypothesis import given
from hypothesis import strategies as st

from mvg_dask import api
from mvg_dask.data import write_matrix
from mvg_dask.engine import output as output_module
from mvg_dask.engine.output_arrays import Declared, Skeleton
from mvg_dask.engine.zarr_io.skeleton import _plain_arrays, write_skeleton
from tests.pipeline_helpers import (
    add_group_variable,
    add_second_variable,
    data,
    make_input,
    spec_dict,
)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _as_dask(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with each declared array (:class:`Declared`) as a dask array of one chunk, which
    ``to_zarr(compute=False)`` declares without writing its values."""
    declared = {
        name: (var.dims, da.zeros(var.shape, chunks=var.shape or (), dtype=var.dtype), var.attrs)
        for name, var in ds.variables.items()
        if isinstance(var.data, Declared)
    }
    out = ds.assign(declared) if declared else ds
    for name in declared:
        out[name].encoding = dict(ds[name].encoding)
    return out


def _with_xarray(ds: xr.Dataset, store: str, encoding: dict[str, Any]) -> None:
    ds = _as_dask(ds)
    ds.to_zarr(
        store,
        mode="w-",
        compute=False,
        zarr_format=3,
        consolidated=False,
        encoding=copy.deepcopy(encoding),
    )


def assert_same_files(ds: Skeleton | xr.Dataset, encoding: dict[str, Any], tmp: Path) -> None:
    """``write_skeleton`` and ``to_zarr`` write the same files (names and bytes); where
    ``to_zarr`` refuses the dataset, so does ``write_skeleton``, and it writes nothing."""
    ours, theirs = tmp / "ours.zarr", tmp / "xarray.zarr"
    try:
        _with_xarray(ds.to_xarray() if isinstance(ds, Skeleton) else ds, str(theirs), encoding)
    except Exception as exc:
        with pytest.raises(type(exc)):
            write_skeleton(ds, str(ours), encoding=copy.deepcopy(encoding))
        assert not ours.exists()
        return
    write_skeleton(ds, str(ours), encoding=copy.deepcopy(encoding))
    a, b = _files(ours), _files(theirs)
    assert sorted(a) == sorted(b)
    different = [key for key in a if a[key] != b[key]]
    assert not different, {key: (a[key][:300], b[key][:300]) for key in different}


# -- the skeletons of real releases ---------------------------------------------------------------
def _release_cases(tmp: Path) -> dict[str, dict[str, Any]]:
    narrow = make_input(tmp / "narrow.zarr", data(5, 300, seed=1), chunk=100)
    records_first = make_input(tmp / "rf.zarr", data(4, 200, seed=2), chunk=50, records_first=True)
    wide = make_input(tmp / "wide.zarr", data(300, 120, seed=3), chunk=60)
    grouped_int = add_group_variable(
        make_input(tmp / "g-int.zarr", data(3, 90, seed=4), chunk=30), np.arange(90) % 2
    )
    grouped_str = add_group_variable(
        make_input(tmp / "g-str.zarr", data(3, 90, seed=5), chunk=30),
        np.array(["a", "b", "c"] * 30, dtype=object),
    )
    pca = {"directions": {"method": "dp-pca", "k": 2}, "allocation": {"strategy": "binary"}}
    # feature names of other types (as the input's coordinate gives them), no coordinate at all
    int_names = make_input(tmp / "int-names.zarr", data(3, 90, seed=6), chunk=30, names=[7, -1, 2])
    float_names = make_input(
        tmp / "float-names.zarr", data(3, 90, seed=7), chunk=30, names=[0.5, float("nan"), -2.0]
    )
    unicode_names = make_input(
        tmp / "unicode.zarr", data(3, 90, seed=8), chunk=30, names=["é", "漢字", "a b/c"]
    )
    no_names = write_matrix(
        data(3, 90, seed=9).astype(np.float32), tmp / "no-names.zarr", record_chunk=30
    )
    grouped_unicode = add_group_variable(
        make_input(tmp / "g-uni.zarr", data(3, 90, seed=10), chunk=30),
        np.array(["nord", "süd"] * 45, dtype=object),
    )
    two_variables = add_second_variable(
        make_input(tmp / "two.zarr", data(3, 90, seed=11), chunk=30, names=[1, 2, 3]),
        data(2, 90, seed=12),
        names=[2, 5],
    )

    def out(name: str) -> str:
        return str(tmp / f"{name}.out.zarr")

    return {
        "identity": spec_dict(narrow, out("identity")),
        "identity-records-first": spec_dict(records_first, out("identity-rf")),
        "identity-dp-pca": spec_dict(
            narrow, out("identity-pca"), mechanism={"algorithm": "unimodal", **pca}
        ),
        "covariance": spec_dict(narrow, out("cov"), query="covariance"),
        "covariance-add-remove": spec_dict(
            narrow,
            out("cov-ar"),
            query="covariance",
            privacy={"neighbours": "add-remove"},
        ),
        "covariance-symmetric": spec_dict(
            narrow,
            out("cov-sym"),
            query="covariance",
            mechanism={"algorithm": "symmetric", "calibration": "exact"},
        ),
        "covariance-dp-pca": spec_dict(
            narrow, out("cov-pca"), query="covariance", mechanism={"algorithm": "equi-modal", **pca}
        ),
        "covariance-300-features": spec_dict(wide, out("cov-300"), query="covariance"),
        "covariance-blocked": spec_dict(
            wide,
            out("cov-blocked"),
            query="covariance",
            mechanism={"algorithm": "symmetric", "calibration": "exact"},
            output={"matrix_chunk": 256},
        ),
        "mean": _moment(narrow, out("mean"), "mean"),
        "centered-covariance": _moment(narrow, out("centered"), "centered-covariance"),
        "mean-first": _moment(
            narrow, out("mean-first"), {"centered-covariance": {"route": "mean-first"}}
        ),
        "grouped-int": _moment(grouped_int, out("grouped-int"), "centered-covariance", [0, 1]),
        "grouped-str": _moment(
            grouped_str, out("grouped-str"), "centered-covariance", ["a", "b", "c"]
        ),
        "cross-covariance": _cross(narrow, out("cross")),
        "identity-float32-without-coordinates": spec_dict(no_names, out("identity-f32")),
        "covariance-int-names": spec_dict(int_names, out("cov-int"), query="covariance"),
        "covariance-float-names": spec_dict(float_names, out("cov-float"), query="covariance"),
        "centered-covariance-unicode-names": _moment(
            unicode_names, out("centered-unicode"), "centered-covariance"
        ),
        "grouped-unicode": _moment(
            grouped_unicode, out("grouped-unicode"), "centered-covariance", ["nord", "süd"]
        ),
        "cross-covariance-two-variables-int-names": _cross(
            two_variables,
            out("cross-two"),
            rows=[1, 3],
            cols={"variable": "Y", "features": [5, 2], "box": {"lower": 0.0, "upper": 1.0}},
        ),
        "stream-period": {
            "name": "nightly",
            "input": {"store": narrow, "variable": "X"},
            "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
            "query": "covariance",
            "privacy": {"epsilon": 1.0, "delta": 1e-6, "neighbours": "add-remove"},
            "output": {"store": out("stream")},
            "stream": {"horizon": 4, "max_records": 4096},
        },
    }


def _moment(store: str, out: str, query: Any, groups: list[Any] | None = None) -> dict[str, Any]:
    """A moment query's spec (its default mechanism), grouped by ``site`` with ``groups``."""
    spec = spec_dict(store, out, query="covariance")
    spec["query"] = query
    spec["mechanism"].pop("algorithm")
    if groups is not None:
        spec["group_by"] = {"variable": "site", "groups": groups}
    return spec


def _cross(store: str, out: str, rows: list[Any] | None = None, cols: Any = None) -> dict[str, Any]:
    spec = spec_dict(store, out, query="covariance")
    spec["query"] = {
        "cross-covariance": {
            "rows": ["f0", "f3"] if rows is None else rows,
            "cols": ["f1", "f2", "f4"] if cols is None else cols,
        }
    }
    spec["mechanism"].pop("algorithm")
    return spec


#: the release cases whose skeletons xarray encodes: the identity outputs with coordinates (which
#: are xarray's, copied from the input)
XARRAY_ENCODED = {"identity", "identity-records-first", "identity-dp-pca"}


def test_release_skeletons_are_the_files_to_zarr_writes(client, tmp_path, monkeypatch) -> None:
    """Every kind of output (identity, records first, covariance with and without a noisy
    count (add-remove), symmetric, DP-PCA, lazy noise matrices, blocked, mean, centered
    covariance by its moment and mean-first routes, grouped by integer, string and non-ASCII
    labels, cross-covariance of one variable and of two, a stream's period; feature names of
    strings, non-ASCII strings, integers, floats with a NaN, or none, a float32 input): the
    skeleton a real release writes equals xarray's ``to_zarr`` of the same dataset, file by
    file. All but the identity outputs with coordinates (xarray's, copied from the input,
    :data:`XARRAY_ENCODED`) are encoded without xarray."""
    caught: list[tuple[Skeleton, dict[str, Any]]] = []
    real = output_module.write_skeleton

    def catch(ds: Skeleton, store: str, **kw: Any) -> None:
        caught.append((ds.copy(), copy.deepcopy(kw.get("encoding") or {})))
        real(ds, store, **kw)

    monkeypatch.setattr(output_module, "write_skeleton", catch)
    for name, spec in _release_cases(tmp_path).items():
        caught.clear()
        api.release(spec, client=client, seed=3, progress=False)
        assert len(caught) == 1, name
        ds, encoding = caught[0]
        plain = _plain_arrays(ds, copy.deepcopy(encoding)) is not None
        assert plain == (name not in XARRAY_ENCODED), name
        case = tmp_path / f"case-{name}"
        case.mkdir()
        assert_same_files(ds, encoding, case)


# -- random datasets ----------------------------------------------------------------------------
DIMS = {"a": 3, "b": 5, "c": 1}
DTYPES = ["float64", "float32", "int64", "int16", "uint8", "bool", "str", "datetime"]


def _values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "str":
        words = np.array(["", "x", "feature", "ünïcode", "a b"], dtype=object)
        return np.asarray(words[rng.integers(0, len(words), shape)], dtype=object)
    if dtype == "datetime":
        return np.datetime64("2020-01-01") + rng.integers(0, 1000, shape).astype("timedelta64[D]")
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("float"):
        out = rng.normal(size=shape).astype(dtype)
        if out.size:
            out.flat[0] = np.nan
        return out
    return rng.integers(0, 100, shape).astype(dtype)


scalar_attrs = st.one_of(
    st.text(max_size=8), st.integers(-5, 5), st.floats(allow_nan=False), st.booleans()
)
attrs = st.dictionaries(
    st.sampled_from(["units", "description", "k", "flag"]),
    st.one_of(scalar_attrs, st.lists(st.integers(-3, 3), max_size=3)),
    max_size=3,
)


@st.composite
def datasets(draw: st.DrawFn) -> tuple[xr.Dataset, dict[str, Any]]:
    variables: dict[str, xr.DataArray] = {}
    encoding: dict[str, Any] = {}
    for i in range(draw(st.integers(1, 4))):
        dims = tuple(draw(st.lists(st.sampled_from(sorted(DIMS)), unique=True, max_size=2)))
        shape = tuple(DIMS[d] for d in dims)
        dtype = draw(st.sampled_from(DTYPES))
        numeric = dtype not in ("str", "datetime", "bool")
        lazy = numeric and draw(st.booleans())
        values: Any = _values(dtype, shape, seed=i)
        if lazy:  # a dask array of one chunk, or the release's declared array
            declared = draw(st.booleans())
            values = (
                Declared(shape, dtype) if declared else da.zeros(shape, chunks=shape, dtype=dtype)
            )
        name = f"v{i}"
        variables[name] = xr.DataArray(values, dims=dims, attrs=draw(attrs))
        enc: dict[str, Any] = {}
        if shape and draw(st.booleans()):
            enc["chunks"] = tuple(draw(st.integers(1, n)) for n in shape)
        elif lazy and shape:
            enc["chunks"] = shape
        if numeric and draw(st.booleans()):
            enc["compressors"] = draw(st.sampled_from([None, (), "zstd"]))
            if enc["compressors"] == "zstd":
                from zarr.codecs import ZstdCodec

                enc["compressors"] = (ZstdCodec(level=3),)
        if dtype.startswith("float") and draw(st.booleans()):
            enc["fill_value"] = 0.0
        if enc:
            encoding[name] = enc
    coords: dict[str, Any] = {}
    for dim in sorted(DIMS):
        if draw(st.booleans()):
            kind = draw(st.sampled_from(["int64", "str", "float64"]))
            coords[dim] = (dim, _values(kind, (DIMS[dim],), seed=ord(dim)))
    if draw(st.booleans()):  # a coordinate that is not a dimension: the "coordinates" attribute
        coords["label"] = ("a", _values("str", (DIMS["a"],), seed=9))
    ds = xr.Dataset(variables, coords=coords, attrs=draw(attrs))
    return ds, encoding


@given(datasets())
def test_random_datasets_give_the_files_to_zarr_writes(tmp_path_factory, case) -> None:
    """Random dims, dtypes (floats, ints, bool, strings, datetimes), lazy or in-memory values,
    attributes, chunks, codecs, fill values and coordinates (hypothesis, default profile)."""
    ds, encoding = case
    assert_same_files(ds, encoding, tmp_path_factory.mktemp("random"))


def test_plain_skeletons_are_encoded_without_xarray_and_give_the_same_files(tmp_path) -> None:
    """A :class:`Skeleton` of plain variables (integers, float32 and float64, strings, scalars,
    declared arrays, numpy attribute values) is encoded here, one holding anything else (a
    boolean variable, a CF attribute, a big-endian array) by xarray: the same files as
    ``to_zarr`` either way."""
    from mvg_dask.engine.output_arrays import output_dataset, output_variable

    labels = np.array(["x", "ü", "a b"], dtype=object)
    variables = {
        "m": output_variable(Declared((3, 3)), ("f_row", "f_col")),
        "s": output_variable(np.float32(0.25), attrs={"description": "a ratio"}),
        "v": output_variable(np.arange(3, dtype=np.int32), ("k",), {"n": np.int64(2)}),
        "w": output_variable(np.array([0.5, np.nan, 2.0]), ("k",), {"a": np.arange(2)}),
    }
    coords = {"f_row": labels, "f_col": labels, "k": np.array([10, 20, 30], dtype=np.uint16)}
    encoding = {"m": {"chunks": (2, 2), "compressors": None, "fill_value": 0.0}}
    others = {
        "bool": output_variable(np.array([True, False, True]), ("k",)),
        "cf": output_variable(np.arange(3.0), ("k",), {"scale_factor": 2.0}),
        "big-endian": output_variable(np.arange(3, dtype=">i4"), ("k",)),
    }
    for name, extra in [("plain", {}), *((k, {k: v}) for k, v in others.items())]:
        ds = output_dataset({**variables, **extra}, coords=coords)
        ds.attrs.update(mvg_dask_status="incomplete", k=np.float64(1.5))
        assert (_plain_arrays(ds, copy.deepcopy(encoding)) is not None) == (name == "plain")
        case = tmp_path / name
        case.mkdir()
        assert_same_files(ds, encoding, case)


def test_an_existing_group_is_refused_and_left_alone(tmp_path) -> None:
    ds = xr.Dataset({"x": ("a", np.arange(3.0))}, attrs={"k": "first"})
    store = str(tmp_path / "s.zarr")
    write_skeleton(ds, store)
    before = _files(tmp_path / "s.zarr")
    with pytest.raises(FileExistsError, match="already holds a Zarr node"):
        write_skeleton(ds.assign_attrs(k="second"), store)
    assert _files(tmp_path / "s.zarr") == before


def test_a_cf_fill_value_in_the_encoding_gives_the_files_to_zarr_writes(tmp_path) -> None:
    """``_FillValue`` given as encoding: xarray's CF encoder makes it an attribute (base64 of
    the value), with the Zarr fill value left at NaN; the same files."""
    ds = xr.Dataset({"x": ("a", np.arange(3.0))})
    assert_same_files(ds, {"x": {"_FillValue": 0.0}}, tmp_path)
    meta = json.loads((tmp_path / "ours.zarr" / "x" / "zarr.json").read_bytes())
    assert meta["attributes"]["_FillValue"] == "AAAAAAAAAAA="


def test_an_encoding_for_a_missing_variable_is_refused(tmp_path) -> None:
    ds = xr.Dataset({"x": ("a", np.arange(3.0))})
    with pytest.raises(ValueError, match=r"variables the dataset does not have: \['y'\]"):
        write_skeleton(ds, str(tmp_path / "s.zarr"), encoding={"y": {"chunks": (1,)}})
    assert not (tmp_path / "s.zarr").exists()


def test_an_fsspec_url_gets_the_same_files() -> None:
    """An object store (fsspec's memory filesystem): the same keys and bytes as ``to_zarr``."""
    fs = fsspec.filesystem("memory")
    for path in ("/skeleton-test/ours.zarr", "/skeleton-test/xarray.zarr"):
        if fs.exists(path):
            fs.rm(path, recursive=True)
    ds = xr.Dataset(
        {
            "c": (("r", "s"), da.zeros((4, 4), chunks=(4, 4))),
            "v": ("r", np.linspace(0, 1, 4)),
        },
        coords={"r": np.array(["a", "b", "c", "d"], dtype=object)},
        attrs={"status": "incomplete"},
    )
    encoding = {"c": {"chunks": (2, 2), "compressors": None}}
    write_skeleton(ds, "memory://skeleton-test/ours.zarr", encoding=copy.deepcopy(encoding))
    _with_xarray(ds, "memory://skeleton-test/xarray.zarr", encoding)

    def files(root: str) -> dict[str, bytes]:
        return {p.removeprefix(root): fs.cat_file(p) for p in fs.find(root)}

    assert files("/skeleton-test/ours.zarr") == files("/skeleton-test/xarray.zarr")


# -- the commit's root document -------------------------------------------------------------------
def test_the_committed_root_is_what_zarr_consolidation_writes(tmp_path) -> None:
    """``consolidated_root`` gives the bytes of ``zarr.consolidate_metadata`` followed by
    ``update_attributes`` (Zarr's own API, the oracle), for a skeleton with arrays of several
    kinds, and ``xr.open_zarr`` reads the result through the consolidated metadata."""
    import warnings

    import zarr

    from mvg_dask.engine.zarr_io.consolidated import consolidated_root

    ds = xr.Dataset(
        {
            "covariance": (("f_row", "f_col"), da.zeros((3, 3), chunks=(3, 3))),
            "noise_variances": ("direction", np.array([0.5, 1.0, 2.0])),
            "symmetric_ratio": ((), 0.5, {"description": "r"}),
            "count": ((), np.int64(7)),
        },
        coords={"f_row": np.array(["a", "b", "c"], dtype=object), "f_col": [1, 2, 3]},
        attrs={"mvg_dask_status": "incomplete", "mvg_dask_release_id": "r1"},
    )
    final = {"mvg_dask_epsilon": 1.0, "mvg_dask_plan": {"k": [1, 2]}, "mvg_dask_status": "complete"}
    ours, oracle = tmp_path / "ours.zarr", tmp_path / "oracle.zarr"
    for store in (ours, oracle):
        write_skeleton(ds, str(store), encoding={"covariance": {"chunks": (2, 2)}})
    children = {p.parent.name: p.read_bytes() for p in sorted(ours.glob("*/zarr.json"))}
    (ours / "zarr.json").write_bytes(
        consolidated_root((ours / "zarr.json").read_bytes(), children, final)
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
        zarr.consolidate_metadata(str(oracle))
    zarr.open_group(str(oracle), mode="r+", use_consolidated=True).update_attributes(final)
    assert (ours / "zarr.json").read_bytes() == (oracle / "zarr.json").read_bytes()
    root = json.loads((ours / "zarr.json").read_bytes())
    assert sorted(root["consolidated_metadata"]["metadata"]) == sorted(children)
    opened = xr.open_zarr(str(ours), consolidated=True)
    assert opened.attrs["mvg_dask_status"] == "complete"
    assert list(opened["f_row"].values) == ["a", "b", "c"]


def test_a_store_path_with_glob_characters_commits_every_array(client, tmp_path) -> None:
    """The commit lists the group's arrays (never globs them): an output path holding ``[``,
    ``]`` and ``*`` still gets every array's metadata consolidated in its root."""

    store = make_input(tmp_path / "in.zarr", data(3, 200, seed=4), chunk=100)
    out = tmp_path / "run[1]*.zarr"
    api.release(
        spec_dict(store, str(out), query="covariance"), client=client, seed=1, progress=False
    )
    root = json.loads((out / "zarr.json").read_bytes())
    arrays = {p.name for p in out.iterdir() if (p / "zarr.json").exists()}
    assert "covariance" in arrays
    assert sorted(root["consolidated_metadata"]["metadata"]) == sorted(arrays)
    assert root["attributes"]["mvg_dask_status"] == "complete"


# -- skeletons xarray refuses, and random skeletons ----------------------------------------------
def test_a_skeleton_xarray_refuses_is_refused_and_nothing_is_written(tmp_path) -> None:
    """Skeletons that are not datasets xarray makes are not encoded here: a name that is both a
    data variable and a coordinate (an input whose feature dimension is called ``mean``, for a
    mean release), a dimension of two lengths (``term`` for a moment release), a declared
    coordinate (xarray indexes its values), an object coordinate of ``str`` and ``numpy.str_``
    (xarray infers no type). ``to_zarr`` refuses each; so does the skeleton writer, with
    xarray's error, and it writes nothing."""
    from mvg_dask.engine.output_arrays import output_dataset, output_variable

    labels = np.array(["a", "b", "c"], dtype=object)
    matrix = output_variable(Declared((3, 3)), ("f_row", "f_col"))
    vector = output_variable(Declared((3,)), ("f_row",))
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "data-variable-and-coordinate": ({"f_row": vector, "m": matrix}, {"f_row": labels}),
        "coordinate-of-another-length": ({"m": matrix}, {"f_row": labels[:2]}),
        "variables-of-two-lengths": (
            {"m": matrix, "v": output_variable(Declared((4,)), ("f_col",))},
            {},
        ),
        "declared-coordinate": ({"m": matrix}, {"f_row": vector}),
        "str-and-numpy-str": (
            {"m": matrix},
            {"f_row": np.array(["a", np.str_("b"), "c"], dtype=object)},
        ),
    }
    for name, (variables, coords) in cases.items():
        ds = output_dataset(variables, coords=coords)
        assert _plain_arrays(ds, {}) is None, name
        with pytest.raises((ValueError, TypeError)):
            write_skeleton(ds, str(tmp_path / f"{name}.zarr"))
        assert not (tmp_path / f"{name}.zarr").exists(), name
        case = tmp_path / name
        case.mkdir()
        assert_same_files(ds, {}, case)


@pytest.mark.parametrize(("dim", "query"), [("mean", "mean"), ("term", "centered-covariance")])
def test_a_feature_dimension_named_like_an_output_name_is_refused_before_any_charge(
    client, tmp_path, dim: str, query: str
) -> None:
    """An input whose feature dimension is named like an output variable or dimension (``mean``
    for a mean release: the ``mean`` variable and the feature coordinate would share the name;
    ``term`` for a centered covariance: a dimension of two lengths) is refused with one line
    naming ``input.feature_dim``, by the dry run and by the release, before anything is read or
    charged: nothing is published and the ledger records nothing. (The skeleton writer once
    published the noisy means as the text values of a ``mean`` coordinate; later, xarray's
    refusal came after the budget was reserved.)"""
    from mvg_dask.errors import DataError
    from mvg_dask.ledger import open_ledger

    store = str(tmp_path / "in.zarr")
    xr.Dataset(
        {"X": ((dim, "record"), data(3, 60, seed=1))},
        coords={dim: np.array(["a", "b", "c"], dtype=object)},
    ).to_zarr(store, zarr_format=3, consolidated=False)
    out, ledger = tmp_path / "out.zarr", tmp_path / "ledger.sqlite"
    spec = _moment(store, str(out), query)
    spec["input"]["feature_dim"] = dim
    spec["ledger"] = {"path": str(ledger), "dataset": "d", "budget": {"epsilon": 3, "delta": 1e-4}}
    refusal = rf"^input.feature_dim: {dim!r} is a name a release gives one of its output"
    with pytest.raises(DataError, match=refusal):
        api.dry_run(spec)
    with pytest.raises(DataError, match=refusal) as err:
        api.release(spec, client=client, progress=False)
    assert "\n" not in str(err.value)
    assert not out.exists()
    if ledger.exists():
        with open_ledger(str(ledger)) as book:
            assert book.releases("d") == []


SKELETON_DIMS = {"f_row": 3, "f_col": 3, "group": 2}

json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6)
)
numpy_values = st.one_of(
    st.floats(width=32).map(np.float32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.booleans().map(np.bool_),
    st.lists(st.floats(), max_size=3).map(np.array),
)
#: attribute values: JSON (nested lists and dicts) or numpy scalars and arrays (not drawn nested
#: in a list or dict, where Zarr's JSON encoder refuses them either way)
attr_values = st.one_of(
    st.recursive(
        json_leaves,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=6,
    ),
    numpy_values,
)
skeleton_attrs = st.dictionaries(
    st.sampled_from(["description", "units", "k", "note", "plan"]), attr_values, max_size=3
)


@st.composite
def coordinate_values(draw: st.DrawFn, n: int) -> np.ndarray:
    """Feature names or group labels as a release makes them: strings (any text, as objects),
    integers (int64 or uint64) or floats (NaN and infinities too)."""
    kind = draw(st.sampled_from(["str", "int64", "uint64", "float64"]))
    if kind == "str":
        return np.array(draw(st.lists(st.text(max_size=5), min_size=n, max_size=n)), dtype=object)
    if kind == "float64":
        return np.array(draw(st.lists(st.floats(), min_size=n, max_size=n)), dtype=np.float64)
    low, high = (0, 2**64 - 1) if kind == "uint64" else (-(2**63), 2**63 - 1)
    return np.array(draw(st.lists(st.integers(low, high), min_size=n, max_size=n)), dtype=kind)


@st.composite
def skeletons(draw: st.DrawFn) -> tuple[Skeleton, dict[str, Any]]:
    """A release-like :class:`Skeleton`: declared and in-memory float64/float32/int64 variables
    over the feature and group dimensions (or scalars), random attributes and coordinates, and
    the encodings a release gives (chunks, zstd or none, fill value 0)."""
    from zarr.codecs import ZstdCodec

    from mvg_dask.engine.output_arrays import output_dataset, output_variable

    variables: dict[str, Any] = {}
    encoding: dict[str, Any] = {}
    for i in range(draw(st.integers(1, 4))):
        dims = tuple(
            draw(st.lists(st.sampled_from(sorted(SKELETON_DIMS)), unique=True, max_size=3))
        )
        shape = tuple(SKELETON_DIMS[d] for d in dims)
        dtype = draw(st.sampled_from(["float64", "float32", "int64"]))
        values: Any = Declared(shape, dtype)
        if draw(st.booleans()):
            values = _values(dtype, shape, seed=i)
        variables[f"v{i}"] = output_variable(values, dims, draw(skeleton_attrs))
        enc: dict[str, Any] = {}
        if shape and draw(st.booleans()):
            enc["chunks"] = tuple(draw(st.integers(1, n)) for n in shape)
        if draw(st.booleans()):
            enc["compressors"] = draw(st.sampled_from([None, (ZstdCodec(),)]))
        if dtype != "int64" and draw(st.booleans()):
            enc["fill_value"] = 0.0
        if enc:
            encoding[f"v{i}"] = enc
    coords = {
        dim: draw(coordinate_values(n)) for dim, n in SKELETON_DIMS.items() if draw(st.booleans())
    }
    ds = output_dataset(variables, coords=coords)
    ds.attrs.update(draw(skeleton_attrs))
    return ds, encoding


@given(skeletons())
def test_random_skeletons_give_the_files_to_zarr_writes(tmp_path_factory, case) -> None:
    """Random release-like skeletons (hypothesis, default profile): coordinates of any text
    (non-ASCII, empty, NUL), int64, uint64 or float values, attributes of nested lists and
    dicts, ``None``, booleans, NaN, infinities, big integers and numpy scalars and arrays: the
    files ``to_zarr`` writes, or its refusal."""
    ds, encoding = case
    assert_same_files(ds, encoding, tmp_path_factory.mktemp("skeleton"))
