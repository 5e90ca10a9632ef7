"""A class-data-sharing archive (AppCDS) of a Spark driver JVM, for the tests' Spark drivers.

A Spark driver's JVM loads and verifies ~10 000 classes from pyspark's jars at every start. An
archive of them, dumped once by a driver that ran the pipeline, is mapped by the later ones
instead: `sketchboard pipeline --once` over 3 000 events took 17.3-19.6 s without it and
12.6-12.9 s with it (a quiet 2-core machine), and the real-process tests start ~25 drivers.

`make test` makes it first (`python -m tests.spark_cds`, a no-op once it exists; ~35 s once, under
build/, git-ignored), and tests/conftest.py passes it to the drivers through SPARK_SUBMIT_OPTS
when it is there. Without it the drivers start as before. The archive is keyed by the pyspark
version and the Java in use; a JVM that cannot use it anyway (another classpath) prints a
one-line warning and starts without it, as it would without the flag. Only drivers get it:
a standalone cluster's daemons and executors, and the Kafka broker, have other classpaths.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JIT = "-XX:TieredStopAtLevel=1"  # what the tests' drivers run with (tests/conftest.py)


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java") or "java"
    return os.path.realpath(java)


def archive_path() -> Path:
    """Where this checkout keeps the archive for this pyspark and this Java (it may not exist)."""
    java = _java()
    stamp = f"{version('pyspark')}|{java}|{os.stat(java).st_mtime_ns if os.path.exists(java) else 0}"
    return REPO / "build" / "spark-cds" / f"driver-{hashlib.sha1(stamp.encode()).hexdigest()[:12]}.jsa"


def driver_opts(archive: Path | None = None) -> str:
    """SPARK_SUBMIT_OPTS for the tests' drivers: the first JIT tier, and the archive if made."""
    archive = archive or archive_path()
    return f"{JIT} -XX:SharedArchiveFile={archive}" if archive.is_file() else JIT


def make(timeout_s: float = 600) -> Path:
    """Dump the archive from a `sketchboard pipeline --once` over a small embedded log (its driver
    writes it at exit), unless it is there already."""
    target = archive_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    import yaml

    from catalog import load_catalog
    from ingest.events import EventValidator
    from ingest.log import SqliteEventLog
    from tests.spark.events import http_events

    catalog = load_catalog(REPO / "config" / "streams.yaml")
    with tempfile.TemporaryDirectory(prefix="spark-cds-") as tmp:
        root = Path(tmp)
        # driver_batch_rows 0: every batch through Spark's query, so the JVM starts (on the
        # embedded log the pipeline's own batches need none, and a driver never started dumps no archive).
        (root / "sketchboard.yaml").write_text(yaml.safe_dump({"data_dir": str(root / "data"),
                                                                "spark_driver_memory": "1g", "driver_batch_rows": 0}))
        stream = catalog.stream("http_requests")
        log = SqliteEventLog(root / "data" / "log.db")
        for s in catalog.streams.values():
            log.ensure_topic(s)
        log.append(stream, [EventValidator(stream).validate(e) for e in http_events(3_000, seed=5)],
                   int(time.time() * 1000))
        log.close()
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SKETCHBOARD_SETTINGS_FILE": str(root / "sketchboard.yaml"),
               "SPARK_SUBMIT_OPTS": f"{JIT} -XX:ArchiveClassesAtExit={partial}"}
        done = subprocess.run([sys.executable, "-m", "sketchboard.cli", "pipeline", "--once"], env=env, cwd=root,
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise SystemExit(f"no Spark class-data archive (the drivers start without one):\n{done.stderr[-3000:]}")
        os.replace(partial, target)  # whole or not at all: a driver never maps a half-written one
    return target


if __name__ == "__main__":
    started = time.monotonic()
    existed = archive_path().is_file()
    path = make()
    print(f"Spark class-data archive: {path}" + ("" if existed else f" (made in {time.monotonic() - started:.0f} s)"))
