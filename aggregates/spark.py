"""Creating the SparkSession the pipeline runs in (one per process: start-up costs ~10 s)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from aggregates.cluster import (
    ExecutorEnvironmentError,
    driver_python_env,
    is_local_master,
    probe_executors,
    spark_start_error,
)
from aggregates.spark_python import use_installed_pyspark
from ingest.spark_source import SketchboardLogSource

log = logging.getLogger("sketchboard.spark")

# Groups a task's sketch aggregation holds in its hash map before it sorts the rest (see build_spark).
HASH_AGGREGATE_GROUPS = 65_536


def build_spark(master: str = "local[2]", *, app_name: str = "sketchboard-pipeline",
                shuffle_partitions: int = 2, driver_memory: str = "2g",
                extra_conf: Mapping[str, str] | None = None, probe_timeout_s: float = 180.0) -> SparkSession:
    """A session on `master`. On a cluster master (aggregates/cluster.py) the executors are
    probed right after start: ExecutorEnvironmentError if they cannot import our packages."""
    extra_conf = dict(extra_conf or {})
    local = is_local_master(master)
    # Python workers must run a Python with our packages (the venv): by default this interpreter,
    # which on a cluster means the same path on every worker (the same image or venv location).
    driver_python_env(extra_conf)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:  # workers import the installed pyspark, not Spark's zip of it (aggregates/spark_python.py)
        use_installed_pyspark()
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
    )
    if local:
        # Bind to loopback: the embedded pipeline needs no network beyond this machine. On a
        # cluster, executors connect back to the driver: Spark's defaults (SPARK_LOCAL_IP, else
        # the host's address) or spark.driver.host / spark.driver.bindAddress in spark_conf.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    builder = (
        builder
        # Sketch aggregates are object aggregates; the default falls back to sorting past 128
        # groups per task, which is several times slower for our (pane x dimensions) groups. But
        # each group holds its KLL sketches on the heap (~2 KB each at k = 200), so the hash map
        # must stay bounded: at 1 000 000 a backfill batch of 1 M events spread over a day
        # (~400 000 groups) ran the 2 GB driver out of heap (bench.throughput --hours 24).
        .config("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", str(HASH_AGGREGATE_GROUPS))
        # PySpark's DataFrame debugging records each API call's Python call site in the JVM: every
        # F.col, F.when, select... then costs ~8 calls into the JVM instead of 1-2 (the active
        # session, a conf read, the origin set and cleared). A demo-rate batch builds a few hundred
        # such expressions: thousands of calls, most of its driver time (docs/benchmarks.md, "a
        # demo-rate micro-batch"). Errors still name the failing expression, not its Python line.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
    )
    for key, value in extra_conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except (Py4JError, PySparkException) as exc:  # the JVM refused the settings, no master answered, ...
        raise spark_start_error(master, exc) from exc
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(SketchboardLogSource)
    if not local:
        try:
            report = probe_executors(spark, timeout_s=probe_timeout_s, variables=executor_variables(extra_conf))
        except ExecutorEnvironmentError:
            spark.stop()  # fail fast: no half-started pipeline holding the cluster's cores
            raise
        log.info("Spark master %s: executors run Python %s (%s) on %s and import the project%s", master,
                 report["python"], report["version"], report["host"], _environment_text(report["environment"]))
    return spark


EXECUTOR_ENV = "spark.executorEnv."


def executor_variables(conf: Mapping[str, str]) -> list[str]:
    """The environment variables `conf` sets for executors (spark.executorEnv.NAME)."""
    return sorted(key[len(EXECUTOR_ENV):] for key in conf if key.startswith(EXECUTOR_ENV))


def _environment_text(values: Mapping[str, str | None]) -> str:
    """The start-up log's account of the variables set for executors, as the probe found them there."""
    if not values:
        return ""
    return "; their environment: " + ", ".join(f"{name}={'(unset)' if value is None else value}"
                                               for name, value in sorted(values.items()))


def kafka_connector_conf(jars_dir: Path, packages: str | None = None) -> dict[str, str]:
    """The Spark settings that put Spark's Kafka connector on the classpath: the jars `make jars`
    resolved (jvm/spark-kafka/pom.xml) as spark.jars, or Maven coordinates as spark.jars.packages
    (Spark downloads them at start: needs internet). FileNotFoundError says how to get the jars."""
    if packages:
        return {"spark.jars.packages": packages}
    jars = sorted(Path(jars_dir).glob("*.jar"))
    if not jars:
        raise FileNotFoundError(
            f"Spark's Kafka connector is not in {jars_dir}: run `make jars` (needs Maven and Java 17+), or set"
            " spark_jars_packages to org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark version> (needs internet)")
    return {"spark.jars": ",".join(str(j) for j in jars)}


class LazySpark:
    """The pipeline's SparkSession, started at its first use: on the embedded log with a local
    master the pipeline runs every batch on the driver and no Spark query at all
    (aggregates/driver_serving.py), so the JVM (~5 s to start here, ~0.35 GiB idle) is started
    only if something asks the session for anything (a reprocessing run's capped source, a
    setting that sends batches through Spark). `master` and the settings it will start with are
    known without it; listeners (`add_listener`) wait for the start and are on the bus before
    anything else runs in it, so no query event is missed."""

    def __init__(self, master: str, build: Callable[[], SparkSession], conf: Mapping[str, str] | None = None):
        self.master, self.conf_values = master, dict(conf or {})
        self._build, self._session, self._listeners = build, None, []
        self._lock = threading.RLock()

    @property
    def started(self) -> bool:
        return self._session is not None

    def session(self) -> SparkSession:
        with self._lock:
            if self._session is None:
                log.info("starting Spark (%s): the pipeline needs it now", self.master)
                session = self._build()
                for listener in self._listeners:
                    session.streams.addListener(listener)
                self._listeners.clear()
                self._session = session
            return self._session

    def add_listener(self, listener) -> None:
        """On the bus now if started, else once it starts."""
        with self._lock:
            if self._session is None:
                self._listeners.append(listener)
                return
        self._session.streams.addListener(listener)

    def remove_listener(self, listener) -> None:
        """Off the bus if started, else off the list it would register."""
        with self._lock:
            if self._session is None:
                if listener in self._listeners:
                    self._listeners.remove(listener)
                return
        self._session.streams.removeListener(listener)

    def __getattr__(self, name: str):
        if name.startswith("_"):  # not a session attribute: never start the JVM for one (copy, pickle)
            raise AttributeError(name)
        return getattr(self.session(), name)


def master_of(spark) -> str:
    """The session's master, without starting a LazySpark."""
    return spark.master if isinstance(spark, LazySpark) else spark.sparkContext.master


def add_listener(spark, listener) -> None:
    """Put a StreamingQueryListener on the session's bus (a LazySpark's: when it starts)."""
    if isinstance(spark, LazySpark):
        spark.add_listener(listener)
    else:
        spark.streams.addListener(listener)


def remove_listener(spark, listener) -> None:
    """Take a listener off the bus (a LazySpark never started: off the list it would register)."""
    if isinstance(spark, LazySpark):
        spark.remove_listener(listener)
    else:
        spark.streams.removeListener(listener)


def conf_value(spark, key: str, default: str) -> str:
    """A Spark setting (a LazySpark not started: what it will start with, else `default`)."""
    if isinstance(spark, LazySpark) and not spark.started:
        return spark.conf_values.get(key, default)
    return spark.conf.get(key, default)


class LazyColumn:
    """A Spark Column built at its first use. Plans the driver path shares with Spark's (the Bloom
    features' and sessions' key items) name their columns so; building one needs a running
    SparkContext (`F.col` asserts it), which a pipeline serving its own batches never starts."""

    __slots__ = ("_make", "_column")

    def __init__(self, make: Callable[[], object]):
        self._make, self._column = make, None

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._column is None:
            self._column = self._make()
        return getattr(self._column, name)


class SparkNeeded(RuntimeError):
    """A batch on the driver path met code that needs a SparkContext (a Column built with `F.col`
    asserts one) while the pipeline's LazySpark had not started: it is started now, and the batch
    is run again by a pipeline built anew (sketchboard/live.py), nothing of it having been stored."""


def start_for_missing_context(spark, error: BaseException) -> bool:
    """Whether `error` is pyspark's assertion that no SparkContext is active, in a pipeline whose
    LazySpark had not started; if so it is started (the caller runs the batch again)."""
    from pyspark import SparkContext

    if not (isinstance(spark, LazySpark) and not spark.started and isinstance(error, AssertionError)
            and SparkContext._active_spark_context is None and _raised_in_pyspark(error)):
        return False
    log.warning("a batch needed Spark's session on the driver path (%s): starting it",
                _where(error) or "pyspark asserted an active SparkContext")
    spark.session()
    return True


def _raised_in_pyspark(error: BaseException) -> bool:
    """Whether the error was raised in pyspark's own code (its assertion of an active context), not
    by an assertion of ours, which is a real failure whether or not a session runs."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}pyspark{os.sep}" in frames[-1].filename


def _where(error: BaseException) -> str | None:
    """The innermost frame of ours in the error's traceback (what to make lazy next)."""
    import traceback

    ours = [f for f in traceback.extract_tb(error.__traceback__) if "site-packages" not in f.filename]
    return f"{ours[-1].filename}:{ours[-1].lineno}" if ours else None
