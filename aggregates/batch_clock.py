"""The instant a batch judges retention by (its `batch_now_ms`): the wall clock, but never before
the pipeline's last commit by a small step back.

A batch drops the panes, tier rows, membership buckets and first-seen counts wholly before
`batch_now - retention`, and dead-letters events older than that. A clock that steps back (an NTP
correction, a pipeline restarted on a host whose clock lags) would let the next batch accept
events into panes the last one dropped, and make them again with only those events: a partial
pane where the data was. So a step back of up to MAX_HELD_STEP_BACK_MS holds the batch clock at
the last commit's instant until the wall clock catches up (its batches judge a little ahead of
the wall clock meanwhile). A larger step back is taken as the truth: the clock was far ahead
before, and holding it there would dead-letter every event as beyond retention for that long.
Pure logic with the time and the stored floor injected."""

from __future__ import annotations

import logging
from collections.abc import Callable

MAX_HELD_STEP_BACK_MS = 3_600_000

log = logging.getLogger("sketchboard.pipeline")


def batch_now_ms(wall_ms: int, floor_ms: int | None, max_held_ms: int = MAX_HELD_STEP_BACK_MS) -> int:
    """The batch's instant: `wall_ms`, or `floor_ms` (the last commit's) when the wall clock is
    behind it by at most `max_held_ms`."""
    if floor_ms is None or wall_ms >= floor_ms or floor_ms - wall_ms > max_held_ms:
        return wall_ms
    return floor_ms


class BatchClock:
    """A pipeline's batch clock: `clock()` in seconds; `stored_floor()` the last commit's instant
    the store holds (read once, at the first batch: a restarted pipeline starts from it)."""

    def __init__(self, clock: Callable[[], float], stored_floor: Callable[[], int | None],
                 max_held_ms: int = MAX_HELD_STEP_BACK_MS):
        self.clock = clock
        self.stored_floor = stored_floor
        self.max_held_ms = max_held_ms
        self.floor_ms: int | None = None
        self._read = False
        self._held = False  # logged once per step back

    def now_ms(self) -> int:
        if not self._read:
            self.floor_ms, self._read = self.stored_floor(), True
        wall = int(self.clock() * 1000)
        now = batch_now_ms(wall, self.floor_ms, self.max_held_ms)
        held = now != wall
        if held and not self._held:
            log.warning("the clock is %.1f s behind the pipeline's last commit: batches judge retention at that"
                        " instant until the clock catches up", (now - wall) / 1000)
        elif not held and self.floor_ms is not None and self.floor_ms - wall > self.max_held_ms:
            log.warning("the clock stepped back %.1f s from the pipeline's last commit, more than the %.0f s held:"
                        " taken as the right time", (self.floor_ms - wall) / 1000, self.max_held_ms / 1000)
            self.floor_ms = wall
        self._held = held
        return now

    def committed(self, batch_now: int) -> None:
        """A batch judged at `batch_now` was committed: no later batch judges before it."""
        self.floor_ms = batch_now if self.floor_ms is None else max(self.floor_ms, batch_now)
