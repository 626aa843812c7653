"""The DP peers against the product, on the same data and (epsilon, delta), interleaved in one run.

Run: ``make bench`` or
``.venv/bin/python -m tests.benchmarks.bench_peers [--records 1e6,1e7] [--repeats 3]``

For each record count ``N`` it writes one input of ``N`` records in ``[0, 1]`` for the covariance
(``--cov-features``, 64) and one for the identity release (``--id-features``, 16), with
:func:`mvg_dask.data.write_matrix`, and times, round-robin (every repeat runs every contender
once, so the machine's load falls on all of them alike), the median of ``--repeats`` runs of:

* **the product**, warm: ``api.release(spec, client=...)`` on one 2-worker cluster (reads the
  Zarr input, charges a ledger, writes the Zarr output; MVG with lattice noise, floating-point
  safe); its peak process memory per worker is printed for every input (flat in ``N``);
* **numpy + Zarr**: one process reading the same store chunk by chunk with zarr, the Gram
  product (covariance) or the noise (identity) in numpy, the result written with zarr with the
  product's output codec (uncompressed); float Gaussian noise (not floating-point safe);
* **numpy in memory**: the same from an in-memory array (not floating-point safe);
* **diffprivlib** (``GaussianAnalytic``, one call per released value; not floating-point safe;
  the identity release timed on a slice and extrapolated);
* **OpenDP**: ``make_np_sscp`` and its ``make_gaussian`` on the upper triangle (covariance),
  ``make_gaussian`` on the values (identity; timed on a slice of ``--slice`` values and
  extrapolated: stated ``~`` and ``(extrapolated)``). Its Gaussian is floating-point safe, but
  ``make_np_sscp`` requires OpenDP's ``idealized-numerics`` opt-in (the renamed
  ``floating-point`` feature: "functions that are susceptible to floating-point attacks"): its
  stability assumes the float sum of outer products is exact. So its covariance is marked ``float``
  (idealized numerics) and its identity release ``fp-safe``;
* **OpenDP + Zarr**: the same covariance with the same Zarr read and write as numpy + Zarr
  (``make_np_sscp`` chunk by chunk, the sums added, one Gaussian).

The in-memory contenders start from data already in memory (read untimed) and are skipped, with
a printed line, above ``--in-memory-max`` elements. A peer that is not installed (the optional
``bench`` extra: ``pip install 'mvg-dask[bench]'``) is skipped with a printed line.

Every figure comes with its relative error, ``||released - exact||_F / ||exact||_F`` against
the exact ``X X^T / N`` (covariance) or ``X`` (identity), so speed is never bought with noise.
The sensitivities are those of a record in the box ``[0, 1]^m`` (add or remove one record):
``||x x^T||_F <= m`` and ``||x||_2 <= sqrt(m)``. Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.benchmarks.bench_release import CHUNK_BYTES, spec

EPSILON, DELTA = 1.0, 1e-6
#: What the in-memory peers' identity draws one value at a time is timed on (then extrapolated).
SLICE = 20_000


def _missing(name: str) -> bool:
    import importlib.util
    import sys

    if name not in sys.modules and importlib.util.find_spec(name) is None:
        print(f"  {name} is not installed (the optional bench extra): skipped", flush=True)
        return True
    return False


@functools.cache
def _gaussian_analytic() -> Any:
    """diffprivlib's ``GaussianAnalytic``. diffprivlib 0.6.6's package imports its models,
    which fail against scikit-learn 1.9; its mechanisms do not need them, so they are loaded
    without the package's ``__init__`` then (said once, on a printed line)."""
    import importlib.util
    import sys
    import types

    try:
        from diffprivlib.mechanisms import GaussianAnalytic
    except ImportError:
        found = importlib.util.find_spec("diffprivlib")
        assert found is not None and found.submodule_search_locations is not None
        for name in [k for k in sys.modules if k.startswith("diffprivlib")]:
            del sys.modules[name]
        pkg = types.ModuleType("diffprivlib")
        pkg.__path__ = list(found.submodule_search_locations)
        sys.modules["diffprivlib"] = pkg
        print("  diffprivlib: its mechanisms loaded without its models (scikit-learn)", flush=True)
        from diffprivlib.mechanisms import GaussianAnalytic
    return GaussianAnalytic


def _classic_sigma(sensitivity: float) -> float:
    """The classic Gaussian mechanism's sigma (valid for epsilon <= 1)."""
    return math.sqrt(2 * math.log(1.25 / DELTA)) * sensitivity / EPSILON


def _rel(released: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(released - exact) / np.linalg.norm(exact))


class Contender:
    """One contender: a name, whether it is floating-point safe (``numerics``: how the table
    says so, ``fp-safe`` or ``float`` by default), and ``run() -> released`` (``None`` when the
    release stays in a store: ``error()`` then reads it)."""

    def __init__(
        self,
        name: str,
        fp_safe: bool,
        run: Callable[[], Any],
        scale: float = 1.0,
        error: Callable[[], float] | None = None,
        exact: np.ndarray | None = None,
        numerics: str | None = None,
    ) -> None:
        self.name, self.fp_safe, self.run, self.scale = name, fp_safe, run, scale
        self.numerics = numerics or ("fp-safe" if fp_safe else "float")
        self._error, self._exact = error, exact
        self.times: list[float] = []
        self.err = float("nan")

    def once(self) -> None:
        t = time.perf_counter()
        out = self.run()
        self.times.append((time.perf_counter() - t) * self.scale)
        if self._error is not None:
            self.err = self._error()
        elif self._exact is not None and out is not None:
            self.err = _rel(np.asarray(out), self._exact)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


# -- covariance ----------------------------------------------------------------------------------
def _zarr_gram(store: str, out: str) -> np.ndarray:
    """numpy with the Zarr read: the store read chunk by chunk in one process, ``X X^T / N``
    with the classic Gaussian, written with zarr."""
    import zarr

    arr = zarr.open_array(store=store, path="X", mode="r")
    m, n = arr.shape
    step = arr.chunks[1]
    g = np.zeros((m, m))
    for a in range(0, n, step):
        c = np.asarray(arr[:, a : a + step])
        g += c @ c.T
    released = _noisy_symmetric(g, m) / n
    shutil.rmtree(out, ignore_errors=True)
    zarr.create_array(store=out, data=released, compressors=None)
    return released


def _noisy_symmetric(g: np.ndarray, m: int) -> np.ndarray:
    rng = np.random.default_rng()
    z = np.triu(rng.standard_normal(g.shape)) * _classic_sigma(float(m))
    return g + z + np.triu(z, 1).T


def _diffprivlib_gram(x: np.ndarray, m: int) -> np.ndarray:
    mech = _gaussian_analytic()(epsilon=EPSILON, delta=DELTA, sensitivity=float(m))
    g = x.T @ x
    out = np.empty_like(g)
    for i in range(m):
        for j in range(i, m):
            out[i, j] = out[j, i] = mech.randomise(float(g[i, j]))
    return out / x.shape[0]


def _opendp_mechanisms(m: int) -> tuple[Any, Callable[[np.ndarray], np.ndarray]]:
    """OpenDP's SSCP transformation and ``noisy(sscp) -> released X^T X`` (its Gaussian, zCDP
    converted to (epsilon, delta), on the upper triangle), calibrated once (untimed).

    ``make_np_sscp`` needs the ``idealized-numerics`` opt-in: OpenDP does not claim it safe
    under floating point."""
    import opendp.prelude as dp
    from opendp.extras.numpy._make_np_sscp import make_np_sscp

    dp.enable_features("contrib", "honest-but-curious", "idealized-numerics")
    space = dp.numpy.array2_domain(T=float, nan=False, num_columns=m, norm=math.sqrt(m), p=2)
    sscp = make_np_sscp(space, dp.symmetric_distance())
    iu = np.triu_indices(m)
    vec = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)

    def gaussian(scale: float) -> Any:
        g = dp.m.make_gaussian(*vec, scale=scale)
        return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(g), DELTA)

    mech = gaussian(dp.binary_search_param(gaussian, d_in=float(m), d_out=(EPSILON, DELTA)))

    def noisy(s: np.ndarray) -> np.ndarray:
        out = np.zeros((m, m))
        out[iu] = mech(s[iu].tolist())
        return out + np.triu(out, 1).T

    return sscp, noisy


def _opendp_gram(m: int) -> Callable[[np.ndarray], np.ndarray]:
    """OpenDP on data in memory: ``make_np_sscp`` of the ``N x m`` array, then its Gaussian."""
    sscp, noisy = _opendp_mechanisms(m)
    return lambda x: noisy(sscp(x)) / x.shape[0]


def _zarr_opendp_gram(store: str, out: str, m: int) -> Callable[[], np.ndarray]:
    """OpenDP with the Zarr read and write of numpy + Zarr: each chunk's records (rows, as
    ``make_np_sscp`` takes them) through its SSCP, the sums added, one Gaussian, written with
    zarr (uncompressed)."""
    sscp, noisy = _opendp_mechanisms(m)

    def run() -> np.ndarray:
        import zarr

        arr = zarr.open_array(store=store, path="X", mode="r")
        n, step = arr.shape[1], arr.chunks[1]
        g = np.zeros((m, m))
        for a in range(0, n, step):
            g += sscp(np.ascontiguousarray(np.asarray(arr[:, a : a + step]).T))
        released = noisy(g) / n
        shutil.rmtree(out, ignore_errors=True)
        zarr.create_array(store=out, data=released, compressors=None)
        return released

    return run


# -- identity ------------------------------------------------------------------------------------
def _zarr_identity(store: str, out: str) -> None:
    """numpy with the Zarr read and write: chunk by chunk, ``X + N(0, sigma^2)``."""
    import zarr

    src = zarr.open_array(store=store, path="X", mode="r")
    m, n = src.shape
    step = src.chunks[1]
    shutil.rmtree(out, ignore_errors=True)
    dst = zarr.create_array(
        store=out, shape=(m, n), chunks=(m, step), dtype="float64", compressors=None
    )
    sigma = _classic_sigma(math.sqrt(m))
    rng = np.random.default_rng()
    for a in range(0, n, step):
        c = np.asarray(src[:, a : a + step])
        dst[:, a : a + step] = c + sigma * rng.standard_normal(c.shape)


def _stored_error(out: str, path: str, exact: Callable[[int, int], np.ndarray]) -> float:
    """Relative error of a released store against ``exact(a, b)`` chunk by chunk."""
    import zarr

    arr = zarr.open_array(store=out, path=path, mode="r")
    num = den = 0.0
    step = arr.chunks[-1]
    for a in range(0, arr.shape[-1], step):
        e = exact(a, a + step)
        num += float(np.sum((np.asarray(arr[..., a : a + step]) - e) ** 2))
        den += float(np.sum(e**2))
    return math.sqrt(num / den)


def _per_value(draw: Callable[[list[float]], Any], values: np.ndarray) -> float:
    """Seconds per value of a one-value-at-a-time mechanism, on a slice (extrapolated)."""
    part = values.ravel()[:SLICE]
    t = time.perf_counter()
    draw(part.tolist())
    return (time.perf_counter() - t) / part.size


def _opendp_identity(m: int) -> Callable[[list[float]], Any]:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    vec = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float)

    def gaussian(scale: float) -> Any:
        g = dp.m.make_gaussian(*vec, scale=scale)
        return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(g), DELTA)

    return gaussian(  # type: ignore[no-any-return]
        dp.binary_search_param(gaussian, d_in=math.sqrt(m), d_out=(EPSILON, DELTA))
    )


def _diffprivlib_identity(m: int) -> Callable[[list[float]], Any]:
    mech = _gaussian_analytic()(epsilon=EPSILON, delta=DELTA, sensitivity=math.sqrt(m))
    return lambda values: [mech.randomise(v) for v in values]


# -- the run -------------------------------------------------------------------------------------
def _input(work: Path, client: Any, m: int, n: int) -> str:
    """The input store of ``n`` records and ``m`` features (~8 MiB chunks), written once."""
    import dask

    from mvg_dask.data import synthetic, write_matrix

    store = str(work / f"in-{m}-{n}.zarr")
    if not Path(store).exists():
        chunk = max(64, min(n, CHUNK_BYTES // (8 * m)))
        with dask.config.set(scheduler=client.get):
            write_matrix(synthetic(n, m, record_chunk=chunk), store, record_chunk=chunk)
    return store


def _product(client: Any, store: str, out: str, query: str) -> Callable[[], None]:
    from mvg_dask import api

    def run() -> None:
        shutil.rmtree(out, ignore_errors=True)
        Path(f"{out}.ledger.sqlite").unlink(missing_ok=True)
        api.release(spec(store, out, query), client=client, progress=False)

    return run


def covariance_contenders(
    client: Any, store: str, work: Path, args: argparse.Namespace
) -> list[Contender]:
    """The covariance contenders on one input (the exact ``X X^T / N`` computed untimed)."""
    import zarr

    arr = zarr.open_array(store=store, path="X", mode="r")
    m, n = arr.shape
    in_memory = m * n <= args.in_memory_max
    x = np.ascontiguousarray(np.asarray(arr[:]).T) if in_memory else None  # N x m, as peers take
    if x is not None:
        exact = x.T @ x / n
    else:
        exact = np.zeros((m, m))
        for a in range(0, n, arr.chunks[1]):
            c = np.asarray(arr[:, a : a + arr.chunks[1]])
            exact += c @ c.T
        exact /= n
    out = str(work / "out-covariance.zarr")
    listed = [
        Contender(
            "mvg_dask (warm)",
            True,
            _product(client, store, out, "covariance"),
            error=lambda: _rel(np.asarray(zarr.open_group(out, mode="r")["covariance"][:]), exact),
        ),
        Contender(
            "numpy + Zarr", False, lambda: _zarr_gram(store, str(work / "np-cov.zarr")), exact=exact
        ),
    ]
    if not _missing("opendp"):
        opendp_zarr = _zarr_opendp_gram(store, str(work / "odp-cov.zarr"), m)
        listed.append(Contender("OpenDP + Zarr", False, opendp_zarr, exact=exact, numerics="ideal"))
    if x is None:
        print(f"  in-memory peers skipped at {m * n:.1e} elements (--in-memory-max)", flush=True)
        return listed
    listed.append(
        Contender("numpy in memory", False, lambda: _noisy_symmetric(x.T @ x, m) / n, exact=exact)
    )
    if not _missing("diffprivlib"):
        listed.append(Contender("diffprivlib", False, lambda: _diffprivlib_gram(x, m), exact=exact))
    if not _missing("opendp"):
        opendp_gram = _opendp_gram(m)
        # not fp-safe: make_np_sscp needs OpenDP's idealized-numerics opt-in
        ideal = Contender("OpenDP", False, lambda: opendp_gram(x), exact=exact, numerics="ideal")
        listed.append(ideal)
    return listed


def identity_contenders(
    client: Any, store: str, work: Path, args: argparse.Namespace
) -> list[Contender]:
    """The identity contenders on one input."""
    import zarr

    arr = zarr.open_array(store=store, path="X", mode="r")
    m, n = arr.shape

    def exact(a: int, b: int) -> np.ndarray:
        return np.asarray(arr[:, a:b])

    out, np_out = str(work / "out-identity.zarr"), str(work / "np-id.zarr")
    listed = [
        Contender(
            "mvg_dask (warm)",
            True,
            _product(client, store, out, "identity"),
            error=lambda: _stored_error(out, "X", exact),
        ),
        Contender(
            "numpy + Zarr",
            False,
            lambda: _zarr_identity(store, np_out),
            error=lambda: _stored_error(np_out, "", exact),
        ),
    ]
    if m * n > args.in_memory_max:
        print(f"  in-memory peers skipped at {m * n:.1e} elements (--in-memory-max)", flush=True)
        return listed
    x = np.asarray(arr[:])
    sigma = _classic_sigma(math.sqrt(m))
    rng = np.random.default_rng()
    listed.append(
        Contender(
            "numpy in memory",
            False,
            lambda: x + sigma * rng.standard_normal(x.shape),
            exact=x,
        )
    )
    part = x.ravel()[:SLICE]
    for name, fp_safe, make in (
        ("diffprivlib", False, _diffprivlib_identity),
        ("OpenDP", True, _opendp_identity),
    ):
        if _missing(name.lower()):
            continue
        draw = make(m)
        listed.append(
            Contender(
                name,
                fp_safe,
                lambda draw=draw: np.asarray(draw(part.tolist())),
                scale=x.size / part.size,  # extrapolated to every value
                exact=part,
            )
        )
    return listed


def race(query: str, m: int, n: int, listed: list[Contender], repeats: int) -> None:
    """Run the contenders round-robin and print medians, errors and the ratios."""
    for _ in range(repeats):
        for c in listed:
            c.once()
    ours = listed[0]
    for c in listed:
        approx = "~" if c.scale != 1.0 else ""
        note = " (extrapolated)" if c.scale != 1.0 else ""
        print(
            f"{query:>10} {m:>4} {n:>9.1e} {c.name:>16} {c.numerics:>7} "
            f"{approx + format(c.median, '.3g'):>10} {c.median / ours.median:>8.2f}x "
            f"{ours.median / c.median:>8.2f} {c.err:>9.2e}{note}",
            flush=True,
        )


def main() -> None:
    from distributed import Client
    from distributed.diagnostics import MemorySampler

    from mvg_dask.engine.cluster import local_cluster

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--records", default="1e6,1e7", help="record counts N, comma-separated")
    p.add_argument("--cov-features", type=int, default=64)
    p.add_argument("--id-features", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="median of N interleaved runs")
    p.add_argument(
        "--in-memory-max",
        type=float,
        default=2e8,
        help="largest input (elements) the in-memory peers load (numpy, diffprivlib, OpenDP)",
    )
    p.add_argument("--queries", default="covariance,identity")
    p.add_argument(
        "--product-only",
        action="store_true",
        help="time the product alone (its peak memory per worker and its error)",
    )
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mvg-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = local_cluster(2, memory_limit="4GiB")
    client = Client(cluster)
    print(
        f"peers: (epsilon, delta) = ({EPSILON:g}, {DELTA:g}); median of {args.repeats} "
        "interleaved runs; the product warm on 2 workers x 1 thread; error = relative Frobenius"
    )
    print(
        f"{'query':>10} {'m':>4} {'N':>9} {'contender':>16} {'noise':>7} {'median s':>10} "
        f"{'/ ours':>9} {'ours /':>8} {'rel error':>9}",
        flush=True,
    )
    peaks: dict[str, list[tuple[int, float]]] = {}
    try:
        for query in args.queries.split(","):
            m = args.cov_features if query == "covariance" else args.id_features
            make = covariance_contenders if query == "covariance" else identity_contenders
            for n in (int(float(r)) for r in args.records.split(",")):
                store = _input(work, client, m, n)
                listed = make(client, store, work, args)[: 1 if args.product_only else None]
                sampler = MemorySampler()
                with sampler.sample(query, interval=0.1):
                    listed[0].once()  # the product once more, its memory sampled
                listed[0].times.pop()
                workers = len(client.scheduler_info()["workers"])
                peak = float(np.nanmax(sampler.to_pandas().to_numpy())) / workers / 2**20
                peaks.setdefault(query, []).append((m * n, peak))
                race(query, m, n, listed, args.repeats)
                if args.workdir is None:
                    shutil.rmtree(store, ignore_errors=True)
        for query, rows in peaks.items():
            shown = ", ".join(f"{el:.1e} elements: {mib:.0f} MiB" for el, mib in rows)
            print(f"peak memory per worker, {query}: {shown}", flush=True)
    finally:
        client.close()
        cluster.close()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
