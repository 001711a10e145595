# Everything bootstraps itself: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Test processes: most tests wait on fsync, child processes, ZooKeeper or a JVM, so two
# workers halve the suite on two cores; each worker starts its own fixtures (ports are 0).
TEST_WORKERS ?= 2

.PHONY: demo test lint bench clean zookeeper java cluster-demo replicated-demo

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip uninstall --quiet -y sediment 2>/dev/null || true  # this project's former distribution name
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# Debian's ZooKeeper for the replication and metadata tests (no service is started).
zookeeper:
	@test -f /usr/share/java/zookeeper.jar || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper >/dev/null)

# Java 17 or newer for Spark (PySpark 4) and ZooKeeper: Debian's JRE when there is none.
java:
	@command -v java >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null)
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	  test "$${v:-0}" -ge 17 || { echo "Java 17 or newer is needed (found: $$(java -version 2>&1 | head -1))"; exit 1; }

demo: $(STAMP) java
	$(BIN)/sediment demo

test: $(STAMP) java zookeeper
	$(BIN)/ruff check .
	$(BIN)/python tools/lint_imports.py
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python tools/lint_imports.py

bench: $(STAMP)
	$(BIN)/python bench/append.py --quick
	$(BIN)/python bench/compact.py --quick
	$(BIN)/python bench/replay.py --quick
	$(BIN)/python bench/device.py --quick
	$(BIN)/python bench/replication.py

# The Spark data source on a standalone cluster (Master + Worker via spark-class on 127.0.0.1),
# batches in moto's S3, credentials as data source options.
cluster-demo: $(STAMP) java
	@echo "cluster-demo: the sediment data source on a Spark standalone cluster (a Master and a Worker on 127.0.0.1), batches in moto's S3; 30-80 s"
	SEDIMENT_SPARK_CLUSTER=1 $(BIN)/pytest -q -rp tests/spark/test_spark_cluster.py

# A replicated deployment on loopback through the CLI: ZooKeeper, moto (S3) and three storage
# nodes, a coordinator killed and replaced; every process stopped by its PID at the end.
replicated-demo: $(STAMP) java zookeeper
	$(BIN)/python tools/replicated_demo.py

clean:
	rm -rf $(VENV) sediment-data
