"""The lab of mvg_dask: the paper's experiments, the literature baselines, the benchmarks.

A separate distribution (``mvg_dask_lab``, the directory ``lab/`` of the repository), installed as
the core's extra ``mvg-dask[experiments]``:

=======================  ==================================================================
package                  what
=======================  ==================================================================
:mod:`.experiments`      the MVG paper's three experiments (Tables 3-5), their reports and
                         results document, the covariance benchmark, ``mvg-dask experiments``
:mod:`.baselines`        the mechanisms the experiments compare against: iid Gaussian and
                         Laplace, the JL transform, PPCA, BLR, the modern DP covariance
                         estimators
=======================  ==================================================================

The lab imports the core (:mod:`mvg_dask`); the core never imports the lab: the command
``mvg-dask experiments`` finds it by name when it runs.
"""

from mvg_dask._version import __version__

__all__ = ["__version__"]
