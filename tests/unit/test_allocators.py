"""The allocators keep freed memory (sketchboard/allocators.py): set in the environment and glibc
where nothing set them before, left alone where something did; and in real processes, mimalloc
reads the delay and glibc stops giving freed blocks back."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from sketchboard.allocators import (GLIBC_MMAP_THRESHOLD, GLIBC_TRIM_THRESHOLD, MIMALLOC_PURGE_DELAY_MS,
                                    child_environment, keep_freed_memory)

ROOT = Path(__file__).resolve().parents[2]
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


class Mallopt:
    def __init__(self, answer: int = 1):
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


def test_both_allocators_are_told_where_nothing_was_set():
    environ, mallopt = {}, Mallopt()
    done = keep_freed_memory(environ, mallopt)
    assert environ == {"MIMALLOC_PURGE_DELAY": str(MIMALLOC_PURGE_DELAY_MS)}
    # The mmap threshold first: set alone, the trim threshold would pin it at glibc's 128 KiB.
    assert mallopt.calls == [(-3, GLIBC_MMAP_THRESHOLD), (-1, GLIBC_TRIM_THRESHOLD)]
    assert len(done) == 2


def test_what_the_environment_sets_is_kept():
    environ, mallopt = {"MIMALLOC_PURGE_DELAY": "10", "MALLOC_TRIM_THRESHOLD_": "1000"}, Mallopt()
    assert keep_freed_memory(environ, mallopt) == []
    assert environ == {"MIMALLOC_PURGE_DELAY": "10", "MALLOC_TRIM_THRESHOLD_": "1000"}
    assert mallopt.calls == []


def test_a_refused_threshold_is_not_reported_as_set(caplog):
    environ, mallopt = {"MIMALLOC_PURGE_DELAY": "10"}, Mallopt(answer=0)
    assert keep_freed_memory(environ, mallopt) == []
    assert mallopt.calls == [(-3, GLIBC_MMAP_THRESHOLD)]  # the trim threshold not tried alone
    assert "refused" in caplog.text


def test_the_command_line_sets_mimallocs_delay_before_arrow_loads():
    # MIMALLOC_VERBOSE: Arrow's mimalloc prints its options as it starts.
    out = subprocess.run([sys.executable, "-m", "sketchboard.cli", "check-config"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**{k: v for k, v in os.environ.items()
                                                         if not k.startswith("MIMALLOC_")}, "MIMALLOC_VERBOSE": "1"})
    assert out.returncode == 0, out.stderr
    assert f"option 'purge_delay': {MIMALLOC_PURGE_DELAY_MS}" in out.stderr + out.stdout


ROUNDS = """
import resource, sys
import numpy as np
if sys.argv[-1] == "keep":
    from sketchboard.allocators import keep_freed_memory
    keep_freed_memory()
def faults_of_a_round():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [np.ones(1 << 20) for _ in range(10)]  # 10 blocks of 8 MiB, freed together
    del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_a_round()
print(max(faults_of_a_round() for _ in range(3)))
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_glibc_keeps_freed_blocks_for_the_next_round():
    def faults(mode: str) -> int:
        return int(subprocess.run([sys.executable, "-c", ROUNDS, mode], cwd=ROOT, capture_output=True, text=True,
                                  timeout=120, check=True, env={**{k: v for k, v in os.environ.items()
                                                                   if not k.startswith("MALLOC_")},
                                                                "PYTHONPATH": str(ROOT)}).stdout)

    # By default glibc trims the 80 MiB freed at its heap's top and faults them in again (~5 000
    # faults a round here); kept, a round after the first takes the same pages without a fault.
    assert faults("default") > 1000
    assert faults("keep") < 200


def test_a_child_given_the_child_environment_keeps_what_it_frees_as_well():
    assert child_environment({"MALLOC_MMAP_THRESHOLD_": "1"}) == {"MIMALLOC_PURGE_DELAY": str(MIMALLOC_PURGE_DELAY_MS)}
    assert child_environment({"MIMALLOC_PURGE_DELAY": "10"}) == {
        "MALLOC_MMAP_THRESHOLD_": str(GLIBC_MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(GLIBC_TRIM_THRESHOLD)}
    if not GLIBC:
        return
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "MIMALLOC_"))}
    faults = int(subprocess.run([sys.executable, "-c", ROUNDS, "default"], cwd=ROOT, capture_output=True, text=True,
                                timeout=120, check=True,
                                env={**clean, **child_environment(clean), "PYTHONPATH": str(ROOT)}).stdout)
    assert faults < 200  # glibc read the thresholds from the environment, as keep_freed_memory sets them
