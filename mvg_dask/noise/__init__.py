"""Noise layer: the keyed CSPRNG and the MVG samplers."""

from mvg_dask.noise.lattice import tile_rounded_gaussian
from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.samplers import affine_sample, kronecker_sample, sqrt_factor
from mvg_dask.noise.tiles import TILE_RECORDS, matrix_noise, record_noise, tile_normals

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
