# The two commands a new user needs:
#   make run    start the whole service on embedded defaults (SQLite, local Redis, local model)
#   make test   run the test suite (Postgres and Redis on 127.0.0.1 by default)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export MODEL_PATH ?=
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
# Most of the suite's time is spent waiting on subprocesses, so it runs on more workers than cores.
TEST_WORKERS ?= 3

.PHONY: setup model run test lint bench

# Installs what is missing: the virtualenv with pinned packages, and (Linux) the Fortran runtime
# that the fast OpenBLAS needs. Re-running is cheap: pip only installs when pyproject changed.
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	@bash scripts/ensure_system_libs.sh
	@touch $@

model: setup
	$(BIN)/python -m demo_model.builder var/models/tiny

run: setup
	@bash scripts/run.sh

# One OpenBLAS thread per process: the tests run the engine in pytest and in worker subprocesses
# at once, and two BLAS threads per process on a 2-core machine made runs 5-10x slower.
test: setup
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} \
		$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
