# Two commands on a fresh machine: `make run` (the pipeline on the bundled digits) and `make test`.
# Each creates .venv and installs the project when needed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# DDP on CPU with two processes; the flow's own default is the Azure component's one process.
RUN_ARGS ?= --processes-per-node 2

export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: run test data server clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/python -m flows.pipeline $(RUN_ARGS)

test: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

data: $(VENV)/.installed
	$(BIN)/python -m tasks.datasets data/digits

server: $(VENV)/.installed
	$(BIN)/prefect server start --host 127.0.0.1 --port 4200

clean:
	rm -rf runs registry data .pytest_cache
