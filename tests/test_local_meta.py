"""The dry run's metadata shortcut (:mod:`mvg_dask.engine.zarr_io.local_meta`) against zarr.

A local Zarr v3 store's metadata is read from its ``zarr.json`` files without importing zarr;
each case reads the same store both ways (the shortcut, and zarr's ``open_group().arrays()``)
and compares the whole :class:`InputMetadata`. Stores the shortcut does not read (Zarr v2,
sharding, big-endian data, string variables) must be handed to zarr, not misread.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from mvg_dask.engine import metadata as md
from mvg_dask.engine.zarr_io.local_meta import Unsupported, local_arrays
from mvg_dask.spec import GroupBySpec, InputSpec
from tests.pipeline_helpers import add_group_variable, add_second_variable, data, make_input


def _both(inp: InputSpec, group_by: GroupBySpec | None = None, cols: str | None = None):
    fast = md._metadata(inp, group_by, cols, dict(local_arrays(Path(inp.store))))
    slow = md._metadata(inp, group_by, cols, md._zarr_arrays(inp))
    return fast, slow


def test_written_input_as_zarr_reads_it(tmp_path: Path) -> None:
    store = make_input(tmp_path / "in.zarr", data(5, 300), chunk=64)
    add_second_variable(store, data(2, 300, seed=1), chunk=100)
    fast, slow = _both(InputSpec(store=store, variable="X"), cols="Y")
    assert fast == slow
    assert fast.feature_names == ("f0", "f1", "f2", "f3", "f4")
    assert fast.cols_input is not None and fast.cols_input.feature_names == ("g0", "g1")


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_consolidated_xarray_store_with_integer_coordinates(tmp_path: Path) -> None:
    store = str(tmp_path / "xr.zarr")
    X = data(4, 50).astype(np.float32)
    ds = xr.Dataset(
        {"X": (("record", "feature"), X.T), "site": (("record",), np.arange(50) % 3)},
        coords={"feature": np.array([10, 20, 30, 40], dtype=np.int64)},
    )
    ds.to_zarr(store, zarr_format=3, consolidated=True)
    inp = InputSpec(store=store, variable="X", record_dim="record", feature_dim="feature")
    groups = GroupBySpec(variable="site", groups=[0, 1, 2])
    fast, slow = _both(inp, groups)
    assert fast == slow and fast.feature_names == (10, 20, 30, 40) and fast.dtype == "float32"


def test_same_refusals(tmp_path: Path) -> None:
    store = make_input(tmp_path / "in.zarr", data(3, 40))
    for inp in (
        InputSpec(store=store, variable="nope"),
        InputSpec(store=store, variable="X", record_dim="rows"),
        InputSpec(store=store, variable="feature"),
    ):
        with pytest.raises(md.DataError) as fast:
            md._metadata(inp, None, None, dict(local_arrays(Path(store))))
        with pytest.raises(md.DataError) as slow:
            md._metadata(inp, None, None, md._zarr_arrays(inp))
        assert str(fast.value) == str(slow.value)


def test_other_layouts_go_to_zarr(tmp_path: Path) -> None:
    v2 = str(tmp_path / "v2.zarr")
    xr.Dataset({"X": (("feature", "record"), data(3, 20))}).to_zarr(v2, zarr_format=2)
    with pytest.raises(Unsupported):
        local_arrays(Path(v2))
    sharded = tmp_path / "sharded.zarr"
    group = zarr.open_group(sharded, mode="w", zarr_format=3)
    group.create_array("X", shape=(3, 40), chunks=(3, 10), shards=(3, 20), dtype="f8")
    with pytest.raises(Unsupported):
        local_arrays(sharded)
    big = tmp_path / "big.zarr"
    group = zarr.open_group(big, mode="w", zarr_format=3)
    arr = group.create_array(
        "X",
        shape=(3, 40),
        dtype="f8",
        dimension_names=("feature", "record"),
        serializer=zarr.codecs.BytesCodec(endian="big"),
    )
    arr[...] = data(3, 40)
    inp = InputSpec(store=str(big), variable="X")
    with pytest.raises(Unsupported):
        md._metadata(inp, None, None, dict(local_arrays(big)))
    assert md.read_input_metadata(inp) == md._metadata(inp, None, None, md._zarr_arrays(inp))
    # a codec or data type zarr must resolve, in any array of the group (here the feature
    # coordinate): zarr says (it refuses a codec it does not know)
    for i, change in enumerate(({"codecs": [{"name": "nosuchcodec"}]}, {"data_type": "r16"})):
        other = Path(make_input(tmp_path / f"other{i}.zarr", data(2, 30)))
        local_arrays(other)  # as written: read here
        meta_path = other / "feature" / "zarr.json"
        meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), **change}))
        with pytest.raises(Unsupported):
            local_arrays(other)
    strings = make_input(tmp_path / "s.zarr", data(2, 30))
    add_group_variable(strings, ["a", "b", "c"] * 10)
    inp = InputSpec(store=strings, variable="X")
    labels = GroupBySpec(variable="site", groups=["a", "b", "c"])
    with pytest.raises(Unsupported):  # a string group variable's dtype is zarr's to say
        md._metadata(inp, labels, None, dict(local_arrays(Path(strings))))
    assert md.read_input_metadata(inp, labels) == md._metadata(
        inp, labels, None, md._zarr_arrays(inp)
    )


def test_dry_run_imports_no_zarr_dask_or_xarray(tmp_path: Path) -> None:
    """The dry run of a local store stays light: no zarr, dask, distributed, xarray, pandas,
    numba, dp_accounting or scipy.special (an import check, not a timing). numcodecs, whose
    zstd decodes the feature names, is imported as usual: its codecs are then the real
    package's (``Zstd`` an instance of ``numcodecs.abc.Codec``)."""
    store = make_input(tmp_path / "in.zarr", data(4, 100))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: light\ninput: {{store: {store}, variable: X}}\n"
        "domain: {box: {lower: 0.0, upper: 1.0}, on_violation: clip}\nquery: covariance\n"
        "mechanism: {algorithm: equi-modal, calibration: exact,"
        " directions: {method: dp-pca, budget_share: 0.2, k: 2}}\n"
        "privacy: {epsilon: 1.0, delta: 1.0e-6}\n"
        f"output: {{store: {tmp_path / 'out.zarr'}}}\n"
        f"ledger: {{path: {tmp_path / 'ledger.sqlite'}, dataset: d,"
        " budget: {epsilon: 3.0, delta: 1.0e-5}}\n"
    )
    heavy = (
        "zarr dask distributed xarray pandas numba dp_accounting scipy.special scipy.stats mpmath"
    ).split()
    code = (
        "import sys\nfrom mvg_dask.cli import main\n"
        "try:\n    main(['release', sys.argv[1], '--dry-run'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
        "import numcodecs, numcodecs.abc\n"
        "print(isinstance(numcodecs.Zstd(), numcodecs.abc.Codec))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(spec)], capture_output=True, text=True, check=True
    )
    assert "release plan" in out.stdout
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "True"], out.stdout
