"""Noise layer: the keyed CSPRNG and the MVG samplers."""

from mvg_dask.noise.rng import NoiseKey
from mvg_dask.noise.samplers import affine_sample, kronecker_sample, sqrt_factor

__all__ = ["NoiseKey", "affine_sample", "kronecker_sample", "sqrt_factor"]
