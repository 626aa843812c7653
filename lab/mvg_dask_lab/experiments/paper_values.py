"""What the MVG paper *reported* in its Tables 3-5: the only numbers typed into this package.

Every value below is copied from Chanyaswad, Dytso, Poor, Mittal, "A Differential Privacy
Mechanism Design Under Matrix-Valued Query" (arXiv:1802.10077, full version), Sec. 9,
Tables 3, 4 and 5, as printed: each table gives its errors in a common unit (RMSE x 10^-2,
Delta-rho x 10^-1, RSS x 10^-2), kept here as :attr:`PaperTable.scale`. All rows are at
``epsilon = 1`` and ``delta = 1/n`` (``delta = 0`` for the Laplace and exponential mechanisms).
Nothing here is ever computed; the experiments print these numbers *beside* their own.

References
----------
.. [1] T. Chanyaswad, A. Dytso, H. V. Poor, P. Mittal, "A Differential Privacy Mechanism Design
   Under Matrix-Valued Query", arXiv:1802.10077, Tables 3-5.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = ["PAPER_TABLES", "PaperRow", "PaperTable"]


@dataclass(frozen=True, kw_only=True)
class PaperRow:
    """One row of a results table of the paper, in the table's printed unit.

    Attributes
    ----------
    label : str
        The paper's row label.
    mean : float
        Printed mean (multiply by the table's ``scale`` for the absolute value).
    ci : float or None
        Printed half-width of the 95 % confidence interval (``None`` where none is printed).
    approximate : bool
        True where the paper prints ``~`` (random guess).
    epsilon, delta : str
        As printed (``"-"``, ``"1.0"``, ``"1/n"``, ``"0"``).
    ours : str or None
        Key of the method of this package that reproduces the row, or ``None`` when the row has
        no counterpart here.
    """

    label: str
    mean: float
    ci: float | None
    approximate: bool = False
    epsilon: str = "1.0"
    delta: str = "1/n"
    ours: str | None = None


@dataclass(frozen=True, kw_only=True)
class PaperTable:
    """A results table of the paper.

    Attributes
    ----------
    table : str
        ``"Table 3"`` etc.
    metric : str
        Metric name as printed.
    scale : float
        Printed unit: absolute value = printed value x ``scale``.
    rows : tuple of PaperRow
        The rows, in the paper's order.
    """

    table: str
    metric: str
    scale: float
    rows: tuple[PaperRow, ...]

    def by_method(self) -> dict[str, PaperRow]:
        """Rows that have a counterpart here, keyed by our method key."""
        return {r.ours: r for r in self.rows if r.ours is not None}


def _references(non_private: float, random_guess: float) -> tuple[PaperRow, PaperRow]:
    """The non-private and random-guess rows (no epsilon; the random guess printed with ``~``)."""
    return (
        PaperRow(
            label="Non-private",
            mean=non_private,
            ci=None,
            epsilon="-",
            delta="-",
            ours="non-private",
        ),
        PaperRow(
            label="Random guess",
            mean=random_guess,
            ci=None,
            approximate=True,
            epsilon="-",
            delta="-",
            ours="random-guess",
        ),
    )


def _laplace(mean: float, ci: float) -> PaperRow:
    """The Laplace row (pure DP), labelled alike in the three tables."""
    return PaperRow(label="Laplace (Dwork et al. [3])", mean=mean, ci=ci, delta="0", ours="laplace")


#: Table 3, Exp. I (regression, Liver): RMSE x 10^-2.
TABLE_3: Final = PaperTable(
    table="Table 3",
    metric="RMSE",
    scale=1e-2,
    rows=(
        *_references(1.226, 3.989),
        PaperRow(
            label="MVG using the binary allocation strategy", mean=1.624, ci=0.026, ours="mvg-thm2"
        ),
        PaperRow(
            label="MVG using the max-PNR allocation strategy",
            mean=1.611,
            ci=0.046,
            ours="mvg-thm2-dppca",
        ),
        PaperRow(
            label="Gaussian (Dwork et al. [2])", mean=1.913, ci=0.069, ours="gaussian-classic"
        ),
        PaperRow(label="JL transform (Upadhyay [46])", mean=1.682, ci=0.015, ours="jl"),
        _laplace(2.482, 0.189),
        PaperRow(
            label="Exponential (Blum et al. [104])", mean=2.202, ci=0.721, delta="0", ours="blr"
        ),
    ),
)

#: Table 4, Exp. II (first principal component, Movement): Delta-rho x 10^-1.
TABLE_4: Final = PaperTable(
    table="Table 4",
    metric="Δρ",
    scale=1e-1,
    rows=(
        *_references(0.0, 4.370),
        PaperRow(label="MVG with Theorem 2", mean=2.138, ci=0.192, ours="mvg-thm2"),
        PaperRow(label="MVG with Theorem 3", mean=1.434, ci=0.192, ours="mvg-thm3"),
        PaperRow(label="Gaussian (Dwork et al. [25])", mean=2.290, ci=0.185, ours="analyze-gauss"),
        PaperRow(label="JL transform (Blocki et al. [42])", mean=2.258, ci=0.186, ours="jl"),
        _laplace(2.432, 0.177),
        PaperRow(
            label="Exponential (Chaudhuri et al. [27])",
            mean=1.742,
            ci=0.188,
            delta="0",
            ours="ppca",
        ),
    ),
)

#: Table 5, Exp. III (covariance estimation, CTG): RSS x 10^-2.
TABLE_5: Final = PaperTable(
    table="Table 5",
    metric="RSS",
    scale=1e-2,
    rows=(
        *_references(0.0, 12.393),
        PaperRow(label="MVG", mean=6.657, ci=0.193, ours="mvg-thm2"),
        PaperRow(
            label="Gaussian (Dwork et al. [2])", mean=7.029, ci=0.216, ours="gaussian-classic"
        ),
        PaperRow(label="JL transform (Upadhyay [46])", mean=6.718, ci=0.229, ours="jl"),
        _laplace(7.109, 0.211),
        PaperRow(
            label="Exponential (Blum et al. [104])", mean=7.223, ci=0.211, delta="0", ours="blr"
        ),
    ),
)

#: The paper's tables by experiment name.
PAPER_TABLES: Final[Mapping[str, PaperTable]] = MappingProxyType(
    {"regression": TABLE_3, "first-pc": TABLE_4, "covariance": TABLE_5}
)
