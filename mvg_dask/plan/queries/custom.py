"""A user query of declared shape and ``s_2``: nothing is proved about it, nothing computed.

Its declared L2 sensitivity is its only bound (and ``gamma`` or an entry range where a paper
calibration needs one); the noise is rectangular, or symmetric when declared symmetric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from mvg_dask.plan.domain import Neighbours, RecordDomain
from mvg_dask.plan.queries.base import MatrixQuery

__all__ = ["CustomQuery"]


@dataclass(frozen=True)
class CustomQuery(MatrixQuery):
    """A user query (parameters of :class:`MatrixQuery`, and the following).

    Parameters
    ----------
    shape_ : tuple of int
        Output shape ``(m, n)``.
    symmetric, psd : bool
        Structure of the output.
    """

    kind: ClassVar[str] = "custom"

    shape_: tuple[int, int] | None = None
    symmetric: bool = False
    psd: bool = False

    def _check_fields(self) -> None:
        if self.shape_ is None or min(self.shape_) < 1:
            raise ValueError("a custom query needs its output shape (m, n)")
        if self.sensitivity is None:
            raise ValueError("a custom query needs its declared L2 sensitivity s2")

    @property
    def shape(self) -> tuple[int, int]:
        """The declared shape."""
        assert self.shape_ is not None
        return self.shape_

    @property
    def is_symmetric(self) -> bool:
        """As declared."""
        return self.symmetric

    @property
    def is_psd(self) -> bool:
        """As declared (and symmetric)."""
        return self.symmetric and self.psd

    def l1_sensitivity(self, domain: RecordDomain, neighbours: Neighbours) -> float:
        """``s_2 sqrt(m n)``."""
        m, n = self.shape
        assert self.sensitivity is not None
        return self.sensitivity * math.sqrt(m * n)

    def _extra_dict(self) -> dict[str, object]:
        return {"symmetric": self.symmetric, "psd": self.psd}

    @classmethod
    def fields_from_dict(cls, data: dict[str, Any]) -> dict[str, Any]:
        """:meth:`MatrixQuery.fields_from_dict` with the shape and structure."""
        return {
            **super().fields_from_dict(data),
            "shape_": tuple(data["shape"]),
            "symmetric": bool(data.get("symmetric", False)),
            "psd": bool(data.get("psd", False)),
        }
