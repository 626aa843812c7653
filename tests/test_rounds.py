"""Rounds: in-memory matrix releases of declared sensitivity, and training runs charged to the
ledger as one entry (docs/guide/rounds.md)."""

from __future__ import annotations

import itertools
import math
import uuid
from typing import Literal

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.pld.common import DifferentialPrivacyParameters
from scipy import stats

from mvg_dask import api
from mvg_dask.errors import BudgetError
from mvg_dask.ledger import open_ledger
from mvg_dask.plan.rounds import ROUND_CALIBRATIONS
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP, RoundsLoss, loss_from_json

SHAPE = (105, 12)  # the MGM paper's Adult gradient (its Table 2)
CLIP = 0.015  # the paper's Adult clip value
DELTA = 1e-5
#: significance of each chi-square test (seeded: the outcome is fixed)
ALPHA = 1e-3


def _gradient(seed: int, shape: tuple[int, int] = SHAPE) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2 * CLIP, 2 * CLIP, shape)  # half clipped


@pytest.mark.parametrize("calibration", ROUND_CALIBRATIONS)
def test_a_round_at_huge_epsilon_equals_the_clipped_input(calibration: str) -> None:
    x = _gradient(0, (6, 4))
    out = api.release_round(
        x, epsilon=1e15, delta=DELTA, calibration=calibration, clip=CLIP, seed=1
    )
    assert out.plan.std.max() < 2e-6 * CLIP
    np.testing.assert_allclose(out.values, np.clip(x, -CLIP, CLIP), rtol=0, atol=1e-5 * CLIP)


def test_a_frobenius_round_at_huge_epsilon_equals_the_input_inside_its_ball() -> None:
    x = _gradient(2, (5, 3))
    r = float(np.linalg.norm(x))
    inside = api.release_round(x, epsilon=1e15, delta=DELTA, calibration="exact", frobenius=r)
    np.testing.assert_allclose(inside.values, x, rtol=0, atol=1e-5 * r)
    half = api.release_round(x, epsilon=1e15, delta=DELTA, calibration="mgm", frobenius=r / 2)
    np.testing.assert_allclose(half.values, x / 2, rtol=0, atol=1e-5 * r)


@pytest.mark.parametrize("calibration", ROUND_CALIBRATIONS)
def test_each_rounds_noise_follows_its_plans_law(calibration: str) -> None:
    """sum((Y - f) / std)^2 over the m n entries of a round is chi-square(mn) when the noise
    has the plan's law (the rounded Gaussian adds 2^2k / 12 to a unit variance: negligible);
    two-sided at ALPHA for each of 3 rounds of a run, seeded."""
    allocation = (
        {"binary": {"important": list(range(10)), "share": 0.8}}
        if calibration not in ("gaussian", "mgm-idn")
        else None
    )
    run = api.training_run(
        shape=SHAPE,
        rounds=3,
        epsilon=4.0,
        delta=DELTA,
        calibration=calibration,
        clip=CLIP,
        allocation=allocation,
        seed=7,
    )
    lo, hi = stats.chi2.ppf([ALPHA / 2, 1 - ALPHA / 2], math.prod(SHAPE))
    with run:
        for i in range(3):
            x = np.clip(_gradient(10 + i), -CLIP, CLIP)
            z = (run.release(x) - x) / run.plan.std
            assert lo < float(np.sum(z * z)) < hi, (calibration, i)
            assert abs(float(z.mean())) < 4 / math.sqrt(z.size)


def _ledger_epsilon(calibration: str, q: float) -> tuple[float, RoundsLoss]:
    name = f"rounds-{uuid.uuid4().hex[:8]}"
    with open_ledger(f"memory://{name}") as book:
        neighbours: Literal["add-remove", "replace-one"] = "add-remove" if q < 1 else "replace-one"
        book.ensure_dataset("adult", 3.0, DELTA, neighbours)
        with api.training_run(
            shape=SHAPE,
            rounds=10,
            epsilon=2.0,
            delta=DELTA,
            calibration=calibration,
            clip=CLIP,
            sampling_probability=q,
            ledger=book,
            dataset="adult",
        ) as run:
            for i in range(10):
                run.release(_gradient(i))
        (entry,) = book.releases("adult")
        assert entry.status == "committed"
        (summary,) = book.summary()
        loss = entry.charge
        assert isinstance(loss, RoundsLoss)
        return float(summary["spent"]["epsilon"]), loss


@pytest.mark.parametrize("q", [1.0, 0.05])
def test_the_ledger_total_of_a_gaussian_run_is_dp_accountings_pld(q: float) -> None:
    """Independent check: dp-accounting's own accountant on the DpEvents of the 10 rounds."""
    spent, loss = _ledger_epsilon("exact", q)
    inner = loss.round()
    assert isinstance(inner, GaussianDP)
    event = dp_event.GaussianDpEvent(1.0 / inner.mu)
    if q < 1:
        event = dp_event.PoissonSampledDpEvent(q, event)
    accountant = PLDAccountant()
    accountant.compose(dp_event.SelfComposedDpEvent(event, 10))
    assert spent == pytest.approx(accountant.get_epsilon(DELTA), abs=1e-6)
    assert 1.99 < spent <= 2.0


@pytest.mark.parametrize("q", [1.0, 0.05])
def test_the_ledger_total_of_an_idn_run_is_dp_accountings_pld(q: float) -> None:
    """An (epsilon, delta) round (the theorem's statement), amplified by Poisson sampling as
    (log(1 + q(e^eps - 1)), q delta) (Balle et al. 2018, Thm. 8), composed 10 times by
    dp-accounting."""
    spent, loss = _ledger_epsilon("mgm-idn", q)
    inner = loss.round()
    assert isinstance(inner, ApproxDP)
    eps, delta = inner.epsilon, inner.delta
    if q < 1:
        eps, delta = math.log(1 + q * (math.exp(eps) - 1)), q * delta
    one = pld.from_privacy_parameters(DifferentialPrivacyParameters(eps, delta))
    expected = one.self_compose(10).get_epsilon_for_delta(DELTA)
    assert spent == pytest.approx(expected, abs=1e-6)
    assert 1.98 < spent <= 2.0


def test_a_run_over_budget_is_refused_before_round_1_and_nothing_is_charged() -> None:
    name = f"rounds-{uuid.uuid4().hex[:8]}"
    with open_ledger(f"memory://{name}") as book:
        book.ensure_dataset("adult", 1.0, DELTA)
        with pytest.raises(BudgetError, match="would be exceeded") as info:
            api.training_run(
                shape=SHAPE,
                rounds=10,
                epsilon=1.5,
                delta=DELTA,
                clip=CLIP,
                ledger=book,
                dataset="adult",
            )
        assert "\n" not in str(info.value)
        assert book.releases("adult") == []
        # what fits is charged in full before round 1, and a later run no longer fits
        run = api.training_run(
            shape=SHAPE, rounds=10, epsilon=0.8, delta=DELTA, clip=CLIP, ledger=book,
            dataset="adult",
        )  # fmt: skip
        (entry,) = book.releases("adult")
        assert entry.status == "pending" and run.done == 0
        assert loss_from_json(entry.public()["loss"]) == run.loss
        with pytest.raises(BudgetError):
            api.training_run(
                shape=SHAPE, rounds=2, epsilon=0.5, delta=DELTA, clip=CLIP, ledger=book,
                dataset="adult",
            )  # fmt: skip
        run.close(RuntimeError("stopped before round 1"))  # no round: refunded
        assert book.releases("adult") == []


def test_a_run_that_fails_after_a_round_stays_charged() -> None:
    name = f"rounds-{uuid.uuid4().hex[:8]}"
    with open_ledger(f"memory://{name}") as book:
        book.ensure_dataset("adult", 1.0, DELTA)
        with pytest.raises(ValueError, match="105 x 12"):
            with api.training_run(
                shape=SHAPE, rounds=3, epsilon=1.0, delta=DELTA, clip=CLIP, ledger=book,
                dataset="adult",
            ) as run:  # fmt: skip
                run.release(_gradient(0))
                run.release(np.zeros((3, 3)))
        (entry,) = book.releases("adult")
        assert entry.status == "aborted"


def test_a_refunded_run_releases_no_round() -> None:
    """A run that ended before round 1 is refunded (its ledger entry cancelled): a round
    released by it afterwards would be charged to nothing, so it is refused, and nothing is
    charged; a run that ended normally releases nothing more either."""
    name = f"rounds-{uuid.uuid4().hex[:8]}"
    with open_ledger(f"memory://{name}") as book:
        book.ensure_dataset("adult", 1.0, DELTA)
        run = api.training_run(
            shape=SHAPE, rounds=3, epsilon=0.8, delta=DELTA, clip=CLIP, ledger=book,
            dataset="adult",
        )  # fmt: skip
        run.close(RuntimeError("stopped before round 1"))  # refunded
        assert book.releases("adult") == []
        with pytest.raises(ValueError, match="this run has ended"):
            run.release(_gradient(0))
        assert run.done == 0 and book.releases("adult") == []
    with api.training_run(shape=(2, 2), rounds=3, epsilon=1.0, delta=DELTA, clip=1.0) as done:
        done.release(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="this run has ended"):
        done.release(np.zeros((2, 2)))


def test_spend_per_round_grows_to_the_total() -> None:
    run = api.training_run(shape=(4, 3), rounds=5, epsilon=2.0, delta=DELTA, clip=1.0, seed=0)
    spent = [run.spent_epsilon(k) for k in range(6)]
    assert spent[0] == 0.0 and all(a < b for a, b in itertools.pairwise(spent))
    assert spent[-1] == pytest.approx(run.loss.approx_dp().epsilon) and spent[-1] <= 2.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip": 1.0, "frobenius": 1.0}, "exactly one of clip"),
        ({}, "exactly one of clip"),
        ({"clip": -1.0}, "clip must be a finite number > 0"),
        ({"frobenius": 1.0, "calibration": "mgm-idn"}, "needs the entry range"),
        ({"clip": 1.0, "calibration": "mvg-thm3"}, "does not apply to a round"),
        ({"clip": 1.0, "calibration": "gaussian", "allocation": {"binary": {}}}, "no allocation"),
        ({"clip": 1.0, "allocation": "max-pnr"}, "allocation must be"),
        ({"clip": 1.0, "epsilon": 0.0}, "epsilon"),
    ],
)
def test_bad_input_is_one_line(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"epsilon": 1.0, "delta": DELTA, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=message) as info:
        api.release_round(np.zeros((3, 2)), **args)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (np.zeros(3), "2-d matrix"),
        (np.full((2, 2), np.nan), "finite"),
        ([["a"]], "numeric matrix"),
    ],
)
def test_bad_matrices_are_refused(values: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        api.release_round(values, epsilon=1.0, delta=DELTA, clip=1.0, seed=0)


def test_a_run_refuses_a_round_too_many_and_a_seed_in_a_ledger() -> None:
    with api.training_run(shape=(2, 2), rounds=1, epsilon=1.0, delta=DELTA, clip=1.0) as run:
        run.release(np.zeros((2, 2)))
        with pytest.raises(ValueError, match="all its 1 rounds"):
            run.release(np.zeros((2, 2)))
    with open_ledger(f"memory://rounds-{uuid.uuid4().hex[:8]}") as book:
        book.ensure_dataset("d", 1.0, DELTA)
        with pytest.raises(Exception, match="seeded"):
            api.training_run(
                shape=(2, 2), rounds=1, epsilon=1.0, delta=DELTA, clip=1.0, seed=3,
                ledger=book, dataset="d",
            )  # fmt: skip
        assert book.releases("d") == []


def test_a_dask_matrix_is_released_from_memory() -> None:
    da = pytest.importorskip("dask.array")
    x = _gradient(4, (8, 5))
    a = api.release_round(da.from_array(x, chunks=(4, 5)), epsilon=1.0, delta=DELTA, clip=CLIP,
                          seed=5)  # fmt: skip
    b = api.release_round(x, epsilon=1.0, delta=DELTA, clip=CLIP, seed=5)
    np.testing.assert_array_equal(a.values, b.values)  # same key, same bytes


def test_a_runs_round_i_is_tile_i_of_its_key() -> None:
    """The run's repositioned generator gives the bytes of the key's own tile generator."""
    from mvg_dask.engine.rounds import noisy_round

    run = api.training_run(shape=(30, 7), rounds=3, epsilon=1.0, delta=DELTA, clip=1.0, seed=9)
    xs = [_gradient(20 + i, (30, 7)) for i in range(3)]
    out = [run.release(x) for x in xs]
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(out[i], noisy_round(x, run.plan, run._key, tile=i))
    assert not np.array_equal(out[0] - xs[0], out[1] - xs[1])


def test_what_a_round_publishes_besides_its_values_does_not_depend_on_the_data() -> None:
    """Neighbouring inputs (one entry changed): the same plan, byte for byte."""
    x = _gradient(30, (6, 4))
    y = x.copy()
    y[2, 1] = -y[2, 1]
    for calibration in ROUND_CALIBRATIONS:
        a = api.release_round(x, epsilon=1.0, delta=DELTA, calibration=calibration, clip=CLIP)
        b = api.release_round(y, epsilon=1.0, delta=DELTA, calibration=calibration, clip=CLIP)
        assert repr(a.plan.to_dict()) == repr(b.plan.to_dict())
