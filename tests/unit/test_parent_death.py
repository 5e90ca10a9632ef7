"""Children of `sketchboard up` stop when it is SIGKILLed (sketchboard/parent_death.py), with
real processes: a parent starts a child the way `up` does, the test SIGKILLs the parent, and
the child gets SIGTERM (its handler runs: a clean stop, not a kill), through the kernel's
parent-death signal and through the polling fallback for systems without prctl."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.procs import alive

CHILD = textwrap.dedent("""
    import signal, sys, time
    from sketchboard import parent_death
    if sys.argv[2] == "poll":
        parent_death._ask_the_kernel = lambda signum: False
    def stop(signum, frame):
        open(sys.argv[1], "w").write("stopped by SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    parent_death.die_with_parent(every_s=0.1)
    print("ready", flush=True)
    time.sleep(60)
""")

PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    env = {**os.environ, "SKETCHBOARD_PARENT_PID": str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], env=env,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    print(child.pid, flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("how", ["prctl", "poll"])
def test_a_child_gets_sigterm_when_its_parent_is_killed(tmp_path, how):
    marker = tmp_path / "marker"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker), how], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child outlived its killed parent"
        assert marker.read_text() == "stopped by SIGTERM"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_without_the_variable_nothing_happens(monkeypatch):
    from sketchboard import parent_death

    monkeypatch.delenv(parent_death.ENV, raising=False)
    parent_death.die_with_parent()  # no signal, no thread: this test process goes on
    assert not any(t.name == "parent-watch" for t in __import__("threading").enumerate())
