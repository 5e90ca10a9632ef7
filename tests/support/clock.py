"""The one settable clock for tests: code under test takes a `clock` callable (time.time's
shape); a test holds this one and moves `now` by hand."""

from __future__ import annotations

NOW_S = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a multiple of one minute


class FakeClock:
    """Returns `now`: epoch seconds where the code expects time.time (the default), or
    whatever unit a clock of milliseconds expects when built with one."""

    def __init__(self, now: float = NOW_S):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, by: float) -> None:
        self.now += by
