"""The parts of a release plan that are plain values of their own: the ledger charge and the
DP-PCA direction step (their JSON form too).

:class:`~mvg_dask.plan.release_plan.ReleasePlan` holds them; they are importable from
:mod:`mvg_dask.plan.release_plan` as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mvg_dask.plan.directions import gram_sensitivity
from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.lattice import Lattice
from mvg_dask.privacy.accounting import PrivacyLoss
from mvg_dask.privacy.registry import get_calibration


@dataclass(frozen=True, kw_only=True)
class LedgerCharge:
    """What the release charges to which dataset's budget (the ledger's location is not part
    of the serialised plan: it may hold credentials).

    Attributes
    ----------
    location : str
        Ledger file path or URL.
    password_file : str or None
        PostgreSQL password file (not serialised).
    dataset : str
        Dataset name.
    budget_epsilon, budget_delta : float
        The dataset's total budget.
    budget_neighbours : str
        The neighbour relation the budget is kept in.
    convert_neighbours : bool
        Charge an add-remove release to a replace-one budget by group privacy.
    epsilon, delta : float
        This release's guarantee (direction step included).
    calibration : str
        The release's calibration.
    mu : float or None
        Gaussian-DP parameter (``exact``).
    neighbours : str
        Neighbouring relation of the guarantee.
    """

    location: str = field(compare=False)
    password_file: str | None = field(default=None, compare=False)
    dataset: str
    budget_epsilon: float
    budget_delta: float
    budget_neighbours: Neighbours = "replace-one"
    convert_neighbours: bool = False
    epsilon: float
    delta: float
    calibration: str
    mu: float | None
    neighbours: Neighbours

    @property
    def loss(self) -> PrivacyLoss:
        """The release's privacy loss, as its calibration gives it
        (:meth:`~mvg_dask.privacy.registry.CalibrationRule.loss`)."""
        return get_calibration(self.calibration).loss(self.epsilon, self.delta, self.mu)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the location)."""
        return {
            "dataset": self.dataset,
            "budget": {
                "epsilon": self.budget_epsilon,
                "delta": self.budget_delta,
                "neighbours": self.budget_neighbours,
            },
            "convert_neighbours": self.convert_neighbours,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "calibration": self.calibration,
            "mu": self.mu,
            "neighbours": self.neighbours,
        }

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], location: str, password_file: str | None = None
    ) -> LedgerCharge:
        """Inverse of :meth:`to_dict`."""
        return cls(
            location=location,
            password_file=password_file,
            dataset=data["dataset"],
            budget_epsilon=float(data["budget"]["epsilon"]),
            budget_delta=float(data["budget"]["delta"]),
            budget_neighbours=data["budget"].get("neighbours", "replace-one"),
            convert_neighbours=bool(data.get("convert_neighbours", False)),
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            calibration=data["calibration"],
            mu=data["mu"],
            neighbours=data["neighbours"],
        )


@dataclass(frozen=True, kw_only=True)
class DpPcaStep:
    """A DP-PCA direction step that runs before the release (Analyze Gauss).

    Attributes
    ----------
    k : int
        Number of important directions.
    budget_share : float
        Fraction of the budget the step spends.
    lattice : Lattice or None
        The step's lattice (Analyze Gauss on the lattice of ``vech(X X^T) / sigma``) when the
        release uses lattice noise.
    """

    k: int
    budget_share: float
    lattice: Lattice | None = None

    def noise_std(self, domain: RecordDomain, neighbours: str, mu: float) -> float:
        """``sigma``: the standard deviation of the step's noise on the Gram matrix (its
        effective sensitivity over ``mu``; ``Delta / mu`` for float noise)."""
        sens = gram_sensitivity(domain, neighbours)  # type: ignore[arg-type]
        if self.lattice is None:
            return sens / mu
        return sens / self.lattice.sensitivity

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the lattice only when there is one)."""
        out: dict[str, Any] = {"k": self.k, "budget_share": self.budget_share}
        if self.lattice is not None:
            out["lattice"] = self.lattice.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DpPcaStep:
        """Inverse of :meth:`to_dict`."""
        lattice = data.get("lattice")
        return cls(
            k=int(data["k"]),
            budget_share=data["budget_share"],
            lattice=None if lattice is None else Lattice.from_dict(lattice),
        )
