"""Tests of the bundled paper data sets and their loaders (``mvg_dask.datasets``)."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import io
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import numpy as np
import pytest

from mvg_dask import datasets
from mvg_dask.datasets import loaders
from mvg_dask.datasets.loaders import (
    CTG_BOUNDS,
    LIVER_BOUNDS,
    MOVEMENT_BOUNDS,
    MOVEMENT_SAMPLES,
    PaperDataset,
    load_ctg,
    load_liver,
    load_movement,
)

MOVEMENT_N = {"full_version": 10_176, "conference": 2_021, "all": 13_197}
MOVEMENT_SEQUENCES = {"full_version": 255, "conference": 80, "all": 314}
LIVER_NAMES = ("mcv", "alkphos", "sgpt", "sgot", "gammagt", "drinks")
CTG_NAMES = (
    "LB AC FM UC DL DS DP ASTV MSTV ALTV MLTV Width Min Max Nmax Nzeros Mode Mean Median "
    "Variance Tendency"
).split()
DATASET_DIRS = ("liver", "ctg", "movement")


def _data_root() -> Traversable:
    """Return the shipped ``data`` directory, located the way the loaders locate it."""
    return resources.files("mvg_dask.datasets").joinpath("data")


def _walk(node: Traversable, prefix: str = "") -> Iterator[tuple[str, Traversable]]:
    """Yield ``(relative path, file)`` for every file below ``node``."""
    for child in node.iterdir():
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            yield from _walk(child, rel + "/")
        else:
            yield rel, child


def _source_md(dataset: str) -> str:
    """Return the text of a shipped ``SOURCE.md``."""
    return _data_root().joinpath(dataset, "SOURCE.md").read_text(encoding="utf-8")


def _source_sha256(dataset: str) -> dict[str, str]:
    """Parse the SHA-256 values that a ``SOURCE.md`` gives, keyed by relative file path."""
    text = _source_md(dataset)
    table = re.findall(r"^\|\s*`([^`]+)`\s*\|\s*`([0-9a-f]{64})`\s*\|", text, flags=re.M)
    listing = re.findall(r"^([0-9a-f]{64})\s+(\S+)\s*$", text, flags=re.M)
    out = {name: digest for name, digest in table}
    out.update({name: digest for digest, name in listing})
    return out


def _source_ranges(dataset: str) -> dict[str, tuple[float, float]]:
    """Parse the ``| feature | min | max | mean |`` table of a ``SOURCE.md``."""
    number = r"(-?[0-9.]+(?:e-?[0-9]+)?)"
    rows = re.findall(
        rf"^\|\s*(\w+)\s*\|\s*{number}\s*\|\s*{number}\s*\|", _source_md(dataset), flags=re.M
    )
    return {name: (float(lo), float(hi)) for name, lo, hi in rows}


@cache
def _movement(sample: str) -> PaperDataset:
    return load_movement(sample)  # type: ignore[arg-type]


@cache
def _ctg() -> PaperDataset:
    return load_ctg()


def _liver_all_scaled() -> np.ndarray:
    """All 345 Liver records scaled independently of the loader, shape (6, 345)."""
    text = _data_root().joinpath("liver", "bupa.data").read_text(encoding="ascii")
    raw = np.loadtxt(io.StringIO(text), delimiter=",")[:, :6].T
    lo = np.array([LIVER_BOUNDS[n][0] for n in LIVER_NAMES])[:, None]
    hi = np.array([LIVER_BOUNDS[n][1] for n in LIVER_NAMES])[:, None]
    return np.clip((raw - lo) / (hi - lo), 0.0, 1.0)


def _sorted_columns(a: np.ndarray) -> np.ndarray:
    """Columns of ``a`` in lexicographic order (to compare multisets of records)."""
    return a[:, np.lexsort(a[::-1])]


# ----------------------------------------------------------------------------- shipped files


def test_shipped_files_are_exactly_what_the_loaders_need() -> None:
    files = {rel for rel, _ in _walk(_data_root())}
    movement = {f"movement/dataset/MovementAAL_RSS_{i}.csv" for i in range(1, 315)}
    expected = {
        "ATTRIBUTION.md",
        "liver/SOURCE.md",
        "liver/bupa.data",
        "liver/bupa.names",
        "liver/noteDuplicates.txt",
        "ctg/SOURCE.md",
        "ctg/CTG_Data_sheet.csv",
        "movement/SOURCE.md",
    } | movement
    assert files == expected


@pytest.mark.parametrize("dataset", DATASET_DIRS)
def test_shipped_files_match_sha256_in_source_md(dataset: str) -> None:
    digests = _source_sha256(dataset)
    shipped = [(rel, f) for rel, f in _walk(_data_root().joinpath(dataset)) if rel != "SOURCE.md"]
    assert shipped
    for rel, node in shipped:
        assert rel in digests, f"{dataset}/{rel} has no SHA-256 in SOURCE.md"
        assert hashlib.sha256(node.read_bytes()).hexdigest() == digests[rel], rel


def test_attribution_names_datasets_and_licence() -> None:
    text = _data_root().joinpath("ATTRIBUTION.md").read_text(encoding="utf-8")
    for needle in ("CC BY 4.0", "Liver Disorders", "Cardiotocography", "MovementAAL", "CTG.xls"):
        assert needle in text
    assert "derived" in text


# ----------------------------------------------------------------------------- Liver (Exp. I)


def test_liver_shapes_names_and_important() -> None:
    d = load_liver()
    assert d.name == "liver"
    assert d.X.shape == (6, 248) and d.X.dtype == np.float64
    assert d.X_test is not None and d.X_test.shape == (6, 97) and d.X_test.dtype == np.float64
    assert d.feature_names == LIVER_NAMES
    assert [d.feature_names[i] for i in d.important] == ["sgpt", "drinks"]
    np.testing.assert_array_equal(d.lower, np.zeros(6))
    np.testing.assert_array_equal(d.upper, np.ones(6))
    assert "default_rng(0)" in d.description


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_liver_split_partitions_the_345_records(seed: int) -> None:
    train, test = loaders._liver_split(seed)
    assert len(train) == 248 and len(test) == 97
    assert not set(train.tolist()) & set(test.tolist())
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(345))

    d = load_liver(seed)
    assert d.X_test is not None
    everything = _liver_all_scaled()
    np.testing.assert_array_equal(d.X, everything[:, train])
    np.testing.assert_array_equal(d.X_test, everything[:, test])
    both = np.concatenate([d.X, d.X_test], axis=1)
    np.testing.assert_array_equal(_sorted_columns(both), _sorted_columns(everything))


def test_liver_split_is_deterministic_per_seed() -> None:
    a, b, c = load_liver(7), load_liver(7), load_liver(8)
    np.testing.assert_array_equal(a.X, b.X)
    assert a.X_test is not None and b.X_test is not None
    np.testing.assert_array_equal(a.X_test, b.X_test)
    assert not np.array_equal(a.X, c.X)


def test_liver_split_ignores_and_keeps_global_random_state() -> None:
    # Deliberate use of the legacy global RNG: the loader must neither read nor advance it.
    np.random.seed(1)  # noqa: NPY002
    first = load_liver(3)
    drawn_after_load = np.random.random()  # noqa: NPY002
    np.random.seed(1)  # noqa: NPY002
    assert drawn_after_load == np.random.random()  # noqa: NPY002
    np.random.seed(2)  # noqa: NPY002
    np.testing.assert_array_equal(first.X, load_liver(3).X)


@pytest.mark.parametrize(("seed", "error"), [(None, TypeError), (1.5, TypeError), (-1, ValueError)])
def test_liver_rejects_non_reproducible_seeds(seed: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        load_liver(seed)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- CTG (Exp. III)


def test_ctg_shape_names_and_important() -> None:
    d = _ctg()
    assert d.name == "ctg"
    assert d.X.shape == (21, 2126) and d.X.dtype == np.float64
    assert d.X_test is None
    assert list(d.feature_names) == CTG_NAMES
    assert [d.feature_names[i] for i in d.important] == ["LB", "ASTV", "ALTV"]
    np.testing.assert_array_equal(d.lower, np.zeros(21))
    np.testing.assert_array_equal(d.upper, np.ones(21))


# ----------------------------------------------------------------------------- Movement (Exp. II)


@pytest.mark.parametrize("sample", MOVEMENT_SAMPLES)
def test_movement_shape_for_each_sample(sample: str) -> None:
    d = _movement(sample)
    assert d.name == "movement"
    assert d.X.shape == (4, MOVEMENT_N[sample]) and d.X.dtype == np.float64
    assert d.X_test is None
    assert d.feature_names == ("ANC0", "ANC1", "ANC2", "ANC3")
    assert [d.feature_names[i] for i in d.important] == ["ANC0", "ANC3"]
    np.testing.assert_array_equal(d.lower, -np.ones(4))
    np.testing.assert_array_equal(d.upper, np.ones(4))
    assert f"{MOVEMENT_N[sample]:,}" in d.description


def test_movement_samples_and_default() -> None:
    assert set(MOVEMENT_SAMPLES) == set(MOVEMENT_N)
    default = inspect.signature(load_movement).parameters["sample"].default
    assert default == "full_version"
    assert load_movement().n_records == 10_176
    desc = _movement("all").description
    for count in ("13,197", "10,176", "2,021", "2,568", "5,259", "5,370", "7,562", "5,635"):
        assert count in desc


def test_movement_samples_are_id_order_prefixes_of_the_raw_files() -> None:
    full, conf, everything = _movement("full_version"), _movement("conference"), _movement("all")
    np.testing.assert_array_equal(conf.X, everything.X[:, :2021])
    np.testing.assert_array_equal(full.X, everything.X[:, :10_176])
    raw = [
        np.loadtxt(
            io.StringIO(
                _data_root()
                .joinpath("movement", "dataset", f"MovementAAL_RSS_{i}.csv")
                .read_text(encoding="ascii")
            ),
            delimiter=",",
            comments="#",
            ndmin=2,
        )
        for i in range(1, 315)
    ]
    lengths = np.cumsum([len(r) for r in raw])
    for sample, k in MOVEMENT_SEQUENCES.items():
        assert lengths[k - 1] == MOVEMENT_N[sample]
    # values are the files' values, bit for bit (already in the declared [-1, 1])
    np.testing.assert_array_equal(everything.X, np.concatenate(raw).T)
    np.testing.assert_array_equal(everything.X[:, 0], [-0.90476, -0.48, 0.28571, 0.3])


def test_movement_rejects_unknown_sample() -> None:
    with pytest.raises(ValueError, match="sample"):
        load_movement("10176")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- all data sets


def _all_datasets() -> list[PaperDataset]:
    return [load_liver(), _ctg(), *(_movement(s) for s in MOVEMENT_SAMPLES)]


def test_values_lie_in_declared_domain() -> None:
    for d in _all_datasets():
        for arr in (d.X, d.X_test):
            if arr is None:
                continue
            assert np.all(np.isfinite(arr))
            assert np.all(arr >= d.lower[:, None]) and np.all(arr <= d.upper[:, None]), d.name


def test_arrays_are_read_only_and_dataset_is_frozen() -> None:
    d = load_liver()
    with pytest.raises(ValueError):
        d.X[0, 0] = 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.name = "other"  # type: ignore[misc]


def test_paper_dataset_validates_its_fields() -> None:
    ok: dict[str, Any] = {
        "name": "t",
        "X": np.zeros((2, 3)),
        "feature_names": ("a", "b"),
        "lower": np.zeros(2),
        "upper": np.ones(2),
        "important": (1,),
        "description": "test",
    }
    d = PaperDataset(**ok)
    assert d.n_features == 2 and d.n_records == 3 and d.X_test is None
    bad_cases: list[dict[str, Any]] = [
        {"X": np.zeros(3)},
        {"feature_names": ("a",)},
        {"lower": np.zeros(3)},
        {"upper": np.zeros(2)},
        {"important": (2,)},
        {"X": np.full((2, 3), 1.5)},
        {"X_test": np.zeros((3, 1))},
    ]
    for change in bad_cases:
        with pytest.raises(ValueError):
            PaperDataset(**{**ok, **change})
    with pytest.raises(TypeError):
        PaperDataset(*ok.values())  # type: ignore[call-arg]  # keyword-only


def test_public_api_is_exported() -> None:
    for name in ("PaperDataset", "load_liver", "load_ctg", "load_movement"):
        assert getattr(datasets, name) is getattr(loaders, name)


# ----------------------------------------------------------------------------- privacy rule


def test_declared_bounds_are_the_published_ranges() -> None:
    liver = _source_ranges("liver")
    assert {n: liver[n] for n in LIVER_NAMES} == dict(LIVER_BOUNDS)
    ctg = _source_ranges("ctg")
    assert {n: ctg[n] for n in CTG_NAMES} == dict(CTG_BOUNDS)
    assert dict(MOVEMENT_BOUNDS) == {f"ANC{i}": (-1.0, 1.0) for i in range(4)}
    assert "[-1, 1]" in _source_md("movement")


def test_scaling_uses_declared_bounds_not_the_data() -> None:
    names = list(CTG_BOUNDS)
    lo = np.array([CTG_BOUNDS[n][0] for n in names])
    hi = np.array([CTG_BOUNDS[n][1] for n in names])
    mid = (lo + hi) / 2
    records = np.stack([lo, hi, mid, hi + (hi - lo), lo - 1.0], axis=1)
    out = loaders._rescale(records, lo, hi)
    np.testing.assert_array_equal(out[:, 0], 0.0)
    np.testing.assert_array_equal(out[:, 1], 1.0)
    np.testing.assert_allclose(out[:, 2], 0.5)
    np.testing.assert_array_equal(out[:, 3], 1.0)  # clipped
    np.testing.assert_array_equal(out[:, 4], 0.0)  # clipped
    # identity domain: values are only clipped, so they stay bit-identical
    x = np.array([[-1.0, -0.90476, 0.28571, 1.0, 1.5]])
    same = loaders._rescale(x, np.array([-1.0]), np.array([1.0]), out_lo=-1.0, out_hi=1.0)
    np.testing.assert_array_equal(same, [[-1.0, -0.90476, 0.28571, 1.0, 1.0]])


def test_loaded_data_reflect_declared_not_observed_extremes() -> None:
    # CTG: FM's published maximum 0.480634 lies above the observed one, so no FM value is 1.
    ctg = _ctg()
    assert 0.9999 < ctg.X[CTG_NAMES.index("FM")].max() < 1.0
    # Movement, conference sample: ANC1 never reaches -1 there, and it is not stretched to it.
    conf = _movement("conference")
    assert conf.X[1].min() == pytest.approx(-0.88)
    # Liver: the 97 test records are scaled with the same constants, not their own extremes.
    d = load_liver(0)
    assert d.X_test is not None
    assert not np.all((d.X_test.min(axis=1) == 0.0) & (d.X_test.max(axis=1) == 1.0))


def test_loader_source_computes_no_bound_from_data() -> None:
    source = inspect.getsource(loaders)
    forbidden = re.compile(
        r"\.(min|max|ptp)\(|\bnp\.(min|max|amin|amax|nanmin|nanmax|ptp|percentile|quantile)\("
        r"|\b(min|max)\("
    )
    assert not forbidden.search(source), forbidden.search(source)
