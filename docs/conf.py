"""Sphinx configuration of the mvg_dask documentation (``make docs``).

The Markdown pages are MyST; the notebooks are the executed ``notebooks/*.ipynb`` of the
repository, copied into ``docs/notebooks/`` at build time and rendered as committed (never
re-executed). The API reference is generated from the numpydoc docstrings, the CLI reference
from the click commands and the spec reference from the pydantic models.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

from mvg_dask import __version__  # noqa: E402

project = "mvg_dask"
author = "the mvg_dask authors"
copyright = "the mvg_dask authors"
version = release = __version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinx_click",
    "sphinxcontrib.autodoc_pydantic",
]

# -- the notebooks: the committed, executed .ipynb, rendered as they are -------------------------
_NOTEBOOKS = DOCS / "notebooks"
_NOTEBOOKS.mkdir(exist_ok=True)
for _nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
    _target = _NOTEBOOKS / _nb.name
    if not _target.exists() or _target.read_bytes() != _nb.read_bytes():
        shutil.copyfile(_nb, _target)

nb_execution_mode = "off"
# the committed notebooks carry no widget state (tests/notebook_helpers.py scrubs it): no
# require.js or widget manager is loaded from a CDN
nb_ipywidgets_js: dict[str, dict[str, str]] = {}
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
# the benchmark's tables are included into its guide page, not a page of their own
exclude_patterns += ["benchmarks/*.md"]
suppress_warnings = [
    # the notebooks' ipywidgets progress bars have no static rendering
    "mystnb.unknown_mime_type",
]

# -- API reference -------------------------------------------------------------------------------
autosummary_generate = True
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "none"
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

autodoc_pydantic_model_show_json = False
autodoc_pydantic_model_show_config_summary = False
autodoc_pydantic_model_show_validator_summary = False
autodoc_pydantic_model_show_validator_members = False
autodoc_pydantic_field_list_validators = False
autodoc_pydantic_model_member_order = "bysource"
autodoc_pydantic_model_signature_prefix = "spec section"

nitpicky = True
nitpick_ignore_regex = [
    # outside this project, with no intersphinx inventory offline
    (r"py:.*", r"(abc|numpy|np|xarray|xr|dask|distributed|zarr|pandas|pd|pydantic|click)\..*"),
    # internals the docstrings cite, outside the public reference
    (
        r"py:.*",
        r"mvg_dask\.(engine|noise|privacy|ledger\.(base|sqlite|postgres|schema|location)"
        r"|plan\.(lattice|low_rank|noise_plan|noise_calibration|queries|covariance|budget"
        r"|symmetric_ratio))(\..*)?",
    ),
    # unqualified names of module-level helpers the docstrings cite
    (
        r"py:.*",
        r"(ReleaseSpec|covariance_from_identity|gaussian_variable|best_symmetric_ratio"
        r"|symmetric_noise)",
    ),
]

# -- HTML ----------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"mvg_dask {__version__}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    # the benchmark's wide tables and figure get the right-hand column's width
    "secondary_sidebar_items": {"**": ["page-toc"], "guide/covariance-benchmark": []},
}
# wide tables scroll inside their box, code and outputs scroll rather than being cut
html_static_path = ["_static"]
html_css_files = ["mvg.css"]
# a notebook figure opens at full size when clicked
html_js_files = ["mvg.js"]
# images shown smaller than they are link to the full-size file
html_scaled_image_link = True
html_show_sourcelink = False
