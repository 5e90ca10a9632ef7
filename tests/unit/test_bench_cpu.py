"""bench/cpu.py, which the benchmarks read their processes' CPU with: a child found by a word of its
command line (`sketchboard up`'s api and pipeline), its CPU counted in its parent's tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.cpu import child_by_command, tree_cpu_seconds

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")


def test_a_child_is_found_by_a_word_of_its_command_line_and_counted_in_the_tree():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(30)", "pipeline"])
    try:
        deadline = time.monotonic() + 10
        while child_by_command(os.getpid(), "pipeline") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child_by_command(os.getpid(), "pipeline") == child.pid
        assert child_by_command(os.getpid(), "api") is None  # a word, not a part of one ("pipeline" holds no "api")
        assert child_by_command(os.getpid(), "pipe") is None
        while not tree_cpu_seconds(child.pid) and time.monotonic() < deadline:  # python's start takes some
            time.sleep(0.05)
        assert tree_cpu_seconds(os.getpid()) >= tree_cpu_seconds(child.pid) > 0
    finally:
        child.kill()
        child.wait()
