# m2g — developer entry points. The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv test test-unit test-e2e lint policy-test demo bench up down status clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## lint: ruff, mypy --strict, import-linter (the layering), policy lint
lint: $(STAMP)
	$(VENV)/bin/ruff check src controllers cli tests bench
	$(VENV)/bin/mypy src controllers cli
	$(VENV)/bin/lint-imports
	$(VENV)/bin/m2g policy lint policies/

## policy-test: the example policies' own test files, on both CEL engines
policy-test: $(STAMP)
	$(VENV)/bin/m2g policy test policies/
	$(VENV)/bin/m2g policy test policies/ --engine cel-python

## test-unit: everything that needs no cluster
test-unit: $(STAMP)
	$(PY) -m pytest -m "not e2e" -q

## test-e2e: against the local control plane (built and started on demand)
test-e2e: $(STAMP)
	$(PY) -m pytest -m e2e -q

## test: the full suite, as CI runs it
test: lint policy-test test-unit test-e2e

## bench: benchmarks (scripts, never timed assertions)
bench: $(STAMP)
	$(PY) bench/policy_bench.py

## demo: the main job
demo: $(STAMP)
	$(VENV)/bin/m2g policy test policies/

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
