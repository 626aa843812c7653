"""Blum-Ligett-Roth's exponential mechanism over a finite, public set of synthetic databases.

BLR release a synthetic database ``D'`` of ``m`` records drawn with probability
``proportional to exp(-epsilon N err(D, D') / 2)``, where ``err(D, D') = max_{q in C}
|q(D) - q(D')|`` over a class ``C`` of normalised linear (counting) queries, each of sensitivity
``1/N``; the range is *every* database of ``m`` records over a discretised domain, which makes
the mechanism exponential-time (``g^(d m)`` candidates for a grid of ``g`` levels per feature).

The tractable instance here is the same exponential mechanism (same score, same sensitivity,
same ``epsilon``) over ``K`` candidate databases drawn *independently of the data* from public
randomness. The exponential mechanism is ``epsilon``-DP on any data-independent range (McSherry &
Talwar 2007), so the privacy statement is BLR's; BLR's accuracy theorem, which needs the full
range, does not carry over, and the report measures how far the best candidate is from the data.

* Query class ``C``: all means ``E[z_j]`` and second moments ``E[z_j z_k]`` (``j <= k``) of the
  records scaled to ``z in [0, 1]^d`` by the declared box: ``d + d(d+1)/2`` linear queries with
  values in ``[0, 1]`` per record, so each changes by at most ``1/N`` under replace-one.
* Candidates: each of ``m`` records on the grid ``{0, 1/(g-1), ..., 1}^d``; per candidate and
  feature a Beta(a, b) law with ``a, b ~ U(0.5, 5)`` (public), rounded to the grid.

References
----------
.. [1] A. Blum, K. Ligett, A. Roth, "A Learning Theory Approach to Noninteractive Database
   Privacy", JACM 60(2):12, 2013, Sec. 3 (the exponential mechanism over small databases).
.. [2] F. McSherry, K. Talwar, "Mechanism Design via Differential Privacy", FOCS 2007, Thm. 6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BLRMechanism", "blr_candidates", "blr_mechanism", "moment_answers"]


def moment_answers(z: np.ndarray) -> np.ndarray:
    """Answers of the query class: means and upper-triangle second moments of ``(..., n, d)``.

    Parameters
    ----------
    z : numpy.ndarray
        Records scaled to ``[0, 1]``, shape ``(..., n, d)``.

    Returns
    -------
    numpy.ndarray
        Shape ``(..., d + d(d+1)/2)``.
    """
    z = np.asarray(z, dtype=np.float64)
    n, d = z.shape[-2:]
    means = z.mean(axis=-2)
    second = np.swapaxes(z, -1, -2) @ z / n
    iu = np.triu_indices(d)
    return np.concatenate([means, second[..., iu[0], iu[1]]], axis=-1)


def blr_candidates(
    rng: np.random.Generator, *, count: int, size: int, features: int, grid: int
) -> np.ndarray:
    """``count`` public candidate databases of ``size`` records on a grid of ``[0, 1]^features``.

    Parameters
    ----------
    rng : numpy.random.Generator
        Public generator (the candidates depend on it only, never on the data).
    count, size, features : int
        ``K``, ``m`` and ``d``.
    grid : int
        Levels per feature (at least 2).

    Returns
    -------
    numpy.ndarray
        Shape ``(count, size, features)``, values in ``{0, 1/(grid-1), ..., 1}``.
    """
    if count < 1 or size < 1 or features < 1 or grid < 2:
        raise ValueError("need count, size, features >= 1 and grid >= 2")
    a = rng.uniform(0.5, 5.0, size=(count, 1, features))
    b = rng.uniform(0.5, 5.0, size=(count, 1, features))
    z = rng.beta(a, b, size=(count, size, features))
    return np.round(z * (grid - 1)) / (grid - 1)


@dataclass(frozen=True, kw_only=True, eq=False)
class BLRMechanism:
    """The exponential mechanism over public candidate databases (``epsilon``-DP, ``delta = 0``).

    Attributes
    ----------
    epsilon : float
        Privacy parameter.
    records : int
        ``N``; the score ``-err`` has sensitivity ``1/N``.
    lower, upper : numpy.ndarray
        Declared box of one record (length ``d``).
    candidates : numpy.ndarray
        ``(K, m, d)`` candidates in ``[0, 1]`` units.
    grid : int
        Levels per feature of the discretised domain.
    """

    epsilon: float
    records: int
    lower: np.ndarray
    upper: np.ndarray
    candidates: np.ndarray
    grid: int

    @property
    def delta(self) -> float:
        """Always 0."""
        return 0.0

    @property
    def log10_full_range(self) -> float:
        """``log10`` of the number of databases BLR's full range holds, ``g^(d m)``."""
        _, m, d = self.candidates.shape
        return d * m * math.log10(self.grid)

    def scale(self, records: np.ndarray) -> np.ndarray:
        """Records ``(n, d)`` in the declared box mapped to ``[0, 1]^d``."""
        return (np.asarray(records, dtype=np.float64) - self.lower) / (self.upper - self.lower)

    def unscale(self, z: np.ndarray) -> np.ndarray:
        """``[0, 1]`` units back to the declared box."""
        return np.asarray(self.lower + z * (self.upper - self.lower))

    def errors(self, records: np.ndarray) -> np.ndarray:
        """``err(D, D'_k) = max_q |q(D) - q(D'_k)|`` for every candidate ``k`` (shape ``(K,)``)."""
        truth = moment_answers(self.scale(records))
        return np.asarray(np.max(np.abs(moment_answers(self.candidates) - truth), axis=-1))

    def sample(self, records: np.ndarray, rng: np.random.Generator, trials: int) -> np.ndarray:
        """Draw ``trials`` candidate indices with probability ``~ exp(-epsilon N err / 2)``.

        Sampling is exact (Gumbel-max: ``argmax_k (log-weight_k + G_k)`` with iid standard Gumbel
        ``G_k`` has the softmax law).

        Parameters
        ----------
        records : numpy.ndarray
            The private records ``(N, d)`` in the declared box.
        rng : numpy.random.Generator
            Keyed generator.
        trials : int
            Number of independent releases.

        Returns
        -------
        numpy.ndarray
            Integer indices into :attr:`candidates`, shape ``(trials,)``.
        """
        logw = -0.5 * self.epsilon * self.records * self.errors(records)
        gumbel = rng.gumbel(size=(trials, logw.size))
        return np.asarray(np.argmax(logw[None, :] + gumbel, axis=1))

    def probabilities(self, records: np.ndarray) -> np.ndarray:
        """The exact selection law over the candidates (for checks and reports)."""
        logw = -0.5 * self.epsilon * self.records * self.errors(records)
        w = np.exp(logw - logw.max())
        return np.asarray(w / w.sum())


def blr_mechanism(
    *,
    epsilon: float,
    records: int,
    lower: np.ndarray,
    upper: np.ndarray,
    candidates: np.ndarray,
    grid: int,
) -> BLRMechanism:
    """Calibrate BLR's exponential mechanism on a public candidate set.

    Parameters
    ----------
    epsilon : float
        Privacy parameter.
    records : int
        ``N`` of the private data (public under replace-one neighbours).
    lower, upper : numpy.ndarray
        Declared box of one record.
    candidates : numpy.ndarray
        From :func:`blr_candidates`.
    grid : int
        Its grid levels.

    Returns
    -------
    BLRMechanism
        The mechanism.

    References
    ----------
    .. [1] Blum, Ligett, Roth, JACM 2013; McSherry, Talwar, FOCS 2007.
    """
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon}")
    if records < 1:
        raise ValueError(f"records must be at least 1, got {records}")
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if np.any(hi <= lo):
        raise ValueError("every upper bound must exceed its lower bound")
    return BLRMechanism(
        epsilon=float(epsilon),
        records=int(records),
        lower=lo,
        upper=hi,
        candidates=np.asarray(candidates, dtype=np.float64),
        grid=int(grid),
    )
