# Everything bootstraps itself: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean zookeeper

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# Debian's ZooKeeper for the replication and metadata tests (no service is started).
zookeeper:
	@test -f /usr/share/java/zookeeper.jar || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper >/dev/null)

demo: $(STAMP)
	$(BIN)/sediment demo

test: $(STAMP) zookeeper
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python bench/append.py --quick
	$(BIN)/python bench/compact.py --quick
	$(BIN)/python bench/replay.py --quick
	$(BIN)/python bench/device.py --quick
	$(BIN)/python bench/replication.py

clean:
	rm -rf $(VENV) sediment-data
