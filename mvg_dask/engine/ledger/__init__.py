"""The engine's side of the ledger: the release session (:mod:`.session`).

The ledger itself (entries, reservations, composition, the SQLite, PostgreSQL and in-memory
backends) is :mod:`mvg_dask.ledger`, a layer below the engine; its public names are re-exported
here for code that imports them from the engine.
"""

from __future__ import annotations

from mvg_dask.ledger import *  # noqa: F403
from mvg_dask.ledger import __all__ as __all__
