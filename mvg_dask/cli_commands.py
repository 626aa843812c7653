"""Subcommands registered on the ``mvg-dask`` app (kept apart so ``calibrate`` stays light)."""

from __future__ import annotations
