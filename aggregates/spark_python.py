"""The interpreter Spark starts for its Python workers in local mode: ours, without Spark's zipped
copies of pyspark and py4j ahead of the installed ones.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` and `py4j-*-src.zip` first on every Python
worker's PYTHONPATH (the JVM's PythonUtils.sparkPythonPath; no setting turns it off). With
pyspark installed from PyPI those zips hold the same sources as the installed package, but
Python compiles a zipped module anew in every process (zipimport writes no bytecode): ~1 s of
CPU per worker process here, for pyspark alone. A local pipeline starts several in a row before
its first batch (the data source's lookup, creation, streaming runner and read planning:
docs/benchmarks.md, "A pipeline's start, and Spark's zipped pyspark"), and more as it runs.

So in local mode, when the workers run the driver's own interpreter and SPARK_HOME is the
installed pyspark itself, PYSPARK_PYTHON points at a two-line launcher that takes those two
entries out of PYTHONPATH and runs the interpreter: the workers import the installed pyspark
(the same files, compiled once). Anything else (a Spark distribution of its own in SPARK_HOME,
an interpreter the user chose, a cluster) is left as Spark does it."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("sketchboard.spark")

# The two entries Spark adds, as the JVM spells them (SPARK_HOME/python/lib/...).
ZIPPED = re.compile(r"(^|/)python/lib/(pyspark\.zip|py4j-[^/]*-src\.zip)$")


def without_zipped(pythonpath: str) -> str:
    """PYTHONPATH without Spark's zipped pyspark and py4j (what the launcher does, for tests)."""
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep) if p and not ZIPPED.search(p))


def launcher_text(python: str) -> str:
    """The launcher's shell script: PYTHONPATH filtered as without_zipped does, then `python`."""
    return ("#!/bin/sh\n"
            "# Written by Sketchboard (aggregates/spark_python.py): Spark's workers without its zipped pyspark and py4j.\n"
            "PYTHONPATH=$(printf '%s' \"$PYTHONPATH\" | tr ':' '\\n'"
            " | grep -Ev '(^|/)python/lib/(pyspark\\.zip|py4j-[^/]*-src\\.zip)$' | paste -sd: -)\n"
            "export PYTHONPATH\n"
            f"exec {_quoted(python)} \"$@\"\n")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def uses_installed_pyspark(environ: Mapping[str, str], pyspark_dir: str) -> bool:
    """Whether Spark's home is the installed pyspark package (a pip install): SPARK_HOME unset
    (pyspark then finds itself) or naming that directory."""
    home = environ.get("SPARK_HOME")
    return not home or os.path.realpath(home) == os.path.realpath(pyspark_dir)


def worker_launcher(python: str = sys.executable, directory: Path | None = None) -> Path:
    """The launcher for `python`, written once per user and interpreter (rewritten when it differs)."""
    directory = directory or Path(tempfile.gettempdir()) / f"sketchboard-{os.getuid()}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"spark-python-{hashlib.sha256(python.encode()).hexdigest()[:12]}.sh"
    text = launcher_text(python)
    if not path.exists() or path.read_text() != text:
        scratch = path.with_name(f"{path.name}.{os.getpid()}")
        scratch.write_text(text)
        scratch.chmod(0o755)
        scratch.replace(path)  # atomic: a worker starting meanwhile sees the old file or the new one
    return path


def use_installed_pyspark(environ=os.environ) -> Path | None:
    """In local mode, before the session starts: PYSPARK_PYTHON set to the launcher where the
    workers would run this interpreter and SPARK_HOME is the installed pyspark; the launcher, or
    None where nothing was changed."""
    import pyspark

    if environ.get("PYSPARK_PYTHON", sys.executable) != sys.executable:
        return None
    if not uses_installed_pyspark(environ, os.path.dirname(pyspark.__file__)):
        return None
    try:
        launcher = worker_launcher()
    except OSError as exc:  # no writable temp dir: Spark's own way, only slower to start its workers
        log.warning("Spark's Python workers will import Spark's zipped pyspark (slower to start): %s", exc)
        return None
    environ["PYSPARK_PYTHON"] = str(launcher)
    return launcher


__all__ = ["launcher_text", "use_installed_pyspark", "uses_installed_pyspark", "without_zipped", "worker_launcher"]
