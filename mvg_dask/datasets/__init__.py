"""The three real data sets of the MVG paper, shipped with the package, and their loaders.

See ``mvg_dask/datasets/data/ATTRIBUTION.md`` for creators, citations and licences, and each
data set's ``SOURCE.md`` for provenance and checksums.

=====================  ==========  ==================================  ==========================
loader                 experiment  shape of ``X`` (features x records)  declared record domain
=====================  ==========  ==================================  ==========================
:func:`load_liver`     Exp. I      6 x 248 (+ 6 x 97 in ``X_test``)      [0, 1]
:func:`load_movement`  Exp. II     4 x 10,176 / 2,021 / 13,197         [-1, 1]
:func:`load_ctg`       Exp. III    21 x 2,126                          [0, 1]
=====================  ==========  ==================================  ==========================
"""

from mvg_dask.datasets.loaders import (
    CTG_BOUNDS,
    CTG_IMPORTANT,
    LIVER_BOUNDS,
    LIVER_IMPORTANT,
    LIVER_N_TEST,
    LIVER_N_TRAIN,
    MOVEMENT_BOUNDS,
    MOVEMENT_IMPORTANT,
    MOVEMENT_SAMPLES,
    MovementSample,
    PaperDataset,
    load_ctg,
    load_liver,
    load_movement,
)

__all__ = [
    "CTG_BOUNDS",
    "CTG_IMPORTANT",
    "LIVER_BOUNDS",
    "LIVER_IMPORTANT",
    "LIVER_N_TEST",
    "LIVER_N_TRAIN",
    "MOVEMENT_BOUNDS",
    "MOVEMENT_IMPORTANT",
    "MOVEMENT_SAMPLES",
    "MovementSample",
    "PaperDataset",
    "load_ctg",
    "load_liver",
    "load_movement",
]
