"""bench/memory.py's attribution of the service's memory to its parts, and its growth figure."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.memory import ROLES, growth, role_of, tree_memory


def test_each_process_of_the_service_has_its_role():
    python = [sys.executable, "-m", "sketchboard.cli"]
    assert role_of("python", python + ["up", "--no-demo"]) == "up"
    assert role_of("python", python + ["api", "--port", "1"]) == "api"
    assert role_of("python", python + ["pipeline"]) == "pipeline"
    assert role_of("python", [sys.executable, "-m", "api.ingest_worker", "7"]) == "ingest worker"
    assert role_of("java", ["/usr/bin/java", "-cp", "x"]) == "java"
    assert role_of("python", python + ["reprocess", "http"]) == "other"  # no role of its own
    assert role_of("python", python) == "other"  # no command at all
    assert role_of("sh", [""]) == "other"
    spawned = [sys.executable, "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
               "--multiprocessing-fork"]
    assert role_of("python", spawned, parent_role="api") == "api pool"  # the websocket queries' pool
    assert role_of("python", spawned, parent_role="pipeline") == "pipeline pool"  # the read-ahead
    assert role_of("python", spawned) == "other"


def test_growth_is_median_against_median_so_one_spike_is_not_a_trend():
    flat_with_a_spike = [100.0] * 19 + [130.0]
    assert growth(flat_with_a_spike) == 0
    assert growth([100.0] * 10 + [110.0] * 10) == pytest.approx(0.10)
    assert growth([5.0]) == 0  # one sample: against itself


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="reads /proc")
def test_the_tree_memory_is_the_sum_of_its_roles():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "api.ingest_worker"])
    try:
        deadline = time.monotonic() + 10
        while not (mem := tree_memory(os.getpid()))["roles"]["ingest worker"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(mem["roles"]) == set(ROLES)
        assert mem["roles"]["ingest worker"] > 0 and mem["processes"] >= 2
        assert sum(mem["roles"].values()) == mem["pss"]
    finally:
        child.kill()
        child.wait()
