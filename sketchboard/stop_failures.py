"""Whether a failure met while stopping was caused by the stop, or is a real one that came with it.

`sketchboard pipeline` exits 0 on SIGTERM/SIGINT, and the stop itself fails things on its way: the
batch gate refuses a batch that begins after the stop (aggregates/batch_gate.py `Stopping`); a
commit retrying a failing store gives up when the stop comes (aggregates/commit_retry.py, which
marks the error it raises so); a signal to the whole process group reaches Spark's JVM, whose
shutdown hook stops the SparkContext and the query under the batch being waited for; and with
the JVM gone, every Py4J call fails on its connection. Those are the stop, and exit 0.

Anything else (the store refused a batch, a bad record, a bug) is a failure that happened to
come at the time of the stop: a service manager must see it, so the pipeline exits 1 with it.
Pure: the error's text is read guarded, since a Py4JJavaError's text is asked of the JVM, which
may be gone (then the unreadable text is itself the sign that the JVM went)."""

from __future__ import annotations

import re

from aggregates.batch_gate import STOPPING_MARK, Stopping

# What Spark, its Python workers and Py4J say when the stop, not the batch, ended the query. Spark 4.3's texts:
# DAGScheduler "Job N cancelled because SparkContext was shut down", SparkContext "SparkContext
# has been shutdown" / "Cannot call methods on a stopped SparkContext.", MicroBatchExecution's
# job cancellation "Query <name> was stopped"; Py4J's lost connection to the JVM.
_STOP_TEXTS = re.compile(
    "|".join([
        re.escape(STOPPING_MARK),
        r"SparkContext was shut down",
        r"SparkContext has been shutdown",
        r"stopped SparkContext",
        r"Query .* was stopped",
        r"cancellation of all jobs",  # SparkContext.stop cancels the jobs under way
        r"RpcEnvStoppedException",  # the JVM's RPC environment, stopped by the same shutdown
        r"RejectedExecutionException",  # a task handed to an executor service the shutdown closed
        r"java\.net\.SocketException",  # a task's socket to a Python worker or the driver, cut by the signal
        # The signal reached the Python workers too (pyspark/daemon.py: a worker takes SIGINT as
        # KeyboardInterrupt and dies of SIGTERM): the task fails under the batch being waited for.
        r"KeyboardInterrupt",
        r"Python worker exited unexpectedly",
        r"Py4JNetworkError",
        r"Answer from Java side is empty",
        r"Error while sending or receiving",
    ]))

# A Py4J call whose JVM went with the signal raises a socket's ConnectionError (refused, reset).
# (Not the text "Connection refused": a PostgreSQL server gone says it too, and that is no stop.)
_GONE_JVM_TYPES = (ConnectionError,)


def caused_by_stop(error: BaseException) -> bool:
    """True when `error`, met while a stop was asked for, is that stop's doing (module doc)."""
    if isinstance(error, (Stopping, *_GONE_JVM_TYPES)) or type(error).__name__ == "Py4JNetworkError":
        return True
    try:
        text = str(error)
    except Exception:  # a Py4JJavaError whose JVM is gone: its text cannot be asked of it
        return True
    text = "\n".join([text, *getattr(error, "__notes__", ())])
    return bool(_STOP_TEXTS.search(text))


def first_line(error: BaseException) -> str:
    """The error's first line, or its type's name. A Py4JJavaError's text is asked of the JVM, which may
    be gone: str() then raises a ConnectionError out of py4j."""
    try:
        text = str(error)
    except Exception:
        text = ""
    return (text.strip().splitlines() or [type(error).__name__])[0][:200]
