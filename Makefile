# The two Quickstart commands: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck docs kernel bench experiments covariance-bench clean

# The core and its lab (lab/: the distribution mvg_dask_lab, the extra [experiments]), both
# editable: pip takes the extra's mvg_dask_lab from ./lab, never from an index.
$(STAMP): pyproject.toml lab/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./lab -e '.[dev,notebook,docs,s3,experiments]'
	touch $(STAMP)

## Set up and run the main job on the embedded default (LocalCluster + local Zarr store).
demo: $(STAMP)
	$(BIN)/mvg-dask demo --out out/demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/lint-imports

## The documentation site (docs/): warnings are errors; open docs/_build/html/index.html.
docs: $(STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html

## Register this venv as the Jupyter kernel the notebooks declare (mvg-dask).
kernel: $(STAMP)
	$(BIN)/python -m ipykernel install --user --name mvg-dask --display-name "Python (mvg-dask)"

## Lint, type-check, build the docs and run the whole test suite, slow tests included (what CI runs).
test: $(STAMP) lint typecheck docs
	$(BIN)/python -m pytest -q --durations=30

## The suite without the tests marked slow (crash loop, out of core).
test-fast: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -m "not slow" -q

## Benchmarks (ratios against baselines measured in the same run; never asserted; the DP
## peers need the optional extra: `.venv/bin/pip install -e ".[bench]"`;
## docs/guide/performance.md).
bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks.bench_codecs
	$(BIN)/python -m tests.benchmarks.bench_lattice_sampler
	$(BIN)/python -m tests.benchmarks.bench_latency
	$(BIN)/python -m tests.benchmarks.bench_cold_start
	$(BIN)/python -m tests.benchmarks.bench_release
	$(BIN)/python -m tests.benchmarks.bench_peers
	$(BIN)/python -m tests.benchmarks.bench_round
	$(BIN)/python -m tests.benchmarks.bench_stream

## The paper's experiments (docs/guide/paper.md) and the covariance benchmark, from the lab.
experiments: $(STAMP)
	$(BIN)/mvg-dask experiments all --out out/experiments

covariance-bench: $(STAMP)
	$(BIN)/mvg-dask experiments covariance-bench --out out/covbench

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache .hypothesis docs/_build docs/notebooks
	rm -rf *.egg-info lab/*.egg-info
