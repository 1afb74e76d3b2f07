# Clipper serverless: the two commands a user needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8080
MODELS := build/models
# make run QUEUE=sqs: the models' request queues on moto's SQS (fidelity) instead of Redis Streams (the default)
QUEUE ?= redis
# make run FRESH=1: start from a clean state (what .local-stack/ kept is deleted first)
FRESH ?=

.PHONY: help venv models run run-port clean-state test test-unit test-integration test-iac test-e2e lint redis clean \
	bench-batching bench-frontdoor bench-cache bench-selection bench-live-selection bench-coldstart bench-latency bench-cost bench-faults sam-venv sam-build

help:
	@echo "make run    - start the local stack (moto, demo models, batchers, frontend on :$(PORT)); state in .local-stack/"
	@echo "              PORT=8081, QUEUE=sqs|redis, FRESH=1 (start from a clean state)"
	@echo "make clean-state - forget what the local stack kept (apps, models, uploads, bandit states, logs)"
	@echo "make test   - run the whole test suite (installs what it needs)"
	@echo "make lint   - ruff + mypy"

$(VENV)/.installed: pyproject.toml
	@echo ">> creating $(VENV) and installing the project with its dev tools"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	@touch $@

# Clipper's own client for the compatibility test: its metadata pins cloudpickle==0.5.3 (no longer runs), so
# without its dependencies; pyproject's dev extra has the ones it imports.
CLIPPER_ADMIN := clipper_admin==0.4.1
$(VENV)/.clipper-admin: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps '$(CLIPPER_ADMIN)'
	@touch $@

venv: $(VENV)/.installed $(VENV)/.clipper-admin

$(MODELS)/manifest.json: $(VENV)/.installed infra/demo/train_models.py
	$(PY) infra/demo/train_models.py --out $(MODELS)

models: $(MODELS)/manifest.json

# redis-server is a real dependency of the tests (reply channel, cache); install it when missing.
redis:
	@command -v redis-server >/dev/null || { \
	  echo ">> installing redis-server"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server; \
	  else sudo apt-get update -qq && sudo apt-get install -y -qq redis-server; fi; }

# the port first (well under a second, with the system Python), then what the stack needs: redis-server included
run: run-port venv models redis
	@$(PY) infra/local/run.py --port $(PORT) --models $(MODELS) --queue $(QUEUE) $(if $(filter 1 yes true,$(FRESH)),--fresh)

run-port:
	@$(PYTHON) infra/local/run.py --port $(PORT) --check-port

# refused while a stack runs on it (CLIPPER_LOCAL_STATE_DIR names another folder than .local-stack)
clean-state:
	@$(PYTHON) infra/local/run.py --clean-state

test: venv models redis
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

test-integration: venv redis
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

test-iac: venv
	$(PY) -m pytest -m iac $(PYTEST_ARGS)

test-e2e: venv models redis
	$(PY) -m pytest -m e2e $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Benchmarks: each prints its figures, writes bench/results/<name>.json and a PNG plot.
# The batcher core and the endpoint, the queue replaced (an in-memory pipe, or one with SQS's limits), no frontend.
bench-batching: venv models
	$(PY) -m bench.batching $(BENCH_ARGS)

# The whole local stack on one core at its HTTP front door, beside a plain FastAPI server and the raw limit.
bench-frontdoor: venv models redis
	$(PY) -m bench.frontdoor $(BENCH_ARGS)

bench-cache: venv models redis
	$(PY) bench/cache.py $(BENCH_ARGS)

bench-selection: venv models
	$(PY) bench/selection.py $(BENCH_ARGS)

# the same experiments through the running local stack's HTTP API (queries and feedback), beside their replay
bench-live-selection: venv models redis
	$(PY) -m bench.live_selection $(BENCH_ARGS)

bench-coldstart: venv models
	$(PY) -m bench.coldstart $(BENCH_ARGS)

bench-latency: venv models redis
	$(PY) bench/latency.py $(BENCH_ARGS)

# cost per million predictions on AWS from the local stack's measured figures and clipper/cost/prices.json
bench-cost: venv models redis
	$(PY) -m bench.cost

# faults on the running local stack under steady load: counts per scenario, bench/results/faults.json and .png
bench-faults: venv models redis
	$(PY) -m bench.faults $(BENCH_ARGS)


# aws-sam-cli in its own venv: it pins boto3 and click below what moto and the dev tools use.
SAM_VENV ?= .venv-sam
SAM_CLI ?= aws-sam-cli>=1.120,<2

$(SAM_VENV)/.installed:
	@echo ">> creating $(SAM_VENV) with $(SAM_CLI)"
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install -q --upgrade pip
	$(SAM_VENV)/bin/python -m pip install --progress-bar on '$(SAM_CLI)'
	@touch $@

sam-venv: $(SAM_VENV)/.installed

# sam build (no container) into .aws-sam/build, where `sam deploy` looks for the built template (it packages the
# unbuilt source template otherwise), then each package's size against Lambda's limits -> build/sam-sizes.json
sam-build: venv sam-venv
	$(PY) -m infra.sam_package_sizes --sam $(SAM_VENV)/bin/sam --build-dir .aws-sam/build --out build/sam-sizes.json

clean:
	rm -rf build .aws-sam .pytest_cache .mypy_cache .ruff_cache .local-stack
