# Two commands on a fresh machine: `make run` (service + demo traffic) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# JVM jars from Maven Central, resolved from the pinned poms in jvm/<name>/pom.xml into
# jars/<name>/ (git-ignored). A folder is fetched only when missing or when its pom changed:
# the stamp is written last, so an interrupted fetch is redone.
JARS := jars
MVN ?= mvn
BROKER_JARS := $(JARS)/kafka-broker/.resolved
SPARK_KAFKA_JARS := $(JARS)/spark-kafka/.resolved

.PHONY: run test test-fast bench install clean jars

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements.lock -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

$(JARS)/%/.resolved: jvm/%/pom.xml
	@command -v $(MVN) >/dev/null || { echo "make jars needs Maven (mvn) and Java 17+: apt-get install maven" >&2; exit 1; }
	rm -rf $(JARS)/$*
	$(MVN) -q -B -Dstyle.color=never -f $< dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory=$(CURDIR)/$(JARS)/$*
	@touch $@

# The Kafka broker the tests start, and Spark's Kafka source (spark.jars).
jars: $(BROKER_JARS) $(SPARK_KAFKA_JARS)

run: $(STAMP)
	$(BIN)/sketchboard up

# Three runs: the tests without a JVM or a real process spread over two workers (pytest-xdist, one
# file per worker at a time, since their fixtures are module-scoped); then the in-process Spark and
# Kafka tests over two workers too (each with its own SparkSession and broker: they wait on py4j,
# the log and the store as much as they compute); then the real-process tests one at a time (they
# time real processes, each with a Spark pipeline of its own: beside other Spark work they time
# out), with any marked `serial` (none today: tests/conftest.py refuses items that share a node id,
# which xdist would not all run). Every run goes on even if one before fails. Each prints its slowest tests
# (where the suite's time goes; the JVM-free run's list was missing and hid an 80 s test there).
# Python caches its bytecode here even where the environment says
# PYTHONDONTWRITEBYTECODE (__pycache__ is git-ignored): without it every worker, `sketchboard` process and
# Spark Python worker compiled the project anew, and each run's collection rewrote every test's asserts
# (~20 s a run instead of ~7). Before the Spark runs, a class-data archive of a Spark driver
# is made once (tests/spark_cds.py, under build/): the tests' drivers map it and start ~5 s sooner.
NO_JVM := not spark and not e2e and not kafka
PARALLEL := $(NO_JVM) and not serial
JVM_PARALLEL := (spark or kafka) and not e2e and not serial
test: $(STAMP) jars
	@unset PYTHONDONTWRITEBYTECODE; \
	$(BIN)/python -m pytest -m "$(PARALLEL)" -n 2 --dist loadfile --durations=20; fast=$$?; \
	$(BIN)/python -m tests.spark_cds || echo "(the Spark drivers start without a class-data archive)"; \
	$(BIN)/python -m pytest -m "$(JVM_PARALLEL)" -n 2 --dist loadfile --durations=20; jvm=$$?; \
	$(BIN)/python -m pytest -m "not ($(PARALLEL)) and not ($(JVM_PARALLEL))" --durations=20; slow=$$?; \
	test $$fast -eq 0 && test $$jvm -eq 0 && test $$slow -eq 0

# No JVM at all: no Spark, no Kafka broker, no real-process tests. The jars are fetched all the
# same: the pipeline command checks for Spark's Kafka connector before it reaches a broker.
test-fast: $(STAMP) jars
	@unset PYTHONDONTWRITEBYTECODE; \
	$(BIN)/python -m pytest -m "$(PARALLEL)" -n 2 --dist loadfile; fast=$$?; \
	$(BIN)/python -m pytest -m "$(NO_JVM) and serial"; serial=$$?; \
	test $$serial -eq 5 && serial=0; \
	test $$fast -eq 0 && test $$serial -eq 0

# Throughput, then the short form of the day-of-data query benchmark (docs/benchmarks.md).
bench: $(STAMP)
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.day_of_data --events 100000 --repeat 10
	$(BIN)/python -m bench.side_by_side --events 500000 --batch 10000

clean:
	rm -rf $(VENV) data build *.egg-info $(JARS)
