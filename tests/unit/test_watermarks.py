"""Per-partition watermarks (store/watermarks.py): properties of the pure rule, no I/O."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from store.watermarks import (
    ACTIVE,
    CAUGHT_UP,
    IDLE,
    PartitionMark,
    advance_stream,
    partition_state,
    stream_watermark,
)

LATENESS = 30
IDLE_TIMEOUT = 1_000

# A partition's log: event times in log order, mostly increasing (a device's clock), some late.
partition_logs = st.lists(
    st.lists(st.integers(0, 10_000), min_size=0, max_size=40).map(lambda ts: sorted(ts) if len(ts) % 3 else ts),
    min_size=1, max_size=5,
)


def _late_in_partition(times: list[int], i: int, lateness: int) -> bool:
    """Is the i-th event of a partition older than its partition's earlier events allow?"""
    return i > 0 and times[i] < max(times[:i]) - lateness


@settings(max_examples=300, deadline=None)
@given(logs=partition_logs, reads=st.lists(st.lists(st.integers(0, 15), min_size=5, max_size=5), max_size=12))
def test_a_backlog_read_in_any_order_never_passes_an_unread_event_of_its_partition(logs, reads):
    """The catch-up case: everything is in the log, batches read any share of each partition.
    After every batch the watermark lies at or below every unread event of every partition,
    unless that event is already late within its own partition."""
    ends = {p: len(ts) for p, ts in enumerate(logs)}
    read = dict.fromkeys(ends, 0)
    marks: dict[int, PartitionMark] = {}
    watermark = None
    now = 0
    for step in reads:
        now += 10  # well inside the idle timeout: no partition is left out
        batch_max = {}
        for p in ends:
            take = min(step[p % len(step)], ends[p] - read[p])
            if take:
                batch_max[p] = max(logs[p][read[p]:read[p] + take])
            read[p] += take
        marks, result = advance_stream(watermark, marks, batch_max_event_ms=batch_max, read_offsets=dict(read),
                                       log_end_offsets=ends, lateness_ms=LATENESS, now_ms=now,
                                       idle_timeout_ms=IDLE_TIMEOUT)
        assert watermark is None or (result.watermark_ms is not None and result.watermark_ms >= watermark)
        watermark = result.watermark_ms
        for p, times in enumerate(logs):
            for i in range(read[p], len(times)):
                if watermark is not None and not _late_in_partition(times, i, LATENESS):
                    assert watermark <= times[i], (p, i, times, read, watermark)
        if result.held_by is not None:
            assert read[result.held_by] < ends[result.held_by]


@given(maxima=st.lists(st.one_of(st.none(), st.integers(0, 10_000)), min_size=1, max_size=6),
       previous=st.one_of(st.none(), st.integers(0, 10_000)))
def test_caught_up_partitions_give_the_newest_event_minus_lateness_and_it_never_goes_back(maxima, previous):
    marks = {p: PartitionMark(m, 5, 5, 0) for p, m in enumerate(maxima)}
    result = stream_watermark(previous, marks, lateness_ms=LATENESS, now_ms=0, idle_timeout_ms=IDLE_TIMEOUT)
    known = [m for m in maxima if m is not None]
    candidates = [c for c in (previous, max(known) - LATENESS if known else None) if c is not None]
    assert result.watermark_ms == (max(candidates) if candidates else None)
    assert result.held_by is None


def test_a_partition_with_unread_records_holds_the_watermark_at_its_own():
    marks = {0: PartitionMark(10_000, 50, 50, 0), 1: PartitionMark(4_000, 10, 90, 0)}
    result = stream_watermark(None, marks, lateness_ms=LATENESS, now_ms=500, idle_timeout_ms=IDLE_TIMEOUT)
    assert result.watermark_ms == 4_000 - LATENESS and result.held_by == 1


def test_a_partition_with_unread_records_and_no_event_yet_holds_the_watermark_where_it_is():
    marks = {0: PartitionMark(10_000, 50, 50, 0), 1: PartitionMark(None, 0, 90, 0)}
    result = stream_watermark(1_234, marks, lateness_ms=LATENESS, now_ms=500, idle_timeout_ms=IDLE_TIMEOUT)
    assert result == result.__class__(1_234, 1)


def test_an_idle_partition_no_longer_holds_the_watermark():
    stuck = PartitionMark(4_000, 10, 90, last_progress_ms=0)
    marks = {0: PartitionMark(10_000, 50, 50, 0), 1: stuck}
    assert partition_state(stuck, now_ms=IDLE_TIMEOUT - 1, idle_timeout_ms=IDLE_TIMEOUT) == ACTIVE
    assert partition_state(stuck, now_ms=IDLE_TIMEOUT, idle_timeout_ms=IDLE_TIMEOUT) == IDLE
    assert partition_state(marks[0], now_ms=0, idle_timeout_ms=IDLE_TIMEOUT) == CAUGHT_UP
    result = stream_watermark(None, marks, lateness_ms=LATENESS, now_ms=IDLE_TIMEOUT, idle_timeout_ms=IDLE_TIMEOUT)
    assert result.watermark_ms == 10_000 - LATENESS and result.held_by is None


def test_reading_from_a_partition_keeps_it_from_going_idle():
    marks, _ = advance_stream(None, {}, batch_max_event_ms={0: 100}, read_offsets={0: 1}, log_end_offsets={0: 9},
                              lateness_ms=LATENESS, now_ms=0, idle_timeout_ms=IDLE_TIMEOUT)
    marks, result = advance_stream(None, marks, batch_max_event_ms={0: 200}, read_offsets={0: 2},
                                   log_end_offsets={0: 9}, lateness_ms=LATENESS, now_ms=IDLE_TIMEOUT,
                                   idle_timeout_ms=IDLE_TIMEOUT)
    assert marks[0].last_progress_ms == IDLE_TIMEOUT and result.held_by == 0
    # Nothing read for the timeout: left out, and the stream-wide newest event rules again.
    marks, result = advance_stream(None, marks, batch_max_event_ms={}, read_offsets={0: 2}, log_end_offsets={0: 9},
                                   lateness_ms=LATENESS, now_ms=2 * IDLE_TIMEOUT, idle_timeout_ms=IDLE_TIMEOUT)
    assert result.held_by is None and result.watermark_ms == 200 - LATENESS


def test_a_clock_stepped_back_past_the_progress_stamps_counts_the_idle_timeout_from_the_corrected_clock():
    """A step back larger than the batch clock holds (aggregates/batch_clock.py) is taken as the
    right time: partition 1's progress, stamped by the clock that ran ahead, is then in the future.
    Its idle timeout starts again at the corrected clock, so it holds the watermark for at most
    the timeout (a negative time since progress kept it `active` for as long as the step)."""
    ahead = 100 * IDLE_TIMEOUT
    marks, _ = advance_stream(None, {}, batch_max_event_ms={0: 5_000, 1: 4_000}, read_offsets={0: 50, 1: 10},
                              log_end_offsets={0: 50, 1: 90}, lateness_ms=LATENESS, now_ms=ahead,
                              idle_timeout_ms=IDLE_TIMEOUT)
    now = 0  # the clock set back by 100 timeouts; partition 0 is read on, partition 1 is stuck
    marks, result = advance_stream(4_000 - LATENESS, marks, batch_max_event_ms={0: 6_000}, read_offsets={0: 60, 1: 10},
                                   log_end_offsets={0: 60, 1: 90}, lateness_ms=LATENESS, now_ms=now,
                                   idle_timeout_ms=IDLE_TIMEOUT)
    assert marks[1].last_progress_ms == now and result.held_by == 1
    marks, result = advance_stream(result.watermark_ms, marks, batch_max_event_ms={0: 7_000},
                                   read_offsets={0: 70, 1: 10}, log_end_offsets={0: 70, 1: 90}, lateness_ms=LATENESS,
                                   now_ms=now + IDLE_TIMEOUT, idle_timeout_ms=IDLE_TIMEOUT)
    assert partition_state(marks[1], now_ms=now + IDLE_TIMEOUT, idle_timeout_ms=IDLE_TIMEOUT) == IDLE
    assert result.held_by is None and result.watermark_ms == 7_000 - LATENESS
