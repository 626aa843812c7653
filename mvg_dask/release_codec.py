"""The published noise plan of a release: written once, read back one way.

A release publishes its noise plan as the attribute :data:`~mvg_dask.release_format.PLAN_ATTR`
(with a few of its terms as attributes of their own), and for the routes that compute part of
their noise at run time the value that noise waits for as noisy data variables: DP-PCA's
:data:`~mvg_dask.release_format.DIRECTIONS` (and
:data:`~mvg_dask.release_format.DP_PCA_EIGENVALUES`), a mean-first release's
:data:`~mvg_dask.release_format.CENTRE`. :class:`ReleaseCodec` is the one place that turns a plan
into those attributes (the writer, :mod:`mvg_dask.engine.output`) and a release back into the
noise plan it was made with: for the engine's resume, which checks the release against the plan
of its spec, and for the readers (the accessor's :func:`mvg_dask.interactive.read.noise_std`,
:func:`~mvg_dask.interactive.read.release_noise_plan`), which check it against the published
``row_cov``. Both resolve the pending plan (:mod:`mvg_dask.plan.pending`) with the same decoded
value, so an analyst's intervals use the noise plan a resume would.

Like :mod:`mvg_dask.release_format`, this module imports no dask, zarr, xarray or fsspec (an
import-linter contract holds it): the variables are any mapping of array-likes (an
``xarray.Dataset`` or numpy arrays).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mvg_dask.plan.noise_plan import NoisePlan
from mvg_dask.plan.pending import PendingCentre, PendingNoise, published_noise_plan
from mvg_dask.release_format import (
    CENTRE,
    PLAN_ATTR,
    ROUTE_ATTR,
    ROW_COV,
    check_complete,
    stored_directions,
)

if TYPE_CHECKING:
    from mvg_dask.plan.release_plan import ReleasePlan

__all__ = ["PlanMismatchError", "ReleaseCodec"]

#: The route attribute's value of a centered covariance by the mean first.
MEAN_FIRST = "mean-first"


class PlanMismatchError(ValueError):
    """A release's published plan is not the one expected of it."""


class ReleaseCodec:
    """Encode a plan's published noise plan; decode a release into the noise plan it was made
    with.

    Parameters
    ----------
    attrs : mapping
        The release's root attributes.
    variables : mapping
        Its variables by name (an ``xarray.Dataset``, or numpy arrays): the ones the pending
        plan waits for, and ``row_cov`` for :meth:`noise_plan`'s check.
    """

    def __init__(self, attrs: Mapping[str, Any], variables: Mapping[Any, Any]) -> None:
        self.attrs = attrs
        self.variables = variables

    # -- writing ----------------------------------------------------------------------------
    @staticmethod
    def encode(rplan: ReleasePlan) -> dict[str, Any]:
        """The plan's attributes that come from its noise plan: the published plan (pending
        for DP-PCA and mean-first releases, :meth:`ReleasePlan.public_noise_dict
        <mvg_dask.plan.release_plan.ReleasePlan.public_noise_dict>`) and the terms a release
        states on their own (``null`` while pending).

        Parameters
        ----------
        rplan : ReleasePlan
            The plan.

        Returns
        -------
        dict
            ``sensitivity``, ``gamma``, ``mahalanobis_sensitivity``, ``precision_budget``,
            ``lattice_log2_grid`` and ``plan`` (the JSON text), by their names in
            :data:`~mvg_dask.release_format.ATTRS`.
        """
        public = rplan.public_noise_dict()
        return {
            "sensitivity": public["sensitivity"],
            "gamma": public["gamma"],
            "mahalanobis_sensitivity": public["mahalanobis_sensitivity"],
            "precision_budget": public["precision_budget"],
            # the grid 2^k of a lattice release (null while DP-PCA's directions are pending:
            # it follows their whitening)
            "lattice_log2_grid": (public.get("lattice") or {}).get("log2_grid"),
            "plan": json.dumps(public),
        }

    # -- reading ----------------------------------------------------------------------------
    @property
    def public(self) -> dict[str, Any]:
        """The published noise plan, decoded."""
        return dict(json.loads(self.attrs[PLAN_ATTR]))

    @property
    def mean_first(self) -> bool:
        """The release took the mean-first route (its plan waits for the centre)."""
        return self.attrs.get(ROUTE_ATTR) == MEAN_FIRST

    def published(self) -> NoisePlan | PendingNoise:
        """The published noise plan: complete, or pending (:mod:`mvg_dask.plan.pending`)."""
        return published_noise_plan(self.public, mean_first=self.mean_first)

    def resolve(self, plan: NoisePlan | PendingNoise) -> NoisePlan:
        """``plan`` complete: a pending plan resolved with the release's decoded centre or
        DP-PCA directions (:func:`~mvg_dask.release_format.stored_directions`)."""
        if isinstance(plan, NoisePlan):
            return plan
        if isinstance(plan, PendingCentre):
            return plan.resolve(np.asarray(self.variables[CENTRE], dtype=np.float64))
        return plan.resolve(stored_directions(self.variables, self.public))

    def noise_plan(self) -> NoisePlan:
        """The noise plan a complete release was made with, from the release alone, checked
        against its published ``row_cov``.

        Raises
        ------
        IncompleteReleaseError
            Not a complete release.
        ValueError
            The plan does not reproduce the release's ``row_cov``: not an intact release.
        """
        check_complete(self.attrs)
        plan = self.resolve(self.published())
        published = np.asarray(self.variables[ROW_COV])
        if not np.allclose(plan.row_cov, published, rtol=1e-9, atol=0.0):
            raise ValueError("the release's row_cov does not match its plan: not an intact release")
        return plan

    def plan_for(self, rplan: ReleasePlan) -> NoisePlan:
        """The noise plan of ``rplan`` (planned again from the release's spec) as the release
        resolved it: its published plan must be ``rplan``'s, and a pending plan is resolved with
        the release's decoded value (the engine's resume).

        Raises
        ------
        PlanMismatchError
            The release was made with another plan.
        """
        if self.public != rplan.public_noise_dict():
            raise PlanMismatchError(
                f"release {rplan.release_id!r} at {rplan.output_store} was made with another "
                "plan than this spec gives; choose a new release_id"
            )
        pending = rplan.pending_noise()
        return rplan.noise_plan() if pending is None else self.resolve(pending)
