"""CPU seconds (user and system) and minor page faults of this process and its descendants (the
Spark JVM, its Python workers), read from /proc: on the shared 2-core machine a run's wall time swings with the others' load, the CPU its
own processes burn much less, so benchmarks print both. Linux only (elsewhere: None)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Usage:
    """A process tree's user and system CPU seconds and minor page faults (children that ended
    included: the kernel adds a reaped child's to its parent's)."""
    user: float = 0.0
    system: float = 0.0
    minor_faults: int = 0

    @property
    def cpu(self) -> float:
        return self.user + self.system

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.user + other.user, self.system + other.system, self.minor_faults + other.minor_faults)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.user - other.user, self.system - other.system, self.minor_faults - other.minor_faults)


def _usage(pid: str) -> tuple[int, Usage] | None:
    """(parent pid, usage) of a live process and of its children that ended (reaped); None once
    it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # After "pid (comm) ": state ppid ... minflt cminflt majflt cmajflt utime stime cutime cstime (proc(5)).
    fields = text[text.rindex(")") + 2:].split()
    ticks = [int(f) for f in fields[11:15]]
    return int(fields[1]), Usage((ticks[0] + ticks[2]) / TICK, (ticks[1] + ticks[3]) / TICK,
                                 int(fields[7]) + int(fields[8]))


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, user + system seconds) of a live process and its reaped children; None once gone."""
    found = _usage(pid)
    return None if found is None else (found[0], found[1].cpu)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one live process (with its reaped children's); None once it is
    gone, or without /proc."""
    found = _stat(str(pid))
    return None if found is None else found[1]


def _pids() -> list[str]:
    """The live processes' ids, as /proc names them."""
    return [p for p in os.listdir("/proc") if p.isdigit()]


def tree_usage(root: int | None = None) -> Usage | None:
    """The usage of `root` (default: this process) and every live descendant; None without /proc."""
    if not Path("/proc/self/stat").exists():
        return None
    root = os.getpid() if root is None else root
    stats = {int(p): s for p in _pids() if (s := _usage(p)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = Usage(), [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


def tree_cpu_seconds(root: int | None = None) -> float | None:
    """User + system CPU seconds of `root` (default: this process) and every live descendant."""
    usage = tree_usage(root)
    return None if usage is None else usage.cpu


def child_by_command(root: int, word: str) -> int | None:
    """The pid of a live child of `root` whose command line holds `word` as one argument (`sketchboard
    up`'s `api` and `pipeline` processes), None if there is none (or no /proc)."""
    for p in _pids() if Path("/proc/self/stat").exists() else ():
        if (stat := _stat(p)) is None or stat[0] != root:
            continue
        try:
            args = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if word.encode() in args:
            return int(p)
    return None
