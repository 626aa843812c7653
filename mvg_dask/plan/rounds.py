"""The noise plan of a round: a matrix release of declared per-contributor sensitivity from
memory (docs/guide/rounds.md).

A round releases ``f + Z`` for an ``m x n`` matrix ``f`` that one contributor (a federated
participant's local dataset) determines entirely, within a declared bound:

* ``clip=C``: every entry lies in ``[-C, C]`` (an ``l_inf`` clip, the MGM paper's gradient
  clipping; IDN's entry range), so ``s_2 = 2 C sqrt(m n)`` (the paper's Eq. 30);
* ``frobenius=r``: ``||f||_F <= r``, so ``s_2 = 2 r``.

The noise is ``Z = diag(sqrt(v)) N`` (row variances ``v``, standard directions, ``Psi = I``):
the MGM paper's unimodal directional noise with ``U_1`` the identity, which every calibration
here shares. The calibrations:

==============  ===============================================================================
``gaussian``    i.i.d. analytic Gaussian: one variance ``(s_2 / mu*)^2`` for every entry
``exact``       the allocation's variances scaled until the whitened sensitivity is ``mu*``
``mgm``         MGM Thm. 1 (unimodal), the allocation of its precision budget
``mgm-udn``     MGM Thm. 2
``mgm-idn``     MGM Thm. 3 (needs ``clip``: the entry range ``[-C, C]``)
``mvg-thm2``    MVG Thm. 2 with Alg. 1 (``gamma = sup ||f||_F``)
==============  ===============================================================================

Every round is released on the lattice (:mod:`mvg_dask.plan.lattice`): the variances are then
scaled, where needed, until the effective whitened sensitivity (``Delta_M`` plus twice the
floating-point error plus the grid's rounding) meets ``mu*(epsilon, delta)``, as a paper
calibration's lattice release is (:func:`mvg_dask.plan.noise_calibration.calibrate_lattice`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mvg_dask.plan.lattice import Lattice, choose_log2_grid
from mvg_dask.privacy import allocation as alloc
from mvg_dask.privacy import calibration as cal
from mvg_dask.privacy import float_error as ferr
from mvg_dask.privacy.accounting import ApproxDP, GaussianDP
from mvg_dask.privacy.registry import check_compatible

__all__ = [
    "ROUND_CALIBRATIONS",
    "RoundBound",
    "RoundPlan",
    "plan_round",
    "round_allocation",
]

RoundCalibration = Literal["gaussian", "exact", "mgm", "mgm-udn", "mgm-idn", "mvg-thm2"]
#: The calibrations a round offers (the i.i.d. analytic Gaussian and the registry's that apply).
ROUND_CALIBRATIONS: tuple[RoundCalibration, ...] = (
    "gaussian",
    "exact",
    "mgm",
    "mgm-udn",
    "mgm-idn",
    "mvg-thm2",
)
#: Largest matrix a round plans (entries): rounds are in-memory releases.
MAX_ENTRIES = 2**26


@dataclass(frozen=True)
class RoundBound:
    """A round's declared per-contributor bound: ``kind`` ``clip`` (``|f_ij| <= bound``) or
    ``frobenius`` (``||f||_F <= bound``)."""

    kind: Literal["clip", "frobenius"]
    bound: float

    @classmethod
    def of(cls, clip: float | None, frobenius: float | None) -> RoundBound:
        """The bound from exactly one of ``clip`` and ``frobenius`` (a ``ValueError`` else)."""
        if (clip is None) == (frobenius is None):
            raise ValueError("a round needs exactly one of clip (l_inf) or frobenius (l2)")
        kind: Literal["clip", "frobenius"] = "clip" if clip is not None else "frobenius"
        value = clip if clip is not None else frobenius
        try:
            bound = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{kind} must be a number > 0, not {value!r}") from None
        if not (math.isfinite(bound) and bound > 0):
            raise ValueError(f"{kind} must be a finite number > 0, not {value!r}")
        return cls(kind, bound)

    def sensitivity(self, m: int, n: int) -> float:
        """``s_2``: ``2 C sqrt(mn)`` or ``2 r``."""
        if self.kind == "clip":
            return 2.0 * self.bound * math.sqrt(float(m) * float(n))
        return 2.0 * self.bound

    def gamma(self, m: int, n: int) -> float:
        """``sup ||f||_F``: ``C sqrt(mn)`` or ``r``."""
        return self.sensitivity(m, n) / 2.0

    def whitened_sensitivity(self, variances: np.ndarray, n: int) -> float:
        """``Delta_M = sup ||diag(v)^-1/2 (f - f')||_F`` (exact: a corner of the box, or the
        ball's diameter along the smallest variance)."""
        if self.kind == "clip":
            return 2.0 * self.bound * math.sqrt(n * math.fsum(1.0 / variances))
        return 2.0 * self.bound / math.sqrt(float(np.min(variances)))

    def float_error(self, variances: np.ndarray, n: int) -> float:
        """``E``: the whitening ``fl(f_ij w_i)`` then ``fl(. 2^-k)`` errs by at most
        ``gamma_3 |f_ij| / sqrt(v_i)`` per entry (docs/bounds.md, Sec. 11)."""
        return ferr.gamma(3) * self.whitened_sensitivity(variances, n) / 2.0 * (1 + 2.0**-40)

    def clip(self, values: np.ndarray) -> np.ndarray:
        """``values`` inside the bound: entries clipped, or the matrix scaled to the ball."""
        if self.kind == "clip":
            return np.clip(values, -self.bound, self.bound)
        norm = float(np.linalg.norm(values))
        return values if norm <= self.bound else values * (self.bound / norm * (1 - 2.0**-50))


@dataclass(frozen=True, eq=False)
class RoundPlan:
    """What a round releases with: public, the same for every input (never data-dependent).

    Attributes
    ----------
    shape : tuple of int
        ``(m, n)``.
    calibration : str
        One of :data:`ROUND_CALIBRATIONS`.
    loss : GaussianDP or ApproxDP
        The round's privacy loss (its calibration's statement at the round's share).
    bound : RoundBound
        The declared per-contributor bound.
    row_variances : ndarray
        ``v``: the noise variance of every entry of row ``i``.
    lattice : Lattice
        The lattice release's grid and effective sensitivity.
    """

    shape: tuple[int, int]
    calibration: RoundCalibration
    loss: GaussianDP | ApproxDP
    bound: RoundBound
    row_variances: np.ndarray
    lattice: Lattice

    @functools.cached_property
    def row_std(self) -> np.ndarray:
        """``d = fl(sqrt(v))`` per row (the lattice release's factor)."""
        return np.sqrt(self.row_variances)

    @functools.cached_property
    def inverse_std(self) -> np.ndarray:
        """``w = fl(1 / d)`` per row (the whitening)."""
        return 1.0 / self.row_std

    @property
    def std(self) -> np.ndarray:
        """The noise's standard deviation per entry (``m x n``)."""
        m, n = self.shape
        return np.broadcast_to(np.sqrt(self.row_variances)[:, None], (m, n))

    @property
    def expected_squared_error(self) -> float:
        """``E ||Z||_F^2 = n sum v_i``."""
        return self.shape[1] * math.fsum(self.row_variances)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (public)."""
        return {
            "shape": list(self.shape),
            "calibration": self.calibration,
            "loss": self.loss.to_json(),
            "bound": {self.bound.kind: self.bound.bound},
            "row_variances": self.row_variances.tolist(),
            "lattice": self.lattice.to_dict(),
        }


def round_allocation(
    m: int, allocation: str | dict[str, Any] | None, kind: cal.BudgetKind
) -> np.ndarray:
    """``theta`` over the ``m`` rows: ``"uniform"`` (the default) or ``{"binary": {"important":
    [...], "share": s}}`` (MVG's binary allocation, the paper's MVG baseline)."""
    if allocation is None or allocation == "uniform":
        return alloc.uniform(m)
    if isinstance(allocation, dict) and set(allocation) == {"binary"}:
        spec = dict(allocation["binary"])
        unknown = set(spec) - {"important", "share"}
        if unknown or "important" not in spec:
            raise ValueError("allocation binary takes important (row indices) and share")
        theta = alloc.binary(m, list(spec["important"]), float(spec.get("share", 0.8)))
        return theta
    raise ValueError(f"allocation must be 'uniform' or {{'binary': {{...}}}}, not {allocation!r}")


def _check_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"a round releases a non-empty 2-d matrix, not shape {tuple(shape)}")
    m, n = int(shape[0]), int(shape[1])
    if m * n > MAX_ENTRIES:
        raise ValueError(f"a round of {m} x {n} is too large for memory (max {MAX_ENTRIES})")
    return m, n


def plan_round(
    shape: tuple[int, ...],
    *,
    calibration: str,
    loss: GaussianDP | ApproxDP,
    bound: RoundBound,
    allocation: str | dict[str, Any] | None = None,
) -> RoundPlan:
    """The plan of one round.

    Parameters
    ----------
    shape : tuple of int
        ``(m, n)`` of the released matrix.
    calibration : str
        One of :data:`ROUND_CALIBRATIONS`.
    loss : GaussianDP or ApproxDP
        The round's share: ``mu`` for ``gaussian`` and ``exact``, ``(epsilon, delta)`` for a
        paper calibration (:func:`mvg_dask.privacy.rounds.split_run_budget`).
    bound : RoundBound
        The declared per-contributor bound.
    allocation : str or dict, optional
        Row allocation (:func:`round_allocation`); ``gaussian`` takes none.

    Returns
    -------
    RoundPlan
        The plan.

    Raises
    ------
    ValueError
        An unknown calibration, a calibration that does not apply, a bad shape or allocation.
    """
    m, n = _check_shape(shape)
    if calibration not in ROUND_CALIBRATIONS:
        raise ValueError(
            f"calibration {calibration!r} does not apply to a round; use one of "
            f"{', '.join(ROUND_CALIBRATIONS)}"
        )
    gaussian = calibration in ("gaussian", "exact")
    if gaussian != isinstance(loss, GaussianDP):
        raise ValueError(f"{calibration} takes a {'Gaussian-DP' if gaussian else 'DP'} share")
    if calibration == "gaussian" and allocation not in (None, "uniform"):
        raise ValueError("gaussian is i.i.d. noise: it takes no allocation (use exact)")
    mu = loss.mu if isinstance(loss, GaussianDP) else cal.analytic_gaussian_mu(*_point(loss))
    if calibration in ("gaussian", "exact"):
        theta = round_allocation(m, allocation, "linear")
        variances = 1.0 / theta  # scaled to mu by the lattice step below
    else:
        rule = check_compatible(
            calibration,
            "unimodal",
            query_kind="identity",
            psd=False,
            square=m == n,
            standard_directions=True,
            symmetric=False,
        )
        if rule.uses_entry_range and bound.kind != "clip":
            raise ValueError(f"{rule.label} needs the entry range: declare clip, not frobenius")
        budget = rule.budget(
            m=m,
            n=n,
            epsilon=loss.epsilon,
            delta=loss.delta,
            algorithm="unimodal",
            sensitivity=bound.sensitivity(m, n),
            gamma=bound.gamma(m, n),
            entry_range=(-bound.bound, bound.bound),
        )
        variances = budget.variances(round_allocation(m, allocation, budget.kind))
    variances, lattice = _calibrate_lattice(np.asarray(variances, float), bound, n, mu, gaussian)
    return RoundPlan(
        shape=(m, n),
        calibration=calibration,
        loss=loss,
        bound=bound,
        row_variances=variances,
        lattice=lattice,
    )


def _point(loss: ApproxDP) -> tuple[float, float]:
    return loss.epsilon, loss.delta


def _calibrate_lattice(
    variances: np.ndarray, bound: RoundBound, n: int, mu: float, scale_to_mu: bool
) -> tuple[np.ndarray, Lattice]:
    """Scale ``variances`` until ``Delta_M + 2 E + 2^k sqrt(c) <= mu`` (``scale_to_mu``: also
    down to it, as ``exact`` does; a paper calibration's theorem may already be below).
    ``Delta_M`` and ``E`` scale as ``t^-1/2`` when every variance is multiplied by ``t``."""
    c = variances.size * n
    err = bound.float_error(variances, n)
    k = choose_log2_grid(mu, c, err)
    room = mu - math.ldexp(math.sqrt(c), k)
    for _ in range(60):
        d_m = bound.whitened_sensitivity(variances, n)
        err = bound.float_error(variances, n)
        total = d_m + 2.0 * err
        if total <= room and not (scale_to_mu and total < room * (1 - 1e-9)):
            break
        variances = variances * ((total / room) ** 2 * (1.0 + 1e-12))
    else:  # pragma: no cover - the scaling is exact up to rounding
        raise ValueError("could not calibrate the round's lattice")
    return variances, Lattice(log2_grid=k, coordinates=c, float_error=err, sensitivity=d_m)
