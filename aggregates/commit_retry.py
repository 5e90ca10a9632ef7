"""A batch whose store commit fails for a reason that passes (disk full, an I/O error, a lock
held past the busy timeout, the PostgreSQL server restarting) is retried with back-off, in the
foreachBatch call, instead of failing the query: the store's transaction rolled back whole, and
the batch id check makes a retry that follows a commit whose answer was lost a no-op. The error
is reported (health, /metrics) while it lasts. Pure: the commit, the sleep and the report are
passed in."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg

from aggregates.batch_gate import STOPPING_MARK
from store.switch import SwitchHeld

T = TypeVar("T")

# Errors of the storage, not of the batch: the same commit can succeed later. (A programming
# error or a constraint violation is not among them: retrying it would only hide it.)
# A synchronized switch's hold (store/switch.py SwitchHeld) passes too: the switch releases it.
TRANSIENT: tuple[type[BaseException], ...] = (sqlite3.OperationalError, psycopg.OperationalError, SwitchHeld)


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the attempt-th failure (0-based): 0.5, 1, 2, ... up to max_s."""
        return min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))


def commit_with_retry(commit: Callable[[], T], *, wait: Callable[[float], bool],
                      report: Callable[[BaseException | None, int], None], backoff: Backoff = Backoff(),
                      transient: tuple[type[BaseException], ...] = TRANSIENT,
                      wait_held: Callable[[float], bool] | None = None) -> T:
    """Run commit until it succeeds. After each transient failure: report(error, attempt), then
    wait(delay), which returns True when the pipeline is stopping (the error is raised then: the
    batch was not recorded, and Spark replays it at the next start). After a success that
    followed failures: report(None, attempts). `transient`: the errors worth waiting out.
    `wait_held`: how to wait out a synchronized switch's hold instead (SwitchHeld), returning
    early once the hold is released: the pipeline then waits for the switch's own time, not for
    the rest of a back-off that has grown to seconds meanwhile."""
    attempt = 0
    while True:
        try:
            result = commit()
        except transient as exc:
            report(exc, attempt)
            waiter = wait_held if wait_held is not None and isinstance(exc, SwitchHeld) else wait
            if waiter(backoff.delay(attempt)):
                # Given up on the stop, not on the error: said so in its text, which is all of it
                # that reaches the pipeline's loop through Spark (sketchboard/stop_failures.py).
                exc.add_note(f"given up: {STOPPING_MARK}")
                raise
            attempt += 1
            continue
        if attempt:
            report(None, attempt)
        return result
