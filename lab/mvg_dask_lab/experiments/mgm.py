"""The MGM paper's learning experiments (its Sec. 8, Figs. 2 and 3), with the product's rounds.

Every private upload is a round of :func:`mvg_dask.api.training_run` (one run per participant
and training: the participant's total ``(epsilon, delta)`` split over its rounds by
dp-accounting's privacy-loss distributions, with Poisson-sampling amplification), so every
mechanism is measured at the same total ``(epsilon, delta)`` under the same accountant. A
second table reproduces the paper's own accounting of its Gaussian baseline: ``epsilon`` per
*element* of the matrix (its Sec. 8.2), labelled as such.

=========================  =================================================================
mechanism                  what a round is
=========================  =================================================================
``gaussian``               i.i.d. analytic Gaussian on the whole matrix (``s_2 = 2C sqrt(mn)``)
``exact``                  the product's ``exact`` calibration (uniform allocation)
``mvg``                    MVG Thm. 2, Alg. 1, binary allocation (the paper's MVG baseline)
``mgm``                    MGM Thm. 1 (unimodal)
``udn``                    MGM Thm. 2 (UDN)
``idn``                    MGM Thm. 3 (IDN, entry range ``[-C, C]``)
``gaussian-per-element``   the paper's accounting: the round's ``(epsilon_r, delta_r)`` of
                           the matrix mechanisms, spent by i.i.d. Gaussian noise on *each
                           element* (sensitivity ``2C``): not the privacy of the others
=========================  =================================================================
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mvg_dask import api
from mvg_dask.engine.rounds import noisy_round
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.plan.rounds import RoundBound, plan_round
from mvg_dask.privacy.accounting import GaussianDP
from mvg_dask.privacy.rounds import split_run_budget
from mvg_dask_lab.experiments.fl import (
    Dataset,
    HorizontalSetup,
    Upload,
    VerticalSetup,
    horizontal_fl,
    load_ctg_binary,
    load_digits_dataset,
    vertical_fl,
)

__all__ = [
    "DELTA",
    "EPSILONS",
    "MECHANISMS",
    "MgmResult",
    "Point",
    "Setting",
    "default_settings",
    "describe",
    "run_mgm",
]

#: The paper's delta (Sec. 8.2).
DELTA = 1e-5
#: Total epsilon per participant and training: the paper's Type II range [1, 10], and 30 and
#: 100, where the first mechanisms leave chance level.
EPSILONS: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0, 100.0)
#: Mechanism -> (calibration, allocation kind); ``None``: the paper's per-element Gaussian.
MECHANISMS: dict[str, str | None] = {
    "gaussian": "gaussian",
    "exact": "exact",
    "mvg": "mvg-thm2",
    "mgm": "mgm",
    "udn": "mgm-udn",
    "idn": "mgm-idn",
    "gaussian-per-element": None,
}
#: The binary allocation's share of the important rows (the MVG paper's default).
MVG_SHARE = 0.8


@dataclass(frozen=True)
class Setting:
    """One experiment: a type (``horizontal``/``vertical``) on a data set."""

    kind: str
    data: Dataset
    horizontal: HorizontalSetup = field(default_factory=HorizontalSetup)
    vertical: VerticalSetup = field(default_factory=VerticalSetup)

    @property
    def name(self) -> str:
        """``type-I-ctg`` etc."""
        return f"{'type-I' if self.kind == 'horizontal' else 'type-II'}-{self.data.name}"

    def shape(self) -> tuple[int, int]:
        """One upload's shape."""
        if self.kind == "horizontal":
            d, h, K = self.data.X.shape[1], self.horizontal.hidden, self.data.classes
            return (d + 1 + K, h + 1)
        return (self.vertical.batch, self.vertical.features)

    def rounds(self) -> int:
        """Rounds per participant's run."""
        return self.horizontal.rounds if self.kind == "horizontal" else self.vertical.rounds

    def participants(self) -> int:
        """5 horizontal, 2 vertical."""
        return self.horizontal.participants if self.kind == "horizontal" else 2

    def clip(self) -> float:
        """The entrywise bound ``C`` of an upload."""
        return self.horizontal.clip if self.kind == "horizontal" else 1.0

    def sampling(self) -> float:
        """Each round's Poisson rate."""
        if self.kind == "horizontal":
            return self.horizontal.sampling_probability
        return min(1.0, self.vertical.batch / len(self.data.y))

    def important(self) -> list[int]:
        """MVG's important rows: the output layer's (Type I); the first quarter of the batch
        rows (Type II, where no row matters more: a public, arbitrary choice)."""
        m, _ = self.shape()
        if self.kind == "horizontal":
            return list(range(m - self.data.classes, m))
        return list(range(max(1, m // 4)))

    def train(self, upload: Upload | None, seed: int) -> float:
        """Test accuracy of one training (participants as Dask tasks)."""
        if self.kind == "horizontal":
            return horizontal_fl(self.data, self.horizontal, upload, seed, compute=_dask_tasks)
        return vertical_fl(self.data, self.vertical, upload, seed, compute=_dask_tasks)


def _dask_tasks(tasks: list[Callable[[], np.ndarray]]) -> list[np.ndarray]:
    """The participants' uploads of a round, computed as Dask tasks (threads, no cluster)."""
    import dask

    return list(dask.compute(*[dask.delayed(t)() for t in tasks], scheduler="threads"))


@dataclass(frozen=True)
class Point:
    """Test accuracies of one (setting, mechanism, epsilon) over the seeded runs."""

    setting: str
    mechanism: str
    epsilon: float | None
    accuracies: tuple[float, ...]
    noise_std: float | None

    @property
    def mean(self) -> float:
        """Mean accuracy."""
        return float(np.mean(self.accuracies))

    @property
    def std(self) -> float:
        """Standard deviation over the runs."""
        return float(np.std(self.accuracies, ddof=1)) if len(self.accuracies) > 1 else 0.0


@dataclass
class MgmResult:
    """Every point of a run, and how it was made."""

    points: list[Point] = field(default_factory=list)
    settings: list[Setting] = field(default_factory=list)
    epsilons: tuple[float, ...] = EPSILONS
    seeds: int = 5
    elapsed: float = 0.0
    quick: bool = False

    def point(self, setting: str, mechanism: str, epsilon: float | None) -> Point:
        """The point of ``(setting, mechanism, epsilon)``."""
        for p in self.points:
            if (p.setting, p.mechanism, p.epsilon) == (setting, mechanism, epsilon):
                return p
        raise KeyError((setting, mechanism, epsilon))


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _private_upload(
    setting: Setting, mechanism: str, epsilon: float, seed: int
) -> tuple[Upload, float]:
    """One training's uploads: a run per participant; and the noise std of an entry."""
    calibration = MECHANISMS[mechanism]
    if calibration is None:
        return _per_element_upload(setting, epsilon, seed)
    allocation = (
        {"binary": {"important": setting.important(), "share": MVG_SHARE}}
        if mechanism == "mvg"
        else None
    )
    runs = [
        api.training_run(
            shape=setting.shape(),
            rounds=setting.rounds(),
            epsilon=epsilon,
            delta=DELTA,
            calibration=calibration,
            clip=setting.clip(),
            allocation=allocation,
            sampling_probability=setting.sampling(),
            seed=_seed(setting.name, mechanism, epsilon, seed, p),
        )
        for p in range(setting.participants())
    ]

    def upload(p: int, t: int, x: np.ndarray) -> np.ndarray:
        return runs[p].release(x)

    return upload, float(np.sqrt(np.mean(runs[0].plan.std ** 2)))


def _per_element_upload(setting: Setting, epsilon: float, seed: int) -> tuple[Upload, float]:
    """The paper's accounting of its Gaussian baseline: each element gets the matrix
    mechanisms' per-round ``(epsilon_r, delta_r)`` with its own sensitivity ``2C`` (a
    Frobenius bound ``C`` on one element), i.e. ``mn`` times that privacy loss per round."""
    share = split_run_budget(
        epsilon,
        DELTA,
        rounds=setting.rounds(),
        sampling_probability=setting.sampling(),
        gaussian_dp=False,
    )
    element = GaussianDP.calibrated(share.epsilon, share.delta)
    C = setting.clip()
    plan = plan_round(setting.shape(), calibration="gaussian", loss=element,
                      bound=RoundBound("frobenius", C))  # fmt: skip
    plan = dataclasses.replace(plan, bound=RoundBound("clip", C))  # the uploads' own bound
    keys = [
        NoiseKey.from_seed(_seed(setting.name, "per-element", epsilon, seed, p))
        for p in range(setting.participants())
    ]

    def upload(p: int, t: int, x: np.ndarray) -> np.ndarray:
        return noisy_round(x, plan, keys[p], tile=t)

    return upload, float(plan.std[0, 0])


def run_mgm(
    settings: Sequence[Setting],
    *,
    epsilons: Sequence[float] = EPSILONS,
    mechanisms: Sequence[str] = tuple(MECHANISMS),
    seeds: int = 5,
    progress: Callable[[str], None] | None = None,
) -> MgmResult:
    """Run every (setting, mechanism, epsilon) ``seeds`` times, and the non-private ceiling.

    Parameters
    ----------
    settings : sequence of Setting
        The experiments (:func:`default_settings`).
    epsilons : sequence of float
        Total epsilon per participant.
    mechanisms : sequence of str
        Keys of :data:`MECHANISMS`.
    seeds : int
        Seeded runs per point.
    progress : callable, optional
        Receives one line per point.

    Returns
    -------
    MgmResult
        The points.
    """
    start = time.perf_counter()
    result = MgmResult(settings=list(settings), epsilons=tuple(epsilons), seeds=seeds)
    say = progress or (lambda line: None)
    for setting in settings:
        accs = tuple(setting.train(None, s) for s in range(seeds))
        result.points.append(Point(setting.name, "non-private", None, accs, None))
        say(f"[mgm] {setting.name} non-private: {np.mean(accs):.3f}")
        for mechanism in mechanisms:
            for eps in epsilons:
                runs, std = [], 0.0
                for s in range(seeds):
                    upload, std = _private_upload(setting, mechanism, eps, s)
                    runs.append(setting.train(upload, s))
                point = Point(setting.name, mechanism, float(eps), tuple(runs), std)
                result.points.append(point)
                say(
                    f"[mgm] {setting.name} {mechanism} eps={eps:g}: {point.mean:.3f} "
                    f"+- {point.std:.3f} (noise std {std:.3g}, "
                    f"{time.perf_counter() - start:.0f} s)"
                )
    result.elapsed = time.perf_counter() - start
    return result


def default_settings(*, quick: bool = False) -> list[Setting]:
    """Type I and Type II on CTG (for Adult) and digits (for MNIST); ``quick``: CTG only, with
    fewer rounds."""
    ctg = load_ctg_binary()
    horizontal = HorizontalSetup(hidden=4, rounds=8, local_steps=10, local_lr=2.0, clip=0.1)
    vertical = VerticalSetup(features=4, batch=64, rounds=30, lr=1.0)
    if quick:
        horizontal = dataclasses.replace(horizontal, rounds=2)
        vertical = dataclasses.replace(vertical, rounds=4)
        return [
            Setting("horizontal", ctg, horizontal=horizontal),
            Setting("vertical", ctg, vertical=vertical),
        ]
    digits = load_digits_dataset()
    return [
        Setting("horizontal", ctg, horizontal=horizontal),
        Setting("horizontal", digits, horizontal=dataclasses.replace(horizontal, hidden=8)),
        Setting("vertical", ctg, vertical=vertical),
        Setting("vertical", digits, vertical=vertical),
    ]


def describe(setting: Setting) -> dict[str, Any]:
    """The public configuration of a setting (for the results page)."""
    m, n = setting.shape()
    return {
        "setting": setting.name,
        "data": setting.data.description,
        "train": len(setting.data.y),
        "test": len(setting.data.y_test),
        "participants": setting.participants(),
        "shape": f"{m} x {n}",
        "rounds": setting.rounds(),
        "sampling": round(setting.sampling(), 4),
        "clip": setting.clip(),
        "s2": 2 * setting.clip() * math.sqrt(m * n),
    }
