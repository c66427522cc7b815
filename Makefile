# gpufair developer commands. Everything installs into .venv from this repository's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint check-generated proto clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

## Install and run the service (embedded PostgreSQL unless GPUFAIR_DATABASE_URL is set).
run: $(VENV)/.installed
	$(BIN)/gpufair serve

## Install and run the tests.
test: $(VENV)/.installed
	$(BIN)/python -m pytest -n auto

## Lint, format check, types, generated code and migrations.
lint: $(VENV)/.installed
	$(BIN)/ruff check service tests bench migrations scripts examples
	$(BIN)/ruff format --check service tests bench migrations scripts examples
	$(BIN)/mypy
	$(BIN)/python scripts/gen_proto.py --check
	$(BIN)/python scripts/check_migrations.py

## Regenerate the Python code of the API contract after editing proto/.
proto: $(VENV)/.installed
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
