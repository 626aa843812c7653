"""Continual releases (``stream:``): the period release over a growing store, end to end.

* At epsilon = 1e7 every one of 16 periods is numpy's query over all records so far
  (covariance with its noisy count, centered covariance, grouped centered covariance), within
  6 of the period's published noise std (which is itself tiny).
* The dry run's worst-period std ratio against a one-shot release at the same budget, checked
  with factorization matrices built here from scratch with numpy.
* A period past the horizon is refused, nothing written or charged; a crash in period 5 resumes
  with the same bytes; sub-grid changes give identical bytes in every period.
* The spec refuses what a stream cannot release, with one-line errors.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import mvg_dask.xarray  # noqa: F401  (the .mvg accessor)
from mvg_dask import api
from mvg_dask.errors import BudgetError, IncompleteReleaseError
from mvg_dask.spec import ReleaseSpec
from tests.pipeline_helpers import add_group_variable, make_input, write_spec

M = 3
SEED = 20261127


def stream_spec(root: Path, query: str = "covariance", **stream: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "nightly",
        "input": {"store": str(root / "in.zarr"), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": query,
        "privacy": {"epsilon": 1e7, "delta": 1e-6, "neighbours": "replace-one"},
        "output": {"store": str(root / "out")},
        "stream": {"horizon": 16, "max_records": 4096, **stream},
    }
    if query == "covariance":
        spec["privacy"]["neighbours"] = "add-remove"
    return spec


def put_input(root: Path, X: np.ndarray, labels: np.ndarray | None = None) -> None:
    """The store as it is after a night's append (rewritten whole: the same records first)."""
    shutil.rmtree(root / "in.zarr", ignore_errors=True)
    make_input(root / "in.zarr", X, chunk=32)
    if labels is not None:
        add_group_variable(root / "in.zarr", labels)


def run_periods(
    root: Path,
    spec: dict[str, Any],
    X: np.ndarray,
    sizes: list[int],
    client: Any,
    labels: np.ndarray | None = None,
    seed: int | None = SEED,
) -> list[xr.Dataset]:
    """Release one period per entry of ``sizes`` (records so far), returning each period."""
    out = []
    for n in sizes:
        put_input(root, X[:, :n], None if labels is None else labels[:n])
        result = api.release(spec, client=client, seed=seed, progress=False)
        out.append(api.open_release(spec["output"]["store"], period=result.period))
    return out


def centered(Y: np.ndarray) -> np.ndarray:
    return np.cov(Y, bias=True) if Y.shape[1] else np.zeros((Y.shape[0], Y.shape[0]))


SIZES = [40 * t for t in range(1, 17)]
SIZES[6] = SIZES[5]  # a period with no new records is still released


QUERIES = ["covariance", "centered-covariance", "group_by"]


@pytest.mark.parametrize(
    ("query", "periods"),
    [pytest.param(q, 16, marks=pytest.mark.slow, id=f"{q}-16") for q in QUERIES]
    + [pytest.param(q, 4, id=f"{q}-4") for q in ("covariance", "group_by")],
)
def test_each_period_is_the_query_over_all_records_so_far(
    query: str, periods: int, tmp_path, client
) -> None:
    """16 periods of each query (slow); 4 in the default suite."""
    rng = np.random.default_rng(7)
    X = rng.uniform(0.0, 1.0, (M, SIZES[-1]))
    labels = rng.integers(0, 2, SIZES[-1]) if query == "group_by" else None
    kind = "centered-covariance" if query == "group_by" else query
    spec = stream_spec(tmp_path, kind)
    if labels is not None:
        spec["group_by"] = {"variable": "site", "groups": [0, 1]}
    sizes = SIZES[:periods]
    released = run_periods(tmp_path, spec, X, sizes, client, labels)
    for t, (n, ds) in enumerate(zip(sizes, released, strict=True), start=1):
        Y = X[:, :n]
        if query == "covariance":
            want = Y @ Y.T / n
        elif query == "centered-covariance":
            want = centered(Y)
        else:
            assert labels is not None
            want = np.stack([centered(Y[:, labels[:n] == g]) for g in (0, 1)])
        got = np.asarray(ds["covariance"].values)
        std = float(ds.mvg.noise_std("covariance").max())
        assert std < 1e-3, (t, std)
        np.testing.assert_allclose(got, want, rtol=0, atol=6 * std + 1e-12, err_msg=f"t={t}")
        assert ds.attrs["mvg_dask_stream_period"] == t
    whole = api.open_release(spec["output"]["store"])
    assert list(whole["period"].values) == [str(t) for t in range(1, periods + 1)]
    assert whole["covariance"].shape[0] == periods


@pytest.mark.parametrize(
    ("query", "neighbours"),
    [("mean", "add-remove"), ("mean", "replace-one"), ("cross-covariance", "replace-one")],
)
def test_mean_and_cross_covariance_streams(query: str, neighbours: str, tmp_path, client) -> None:
    """Three periods of the other sums: each within 6 published stds of numpy's."""
    X = np.random.default_rng(8).uniform(0, 1, (M, 90))
    spec = stream_spec(tmp_path, "covariance", factorization="tree")
    spec["query"] = (
        query if query == "mean" else {"cross-covariance": {"rows": ["f0"], "cols": ["f1", "f2"]}}
    )
    spec["privacy"]["neighbours"] = neighbours
    sizes = [30, 60, 90]
    for n, ds in zip(sizes, run_periods(tmp_path, spec, X, sizes, client), strict=True):
        Y = X[:, :n]
        name = "mean" if query == "mean" else "cross_covariance"
        want = Y.mean(axis=1) if query == "mean" else Y[:1] @ Y[1:].T / n
        std = float(ds.mvg.noise_std(name).max())
        assert std < 1e-3
        np.testing.assert_allclose(ds[name].values, want, rtol=0, atol=6 * std)


def _sqrt_ratio_numpy(T: int, bits: int = 12) -> float:
    """``max_s ||C[:, s]|| max_t ||B[t]||`` of the dyadic square-root factorization, built here:
    ``c_k = binom(2k, k) / 4^k`` rounded to ``2^-bits``, ``C`` Toeplitz, ``B = A C^-1``."""
    k = np.arange(T)
    c = np.exp(
        np.array([math.lgamma(2 * i + 1) - 2 * math.lgamma(i + 1) - 2 * i * math.log(2) for i in k])
    )
    c = np.floor(c * 2**bits + 0.5) / 2**bits
    C = np.zeros((T, T))
    for i in range(T):
        C[i, : i + 1] = c[: i + 1][::-1]
    A = np.tril(np.ones((T, T)))
    B = np.linalg.solve(C.T, A.T).T
    return float(np.linalg.norm(C, axis=0).max() * np.linalg.norm(B, axis=1).max())


def _tree_dyadic_ratio_numpy(T: int) -> float:
    """The binary tree's ``max_s ||C[:, s]||`` times its dyadic decoder's worst ``||B[t]||``
    (``C``: one row per dyadic interval inside ``[1, T]``; ``B[t]`` picks the decomposition of
    ``[1, t]``), built here."""
    rows, index = [], {}
    for j in range(T.bit_length()):
        for start in range(0, T - (1 << j) + 1, 1 << j):
            index[(start, j)] = len(rows)
            row = np.zeros(T)
            row[start : start + (1 << j)] = 1.0
            rows.append(row)
    C = np.array(rows)
    B = np.zeros((T, len(rows)))
    for t in range(1, T + 1):
        start = 0
        for j in reversed(range(T.bit_length())):
            if t >> j & 1:
                B[t - 1, index[(start, j)]] = 1.0
                start += 1 << j
    A = np.tril(np.ones((T, T)))
    assert np.allclose(B @ C, A)
    return float(np.linalg.norm(C, axis=0).max() * np.linalg.norm(B, axis=1).max())


@pytest.mark.parametrize("factorization", ["square-root", "tree"])
def test_dry_run_ratio_for_a_year_of_nights(factorization: str, tmp_path) -> None:
    """T = 365, (1, 1e-6): the dry run's worst-period std over a one-shot release's."""
    make_input(tmp_path / "in.zarr", np.full((M, 10), 0.5))
    spec = stream_spec(tmp_path, "covariance", horizon=365, factorization=factorization)
    spec["privacy"]["epsilon"] = 1.0
    preview = api.stream_dry_run(spec)
    if factorization == "square-root":
        independent = _sqrt_ratio_numpy(365)
        assert preview.worst_ratio <= 3.0
        assert preview.worst_ratio == pytest.approx(independent, rel=2e-3)
    else:
        independent = _tree_dyadic_ratio_numpy(365)
        assert independent <= 9.0  # the plain tree's bound (8.49x)
        assert preview.worst_ratio <= independent  # Honaker's estimator does better
    text = preview.text
    for method in ("naive", "tree, dyadic", "tree, Honaker", "square root"):
        assert method in text
    assert f"{preview.worst_ratio:.2f}x" in text


def test_a_period_past_the_horizon_is_refused(tmp_path, client) -> None:
    X = np.random.default_rng(1).uniform(0, 1, (M, 60))
    spec = stream_spec(tmp_path, "covariance", horizon=2)
    run_periods(tmp_path, spec, X, [20, 40], client)
    put_input(tmp_path, X)
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(BudgetError, match=r"all 2 periods.*new stream"):
        api.release(spec, client=client, seed=SEED, progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before


_CRASH = """
import sys
from mvg_dask import api
api.release(sys.argv[1], seed={seed}, progress=False)
"""


def _files(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("point", ["stream-skeleton", "stream-before-commit"])
def test_a_crash_in_period_5_resumes_with_the_same_bytes(point: str, tmp_path, client) -> None:
    """SIGKILL in period 5: mid-write (the period incomplete), or written but not committed
    (the stream not advanced either way); the next run finishes period 5 with the bytes of a
    run that never crashed, and period 6 follows."""
    X = np.random.default_rng(3).uniform(0, 1, (M, 120))
    sizes = [20, 40, 60, 80, 100, 120]
    ref_root, crash_root = tmp_path / "ref", tmp_path / "crash"
    ref_root.mkdir()
    crash_root.mkdir()
    run_periods(ref_root, stream_spec(ref_root), X, sizes, client)
    spec = stream_spec(crash_root)
    run_periods(crash_root, spec, X, sizes[:4], client)
    put_input(crash_root, X[:, : sizes[4]])
    path = write_spec(crash_root / "nightly.yaml", spec)
    env = {**os.environ, "MVG_DASK_CRASH_AT": point}
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH.format(seed=SEED), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    state = json.loads((crash_root / "out.stream-state" / "stream.json").read_text())
    assert state["periods"] == 4 and state["pending"]["period"] == 5  # not advanced
    if point == "stream-skeleton":
        with pytest.raises(IncompleteReleaseError):
            api.open_release(spec["output"]["store"], period=5)
        assert len(api.open_release(spec["output"]["store"])["period"]) == 4
    run_periods(crash_root, spec, X, sizes[4:], client)
    for t in (5, 6):
        name = f"period-{t:04d}"
        assert _files(crash_root / "out" / name) == _files(ref_root / "out" / name)


def test_a_resumed_period_reads_the_records_it_claimed(tmp_path, client) -> None:
    """A crash in period 2, then the next night's records are appended before the retry: the
    retry finishes period 2 over the records period 2 claimed (the bytes of a run that never
    crashed), and period 3 takes the appended ones."""
    X = np.random.default_rng(4).uniform(0, 1, (M, 60))
    sizes = [20, 40, 60]
    ref_root, crash_root = tmp_path / "ref", tmp_path / "crash"
    ref_root.mkdir()
    crash_root.mkdir()
    run_periods(ref_root, stream_spec(ref_root), X, sizes, client)
    spec = stream_spec(crash_root)
    run_periods(crash_root, spec, X, sizes[:1], client)
    put_input(crash_root, X[:, : sizes[1]])
    path = write_spec(crash_root / "nightly.yaml", spec)
    env = {**os.environ, "MVG_DASK_CRASH_AT": "stream-skeleton"}
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH.format(seed=SEED), str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    state = json.loads((crash_root / "out.stream-state" / "stream.json").read_text())
    assert state["pending"]["period"] == 2 and state["pending"]["watermark_after"] == sizes[1]
    # the next night's records arrive before the retry
    run_periods(crash_root, spec, X, [sizes[2], sizes[2]], client)
    for t in (2, 3):
        name = f"period-{t:04d}"
        assert _files(crash_root / "out" / name) == _files(ref_root / "out" / name), t


def test_sub_grid_changes_give_identical_bytes_in_every_period(tmp_path, client) -> None:
    X = np.random.default_rng(5).uniform(0.1, 0.9, (M, 90))
    Y = X.copy()
    Y[1, 35] += 2.0**-40  # a record of period 2, far below the grid
    sizes = [30, 60, 90]
    for tag, data in (("x", X), ("y", Y)):
        (tmp_path / tag).mkdir()
        run_periods(tmp_path / tag, stream_spec(tmp_path / tag), data, sizes, client)
    for t in (1, 2, 3):
        name = f"period-{t:04d}"
        assert _files(tmp_path / "x" / "out" / name) == _files(tmp_path / "y" / "out" / name)
    # the curator-side state lives beside the store, never in it, and its key is not published
    key = json.loads((tmp_path / "x" / "out.stream-state" / "stream.json").read_text())["key"]
    assert key is None or all(
        key.encode() not in data for data in _files(tmp_path / "x" / "out").values()
    )


def _spec_error(**changes: Any) -> str:
    data = stream_spec(Path("/tmp"), "covariance")
    for key, value in changes.items():
        old = data.get(key, {})
        data[key] = {**old, **value} if isinstance(value, dict) else value
    with pytest.raises(ValueError) as info:
        ReleaseSpec.model_validate(data)
    return str(info.value)


def test_the_spec_refuses_what_a_stream_cannot_release() -> None:
    msg = _spec_error(query="identity", privacy={"neighbours": "replace-one"})
    assert "not a sum over records" in msg and "covariance, centered-covariance" in msg
    assert "mechanism.noise: lattice" in _spec_error(mechanism={"noise": "float"})
    assert "calibration: exact" in _spec_error(
        mechanism={"calibration": "mvg-thm2", "algorithm": "unimodal"}
    )
    assert "horizon" in _spec_error(stream={"horizon": 0})


def test_a_horizon_beyond_the_lattice_headroom_is_refused() -> None:
    """The plan coarsens the grid until every weighted sum of the periods' integers fits int64
    (docs/guide/streams.md); integers that cannot fit are refused with the remedy."""
    from mvg_dask.errors import DataError
    from mvg_dask.plan.stream import OUTPUT_RANGE, check_headroom
    from mvg_dask.privacy.continual import make_factorization

    f = make_factorization("square-root", 10_000)
    fits = OUTPUT_RANGE // f.max_row_sum_int()
    check_headroom(f, fits, 2**20)
    with pytest.raises(DataError, match=r"headroom.*use a horizon of at most 365"):
        check_headroom(f, fits + 1, 2**20)


def test_spec_hash_without_a_stream_is_unchanged(tmp_path) -> None:
    from mvg_dask.spec import spec_hash

    data = stream_spec(tmp_path)
    with_stream = ReleaseSpec.model_validate(data)
    data.pop("stream")
    plain = ReleaseSpec.model_validate(data)
    dumped = plain.model_dump(mode="json")
    assert "stream" in dumped and dumped["stream"] is None
    assert spec_hash(with_stream) != spec_hash(plain)
    assert spec_hash(plain) == spec_hash(ReleaseSpec.model_validate({**data, "stream": None}))


@pytest.mark.slow
def test_cli_dry_run_and_period_label(tmp_path) -> None:
    """``mvg-dask release nightly.yaml --dry-run`` prints the stream's plan and the comparison;
    ``--period-label`` names the period's coordinate."""
    from tests.pipeline_helpers import run_cli

    X = np.random.default_rng(2).uniform(0, 1, (M, 30))
    put_input(tmp_path, X)
    spec = stream_spec(tmp_path, "covariance", horizon=365)
    spec["privacy"]["epsilon"] = 1.0
    path = write_spec(tmp_path / "nightly.yaml", spec)
    dry = run_cli(tmp_path, "release", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "period 1: noise std" in dry.stdout and "tree, Honaker decoder" in dry.stdout
    assert not (tmp_path / "out").exists()
    run = run_cli(
        tmp_path, "release", str(path), "--period-label", "2026-11-27", "--seed", "1", "--quiet"
    )
    assert run.returncode == 0, run.stderr
    assert "stream period 1 (2026-11-27)" in run.stdout
    ds = api.open_release(str(tmp_path / "out"), period="2026-11-27")
    assert ds.attrs["mvg_dask_stream_period"] == 1
    assert list(api.open_release(str(tmp_path / "out"))["period"].values) == ["2026-11-27"]


def _ledger_streams() -> None:
    from mvg_dask.ledger import Ledger

    if not hasattr(Ledger, "open_stream"):
        pytest.skip("the ledger's stream tables are not in this tree")


@pytest.mark.parametrize(
    "horizon", [pytest.param(10, marks=pytest.mark.slow, id="10-periods"), pytest.param(3, id="3")]
)
def test_one_ledger_charge_for_the_whole_stream(horizon: int, tmp_path, client) -> None:
    """The ledger holds one charge for the stream; a run past the horizon is refused and
    charges nothing (fresh keys: no seed with a ledger)."""
    _ledger_streams()
    from mvg_dask.ledger import open_ledger

    X = np.random.default_rng(4).uniform(0, 1, (M, 10 * (horizon + 1)))
    spec = stream_spec(tmp_path, "covariance", horizon=horizon)
    spec["privacy"]["epsilon"] = 1.0
    ledger = tmp_path / "ledger.sqlite"
    spec["ledger"] = {
        "path": str(ledger),
        "dataset": "events",
        "budget": {"epsilon": 3.0, "delta": 1e-5, "neighbours": "add-remove"},
    }
    run_periods(tmp_path, spec, X, [10 * t for t in range(1, horizon + 1)], client, seed=None)
    with open_ledger(str(ledger)) as book:
        (charge,) = book.releases()
        assert charge.status == "committed"
        entry = book.stream("nightly")
        assert entry is not None and entry.periods == horizon and entry.status == "complete"
        summary = book.summary()
    put_input(tmp_path, X)
    with pytest.raises(BudgetError, match="new stream"):
        api.release(spec, client=client, progress=False)
    with open_ledger(str(ledger)) as book:
        assert len(book.releases()) == 1
        assert book.summary() == summary


@pytest.mark.parametrize("name", ["square-root", "tree"])
def test_period_noise_has_the_published_std(name: str) -> None:
    """The engine's period functions alone (zero increments): over 300 keys x 16 entries the
    decoded period-8 noise has std ``s ||B[8]||`` in grid units (s = 4 grid units). Seeded keys
    0..299; the sample std is within 4 of its standard errors (alpha ~ 6e-5, normal theory)."""
    from mvg_dask.engine.stream_noise import decode_period, period_outputs
    from mvg_dask.noise.rng import NoiseKey
    from mvg_dask.privacy.continual import make_factorization

    f = make_factorization(name, 8)
    s, t = 4.0, 8
    zeros = [np.zeros((4, 4), dtype=np.int64)] * t
    draws = []
    for seed in range(300):
        key = NoiseKey.from_seed(seed)
        scale = math.ldexp(s, f.scale_bits)
        outs = [period_outputs(f, u, zeros, key, scale=scale, bound=0) for u in range(1, t + 1)]
        draws.append(decode_period(f, t, outs).ravel())
        again = period_outputs(f, t, zeros, key, scale=scale, bound=0)
        assert np.array_equal(again, outs[-1])  # re-derived, never redrawn
    x = np.concatenate(draws)
    want = s * f.period_std_factor(t)
    se = want / math.sqrt(2 * (x.size - 1))
    assert abs(float(np.std(x, ddof=1)) - want) < 4 * se
    assert abs(float(np.mean(x))) < 4 * want / math.sqrt(x.size)


def test_a_file_books_key_is_readable_by_its_owner_only(tmp_path) -> None:
    """A stream without a ledger keeps its key in the state directory beside the output: like
    the ledger's file (0600), the directory is 0700 and every file in it 0600, whatever the
    umask (a world-readable key lets anyone who can read it remove the noise)."""
    from mvg_dask.engine.stream_book import FileStreamBook

    old = os.umask(0o022)
    try:
        book = FileStreamBook.beside(str(tmp_path / "out"))
        book.open_stream(stream_id="s", horizon=2, spec_hash="h")
        book.begin_period("s", 1, "1", target=3)
        book.commit_period("s", 1, watermark=3, state={"arrays": b"x"})
    finally:
        os.umask(old)
    assert (tmp_path / "out.stream-state").stat().st_mode & 0o777 == 0o700
    files = list((tmp_path / "out.stream-state").iterdir())
    assert len(files) == 2
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o600, path.name
