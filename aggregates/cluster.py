"""Running the pipeline on a Spark cluster (standalone `spark://`, YARN, Kubernetes) rather than
in local mode: what must hold before the first micro-batch, checked at start with messages that
name the fix.

- Executors run Python for our code (the Kafka records' validation in mapInArrow, the embedded
  log's data source, the first-seen filter test). Which interpreter: the driver tells them, from
  its PYSPARK_PYTHON; `executor_python` picks it (spark.pyspark.python in the Spark settings,
  else PYSPARK_PYTHON, else the driver's own interpreter: right when every machine runs the
  same image or venv path). A wrong one shows up only at the first batch, as a task failure
  deep in a stack trace; `probe_executors` runs one small task right after the session
  starts that imports the project's packages there, and turns a failure into one clear error
  naming the executor's interpreter and what it could not import.
- Nothing may be read from the driver's local disk by an executor: on another machine the path
  does not exist (or is another file). The embedded log is a SQLite file the executors open by
  path, so a non-local master needs log_backend kafka (`check_log_fits_master`). Everything
  else executors need travels with the job: the catalog as JSON in the Kafka source's closure,
  the first-seen filters as a broadcast; the store is only read and written by the driver.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping

# What executors import to run our code: the project's packages whose functions run in tasks,
# and the libraries those tasks need (mapInArrow hands pyarrow batches; numpy tests filter bits).
EXECUTOR_MODULES = ("catalog", "sketches", "ingest.source_rows", "ingest.kafka_source", "ingest.spark_source",
                    "aggregates.firstseen", "aggregates.arrow_partials", "datasketches", "pyarrow", "numpy")

PYTHON_CONF = "spark.pyspark.python"


class ClusterConfigError(ValueError):
    """The settings cannot work on this Spark master (said before Spark starts)."""


class ExecutorEnvironmentError(RuntimeError):
    """The executors cannot run the project's Python code (said right after Spark starts)."""


class SparkStartError(RuntimeError):
    """Spark's session did not start: one line with Spark's reason instead of a Py4J traceback."""


def spark_start_error(master: str, error: BaseException) -> SparkStartError:
    """What a failed SparkSession start says: Spark's own message (its first line: the error class
    and reason, e.g. [INVALID_EXECUTOR_MEMORY.CONFIG_MEMORY] ...), or, when a standalone master never
    answered (Spark retries for ~60 s, logs "All masters are unresponsive! Giving up.", stops the
    context, and the session then fails on the stopped context), which master addresses refuse
    connections."""
    reason = _first_line(_java_message(error) or str(error)) or type(error).__name__
    if "stopped SparkContext" in reason:
        if master.startswith("spark://"):
            unreachable = _unreachable(master[len("spark://"):].split(","))
            if unreachable:
                reason = ("all masters unresponsive (" + "; ".join(unreachable) + "): is a Spark master running"
                          " there, and can this machine reach it?")
            else:
                reason = ("Spark stopped the context while starting it (the master answers: its log and"
                          " Spark's lines above say why, e.g. \"All masters are unresponsive\")")
        else:
            reason = "Spark stopped the context while starting it (Spark's lines above say why)"
    return SparkStartError(f"could not start Spark on {master}: {reason}")


def _java_message(error: BaseException) -> str | None:
    java = getattr(error, "java_exception", None)  # py4j's Py4JJavaError
    if java is None:
        return None
    try:
        return java.getMessage() or java.toString()
    except Exception:  # the JVM is gone too: fall back on Python's text
        return None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _unreachable(addresses: Iterable[str], timeout_s: float = 3.0) -> list[str]:
    """'host:port: reason' for each standalone master address nothing answers on (all or none)."""
    import socket

    failures = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except (OSError, ValueError) as exc:
            failures.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
        else:
            return []  # one answers: the masters are not simply absent
    return failures


# The master URLs Spark takes, as it reads them: case-sensitive (SparkMasterRegex in SparkContext,
# the cluster managers' prefixes in SparkSubmit), every standalone master as host:port
# (RpcAddress.fromSparkURL: java.net.URI's host and port, nothing else).
_LOCAL = re.compile(r"local(\[([0-9]+|\*)(\s*,\s*[0-9]+)?\])?\Z")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*[0-9]+\s*,\s*[0-9]+\s*,\s*[0-9]+\s*\]\Z")
_HOST_PORT = re.compile(
    r"(?P<host>\[[0-9A-Fa-f:.]+\]"  # [IPv6]
    r"|[0-9]{1,3}(?:\.[0-9]{1,3}){3}"  # IPv4
    r"|(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)*[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.?)"  # a DNS name
    r":(?P<port>[0-9]{1,5})\Z")


def master_kind(master: str) -> str:
    """How Spark runs `master`: "local" (one JVM on this machine: local, local[N], local[*],
    local[N,F]), "local-cluster" (local-cluster[W,C,M]: several JVMs, still this machine) or
    "cluster" (spark://host:port[,host:port...], yarn, k8s://...). ValueError, saying why, for
    text Spark would refuse when its session starts ("Could not parse Master URL", "Invalid
    master URL"). Case-sensitive and unstripped, as Spark reads it."""
    if _LOCAL.match(master):
        if re.match(r"local\[0+[\],\s]", master):
            raise ValueError("local mode needs at least one thread (local[1])")
        return "local"
    if _LOCAL_CLUSTER.match(master):
        return "local-cluster"
    if master == "yarn":
        return "cluster"
    if master.startswith("spark://"):
        for address in master[len("spark://"):].split(","):
            matched = _HOST_PORT.match(address)
            if matched and re.fullmatch(r"[0-9.]+", matched["host"]) and max(map(int, matched["host"].split("."))) > 255:
                matched = None  # not an IPv4 address, and no host name either (its last label is a number)
            if not matched and "_" in address.rsplit(":", 1)[0]:
                raise ValueError(f"{address!r}: a host name with '_' is no host to Spark (java.net.URI finds none"
                                 f" in spark://{address}): use a name without it or the address")
            if not matched:
                raise ValueError(f"{address!r} is no master address: each master of spark:// is host:port"
                                 " (spark://host:7077, or spark://host1:7077,host2:7077 for standby masters)")
            if not 0 < int(matched["port"]) < 65536:
                raise ValueError(f"{address!r}: the port must be 1 to 65535")
        return "cluster"
    if master.startswith("k8s://"):
        api = master[len("k8s://"):]
        scheme = api.split("://", 1)[0].lower() if "://" in api else "https"
        if not api or scheme not in ("http", "https") or not api.split("://", 1)[-1].strip("/"):
            raise ValueError("k8s:// is followed by the API server's address: k8s://host:port or"
                             " k8s://https://host:port")
        return "cluster"
    if master != master.strip():
        raise ValueError("no spaces around it")
    if master.lower() != master:
        try:
            master_kind(master.lower())
        except ValueError:
            pass
        else:
            raise ValueError(f"Spark reads master URLs case-sensitively: write {master.lower()!r}")
    raise ValueError("local, local[N], local[*], local[N,F], spark://host:port, yarn or k8s://host:port")


def is_local_master(master: str) -> bool:
    """local, local[N], local[*], local[N,F] and local-cluster[...] run every executor on this
    machine (the driver's disk is theirs); anything else (spark://, yarn, k8s://) may not."""
    return master_kind(master) != "cluster"


def check_log_fits_master(master: str, log_backend: str) -> None:
    if log_backend == "embedded" and not is_local_master(master):
        raise ClusterConfigError(
            f"spark_master is {master!r}, but the embedded log is a file on this machine that Spark's executors"
            " would have to open on theirs: on a cluster set log_backend: kafka (and kafka_bootstrap_servers),"
            " or run Spark in local mode (spark_master: local[N])")


def executor_python(conf: Mapping[str, str], environ: Mapping[str, str], default: str) -> str:
    """The interpreter executors start for Python tasks: spark.pyspark.python if the Spark
    settings name one, else PYSPARK_PYTHON, else `default` (the driver's own interpreter)."""
    return conf.get(PYTHON_CONF) or environ.get("PYSPARK_PYTHON") or default


def probe_task(modules: Iterable[str], variables: Iterable[str] = ()) -> Callable[[object], dict]:
    """The function one executor task runs: import `modules`, report the interpreter, the values
    of the environment `variables` there (None: unset) and the first failure. A closure on purpose:
    cloudpickle ships it by value, so an executor that cannot import this module (the very thing
    probed) can still run it and say so."""
    names, asked = list(modules), list(variables)

    def probe(_):
        import importlib
        import os
        import platform
        import socket
        import sys
        import traceback

        report = {"python": sys.executable, "version": platform.python_version(), "host": socket.gethostname(),
                  "environment": {name: os.environ.get(name) for name in asked}, "module": None, "error": None}
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException as exc:  # noqa: BLE001 - any failure to import is the answer
                report["module"] = name
                report["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                break
        return report

    return probe


def probe_failure(report: Mapping[str, object], driver_python: str, driver_version: str) -> str | None:
    """The error message for an executor's probe report, or None when it imported everything."""
    if not report.get("error"):
        return None
    return (f"Spark's executors cannot import the project's packages: on host {report['host']}, Python"
            f" {report['python']} ({report['version']}) failed to import {report['module']}: {report['error']}."
            f" The driver runs {driver_python} ({driver_version}). Point executors at a Python with Sketchboard"
            " and its dependencies installed: set PYSPARK_PYTHON (or spark.pyspark.python in spark_conf) to"
            " its path on the workers, e.g. run the workers from the project's image, where it is the same path")


def task_failure(error: BaseException, python: str) -> str:
    """A short message for a probe job that failed outright (the executor's Python did not start
    or crashed): Spark's error is pages of JVM stack; keep the task's own cause."""
    text = str(error)
    found = re.search(r"most recent failure: Lost task [^\n]*?\): ([^\n]+)", text)
    detail = found.group(1) if found else (text.strip().splitlines() or [type(error).__name__])[0]
    if "Traceback" in detail:  # a Python worker's error: its last line says what went wrong
        raised = re.findall(r"(?m)^\w+(?:\.\w+)*(?:Error|Exception)\b[^\n]*$", text)
        detail = raised[-1] if raised else detail
    return (f"Spark's executors could not run Python ({python}) for the start-up probe: {detail[:1000]}."
            " Set PYSPARK_PYTHON (or spark.pyspark.python in spark_conf) to a Python with Sketchboard and its"
            " dependencies installed, at that path on every worker, of the driver's Python version")


def probe_executors(spark, *, timeout_s: float = 180.0, modules: Iterable[str] = EXECUTOR_MODULES,
                    variables: Iterable[str] = ()) -> dict:
    """Run one task on the cluster that imports the project's packages (and reads the environment
    `variables` there); its report when all import, else ExecutorEnvironmentError. A cluster that
    gives the job no executor within `timeout_s` (no worker has the cores or memory asked for) is
    an error too: Spark itself would wait forever, logging "Initial job has not accepted any
    resources"."""
    import platform

    sc = spark.sparkContext
    python = sc.pythonExec
    group = f"sketchboard-probe-{uuid.uuid4().hex[:8]}"
    outcome: dict[str, object] = {}

    def run() -> None:
        sc.setJobGroup(group, "Sketchboard start-up probe: can executors import the project?", True)
        try:
            outcome["reports"] = sc.parallelize([0], 1).map(probe_task(modules, variables)).collect()
        except Exception as exc:  # noqa: BLE001 - reported below with the executor's side of it
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="sketchboard-executor-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        sc.cancelJobGroup(group)
        worker.join(30)
        raise ExecutorEnvironmentError(
            f"no executor ran the start-up probe within {timeout_s:.0f} s on {sc.master}: check that workers are"
            " registered with the master (its web UI) and that one has the cores and memory the pipeline asks"
            " for (spark.executor.cores, spark.executor.memory; spark.cores.max)")
    if "error" in outcome:
        raise ExecutorEnvironmentError(task_failure(outcome["error"], python)) from None
    report = outcome["reports"][0]
    message = probe_failure(report, sys.executable, platform.python_version())
    if message:
        raise ExecutorEnvironmentError(message)
    return report


def driver_python_env(conf: Mapping[str, str]) -> None:
    """Set PYSPARK_PYTHON (read by SparkContext when it starts) to executor_python's choice."""
    os.environ["PYSPARK_PYTHON"] = executor_python(conf, os.environ, sys.executable)
