# The two commands of the README: `make run` and `make test`. Both install what they need first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test check install browser fault-loop token

$(STAMP): pyproject.toml scripts/install.sh
	scripts/install.sh $(VENV)
	@touch $(STAMP)

install: $(STAMP)

browser:
	scripts/install-browser.sh

run: $(STAMP)
	FLEETDECK_DEBUG=$${FLEETDECK_DEBUG:-1} $(PY) manage.py runlocal

# `make token USER=alice` prints a new API token for alice from the database `make run` uses,
# under the same development settings: manage.py alone refuses to start without a real secret key.
token:
	@test "$(origin USER)" = "command line" || { echo 'Usage: make token USER=<username>' >&2; exit 2; }
	@FLEETDECK_DEBUG=$${FLEETDECK_DEBUG:-1} $(PY) manage.py create_api_token '$(USER)'

test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

# The fast lane: lint and the unit tests, which need neither Ray nor a browser.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

# Long fault loops, kept out of `make test`: a worker SIGKILLed at random points of 20 changes.
fault-loop: $(STAMP)
	$(PY) -m pytest -m fault_loop tests/faults $(PYTEST_ARGS)
