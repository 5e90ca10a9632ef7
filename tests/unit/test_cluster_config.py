"""The checks that make a cluster run fail at start rather than at the first batch
(aggregates/cluster.py): no JVM here; the probe's task function runs in this interpreter."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from aggregates.cluster import (
    EXECUTOR_MODULES,
    ClusterConfigError,
    check_log_fits_master,
    executor_python,
    is_local_master,
    probe_failure,
    probe_task,
    task_failure,
)
from sketchboard.settings import Settings


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,3]", "local-cluster[2,1,1024]"])
def test_local_masters_share_the_drivers_disk(master):
    assert is_local_master(master)
    check_log_fits_master(master, "embedded")  # no error


@pytest.mark.parametrize("master", ["spark://spark-master:7077", "yarn", "k8s://https://kube:6443"])
def test_the_embedded_log_is_refused_on_a_cluster_naming_the_fix(master):
    assert not is_local_master(master)
    with pytest.raises(ClusterConfigError, match="log_backend: kafka"):
        check_log_fits_master(master, "embedded")
    check_log_fits_master(master, "kafka")


def test_one_reading_of_the_master_decides_local_mode_everywhere():
    """is_local_master (the executors share the driver's disk) and driver_rows_limit (every batch on
    the driver in one local JVM) read the master through master_kind, as Spark does: case-sensitively.
    They used to differ (one lowercased, the other not), so LOCAL[2] was local to one and a cluster
    to the other, while Spark refuses it."""
    from aggregates.cluster import master_kind
    from aggregates.pipeline import CLUSTER_DRIVER_BATCH_ROWS, driver_rows_limit

    assert [master_kind(m) for m in ("local", "local[3]", "local-cluster[2,1,1024]", "spark://h:7077")] == [
        "local", "local", "local-cluster", "cluster"]
    assert driver_rows_limit(None, "local-cluster[2,1,1024]", 10**6) == CLUSTER_DRIVER_BATCH_ROWS
    for refused in ("LOCAL[2]", "Local", "SPARK://h:7077", "spark://h"):
        with pytest.raises(ValueError):
            is_local_master(refused)
        with pytest.raises(ValueError):
            driver_rows_limit(None, refused, 10**6)


def test_settings_refuse_a_cluster_master_with_the_embedded_log(tmp_path):
    with pytest.raises(ValidationError, match="embedded log is a file on this machine"):
        Settings(data_dir=tmp_path, spark_master="spark://spark-master:7077")
    settings = Settings(data_dir=tmp_path, spark_master="spark://spark-master:7077", log_backend="kafka",
                        kafka_bootstrap_servers="kafka:9092", spark_conf={"spark.executor.memory": "2g"})
    assert settings.spark_conf == {"spark.executor.memory": "2g"}


def test_executor_python_prefers_the_spark_setting_then_the_environment_then_the_driver():
    assert executor_python({}, {}, "/venv/bin/python") == "/venv/bin/python"
    assert executor_python({}, {"PYSPARK_PYTHON": "/opt/py/bin/python"}, "/venv/bin/python") == "/opt/py/bin/python"
    conf = {"spark.pyspark.python": "/image/bin/python"}
    assert executor_python(conf, {"PYSPARK_PYTHON": "/opt/py/bin/python"}, "/venv/bin/python") == "/image/bin/python"


def test_the_probe_imports_what_executors_run_and_reports_the_first_failure():
    ok = probe_task(EXECUTOR_MODULES)(0)
    assert ok["error"] is None and ok["module"] is None and ok["python"]
    assert probe_failure(ok, "/venv/bin/python", "3.11.7") is None

    bad = probe_task(["json", "no_such_package_here", "catalog"])(0)
    assert bad["module"] == "no_such_package_here"
    assert bad["error"] == "ModuleNotFoundError: No module named 'no_such_package_here'"
    message = probe_failure({**bad, "python": "/usr/bin/python3", "host": "worker-1"}, "/venv/bin/python", "3.11.7")
    assert message.startswith("Spark's executors cannot import the project's packages: on host worker-1, Python"
                              " /usr/bin/python3")
    assert "no_such_package_here" in message and "/venv/bin/python" in message and "PYSPARK_PYTHON" in message


def test_the_probe_is_shipped_by_value(monkeypatch):
    """An executor that cannot import aggregates.cluster must still be able to run the probe."""
    import pickle

    from pyspark import cloudpickle

    shipped = cloudpickle.dumps(probe_task(["json"]))
    for name in ("aggregates", "aggregates.cluster"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    assert pickle.loads(shipped)(0)["error"] is None


# What Spark raises when the executor's Python cannot start (abridged from a real run).
JOB_ABORTED = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent\
 failure: Lost task 0.3 in stage 0.0 (TID 3) (127.0.0.1 executor 0): java.io.IOException: Cannot run program\
 "/nonexistent/python": error=2, No such file or directory
\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)
"""
PYTHON_CRASH = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, most recent\
 failure: Lost task 0.3 in stage 0.0 (TID 3) (127.0.0.1 executor 0): org.apache.spark.api.python.PythonException:\
 Traceback (most recent call last):
  File "/spark/python/lib/pyspark.zip/pyspark/worker.py", line 3, in main
pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has different version\
 (3, 10) than that in driver 3.11, PySpark cannot run with different minor versions.
\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)
"""


def test_a_failed_probe_job_is_reported_by_its_cause_not_the_jvm_stack():
    message = task_failure(Exception(JOB_ABORTED), "/nonexistent/python")
    assert message.startswith("Spark's executors could not run Python (/nonexistent/python) for the start-up probe:"
                              ' java.io.IOException: Cannot run program "/nonexistent/python"')
    assert "ProcessBuilder" not in message and "PYSPARK_PYTHON" in message
    message = task_failure(Exception(PYTHON_CRASH), "/usr/bin/python3.10")
    assert "PYTHON_VERSION_MISMATCH" in message and "Traceback" not in message and "scala" not in message


class _JavaError(Exception):
    """What py4j raises for a Java exception (Py4JJavaError): the Java exception's message is asked of the JVM."""

    def __init__(self, message: str):
        super().__init__("An error occurred while calling None.org.apache.spark.sql.classic.SparkSession.\n: ...")
        self.java_exception = type("JavaException", (), {"getMessage": lambda _self: message})()


def test_a_failed_spark_start_is_one_line_with_sparks_reason():
    """build_spark turns a session that does not start into SparkStartError (the CLI: `sketchboard:
    <it>`, exit 2) instead of a Py4J traceback: Spark's first line, or for a standalone master
    nothing answered (Spark gives up after ~60 s and the session fails on the stopped context),
    the addresses that refuse connections."""
    from aggregates.cluster import SparkStartError, spark_start_error
    from tests.procs import free_port

    memory = spark_start_error("spark://m:7077", _JavaError(
        "[INVALID_EXECUTOR_MEMORY.CONFIG_MEMORY] Insufficient executor memory: Executor memory 314572800 must be at"
        " least 471859200.\nPlease increase executor memory using ..."))
    assert isinstance(memory, SparkStartError)
    assert str(memory) == ("could not start Spark on spark://m:7077: [INVALID_EXECUTOR_MEMORY.CONFIG_MEMORY]"
                           " Insufficient executor memory: Executor memory 314572800 must be at least 471859200.")
    port = free_port()
    stopped = spark_start_error(f"spark://127.0.0.1:{port}", _JavaError(
        "Cannot call methods on a stopped SparkContext.\nThis stopped SparkContext was created at: ..."))
    assert str(stopped).startswith(f"could not start Spark on spark://127.0.0.1:{port}: all masters unresponsive"
                                   f" (127.0.0.1:{port}: Connection refused)"), stopped
    from pyspark.errors import PySparkRuntimeError

    gateway = spark_start_error("local[2]", PySparkRuntimeError(
        errorClass="JAVA_GATEWAY_EXITED", messageParameters={}))
    assert str(gateway).startswith("could not start Spark on local[2]: [JAVA_GATEWAY_EXITED]"), gateway


def test_the_probe_reports_the_environment_asked_for_and_the_start_up_log_names_it(monkeypatch):
    from aggregates.spark import _environment_text, executor_variables

    monkeypatch.setenv("SKETCHBOARD_PROBED", "7")
    monkeypatch.delenv("SKETCHBOARD_NOT_SET", raising=False)
    conf = {"spark.executorEnv.SKETCHBOARD_PROBED": "7", "spark.executorEnv.SKETCHBOARD_NOT_SET": "1",
            "spark.executor.memory": "1g"}
    asked = executor_variables(conf)
    assert asked == ["SKETCHBOARD_NOT_SET", "SKETCHBOARD_PROBED"]
    report = probe_task(["json"], asked)(0)
    assert report["environment"] == {"SKETCHBOARD_NOT_SET": None, "SKETCHBOARD_PROBED": "7"}
    assert _environment_text(report["environment"]) == (
        "; their environment: SKETCHBOARD_NOT_SET=(unset), SKETCHBOARD_PROBED=7")
    assert _environment_text({}) == ""


def test_a_cluster_masters_executors_get_the_allocators_settings(monkeypatch):
    from sketchboard.allocators import remote_environment
    from sketchboard.wiring import executor_allocators

    monkeypatch.delenv("MIMALLOC_ALLOW_THP", raising=False)
    assert executor_allocators("local[2]") == {}  # the JVM and its Python workers inherit this process's
    conf = executor_allocators("spark://spark-master:7077")
    assert conf == {f"spark.executorEnv.{name}": value for name, value in remote_environment().items()}
    assert conf["spark.executorEnv.MIMALLOC_ALLOW_THP"] == "0"
