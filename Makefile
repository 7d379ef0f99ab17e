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
	# mosaicml-streaming (the MDS export's reader in the tests) without its declared dependencies:
	# they pull torchvision and a CUDA torch. Its MDS path needs only these compression libraries.
	$(BIN)/pip install -q --no-deps mosaicml-streaming==0.13.0 Brotli==1.2.1 python-snappy==0.7.3 \
		cramjam==2.14.0 zstd==1.5.7.2 catalogue==2.0.10
	# Full fastText for `tokenmill classifier train`, in its own folder: fasttext-numpy2 and
	# fasttext-predict (scoring) both ship a module named fasttext.
	$(BIN)/pip install -q --no-deps --target $(VENV)/fasttext-train fasttext-numpy2==0.10.4
	# Bytecode for tokenmill's own modules, as pip writes it for an installed package: an editable
	# install has none, and where PYTHONDONTWRITEBYTECODE is set every process (the launcher and
	# each Beam worker) compiled them again at start, 0.4 s each.
	$(BIN)/python -m compileall -q tokenmill
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
