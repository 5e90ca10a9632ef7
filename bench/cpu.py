"""CPU seconds of this process and its descendants (the Spark JVM, its Python workers), read from
/proc: on the shared 2-core machine a run's wall time swings with the others' load, the CPU its
own processes burn much less, so benchmarks print both. Linux only (elsewhere: None)."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, user + system seconds) of a live process and of its children that ended (reaped);
    None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ...; utime stime cutime cstime
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / TICK


def _pids() -> list[str]:
    """The live processes' ids, as /proc names them."""
    return [p for p in os.listdir("/proc") if p.isdigit()]


def tree_cpu_seconds(root: int | None = None) -> float | None:
    """User + system CPU seconds of `root` (default: this process) and every live descendant."""
    if not Path("/proc/self/stat").exists():
        return None
    root = os.getpid() if root is None else root
    stats = {int(p): s for p in _pids() if (s := _stat(p)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


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
