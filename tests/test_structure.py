"""Planning follows the structure of the noise: standard directions never build an m x m matrix
for the privacy math, and the O(m) path gives the dense path's numbers."""

from __future__ import annotations

import numpy as np
import pytest

from mvg_dask.plan import BoxDomain, Directions, L2BallDomain, build_noise_plan
from mvg_dask.plan.queries import CovarianceQuery, IdentityQuery

DOMAINS = {
    "sym-box": lambda m: BoxDomain.create(-1.0, 1.0, m),
    "unit-box": lambda m: BoxDomain.create(0.0, 1.0, m),
    "mixed-box": lambda m: BoxDomain.create(np.linspace(-2, 0.5, m), np.linspace(1, 3, m), m),
    "ball": lambda m: L2BallDomain(1.5, m),
}


#: (query, algorithm, neighbours): the identity query takes unimodal noise and replace-one
CASES = [("identity", "unimodal", "replace-one")] + [
    ("covariance", algorithm, neighbours)
    for algorithm in ("unimodal", "equi-modal", "symmetric")
    for neighbours in ("replace-one", "add-remove")
]


@pytest.mark.parametrize("domain_name", list(DOMAINS))
@pytest.mark.parametrize(("kind", "algorithm", "neighbours"), CASES)
def test_diagonal_path_equals_the_dense_path(domain_name, kind, algorithm, neighbours):
    """Random precisions (seed 4): the vector form of a diagonal precision gives the bound the
    dense ``diag(p)`` with the identity as directions gives, to rounding."""
    m = 6
    rng = np.random.default_rng(4)
    p = rng.uniform(0.2, 3.0, m)
    domain = DOMAINS[domain_name](m)
    query = IdentityQuery(m, 50) if kind == "identity" else CovarianceQuery(m, 50)
    ratio = 1.7 if algorithm == "symmetric" else None
    dense = query.mahalanobis_sensitivity(
        domain, neighbours, np.diag(p), algorithm, directions=np.eye(m), ratio=ratio
    )
    fast = query.mahalanobis_sensitivity(domain, neighbours, p, algorithm, ratio=ratio)
    assert fast == pytest.approx(dense, rel=1e-12)


def test_a_vector_precision_with_directions_is_refused():
    q = CovarianceQuery(3, 10)
    with pytest.raises(ValueError, match="standard directions"):
        q.mahalanobis_sensitivity(
            BoxDomain.create(0.0, 1.0, 3),
            "replace-one",
            np.ones(3),
            "equi-modal",
            directions=np.eye(3),
        )


@pytest.mark.parametrize("algorithm", ["equi-modal", "symmetric", "unimodal"])
def test_standard_directions_plan_without_eigendecompositions(monkeypatch, algorithm):
    """With standard directions the plan's math is diagonal: no eigendecomposition runs (the
    dense path ran ``eigvalsh`` on m x m matrices hundreds of times)."""
    m = 2048

    def forbidden(*args, **kwargs):
        raise AssertionError("an eigendecomposition ran for standard directions")

    monkeypatch.setattr(np.linalg, "eigvalsh", forbidden)
    monkeypatch.setattr(np.linalg, "eigh", forbidden)
    plan = build_noise_plan(
        CovarianceQuery(m, 100_000),
        BoxDomain.create(0.0, 1.0, m),
        epsilon=1.0,
        delta=1e-6,
        algorithm=algorithm,
        calibration="exact",
    )
    assert plan.directions.is_standard
    lhs, rhs = plan.theorem_check()
    assert lhs <= rhs


def test_is_standard_recognises_an_identity_given_as_a_matrix():
    assert Directions.from_matrix(np.eye(4)).is_standard
    W = np.eye(4)[:, [1, 0, 2, 3]]
    assert not Directions.from_matrix(W).is_standard


@pytest.mark.parametrize("algorithm", ["symmetric", "equi-modal", "unimodal"])
def test_diagonal_noise_is_the_dense_noise(algorithm):
    """The O(m^2) sampler for standard directions draws the same normals and gives the same
    matrix as the dense products (up to the last bit of a multiply-add: rel 1e-15), and the
    O(m^2) entry standard deviations are those of the dense formula."""
    from mvg_dask.noise import NoiseKey
    from mvg_dask.noise.tiles import symmetric_query_noise
    from mvg_dask.plan.noise_plan import symmetric_entry_std

    m = 40
    v = np.random.default_rng(6).uniform(0.5, 2.0, m)
    B = np.diag(np.sqrt(v))
    key = NoiseKey.from_seed(12)
    ratio = 1.8 if algorithm == "symmetric" else None
    fast = symmetric_query_noise(key, B, algorithm, ratio, diagonal=True)
    dense = symmetric_query_noise(key, B, algorithm, ratio, diagonal=False)
    np.testing.assert_allclose(fast, dense, rtol=1e-15, atol=0.0)
    if algorithm == "unimodal":
        return
    plan = build_noise_plan(
        CovarianceQuery(m, 1000),
        BoxDomain.create(-1.0, 1.0, m),
        epsilon=1.0,
        delta=1e-6,
        algorithm=algorithm,
        calibration="exact",
    )
    r = plan.output_symmetric_ratio
    assert r is not None
    np.testing.assert_allclose(
        plan.released_entry_std(), symmetric_entry_std(plan.row_factor, r), rtol=1e-13
    )


def _import_cycles() -> list[list[str]]:
    """Every import cycle between two modules of mvg_dask and its lab, as ``[a, ..., a]`` chains:
    for each direct import ``a -> b``, the shortest chain back from ``b`` to ``a`` (grimp's graph
    holds imports inside functions and under ``TYPE_CHECKING`` too)."""
    grimp = pytest.importorskip("grimp", reason="extra [dev]")
    graph = grimp.build_graph("mvg_dask", "mvg_dask_lab")
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if not imported.startswith("mvg_dask"):
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.append([module, *back])
    return cycles


def test_no_import_cycle_in_the_package():
    """No module of mvg_dask imports, directly or through others, a module that imports it back:
    the front ends are layers (``cli > xarray > interactive > api``), the experiments' method rows
    live below the runner and the literature (import-linter's ``acyclic_siblings`` contract
    in pyproject.toml says the same per package)."""
    cycles = _import_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_accessor_registers_on_import_of_mvg_dask_xarray():
    """``import mvg_dask.xarray`` registers ``.mvg`` on Datasets and DataArrays; the API module
    below it imports neither it nor xarray."""
    import subprocess
    import sys

    code = (
        "import sys, mvg_dask.api; assert 'mvg_dask.xarray' not in sys.modules; "
        "assert 'xarray' not in sys.modules; import mvg_dask.xarray, xarray as xr; "
        "assert hasattr(xr.Dataset, 'mvg') and hasattr(xr.DataArray, 'mvg')"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
