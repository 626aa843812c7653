"""The release specs of ``mvg-dask demo``, as YAML templates.

This directory is installed as the package data ``mvg_dask.cli.demo_specs`` (the package-dir
mapping in ``pyproject.toml``), so the demo finds the files in a checkout, an editable install
and a regular install alike. The demo replaces every ``${name}`` with a value computed from the
data (:class:`string.Template`) and writes the result, a complete release spec, into its
``--out`` directory; relative paths in a spec are resolved against that directory.
"""
