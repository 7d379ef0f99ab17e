# Two entry points for a fresh machine (see README.md): `make sample` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: setup-data setup sample test test-fast cluster-up cluster-down test-cluster bench lint clean

# Data only (`make sample`): tokenmill and apache-beam, no torch. Bytecode for tokenmill's own
# modules, as pip writes it for an installed package: an editable install has none, and where
# PYTHONDONTWRITEBYTECODE is set every process (the launcher and each Beam worker) compiled them
# again at start, 0.4 s each.
$(VENV)/.setup-data: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	$(BIN)/python -m compileall -q tokenmill
	@touch $@

# Everything the tests use: the trainer (torch from PyPI, a CUDA build of ~4 GB that also runs
# on the CPU; pinned so every machine tests the same one) and the interop readers.
$(VENV)/.setup: $(VENV)/.setup-data
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,train]'
	# Readers the export tests load shards with, without their declared dependencies:
	# mosaicml-streaming's pull torchvision and a CUDA torch (its MDS path needs only these
	# compression libraries); HF datasets' multiprocess and dill pins cannot meet apache-beam
	# 2.62's dill<0.3.2 (pip backtracks into an sdist whose setup.py never ends), and loading a
	# parquet file uses neither.
	$(BIN)/pip install -q --no-deps mosaicml-streaming==0.13.0 Brotli==1.2.1 python-snappy==0.7.3 \
		cramjam==2.14.0 zstd==1.5.7.2 catalogue==2.0.10 datasets==3.6.0 multiprocess==0.70.16
	$(BIN)/pip install -q pandas requests tqdm
	# datatrove's filter classes, for tests/test_quality_compat.py (quality.compat=datatrove against
	# them): without its declared dependencies, whose multiprocess/dill pins cannot meet apache-beam's
	# dill<0.3.2; its filters import only these two more.
	$(BIN)/pip install -q --no-deps datatrove==0.10.1 loguru==0.7.3 humanize==4.17.0
	@touch $@

setup-data: $(VENV)/.setup-data
setup: $(VENV)/.setup

sample: setup-data
	$(BIN)/tokenmill prepare --output $(OUT)

test: setup
	$(BIN)/python -m pytest -q

# The inner loop: everything but the tests marked slow (pyproject.toml), in under 2 minutes.
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# Real Flink and Spark clusters and Prism on this machine (scripts/cluster.sh; versions in
# cluster/versions.env), and the tests that run `prepare` on them; then a Flink cluster of
# namespace hosts that share no disk (tests/test_hosts.py).
cluster-up: setup-data
	scripts/cluster.sh install all
	scripts/cluster.sh up all

cluster-down:
	scripts/cluster.sh down all

# Then the hosts cluster (network and mount namespaces: as root), alone on the machine.
test-cluster: setup cluster-up
	TOKENMILL_CLUSTER=1 $(BIN)/python -m pytest -q tests/test_cluster.py; rc=$$?; scripts/cluster.sh down all; \
	TOKENMILL_CLUSTER=1 $(BIN)/python -m pytest -q tests/test_hosts.py; rc2=$$?; scripts/cluster.sh down hosts; \
	exit $$(( rc || rc2 ))

bench: setup
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python bench/extraction.py
	$(BIN)/python bench/langid.py

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(OUT) .pytest_cache
