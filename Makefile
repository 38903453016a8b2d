# Two commands on a fresh machine: `make run` (the pipeline on the bundled digits) and `make test`.
# Each creates .venv and installs the project when needed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# DDP on CPU with two processes; the flow's own default is the Azure component's one process.
RUN_ARGS ?= --processes-per-node 2

export PREFECT_SERVER_ANALYTICS_ENABLED := false
# `make run` starts a temporary Prefect server; on a busy 2-core machine its first start took longer than
# Prefect's 20 s default ("Timed out while attempting to connect to ephemeral Prefect API server").
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180

# Where `make server` listens (HOST=0.0.0.0 for every address), and the URL that clients, workers and the
# browser's UI use to reach it: HOST, or this machine's name when HOST is 0.0.0.0.
HOST ?= 127.0.0.1
PORT ?= 4200
SERVER_ADDRESS ?= $(if $(filter 0.0.0.0,$(HOST)),$(shell hostname -f),$(HOST))
PREFECT_SERVER_URL ?= http://$(SERVER_ADDRESS):$(PORT)/api
POOL ?= gpu
# Flow runs one worker runs at once: one training per GPU host unless told otherwise.
WORKER_LIMIT ?= 1
WORKER_NAME ?= $(POOL)-$(shell hostname)

# Secrets reach commands through their environment, never their arguments (`ps` shows those to every user):
# deployments/auth.py reads them from the environment or from 0600 files in ~/.config/image-classifier/, and a
# non-loopback `make server` turns basic auth on (INSECURE=1 opts out, with a warning). See docs/operations.md.
SECRET_VARIABLES := PREFECT_SERVER_API_AUTH_STRING PREFECT_API_AUTH_STRING PREFECT_SERVER_DATABASE_CONNECTION_URL \
	PREFECT_API_DATABASE_CONNECTION_URL AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN
$(foreach variable,$(SECRET_VARIABLES),$(if $(filter command line,$(origin $(variable))),$(error $(variable) \
	given to make shows in `ps` to every user of this host: export it or put it in a 0600 file (docs/operations.md))))
# The server's database: DB=postgresql uses ~/.config/image-classifier/database-url, else the cluster that
# `make postgres` made (POSTGRES_DIR, on POSTGRES_HOST:POSTGRES_PORT); DB=sqlite forces SQLite. See docs/operations.md.
DB ?=
POSTGRES_DIR ?=
POSTGRES_HOST ?= 127.0.0.1
POSTGRES_PORT ?= 5433
POSTGRES_OPTIONS = $(if $(POSTGRES_DIR),--dir $(POSTGRES_DIR))
SERVER_SECRETS = $(BIN)/python -m deployments.auth server --host $(HOST) $(if $(DB),--db $(DB)) \
	$(if $(POSTGRES_DIR),--postgres-dir $(POSTGRES_DIR)) --
WITH_AUTH = $(BIN)/python -m deployments.auth client --

.PHONY: run test test-fast lint browser postgres-programs postgres postgres-stop screenshots bench data server worker \
	deploy serve serve-model clean torch-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's dependencies change.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(MAKE) --no-print-directory torch-check VENV=$(VENV)
	touch $@

# A torchvision built for another torch imports with "operator torchvision::nms does not exist"; say so
# here rather than in the middle of a training run.
torch-check:
	@err=$$($(BIN)/python -c "import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.ones(1), 0.5)" 2>&1) || { \
		echo "torch and torchvision in $(VENV) do not work together: $$(echo "$$err" | tail -n 1)" >&2; \
		echo "Installed: $$($(BIN)/python -m pip list 2>/dev/null | grep -E '^torch(vision)? ' | tr -s ' ' | paste -sd ',' | sed 's/,/, /g')" >&2; \
		echo "Install a matching pair from one index, e.g. $(BIN)/python -m pip install --force-reinstall torch torchvision" >&2; \
		exit 1; }

# Every training worker, torchrun-launched flow and command line imports the project anew. Where the environment
# says PYTHONDONTWRITEBYTECODE (CI does), each would compile its sources again (~0.25 CPU-s a process); compiled
# once here (only what changed since), they read the bytecode instead; `make test` adds bench/ and tests/, whose
# modules its subprocesses import too.
COMPILE = $(BIN)/python -m compileall -q -j 0 flows tasks deployments

# The new version takes the production alias when it beats the one there (the first always does): what
# `make serve-model` follows.
run: $(VENV)/.installed
	$(COMPILE)
	$(WITH_AUTH) $(BIN)/python -m flows.pipeline --promote-to production $(RUN_ARGS) $(if $(DEBUG),--debug)

# The suite keeps two cores ~88% busy, but some files wait long (heartbeats, join timeouts), so its files run in
# TEST_WORKERS processes at once, each file whole in one of them (--dist loadfile: its module fixtures start once),
# the longest files first (tests/conftest.py LONGEST_FILES); one Prefect server and one S3 endpoint serve them all.
TEST_WORKERS ?= 3
test: $(VENV)/.installed browser postgres-programs lint
	$(COMPILE) bench tests
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The fast loop while editing: the tests that start no server, torchrun or subprocess, in two processes.
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not slow and not integration" -n 2 $(PYTEST_ARGS)

# One linter and formatter, configured in pyproject.toml.
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The UI test drives Debian's Chromium with its matching driver; installed here (apt, as root) when missing.
# The README's pictures (docs/images/) from the real digits model, in headless Chromium (docs/screenshots.py).
screenshots: $(VENV)/.installed browser
	$(BIN)/python -m docs.screenshots

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

# PostgreSQL's server programs, for `make postgres` and the tests' cluster; installed here (apt, as root) when missing.
postgres-programs:
	@command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || \
		(apt-get update -qq && apt-get install -y -qq postgresql)

# A PostgreSQL cluster of the project's own for the server (deployments/postgres.py): made on first use with a
# generated password (0600 file), listening on POSTGRES_HOST only; `make server DB=postgresql` then uses it.
postgres: $(VENV)/.installed postgres-programs
	@$(BIN)/python -m deployments.postgres start --host $(POSTGRES_HOST) --port $(POSTGRES_PORT) $(POSTGRES_OPTIONS)

postgres-stop: $(VENV)/.installed
	@$(BIN)/python -m deployments.postgres stop $(POSTGRES_OPTIONS)

# Every benchmark side by side on this machine: a table, and bench/results/<date>-<host>.json.
bench: $(VENV)/.installed
	$(BIN)/python -m bench.run

data: $(VENV)/.installed
	$(BIN)/python -m tasks.data.datasets data/digits

# The UI asks its API at PREFECT_UI_API_URL; left to Prefect it is 127.0.0.1:4200 whatever the port.
# Streamed logs let `prefect deployment run --watch` show a run's logs, down to its final state's message.
server: export PREFECT_UI_API_URL ?= $(PREFECT_SERVER_URL)
server: export PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED ?= true
server: export PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED ?= true
server: $(VENV)/.installed
	INSECURE=$(INSECURE) $(SERVER_SECRETS) $(BIN)/prefect server start --host $(HOST) --port $(PORT)

# One worker per GPU host, named after it, taking WORKER_LIMIT runs at a time; creates the pool on first use.
worker: export PREFECT_API_URL ?= $(PREFECT_SERVER_URL)
worker: $(VENV)/.installed
	$(WITH_AUTH) $(BIN)/python -m deployments.worker --pool $(POOL) --name $(WORKER_NAME) --limit $(WORKER_LIMIT)

# Keeps each schedule switched on or off as it is on the server (deployments/deploy.py).
deploy: export PREFECT_API_URL ?= $(PREFECT_SERVER_URL)
deploy: $(VENV)/.installed
	@$(WITH_AUTH) $(BIN)/python -m deployments.deploy

# The registered model answering HTTP requests (tasks/serving, docs/serving.md), following MODEL's alias: MODEL is
# a registry reference or a model folder; SERVE_ARGS adds options (--port 9000 --max-batch-size 32 …).
MODEL ?= digits-resnet18@production
serve-model: $(VENV)/.installed
	$(BIN)/python -m tasks.serving $(MODEL) $(SERVE_ARGS)

# Single-process alternative to worker + deploy (flow.serve).
serve: export PREFECT_API_URL ?= $(PREFECT_SERVER_URL)
serve: $(VENV)/.installed
	$(WITH_AUTH) $(BIN)/python -m deployments.serve

clean:
	rm -rf runs registry data .pytest_cache
