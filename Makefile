# Two commands on a fresh machine: `make run` (the pipeline on the bundled digits) and `make test`.
# Each creates .venv and installs the project when needed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# DDP on CPU with two processes; the flow's own default is the Azure component's one process.
RUN_ARGS ?= --processes-per-node 2

export PREFECT_SERVER_ANALYTICS_ENABLED := false

# The Prefect server the long-running commands talk to (make server starts it here).
PREFECT_SERVER_URL ?= http://127.0.0.1:4200/api
POOL ?= gpu

.PHONY: run test browser bench data server worker deploy serve clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/python -m flows.pipeline $(RUN_ARGS)

test: $(VENV)/.installed browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The UI test drives Debian's Chromium with its matching driver; installed here (apt, as root) when missing.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

# Every benchmark side by side on this machine: a table, and bench/results/<date>-<host>.json.
bench: $(VENV)/.installed
	$(BIN)/python -m bench.run

data: $(VENV)/.installed
	$(BIN)/python -m tasks.datasets data/digits

server: $(VENV)/.installed
	$(BIN)/prefect server start --host 127.0.0.1 --port 4200

# One worker per GPU host; creates the process work pool on first use.
worker: export PREFECT_API_URL ?= $(PREFECT_SERVER_URL)
worker: $(VENV)/.installed
	$(BIN)/prefect work-pool inspect $(POOL) >/dev/null 2>&1 || $(BIN)/prefect work-pool create $(POOL) --type process
	$(BIN)/prefect worker start --pool $(POOL)

deploy: export PREFECT_API_URL ?= $(PREFECT_SERVER_URL)
deploy: $(VENV)/.installed
	for pool in gpu default; do \
		$(BIN)/prefect work-pool inspect $$pool >/dev/null 2>&1 || $(BIN)/prefect work-pool create $$pool --type process; \
	done
	$(BIN)/prefect --no-prompt deploy --prefect-file deployments/prefect.yaml --all

# Single-process alternative to worker + deploy (flow.serve).
serve: export PREFECT_API_URL ?= $(PREFECT_SERVER_URL)
serve: $(VENV)/.installed
	$(BIN)/python -m deployments.serve

clean:
	rm -rf runs registry data .pytest_cache
