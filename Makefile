# One entry point for developers and CI: `make test` builds the venv and runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: test lint run bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

test: $(BIN)/.installed
	scripts/ensure-debian-packages chromium prometheus prometheus-alertmanager
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check .

# The main job on the embedded default: the simulator at the seed's baseline, the exporter, and a fixed
# streaming load whose summary is printed (and saved in out/demo).
run: $(BIN)/.installed
	scripts/demo

bench: $(BIN)/.installed
	$(BIN)/python bench/sim_throughput.py
