"""The pipeline on a real Spark standalone cluster (a master and one 1-core worker on loopback,
tests/spark_cluster.py), as a deployment runs it: a `sketchboard pipeline` process whose
spark_master is spark://..., reading a real Kafka broker's topics and committing into a real
PostgreSQL server. The executors are the worker's JVM and Python processes, not the driver's:
what they need travels with the job (catalog, filters) or the run fails at start, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from catalog import Catalog
from ingest.events import EventValidator
from tests.log_backends import TestLog
from tests.spark.events import assert_panes_exact, http_events

pytestmark = [
    pytest.mark.cluster, pytest.mark.spark, pytest.mark.e2e, pytest.mark.kafka, pytest.mark.postgres,
    # The scale-out stack only: the embedded log cannot serve a cluster (aggregates/cluster.py).
    pytest.mark.parametrize(("log_backend", "store_backend"), [("kafka", "postgres")], indirect=True,
                            scope="module", ids=["scale-out"]),
]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    from tests.spark_cluster import SparkCluster

    # One worker with one core and 1 GiB: the cheapest cluster that still runs every task away
    # from the driver's process.
    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=1, cores=1, memory="1g") as cluster:
        yield cluster


def run_pipeline(root: Path, settings: dict, env: dict[str, str] | None = None,
                 timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`sketchboard pipeline --once` as its own process (its own SparkContext, on the cluster)."""
    settings_file = root / "sketchboard.yaml"
    settings_file.write_text(yaml.safe_dump({"data_dir": str(root / "data"), **settings}))
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", "SKETCHBOARD_SETTINGS_FILE": str(settings_file),
               "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}  # the driver binds loopback, where the worker is
    return subprocess.run([sys.executable, "-m", "sketchboard.cli", "pipeline", "--once"], env=environ,
                          capture_output=True, text=True, timeout=timeout_s)


def cluster_settings(log: TestLog, dsn: str, master: str) -> dict:
    return {**log.settings(), "store_backend": "postgres", "postgres_dsn": dsn, "postgres_pool_size": 2,
            "spark_master": master, "spark_driver_memory": "512m",
            # The worker offers 1 GiB: executors ask for less, leaving room for their Python workers.
            "spark_conf": {"spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
                           # As the tests' drivers (tests/conftest.py): a one-batch executor JVM with
                           # the JIT's first tier only spends less of the 2 cores compiling.
                           "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1"}}


def append(log: TestLog, catalog: Catalog, stream: str, events: list[dict]) -> None:
    """Validated as the ingest API validates, appended to the stream's topic."""
    validator = EventValidator(catalog.stream(stream))
    opened = log.open(catalog)
    try:
        opened.append(catalog.stream(stream), [validator.validate(e) for e in events], int(time.time() * 1000))
    finally:
        opened.close()


def test_pipeline_on_a_standalone_cluster_is_exact(tmp_path, demo_catalog, spark_cluster, log_backend,
                                                   store_backend):
    log = log_backend.new(tmp_path)
    store = store_backend.create()
    events = http_events(3_000, seed=11)
    append(log, demo_catalog, "http_requests", events)

    done = run_pipeline(tmp_path, cluster_settings(log, store.dsn, spark_cluster.master_url))

    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}\n{spark_cluster.log_tail()}"
    assert "executors run Python" in done.stderr, done.stderr[-3000:]  # the start-up probe ran on the worker
    # The driver's allocator settings reached the executors, which inherit nothing from it (sketchboard/allocators.py).
    assert "MIMALLOC_ALLOW_THP=0" in done.stderr, done.stderr[-3000:]
    assert_panes_exact(store, events)
    progress = store.progress("main")
    assert progress.events_read == len(events)
    # The worker's own executor did the work: the master saw an application that ran on it.
    completed = spark_cluster.status()["completedapps"]
    assert any(app["name"] == "sketchboard-pipeline" for app in completed), completed


def test_executors_without_the_project_fail_fast_saying_so(tmp_path, demo_catalog, spark_cluster, log_backend,
                                                           store_backend):
    # A Python of the driver's version with nothing installed: what a worker started from
    # another image or with PYSPARK_PYTHON pointing elsewhere would run.
    bare = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    log = log_backend.new(tmp_path)
    store = store_backend.create()
    append(log, demo_catalog, "http_requests", http_events(100, seed=12))

    done = run_pipeline(tmp_path, cluster_settings(log, store.dsn, spark_cluster.master_url),
                        env={"PYSPARK_PYTHON": python})

    assert done.returncode == 2, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("sketchboard: Spark's executors cannot import the project's packages"), message
    assert python in message and "No module named 'catalog'" in message and "PYSPARK_PYTHON" in message, message
    assert store.last_batch_id("main") is None  # nothing ran


def test_a_spark_start_that_fails_is_one_line_and_exit_2(tmp_path, demo_catalog, log_backend, store_backend):
    """A session Spark refuses to start (here: executor options with -Xmx, refused by SparkConf before
    any master is asked, so no cluster and no ~60 s wait for one) stops the pipeline with one line
    naming the master and Spark's reason, as the settings' own errors do, not with a Py4J traceback
    (exit 1). The same path says "all masters unresponsive (host:port: Connection refused)" when no
    master answers (tests/unit/test_cluster_config.py)."""
    from tests.procs import free_port

    log = log_backend.new(tmp_path)
    store = store_backend.create()
    master = f"spark://127.0.0.1:{free_port()}"
    settings = cluster_settings(log, store.dsn, master)
    settings["spark_conf"]["spark.executor.extraJavaOptions"] = "-Xmx1g"

    done = run_pipeline(tmp_path, settings, timeout_s=180)

    assert done.returncode == 2, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-6000:]
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith(f"sketchboard: could not start Spark on {master}: [INVALID_SPARK_CONFIG."), message
    assert "-Xmx1g" in message, message


def test_sigterm_to_the_pipelines_process_group_is_a_clean_stop(tmp_path, demo_catalog, spark_cluster, log_backend,
                                                                  store_backend):
    """systemd's default KillMode (control-group) signals every process of the service: the driver's
    JVM gets the SIGTERM too, and its shutdown hook stops the SparkContext under the query the
    pipeline is waiting on. That is the stop asked for: exit 0, not a Py4J error (exit 1, or 2 with
    "Connection refused"), and the next start resumes from the checkpoint, exactly once."""
    import signal

    log = log_backend.new(tmp_path)
    store = store_backend.create()
    events = http_events(3_000, seed=13)
    append(log, demo_catalog, "http_requests", events)
    settings = {**cluster_settings(log, store.dsn, spark_cluster.master_url), "driver_batch_rows": 0}
    settings_file = tmp_path / "sketchboard.yaml"
    settings_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), **settings}))
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", "SKETCHBOARD_SETTINGS_FILE": str(settings_file),
               "SPARK_LOCAL_IP": "127.0.0.1"}
    output = tmp_path / "pipeline.log"
    with open(output, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sketchboard.cli", "pipeline"], env=environ, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "running (checkpoints in" not in output.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)  # the query under way
        os.killpg(proc.pid, signal.SIGTERM)  # the driver and its JVM, as systemd stops a service
        returncode = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = output.read_text()
    assert returncode == 0, text[-6000:]
    assert "\nsketchboard: " not in text, text[-3000:]

    done = run_pipeline(tmp_path, settings)  # resumes from the checkpoint
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert_panes_exact(store, events)
