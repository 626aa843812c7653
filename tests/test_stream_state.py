"""A stream's curator-side state (docs/guide/streams.md, "What is curator-side"): what it keeps
after ``t`` periods for each factorization, measured in its book and checked against the
formula the docs' table extrapolates; the banded square root (spec, dry run, values); the
limit's refusal; format 1's state still loads, an unknown format is refused."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.engine.stream_book import FileStreamBook
from mvg_dask.engine.stream_carry import decode_arrays, state_payload
from mvg_dask.errors import DataError, ReleaseError
from mvg_dask.plan.stream import last_uses, peak_state_arrays, state_arrays
from mvg_dask.privacy.continual import Factorization, ToeplitzFactorization, make_factorization
from mvg_dask.spec import ReleaseSpec
from tests.pipeline_helpers import make_input
from tests.test_streams import SEED, M, run_periods, stream_spec

SIZES = [20, 45, 45, 70, 90, 130, 150, 200]


def _book(root: Path) -> FileStreamBook:
    return FileStreamBook.beside(str(root / "out"))


def _numpy_state_arrays(f: Factorization, t: int) -> int:
    """Independently: the tree's open nodes by walking its levels, the outputs some later
    decoder row (numpy's ``B = A C⁻¹`` for the square root) uses, the windows."""
    T = f.horizon
    if isinstance(f, ToeplitzFactorization):
        if f.band is not None:
            return 2 * min(t, f.band - 1) + 1
        C = np.array(
            [[f.coefficients[i - j] if i >= j else 0 for j in range(T)] for i in range(T)],
            dtype=float,
        )
        B = np.tril(np.ones((T, T))) @ np.linalg.inv(C)
        used = sum(1 for s in range(t) if np.any(B[t:, s] != 0))
        return min(t, T - 1) + used
    opened = sum(
        1 for lvl in range(1, T.bit_length()) if t % 2**lvl and (t // 2**lvl + 1) * 2**lvl <= T
    )
    return opened + f.n_outputs(t)  # Honaker's decoder: every released node, until T


@pytest.mark.parametrize(
    "stream", [{"factorization": "tree"}, {"factorization": "square-root"}, {"band": 4}]
)
def test_state_after_8_periods_has_the_documented_size(
    stream: dict[str, Any], tmp_path: Path, client: Any
) -> None:
    """8 periods of a 16-period covariance stream (add-remove: the noisy count too): the
    arrays in the book are ``state_arrays(f, 8)`` arrays of ``m x m`` int64/float64 plus as
    many count scalars; the containers add at most 1 KiB a part."""
    rng = np.random.default_rng(3)
    X = rng.uniform(0.0, 1.0, (M, SIZES[-1]))
    spec = stream_spec(tmp_path, "covariance", **stream)
    spec["privacy"]["epsilon"] = 1e7
    released = run_periods(tmp_path, spec, X, SIZES, client)
    f = make_factorization("banded", 16, band=4) if "band" in stream else None
    f = f or make_factorization(stream["factorization"], 16)
    kept = state_arrays(f, 8)
    assert kept == _numpy_state_arrays(f, 8)
    assert state_payload(_book(tmp_path), "nightly") == kept * (M * M + 1) * 8
    files = [p for p in (tmp_path / "out.stream-state").glob("p*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= kept * (M * M + 1) * 8 + 1024 * len(files)
    # the values are right (epsilon = 1e7), the banded decoder's recursion included
    n = SIZES[-1]
    got = np.asarray(released[-1]["covariance"].values)
    std = float(released[-1].mvg.noise_std("covariance").max())
    np.testing.assert_allclose(got, X @ X.T / n, rtol=0, atol=6 * std + 1e-12)


def test_the_state_formula_for_a_year_of_nights() -> None:
    """The docs' table: arrays kept at their peak for T = 365, checked against numpy."""
    tree = make_factorization("tree", 365)
    sqrt = make_factorization("square-root", 365)
    banded = ToeplitzFactorization(365, band=32)
    for f in (tree, banded):
        for t in (1, 2, 31, 255, 256, 364):
            assert state_arrays(f, t) == _numpy_state_arrays(f, t)
    assert [state_arrays(sqrt, t) for t in (1, 100, 364, 365)] == [2, 200, 728, 0]
    assert set(last_uses(tree)) == {365}  # Honaker's decoder uses every node until T
    assert (peak_state_arrays(tree), peak_state_arrays(sqrt), peak_state_arrays(banded)) == (
        723,
        728,
        63,
    )


def _spec_error(**stream: Any) -> str:
    data = stream_spec(Path("/tmp"), "covariance", **stream)
    with pytest.raises(ValueError) as err:
        ReleaseSpec.model_validate(data)
    return str(err.value)


def test_the_spec_validates_the_band() -> None:
    assert "drop it for the tree" in _spec_error(factorization="tree", band=8)
    assert "exceeds the horizon" in _spec_error(band=17)
    assert "band" in _spec_error(band=1)
    spec = ReleaseSpec.model_validate(stream_spec(Path("/tmp"), "covariance", band=8))
    assert spec.stream is not None and spec.stream.band == 8


def test_dry_run_names_the_band_and_the_state_and_refuses_above_the_limit(
    tmp_path: Path,
) -> None:
    """m = 2,000 at T = 365: the full square root's state (21.7 GiB) is refused with the remedy;
    ``band: 32`` keeps 1.9 GiB and its dry run says so."""
    make_input(tmp_path / "in.zarr", np.full((2000, 4), 0.5), chunk=4)
    spec = stream_spec(tmp_path, "covariance", horizon=365)
    spec["privacy"]["epsilon"] = 1.0
    with pytest.raises(DataError, match=r"21\.7 GiB.*stream\.band: 32 .*1\.9 GiB.*4\.77x"):
        api.stream_dry_run(spec)
    spec["stream"]["band"] = 32
    text = api.stream_dry_run(spec).text
    assert '"factorization": "banded"' in text and '"band": 32' in text
    assert "curator-side state: up to 1.9 GiB (63 arrays" in text


def _to_format_one(state: Path, periods: int) -> None:
    """Rewrite a square-root stream's format-2 state as format 1 (one ``arrays`` part)."""
    for t in range(1, periods + 1):
        inc = decode_arrays((state / f"p{t:04d}.increment").read_bytes())
        out = decode_arrays((state / f"p{t:04d}.outputs").read_bytes())
        buf = io.BytesIO()
        np.savez(
            buf,
            increment=inc["release"],
            outputs=out["release"],
            count=inc["count"],
            count_outputs=out["count"],
        )
        for p in state.glob(f"p{t:04d}.*"):
            p.unlink()
        (state / f"p{t:04d}.arrays").write_bytes(buf.getvalue())


def test_format_one_state_still_loads_and_an_unknown_format_is_refused(
    tmp_path: Path, client: Any
) -> None:
    """A stream whose first periods were committed in format 1 releases its next period with
    the same bytes; a state of an unknown format is refused, nothing written."""
    X = np.random.default_rng(4).uniform(0.0, 1.0, (M, 90))
    ref, old = tmp_path / "ref", tmp_path / "old"
    for root in (ref, old):
        root.mkdir()
        run_periods(root, stream_spec(root), X, [20, 45, 70], client)
    _to_format_one(old / "out.stream-state", 3)
    for root in (ref, old):
        run_periods(root, stream_spec(root), X, [90], client)
    for p in (ref / "out" / "period-0004").rglob("*"):
        if p.is_file():
            assert (old / p.relative_to(ref)).read_bytes() == p.read_bytes(), p
    (old / "out.stream-state" / "p0004.format").write_bytes(b"9")
    shutil.rmtree(old / "out" / "period-0005", ignore_errors=True)
    with pytest.raises(ReleaseError, match=r"period 4's state has format '9'.*new stream"):
        run_periods(old, stream_spec(old), X, [90], client, seed=SEED)
    assert not (old / "out" / "period-0005").exists()
