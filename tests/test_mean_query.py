"""The ``mean`` query: the column means of the clipped records, ``X 1 / N`` (m entries), the
proof that a query is one module (docs/concepts/queries.md, "The mean").

* at epsilon = 1e7 a real release equals numpy's column means of the clipped data, under
  replace-one (divided by the public ``N``) and add-remove (the sum with a noisy count, and with
  a declared ``N0``);
* its sensitivities against an independent brute force over the box's corners and random
  records;
* its 95 % intervals (the accessor's ``noise_std``) cover the non-private means 95 % of the time
  within 3 standard errors over ``TRIALS`` seeded releases (seeds ``SEED + t``) drawn by the
  engine's own ``query`` stage (:func:`mean_trial`, checked bit for bit against a real release
  of the same seed);
* its dry run names what is released.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mvg_dask.xarray  # noqa: F401  (registers .mvg)
from mvg_dask import api
from mvg_dask.engine.metadata import read_input_metadata
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.count import draw_noisy_count
from mvg_dask.engine.stages.query import run_query
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.domain import BoxDomain
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.presentation import plan_rows
from mvg_dask.plan.queries import MeanQuery, query_from_dict
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.spec import parse_spec
from tests.audit_helpers import CapturedOutput
from tests.pipeline_helpers import data, make_input, spec_dict
from tests.test_audit import engine_gram

SEED = 7_300_000  # trial t uses SEED + t
TRIALS = 2000
Z95 = 1.959963984540054
M, N = 4, 300
#: add-remove's trials: enough records that the delta method's first order holds for the ratio
#: ``sum / count`` (as tests/test_accuracy.py measures the covariance's)
N_AR = 20_000


def _spec(store: str, out: Path, neighbours: str, **privacy: Any) -> dict[str, Any]:
    return spec_dict(
        store,
        str(out),
        query="mean",
        mechanism={"algorithm": "unimodal"},
        privacy={"epsilon": 1.0, "delta": 1e-5, "neighbours": neighbours, **privacy},
    )


def mean_trial(rplan: ReleasePlan, total: np.ndarray, seed: int) -> CapturedOutput:
    """One mean release of the dataset whose clipped row sums are ``total`` (from the engine's
    own Gram pass): the engine's ``noisy-count`` and ``query`` stages, with the key
    ``execute_release`` makes for ``seed``."""
    out = CapturedOutput()
    key = NoiseKey.from_seed(seed)
    ctx = RunContext(None, key, out, progress=False)  # type: ignore[arg-type]
    ctx.gram = total
    if rplan.releases_count:
        ctx.count = draw_noisy_count(rplan, key)
    run_query(ctx, rplan)
    return out


@pytest.mark.parametrize(
    ("neighbours", "privacy"),
    [("replace-one", {}), ("add-remove", {}), ("add-remove", {"records": N})],
)
def test_at_a_huge_budget_the_release_is_numpys_mean(
    tmp_path: Path, client: Any, neighbours: str, privacy: dict[str, Any]
) -> None:
    X = data(M, N, seed=11)  # values outside [0, 1]: the release clips them first
    store = make_input(tmp_path / "in.zarr", X, chunk=64)
    spec = _spec(store, tmp_path / "out.zarr", neighbours, **privacy)
    spec["privacy"]["epsilon"] = 1e7
    res = api.release(spec, client=client, seed=3, progress=False)
    ds = api.open_release(res.output)
    truth = np.clip(X, 0.0, 1.0).mean(axis=1)
    assert ds["mean"].dims == ("feature",) and list(ds["feature"].values) == [
        "f0",
        "f1",
        "f2",
        "f3",
    ]
    std = ds.mvg.noise_std("mean").values
    assert np.all(std < 1e-5)
    np.testing.assert_allclose(ds["mean"].values, truth, rtol=0, atol=1e-5)
    if neighbours == "add-remove" and not privacy:  # the noisy sum and count, and their ratio
        assert set(ds.data_vars) >= {"sum", "record_count"}
        sum_std = ds.mvg.noise_std("sum").values  # exact: the sum carries the plan's noise
        np.testing.assert_allclose(
            ds["sum"].values, truth * N, rtol=0, atol=float(6 * sum_std.max())
        )
        assert abs(float(ds["record_count"]) - N) < 0.01
        np.testing.assert_array_equal(
            ds["mean"].values, ds["sum"].values / max(float(ds["record_count"]), 1.0)
        )
        assert ds.mvg.noise_std("mean").attrs["approximate"] == (
            "delta method: mean = sum / record_count"
        )
    else:
        assert "sum" not in ds and "record_count" not in ds


def _corners(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.array(list(itertools.product(*zip(lo, hi, strict=True))))


def test_sensitivities_against_a_brute_force() -> None:
    """``sup ||x - x'|| / N`` (replace-one) and ``sup ||x|| / N`` (add-remove), plain and
    whitened by a diagonal precision, over every pair of the box's corners (the suprema of a
    convex function over the box are at its corners), and never exceeded by random records."""
    rng = np.random.default_rng(2)
    lo, hi = np.array([-1.0, 0.0, 0.5, -2.0]), np.array([1.0, 2.0, 0.75, -1.0])
    domain = BoxDomain(lo, hi)
    q = MeanQuery(M, 50)
    q_ar = MeanQuery(M, 1, records_known=False)
    corners = _corners(lo, hi)
    diff = np.max([np.linalg.norm(a - b) for a in corners for b in corners])
    assert q.l2_sensitivity(domain, "replace-one") == pytest.approx(diff / 50, rel=1e-12)
    assert q_ar.l2_sensitivity(domain, "add-remove") == pytest.approx(
        np.max(np.linalg.norm(corners, axis=1)), rel=1e-12
    )
    x, y = rng.uniform(lo, hi, (2, 1000, M))
    assert np.max(np.linalg.norm(x - y, axis=1)) / 50 <= q.l2_sensitivity(domain, "replace-one")
    p = np.array([0.5, 2.0, 1.0, 4.0])  # a diagonal precision Sigma^-1
    whitened = np.max([np.sqrt((a - b) @ (p * (a - b))) for a in corners for b in corners])
    got = q.mahalanobis_sensitivity(domain, "replace-one", p, "unimodal")
    assert got == pytest.approx(whitened / 50, rel=1e-9)
    got_ar = q_ar.mahalanobis_sensitivity(domain, "add-remove", p, "unimodal")
    assert got_ar == pytest.approx(np.max(np.sqrt((corners * corners) @ p)), rel=1e-9)


def test_the_blueprint_and_its_description() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(3, 40))
    q = MeanQuery(3, 40)
    total = q.combine(q.partial(X[:, :15]), q.partial(X[:, 15:]))
    np.testing.assert_allclose(q.finalize(total)[:, 0], X.mean(axis=1), rtol=1e-14)
    assert q.shape == (3, 1) and q.noise_shape == "rectangular"
    assert query_from_dict(q.to_dict()) == q
    with pytest.raises(ValueError, match="unimodal"):
        q.mahalanobis_sensitivity(
            BoxDomain(np.zeros(3), np.ones(3)), "replace-one", np.ones(3), "equi-modal"
        )


@pytest.mark.parametrize("neighbours", ["replace-one", "add-remove"])
def test_dry_run_names_the_release(tmp_path: Path, neighbours: str) -> None:
    store = make_input(tmp_path / "in.zarr", data(M, N, seed=1), chunk=64)
    rplan = api.dry_run(_spec(store, tmp_path / "o.zarr", neighbours))
    rows = dict(plan_rows(rplan))
    assert "MVG noise plan: mean query 4x1, unimodal noise" in rplan.summary()
    if neighbours == "replace-one":
        assert rplan.stages == ("gram", "query")
        assert rows["query"] == "mean X 1 / N (4 features), N = 300 (public)"
        assert rows["noise std"].endswith("on each released entry")
    else:
        assert rplan.stages == ("noisy-count", "gram", "query")
        assert rows["query"].startswith("sum X 1 (4 features) and a noisy record count")
        assert rows["noise std"].endswith("on the sum")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, client: Any) -> dict[str, Any]:
    """Per relation: a real release (its accessor's ``noise_std``), the engine's row sums, the
    non-private value, and ``TRIALS`` trials of the engine's own stages (``value``, and the
    noisy ``sum`` under add-remove with a count)."""
    root = tmp_path_factory.mktemp("mean")
    out: dict[str, Any] = {}
    for neighbours, n in (("replace-one", N), ("add-remove", N_AR)):
        X = data(M, n, seed=4)
        store = make_input(root / f"in-{neighbours}.zarr", X, chunk=4096)
        raw = _spec(store, root / f"{neighbours}.zarr", neighbours)
        spec = parse_spec(raw)
        rplan = plan_release(spec, read_input_metadata(spec.input))
        total = engine_gram(rplan, client)
        res = api.release(raw, client=client, seed=SEED, progress=False)
        ds = api.open_release(res.output)
        trials = [mean_trial(rplan, total, SEED + t) for t in range(TRIALS)]
        out[neighbours] = {
            "ds": ds,
            "first": trials[0],
            "truth": np.clip(X, 0.0, 1.0).sum(axis=1),
            "records": n,
            "values": np.stack([t.value for t in trials]),
            "sums": np.stack([t.extra["sum"] for t in trials]) if "sum" in ds else None,
        }
    yield out
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("neighbours", ["replace-one", "add-remove"])
def test_a_trial_is_the_release(neighbours: str, measured: dict[str, Any]) -> None:
    """The coverage below samples the real mechanism: trial 0 is the cluster's release of the
    same seed, bit for bit."""
    m = measured[neighbours]
    np.testing.assert_array_equal(m["ds"]["mean"].values, m["first"].value)
    if m["sums"] is not None:
        np.testing.assert_array_equal(m["ds"]["sum"].values, m["first"].extra["sum"])


@pytest.mark.parametrize("neighbours", ["replace-one", "add-remove"])
def test_95_percent_intervals_cover_95_percent(neighbours: str, measured: dict[str, Any]) -> None:
    """``value +- 1.96 noise_std`` covers the non-private value in 95 % of ``TRIALS`` releases
    within 3 standard errors (from the trials' own coverage fractions; two-sided alpha about
    0.0027 per check, seeds ``SEED + t``): the mean (exact std) under replace-one, the noisy
    sum (exact std) and the mean (the delta method's std of ``sum / count``, evaluated at the
    real release's values, ``N_AR`` records) under add-remove."""
    m = measured[neighbours]
    ds, truth = m["ds"], m["truth"]
    checks = [("mean", m["values"], truth / m["records"])]
    if m["sums"] is not None:
        checks.append(("sum", m["sums"], truth))
    for name, values, exact in checks:
        std = ds.mvg.noise_std(name).values
        covered = np.abs(values - exact) <= Z95 * std
        per_trial = covered.mean(axis=1)
        rate, se = per_trial.mean(), per_trial.std(ddof=1) / np.sqrt(TRIALS)
        assert abs(rate - 0.95) <= 3 * se, f"{neighbours} {name}: {rate:.4f} +- {se:.4f}"


class _Records:
    """Records in memory as the Gram tasks read them (a fresh copy per read)."""

    def __init__(self, X: np.ndarray) -> None:
        self.X = X
        self.shape = X.shape

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.X[:, start:stop].copy()


@pytest.mark.parametrize("block", [2**17, 64])
def test_float_error_bound_dominates_the_engines_error(block: int) -> None:
    """The lattice's ``E`` of the mean at the canonical depth against the measured error of the
    engine's own sequence (``gram_task`` with the query's partial over the canonical ranges, then
    the fixed tree of ``combine_grams``, ``finalize``, the row whitening), reference in
    ``longdouble``."""
    from mvg_dask.engine.clipping import Clipper
    from mvg_dask.engine.tasks.gram import combine_grams, gram_task
    from mvg_dask.engine.tasks.outcome import Outcome
    from mvg_dask.plan.input_metadata import GRAM_MIN_TASKS, TREE_FAN_IN, chunk_runs
    from mvg_dask.plan.lattice import LatticeContext, canonical_gram_depth
    from mvg_dask.privacy import float_error as ferr

    rng = np.random.default_rng(8)
    m, n = 5, 3000
    X = rng.uniform(0.0, 1.0, (m, n))
    per_task = max(1, 2**22 // (m * block))
    ranges = chunk_runs(n, block, per_task)
    depth = canonical_gram_depth(n, block, per_task, TREE_FAN_IN, GRAM_MIN_TASKS)
    q = MeanQuery(m, n)
    clip = Clipper("box", np.zeros((m, 1)), np.ones((m, 1)), None, "clip")
    parts: list[Outcome] = [
        gram_task(a, b, source=_Records(X), clipper=clip, step=333, block=block, query=q)  # type: ignore[arg-type]
        for a, b in ranges
    ]
    while len(parts) > 1:
        parts = [
            combine_grams(parts[i : i + TREE_FAN_IN], q) for i in range(0, len(parts), TREE_FAN_IN)
        ]
    v = np.array([0.3, 1.7, 0.9, 2.5, 1.0])
    E = q.float_error(
        np.ones(m),
        ferr.Whitening.diagonal(v),
        norm_max=None,
        algorithm="unimodal",
        ratio=None,
        context=LatticeContext(records=n, depth=depth),
    )
    w = 1.0 / np.sqrt(v)
    g_hat = q.finalize(parts[0].unwrap()[0]) * w[:, None]
    exact = X.astype(np.longdouble).sum(axis=1, keepdims=True) / n
    g = exact * w.astype(np.longdouble)[:, None]
    measured = float(np.sqrt(np.sum((g_hat - g) ** 2)))
    assert 0 < measured <= E


def test_what_the_mean_refuses_is_one_line(tmp_path: Path) -> None:
    """DP-PCA (its pass needs ``X X^T``, the mean's sums the records) and the noise forms of a
    square query are refused before anything is read, in one line."""
    from mvg_dask.errors import DataError
    from mvg_dask.spec import SpecError

    store = make_input(tmp_path / "in.zarr", data(M, N, seed=1), chunk=64)
    spec = _spec(store, tmp_path / "o.zarr", "replace-one")
    spec["mechanism"]["directions"] = {"method": "dp-pca", "k": 2}
    refused = r"^mechanism: DP-PCA directions are not offered for a mean"
    with pytest.raises(DataError, match=refused):
        api.dry_run(spec)
    spec = _spec(store, tmp_path / "o.zarr", "replace-one")
    spec["mechanism"]["algorithm"] = "equi-modal"
    with pytest.raises(SpecError, match="the mean query is not square: use algorithm: unimodal"):
        api.dry_run(spec)
    assert not (tmp_path / "o.zarr").exists()
