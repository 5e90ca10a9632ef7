"""Children of `sketchboard up` die with it, even when it is killed with SIGKILL and has no
chance to stop them: each child asks the kernel for SIGTERM when its parent dies (Linux
`prctl(PR_SET_PDEATHSIG)`), and so stops as cleanly as on `kill <pid>`.

`up` passes its pid in SKETCHBOARD_PARENT_PID. The child checks it after the prctl: a parent
that died between the fork and the prctl sends no signal, and the child would be orphaned
already. Where prctl is missing (not Linux), a thread watches the parent pid instead."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading

ENV = "SKETCHBOARD_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def _ask_the_kernel(signum: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, signum: int, every_s: float) -> None:
    while os.getppid() == parent:
        threading.Event().wait(every_s)
    os.kill(os.getpid(), signum)


def die_with_parent(environ=os.environ, *, signum: int = signal.SIGTERM, every_s: float = 1.0) -> None:
    """Call first thing in a child process of `up` (a no-op when not started by `up`)."""
    value = environ.get(ENV)
    if not value or not value.isdigit():
        return
    parent = int(value)
    if not _ask_the_kernel(signum):
        threading.Thread(target=_watch, args=(parent, signum, every_s), daemon=True, name="parent-watch").start()
    elif os.getppid() != parent:  # it died before the prctl took effect
        os.kill(os.getpid(), signum)


def watch_parent(parent: int, *, signum: int = signal.SIGTERM, every_s: float = 1.0) -> None:
    """Stop (signum) when process `parent` is gone, seen by a thread polling the parent pid: for
    a process pool's workers, where prctl does not fit (its signal comes when the parent *thread*
    that started the child ends, and a pool starts its workers from a thread that ends)."""
    threading.Thread(target=_watch, args=(parent, signum, every_s), daemon=True, name="parent-watch").start()
