"""Empirical privacy audit of the release code on worst-case neighbouring pairs.

Each audit runs the real mechanism many times on ``D`` and on ``D'``, computes the
likelihood-ratio statistic of the pair from what a release publishes, and gives a
Clopper-Pearson lower bound on epsilon (tests/audit_helpers.py: ``ALPHA = 0.01`` family-wise,
a fixed grid of thresholds with a Bonferroni correction). Every bound must be at most the
claimed epsilon; the bounds are printed (``pytest -s``) and reported in the issue notes.

"Through the real release code":

* covariance: the plan comes from :func:`mvg_dask.api.dry_run`, the clipped Gram matrices of
  ``D`` and ``D'`` from the engine's own Gram pass on the cluster (``submit_gram`` and
  ``finish_gram`` of ``mvg_dask.engine.stages.gram``: the real reads, the real ``Clipper``), and
  every trial runs the public functions of the engine's stages after that pass
  (``draw_noisy_count``, ``dp_pca_directions`` = the real ``dp_pca`` + ``ReleasePlan.resolve``,
  ``write_covariance_skeleton`` = the real ``covariance_noise``, i.e. the plan's own draw, and
  ``write_covariance``) with the key
  ``execute_release`` makes from ``--seed`` (``NoiseKey.from_seed(seed)``, and the stages derive
  ``count``, ``dp-pca`` and ``release`` from it themselves); trial ``t`` uses seed
  ``SEED + t`` (``D``) or ``SEED + TRIALS + t`` (``D'``). ``test_trial_sampler_is_the_release``
  checks that a trial is bit for bit the release the cluster publishes for that seed.
* identity: whole releases through :func:`mvg_dask.api.release` on the cluster. With
  ``Psi = I`` every record's column gets its own independent noise ``B_Sigma n_j`` (the tile
  grid draws iid normals), so a release of a dataset whose ``N`` records are all the worst-case
  record ``x`` gives ``N`` independent samples of "the column of the changed record under D",
  and a dataset of ``N`` copies of the out-of-domain neighbour gives the samples under ``D'``.
  The other columns of a real neighbouring pair have the same law under both datasets and are
  independent of the changed one, so the most powerful test depends on that column only.

Under-noised control: ``test_audit_flags_an_under_noised_mechanism`` halves the noise of the
covariance release (``covariance_noise`` * 0.5) and the same audit must then exceed the claim.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.engine import lattice as engine_lattice
from mvg_dask.engine.stages import covariance as engine_covariance
from mvg_dask.engine.stages.context import RunContext
from mvg_dask.engine.stages.gram import finish_gram, submit_gram
from mvg_dask.noise import NoiseKey
from mvg_dask.plan.release_plan import ReleasePlan
from mvg_dask.privacy import calibration as cal
from tests.audit_helpers import (
    CapturedOutput,
    covariance_trial,
    epsilon_lower_bound,
    gaussian_log_lr,
    moment_trial,
    standardise,
    whiten,
    whiten_symmetric,
)
from tests.pipeline_helpers import make_input

EPSILON, DELTA = 1.0, 1e-2  # the claim of every audited release
MU = cal.analytic_gaussian_mu(EPSILON, DELTA)  # its Gaussian-DP ratio (0.533)
SEED = 8_000_000  # trial t of D uses SEED + t, of D' SEED + TRIALS + t
TRIALS = 30_000  # per dataset, covariance audits
M = 4
N = 40  # records of the covariance datasets
N0 = 50  # the public normaliser of the add-remove release that declares one
CORNER = np.ones(M)  # x x^T with ||x||^2 = R = 4, the largest record of [-1, 1]^4
OUTSIDE = np.array([3.0, -3.0, 3.0, -3.0])  # clipped to (1, -1, 1, -1), orthogonal to CORNER
OUTSIDE_CORNER = 3.0 * CORNER  # clipped to CORNER


def _spec(root: Path, tag: str, **privacy: Any) -> dict[str, Any]:
    mech = privacy.pop("mechanism", {})
    query = privacy.pop("query", "covariance")
    return {
        "name": "audit",
        "release_id": f"audit-{tag}",
        "input": {"store": str(root / f"{tag}.zarr"), "variable": "X"},
        "domain": {"box": {"lower": -1.0, "upper": 1.0}, "on_violation": "clip"},
        "query": query,
        "mechanism": {"algorithm": "equi-modal", "calibration": "exact", **mech},
        "privacy": {"epsilon": EPSILON, "delta": DELTA, **privacy},
        "output": {"store": str(root / f"{tag}-out.zarr")},
    }


def _base() -> np.ndarray:
    """``N`` records of ``[-1, 1]^4``; the first is the corner ``(1, 1, 1, 1)``."""
    X = np.random.default_rng(11).uniform(-1, 1, (M, N))
    X[:, 0] = CORNER
    return X


def _pair(root: Path, neighbours: str, **privacy: Any) -> tuple[ReleasePlan, ReleasePlan]:
    """Plans of the worst-case pair: replace-one swaps the corner for a record outside the box
    (clipped to an orthogonal corner: ``||xx^T - x'x'^T||_F = sqrt(2) R``, the sensitivity);
    add-remove appends a record outside the box (clipped to the corner: ``||xx^T||_F = R``)."""
    X = _base()
    if neighbours == "replace-one":
        Y = X.copy()
        Y[:, 0] = OUTSIDE
    else:
        Y = np.concatenate([X, OUTSIDE_CORNER[:, None]], axis=1)
        privacy["neighbours"] = "add-remove"
    plans = []
    for tag, data in (("d", X), ("d2", Y)):
        shutil.rmtree(root / f"{tag}.zarr", ignore_errors=True)
        make_input(root / f"{tag}.zarr", data, chunk=16)
        plans.append(api.dry_run(_spec(root, tag, **privacy)))
    return plans[0], plans[1]


def engine_gram(rplan: ReleasePlan, client: Any) -> np.ndarray:
    """The clipped ``X X^T`` from the engine's Gram pass on the cluster."""
    ctx = RunContext(client, NoiseKey.from_seed(0), CapturedOutput(), progress=False)  # type: ignore[arg-type]
    return finish_gram(ctx, rplan, submit_gram(ctx, rplan))


def _trials(rplan: ReleasePlan, gram: np.ndarray, first_seed: int, n: int) -> list[Any]:
    return [covariance_trial(rplan, gram, first_seed + t) for t in range(n)]


def _report(name: str, result: Any) -> None:
    print(f"\naudit {name}: {result.describe(EPSILON)}")


# -- covariance ---------------------------------------------------------------------------------
def _covariance_statistic(
    runs: list[Any], plan_d: ReleasePlan, gram_d: np.ndarray, gram_d2: np.ndarray
) -> np.ndarray:
    """Whitened projection of the published ``covariance`` onto the pair's shift."""
    noise = plan_d.noise_plan()
    B = noise.row_factor
    equi = noise.algorithm == "equi-modal"
    f_d = gram_d / plan_d.query.records
    shift = whiten(gram_d2 / plan_d.query.records - f_d, B, equi)
    Y = np.stack([r.value for r in runs])
    return standardise(gaussian_log_lr(whiten(Y - f_d, B, equi), shift), MU)


def _audit_covariance(root: Path, client: Any, neighbours: str, n: int, **privacy: Any) -> Any:
    plan_d, plan_d2 = _pair(root, neighbours, **privacy)
    gram_d, gram_d2 = engine_gram(plan_d, client), engine_gram(plan_d2, client)
    # the pair is worst case: its whitened shift is the plan's Mahalanobis sensitivity, which
    # the exact calibration set to the claim's mu (lattice noise: with the float error and the
    # grid's rounding, the effective sensitivity is the claim's mu)
    noise = plan_d.noise_plan()
    shift = whiten((gram_d2 - gram_d) / plan_d.query.records, noise.row_factor, True)
    assert float(np.linalg.norm(shift)) == pytest.approx(noise.mahalanobis_sensitivity, rel=1e-9)
    assert noise.release_sensitivity == pytest.approx(MU, rel=1e-9)
    t0 = _covariance_statistic(_trials(plan_d, gram_d, SEED, n), plan_d, gram_d, gram_d2)
    t1 = _covariance_statistic(_trials(plan_d2, gram_d2, SEED + n, n), plan_d, gram_d, gram_d2)
    return epsilon_lower_bound(t0, t1, DELTA)


@pytest.mark.slow
def test_covariance_replace_one(tmp_path: Path, client) -> None:
    result = _audit_covariance(tmp_path, client, "replace-one", TRIALS)
    _report("covariance replace-one (equi-modal, exact)", result)
    assert 0.5 * EPSILON < result.epsilon_lower <= EPSILON


@pytest.mark.slow
def test_covariance_replace_one_symmetric(tmp_path: Path, client) -> None:
    """The product's default for a covariance: symmetric noise ``B S B^T`` at ``r* = 2.5``.

    The pair (corner, clipped alternating corner) differs only off the diagonal, where
    ``Q_r(D) = 16 = sup Q_r`` for every ``r <= 2.5`` (docs/bounds.md Sec. 5): worst case. The
    statistic is the exact log-likelihood ratio in the ``vech_r`` coordinates.
    """
    sym = {"mechanism": {"algorithm": "symmetric"}}
    plan_d, plan_d2 = _pair(tmp_path, "replace-one", **sym)
    noise = plan_d.noise_plan()
    assert noise.algorithm == "symmetric"
    r = float(noise.symmetric_ratio)
    assert r == pytest.approx((M + 1) / 2)
    gram_d, gram_d2 = engine_gram(plan_d, client), engine_gram(plan_d2, client)
    n = plan_d.query.records
    B = noise.row_factor
    shift = whiten_symmetric((gram_d2 - gram_d) / n, B, r)
    assert float(np.linalg.norm(shift)) == pytest.approx(noise.mahalanobis_sensitivity, rel=1e-9)
    assert noise.release_sensitivity == pytest.approx(MU, rel=1e-9)

    def statistic(runs: list[Any]) -> np.ndarray:
        Y = np.stack([run.value for run in runs])
        whitened = whiten_symmetric(Y - gram_d / n, B, r)
        return standardise(gaussian_log_lr(whitened, shift), MU)

    t0 = statistic(_trials(plan_d, gram_d, SEED, TRIALS))
    t1 = statistic(_trials(plan_d2, gram_d2, SEED + TRIALS, TRIALS))
    result = epsilon_lower_bound(t0, t1, DELTA)
    _report("covariance replace-one (symmetric, r = 2.5, exact)", result)
    assert 0.5 * EPSILON < result.epsilon_lower <= EPSILON


@pytest.mark.slow
def test_centered_covariance_and_regression(tmp_path: Path, client) -> None:
    """The moment release (the second moment of ``z = [x; 1]``, symmetric noise, the default),
    audited on the moment it publishes (``mean`` and ``covariance`` are functions of it). The
    pair swaps the corner for the clipped alternating corner: ``||zz^T - z'z'^T||_F = sqrt(48)``
    against the proved ``sqrt(2) R = sqrt(50)`` of the augmented box ``[-1, 1]^4 x [0, 1]``, so
    near worst case. The regression release of the same data has the same noise plan (its
    target changes only what ``ds.mvg.regression`` reads), so its audit is this one."""
    sym = {"mechanism": {"algorithm": "symmetric"}, "query": "centered-covariance"}
    plan_d, plan_d2 = _pair(tmp_path, "replace-one", **sym)
    regression = {**sym, "query": {"regression": {"target": "f3"}}}
    plan_r, _ = _pair(tmp_path, "replace-one", **regression)
    centered_noise, regression_noise = plan_d.public_noise_dict(), plan_r.public_noise_dict()
    assert centered_noise.pop("query")["kind"] == "centered-covariance"
    assert regression_noise.pop("query")["kind"] == "regression"
    assert centered_noise == regression_noise
    noise = plan_d.noise_plan()
    r = float(noise.symmetric_ratio)
    gram_d, gram_d2 = engine_gram(plan_d, client), engine_gram(plan_d2, client)
    assert gram_d.shape == (M + 1, M + 1) and gram_d[M, M] == N  # the constant term
    n = plan_d.query.records
    B = noise.row_factor
    shift = whiten_symmetric((gram_d2 - gram_d) / n, B, r)
    # near worst case, never beyond the calibrated sensitivity
    assert 0.8 * noise.mahalanobis_sensitivity < float(np.linalg.norm(shift))
    assert float(np.linalg.norm(shift)) <= noise.mahalanobis_sensitivity * (1 + 1e-12)

    def statistic(runs: list[Any]) -> np.ndarray:
        Y = np.stack([run.value for run in runs])
        whitened = whiten_symmetric(Y - gram_d / n, B, r)
        return standardise(gaussian_log_lr(whitened, shift), float(np.linalg.norm(shift)))

    def trials(rplan: ReleasePlan, gram: np.ndarray, first: int) -> list[Any]:
        return [moment_trial(rplan, gram, first + t) for t in range(TRIALS)]

    t0 = statistic(trials(plan_d, gram_d, SEED))
    t1 = statistic(trials(plan_d2, gram_d2, SEED + TRIALS))
    result = epsilon_lower_bound(t0, t1, DELTA)
    _report("centered covariance replace-one (symmetric, exact)", result)
    assert 0.3 * EPSILON < result.epsilon_lower <= EPSILON


@pytest.mark.slow
def test_grouped_moment_release_across_groups(tmp_path: Path, client) -> None:
    """A grouped centered-covariance release (``group_by``, two groups, symmetric noise, lattice),
    audited on both groups' published moments together. The pair moves the corner record
    ``(1, 1, 1, 1)`` from group 0 to group 1 (the data are the same; only its label changes):
    group 0 loses ``z z^T / N`` and group 1 gains it, ``||Delta F||_F = sqrt(2) * 5 / N``, the joint
    sensitivity ``max(s_replace-one, sqrt(2) s_add-remove)`` of the augmented box
    (docs/bounds.md, Sec. 15 and 17): a worst case. The statistic is the Gaussian log-LR
    along the whitened shift of the concatenated ``vech_r`` coordinates of both groups (each
    group's noise is independent, with the plan's law). Claim: epsilon_hat <= epsilon = 1
    (alpha = 0.01, seeds ``SEED + t``)."""
    from tests.pipeline_helpers import add_group_variable

    X = _base()
    labels = np.arange(N) % 2
    moved = labels.copy()
    moved[0] = 1  # the corner record, in group 0 in D, is in group 1 in D'
    plans = []
    for tag, site in (("d", labels), ("d2", moved)):
        shutil.rmtree(root := tmp_path / f"{tag}.zarr", ignore_errors=True)
        add_group_variable(make_input(root, X, chunk=16), site)
        spec = _spec(tmp_path, tag, mechanism={"algorithm": "symmetric"})
        spec["query"] = "centered-covariance"
        spec["group_by"] = {"variable": "site", "groups": [0, 1]}
        plans.append(api.dry_run(spec))
    plan_d, plan_d2 = plans
    noise = plan_d.noise_plan()
    r, B, n = float(noise.symmetric_ratio), noise.row_factor, plan_d.query.records
    gram_d, gram_d2 = engine_gram(plan_d, client), engine_gram(plan_d2, client)
    assert gram_d.shape == (2, M + 1, M + 1)
    assert gram_d[0, M, M] + gram_d[1, M, M] == N  # every record in one declared group
    np.testing.assert_allclose(gram_d2[1] - gram_d[1], np.outer(*(2 * [np.append(CORNER, 1)])))

    def coordinates(moments: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [whiten_symmetric(moments[..., g, :, :], B, r) for g in range(2)], axis=-1
        )

    shift = coordinates((gram_d2 - gram_d) / n)
    # the worst case, never beyond the calibrated (joint) sensitivity
    assert 0.8 * noise.mahalanobis_sensitivity < float(np.linalg.norm(shift))
    assert float(np.linalg.norm(shift)) <= noise.mahalanobis_sensitivity * (1 + 1e-12)

    def statistic(runs: list[Any]) -> np.ndarray:
        Y = np.stack([run.value for run in runs])
        return standardise(
            gaussian_log_lr(coordinates(Y - gram_d / n), shift), float(np.linalg.norm(shift))
        )

    t0 = statistic([moment_trial(plan_d, gram_d, SEED + t) for t in range(TRIALS)])
    t1 = statistic([moment_trial(plan_d2, gram_d2, SEED + TRIALS + t) for t in range(TRIALS)])
    result = epsilon_lower_bound(t0, t1, DELTA)
    _report("grouped centered covariance, a record moving between groups (symmetric)", result)
    assert 0.3 * EPSILON < result.epsilon_lower <= EPSILON


@pytest.mark.slow
def test_covariance_add_remove_public_normaliser(tmp_path: Path, client) -> None:
    result = _audit_covariance(tmp_path, client, "add-remove", TRIALS, records=N0)
    _report("covariance add-remove, N0 (equi-modal, exact)", result)
    assert 0.5 * EPSILON < result.epsilon_lower <= EPSILON


@pytest.mark.slow
def test_covariance_add_remove_noisy_count(tmp_path: Path, client) -> None:
    """The published ``gram`` (noisy ``X X^T``) and ``record_count`` (noisy ``N``) together;
    the published ``covariance`` is their ratio (post-processing, nothing more to test)."""
    plan_d, plan_d2 = _pair(tmp_path, "add-remove")
    assert plan_d.releases_count
    gram_d, gram_d2 = engine_gram(plan_d, client), engine_gram(plan_d2, client)
    noise = plan_d.noise_plan()
    B = noise.row_factor
    count_mu = plan_d.budgets.count_mu
    assert count_mu is not None and plan_d.query.records == 1
    shift = whiten(gram_d2 - gram_d, B, True)
    # worst case: the pair's whitened shift is the plan's exact-arithmetic Delta_M; the release's
    # sensitivity (lattice noise: Delta_M + 2E + grid sqrt(c), where E counts sums of up to
    # max_records = 2^32 records, a few per cent of Delta_M here) and the count's ratio make up
    # the whole claim
    assert float(np.linalg.norm(shift)) == pytest.approx(noise.mahalanobis_sensitivity, rel=1e-9)
    assert float(np.hypot(noise.release_sensitivity, count_mu)) == pytest.approx(MU, rel=1e-9)

    def statistic(runs: list[Any]) -> np.ndarray:
        G = np.stack([r.extra["gram"] for r in runs])
        count = np.array([r.extra["record_count"] for r in runs])
        # the count's whitened residual against D's N and its shift (one record) for D'
        lr_count = (count - N) * count_mu * count_mu - count_mu**2 / 2
        return standardise(gaussian_log_lr(whiten(G - gram_d, B, True), shift) + lr_count, MU)

    t0 = statistic(_trials(plan_d, gram_d, SEED, TRIALS))
    t1 = statistic(_trials(plan_d2, gram_d2, SEED + TRIALS, TRIALS))
    result = epsilon_lower_bound(t0, t1, DELTA)
    _report("covariance add-remove, noisy count (equi-modal, exact)", result)
    assert 0.5 * EPSILON < result.epsilon_lower <= EPSILON


@pytest.mark.slow
def test_exact_with_dp_pca(tmp_path: Path, client) -> None:
    """DP-PCA directions (a quarter of the budget) then the release, composed as Gaussian DP.

    A release publishes the directions and the eigenvalues of the noisy Gram matrix of the
    Analyze Gauss step, so ``G~ = N V diag(lambda) V^T`` is known to the analyst; the log LR
    is that of ``G~`` (upper triangle, iid ``N(0, sigma_1^2)``) plus that of the covariance
    given the directions, whitened with the ``row_factor`` of that trial's plan."""
    n = TRIALS // 3  # a trial also runs DP-PCA and resolves the plan
    mech = {"directions": {"method": "dp-pca", "k": 2, "budget_share": 0.25}}
    plan_d, plan_d2 = _pair(tmp_path, "replace-one", mechanism=mech)
    assert plan_d.uses_dp_pca and plan_d.budgets.step_mu is not None
    gram_d, gram_d2 = engine_gram(plan_d, client), engine_gram(plan_d2, client)
    from mvg_dask.plan import gram_sensitivity

    sigma1 = gram_sensitivity(plan_d.domain, "replace-one") / plan_d.budgets.step_mu
    iu = np.triu_indices(M)
    step_shift = (gram_d2 - gram_d)[iu] / sigma1
    f_d, f_d2 = gram_d / N, gram_d2 / N

    def statistic(runs: list[Any]) -> np.ndarray:
        out = []
        for r in runs:
            noise = r.rplan.noise_plan()
            V = noise.directions.matrix
            G = N * (V * noise.directions.eigenvalues) @ V.T  # the published noisy Gram
            step = gaussian_log_lr(((G - gram_d)[iu] / sigma1)[None], step_shift)[0]
            B = noise.row_factor
            rel = gaussian_log_lr(
                whiten((r.value - f_d)[None], B, True), whiten(f_d2 - f_d, B, True)
            )
            out.append(step + rel[0])
        return standardise(np.array(out), MU)

    t0 = statistic(_trials(plan_d, gram_d, SEED, n))
    t1 = statistic(_trials(plan_d2, gram_d2, SEED + n, n))
    result = epsilon_lower_bound(t0, t1, DELTA)
    _report("covariance replace-one, exact + DP-PCA (k=2, share 0.25)", result)
    assert 0.3 * EPSILON < result.epsilon_lower <= EPSILON


def test_trial_sampler_is_the_release(tmp_path: Path, client) -> None:
    """A trial of the audit is the release the cluster publishes for the same seed, bit for
    bit (noisy count and DP-PCA included): the audit samples the real mechanism."""
    mech = {"directions": {"method": "dp-pca", "k": 2, "budget_share": 0.25}}
    plan_d, _ = _pair(tmp_path, "add-remove", mechanism=mech)
    gram_d = engine_gram(plan_d, client)
    seed = SEED + 5
    trial = covariance_trial(plan_d, gram_d, seed)
    api.release(
        _spec(tmp_path, "d", neighbours="add-remove", mechanism=mech),
        client=client,
        seed=seed,
        progress=False,
    )
    ds = api.open_release(str(tmp_path / "d-out.zarr"))
    assert trial.value is not None and trial.rplan is not None
    np.testing.assert_array_equal(ds["covariance"].values, trial.value)
    np.testing.assert_array_equal(ds["gram"].values, trial.extra["gram"])
    assert float(ds["record_count"].values) == trial.extra["record_count"]
    directions = trial.rplan.noise_plan().directions
    np.testing.assert_array_equal(ds["directions"].values, directions.matrix)
    np.testing.assert_array_equal(ds["dp_pca_eigenvalues"].values, directions.eigenvalues)
    np.testing.assert_array_equal(ds["row_cov"].values, trial.rplan.noise_plan().row_cov)
    assert json.loads(ds.attrs["mvg_dask_plan"]) == plan_d.public_noise_dict()


@pytest.mark.slow
@pytest.mark.parametrize("noise", ["lattice", "float"])
def test_audit_flags_an_under_noised_mechanism(
    tmp_path: Path, client, monkeypatch, noise: str
) -> None:
    """The same audit as ``test_covariance_replace_one`` with the noise of the release halved,
    everything else unchanged, must exceed the claim: it can fail. Lattice noise: the rounded
    Gaussian's scale halved (``StandardSquareLattice.scale``); float noise: ``covariance_noise``
    times 0.5."""
    if noise == "float":
        real = engine_covariance.covariance_noise
        monkeypatch.setattr(
            engine_covariance, "covariance_noise", lambda *a, **k: 0.5 * real(*a, **k)
        )
    else:
        real_for_plan = engine_lattice.StandardSquareLattice.for_plan

        def halved(cls: Any, plan: Any, key: Any) -> Any:
            lattice = real_for_plan(plan, key)
            return dataclasses.replace(lattice, scale=lattice.scale / 2)

        monkeypatch.setattr(engine_lattice.StandardSquareLattice, "for_plan", classmethod(halved))
    result = _audit_covariance(
        tmp_path, client, "replace-one", TRIALS // 2, mechanism={"noise": noise}
    )
    _report(f"UNDER-NOISED covariance replace-one ({noise} noise * 0.5)", result)
    assert result.epsilon_lower > EPSILON


# -- identity ---------------------------------------------------------------------------------
ID_RECORDS = 600_000  # samples per dataset (one release each)
ID_CHUNK = 100_000
LOWER = np.array([0.0, -1.0, 0.0, -0.5])
UPPER = np.array([1.0, 1.0, 2.0, 0.5])


@pytest.mark.slow
def test_identity_rotated_directions(tmp_path: Path, client) -> None:
    """Unimodal ``exact`` noise along a random rotation with a binary allocation (so that
    ``Sigma`` is not isotropic and the rotation matters)."""
    W = np.linalg.qr(np.random.default_rng(5).standard_normal((M, M)))[0]
    np.save(tmp_path / "W.npy", W)

    def spec(tag: str) -> dict[str, Any]:
        return {
            "name": "audit",
            "release_id": f"audit-identity-{tag}",
            "input": {"store": str(tmp_path / f"{tag}.zarr"), "variable": "X"},
            "domain": {"box": {"lower": LOWER.tolist(), "upper": UPPER.tolist()}},
            "query": "identity",
            "mechanism": {
                "algorithm": "unimodal",
                "calibration": "exact",
                "directions": {"method": "matrix", "path": str(tmp_path / "W.npy")},
                "allocation": {"strategy": "binary", "important": [0], "share": 0.7},
            },
            "privacy": {"epsilon": EPSILON, "delta": DELTA},
            "output": {"store": str(tmp_path / f"{tag}-out.zarr")},
        }

    # the worst case pair of records: opposite corners along the sign pattern that maximises
    # d^T Sigma^-1 d (the maximum of a convex quadratic over the box is at a vertex); the plan
    # is made from metadata only, so D's input is first written with placeholder records
    widths = UPPER - LOWER
    signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * M)).reshape(M, -1).T
    placeholder = np.tile(((LOWER + UPPER) / 2)[:, None], (1, ID_RECORDS))
    make_input(tmp_path / "d.zarr", placeholder, chunk=ID_CHUNK)
    plan = api.dry_run(spec("d")).noise_plan()
    P = plan.row_precision
    s = max(signs, key=lambda sg: float((sg * widths) @ P @ (sg * widths)))
    d = s * widths
    x_d = np.where(s > 0, LOWER, UPPER)  # D's record
    x_d2 = x_d + d  # D''s record, the opposite corner ...
    outside = x_d2 + s  # ... reached by clipping a record outside the box
    shift_norm = float(np.sqrt(d @ P @ d))
    # the pair attains the plan's Mahalanobis sensitivity, which the calibration made MU
    assert shift_norm == pytest.approx(plan.mahalanobis_sensitivity, rel=1e-9)
    assert shift_norm == pytest.approx(MU, rel=1e-6)

    columns = {}
    for tag, record, seed in (("d", x_d, SEED), ("d2", outside, SEED + 1)):
        shutil.rmtree(tmp_path / f"{tag}.zarr", ignore_errors=True)
        make_input(
            tmp_path / f"{tag}.zarr", np.tile(record[:, None], (1, ID_RECORDS)), chunk=ID_CHUNK
        )
        api.release(spec(tag), client=client, seed=seed, progress=False)
        columns[tag] = api.open_release(str(tmp_path / f"{tag}-out.zarr"))["X"].values
    # the projection of each column's whitened residual (against D's record) on the shift
    proj = P @ d / shift_norm
    t0 = (columns["d"] - x_d[:, None]).T @ proj
    t1 = (columns["d2"] - x_d[:, None]).T @ proj
    result = epsilon_lower_bound(
        standardise(shift_norm * t0 - shift_norm**2 / 2, MU),
        standardise(shift_norm * t1 - shift_norm**2 / 2, MU),
        DELTA,
    )
    _report("identity, rotated directions (unimodal, exact, binary allocation)", result)
    assert 0.5 * EPSILON < result.epsilon_lower <= EPSILON


@pytest.mark.slow
def test_centered_covariance_mean_first(tmp_path: Path, client) -> None:
    """The mean-first route: the mean (Gaussian, lattice) then the covariance about the
    released mean clamped into the box, with step 2's plan made from step 1's output
    (``resolve_about_mean``), composed as Gaussian DP. Each trial runs the engine's step
    functions (``released_mean`` on the engine's Gram-pass sums, ``centre_from_mean``,
    ``resolve_about_mean``, the lattice ``square_release``) under the keys a release derives
    from ``NoiseKey.from_seed(seed)``; the log LR is that of the mean plus that of the
    covariance given the centre (the output's density factorises), whitened with that trial's
    plan. 3,000 trials per dataset (seeds ``SEED + t`` and ``SEED + 3000 + t``)."""
    from mvg_dask.engine.lattice import square_release
    from mvg_dask.engine.stages.mean_first import released_mean
    from mvg_dask.plan.mean_first import centre_from_mean
    from mvg_dask.plan.release_plan import resolve_about_mean

    n = 3000
    route = {"centered-covariance": {"route": "mean-first"}}
    sym = {"algorithm": "symmetric"}
    plan_d, plan_d2 = _pair(tmp_path, "replace-one", query=route, mechanism=sym)
    step = plan_d.mean_first
    assert step is not None and plan_d2.mean_first == step
    sums = [engine_gram(p, client)[:M, M] for p in (plan_d, plan_d2)]  # sum of fl(x - 0)
    X_d = _base()
    X_d2 = X_d.copy()
    X_d2[:, 0] = np.clip(OUTSIDE, -1, 1)
    np.testing.assert_allclose(sums[0], X_d.sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(sums[1], X_d2.sum(axis=1), atol=1e-12)
    s1 = (sums[1] - sums[0]) / N / step.std  # the mean's whitened shift

    def second(X: np.ndarray, centre: np.ndarray) -> np.ndarray:
        U = X - centre[:, None]
        return U @ U.T / N

    def statistic(X: np.ndarray, total: np.ndarray, first: int) -> np.ndarray:
        out = []
        for t in range(n):
            key = NoiseKey.from_seed(first + t)
            mean = released_mean(step, total, N, key.derive("mean"))
            centre = centre_from_mean(mean, plan_d.domain)  # type: ignore[arg-type]
            noise = resolve_about_mean(plan_d, centre).noise_plan()
            cov = square_release(second(X, centre), noise, key.derive("release"))
            e1 = (mean - sums[0] / N) / step.std
            lr = gaussian_log_lr(e1[None], s1)[0]
            B, r = noise.row_factor, float(noise.symmetric_ratio)
            f_d, f_d2 = second(X_d, centre), second(X_d2, centre)
            e2 = whiten_symmetric((cov - f_d)[None], B, r)
            lr += gaussian_log_lr(e2, whiten_symmetric((f_d2 - f_d)[None], B, r)[0])[0]
            out.append(lr)
        return standardise(np.array(out), MU)

    t0 = statistic(X_d, sums[0], SEED)
    t1 = statistic(X_d2, sums[1], SEED + n)
    result = epsilon_lower_bound(t0, t1, DELTA)
    _report("centered covariance, mean-first (mean then covariance about it)", result)
    assert 0.2 * EPSILON < result.epsilon_lower <= EPSILON
