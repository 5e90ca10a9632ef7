"""A session fixture's teardown timed: one run's last test carried 105–113 s of teardown (the
session's servers and the SparkSession stopping after it), with nothing saying whose. A slow one
now names itself as a warning, which pytest's warnings summary shows at the end of the run (a
write to stderr would not show: pytest captures file descriptor 2 in teardown too)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class SlowTeardown(UserWarning):
    """A session fixture took long to stop."""


@contextmanager
def reported_if_slow(what: str, over_s: float = 5.0) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - started
        if took > over_s:
            warnings.warn(SlowTeardown(f"stopping {what} took {took:.1f} s"), stacklevel=3)
