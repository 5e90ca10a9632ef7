"""Fail fast, with a clear message, where Java is missing or older than PySpark 4.3 needs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

MIN_JAVA = 17


class JavaError(RuntimeError):
    pass


def java_binary() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def parse_java_major(version_output: str) -> int | None:
    """'openjdk version "17.0.15" ...' -> 17; 'java version "1.8.0_392"' -> 8."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        return None
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    return minor if major == 1 else major


def check_java() -> int:
    binary = java_binary()
    hint = "Install a JDK or JRE 17+ (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
    if binary is None:
        raise JavaError(f"Java not found: the pipeline runs on Spark, which needs Java {MIN_JAVA} or newer. {hint}")
    try:
        out = subprocess.run([binary, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaError(f"cannot run {binary} -version: {exc}. {hint}") from None
    major = parse_java_major(out.stderr + out.stdout)
    if major is None:
        raise JavaError(f"cannot tell the Java version from `{binary} -version`: {out.stderr.strip()!r}. {hint}")
    if major < MIN_JAVA:
        raise JavaError(f"Java {major} found at {binary}, but Spark 4.3 needs Java {MIN_JAVA} or newer. {hint}")
    return major
