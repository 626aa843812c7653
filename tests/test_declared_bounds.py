"""Declared sensitivities, gamma and entry ranges (docs/bounds.md, Sec. 12).

A built-in query's declared bound below the one its record domain proves is refused when the
plan is built (nothing read, written or charged); a larger one is used as declared, and
``exact`` scales ``Delta_M`` (so every entry's noise std) by ``declared / proved``.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mvg_dask import api
from mvg_dask.experiments.first_pc import FirstPCExperiment
from mvg_dask.plan import BoxDomain, DeclaredBoundError, L2BallDomain, build_noise_plan
from mvg_dask.plan.input_metadata import InputMetadata
from mvg_dask.plan.planning import plan_release
from mvg_dask.plan.queries import CovarianceQuery, CustomQuery, IdentityQuery
from mvg_dask.privacy.registry import get_calibration
from mvg_dask.spec import SpecError, parse_spec
from tests.pipeline_helpers import data, make_input, spec_dict, write_spec

ROOT = Path(__file__).resolve().parents[1]
N = 1000
UNIT4 = BoxDomain.create(0, 1, 4)  # sign-definite: covariance s2 = R/N = 4/N, gamma = R = 4
SYM4 = BoxDomain.create(-1, 1, 4)  # covariance s2 = sqrt(2) R/N


def _meta(m: int, n: int) -> InputMetadata:
    return InputMetadata(
        store="in.zarr",
        variable="X",
        record_dim="record",
        feature_dim="feature",
        dims=("feature", "record"),
        shape=(m, n),
        dtype="float64",
        record_chunk=100,
        feature_names=tuple(f"f{i}" for i in range(m)),
    )


# -- the query: refused below the proved bound, used as declared above it ---------------------


@pytest.mark.parametrize(
    ("query", "field", "value", "proved"),
    [
        (CovarianceQuery, "sensitivity", 1.0 / N, 4.0 / N),
        (IdentityQuery, "sensitivity", 1.0, 2.0),  # ||w|| = 2 on [0, 1]^4
        (CovarianceQuery, "gamma", 2.0, 4.0),
        (IdentityQuery, "gamma", 10.0, math.sqrt(N * 4.0)),
    ],
)
def test_a_declared_bound_below_the_proved_one_is_refused(query, field, value, proved):
    q = query(4, N, **{field: value})
    with pytest.raises(DeclaredBoundError) as err:
        q.check_declared(UNIT4, "replace-one")
    msg = str(err.value)
    assert err.value.field == field
    assert msg.startswith(f"mechanism.{field}: declared {value:.6g} is below the bound ")
    assert f"{proved:.6g}" in msg and "box [0, 1]^4" in msg
    assert "; remove it or declare at least " in msg
    assert float(msg.rsplit(" ", 1)[1]) >= proved
    # every use of the value refuses it too, not only the spec's check
    with pytest.raises(DeclaredBoundError):
        if field == "sensitivity":
            q.l2_sensitivity(UNIT4, "replace-one")
        else:
            q.sup_frobenius(UNIT4)
    for calibration in ("exact", "mvg-thm2", "mgm", "mgm-udn"):
        if field == "gamma" and not get_calibration(calibration).uses_gamma:
            continue  # refused by plan_release's check_declared all the same
        with pytest.raises(DeclaredBoundError):
            build_noise_plan(q, UNIT4, epsilon=1, delta=1e-5, calibration=calibration)


def test_the_remedy_value_is_accepted():
    """The value the message proposes ("declare at least ...") is never refused."""
    q = CovarianceQuery(4, 3, sensitivity=1e-9)
    with pytest.raises(DeclaredBoundError) as err:
        q.check_declared(SYM4, "replace-one")
    least = float(str(err.value).rsplit(" ", 1)[1])
    ok = CovarianceQuery(4, 3, sensitivity=least)
    ok.check_declared(SYM4, "replace-one")
    assert ok.l2_sensitivity(SYM4, "replace-one") == least


def test_an_entry_range_must_contain_the_proved_one():
    with pytest.raises(DeclaredBoundError, match=r"mechanism.entry_range: declared \[0, 0.5\]"):
        IdentityQuery(4, N, entry_range=(0.0, 0.5)).check_declared(UNIT4, "replace-one")
    wide = IdentityQuery(4, N, entry_range=(-1.0, 2.0))
    assert wide.output_entry_range(UNIT4) == (-1.0, 2.0)


def test_the_proved_value_typed_with_fewer_digits_is_the_proved_value():
    q = CovarianceQuery(4, 3, sensitivity=float(f"{math.sqrt(2) * 4 / 3:.12g}"))
    proved = q.proved_l2_sensitivity(SYM4, "replace-one")
    assert proved is not None and q.l2_sensitivity(SYM4, "replace-one") >= proved


def test_custom_queries_and_private_counts_keep_their_declared_values():
    """Nothing is proved for a custom query, nor gamma for an add-remove covariance without
    N0: the declared values are the bounds, as before."""
    custom = CustomQuery(features=4, records=N, shape_=(2, 2), sensitivity=1e-6)
    custom.check_declared(UNIT4, "replace-one")
    assert custom.l2_sensitivity(UNIT4, "replace-one") == 1e-6
    assert custom.sensitivity_excess(UNIT4, "replace-one") == 1.0
    private = CovarianceQuery(features=4, records=1, gamma=1e-3, records_known=False)
    private.check_declared(UNIT4, "add-remove")
    assert private.sup_frobenius(UNIT4) == 1e-3
    # its s2 is proved (R / N0) and checked
    with pytest.raises(DeclaredBoundError):
        CovarianceQuery(features=4, records=1, sensitivity=1.0, records_known=False).check_declared(
            UNIT4, "add-remove"
        )


@pytest.mark.parametrize(
    ("query", "domain", "algorithm", "degree"),
    [
        (IdentityQuery, UNIT4, "unimodal", 2),
        (CovarianceQuery, SYM4, "unimodal", 2),
        (CovarianceQuery, SYM4, "equi-modal", 1),
        (CovarianceQuery, SYM4, "symmetric", 1),
        (CovarianceQuery, L2BallDomain(1.0, 4), "symmetric", 1),
    ],
)
def test_exact_scales_the_noise_by_declared_over_proved(query, domain, algorithm, degree):
    """``Delta_M`` times k: row variances x k^2 (unimodal) or x k (both factors of equi-modal
    and symmetric noise); every entry's std x k."""
    base = build_noise_plan(query(4, N), domain, epsilon=1, delta=1e-5, algorithm=algorithm)
    proved = base.sensitivity
    for k in (1.0, math.sqrt(2), 3.0):
        q = query(4, N, sensitivity=k * proved)
        assert q.sensitivity_excess(domain, "replace-one") == pytest.approx(k)
        plan = build_noise_plan(
            q,
            domain,
            epsilon=1,
            delta=1e-5,
            algorithm=algorithm,
            symmetric_ratio=base.symmetric_ratio,
        )
        np.testing.assert_allclose(plan.row_variances, base.row_variances * k**degree, rtol=1e-9)
        np.testing.assert_allclose(plan.entry_std(), base.entry_std() * k, rtol=1e-9)
        assert plan.sensitivity == pytest.approx(k * proved)
        lhs, rhs = plan.theorem_check()
        assert lhs <= rhs


def test_paper_calibrations_use_a_larger_value_as_declared():
    base = build_noise_plan(CovarianceQuery(4, N), SYM4, epsilon=1, delta=1e-5,
                            algorithm="unimodal", calibration="mgm-udn")  # fmt: skip
    s2 = 2 * 4.0 / N  # the paper's 2R/N
    plan = build_noise_plan(CovarianceQuery(4, N, sensitivity=s2), SYM4, epsilon=1,
                            delta=1e-5, algorithm="unimodal", calibration="mgm-udn")  # fmt: skip
    assert plan.sensitivity == s2
    ratio = plan.entry_std().max() / base.entry_std().max()
    assert ratio == pytest.approx(s2 / base.sensitivity)  # MGM Thm. 2: std proportional to s2


def test_the_paper_reproduction_still_builds():
    """The experiments declare 2R/N and gamma = R (Exp. II's paper calibrations): both at least
    the proved bounds, for every paper calibration the experiment runs."""
    exp = FirstPCExperiment()
    n = exp.dataset.X.shape[1]
    domain, paper = exp.domain, exp.paper_query
    R = domain.sup_norm_sq()
    assert (paper.sensitivity, paper.gamma) == (2.0 * R / n, R)
    paper.check_declared(domain, "replace-one")
    for calibration, algorithm in (("mvg-thm2", "unimodal"), ("mvg-thm3", "equi-modal")):
        plan = build_noise_plan(
            paper, domain, epsilon=1, delta=1 / n, algorithm=algorithm, calibration=calibration
        )
        assert plan.sensitivity == 2.0 * R / n and plan.gamma == R


# -- the release plan, the dry run, the API and the CLI ------------------------------------------


@pytest.mark.parametrize("calibration", ["exact", "mvg-thm3", "mgm"])
def test_plan_release_refuses_with_a_spec_error(calibration):
    spec = parse_spec(
        spec_dict(
            "in.zarr",
            "out.zarr",
            query="covariance",
            mechanism={"calibration": calibration, "algorithm": "equi-modal", "sensitivity": 1e-3},
        )
    )
    with pytest.raises(SpecError) as err:
        plan_release(spec, _meta(4, N))
    assert str(err.value) == (
        "mechanism.sensitivity: declared 0.001 is below the bound 0.004 that the record domain "
        "box [0, 1]^4 proves for the covariance query (replace-one); remove it or declare at "
        "least 0.004"
    )


def test_the_dry_run_says_what_a_larger_value_costs():
    n = 10176
    base = {"query": "covariance", "domain": {"box": {"lower": -1.0, "upper": 1.0}}}
    spec = parse_spec(spec_dict("in.zarr", "out.zarr", **base, mechanism={"sensitivity": 8.0 / n}))
    rplan = plan_release(spec, _meta(4, n))
    line = rplan.declared_bounds_text()
    assert line == (
        f"declared s2 = {8 / n:.4g} (proved bound {math.sqrt(2) * 4 / n:.4g}): noise x1.41 "
        "against the proved bounds"
    )
    assert line in rplan.summary()
    text = api.preview(rplan).text()
    assert "  declared " in text and "noise x1.41 against the proved bounds" in text
    plain = plan_release(parse_spec(spec_dict("in.zarr", "out.zarr", **base)), _meta(4, n))
    assert plain.declared_bounds_text() is None and "declared" not in api.preview(plain).text()
    ratio = rplan.noise_plan().entry_std().max() / plain.noise_plan().entry_std().max()
    assert ratio == pytest.approx(math.sqrt(2))
    # a paper calibration: the factor is measured against the proved bounds' plan
    paper = parse_spec(
        spec_dict(
            "in.zarr",
            "out.zarr",
            **base,
            mechanism={
                "calibration": "mgm-udn",
                "algorithm": "unimodal",
                "sensitivity": 8.0 / n,
                "gamma": 5.0,
            },
        )
    )
    text = plan_release(paper, _meta(4, n)).declared_bounds_text()
    assert text is not None and "gamma = 5 (proved bound 4, not used by mgm-udn)" in text
    assert text.endswith("noise x1.41 against the proved bounds")


def _refused_setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A spec whose declared sensitivity is below the proved bound, with a ledger, and an input
    whose chunks are gone (a read would fail with another error)."""
    store = make_input(tmp_path / "in.zarr", data(4, 300, seed=2), chunk=100)
    shutil.rmtree(Path(store) / "X" / "c")
    ledger = tmp_path / "ledger.sqlite"
    out = tmp_path / "out.zarr"
    spec = spec_dict(
        store,
        str(out),
        query="covariance",
        mechanism={"sensitivity": 1.0 / 300},  # the bound is 4/300
        ledger={"path": str(ledger), "dataset": "d", "budget": {"epsilon": 5, "delta": 1e-4}},
    )
    return write_spec(tmp_path / "spec.yaml", spec), out, ledger


def test_the_api_refuses_before_reading_writing_or_charging(tmp_path):
    path, out, ledger = _refused_setup(tmp_path)
    for call in (api.dry_run, api.preview, api.release):
        with pytest.raises(SpecError, match=r"mechanism\.sensitivity: declared 0\.00333333 "):
            call(path)
    assert not out.exists() and not ledger.exists()


def test_the_cli_prints_one_line_and_charges_nothing(tmp_path):
    path, out, ledger = _refused_setup(tmp_path)
    for extra in ([], ["--dry-run"]):
        run = subprocess.run(
            [sys.executable, "-m", "mvg_dask", "release", str(path), *extra],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        assert run.returncode == 2, run.stderr
        assert run.stdout == "" and "Traceback" not in run.stderr
        (line,) = [ln for ln in run.stderr.splitlines() if ln.strip()]
        assert line == (
            "mvg-dask: error: mechanism.sensitivity: declared 0.00333333 is below the bound "
            "0.0133333 that the record domain box [0, 1]^4 proves for the covariance query "
            "(replace-one); remove it or declare at least 0.0133334"
        )
    assert not out.exists() and not ledger.exists()
