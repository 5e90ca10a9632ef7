"""The garbage collector held off while a batch commits.

A backfill commit builds hundreds of thousands of short-lived, acyclic objects (pane and tier
rows, their stats and keys) while the batch's partials are alive; each of CPython's
generation-0 collections (every 700 allocations) and the older generations' sweeps then
traverse them again and again, about half of such a commit's CPU time (issue 27's profile).
Nothing the commit builds needs the cycle collector: the objects are freed by reference
counting when the commit returns. So the collector is disabled for the commit and enabled
again after it, by the last of several threads committing at once (a service's pipelines
share one process); the collections it skipped run at its next allocations. The pipeline holds it
off for a whole batch (aggregates/pipeline.py). Where several pipelines of one process overlap
their batches, the count might never fall to zero: once it has been off for MAX_PAUSE_S without
a break, the thread that leaves then runs one full collection (the cycles of the batches done
meanwhile), so nothing piles up however the batches interleave."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

MAX_PAUSE_S = 60.0

_lock = threading.Lock()
_holders = 0
_was_enabled = False
_off_since = 0.0  # when the collector was last turned off here, or last run by a leaving holder


@contextmanager
def paused_gc(clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    global _holders, _was_enabled, _off_since
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
            _off_since = clock()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
            elif _holders and _was_enabled and clock() - _off_since >= MAX_PAUSE_S:
                gc.collect()  # others still hold it off: their overlap must not keep it off for good
                _off_since = clock()
