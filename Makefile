# Two entry points for a fresh machine (see README.md): `make sample` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: setup sample test bench lint clean

# torch first and pinned: 2.13.0 is a CPU wheel on disk here (pyproject allows newer; a bare
# "torch" would pull a multi-GB CUDA build). Then the project with its test and trainer extras.
$(BIN)/tokenmill: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,train]'
	@touch $@

setup: $(BIN)/tokenmill

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
