"""The canonical partition of the centered-covariance, regression and cross-covariance Gram
passes (docs/bounds.md Sec. 11): canonical record blocks, a function of the record and feature
counts only. Non-dyadic data in several chunk grids and layouts give byte-identical releases
and identical plans; the blocks are the same bits whatever the chunk grid; the plan's depth
bounds the partition's for every record count up to the bound; and the float-error bound
covers the engine's measured error on the canonical partition."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.records import canonical_blocks
from mvg_dask.engine.tasks.gram import combine_grams, gram_task
from mvg_dask.engine.tasks.outcome import Outcome
from mvg_dask.plan import input_metadata
from mvg_dask.plan.input_metadata import GRAM_MIN_TASKS, TREE_FAN_IN, InputMetadata, chunk_runs
from mvg_dask.plan.lattice import (
    LatticeContext,
    canonical_gram_depth,
    panel_depth,
    panel_inner_groups,
)
from mvg_dask.plan.queries import CrossCovarianceQuery
from tests.pipeline_helpers import add_group_variable, add_second_variable, data, make_input

N = 2000
#: (record chunk, records-first) of the input layouts compared: blocks cut across chunks,
#: records-first storage, and chunks that are exactly the canonical blocks (no copy)
LAYOUTS = [(250, False), (333, True), (64, False)]


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canonical blocks of 64 records for 4 to 7 features (the plan and the engine read the
    bound on the client), so 2,000 records make 32 blocks, several per task, and a tree."""
    monkeypatch.setattr(input_metadata, "CANONICAL_BLOCK_ELEMENTS", 2**9)


def _meta(records: int, features: int, chunk: int = 100) -> InputMetadata:
    return InputMetadata(
        store="x",
        variable="X",
        record_dim="record",
        feature_dim="feature",
        dims=("feature", "record"),
        shape=(features, records),
        dtype="float64",
        record_chunk=chunk,
    )


CLIP = Clipper("box", np.zeros((5, 1)), np.ones((5, 1)), None, "clip")


class _Memory:
    """An in-memory source (``features x records``), read as a chosen layout."""

    def __init__(self, X: np.ndarray, records_first: bool = False) -> None:
        self.X = np.ascontiguousarray(X.T).T if records_first else np.ascontiguousarray(X)

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.X[:, start:stop].copy(order="K")


def test_blocks_are_the_same_bits_whatever_the_chunk_grid() -> None:
    X = np.clip(data(5, 1000, seed=2), 0, 1)
    want = [(a, X[:, a : min(a + 128, 1000)]) for a in range(256, 1000, 128)]
    for step, first in ((100, False), (128, False), (333, True), (1000, False), (7, True)):
        # a block is valid until the next one is asked for (the buffer is reused): copied
        blocks = canonical_blocks(_Memory(X, first), CLIP, 256, 1000, step, 128)  # type: ignore[arg-type]
        got = [(a, x.copy(order="K")) for a, x, _ in blocks]
        assert [a for a, _ in got] == [a for a, _ in want]
        for (_, x), (_, w) in zip(got, want, strict=True):
            assert x.flags.c_contiguous and x.shape == w.shape
            assert x.tobytes() == np.ascontiguousarray(w).tobytes()


def test_canonical_partition_depends_on_the_counts_only() -> None:
    a, b = _meta(N, 5, chunk=250), _meta(N, 5, chunk=333)
    assert a.canonical_ranges() == b.canonical_ranges()
    # at most 2^20 elements and 2^13 records per block, a power of two
    assert a.canonical_block() == 2**13
    assert _meta(N, 64).canonical_block() == 2**13
    assert _meta(N, 200).canonical_block() == 2 ** (int(math.log2(2**20 / 200))) == 2**12
    assert _meta(N, 2**21).canonical_block() == 1


def _actual_panel_depth(records: int, group: int, inner: int) -> int:
    """The most additions a term passes through in a lattice panel task as the engine sums it
    (:func:`mvg_dask.engine.tasks.panels._gram_panel`): a group's inner product, its addition into
    the inner accumulator and the inner accumulator's folds into the panel."""
    groups = -(-records // group)
    return min(group, records) + min(inner, groups) + -(-groups // inner)


def test_the_panel_depth_of_a_bound_bounds_every_smaller_count() -> None:
    """Brute force: the engine's panel tasks fold every ``panel_inner_groups(bound)`` groups (the
    plan's record count, a public bound under add-remove); the depth the plan takes for the bound
    is at least the engine's at every count up to it."""
    group = 4
    for bound in range(1, 800):
        inner = panel_inner_groups(bound, group)
        worst = max(_actual_panel_depth(n, group, inner) for n in range(1, bound + 1))
        assert worst <= panel_depth(bound, group)


def _actual_depth(records: int, block: int, per_task: int) -> int:
    """The most additions a term passes through in the partition the engine runs."""
    ranges = chunk_runs(records, block, per_task)
    most = max(-(-(b - a) // block) for a, b in ranges)
    tasks, levels = len(ranges), 0
    while tasks > 1:
        tasks, levels = -(-tasks // TREE_FAN_IN), levels + 1
    return min(block, records) + most - 1 + (TREE_FAN_IN - 1) * levels


def test_the_plans_depth_bounds_the_partition_for_every_smaller_count() -> None:
    """Brute force over record counts: the depth of a bound ``n`` is at least the engine's
    depth at every count up to ``n`` (the tree's task count is not monotone in the count)."""
    block, per_task = 16, 4
    bound = {
        n: canonical_gram_depth(n, block, per_task, TREE_FAN_IN, GRAM_MIN_TASKS)
        for n in range(1, 3000)
    }
    worst = 0
    for n in range(1, 3000):
        worst = max(worst, _actual_depth(n, block, per_task))
        assert worst <= bound[n]
    assert bound[1] == 1 and bound[16] == 16  # one block: the inner product only


class _Stacked:
    def __init__(self, X: np.ndarray) -> None:
        self.X = X

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.X[:, start:stop].copy()


@pytest.mark.parametrize("block", [2**17, 64])
def test_float_error_bound_dominates_the_canonical_engines_error(block: int) -> None:
    """The lattice's ``E`` of a cross-covariance at the canonical depth against the measured
    error of the engine's canonical sequence (``gram_task`` over the canonical ranges, then the
    fixed tree of ``combine_grams``), uniform data, reference in ``longdouble``."""
    rng = np.random.default_rng(3)
    M, n = 5, 3000
    X = rng.uniform(0.0, 1.0, (M, n))
    per_task = max(1, 2**22 // (M * block))
    ranges = chunk_runs(n, block, per_task)
    depth = canonical_gram_depth(n, block, per_task, TREE_FAN_IN, GRAM_MIN_TASKS)
    parts: list[Outcome] = [
        gram_task(a, b, source=_Stacked(X), clipper=CLIP, step=333, block=block)  # type: ignore[arg-type]
        for a, b in ranges
    ]
    while len(parts) > 1:
        parts = [
            combine_grams(parts[i : i + TREE_FAN_IN]) for i in range(0, len(parts), TREE_FAN_IN)
        ]
    G = parts[0].unwrap()[0]
    q = CrossCovarianceQuery(M, n, rows=(0, 2), cols=(1, 2, 3, 4))
    v = np.array([0.3, 1.7])
    from mvg_dask.privacy import float_error as ferr

    E = q.float_error(
        np.ones(M),
        ferr.Whitening.diagonal(v),
        norm_max=None,
        algorithm="unimodal",
        ratio=None,
        context=LatticeContext(records=n, depth=depth),
    )
    g_hat = q.finalize(G) * (1.0 / np.sqrt(v))[:, None]
    exact = (X[[0, 2]].astype(np.longdouble) @ X[[1, 2, 3, 4]].T.astype(np.longdouble)) / n
    g = exact / np.sqrt(v.astype(np.longdouble))[:, None]
    measured = float(np.sqrt(np.sum((g_hat - g) ** 2)))
    assert 0 < measured <= E
    assert len(ranges) == (1 if block > n else 10)  # several blocks per task, two levels


# -- releases ---------------------------------------------------------------------------------
def _release(tmp_path: Path, client: Any, tag: str, spec: dict[str, Any], names: tuple[str, ...]):
    res = api.release(spec, client=client, seed=5, progress=False)
    ds = api.open_release(res.output)
    plan = api.dry_run(spec)
    return b"".join(ds[v].values.tobytes() for v in names), plan.public_noise_dict()


def _base(store: str, out: Path, query: Any, noise: str) -> dict[str, Any]:
    return {
        "name": "canon",
        "input": {"store": store, "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": query,
        "mechanism": {"noise": noise},
        "privacy": {"epsilon": 1.0, "delta": 1e-5},
        "output": {"store": str(out)},
    }


CASES = {
    "centered-lattice": ("centered-covariance", "lattice", ("moment", "mean", "covariance")),
    "centered-float": ("centered-covariance", "float", ("moment", "mean", "covariance")),
    "grouped-regression": ({"regression": {"target": "f3"}}, "lattice", ("moment",)),
    "cross": (
        {"cross-covariance": {"rows": ["f0", "f3"], "cols": ["f1", "f2", "f4"]}},
        "lattice",
        ("cross_covariance",),
    ),
    "mean-first": (  # both passes: the mean's sums and the second moment about the centre
        {"centered-covariance": {"route": "mean-first"}},
        "lattice",
        ("mean", "centre", "covariance"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bytes_and_plan_do_not_depend_on_the_chunk_grid(tmp_path, client, small_blocks, case):
    """Non-dyadic data (``data()``: every sum rounds) in three layouts, same seed: the same
    bytes and the same published noise plan (with its lattice)."""
    query, noise, names = CASES[case]
    X = data(5, N, seed=21)
    labels = np.random.default_rng(22).integers(0, 3, N)
    outs = []
    for i, (chunk, first) in enumerate(LAYOUTS):
        store = make_input(tmp_path / f"in{i}.zarr", X, chunk=chunk, records_first=first)
        spec = _base(store, tmp_path / f"out{i}.zarr", query, noise)
        if case == "grouped-regression":
            add_group_variable(store, labels)
            spec["group_by"] = {"variable": "site", "groups": [0, 1, 2]}
        outs.append(_release(tmp_path, client, str(i), spec, names))
    assert all(o == outs[0] for o in outs[1:])
    plan = outs[0][1]
    if case != "mean-first":  # its step 2's lattice is set at run time, about the mean
        assert (plan.get("lattice") is not None) == (noise == "lattice")


def test_two_variable_cross_bytes_do_not_depend_on_either_chunk_grid(
    tmp_path, client, small_blocks
):
    """``X`` and ``Y`` each chunked differently (``Y`` unlike ``X``) in three stores: the same
    bytes and plan."""
    X = data(4, N, seed=23)
    Y = np.random.default_rng(24).uniform(-1.5, 2.5, (3, N))
    query = {
        "cross-covariance": {
            "rows": ["f0", "f2"],
            "cols": {"variable": "Y", "features": ["g2", "g0"], "box": {"lower": -1, "upper": 2}},
        }
    }
    outs = []
    for i, ((chunk, first), y_chunk) in enumerate(zip(LAYOUTS, (70, 512, 64), strict=True)):
        store = make_input(tmp_path / f"in{i}.zarr", X, chunk=chunk, records_first=first)
        add_second_variable(store, Y, chunk=y_chunk)
        spec = _base(store, tmp_path / f"out{i}.zarr", query, "lattice")
        outs.append(_release(tmp_path, client, str(i), spec, ("cross_covariance",)))
    assert all(o == outs[0] for o in outs[1:])
    assert outs[0][1]["lattice"] is not None


def test_dense_record_products_are_the_same_bits_whatever_the_pieces() -> None:
    """An identity release with dense directions multiplies each record by ``P`` and ``B``
    (:meth:`~mvg_dask.engine.lattice.RecordLattice.release`; float noise: ``B N``,
    :func:`~mvg_dask.noise.tiles.record_noise`): formed in index-aligned windows,
    a record's product has the same bits whether it came in one piece, in pieces of 333 or 250,
    or alone (a one-record piece was a matrix-vector product before, 1 ulp off); and the
    products agree with ``A @ x`` to rounding."""
    from mvg_dask.noise.tiles import windowed_product

    rng = np.random.default_rng(12)
    A = np.linalg.qr(rng.standard_normal((7, 7)))[0] * rng.uniform(0.5, 2.0, 7)
    X = rng.uniform(-1.0, 1.0, (7, 1000))
    whole = windowed_product(A, X, 0)
    np.testing.assert_allclose(whole, A @ X, rtol=0, atol=1e-14)
    for step in (333, 250, 1, 7):
        parts = [windowed_product(A, X[:, a : a + step], a) for a in range(0, 1000, step)]
        assert np.concatenate(parts, axis=1).tobytes() == whole.tobytes()
