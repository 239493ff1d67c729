# Two commands do all set-up on a fresh machine (DESIGN §3.1):
#   make run   - the main job on embedded defaults
#   make test  - the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint format bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing trainyard and its pinned dependencies into $(VENV) (first run only)..."
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	@$(PY) -m trainyard.demo

test: $(STAMP)
	@$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	@$(VENV)/bin/ruff check src tests benchmarks
	@$(VENV)/bin/ruff format --check src tests benchmarks
	@$(VENV)/bin/mypy

format: $(STAMP)
	@$(VENV)/bin/ruff format src tests benchmarks
	@$(VENV)/bin/ruff check --fix src tests benchmarks

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info
