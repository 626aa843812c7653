"""Budget messages that say what is spent and what is left, and refusals that say why.

* ``ledger show`` states a Gaussian-DP (or PLD) spend as epsilon *at the budget's delta*: the
  budget's whole delta is not "spent" by one release (it used to read ``delta=1e-05``, as if used
  up);
* a release whose (epsilon, delta) alone exceeds its dataset's budget is refused when the spec is
  validated (exit 2, one line, nothing charged), naming the composition that decides;
* the dry run's budget line says ``refused: ...`` whenever the release would be refused: a spec
  whose budget is not the registered one, or a release that does not fit what is left.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mvg_dask.ledger import open_ledger
from mvg_dask.privacy.accounting import GaussianDP, GaussianDPAccountant
from mvg_dask.privacy.calibration import analytic_gaussian_epsilon, analytic_gaussian_mu
from tests.pipeline_helpers import data, make_input, run_cli, spec_dict, write_spec


@pytest.fixture
def store(tmp_path: Path) -> str:
    return make_input(tmp_path / "in.zarr", data(3, 200, seed=4), chunk=100)


def _spec(tmp_path: Path, store: str, **privacy: object) -> Path:
    ledger = {
        "path": str(tmp_path / "l.sqlite"),
        "dataset": "d",
        "budget": {"epsilon": 3.0, "delta": 1e-5},
    }
    spec = spec_dict(
        store,
        str(tmp_path / "out.zarr"),
        query="covariance",
        ledger=ledger,
        privacy={"epsilon": 1.0, "delta": 1e-6, **privacy},
    )
    return write_spec(tmp_path / "s.yaml", spec)


def test_ledger_show_states_the_spend_at_the_budgets_delta(tmp_path: Path, store: str) -> None:
    spec = _spec(tmp_path, store)
    assert run_cli(tmp_path, "release", str(spec), "--quiet").returncode == 0
    shown = run_cli(tmp_path, "ledger", "show", "--ledger", str(tmp_path / "l.sqlite"))
    line = shown.stdout.splitlines()[0]
    # independent: one exact release's mu, stated as epsilon at the budget's delta
    eps = analytic_gaussian_epsilon(analytic_gaussian_mu(1.0, 1e-6), 1e-5)
    assert f"spent epsilon={eps:.4g} at the budget's delta (gaussian-dp" in line, line
    assert f"left epsilon={3.0 - eps:.4g} at the budget's delta" in line, line
    assert "delta=shared" not in shown.stdout and "spent epsilon=0.8725 delta=" not in line


@pytest.mark.parametrize(
    ("calibration", "message"),
    [
        ("exact", "a Gaussian mechanism (mu = "),
        ("mvg-thm2", "privacy.delta (0.5) exceeds the dataset's whole ledger.budget.delta"),
    ],
)
def test_a_release_that_alone_exceeds_the_budget_is_refused_at_validation(
    tmp_path: Path, store: str, calibration: str, message: str
) -> None:
    spec = _spec(tmp_path, store, delta=0.5)
    text = spec.read_text().replace("calibration: exact", f"calibration: {calibration}")
    spec.write_text(text)
    for args in (["--dry-run"], ["--quiet"]):
        run = run_cli(tmp_path, "release", str(spec), *args)
        assert run.returncode == 2, run.stderr
        assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "l.sqlite").exists() and not (tmp_path / "out.zarr").exists()


def test_the_gaussian_refusal_is_the_accountants_decision() -> None:
    """The rule the validation applies, checked against the closed form: a Gaussian mechanism
    at (1, 0.5) spends far more than 3 at delta = 1e-5, one at (1, 1e-6) fits."""
    for delta, fits in ((0.5, False), (1e-6, True)):
        mu = analytic_gaussian_mu(1.0, delta)
        spent = GaussianDPAccountant().total([GaussianDP.calibrated(1.0, delta)], 1e-5)
        assert spent.epsilon == pytest.approx(analytic_gaussian_epsilon(mu, 1e-5), rel=1e-9)
        assert spent.fits(3.0, 1e-5) is fits


def test_the_dry_run_says_refused_for_another_registered_budget(tmp_path: Path, store: str) -> None:
    with open_ledger(tmp_path / "l.sqlite") as book:
        book.ensure_dataset("d", 5.0, 1e-5)
    run = run_cli(tmp_path, "release", str(_spec(tmp_path, store)), "--dry-run")
    assert run.returncode == 1, run.stderr
    (budget,) = [x for x in run.stdout.splitlines() if x.strip().startswith("budget")]
    assert "refused: ledger.budget: dataset 'd' is registered with epsilon=5" in budget, budget


def test_the_dry_run_says_refused_when_the_release_does_not_fit(tmp_path: Path, store: str) -> None:
    spec = _spec(tmp_path, store, epsilon=2.9)
    assert run_cli(tmp_path, "release", str(spec), "--quiet").returncode == 0
    (tmp_path / "s.yaml").write_text(
        (tmp_path / "s.yaml").read_text().replace(str(tmp_path / "out.zarr"), str(tmp_path / "o2"))
    )
    run = run_cli(tmp_path, "release", str(spec), "--dry-run")
    assert run.returncode == 1, run.stderr
    (budget,) = [x for x in run.stdout.splitlines() if x.strip().startswith("budget")]
    assert "refused: this release (epsilon = 2.9) would exceed the budget" in budget, budget
