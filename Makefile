# The two commands of the README: `make run` and `make test`. Both install what they need first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test check lint typecheck install browser monitoring fault-loop story token

$(STAMP): pyproject.toml scripts/install.sh
	scripts/install.sh $(VENV)
	@touch $(STAMP)

install: $(STAMP)

browser:
	scripts/install-browser.sh

monitoring:
	scripts/install-monitoring.sh

# The local Ray head is on loopback, and so is everything the local Fleetdeck may call: it calls
# nothing its allow-list does not cover.
run: $(STAMP)
	FLEETDECK_DEBUG=$${FLEETDECK_DEBUG:-1} FLEETDECK_CLUSTER_NETWORKS=$${FLEETDECK_CLUSTER_NETWORKS:-127.0.0.0/8,::1/128} \
		$(PY) manage.py runlocal

# `make token USER=alice` prints a new API token for alice from the database `make run` uses,
# under the same development settings: manage.py alone refuses to start without a real secret key.
# Only the token goes to stdout, for `TOKEN=$(make token USER=alice)`; the date it expires, to stderr.
token:
	@test "$(origin USER)" = "command line" || { echo 'Usage: make token USER=<username>' >&2; exit 2; }
	@FLEETDECK_DEBUG=$${FLEETDECK_DEBUG:-1} $(PY) manage.py create_api_token '$(USER)'

# Format, lint, the architecture contracts (pyproject.toml) and the types, before any test.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	@$(MAKE) --no-print-directory typecheck

# mypy against mypy-baseline.txt, which may only shrink; the domain modules have no entry (CONTRIBUTING.md).
typecheck: $(STAMP)
	$(PY) scripts/mypy_baseline.py

# The slowest tests are listed at the end: CI's 45-minute budget is watched from them.
test: lint browser monitoring
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)

# The fast lane: lint and the unit tests, which need neither Ray nor a browser, on every core;
# the few marked slow (processes, fuzzing) are left to `make test`.
# The fuzz module is not even collected: it generates the API schema as it is collected.
check: lint
	$(PY) -m pytest tests/unit -q -m "not slow" -n auto --ignore=tests/unit/controlplane/test_api_schema_fuzz.py $(PYTEST_ARGS)

# Long fault loops, kept out of `make test`: a worker SIGKILLed at random points of 20 changes of each
# kind (option patches, application deploys and deletes, a wizard's change).
fault-loop: $(STAMP)
	$(PY) -m pytest -m fault_loop tests/faults $(PYTEST_ARGS)

# The README's "Reproduce an OOM and fix it" walked as written, `make run` and a browser included
# (about 5 min and 5 GiB of memory), kept out of `make test` like the fault loops.
story: $(STAMP) browser
	$(PY) -m pytest -m story tests/story -s $(PYTEST_ARGS)
