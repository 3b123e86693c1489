# Quick start: `make run` (a broker on 127.0.0.1:61616, its HTTP management API on 127.0.0.1:8161,
# data in ./data) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: run test lint typecheck unit integration spark pipeline clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $(STAMP)

# Tests also cover the Spark connector: pyspark (the `spark` extra) and Java 17; the replication
# tests start a private ZooKeeper from Debian's `zookeeper` package (tandem.testing.zookeeper); the chaos
# tests draw their plot with matplotlib (the `chaos` extra); the web console's tests drive Debian's
# `chromium` with Playwright (tests/browser); the leak test runs the broker with Debian's mimalloc
# (`memory-allocator = "mimalloc"`, decision 0083).
$(TSTAMP): $(BIN)/python pyproject.toml scripts/ensure-java.sh scripts/ensure-zookeeper.sh scripts/ensure-chromium.sh scripts/ensure-mimalloc.sh scripts/apt-install.sh
	scripts/ensure-java.sh
	scripts/ensure-zookeeper.sh
	scripts/ensure-chromium.sh
	scripts/ensure-mimalloc.sh
	$(BIN)/pip install -q -e '.[test,spark,chaos]'
	touch $(STAMP) $(TSTAMP)

run: $(STAMP)
	$(BIN)/tandem run --data ./data --bind 127.0.0.1:61616 --management-bind 127.0.0.1:8161

lint: $(TSTAMP)
	$(BIN)/ruff check --no-cache src tests bench examples
	$(BIN)/ruff format --no-cache --check src tests bench examples

typecheck: $(TSTAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider --durations=30 -n 3 --dist loadgroup

unit: $(TSTAMP)
	$(BIN)/pytest -q tests/unit

integration: $(TSTAMP)
	$(BIN)/pytest -q tests/integration

spark: $(TSTAMP)
	$(BIN)/pytest -q tests/spark

# The example data pipeline end to end: broker, producer, Spark job, alerts consumer, checks.
pipeline: $(TSTAMP)
	$(BIN)/python examples/pipeline/run.py

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache
