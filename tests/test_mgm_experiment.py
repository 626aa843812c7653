"""``mvg-dask experiments mgm``: the MGM paper's federated-learning experiments on rounds
(docs/guide/mgm-experiments.md)."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("mvg_dask_lab")
pytest.importorskip("sklearn")

from mvg_dask_lab.experiments.cli import experiments
from mvg_dask_lab.experiments.fl import (
    PackedMLP,
    load_ctg_binary,
    load_digits_dataset,
)


def test_the_quick_grid_runs_in_the_suite_and_writes_its_tables(tmp_path: Path) -> None:
    start = time.perf_counter()
    out = CliRunner().invoke(experiments, ["mgm", "--quick", "--out", str(tmp_path)])
    elapsed = time.perf_counter() - start
    assert out.exit_code == 0, out.output
    assert elapsed < 120, f"--quick took {elapsed:.0f} s"
    rows = list(csv.DictReader(io.StringIO((tmp_path / "mgm.csv").read_text())))
    mechanisms = {r["mechanism"] for r in rows}
    assert mechanisms == {
        "non-private",
        "gaussian",
        "exact",
        "mvg",
        "mgm",
        "udn",
        "idn",
        "gaussian-per-element",
    }
    assert {r["setting"] for r in rows} == {"type-I-ctg", "type-II-ctg"}
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)
    text = (tmp_path / "mgm.md").read_text()
    assert "mvg-dask experiments mgm --quick" in text
    assert "IDN best overall" in text and "Gaussian above MVG" in text
    assert "per element" in text
    assert (tmp_path / "mgm.png").stat().st_size > 1000


def test_the_same_privacy_rows_order_their_noise_as_their_theorems() -> None:
    """At the same total (epsilon, delta), the i.i.d. analytic Gaussian's noise is the
    smallest, then IDN, UDN, MGM Thm. 1 and MVG Thm. 2 (each theorem's bound is looser)."""
    from mvg_dask_lab.experiments.mgm import _private_upload, default_settings

    setting = default_settings(quick=True)[0]
    std = {m: _private_upload(setting, m, 10.0, 0)[1] for m in ("gaussian", "idn", "udn", "mgm")}
    assert std["gaussian"] < std["idn"] < std["udn"] < std["mgm"]


def test_quick_belongs_to_mgm(tmp_path: Path) -> None:
    out = CliRunner().invoke(experiments, ["regression", "--quick", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "--quick goes with mgm" in out.output


@pytest.mark.parametrize("classes", [2, 10])
def test_the_hand_written_gradient_matches_finite_differences(classes: int) -> None:
    rng = np.random.default_rng(0)
    model = PackedMLP(d=5, h=3, K=classes)
    P = model.init(rng)
    X, y = rng.uniform(0, 1, (7, 5)), rng.integers(0, classes, 7)

    def loss(Q: np.ndarray) -> float:
        H = np.tanh(np.hstack([X, np.ones((7, 1))]) @ Q[:6, :3])
        z = np.hstack([H, np.ones((7, 1))]) @ Q[6:, :].T
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(7), y].mean())

    G = model.gradient(P, X, y)
    for i, j in [(0, 0), (5, 2), (6, 1), (6 + classes - 1, 3)]:
        E = np.zeros_like(P)
        E[i, j] = 1e-6
        assert G[i, j] == pytest.approx((loss(P + E) - loss(P - E)) / 2e-6, rel=1e-5, abs=1e-9)
    assert np.all(G[:6, 3] == 0)  # the structural zeros


def test_the_stand_in_data_sets_and_their_sizes() -> None:
    ctg, digits = load_ctg_binary(), load_digits_dataset()
    assert (ctg.X.shape, ctg.X_test.shape) == ((1488, 21), (638, 21))
    assert (digits.X.shape, digits.X_test.shape) == ((1258, 64), (539, 64))
    assert 0.2 < ctg.y.mean() < 0.25  # NSP != 1, as Adult's >50K share (24 %)
    assert ctg.X.min() >= 0 and ctg.X.max() <= 1 and digits.X.max() <= 1
