"""The garbage collector held off while a batch commits.

A backfill commit builds hundreds of thousands of short-lived, acyclic objects (pane and tier
rows, their stats and keys) while the batch's partials are alive; each of CPython's
generation-0 collections (every 700 allocations) and the older generations' sweeps then
traverse them again and again, about half of such a commit's CPU time (issue 27's profile).
Nothing the commit builds needs the cycle collector: the objects are freed by reference
counting when the commit returns. So the collector is disabled for the commit and enabled
again after it, by the last of several threads committing at once (a service's pipelines
share one process); the collections it skipped run at its next allocations."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def paused_gc() -> Iterator[None]:
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
