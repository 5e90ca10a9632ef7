"""A benchmark's steps timed by wrapping the functions that do them (store steps, pipeline parts):
each call's time added to the step's label, however deep the call."""

from __future__ import annotations

import time
from collections.abc import Callable


def wrap_timed(owner, name: str, label: str, spent: dict[str, float],
               clock: Callable[[], float] = time.perf_counter) -> Callable:
    """Replace `owner.name` by a wrapper adding each call's `clock` time to spent[label]; returns
    what it replaced (to put back)."""
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        started = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + clock() - started

    setattr(owner, name, timed)
    return inner
