"""The Johnson-Lindenstrauss transform as an ``(epsilon, delta)``-DP release of a Gram matrix.

Blocki, Blum, Datta and Sheffet (BBDS) show that multiplying a data matrix ``A`` (records as
rows) by an ``r x n`` matrix of iid standard normals is ``(epsilon, delta)``-DP for neighbours
``A' = A + e_i v^T`` with ``||v|| <= 1``, provided every singular value of ``A`` is at least

    ``w = 16 sqrt(r ln(2/delta)) ln(16 r/delta) / epsilon``

(BBDS Thm. 3.1, Alg. 2 "approximating A^T A"). The public alteration that makes this hold for
every input lifts all singular values: ``A_w = U sqrt(Sigma^2 + w^2 I) V^T``, so that
``A_w^T A_w = A^T A + w^2 I``. The release is ``R = M A_w`` (``r x d``); ``R^T R / r - w^2 I``
estimates ``A^T A``. The number of projections ``r = 8 ln(2/nu) / eta^2`` is BBDS's free
parameter (their JL accuracy ``eta`` and failure probability ``nu``).

Records in a declared box are scaled by the box's diameter (the largest ``||x - x'||``, the
replace-one change of a row) so that neighbours differ by a row of norm at most 1, as BBDS
assume.

Each row of ``M A_w`` is distributed as ``N(0, A_w^T A_w)``, independently; :meth:`sample`
draws the rows with that law directly (``Z L^T`` with ``L L^T = A^T A + w^2 I``), which is the
same output distribution at ``O(r d^2)`` instead of ``O(r n d)`` work.

References
----------
.. [1] J. Blocki, A. Blum, A. Datta, O. Sheffet, "The Johnson-Lindenstrauss Transform Itself
   Preserves Differential Privacy", FOCS 2012, arXiv:1204.2136, Thm. 3.1 and Alg. 2.
.. [2] J. Upadhyay, "Randomness Efficient Fast-Johnson-Lindenstrauss Transform with Applications
   in Differential Privacy", arXiv:1410.2470: a structured (fast, randomness-efficient) matrix
   in place of BBDS's dense Gaussian ``M``, private under a singular-value condition of the same
   form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mvg_dask.privacy import calibration as cal

__all__ = ["JLTransform", "bbds_projections", "bbds_w", "jl_transform"]


def bbds_w(epsilon: float, delta: float, projections: int) -> float:
    """BBDS's singular-value floor ``w = 16 sqrt(r ln(2/delta)) ln(16 r/delta) / epsilon``.

    Parameters
    ----------
    epsilon, delta : float
        Privacy parameters (``0 < delta < 1``).
    projections : int
        Number ``r`` of Gaussian projections.

    Returns
    -------
    float
        ``w`` for neighbours whose rows differ by a vector of norm at most 1.

    References
    ----------
    .. [1] Blocki, Blum, Datta, Sheffet, FOCS 2012, Thm. 3.1.
    """
    cal._check_privacy(epsilon, delta)
    if delta <= 0:
        raise ValueError(f"the JL transform needs delta > 0, got {delta}")
    if projections < 1:
        raise ValueError(f"projections must be at least 1, got {projections}")
    r = float(projections)
    return 16.0 * math.sqrt(r * math.log(2.0 / delta)) * math.log(16.0 * r / delta) / epsilon


def bbds_projections(eta: float, nu: float) -> int:
    """BBDS's number of projections ``r = ceil(8 ln(2/nu) / eta^2)``.

    Parameters
    ----------
    eta : float
        Multiplicative accuracy of the JL estimate of each directional variance.
    nu : float
        Failure probability of that accuracy.

    Returns
    -------
    int
        ``r``.
    """
    if not (0 < eta and 0 < nu < 1):
        raise ValueError(f"need eta > 0 and 0 < nu < 1, got eta={eta}, nu={nu}")
    return math.ceil(8.0 * math.log(2.0 / nu) / eta**2)


@dataclass(frozen=True, kw_only=True)
class JLTransform:
    """A calibrated BBDS JL release of the Gram matrix of a record matrix.

    Attributes
    ----------
    epsilon, delta : float
        Privacy parameters; the release is ``(epsilon, delta)``-DP (BBDS Thm. 3.1).
    projections : int
        ``r``, the number of rows of the release.
    w : float
        Singular-value floor for unit row changes (:func:`bbds_w`).
    row_change : float
        Largest norm of the change of one row between neighbours (the scale the records are
        divided by).
    """

    epsilon: float
    delta: float
    projections: int
    w: float
    row_change: float

    @property
    def lift(self) -> float:
        """``(row_change * w)^2``: what the release adds to the Gram matrix's diagonal."""
        return (self.row_change * self.w) ** 2

    def gram_factor(self, records: np.ndarray) -> np.ndarray:
        """Lower Cholesky factor of the lifted Gram ``A^T A + lift I`` of ``records`` (n x d)."""
        a = np.asarray(records, dtype=np.float64)
        gram = a.T @ a + self.lift * np.eye(a.shape[1])
        return np.linalg.cholesky(gram)

    def sample(self, records: np.ndarray, rng: np.random.Generator, trials: int) -> np.ndarray:
        """Draw ``trials`` releases ``M A_w`` (in the records' units).

        Parameters
        ----------
        records : numpy.ndarray
            ``n x d``, one record per row.
        rng : numpy.random.Generator
            Keyed generator.
        trials : int
            Number of independent releases.

        Returns
        -------
        numpy.ndarray
            Shape ``(trials, r, d)``; each row ``~ N(0, A^T A + lift I)``.
        """
        factor = self.gram_factor(records)
        z = rng.standard_normal((trials, self.projections, factor.shape[0]))
        return np.asarray(z @ factor.T)

    def gram_estimate(self, release: np.ndarray) -> np.ndarray:
        """Unbiased estimate ``R^T R / r - lift I`` of ``A^T A`` from releases ``(T, r, d)``."""
        d = release.shape[-1]
        gram = np.swapaxes(release, -1, -2) @ release / self.projections
        return np.asarray(gram - self.lift * np.eye(d))


def jl_transform(
    *, epsilon: float, delta: float, projections: int, row_change: float
) -> JLTransform:
    """Calibrate the BBDS JL transform.

    Parameters
    ----------
    epsilon, delta : float
        Privacy parameters.
    projections : int
        ``r`` (see :func:`bbds_projections`).
    row_change : float
        Largest ``||x - x'||`` between a record and its replacement (the declared domain's
        diameter for replace-one neighbours).

    Returns
    -------
    JLTransform
        The calibrated mechanism.

    References
    ----------
    .. [1] Blocki, Blum, Datta, Sheffet, FOCS 2012, Alg. 2 and Thm. 3.1.
    """
    if not row_change > 0:
        raise ValueError(f"row_change must be positive, got {row_change}")
    return JLTransform(
        epsilon=epsilon,
        delta=delta,
        projections=int(projections),
        w=bbds_w(epsilon, delta, projections),
        row_change=float(row_change),
    )
