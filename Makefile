# Two entry points for a fresh machine (see README.md): `make sample` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: setup setup-train sample test bench lint clean

$(BIN)/tokenmill: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

setup: $(BIN)/tokenmill

# The trainer's torch: exactly 2.13.0 here (a CPU wheel on disk); pyproject allows newer.
setup-train: setup
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,train]'

sample: setup
	$(BIN)/tokenmill prepare --output $(OUT)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python bench/extraction.py
	$(BIN)/python bench/langid.py

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(OUT) .pytest_cache
