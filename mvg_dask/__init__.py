"""mvg_dask: differentially private matrix-valued releases with the MVG mechanism."""

from mvg_dask._version import __version__

__all__ = ["__version__"]
