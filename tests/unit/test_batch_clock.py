"""The batch clock (aggregates/batch_clock.py): the wall clock, held at the last commit's instant
through a small step back; a large step back taken as the truth. No JVM."""

from __future__ import annotations

import logging

from aggregates.batch_clock import MAX_HELD_STEP_BACK_MS, BatchClock, batch_now_ms

T = 1_800_000_000_000


def test_the_wall_clock_unless_it_stepped_back_a_little():
    assert batch_now_ms(T, None) == T  # nothing committed yet
    assert batch_now_ms(T, T - 5_000) == T  # ahead of the last commit, as it should be
    assert batch_now_ms(T - 30_000, T) == T  # 30 s back (NTP): held at the last commit
    assert batch_now_ms(T - MAX_HELD_STEP_BACK_MS, T) == T
    assert batch_now_ms(T - MAX_HELD_STEP_BACK_MS - 1, T) == T - MAX_HELD_STEP_BACK_MS - 1  # far back: the truth


class Clock:
    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def test_a_pipeline_s_clock_starts_from_the_stored_commit_and_follows_its_own(caplog):
    reads = []
    clock = Clock(T - 20_000)  # restarted on a host 20 s behind the last commit's

    def stored() -> int:
        reads.append(1)
        return T

    batches = BatchClock(clock, stored)
    with caplog.at_level(logging.WARNING, logger="sketchboard.pipeline"):
        assert batches.now_ms() == T and batches.now_ms() == T
    assert len(reads) == 1  # the store is asked once
    assert [r.message for r in caplog.records if "behind" in r.message] == [
        "the clock is 20.0 s behind the pipeline's last commit: batches judge retention at that instant until"
        " the clock catches up"]  # once per step back, not per batch
    batches.committed(T)
    clock.ms = T + 1_000
    assert batches.now_ms() == T + 1_000  # caught up
    batches.committed(T + 1_000)
    clock.ms = T - 3 * MAX_HELD_STEP_BACK_MS  # the clock was hours ahead: now right
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sketchboard.pipeline"):
        assert batches.now_ms() == clock.ms and batches.now_ms() == clock.ms
    assert len([r for r in caplog.records if "taken as the right time" in r.message]) == 1
    batches.committed(clock.ms)
    clock.ms += 10
    assert batches.now_ms() == clock.ms
