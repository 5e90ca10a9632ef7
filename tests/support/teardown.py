"""A session fixture's teardown timed: one run's last test once carried 113 s of teardown
(the session's servers and the SparkSession stopping after it), with nothing saying whose. A
slow one now names itself on the real stderr (past pytest's capture) in the run's output."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def reported_if_slow(what: str, over_s: float = 5.0) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - started
        if took > over_s:
            sys.__stderr__.write(f"\n[teardown] stopping {what} took {took:.1f} s\n")
            sys.__stderr__.flush()
