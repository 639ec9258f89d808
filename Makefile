# Two commands from a fresh clone: `make demo` (a real run of the embedded default) and `make test`.
# Both create or update .venv themselves, with torch's CPU build (TORCH_INDEX_URL below) at constraints.txt's pin.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.zerotrain-installed

.PHONY: demo test test-long test-all test-fast bench lint typecheck crd monitoring system-deps clean

# The repository root has a folder named `operator`; keep the working directory off sys.path so
# `python -m ...` run from here still finds the standard library's operator module (Python >= 3.11).
export PYTHONSAFEPATH := 1

# Where torch comes from. The default is PyTorch's CPU index: its 2.13.0+cpu sorts above PyPI's 2.13.0 (a multi-GB
# CUDA build on Linux), and where that index cannot be reached pip falls back to PyPI. Choose CUDA with e.g.
# `make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128`, or PyPI's own build with TORCH_INDEX_URL=.
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# On pip's command line --extra-index-url replaces the extra indexes of pip's configuration and environment, so
# those are passed along. Only the torch step sees the torch index: pip asks every index for every package, and an
# unreachable one costs about 8 s of retries per package.
PIP_EXTRA_INDEXES = $(shell $(PYTHON) -m pip config list 2>/dev/null \
	| sed -nE "s/^(:env:|global|install)\.extra-index-url='(.*)'$$/\2/p")
TORCH_INDEXES = $(foreach url,$(PIP_EXTRA_INDEXES) $(TORCH_INDEX_URL),--extra-index-url $(url))
PIP_INSTALL = $(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --no-deps $(TORCH_INDEXES) torch
	$(PIP_INSTALL) -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/zerotrain run examples/quickstart.yaml

# Three workers, a test file each at a time (its module fixtures stay in one process). Much of the suite waits
# (operator timers, rank start-up, Prometheus scrapes), so a third worker fills the 2 cores (two took pytest 977 s
# when three took 520 s, on the suite of then); a fourth did not help (fresh clone, pytest 1,230 s against 1,118 s
# with three, within this machine's spread).
# Files go out in the order tests/conftest.py sorts them, the whole-job files first (xdist's default, the most tests
# first, left the few-test files that run jobs for minutes to the end, one worker busy while the others idled).
# `.venv/bin/pytest FILE` alone runs serially as before.
# CI runs `make test`: every test but the long tier (tests/long_tier.py: 59 whole runs, or second runs of what CI covers
# once), which `make test-long` runs (pytest 22 min on 2 cores, measured) and `make test-all` runs with the rest.
PYTEST_ALL = $(BIN)/pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=25
test: lint $(STAMP) system-deps
	$(PYTEST_ALL) -m "not long"

test-long: $(STAMP) system-deps
	$(PYTEST_ALL) -m long

test-all: lint $(STAMP) system-deps
	$(PYTEST_ALL)

# The inner loop, under 3 min on 2 cores: ruff, every test not marked slow but the runs of the docs' and benches'
# commands, and one multi-process test (stages 0-3 on 2 gloo ranks against AdamW, marked smoke). CI runs `make test`.
test-fast: $(STAMP) system-deps
	$(BIN)/ruff check .
	$(BIN)/pytest -n 3 --dist loadfile -q -m "smoke or not slow" --ignore=tests/docs --ignore=tests/bench

# zerotrain's stages side by side with DDP, ZeroRedundancyOptimizer, FSDP2 and DeepSpeed (when installed): about
# 15 min on 2 cores, not part of `make test`. JSON in bench/results/, plots in docs/; BENCH_ARGS=--worlds 2,4 etc.
bench: $(STAMP)
	$(PIP_INSTALL) -e '.[dev,bench]'
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --disable-pip-version-check --no-build-isolation -c constraints.txt deepspeed \
		|| echo "DeepSpeed did not install; bench/compare/compare.py skips it and says why"
	$(BIN)/python bench/compare/compare.py $(BENCH_ARGS)

# What bench/gpu/gpu_check.sh installs on a bare GPU machine (no network, its own CUDA torch): a zerotrain wheel of this
# working tree and the cp312 wheels of pydantic and its requirements, in .gpu-bundle/ (git-ignored, about 3 MiB).
# Bring that folder along and run `bash bench/gpu/gpu_check.sh OUTDIR` there (docs/performance.md, "GPU check").
.PHONY: gpu-bundle
gpu-bundle: $(STAMP)
	$(BIN)/python bench/gpu/gpu_bundle.py build --out .gpu-bundle

# The monitoring tests run a real Prometheus and promtool (Debian package `prometheus`), and `zerotrain top`'s test a
# real terminal (Debian package `tmux`); install what is missing.
system-deps:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v tmux >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing prometheus, promtool and tmux (Debian packages prometheus, tmux)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus tmux; \
	else \
		echo "make test needs prometheus, promtool and tmux: sudo apt-get install prometheus tmux" >&2; exit 1; \
	fi

lint: $(STAMP) typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy cannot follow setuptools' package-dir mapping through an editable install, so it checks a
# symlinked tree shaped like the installed package (zerotrain/, zerotrain/operator, zerotrain/runtime).
# bench/ holds scripts, not a package: they are checked in the same tree, so `zerotrain` resolves as installed. Its
# folders (compare, gpu, operator, runtime) import each other's scripts as top-level modules, so mypy takes them all
# in one run (each file's folder goes on its search path): a script's name must be unique across bench/.
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/zerotrain
	for f in zerotrain/*; do ln -s "$(CURDIR)/$$f" build/typecheck/zerotrain/; done
	ln -s "$(CURDIR)/operator" build/typecheck/zerotrain/operator
	ln -s "$(CURDIR)/runtime" build/typecheck/zerotrain/runtime
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p zerotrain
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml $(CURDIR)/bench/*/*.py

# The chart carries a byte-identical copy of the CRD (a test checks it).
crd: $(STAMP)
	$(BIN)/zerotrain crd
	cp crds/zerotrainingjobs.zerotrain.dev.yaml charts/zerotrain-operator/crds/

# The Grafana dashboard and the alert rules are generated from zerotrain/monitoring (a test fails on drift).
monitoring: $(STAMP)
	$(BIN)/python -m zerotrain.monitoring charts/zerotrain-operator

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
