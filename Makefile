# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each step is idempotent and keyed on the files it depends on, so a second run is fast.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test test-fast setup bench-setup lint clean

setup: $(VENV)/.installed node_modules/.installed

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python pyproject.toml
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

# The benchmarks' comparison packages (TRL, ByzFL). ByzFL declares torchvision, whose wheel does not
# match the CPU torch build and breaks transformers' imports; the aggregate benchmark loads ByzFL's
# aggregators module without it, so it is removed again.
bench-setup: setup
	$(BIN)/pip install --quiet -e ".[bench]"
	$(BIN)/pip uninstall --quiet -y torchvision

demo: setup
	$(BIN)/krill demo

test: setup
	bash scripts/test-services.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) node_modules build *.egg-info
