# Two commands: `make demo` and `make test`. Both create .venv and install the project
# into it when missing (and again when pyproject.toml changes), quietly otherwise.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.scopebench-installed
BENCHOPT := $(VENV)/bin/benchopt
PYTEST_ARGS ?=
LINT_PATHS := src tests perf scripts examples objective.py solvers datasets plots benchmark_inference benchmark_training benchmark_validation

.PHONY: install system-packages demo test test-fast lint clean-outputs

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing scopebench and its dependencies into $(VENV) (first time: a few minutes)"
	@$(PY) -m pip install -q --disable-pip-version-check -U pip
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# Chromium (HTML report test) and a single-node SLURM (cluster tests), from apt when missing.
system-packages:
	@scripts/install_system_packages.sh

# Two pytest-xdist workers, a test file (or a unit of tests/conftest.py's SHARED_UNITS) whole
# on one; then, alone on the machine, the tests marked `alone`. TEST_WORKERS=0: one process.
# pytest exits 5 when it collects nothing: that is a broken suite, not a pass (the second pass
# may collect nothing when PYTEST_ARGS selects other tests).
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile
test: $(STAMP) system-packages
	@$(PY) -m pytest tests src/scopebench --doctest-modules $(XDIST) -m "not alone" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; \
	$(PY) -m pytest tests -m alone $(PYTEST_ARGS); alone=$$?; \
	if [ $$alone -eq 5 ]; then alone=0; fi; if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$alone

test-fast: $(STAMP)
	@$(PY) -m pytest tests src/scopebench --doctest-modules $(XDIST) -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	@$(PY) scripts/demo.py

lint: $(STAMP)
	@$(VENV)/bin/ruff check $(LINT_PATHS) && $(VENV)/bin/black --check -q $(LINT_PATHS)

clean-outputs:
	@find . -path ./.venv -prune -o -path '*/outputs/*' ! -name .gitkeep -type f -print -delete
