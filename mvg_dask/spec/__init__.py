"""Release specifications (YAML), validated before any data is read.

Unknown keys are errors, every field is checked, and every error message names the field (its
dotted path) and what to do. :func:`load_spec` turns any problem into a :class:`SpecError`.
"""

# The modules, by concern: base (SpecError, the strict base model, the YAML 1.2 loader, a store
# URL's scheme), sections (input, domain, mechanism, output), privacy (privacy, ledger, budget),
# queries (the query sections), release (ReleaseSpec, its checks and hash) and loader (reading,
# validating, one-line error messages). Every public name is importable from here.
from typing import Annotated, Any, Literal  # noqa: F401 (see the end of the module)

from pydantic import Field  # noqa: F401

from mvg_dask.privacy.allocation import AllocationStrategy  # noqa: F401
from mvg_dask.privacy.calibration import Algorithm, Calibration  # noqa: F401
from mvg_dask.spec.base import LOCAL_SCHEMES, Scalars, SpecError, SpecLoader, is_local, url_scheme
from mvg_dask.spec.loader import load_spec, parse_spec, parse_yaml, resolve_paths, with_output_store
from mvg_dask.spec.privacy import BudgetSpec, LedgerSpec, PrivacySpec
from mvg_dask.spec.queries import (
    MAX_GROUPS,
    MOMENT_QUERY_KINDS,
    SQUARE_QUERIES,
    WORD_ROUTES,
    CenteredCovarianceSpec,
    CenteredParams,
    CenteredRoute,
    ColAllocationSpec,
    ColumnsSpec,
    CrossCovarianceQuerySpec,
    CrossCovarianceSpec,
    FeatureLabel,
    GroupBySpec,
    RegressionParams,
    RegressionSpec,
    SimpleQuery,
)
from mvg_dask.spec.release import ReleaseSpec, spec_hash
from mvg_dask.spec.sections import (
    AllocationSpecModel,
    BoxSpec,
    DirectionsSpec,
    DomainSpec,
    InputSpec,
    MechanismSpec,
    Missing,
    MissingSpec,
    OutputSpec,
    StreamSpec,
)

__all__ = [
    "LOCAL_SCHEMES",
    "MAX_GROUPS",
    "MOMENT_QUERY_KINDS",
    "SQUARE_QUERIES",
    "WORD_ROUTES",
    "AllocationSpecModel",
    "BoxSpec",
    "BudgetSpec",
    "CenteredCovarianceSpec",
    "CenteredParams",
    "CenteredRoute",
    "ColAllocationSpec",
    "ColumnsSpec",
    "CrossCovarianceQuerySpec",
    "CrossCovarianceSpec",
    "DirectionsSpec",
    "DomainSpec",
    "FeatureLabel",
    "GroupBySpec",
    "InputSpec",
    "LedgerSpec",
    "MechanismSpec",
    "Missing",
    "MissingSpec",
    "OutputSpec",
    "PrivacySpec",
    "RegressionParams",
    "RegressionSpec",
    "ReleaseSpec",
    "Scalars",
    "SimpleQuery",
    "SpecError",
    "SpecLoader",
    "StreamSpec",
    "is_local",
    "load_spec",
    "parse_spec",
    "parse_yaml",
    "resolve_paths",
    "spec_hash",
    "url_scheme",
    "with_output_store",
]

# The public classes keep the path they had as one module (``mvg_dask.spec.ReleaseSpec``), for
# the reference docs (autodoc_pydantic links a model's fields under its ``__module__``), reprs and
# pickles. ``typing.get_type_hints`` then reads a model's (string) annotations in this module's
# namespace, so it holds every name they use (the typing and pydantic names and the privacy
# layer's word types imported above), as the single module did.
for _cls in (
    SpecError,
    SpecLoader,
    InputSpec,
    BoxSpec,
    MissingSpec,
    DomainSpec,
    DirectionsSpec,
    AllocationSpecModel,
    MechanismSpec,
    PrivacySpec,
    OutputSpec,
    BudgetSpec,
    LedgerSpec,
    ColAllocationSpec,
    ColumnsSpec,
    CrossCovarianceSpec,
    CrossCovarianceQuerySpec,
    RegressionParams,
    RegressionSpec,
    CenteredParams,
    CenteredCovarianceSpec,
    GroupBySpec,
    StreamSpec,
    ReleaseSpec,
):
    _cls.__module__ = __name__
del _cls
