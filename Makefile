# hakafka: the two commands a new engineer needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Most of a test's wall time is waiting (a Spark session, a ZooKeeper session timeout, a
# flush interval): two workers, each with its own local stack, halve the suite's time on 2
# cores. A file's tests stay on one worker (its module fixtures start once). Three were
# measured: 14:25 instead of 16:56, but with the cores saturated the chaos run's daemons
# missed their ZooKeeper connect bound; two it stays. Files go out longest first (the
# order tests/conftest.py gives them), not xdist's by test count.
PYTEST_WORKERS ?= 2

.PHONY: install java systemd-analyze chromium demo test check lint typecheck pytest bench chaos clean

$(VENV)/bin/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python venv module missing: installing python3-venv"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,local,connect]'
	@touch $@

install: $(STAMP) java systemd-analyze chromium

# ZooKeeper and Spark need a Java 17 runtime; install it only when there is no java at all.
java:
	@command -v java >/dev/null || { \
	  echo "java not found: installing openjdk-17-jre-headless"; \
	  apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; }

# tests/ops/test_ops_systemd.py rates the units with `systemd-analyze security --offline`.
systemd-analyze:
	@command -v systemd-analyze >/dev/null || { \
	  echo "systemd-analyze not found: installing systemd"; \
	  apt-get update -qq && apt-get install -y -qq systemd; }

# tests/ops/test_ops_status_page.py opens the status page in Debian's headless chromium.
chromium:
	@command -v chromium >/dev/null || { \
	  echo "chromium not found: installing chromium"; \
	  apt-get update -qq && apt-get install -y -qq chromium; }

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck

# pytest exits 5 when it collects nothing: one clear line and exit 1, never taken as a pass.
pytest: install
	@set +e; $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests (check PYTEST_ARGS): nothing was verified, so this fails" >&2; exit 1; fi; \
	exit $$rc

test: install check pytest

demo: install
	$(PY) -m devstack.demo

bench: install
	$(PY) bench/run_all.py

chaos: install
	$(PY) -m pytest tests/chaos -m chaos --chaos-long -s $(PYTEST_ARGS)

clean:
	-[ -f .devstack/stack.json ] && $(PY) -m devstack down
	rm -rf .devstack build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
