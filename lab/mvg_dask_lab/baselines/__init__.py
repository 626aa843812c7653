"""Baseline mechanisms the experiments compare MVG against, at the same ``(epsilon, delta)``.

The MVG paper compares against four basic mechanisms (Sec. 2.1, 8.4):

=====================  ====================================  ===============================
mechanism              here                                  privacy
=====================  ====================================  ===============================
Laplace, Gaussian      :mod:`.iid` (iid additive noise)      ``epsilon`` / ``(epsilon, delta)``
JL transform           :mod:`.jl` (Blocki et al. 2012)       ``(epsilon, delta)``
Exponential, PCA       :mod:`.bingham` (PPCA, Chaudhuri      ``epsilon``
                       et al. 2012)
Exponential, data      :mod:`.blr` (Blum-Ligett-Roth over    ``epsilon``
                       a public candidate set)
=====================  ====================================  ===============================
"""

from mvg_dask_lab.baselines.bingham import PPCA, acg_parameter, ppca, sample_bingham
from mvg_dask_lab.baselines.blr import BLRMechanism, blr_candidates, blr_mechanism, moment_answers
from mvg_dask_lab.baselines.iid import BASELINES, Baseline, IidMechanism, iid_baseline
from mvg_dask_lab.baselines.jl import JLTransform, bbds_projections, bbds_w, jl_transform

__all__ = [
    "BASELINES",
    "PPCA",
    "BLRMechanism",
    "Baseline",
    "IidMechanism",
    "JLTransform",
    "acg_parameter",
    "bbds_projections",
    "bbds_w",
    "blr_candidates",
    "blr_mechanism",
    "iid_baseline",
    "jl_transform",
    "moment_answers",
    "ppca",
    "sample_bingham",
]
