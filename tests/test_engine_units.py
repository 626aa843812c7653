"""Engine pieces without a cluster: clipping, task outcomes, the tile grid, the output format."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

from mvg_dask.engine.clipping import Clipper
from mvg_dask.engine.metadata import read_input_metadata
from mvg_dask.engine.output import ATTRS, PREFIX, OutputTarget, provenance
from mvg_dask.engine.records import ZarrMatrix
from mvg_dask.engine.tasks.gram import add_grams, combine_grams, gram_task
from mvg_dask.engine.tasks.identity import identity_task
from mvg_dask.engine.tasks.outcome import Outcome, abort_marker, progress_marker
from mvg_dask.errors import DataError, ReleaseError
from mvg_dask.noise import NoiseKey, record_noise, tile_normals
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.queries import CovarianceQuery
from mvg_dask.spec import InputSpec, parse_spec
from tests.pipeline_helpers import data, make_input, spec_dict

#: The Gram pass's query in these tests: the covariance's partial and combine (a sum).
SUM = CovarianceQuery(3, 300)


def _box(on_violation: str = "clip") -> Clipper:
    return Clipper("box", np.zeros((3, 1)), np.ones((3, 1)), None, on_violation)


def test_box_clipper_clips_and_counts():
    x = np.array([[0.5, -1.0], [2.0, 0.1], [0.3, 0.3]])
    y, count = _box()(x, 10)
    np.testing.assert_array_equal(y, np.clip(x, 0, 1))
    assert count == 2


def test_box_clipper_error_names_the_records():
    x = np.array([[0.5, -1.0], [0.2, 0.1], [0.3, 0.3]])
    with pytest.raises(DataError, match=r"records 10\.\.11"):
        _box("error")(x, 10)


def test_l2_clipper_projects_onto_the_ball():
    c = Clipper("l2", None, None, 1.0, "clip")
    x = np.array([[3.0, 0.1], [4.0, 0.2]])
    y, count = c(x, 0)
    np.testing.assert_allclose(np.linalg.norm(y, axis=0), [1.0, np.hypot(0.1, 0.2)])
    assert count == 1


def test_nonfinite_values_are_rejected_whatever_the_policy():
    x = np.array([[np.nan], [0.0], [0.0]])
    with pytest.raises(DataError, match="NaN or infinite"):
        _box()(x, 0)


def test_outcome_carries_expected_errors_as_values():
    ok = Outcome(3)
    assert ok.unwrap() == 3
    bad = Outcome.failure(ReleaseError("chunk 7 unreadable"))
    with pytest.raises(ReleaseError, match="chunk 7"):
        bad.unwrap()
    parts = [Outcome((np.eye(2), 1)), bad, Outcome.failure(DataError("later"))]
    assert combine_grams(parts, SUM) is bad  # the first failure in record order wins
    total = combine_grams([Outcome((np.eye(2), 1)), Outcome((2 * np.eye(2), 3))], SUM)
    np.testing.assert_array_equal(total.value[0], 3 * np.eye(2))
    assert total.value[1] == 4


def test_a_fold_of_pairwise_additions_is_the_combine_of_its_group():
    """The workers' reduction folds a group with ``add_grams``; the client's sums it with
    ``combine_grams``: the same additions in the same order, so the same bytes, whether the
    fold adds in place or (read-only operands, as a transfer may deliver) into a new array."""
    rng = np.random.default_rng(4)
    mats = [rng.standard_normal((5, 5)) * 10.0**k for k in range(-3, 5)]  # rounding matters
    group = [Outcome((g, i)) for i, g in enumerate(mats)]
    combined = combine_grams(group, SUM)
    for readonly in (False, True):
        copies = [Outcome((g.copy(), i)) for i, g in enumerate(mats)]
        for c in copies:
            c.value[0].flags.writeable = not readonly
        acc = copies[0]
        for part in copies[1:]:
            acc = add_grams(acc, part, SUM)
        assert acc.value[0].tobytes() == combined.value[0].tobytes()
        assert acc.value[1] == combined.value[1] == sum(range(len(mats)))
    # a different summation tree is a different sum: the test can tell them apart
    pairs = [combine_grams(group[i : i + 2], SUM) for i in range(0, len(group), 2)]
    assert combine_grams(pairs, SUM).value[0].tobytes() != combined.value[0].tobytes()
    bad, later = Outcome.failure(DataError("first")), Outcome.failure(DataError("later"))
    assert add_grams(bad, later, SUM) is bad and add_grams(group[0], later, SUM) is later


def test_an_outcome_travels_with_its_arrays_as_raw_frames():
    """An Outcome crosses the cluster through dask's serializers: its arrays as raw frames (no
    pickle buffer the receiver must copy), its error and flags in the header."""
    from distributed.protocol import deserialize, serialize

    a = np.arange(12.0).reshape(3, 4)
    header, frames = serialize(Outcome((a, 3)), on_error="raise")
    assert header["serializer"] == "dask"
    (array_header, _) = header["sub-header"]["value"]["sub-headers"]
    assert array_header["serializer"] == "dask" and array_header["type"] == "numpy.ndarray"
    back = deserialize(header, frames)
    np.testing.assert_array_equal(back.value[0], a)
    assert back.value[1] == 3 and back.error is None
    for outcome in (Outcome.failure(ReleaseError("chunk 7")), Outcome(None, skipped=True)):
        assert deserialize(*serialize(outcome, on_error="raise")) == outcome


@pytest.mark.parametrize("cuts", [[0, 1024, 2500], [0, 1, 1500, 2049, 2500], [0, 2500]])
def test_tile_grid_gives_the_same_noise_whatever_the_cuts(cuts):
    key = NoiseKey.from_seed(3)
    whole = tile_normals(key, 4, 0, 2500, tile=1024, n_total=2500)
    parts = [
        tile_normals(key, 4, a, b, tile=1024, n_total=2500) for a, b in itertools.pairwise(cuts)
    ]
    assert np.concatenate(parts, axis=1).tobytes() == whole.tobytes()
    # a tile is one draw of the keyed generator: M x tile, C order
    np.testing.assert_array_equal(whole[:, :1024], key.tile_normals(0, (4, 1024)))


def test_record_noise_diagonal_equals_the_dense_product():
    key = NoiseKey.from_seed(4)
    B = np.diag([1.0, 2.0, 3.0])
    fast = record_noise(key, B, 5, 900, tile=256, n_total=1000, diagonal=True)
    dense = record_noise(key, B, 5, 900, tile=256, n_total=1000, diagonal=False)
    np.testing.assert_allclose(fast, dense, rtol=0, atol=0)


def test_identity_and_gram_tasks_without_a_cluster(tmp_path):
    X = data(3, 300, seed=2)
    src = ZarrMatrix(make_input(tmp_path / "in.zarr", X, chunk=100), "X", False)
    out = make_input(tmp_path / "out.zarr", np.zeros_like(X), chunk=100)
    sink = ZarrMatrix(out, "X", False)
    (tmp_path / "out.zarr" / ".mvg_dask_progress").mkdir()
    key = NoiseKey.from_seed(9)
    B = np.diag([0.1, 0.2, 0.3])
    kw = dict(source=src, sink=sink, clipper=_box(), noise_key=key, factor=B, tile=64, n_total=300)
    res = identity_task(100, 200, diagonal=True, **kw)
    clipped = int(np.sum((X[:, 100:200] < 0) | (X[:, 100:200] > 1)))
    np.testing.assert_array_equal(res.unwrap(), [clipped, 100])
    noise = record_noise(key, B, 100, 200, tile=64, n_total=300, diagonal=True)
    np.testing.assert_array_equal(sink.read(100, 200), np.clip(X[:, 100:200], 0, 1) + noise)
    assert json.loads((tmp_path / progress_marker("out.zarr", 100)).read_text())["records"] == 100
    # after an abort the remaining tasks do nothing
    (tmp_path / abort_marker("out.zarr")).write_bytes(b"")
    assert identity_task(200, 300, diagonal=True, **kw).skipped
    np.testing.assert_array_equal(sink.read(200, 300), 0.0)
    g = gram_task(0, 100, source=src, clipper=_box(), block=64, query=SUM).unwrap()
    Xc = np.clip(X[:, :100], 0, 1)
    np.testing.assert_allclose(g[0], Xc @ Xc.T)


def test_an_identity_task_over_several_chunks_writes_and_marks_each(tmp_path):
    """A task over a run of chunks writes the bytes of one task per chunk, one marker per chunk,
    and a rerun skips the chunks already marked (their counts still add up)."""
    X = data(3, 500, seed=6)
    src = ZarrMatrix(make_input(tmp_path / "in.zarr", X, chunk=100), "X", False)
    key = NoiseKey.from_seed(10)
    clipped = int(np.sum((X < 0) | (X > 1)))
    assert clipped > 0
    outs = []
    for name in ("one", "run"):
        out = make_input(tmp_path / f"{name}.zarr", np.zeros_like(X), chunk=100)
        (tmp_path / f"{name}.zarr" / ".mvg_dask_progress").mkdir()
        kw = dict(
            source=src,
            sink=ZarrMatrix(out, "X", False),
            clipper=_box(),
            noise_key=key,
            factor=np.array([0.1, 0.2, 0.3]),
            tile=64,
            n_total=500,
            diagonal=True,
        )
        if name == "one":
            counts = sum(identity_task(a, a + 100, **kw).unwrap() for a in range(0, 500, 100))
        else:
            first = identity_task(0, 300, step=100, **kw).unwrap()
            # a rerun of the second run: chunk 300 is marked done, chunk 400 is not
            (tmp_path / f"{name}.zarr" / "X" / "c" / "0" / "4").unlink()
            (tmp_path / progress_marker(f"{name}.zarr", 400)).unlink(missing_ok=True)
            identity_task(300, 500, step=100, **kw)
            (tmp_path / progress_marker(f"{name}.zarr", 400)).unlink()
            rerun = identity_task(300, 500, step=100, **kw).unwrap()
            counts = first + rerun
        np.testing.assert_array_equal(counts, [clipped, 500])
        outs.append(ZarrMatrix(out, "X", False).read(0, 500))
        for a in range(0, 500, 100):
            done = json.loads((tmp_path / progress_marker(f"{name}.zarr", a)).read_text())
            assert done["records"] == 100
    assert outs[0].tobytes() == outs[1].tobytes()


def test_task_ranges_are_runs_of_whole_chunks(tmp_path):
    """Runs of whole chunks of at least TASK_ELEMENTS elements, at least GRAM_MIN_TASKS tasks
    where there are that many chunks, covering every record once."""
    from mvg_dask.plan.input_metadata import GRAM_MIN_TASKS, TASK_ELEMENTS

    meta = read_input_metadata(
        InputSpec(store=make_input(tmp_path / "in.zarr", data(4, 500, seed=4), chunk=128))
    )
    for m, n, c in [(64, 1_562_500, 16_384), (64, 156_250, 16_384), (4, 10**7, 1000), (8, 50, 7)]:
        info = dataclasses.replace(meta, record_chunk=c, shape=(m, n), dims=("feature", "record"))
        for ranges in (info.task_ranges(),):
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(b == a2 for (_, b), (a2, _) in itertools.pairwise(ranges))
            assert all(a % c == 0 for a, _ in ranges)
            chunks = -(-n // c)
            if chunks >= GRAM_MIN_TASKS:
                assert len(ranges) >= GRAM_MIN_TASKS
            whole = [b - a for a, b in ranges[:-1]]
            assert all(w * m >= TASK_ELEMENTS for w in whole) or len(ranges) >= GRAM_MIN_TASKS
    big = dataclasses.replace(meta, record_chunk=16_384, shape=(64, 1_562_500))
    assert len(big.task_ranges()) == 24  # 96 chunks of 2^20 elements, 4 per task


def test_a_data_error_in_a_task_is_an_outcome_not_an_exception(tmp_path):
    X = data(3, 200, seed=3)
    X[0, 150] = np.inf
    src = ZarrMatrix(make_input(tmp_path / "in.zarr", X, chunk=100), "X", False)
    res = gram_task(100, 200, source=src, clipper=_box(), block=64, query=SUM)
    assert res.error is not None and "records 100..199" in res.error


def test_metadata_is_read_without_chunks(tmp_path):
    X = data(4, 500, seed=4)
    store = make_input(tmp_path / "in.zarr", X, chunk=128, records_first=True)
    meta = read_input_metadata(InputSpec(store=store))
    assert (meta.features, meta.records, meta.record_chunk) == (4, 500, 128)
    assert meta.records_first and meta.feature_names == ("f0", "f1", "f2", "f3")
    assert meta.record_ranges()[-1] == (384, 500)
    with pytest.raises(DataError, match="'Y' is not in"):
        read_input_metadata(InputSpec(store=store, variable="Y"))
    with pytest.raises(DataError, match="does not exist"):
        read_input_metadata(InputSpec(store=str(tmp_path / "nope.zarr")))


def test_provenance_is_a_function_of_the_plan_only(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=5), chunk=100)
    spec = parse_spec(spec_dict(store, str(tmp_path / "o.zarr"), release_id="r1"))
    meta = read_input_metadata(spec.input)
    a = provenance(plan_release(spec, meta, created="t"), seeded=False)
    b = provenance(plan_release(spec, meta, created="t"), seeded=False)
    assert a == b
    assert set(a) <= {PREFIX + name for name in ATTRS}
    assert "mvg_dask_clipped_count" not in a


def test_output_target_stages_commits_and_aborts(tmp_path):
    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=6), chunk=100)
    spec = parse_spec(spec_dict(store, str(tmp_path / "o.zarr"), query="covariance"))
    rplan = plan_release(spec, read_input_metadata(spec.input), release_id="r2")
    target = OutputTarget.for_plan(rplan)
    target.check_free()
    target.write_matrix_skeleton(rplan, "covariance")
    target.write_matrix_values({"covariance": np.eye(3)})
    assert not target.is_complete() and (tmp_path / "o.zarr.staging-r2").exists()
    target.commit(provenance(rplan, seeded=True))
    assert target.is_complete() and not (tmp_path / "o.zarr.staging-r2").exists()
    with pytest.raises(ReleaseError, match="already exists"):
        OutputTarget.for_plan(rplan).check_free()
    other = OutputTarget(str(tmp_path / "p.zarr"), "r3")
    other.write_matrix_skeleton(rplan, "covariance")
    other.abort()
    assert not (tmp_path / "p.zarr.staging-r3").exists() and not (tmp_path / "p.zarr").exists()


def test_a_resume_runs_the_plan_its_first_run_saved(tmp_path, monkeypatch):
    from mvg_dask.engine.ledger.session import saved_plan

    store = make_input(tmp_path / "in.zarr", data(3, 300, seed=7), chunk=100)
    spec = parse_spec(spec_dict(store, str(tmp_path / "o.zarr"), release_id="r4"))
    first = plan_release(spec, read_input_metadata(spec.input), created="2026-11-22T00:00:00+00:00")
    target = OutputTarget.for_plan(first)
    (tmp_path / "o.zarr.staging-r4" / ".mvg_dask_progress").mkdir(parents=True)
    target.save_plan(first)
    again = plan_release(spec, read_input_metadata(spec.input))  # planned anew, later
    resumed = saved_plan(again, target)
    assert resumed.created == first.created  # the saved plan runs, not the new one
    assert resumed.to_dict() == first.to_dict()
    # a spec or input that plans differently is refused
    other = parse_spec(spec_dict(store, str(tmp_path / "o.zarr"), release_id="r4",
                                 privacy={"epsilon": 2.0, "delta": 1e-5}))  # fmt: skip
    with pytest.raises(ReleaseError, match="started with another plan"):
        saved_plan(plan_release(other, read_input_metadata(other.input)), target)
    # a plan saved before plans carried their stages resumes with the stages it implies
    old = {k: v for k, v in first.to_dict().items() if k != "stages"}
    monkeypatch.setattr(target, "load_plan", lambda: old)
    assert saved_plan(again, target).stages == first.stages == ("identity",)


def test_a_truncated_marker_means_the_chunk_is_written_again(tmp_path):
    """A worker killed while writing a completion marker leaves it empty; the retried task must
    write the chunk again (same bytes), not fail on the marker."""
    X = data(3, 200, seed=8)
    src = ZarrMatrix(make_input(tmp_path / "in.zarr", X, chunk=100), "X", False)
    sink = ZarrMatrix(make_input(tmp_path / "out.zarr", np.zeros_like(X), chunk=100), "X", False)
    (tmp_path / "out.zarr" / ".mvg_dask_progress").mkdir()
    (tmp_path / progress_marker("out.zarr", 100)).write_bytes(b"")  # truncated
    key = NoiseKey.from_seed(3)
    B = np.diag([0.1, 0.2, 0.3])
    kw = dict(source=src, sink=sink, clipper=_box(), noise_key=key, factor=B, tile=64, n_total=200)
    res = identity_task(100, 200, diagonal=True, **kw)
    assert res.unwrap()[1] == 100
    noise = record_noise(key, B, 100, 200, tile=64, n_total=200, diagonal=True)
    np.testing.assert_array_equal(sink.read(100, 200), np.clip(X[:, 100:200], 0, 1) + noise)
    marker = json.loads((tmp_path / progress_marker("out.zarr", 100)).read_text())
    assert marker == {"clipped": int(res.value[0]), "records": 100}
    assert not list((tmp_path / "out.zarr" / ".mvg_dask_progress").glob("*.tmp"))


def test_the_executor_has_a_function_for_every_stage_name():
    """The engine runs each stage a plan can name (``mvg_dask.plan.stages``), and no other."""
    from mvg_dask.engine.stages.executor import STAGE_FUNCTIONS
    from mvg_dask.plan.stages import STAGES

    assert tuple(STAGE_FUNCTIONS) == STAGES


@pytest.mark.parametrize(("start", "stop", "tile"), [(0, 1000, 256), (5, 900, 256), (300, 301, 7)])
def test_diagonal_record_noise_scales_the_assembled_normals(start, stop, tile):
    """The diagonal float noise, scaled tile by tile as drawn, has the bytes of the whole
    range's normals (:func:`tile_normals`) times the diagonal (a vector or a matrix)."""
    key = NoiseKey.from_seed(5)
    d = np.array([0.3, 1.0, 7.5, 1e-300, 1e300])
    want = tile_normals(key, 5, start, stop, tile=tile, n_total=1000) * d[:, None]
    for factor in (d, np.diag(d)):
        got = record_noise(key, factor, start, stop, tile=tile, n_total=1000, diagonal=True)
        assert got.tobytes() == want.tobytes()
