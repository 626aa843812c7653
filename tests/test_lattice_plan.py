"""The lattice release's plan: its effective sensitivity meets the release's mu, the grid follows
its public rule, and a plan round-trips (docs/lattice.md).

Independent checks: the effective sensitivity is recomputed here from the plan's own parts
(``Delta_M`` from the query's bound at the plan's variances, ``E`` from the float-error module,
the grid's term from ``k`` and ``c``) and compared with the analytic Gaussian's ``mu*`` computed
from ``(epsilon, delta)`` by bisection on Balle and Wang's formula (not by the plan's code).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from mvg_dask.errors import DataError
from mvg_dask.plan import Allocation, BoxDomain, Directions, build_noise_plan
from mvg_dask.plan.domain import L2BallDomain
from mvg_dask.plan.lattice import GRID_SHARE, LatticeContext, choose_log2_grid, gram_depth
from mvg_dask.plan.noise_calibration import release_float_error
from mvg_dask.plan.noise_plan import noise_plan_from_dict
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery

M, N = 5, 10_000
CONTEXT = LatticeContext(records=N, depth=gram_depth(N, 512, 8, 8))


def _mu_star(epsilon: float, delta: float) -> float:
    """The largest mu with delta_AG(epsilon, mu) <= delta (Balle & Wang, Thm. 8)."""

    def excess(mu: float) -> float:
        return float(
            stats.norm.cdf(mu / 2 - epsilon / mu)
            - math.exp(epsilon) * stats.norm.cdf(-mu / 2 - epsilon / mu)
            - delta
        )

    return float(optimize.brentq(excess, 1e-6, 50.0, xtol=1e-14))


CASES = [
    ("identity", "unimodal", "standard", "box"),
    ("identity", "unimodal", "matrix", "l2"),
    ("covariance", "symmetric", "standard", "box"),
    ("covariance", "symmetric", "matrix", "box"),
    ("covariance", "equi-modal", "standard", "l2"),
    ("covariance", "equi-modal", "matrix", "box"),
    ("covariance", "unimodal", "standard", "box"),
    ("covariance", "unimodal", "matrix", "l2"),
]


def _plan(query: str, algorithm: str, directions: str, domain: str, **kw: object):
    rng = np.random.default_rng(11)
    q = IdentityQuery(M, N) if query == "identity" else CovarianceQuery(M, N)
    dom = BoxDomain.create(-1.0, 2.0, M) if domain == "box" else L2BallDomain(radius=1.5, m=M)
    dirs = (
        Directions.standard(M)
        if directions == "standard"
        else Directions.from_matrix(np.linalg.qr(rng.standard_normal((M, M)))[0])
    )
    return build_noise_plan(
        q,
        dom,
        epsilon=1.0,
        delta=1e-6,
        algorithm=algorithm,  # type: ignore[arg-type]
        directions=dirs,
        allocation=Allocation(strategy="custom", theta=rng.dirichlet(np.ones(M))),
        lattice_context=None if query == "identity" else CONTEXT,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
def test_effective_sensitivity_meets_mu(case: tuple[str, str, str, str]) -> None:
    plan = _plan(*case, noise="lattice")
    lat = plan.lattice
    assert lat is not None
    mu = _mu_star(1.0, 1e-6)
    # recomputed from the plan's parts
    err = release_float_error(
        plan.query,
        plan.domain,
        plan.algorithm,
        plan.directions,
        plan.row_variances,
        plan.symmetric_ratio,
        plan.lattice_context,
    )
    assert err == lat.float_error
    effective = (
        plan.mahalanobis_sensitivity
        + 2 * err
        + math.ldexp(math.sqrt(lat.coordinates), lat.log2_grid)
    )
    assert effective <= mu * (1 + 1e-9)
    assert effective >= mu * (1 - 1e-6)  # calibrated, not over-noised
    # the grid's rule: public, from mu, c and E
    assert lat.log2_grid == choose_log2_grid(plan.budgets.release_mu, lat.coordinates, err)
    assert math.ldexp(math.sqrt(lat.coordinates), lat.log2_grid) <= GRID_SHARE * mu * 1.0000001
    # the coordinates one record moves
    c = {"identity": M, "symmetric": M * (M + 1) // 2}.get(case[0], None) or {
        "symmetric": M * (M + 1) // 2
    }.get(case[1], M * M)
    assert lat.coordinates == (M if case[0] == "identity" else c)
    # the noise costs at most a tiny share more than the float path's
    flt = _plan(*case, noise="float")
    ratio = float(np.max(plan.row_variances / flt.row_variances))
    assert 1.0 <= ratio < 1.0 + 1e-4
    # round trip
    again = noise_plan_from_dict(plan.to_dict())
    assert again.lattice == plan.lattice
    np.testing.assert_array_equal(again.row_variances, plan.row_variances)


def test_paper_calibration_is_checked_against_the_analytic_gaussian() -> None:
    plan = _plan(
        "covariance", "equi-modal", "standard", "box", noise="lattice", calibration="mvg-thm2"
    )
    assert plan.lattice is not None
    mu = _mu_star(1.0, 1e-6)
    assert plan.lattice.effective_sensitivity <= mu
    assert plan.implied_epsilon() <= 1.0


def test_grid_never_finer_than_the_float_error() -> None:
    k = choose_log2_grid(1.0, 10, 1e-3)
    assert math.ldexp(1.0, k) >= 1e-3 * 2.0**-8 / 2  # within the power of two's rounding
    assert choose_log2_grid(1.0, 4, 0.0) == math.floor(math.log2(GRID_SHARE / 2))


def test_gram_depth_counts_chunks_tasks_and_tree_levels() -> None:
    # 1 chunk: the inner product only
    assert gram_depth(64, 64, 1, 8) == 64
    # 8 tasks of 2 chunks: one tree level of 7 additions
    assert gram_depth(8 * 2 * 64, 64, 2, 8) == 64 + 1 + 7
    # 65 tasks: three levels (65 -> 9 -> 2 -> 1)
    assert gram_depth(65 * 64, 64, 1, 8) == 64 + 3 * 7


def test_add_remove_needs_a_public_bound_on_the_count(tmp_path) -> None:
    from mvg_dask import api
    from tests.pipeline_helpers import make_input

    make_input(tmp_path / "in.zarr", np.zeros((3, 200)), chunk=64)
    spec = {
        "name": "bound",
        "input": {"store": str(tmp_path / "in.zarr")},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}},
        "query": "covariance",
        "privacy": {"epsilon": 1.0, "delta": 1e-6, "neighbours": "add-remove", "max_records": 100},
        "output": {"store": str(tmp_path / "out.zarr")},
    }
    with pytest.raises(DataError, match="max_records"):
        api.dry_run(spec)
    spec["privacy"]["max_records"] = 1000  # type: ignore[index]
    plan = api.dry_run(spec)
    assert plan.lattice_context is not None and plan.lattice_context.records == 1000
    # the public plan carries the bound, never the private count
    public = plan.public_dict()
    assert public["input"]["records"] is None
    assert public["plan"]["lattice_context"]["records"] == 1000
