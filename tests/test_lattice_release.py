"""The lattice release is floating-point safe: what it publishes is a function of exact integers.

* Sub-grid inputs: two inputs that differ below the grid (one entry moved by ``2^-40``) give
  byte-identical releases for the same key, identity and covariance; the ``float`` path's bytes
  differ (its published low-order bits carry the input's).
* The precision attack (Haney et al. 2022): a record that is all 0 in ``D`` and all 1 in ``D'``.
  With float noise, ``fl(1 + z)`` is always a multiple of ``2^-53`` and ``fl(0 + z) = z`` often is
  not, so the event "the record's published value is off the ``2^-53`` grid" has probability 0
  on one side and about 0.1 on the other. With lattice noise the event has the same probability
  on both sides within the test's power. Real releases (``api.release``) with fresh keys.
* The dry run states the lattice: its grid, the float error and the inflation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
from scipy import stats

from mvg_dask import api
from tests.pipeline_helpers import make_input

ALPHA = 1e-3
RECORDS = 4096
M = 4


def _spec(root: Path, tag: str, query: str, noise: str, **mech: Any) -> dict[str, Any]:
    return {
        "name": "lattice",
        "release_id": f"lattice-{tag}",
        "input": {"store": str(root / f"{tag}.zarr"), "variable": "X"},
        "domain": {"box": {"lower": 0.0, "upper": 1.0}, "on_violation": "clip"},
        "query": query,
        "mechanism": {
            "algorithm": "unimodal" if query == "identity" else "symmetric",
            "noise": noise,
            **mech,
        },
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "output": {"store": str(root / f"{tag}-out.zarr")},
    }


def _release(
    root: Path, tag: str, X: np.ndarray, query: str, noise: str, client: Any, seed: int | None
) -> np.ndarray:
    make_input(root / f"{tag}.zarr", X, chunk=1024)
    api.release(_spec(root, tag, query, noise), client=client, seed=seed, progress=False)
    ds = xr.open_zarr(root / f"{tag}-out.zarr")
    return np.asarray(ds["X" if query == "identity" else "covariance"].values)


@pytest.mark.parametrize("query", ["identity", "covariance"])
def test_sub_grid_inputs_give_identical_bytes(query: str, tmp_path: Path, client) -> None:
    X = np.random.default_rng(1).uniform(0.1, 0.9, (M, 600))
    Y = X.copy()
    Y[2, 17] += 2.0**-40  # far below the lattice's grid, far above float64's resolution
    seed = 424242
    lat_x = _release(tmp_path, "lx", X, query, "lattice", client, seed)
    lat_y = _release(tmp_path, "ly", Y, query, "lattice", client, seed)
    assert lat_x.tobytes() == lat_y.tobytes()
    flt_x = _release(tmp_path, "fx", X, query, "float", client, seed)
    flt_y = _release(tmp_path, "fy", Y, query, "float", client, seed)
    assert flt_x.tobytes() != flt_y.tobytes()  # the float path shows the sub-grid change


def _off_grid(values: np.ndarray) -> np.ndarray:
    """True where a value is not a multiple of ``2^-53``."""
    scaled = np.ldexp(values, 53)
    return scaled != np.rint(scaled)


def _grid_event_counts(
    root: Path, noise: str, client: Any, releases: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """(off-grid, total) over the published values of ``D`` (all records 0) and ``D'`` (all 1):
    with ``Psi = I`` every record's column has its own independent noise, so a dataset of
    ``RECORDS`` copies of the record gives ``RECORDS`` samples of its published column."""
    out = []
    for value in (0.0, 1.0):
        off = total = 0
        for r in range(releases):
            tag = f"{noise}-{int(value)}-{r}"
            y = _release(root, tag, np.full((M, RECORDS), value), "identity", noise, client, None)
            off += int(_off_grid(y).sum())
            total += y.size
        out.append((off, total))
    return out[0], out[1]


def test_precision_attack_fails_on_lattice_releases(tmp_path: Path, client) -> None:
    """ALPHA = 1e-3; fresh keys (no seed): 3 releases x 4,096 records x 4 features per side."""
    (off0, n0), (off1, n1) = _grid_event_counts(tmp_path, "lattice", client, 3)
    p0, p1 = off0 / n0, off1 / n1
    table = np.array([[off0, n0 - off0], [off1, n1 - off1]])
    pvalue = (
        stats.fisher_exact(table).pvalue
        if min(off0, off1) < 5
        else stats.chi2_contingency(table).pvalue
    )
    print(f"lattice: off-grid share {p0:.4f} (record 0) vs {p1:.4f} (record 1), p = {pvalue:.3g}")
    assert pvalue > ALPHA


def test_precision_attack_succeeds_on_float_releases(tmp_path: Path, client) -> None:
    """The control that gives the attack its power: on the float path the event never happens
    for the record at 1 and often for the record at 0 (ALPHA = 1e-3, fresh keys)."""
    (off0, n0), (off1, n1) = _grid_event_counts(tmp_path, "float", client, 1)
    print(f"float: off-grid share {off0 / n0:.4f} (record 0) vs {off1 / n1:.4f} (record 1)")
    assert off1 == 0
    assert stats.binomtest(off0, n0, 0.01, alternative="greater").pvalue < ALPHA


def test_dry_run_states_the_lattice(tmp_path: Path) -> None:
    make_input(tmp_path / "d.zarr", np.zeros((M, 64)))
    from mvg_dask.engine.preview import preview

    text = preview(api.dry_run(_spec(tmp_path, "d", "covariance", "lattice"))).text()
    assert "lattice noise: grid 2^" in text
    assert "float error E <=" in text
    assert "sensitivity inflated by" in text
    float_text = preview(api.dry_run(_spec(tmp_path, "d", "covariance", "float"))).text()
    assert "not floating-point safe" in float_text


def test_fused_diagonal_kernel_gives_the_numpy_bytes() -> None:
    """The compiled one-pass kernel of a diagonal identity release performs the numpy path's
    operations in the same order (seed 0; random scales, grids and integers)."""
    from mvg_dask.engine.lattice import diagonal_release, from_lattice, to_lattice

    rng = np.random.default_rng(0)
    for _ in range(20):
        m, n = int(rng.integers(1, 70)), int(rng.integers(1, 3000))
        x = rng.uniform(-3, 3, (m, n)) * 10.0 ** int(rng.integers(-5, 5))
        w = rng.uniform(0.01, 100, m)
        d = 1 / np.sqrt(rng.uniform(0.1, 10, m))
        K = rng.integers(-(2**40), 2**40, (m, n))
        k = int(rng.integers(-40, -5))
        reference = from_lattice(to_lattice(x * w[:, None], k) + K, k) * d[:, None]
        assert diagonal_release(x, w, d, K, k).tobytes() == reference.tobytes()


def test_kernel_warmup_is_asked_for_lattice_identity_releases_only(tmp_path: Path) -> None:
    """The workers load numba's kernels ahead of the first task only for a release whose tasks
    run them: an identity release with lattice noise (not its float twin, not a covariance)."""
    from mvg_dask.engine.warmup import needs_kernels
    from tests.pipeline_helpers import spec_dict

    store = make_input(tmp_path / "in.zarr", np.random.default_rng(3).uniform(0, 1, (4, 50)))
    out = str(tmp_path / "out.zarr")

    def plan(query: str, noise: str) -> Any:
        return api.dry_run(spec_dict(store, out, query=query, mechanism={"noise": noise}))

    assert needs_kernels(plan("identity", "lattice"))
    assert not needs_kernels(plan("identity", "float"))
    assert not needs_kernels(plan("covariance", "lattice"))


def test_kernel_warmup_loads_both_kernels_in_a_fresh_process() -> None:
    """``load_kernels`` leaves a fresh process with the sampler's kernel compiled (or loaded
    from numba's cache) for the signature a release calls it with, and the diagonal kernel too;
    and the sampler draws the same bits after it (the warm-up's throwaway draw reads no shared
    state)."""
    import subprocess
    import sys

    probe = (
        "from mvg_dask.noise import NoiseKey, lattice as L\n"
        "from mvg_dask.engine import lattice as EL\n"
        "before = NoiseKey.from_seed(5).tile_lattice(7, (3, 50), 2.5).tolist()\n"
        "assert not L._compiled\n"
        "from mvg_dask.engine.warmup import load_kernels\n"
        "load_kernels()\n"
        "assert len(L._compiled[0].signatures) == 1, L._compiled[0].signatures\n"
        "assert len(EL._diagonal_kernel().signatures) == 1\n"
        "L._uncompiled_left[0] = 0\n"
        "after = NoiseKey.from_seed(5).tile_lattice(7, (3, 50), 2.5).tolist()\n"
        "assert after == before\n"
        "assert len(L._compiled[0].signatures) == 1, L._compiled[0].signatures\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _reference_release(
    x: np.ndarray, w: np.ndarray, d: np.ndarray, k: int, scale: float, key: Any, grid: tuple
) -> np.ndarray:
    """The numpy path of a diagonal record lattice (the docs' sequence, pass by pass): the
    whole chunk's integers from the tile grid, ``rint(fl(x w) / 2^k) + K``, times ``2^k d``."""
    from mvg_dask.engine.lattice import from_lattice, to_lattice
    from mvg_dask.noise.tiles import tile_lattice_noise

    start, stop, tile, n_total = grid
    K = tile_lattice_noise(key, x.shape[0], start, stop, tile=tile, n_total=n_total, scale=scale)
    return np.asarray(from_lattice(to_lattice(x * w[:, None], k) + K, k) * d[:, None])


@pytest.mark.parametrize("scale", [2.0**-16, 0.37, 2.0**6, 2.0**30, 2.0**46])
def test_tile_by_tile_record_release_gives_the_reference_bytes(scale: float) -> None:
    """The identity task's fused release (a tile drawn, then applied to its records at once,
    optionally in place) publishes the bytes of the reference numpy path on random inputs
    (seed 1): unaligned record ranges, a short last tile, C- and F-ordered blocks, clipped
    (boundary) values, values near the lattice's range, tiny and huge scales and grids."""
    from mvg_dask.engine.lattice import RecordLattice
    from mvg_dask.noise import NoiseKey

    rng = np.random.default_rng(1)
    key = NoiseKey.from_seed(11).derive("release")
    for trial in range(12):
        m, tile = int(rng.integers(1, 40)), int(rng.integers(1, 300))
        n_total = int(rng.integers(1, 3000))
        start = int(rng.integers(0, n_total))
        stop = int(rng.integers(start + 1, n_total + 1))
        k = int(rng.integers(-60, 20))
        x = np.clip(rng.uniform(-0.2, 1.2, (m, stop - start)), 0.0, 1.0)  # clipped: 0s and 1s
        x[:, :3] *= 2.0 ** (k + 58)  # large whitened values, still inside 2^61 grid units
        if trial % 3 == 0:
            x = np.asfortranarray(x)
        w = 1.0 / np.sqrt(rng.uniform(0.5, 2.0, m))
        d = np.sqrt(rng.uniform(0.5, 2.0, m))
        lattice = RecordLattice(k, scale, w, d)
        grid = (start, stop, tile, n_total)
        want = _reference_release(x, w, d, k, scale, key, grid).tobytes()
        kept = x.copy()
        got = lattice.release(x, key, start, stop, tile=tile, n_total=n_total)
        assert got.tobytes() == want and np.array_equal(x, kept)  # x untouched by default
        again = lattice.release(x, key, start, stop, tile=tile, n_total=n_total, overwrite=True)
        assert again.tobytes() == want
        assert (again is x) == x.flags.c_contiguous  # in place when it can


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 2.0**62])
def test_record_release_refuses_values_off_the_lattice_as_the_reference(bad: float) -> None:
    """A NaN, an infinity or a whitened value beyond the lattice's range is refused by the
    fused release as by the reference path (a ReleaseError, nothing returned)."""
    from mvg_dask.engine.lattice import RecordLattice, to_lattice
    from mvg_dask.errors import ReleaseError
    from mvg_dask.noise import NoiseKey

    key = NoiseKey.from_seed(12)
    x = np.full((3, 50), 0.5)
    x[1, 37] = bad
    lattice = RecordLattice(0, 1.0, np.ones(3), np.ones(3))
    with pytest.raises(ReleaseError, match="left the lattice's range"):
        to_lattice(x, 0)
    for overwrite in (False, True):
        with pytest.raises(ReleaseError, match="left the lattice's range"):
            lattice.release(x.copy(), key, 100, 150, tile=16, n_total=200, overwrite=overwrite)
