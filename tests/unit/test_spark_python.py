"""The launcher Spark's local Python workers run through (aggregates/spark_python.py): it drops
exactly Spark's zipped pyspark and py4j from PYTHONPATH, runs the given interpreter, and is
used only where the workers would run this interpreter against the installed pyspark."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from aggregates.spark_python import launcher_text, use_installed_pyspark, uses_installed_pyspark, without_zipped, worker_launcher

HOME = "/opt/venv/lib/python3.11/site-packages/pyspark"
SPARKS = [f"{HOME}/python/lib/pyspark.zip", f"{HOME}/python/lib/py4j-0.10.9.9-src.zip"]
OTHERS = st.sampled_from(["/work/app", f"{HOME}/jars/spark-core_2.13-4.3.0.jar", "/x/pyspark.zip", "/x/lib/py4j.zip",
                          "/srv/python/lib/mine.zip", "relative/dir", "/a b/c"])


@given(st.lists(st.one_of(OTHERS, st.sampled_from(SPARKS)), max_size=6))
def test_the_launcher_drops_sparks_zips_and_keeps_every_other_entry(entries):
    path = os.pathsep.join(entries)
    assert without_zipped(path) == os.pathsep.join(e for e in entries if e not in SPARKS)


def test_the_launcher_script_filters_as_documented_and_runs_the_interpreter(tmp_path):
    launcher = worker_launcher(sys.executable, tmp_path)
    assert launcher.read_text() == launcher_text(sys.executable) and os.access(launcher, os.X_OK)
    path = os.pathsep.join([SPARKS[1], "/work/app", SPARKS[0], "/a b/c", f"{HOME}/jars/spark-core_2.13-4.3.0.jar"])
    out = subprocess.run([str(launcher), "-c", "import os, sys; print(os.environ['PYTHONPATH']); print(sys.executable)"],
                         env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [without_zipped(path), sys.executable]
    # Written again only when its text differs (another interpreter gets a file of its own).
    assert worker_launcher(sys.executable, tmp_path) == launcher
    assert worker_launcher("/usr/bin/python3", tmp_path) != launcher


def test_it_is_used_only_for_this_interpreter_and_the_installed_pyspark(tmp_path, monkeypatch):
    import pyspark

    installed = os.path.dirname(pyspark.__file__)
    assert uses_installed_pyspark({}, installed) and uses_installed_pyspark({"SPARK_HOME": installed}, installed)
    assert not uses_installed_pyspark({"SPARK_HOME": "/opt/spark"}, installed)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    assert use_installed_pyspark({"PYSPARK_PYTHON": "/opt/other/python"}) is None  # the user's choice
    assert use_installed_pyspark({"SPARK_HOME": "/opt/spark"}) is None  # a Spark distribution of its own
    environ = {"PYSPARK_PYTHON": sys.executable}
    launcher = use_installed_pyspark(environ)
    assert launcher is not None and environ["PYSPARK_PYTHON"] == str(launcher) and launcher.is_relative_to(tmp_path)


def test_without_a_writable_temp_dir_spark_keeps_its_own_way(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the launcher's folder would go
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(blocked))
    environ = {"PYSPARK_PYTHON": sys.executable}
    assert use_installed_pyspark(environ) is None and environ == {"PYSPARK_PYTHON": sys.executable}
