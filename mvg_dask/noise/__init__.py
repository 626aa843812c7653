"""Noise layer: the keyed CSPRNG and the MVG samplers.

The names below are loaded on first use (PEP 562): the plan layer imports
:mod:`mvg_dask.noise.tiles` for its constants, and a dry run needs neither the lattice sampler
(mpmath) nor the CSPRNG (randomgen).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mvg_dask.noise.lattice import tile_rounded_gaussian
    from mvg_dask.noise.rng import NoiseKey
    from mvg_dask.noise.samplers import affine_sample, kronecker_sample, sqrt_factor
    from mvg_dask.noise.tiles import TILE_RECORDS, matrix_noise, record_noise, tile_normals

_WHERE = {
    "tile_rounded_gaussian": "lattice",
    "NoiseKey": "rng",
    "affine_sample": "samplers",
    "kronecker_sample": "samplers",
    "sqrt_factor": "samplers",
    "TILE_RECORDS": "tiles",
    "matrix_noise": "tiles",
    "record_noise": "tiles",
    "tile_normals": "tiles",
}

__all__ = [
    "TILE_RECORDS",
    "NoiseKey",
    "affine_sample",
    "kronecker_sample",
    "matrix_noise",
    "record_noise",
    "sqrt_factor",
    "tile_normals",
    "tile_rounded_gaussian",
]


_SUBMODULES = ("aes", "lattice", "rng", "samplers", "tiles")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:  # ``mvg_dask.noise.lattice`` without importing it first
        return importlib.import_module(f"{__name__}.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
