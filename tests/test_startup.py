"""Start-up helpers (:mod:`mvg_dask._startup`): the collector is paused for imports only, and
frozen only by the ``mvg-dask`` script, never in a library process."""

from __future__ import annotations

import gc
import subprocess
import sys

from mvg_dask import _startup
from mvg_dask.cli import main


def test_imports_without_gc_pauses_then_resumes() -> None:
    assert gc.isenabled()
    with _startup.imports_without_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with _startup.imports_without_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # paused on entry: left paused
    finally:
        gc.enable()


def test_only_the_script_freezes() -> None:
    """``main(argv)`` from a library process freezes nothing; the script does, after its
    imports (``gc.get_freeze_count``)."""
    frozen = gc.get_freeze_count()
    assert main(["--version"]) == 0
    assert not _startup.FREEZE_AFTER_IMPORTS and gc.get_freeze_count() == frozen
    code = (
        "import gc, sys\n"
        "from mvg_dask import _startup\n"
        "from mvg_dask.cli import main\n"
        "sys.argv = ['mvg-dask', '--version']\n"
        "main()\n"
        "assert 'colorsys' not in sys.modules\n"
        "with _startup.imports_without_gc():\n"
        "    import colorsys\n"
        "frozen = gc.get_freeze_count()\n"
        "with _startup.imports_without_gc():\n"
        "    x = [[] for _ in range(1000)]\n"
        "print(_startup.FREEZE_AFTER_IMPORTS, frozen > 0, gc.get_freeze_count() == frozen, "
        "gc.isenabled())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # frozen after a block that imported a module, not after one that imported nothing
    assert out.stdout.split()[-4:] == ["True", "True", "True", "True"]


def test_small_covariance_release_imports_no_dask_array(tmp_path) -> None:
    """A covariance release on threads in the releasing process declares its output's
    variables without dask (:class:`~mvg_dask.engine.output_arrays.Declared`) and writes its
    skeleton without xarray (:mod:`mvg_dask.engine.zarr_io.skeleton`): the script imports
    neither ``dask.array`` nor scipy's sparse, FFT and special modules, nor xarray and pandas
    (an import check, not a timing; an xarray ``DataArray`` made of numpy values would import
    them)."""
    from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

    store = make_input(tmp_path / "in.zarr", data(4, 120), chunk=40)
    spec = write_spec(
        tmp_path / "spec.yaml", spec_dict(store, str(tmp_path / "out.zarr"), query="covariance")
    )
    code = (
        "import sys\nfrom mvg_dask.cli import main\n"
        "sys.argv = ['mvg-dask', 'release', sys.argv[1], '--seed', '1', '--quiet']\n"
        "code = main()\n"
        "heavy = ['dask.array', 'scipy.sparse', 'scipy.fft', 'scipy.special', 'xarray', 'pandas']\n"
        "print(code, sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(spec)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout + out.stderr
    assert (tmp_path / "out.zarr" / "zarr.json").exists()
