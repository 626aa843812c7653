"""Reusable hypothesis strategies (one place, as flox does)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

epsilons = st.floats(min_value=0.05, max_value=8.0)
deltas = st.floats(min_value=1e-9, max_value=0.2)
paper_calibrations_unimodal = st.sampled_from(["mvg-thm2", "mgm", "mgm-udn", "mgm-idn"])
paper_calibrations_equimodal = st.sampled_from(["mvg-thm2", "mvg-thm3", "mgm"])


@st.composite
def boxes(draw: st.DrawFn, m: int) -> tuple[np.ndarray, np.ndarray]:
    """A per-feature box with lower < upper."""
    lo = np.array(draw(st.lists(st.floats(-5, 5), min_size=m, max_size=m)))
    width = np.array(draw(st.lists(st.floats(0.05, 5), min_size=m, max_size=m)))
    return lo, lo + width


@st.composite
def orthonormal(draw: st.DrawFn, m: int) -> np.ndarray:
    """A random orthonormal matrix (QR of a seeded Gaussian matrix)."""
    seed = draw(st.integers(0, 2**32 - 1))
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((m, m)))
    return q * np.sign(np.diag(r))


@st.composite
def allocations(draw: st.DrawFn, m: int) -> np.ndarray:
    """A positive allocation summing to at most 1."""
    raw = np.array(draw(st.lists(st.floats(0.01, 1.0), min_size=m, max_size=m)))
    total = draw(st.floats(0.3, 1.0))
    return raw / raw.sum() * total
