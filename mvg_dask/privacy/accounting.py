"""Privacy loss as a typed value, and the accountants that compose losses against a budget.

A release's privacy loss is one of a few types, each a frozen value that serialises to one JSON
object with a ``type`` tag (:func:`loss_to_json`, :func:`loss_from_json`):

* :class:`ApproxDP` ``(epsilon, delta)``: a bare approximate-DP guarantee (the paper
  calibrations);
* :class:`GaussianDP` ``mu``: a Gaussian mechanism after whitening (the ``exact`` calibration),
  with the ``(epsilon, delta)`` it was calibrated to, one point of its curve;
* :class:`ZCDP` ``rho``: zero-concentrated DP, with the ``delta`` at which it is read as
  ``(epsilon, delta)``;
* :class:`PLDLoss`: a mechanism whose privacy-loss distribution dp-accounting builds (Gaussian
  or Laplace noise of a given scale and sensitivity, optionally Poisson-subsampled).

Every loss can say three things: the ``(epsilon, delta)`` statement basic composition sums
(:meth:`PrivacyLoss.approx_dp`), its privacy-loss distribution (:meth:`PrivacyLoss.pld`, an
upper bound by pessimistic discretisation), and the loss of the same release counted under a
relation whose neighbours are two steps apart (:meth:`PrivacyLoss.group2`, group privacy at
group size 2, used to charge an add-remove release to a replace-one budget).

An :class:`Accountant` composes a sequence of losses: :meth:`Accountant.total` gives a
:class:`Spent` (epsilon at the budget's delta, and whether a budget admits it). The
implementations are :class:`BasicAccountant` (sum of epsilons and deltas, as diffprivlib's
``BudgetAccountant`` and PipelineDP's ``NaiveBudgetAccountant``), :class:`GaussianDPAccountant`
(``mu^2 = sum mu_i^2``, exact for Gaussian mechanisms), :class:`PLDAccountant` (dp-accounting's
privacy-loss distributions, as PipelineDP's ``PLDBudgetAccountant``), and
:class:`LedgerAccountant`, the ledger's rule: the tightest of those that applies. A new
accountant is one subclass of :class:`Accountant`; a new kind of charge is one subclass of
:class:`PrivacyLoss` registered in :data:`LOSS_TYPES`.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from mvg_dask.privacy import calibration as cal

__all__ = [
    "LOSS_TYPES",
    "PLD_DISCRETISATION",
    "PLD_REPORT_GAIN",
    "ZCDP",
    "Accountant",
    "ApproxDP",
    "BasicAccountant",
    "GaussianDP",
    "GaussianDPAccountant",
    "LedgerAccountant",
    "PLDAccountant",
    "PLDLoss",
    "PrivacyLoss",
    "RoundsLoss",
    "Spent",
    "amplified_by_sampling",
    "loss_from_json",
    "loss_to_json",
]

#: Grid of the privacy-loss distributions (dp-accounting's default).
PLD_DISCRETISATION = 1e-4
#: The privacy-loss-distribution total is reported when it is below the basic sum by more than
#: this fraction (otherwise the basic sum, which a person can check; admission uses both).
PLD_REPORT_GAIN = 1e-3
_TOL = 1e-12


def _positive(name: str, value: float, *, zero: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be a finite number {'>=' if zero else '>'} 0, not {value!r}")
    return value


class PrivacyLoss(ABC):
    """A release's privacy loss (one JSON value with a ``type`` tag)."""

    #: the ``type`` tag of the loss's JSON value
    tag: ClassVar[str]

    @abstractmethod
    def approx_dp(self) -> ApproxDP:
        """The ``(epsilon, delta)``-DP statement basic composition sums."""

    @abstractmethod
    def pld(self) -> Any:
        """dp-accounting's privacy-loss distribution (pessimistic: an upper bound)."""

    @abstractmethod
    def group2(self) -> PrivacyLoss:
        """The loss between datasets two neighbouring steps apart (group privacy, size 2)."""

    def to_json(self) -> dict[str, Any]:
        """The loss as one JSON object: its ``type`` tag and its fields."""
        return {"type": self.tag, **{k: v for k, v in vars(self).items()}}


@dataclass(frozen=True)
class ApproxDP(PrivacyLoss):
    """An ``(epsilon, delta)``-DP guarantee."""

    epsilon: float
    delta: float
    tag: ClassVar[str] = "approx-dp"

    def __post_init__(self) -> None:
        _positive("epsilon", self.epsilon)
        _positive("delta", self.delta, zero=True)  # >= 1 is vacuous, but a valid statement

    def approx_dp(self) -> ApproxDP:
        """Itself."""
        return self

    def pld(self) -> Any:
        """The worst-case privacy-loss distribution of an ``(epsilon, delta)``-DP mechanism."""
        return _approx_dp_pld(self.epsilon, self.delta, 1)

    def group2(self) -> ApproxDP:
        """``(2 epsilon, (1 + e^epsilon) delta)`` (Dwork & Roth 2014, group privacy)."""
        return ApproxDP(2 * self.epsilon, (1 + math.exp(self.epsilon)) * self.delta)


@dataclass(frozen=True)
class GaussianDP(PrivacyLoss):
    """A ``mu``-GDP Gaussian mechanism, and the ``(epsilon, delta)`` it was calibrated to.

    ``(epsilon, delta)`` is one point of the mechanism's curve
    ``delta_AG(epsilon, mu)`` (what basic composition sums); Gaussian-DP composition uses
    ``mu`` alone.
    """

    mu: float
    epsilon: float
    delta: float
    tag: ClassVar[str] = "gaussian-dp"

    def __post_init__(self) -> None:
        _positive("mu", self.mu)
        ApproxDP(self.epsilon, self.delta)

    @classmethod
    def calibrated(cls, epsilon: float, delta: float) -> GaussianDP:
        """The Gaussian mechanism calibrated to ``(epsilon, delta)`` (analytic Gaussian)."""
        return cls(cal.analytic_gaussian_mu(epsilon, delta), epsilon, delta)

    def approx_dp(self) -> ApproxDP:
        """The calibration point."""
        return ApproxDP(self.epsilon, self.delta)

    def pld(self) -> Any:
        """The Gaussian mechanism's privacy-loss distribution (noise 1/mu, sensitivity 1)."""
        return _gaussian_pld(self.mu)

    def group2(self) -> GaussianDP:
        """``2 mu`` (two unit shifts add to one of ``2 mu``: Dong, Roth & Su 2022, Thm 2.14), and
        the calibration point converted as :meth:`ApproxDP.group2`."""
        point = self.approx_dp().group2()
        return GaussianDP(2 * self.mu, point.epsilon, point.delta)


@dataclass(frozen=True)
class ZCDP(PrivacyLoss):
    """``rho``-zCDP, read as ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP (Bun & Steinke 2016,
    Prop. 1.3) at its ``delta``."""

    rho: float
    delta: float
    tag: ClassVar[str] = "zcdp"

    def __post_init__(self) -> None:
        _positive("rho", self.rho)
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")

    def approx_dp(self) -> ApproxDP:
        """The Bun-Steinke conversion at ``delta``."""
        return ApproxDP(self.rho + 2 * math.sqrt(self.rho * math.log(1 / self.delta)), self.delta)

    def pld(self) -> Any:
        """The worst case of :meth:`approx_dp` (zCDP has no exact PLD of its own)."""
        return self.approx_dp().pld()

    def group2(self) -> ZCDP:
        """``4 rho`` (zCDP's group privacy, ``k^2 rho`` at group size ``k``)."""
        return ZCDP(4 * self.rho, self.delta)


PLDMechanism = Literal["gaussian", "laplace"]


@dataclass(frozen=True)
class PLDLoss(PrivacyLoss):
    """A noise mechanism whose privacy-loss distribution dp-accounting builds.

    Attributes
    ----------
    mechanism : {"gaussian", "laplace"}
        The noise.
    scale : float
        Its standard deviation (Gaussian) or parameter ``b`` (Laplace).
    sensitivity : float
        The query's sensitivity under the release's neighbour relation.
    sampling_probability : float
        Poisson subsampling rate (1: no subsampling).
    delta : float
        Where :meth:`approx_dp` reads the distribution's epsilon.
    """

    mechanism: PLDMechanism
    scale: float
    sensitivity: float
    delta: float
    sampling_probability: float = 1.0
    tag: ClassVar[str] = "pld"

    def __post_init__(self) -> None:
        if self.mechanism not in ("gaussian", "laplace"):
            raise ValueError(f"pld mechanism must be gaussian or laplace, not {self.mechanism!r}")
        _positive("scale", self.scale)
        _positive("sensitivity", self.sensitivity)
        if not 0 < self.sampling_probability <= 1:
            raise ValueError("sampling_probability must lie in (0, 1]")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")

    def approx_dp(self) -> ApproxDP:
        """epsilon of the distribution at ``delta``."""
        return ApproxDP(float(self.pld().get_epsilon_for_delta(self.delta)), self.delta)

    def pld(self) -> Any:
        """dp-accounting's distribution of the mechanism."""
        return _mechanism_pld(
            self.mechanism, self.scale, self.sensitivity, self.sampling_probability
        )

    def group2(self) -> PLDLoss:
        """Twice the sensitivity (a record's two steps move an additive mechanism's query by at
        most twice); not defined under subsampling."""
        if self.sampling_probability != 1.0:
            raise ValueError("a subsampled PLD loss has no group-privacy conversion here")
        return PLDLoss(self.mechanism, self.scale, 2 * self.sensitivity, self.delta)


def amplified_by_sampling(loss: ApproxDP, q: float) -> ApproxDP:
    """``(log(1 + q (e^eps - 1)), q delta)``: an ``(eps, delta)``-DP mechanism run on a Poisson
    sample of rate ``q`` (add-remove neighbours; Balle, Barthe & Gaboardi, NeurIPS 2018, Thm. 8)."""
    eps = loss.epsilon
    # log(q e^eps + 1 - q) = eps + log(q + (1 - q) e^-eps): no overflow at a large epsilon
    amplified = (
        math.log1p(q * math.expm1(eps))
        if eps < 30
        else eps + math.log(q + (1 - q) * math.exp(-eps))
    )
    return ApproxDP(amplified, q * loss.delta)


@dataclass(frozen=True)
class RoundsLoss(PrivacyLoss):
    """A training run: ``rounds`` releases of the same loss, each on a Poisson sample of rate
    ``sampling_probability`` (1: the whole dataset), composed by dp-accounting's privacy-loss
    distributions (docs/guide/rounds.md).

    A Gaussian-DP round is dp-accounting's (subsampled) Gaussian mechanism of noise ``1 / mu``
    and sensitivity 1; an ``(epsilon, delta)`` round is the worst-case distribution of
    :func:`amplified_by_sampling`'s statement. :meth:`approx_dp` reads the composed
    distribution's epsilon at ``delta``.

    Attributes
    ----------
    round_loss : str
        One round's loss, as :func:`loss_to_json` writes it (:class:`GaussianDP` or
        :class:`ApproxDP`).
    rounds : int
        How many rounds.
    sampling_probability : float
        Poisson sampling rate of each round.
    delta : float
        Where :meth:`approx_dp` reads the epsilon.
    """

    round_loss: str
    rounds: int
    sampling_probability: float
    delta: float
    tag: ClassVar[str] = "rounds"

    def __post_init__(self) -> None:
        inner = self.round()
        if not isinstance(inner, GaussianDP | ApproxDP):
            raise ValueError("a round's loss must be gaussian-dp or approx-dp")
        if not (isinstance(self.rounds, int) and self.rounds >= 1):
            raise ValueError(f"rounds must be an integer >= 1, not {self.rounds!r}")
        if not 0 < self.sampling_probability <= 1:
            raise ValueError("sampling_probability must lie in (0, 1]")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")

    def round(self) -> PrivacyLoss:
        """One round's loss."""
        return loss_from_json(self.round_loss)

    def approx_dp(self) -> ApproxDP:
        """epsilon of the composed distribution at ``delta``."""
        return ApproxDP(float(self.pld().get_epsilon_for_delta(self.delta)), self.delta)

    def pld(self) -> Any:
        """dp-accounting's composition of the rounds."""
        return _rounds_pld(self.round_loss, self.rounds, self.sampling_probability)

    def group2(self) -> RoundsLoss:
        """Each round's :meth:`PrivacyLoss.group2`; not defined under subsampling."""
        if self.sampling_probability != 1.0:
            raise ValueError("a subsampled run has no group-privacy conversion here")
        return RoundsLoss(loss_to_json(self.round().group2()), self.rounds, 1.0, self.delta)


#: Every loss type by its JSON tag (a new kind of charge adds one entry).
LOSS_TYPES: dict[str, type[PrivacyLoss]] = {
    t.tag: t for t in (ApproxDP, GaussianDP, ZCDP, PLDLoss, RoundsLoss)
}


def loss_to_json(loss: PrivacyLoss) -> str:
    """One JSON value (floats exactly: ``repr`` round-trips)."""
    import json

    return json.dumps(loss.to_json(), sort_keys=True, allow_nan=False)


def loss_from_json(text: str | dict[str, Any]) -> PrivacyLoss:
    """The loss of :func:`loss_to_json`'s value.

    Raises
    ------
    ValueError
        For an unknown ``type`` tag or a missing field.
    """
    import json

    data = dict(json.loads(text) if isinstance(text, str) else text)
    tag = data.pop("type", None)
    kind = LOSS_TYPES.get(str(tag))
    if kind is None:
        raise ValueError(
            f"privacy loss: unknown type {tag!r}; known types are {', '.join(LOSS_TYPES)}"
        )
    try:
        return kind(**data)
    except TypeError as exc:
        raise ValueError(f"privacy loss of type {tag!r}: {exc}") from None


# -- privacy-loss distributions (cached: a ledger re-composes the same charges) -----------------
@functools.lru_cache(maxsize=256)
def _gaussian_pld(mu: float) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(
        1.0 / mu, sensitivity=1.0, value_discretization_interval=PLD_DISCRETISATION
    )


@functools.lru_cache(maxsize=256)
def _approx_dp_pld(epsilon: float, delta: float, count: int) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld
    from dp_accounting.pld.common import DifferentialPrivacyParameters

    one = pld.from_privacy_parameters(
        DifferentialPrivacyParameters(epsilon, delta),
        value_discretization_interval=PLD_DISCRETISATION,
    )
    return one if count == 1 else one.self_compose(count)


@functools.lru_cache(maxsize=64)
def _mechanism_pld(mechanism: str, scale: float, sensitivity: float, sampling: float) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld

    build = pld.from_gaussian_mechanism if mechanism == "gaussian" else pld.from_laplace_mechanism
    return build(
        scale,
        sensitivity=sensitivity,
        sampling_prob=sampling,
        value_discretization_interval=PLD_DISCRETISATION,
    )


@functools.lru_cache(maxsize=256)
def _rounds_pld(round_loss: str, rounds: int, sampling: float) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld

    inner = loss_from_json(round_loss)
    if isinstance(inner, GaussianDP):
        if sampling == 1.0:  # as dp-accounting composes Gaussians: one of noise 1/(mu sqrt(R))
            return _gaussian_pld(inner.mu * math.sqrt(rounds))
        one = pld.from_gaussian_mechanism(
            1.0 / inner.mu,
            sensitivity=1.0,
            sampling_prob=sampling,
            value_discretization_interval=PLD_DISCRETISATION,
        )
        return one.self_compose(rounds)
    assert isinstance(inner, ApproxDP)
    point = inner if sampling == 1.0 else amplified_by_sampling(inner, sampling)
    return _approx_dp_pld(point.epsilon, point.delta, rounds)


# -- accountants --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spent:
    """What a sequence of losses spends, by one accountant's rule.

    Attributes
    ----------
    composition : str
        The rule whose numbers are reported (``basic``, ``gaussian-dp``, ``pld``).
    epsilon, delta : float
        The spent guarantee (for ``gaussian-dp`` and ``pld``: epsilon at the budget's delta).
    mu : float or None
        The Gaussian-DP total (``gaussian-dp`` only).
    basic : tuple of float or None
        ``(sum eps, sum delta)`` where basic composition was computed.
    pld : object or None
        dp-accounting's composed distribution, where computed.
    """

    composition: str
    epsilon: float
    delta: float
    mu: float | None
    basic: tuple[float, float] | None = None
    pld: Any = field(default=None, repr=False, compare=False)
    admits: Callable[[float, float], bool] | None = field(default=None, repr=False, compare=False)

    def fits(self, budget_epsilon: float, budget_delta: float) -> bool:
        """True when a budget ``(budget_epsilon, budget_delta)`` admits the spending."""
        assert self.admits is not None
        return self.admits(budget_epsilon, budget_delta)


def _basic_fits(basic: tuple[float, float], budget_epsilon: float, budget_delta: float) -> bool:
    eps, delta = basic
    return eps <= budget_epsilon * (1 + _TOL) and delta <= budget_delta * (1 + _TOL)


def _pld_fits(composed: Any, budget_epsilon: float, budget_delta: float) -> bool:
    return float(composed.get_delta_for_epsilon(budget_epsilon)) <= budget_delta


class Accountant(ABC):
    """Composes a sequence of privacy losses (within a release and across releases)."""

    #: the rule's name, as ``Spent.composition`` reports it
    name: ClassVar[str]

    def applies(self, losses: Sequence[PrivacyLoss]) -> bool:
        """Whether this accountant can compose ``losses`` (default: any non-empty sequence)."""
        return bool(losses)

    @abstractmethod
    def total(self, losses: Sequence[PrivacyLoss], delta: float) -> Spent:
        """The composition of ``losses``, its epsilon reported at ``delta`` where it has one."""

    def fits(self, losses: Sequence[PrivacyLoss], epsilon: float, delta: float) -> bool:
        """Whether the budget ``(epsilon, delta)`` admits ``losses``."""
        return self.total(losses, delta).fits(epsilon, delta)

    def spent_epsilon(self, losses: Sequence[PrivacyLoss], delta: float) -> float:
        """The spent epsilon at the budget's ``delta``."""
        return self.total(losses, delta).epsilon


class BasicAccountant(Accountant):
    """Basic composition: ``(sum epsilon_i, sum delta_i)`` of each loss's
    :meth:`~PrivacyLoss.approx_dp`."""

    name = "basic"

    def total(self, losses: Sequence[PrivacyLoss], delta: float) -> Spent:
        """The sums (``delta`` is not used: the sum of the deltas is reported)."""
        points = [x.approx_dp() for x in losses]
        basic = (math.fsum(p.epsilon for p in points), math.fsum(p.delta for p in points))
        return Spent(
            self.name,
            basic[0],
            basic[1],
            None,
            basic=basic,
            admits=functools.partial(_basic_fits, basic),
        )


class GaussianDPAccountant(Accountant):
    """Exact composition of Gaussian mechanisms: ``mu^2 = sum mu_i^2``; a budget admits it
    while ``delta_AG(epsilon, mu) <= delta``."""

    name = "gaussian-dp"

    def applies(self, losses: Sequence[PrivacyLoss]) -> bool:
        """Every loss is :class:`GaussianDP`."""
        return bool(losses) and all(isinstance(x, GaussianDP) for x in losses)

    def total(self, losses: Sequence[PrivacyLoss], delta: float) -> Spent:
        """``mu`` and its epsilon at ``delta``."""
        if not self.applies(losses):
            raise ValueError("Gaussian-DP composition needs Gaussian-DP losses only")
        mu = math.sqrt(math.fsum(x.mu**2 for x in losses if isinstance(x, GaussianDP)))

        def admits(epsilon: float, budget_delta: float) -> bool:
            return cal.analytic_gaussian_delta(epsilon, mu) <= budget_delta

        return Spent(self.name, cal.analytic_gaussian_epsilon(mu, delta), delta, mu, admits=admits)


def compose_plds(losses: Sequence[PrivacyLoss]) -> Any:
    """dp-accounting's composition of ``losses``: the Gaussian ones merged into one ``mu``,
    equal :class:`ApproxDP` ones self-composed, the others composed in turn.

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        Its ``get_delta_for_epsilon`` is an upper bound of the true delta.
    """
    gauss = [x.mu for x in losses if isinstance(x, GaussianDP)]
    counts: dict[tuple[float, float], int] = {}
    for x in losses:
        if isinstance(x, ApproxDP):
            key = (float(x.epsilon), float(x.delta))
            counts[key] = counts.get(key, 0) + 1
    parts = [_approx_dp_pld(e, d, k) for (e, d), k in sorted(counts.items())]
    parts += [x.pld() for x in losses if not isinstance(x, GaussianDP | ApproxDP)]
    mu = math.sqrt(math.fsum(m * m for m in gauss))
    if mu > 0:
        parts.append(_gaussian_pld(mu))
    if not parts:
        raise ValueError("a privacy-loss distribution needs at least one loss")
    out = parts[0]
    for part in parts[1:]:
        out = out.compose(part)
    return out


class PLDAccountant(Accountant):
    """dp-accounting's privacy-loss-distribution composition (pessimistic discretisation)."""

    name = "pld"

    def total(self, losses: Sequence[PrivacyLoss], delta: float) -> Spent:
        """epsilon of the composed distribution at ``delta``."""
        composed = compose_plds(losses)
        return Spent(
            self.name,
            float(composed.get_epsilon_for_delta(delta)),
            delta,
            None,
            pld=composed,
            admits=functools.partial(_pld_fits, composed),
        )


class LedgerAccountant(Accountant):
    """The ledger's rule: the tightest sound composition that applies.

    * all losses Gaussian: :class:`GaussianDPAccountant`;
    * one other loss: :class:`BasicAccountant`;
    * otherwise a budget admits the losses when :class:`BasicAccountant` *or*
      :class:`PLDAccountant` does (both are sound), and the PLD total is reported when it is
      below the basic sum by more than :data:`PLD_REPORT_GAIN` (else the sum, which a person
      can check).
    """

    name = "ledger"

    def total(self, losses: Sequence[PrivacyLoss], delta: float) -> Spent:
        """The spending by the rule above."""
        gaussian = GaussianDPAccountant()
        if gaussian.applies(losses):
            return gaussian.total(losses, delta)
        basic = BasicAccountant().total(losses, delta)
        if len(losses) < 2:
            return basic
        assert basic.basic is not None
        pld = PLDAccountant().total(losses, delta)
        sums = basic.basic

        def admits(epsilon: float, budget_delta: float) -> bool:
            return _basic_fits(sums, epsilon, budget_delta) or _pld_fits(
                pld.pld, epsilon, budget_delta
            )

        if sums[1] <= delta * (1 + _TOL) and pld.epsilon >= sums[0] * (1 - PLD_REPORT_GAIN):
            # within PLD_REPORT_GAIN of the basic sum: report the sum a person can check
            return Spent("basic", *sums, None, basic=sums, pld=pld.pld, admits=admits)
        return Spent("pld", pld.epsilon, delta, None, basic=sums, pld=pld.pld, admits=admits)
