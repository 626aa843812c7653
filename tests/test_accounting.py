"""Privacy loss as a typed value, and the accountants (mvg_dask.privacy.accounting), checked
against dp-accounting and closed forms computed here; and the in-memory ledger."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy.optimize import brentq
from scipy.stats import norm

from mvg_dask.errors import BudgetError
from mvg_dask.ledger import Guarantee, convert_neighbours, open_ledger, spending, summary_text
from mvg_dask.ledger.location import parse_location
from mvg_dask.ledger.memory import forget
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy.accounting import (
    LOSS_TYPES,
    ZCDP,
    Accountant,
    ApproxDP,
    BasicAccountant,
    GaussianDP,
    GaussianDPAccountant,
    LedgerAccountant,
    PLDAccountant,
    PLDLoss,
    PrivacyLoss,
    Spent,
    loss_from_json,
    loss_to_json,
)
from mvg_dask.privacy.registry import CALIBRATIONS, get_calibration

LOSSES: list[PrivacyLoss] = [
    ApproxDP(0.7, 1e-7),
    GaussianDP.calibrated(1.0, 1e-6),
    ZCDP(0.05, 1e-6),
    PLDLoss("laplace", 2.0, 1.0, 1e-6),
    PLDLoss("gaussian", 3.0, 1.0, 1e-6, sampling_probability=0.1),
]


@pytest.mark.parametrize("loss", LOSSES, ids=lambda x: x.tag)
def test_a_loss_is_one_json_value_with_a_type_tag(loss):
    text = loss_to_json(loss)
    data = json.loads(text)
    assert data["type"] == loss.tag and LOSS_TYPES[loss.tag] is type(loss)
    assert loss_from_json(text) == loss  # floats round-trip exactly
    assert loss_from_json(data) == loss


def test_an_unknown_or_incomplete_loss_is_refused():
    with pytest.raises(ValueError, match="unknown type 'rdp'; known types are approx-dp"):
        loss_from_json('{"type": "rdp", "alpha": 2}')
    with pytest.raises(ValueError, match="of type 'gaussian-dp'"):
        loss_from_json('{"type": "gaussian-dp", "mu": 1.0}')
    with pytest.raises(ValueError, match="mu must be a finite number > 0"):
        GaussianDP(-1.0, 1.0, 1e-6)


@pytest.mark.parametrize("name", CALIBRATIONS)
def test_each_calibration_produces_its_loss(name):
    rule = get_calibration(name)
    loss = rule.loss(1.0, 1e-6)
    if name == "exact":  # a Gaussian mechanism after whitening
        assert loss == GaussianDP(cal.analytic_gaussian_mu(1.0, 1e-6), 1.0, 1e-6)
        # its calibration point lies on its curve
        assert cal.analytic_gaussian_delta(1.0, loss.mu) == pytest.approx(1e-6, rel=1e-6)
    else:
        assert loss == ApproxDP(1.0, 1e-6)
    assert loss.approx_dp() == ApproxDP(1.0, 1e-6)


def _gauss_delta(eps: float, mu: float) -> float:
    """delta of mu-GDP at eps (Dong, Roth & Su 2022, Cor. 2.13), by scipy here."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def test_an_approximate_and_a_gaussian_release_compose_as_dp_accounting_says():
    """A paper release (1.0, 1e-6)-DP and an exact release with mu: the PLD accountant's total
    equals dp-accounting's own composition built here, and both lie within 1 % above the tight
    closed form of the mix (Kairouz-Oh-Viswanath's four outcomes against N(mu^2/2, mu^2))."""
    eps0, delta0, budget_delta = 1.0, 1e-6, 1e-5
    gauss = get_calibration("exact").loss(1.0, 1e-6)
    approx = get_calibration("mvg-thm2").loss(eps0, delta0)
    assert isinstance(gauss, GaussianDP)
    total = PLDAccountant().total([approx, gauss], budget_delta)

    direct = pld_lib.from_privacy_parameters(
        dp_accounting.pld.common.DifferentialPrivacyParameters(eps0, delta0),
        value_discretization_interval=1e-4,
    ).compose(
        pld_lib.from_gaussian_mechanism(
            1.0 / gauss.mu, sensitivity=1.0, value_discretization_interval=1e-4
        )
    )
    assert total.epsilon == pytest.approx(direct.get_epsilon_for_delta(budget_delta), rel=1e-9)

    p_plus = math.exp(eps0) / (1 + math.exp(eps0))

    def closed_form(eps: float) -> float:
        return delta0 + (1 - delta0) * (
            p_plus * _gauss_delta(eps - eps0, gauss.mu)
            + (1 - p_plus) * _gauss_delta(eps + eps0, gauss.mu)
        )

    tight = brentq(lambda e: closed_form(e) - budget_delta, 0.0, 10.0)
    assert tight <= total.epsilon <= tight * 1.01
    # the ledger's rule reports the PLD total (well below the basic sum 2) and admits it
    ledger = LedgerAccountant().total([approx, gauss], budget_delta)
    assert (ledger.composition, ledger.epsilon) == ("pld", total.epsilon) and ledger.epsilon < 2
    assert ledger.fits(total.epsilon * 1.001, budget_delta)
    assert not ledger.fits(tight * 0.99, budget_delta)


def test_basic_and_gaussian_accountants():
    a, b = ApproxDP(0.5, 1e-6), ApproxDP(0.25, 2e-6)
    s = BasicAccountant().total([a, b], 1e-5)
    assert (s.composition, s.epsilon, s.delta) == ("basic", 0.75, 3e-6)
    assert s.fits(0.75, 3e-6) and not s.fits(0.74, 1e-5) and not s.fits(1.0, 2e-6)
    g1, g2 = GaussianDP.calibrated(1.0, 1e-6), GaussianDP.calibrated(0.5, 1e-6)
    gdp = GaussianDPAccountant()
    assert gdp.applies([g1, g2]) and not gdp.applies([g1, a]) and not gdp.applies([])
    t = gdp.total([g1, g2], 1e-5)
    assert t.mu == pytest.approx(math.hypot(g1.mu, g2.mu), rel=1e-15)
    assert _gauss_delta(t.epsilon, t.mu) == pytest.approx(1e-5, rel=1e-6)
    assert gdp.spent_epsilon([g1, g2], 1e-5) == t.epsilon
    assert gdp.fits([g1, g2], t.epsilon * 1.0001, 1e-5)
    assert not gdp.fits([g1, g2], t.epsilon * 0.999, 1e-5)
    # basic composition of Gaussian losses sums their calibration points
    assert BasicAccountant().total([g1, g2], 1e-5).basic == (1.5, 2e-6)


def test_zcdp_and_pld_losses():
    z = ZCDP(0.1, 1e-6)
    assert z.approx_dp().epsilon == pytest.approx(0.1 + 2 * math.sqrt(0.1 * math.log(1e6)))
    assert z.group2() == ZCDP(0.4, 1e-6)
    lap = PLDLoss("laplace", 1.0, 1.0, 1e-6)
    assert lap.approx_dp().epsilon == pytest.approx(1.0, rel=1e-3)  # Laplace(b=1): 1-DP
    assert lap.group2().approx_dp().epsilon == pytest.approx(2.0, rel=1e-3)
    with pytest.raises(ValueError, match="subsampled"):
        LOSSES[-1].group2()
    # any loss composes through the PLD accountant and the ledger's rule
    s = LedgerAccountant().total(LOSSES, 1e-5)
    assert s.composition in ("basic", "pld") and s.epsilon > 0


def test_group_privacy_conversion_of_each_loss():
    g = GaussianDP.calibrated(0.5, 1e-7)
    g2 = convert_neighbours(Guarantee(g, "add-remove"), "replace-one", allow=True)
    assert g2.neighbours == "replace-one" and g2.mu == 2 * g.mu
    assert (g2.epsilon, g2.delta) == (1.0, (1 + math.exp(0.5)) * 1e-7)
    a2 = convert_neighbours(Guarantee(ApproxDP(0.5, 1e-7), "add-remove"), "replace-one", allow=True)
    assert a2.loss == ApproxDP(1.0, (1 + math.exp(0.5)) * 1e-7) and a2.mu is None
    with pytest.raises(BudgetError, match="replace-one release cannot be charged"):
        convert_neighbours(Guarantee(g, "replace-one"), "add-remove", allow=True)


def test_a_new_accountant_is_one_class():
    """The protocol's contract: ``total`` alone; ``fits`` and ``spent_epsilon`` follow."""

    class MaxAccountant(Accountant):  # a deliberately loose rule: k times the worst release
        name = "max"

        def total(self, losses, delta):
            points = [x.approx_dp() for x in losses]
            eps = len(points) * max(p.epsilon for p in points)
            d = len(points) * max(p.delta for p in points)
            return Spent(self.name, eps, d, None, admits=lambda e, dd: eps <= e and d <= dd)

    losses = [ApproxDP(0.5, 1e-7), ApproxDP(0.1, 1e-7)]
    assert MaxAccountant().spent_epsilon(losses, 1e-5) == 1.0
    assert MaxAccountant().fits(losses, 1.0, 1e-5) and not MaxAccountant().fits(losses, 0.9, 1e-5)


def test_legacy_charges_read_as_losses():
    """``(epsilon, delta, calibration, mu)`` charges (ledgers before schema version 3) give
    the same spending as their losses."""
    mu = cal.analytic_gaussian_mu(1.0, 1e-6)
    legacy = [(1.0, 1e-6, "exact", mu), (0.5, 1e-6, "mgm", None), (0.2, 1e-7, "exact", None)]
    losses = [GaussianDP(mu, 1.0, 1e-6), ApproxDP(0.5, 1e-6), ApproxDP(0.2, 1e-7)]
    a, b = spending(legacy, 1e-5), spending(losses, 1e-5)
    assert (a.composition, a.epsilon, a.delta) == (b.composition, b.epsilon, b.delta)


# -- the in-memory ledger -------------------------------------------------------------------------
def test_the_in_memory_ledger_keeps_budgets_for_the_process():
    name = "test-accounting-memory"
    try:
        with open_ledger(f"memory://{name}") as book:
            assert book.display() == f"memory://{name}"
            book.ensure_dataset("d", 2.0, 1e-5)
            book.reserve(
                dataset="d",
                release_id="r1",
                calibration="exact",
                loss=get_calibration("exact").loss(1.0, 1e-6),
                spec_hash="h",
                output="/o",
                noise_key="00" * 16,
                seeded=False,
            )
            book.commit("r1", clipped=2)
        with open_ledger(f"memory://{name}") as again:  # another handle sees the same ledger
            (entry,) = again.releases()
            assert entry.status == "committed" and entry.clipped == 2 and entry.noise_key is None
            assert isinstance(entry.loss, GaussianDP) and entry.epsilon == 1.0
            with pytest.raises(BudgetError, match="would be exceeded"):
                again.reserve(
                    dataset="d",
                    release_id="r2",
                    calibration="mgm",
                    loss=ApproxDP(1.5, 1e-6),
                    spec_hash="h",
                    output="/o",
                    noise_key="00" * 16,
                    seeded=False,
                )
            assert "(gaussian-dp, mu=" in summary_text(again.summary())
        with open_ledger("memory://another") as other:
            assert other.releases() == []
    finally:
        forget(name)
        forget("another")
    with pytest.raises(Exception, match="name the in-memory ledger"):
        parse_location("memory://")


@pytest.mark.parametrize("calibration", ["exact", "mgm"])
@pytest.mark.parametrize(("share", "count_share"), [(0.0, 0.0), (0.3, 0.0), (0.2, 0.1)])
def test_a_release_split_composes_back_to_its_budget(calibration, share, count_share):
    """share_budget splits a release's (epsilon, delta) between its steps; the accountant
    composes the steps' losses back to exactly the total."""
    from mvg_dask.plan.budget import share_budget

    budgets = share_budget(calibration, 1.0, 1e-6, share, count_share)
    losses = budgets.losses()
    assert len(losses) == 1 + (share > 0) + (count_share > 0)
    total = LedgerAccountant().total(losses, 1e-6)
    if calibration == "exact":
        assert total.composition == "gaussian-dp"
        assert total.mu == pytest.approx(cal.analytic_gaussian_mu(1.0, 1e-6), rel=1e-12)
        assert total.epsilon == pytest.approx(1.0, rel=1e-6)
    else:
        assert total.basic == pytest.approx((1.0, 1e-6), rel=1e-12)
    assert total.fits(1.0 * (1 + 1e-9), 1e-6 * (1 + 1e-9))


def test_a_release_charges_an_in_memory_ledger_named_in_its_spec(tmp_path, client):
    """``ledger.url: memory://name``: a release in this process is charged to it, and the next
    one that would exceed the budget is refused before anything is read or written."""
    from mvg_dask.api import release
    from tests.pipeline_helpers import data, make_input, spec_dict

    store = make_input(tmp_path / "in.zarr", data(3, 128))
    name = "test-accounting-spec"
    ledger = {"url": f"memory://{name}", "dataset": "d", "budget": {"epsilon": 1.2, "delta": 1e-5}}
    try:
        release(spec_dict(store, str(tmp_path / "a.zarr"), ledger=ledger), client=client)
        with pytest.raises(BudgetError, match="would be exceeded"):
            release(spec_dict(store, str(tmp_path / "b.zarr"), ledger=ledger), client=client)
        assert not (tmp_path / "b.zarr").exists()
        with open_ledger(f"memory://{name}") as book:
            (entry,) = book.releases()
            assert entry.status == "committed" and isinstance(entry.loss, GaussianDP)
    finally:
        forget(name)


# -- today's decisions unchanged ----------------------------------------------------------------
def _old_spending(entries, budget_delta):
    """The ledger's composition before losses were typed (schema version 2), verbatim in
    substance: ``(epsilon, delta, calibration, mu)`` charges, Gaussian when ``exact`` with a mu.
    Returns ``(composition, epsilon, delta, mu, fits)``."""
    gaussian = [c for c in entries if c[2] == "exact" and c[3] is not None]
    if entries and len(gaussian) == len(entries):
        mu = math.sqrt(math.fsum(c[3] ** 2 for c in entries))
        return (
            "gaussian-dp",
            cal.analytic_gaussian_epsilon(mu, budget_delta),
            budget_delta,
            mu,
            lambda e, d: cal.analytic_gaussian_delta(e, mu) <= d,
        )
    basic = (math.fsum(c[0] for c in entries), math.fsum(c[1] for c in entries))

    def basic_fits(e, d):
        return basic[0] <= e * (1 + 1e-12) and basic[1] <= d * (1 + 1e-12)

    if len(entries) < 2:
        return ("basic", *basic, None, basic_fits)
    others: dict[tuple[float, float], int] = {}
    for c in entries:
        if c not in gaussian:
            others[(c[0], c[1])] = others.get((c[0], c[1]), 0) + 1
    parts = []
    for (e, d), k in sorted(others.items()):
        one = pld_lib.from_privacy_parameters(
            dp_accounting.pld.common.DifferentialPrivacyParameters(e, d),
            value_discretization_interval=1e-4,
        )
        parts.append(one if k == 1 else one.self_compose(k))
    mu = math.sqrt(math.fsum(c[3] ** 2 for c in gaussian))
    if mu > 0:
        parts.append(
            pld_lib.from_gaussian_mechanism(
                1.0 / mu, sensitivity=1.0, value_discretization_interval=1e-4
            )
        )
    composed = parts[0]
    for p in parts[1:]:
        composed = composed.compose(p)
    eps = float(composed.get_epsilon_for_delta(budget_delta))

    def fits(e, d):
        return basic_fits(e, d) or float(composed.get_delta_for_epsilon(e)) <= d

    if basic[1] <= budget_delta * (1 + 1e-12) and eps >= basic[0] * (1 - 1e-3):
        return ("basic", *basic, None, fits)
    return ("pld", eps, budget_delta, None, fits)


@pytest.mark.parametrize("seed", range(6))
def test_the_ledger_decides_as_before_on_random_charges(seed):
    """Random sets of exact and paper releases (seeded): the accountant's composition, spent
    epsilon and admission at several budgets are those of the rule before typed losses."""
    import random

    rng = random.Random(seed)
    entries = []
    for _ in range(rng.randint(1, 4)):
        eps, delta = rng.choice([0.25, 0.5, 1.0]), rng.choice([1e-7, 1e-6])
        # seeds 0 and 3: every release exact (Gaussian DP); the others mix
        calibration = rng.choice(["exact", "exact", "mgm", "mvg-thm2"]) if seed % 3 else "exact"
        mu = cal.analytic_gaussian_mu(eps, delta) if calibration == "exact" else None
        entries.append((eps, delta, calibration, mu))
    losses = [get_calibration(c).loss(e, d, m) for e, d, c, m in entries]
    new = LedgerAccountant().total(losses, 1e-5)
    composition, eps, delta, mu, fits = _old_spending(entries, 1e-5)
    assert composition == {0: "gaussian-dp", 3: "gaussian-dp", 2: "basic"}.get(seed, composition)
    assert (new.composition, new.epsilon, new.delta, new.mu) == (composition, eps, delta, mu)
    for budget_eps in (0.5 * eps, 0.999 * eps, eps, 1.001 * eps, 2 * eps):
        for budget_delta in (1e-6, 1e-5):
            assert new.fits(budget_eps, budget_delta) == fits(budget_eps, budget_delta)
