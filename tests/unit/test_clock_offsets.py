"""Device clock offsets (aggregates/clock_offsets.py): properties of the estimator, no I/O."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.clock_offsets import ClockEstimate, corrected_event_time, estimate

BUCKET = 60_000
WINDOW = 15 * 60_000
HOUR = 3_600_000

offsets = st.integers(-30 * HOUR, 30 * HOUR)  # a device clock off by up to a day and more, either way
delays = st.lists(st.one_of(st.integers(5, 400), st.integers(400, 120_000)), min_size=5, max_size=80)


def sends(offset: int, delay_list: list[int], start: int = 1_800_000_000_000, every: int = 7_000):
    """(received, sent) of sends every `every` ms by a device whose clock is `offset` behind ours."""
    return [(start + i * every + d, start + i * every - offset) for i, d in enumerate(delay_list)]


@settings(max_examples=300)
@given(offset=offsets, delay_list=delays)
def test_a_constant_offset_is_recovered_within_the_smallest_delay(offset, delay_list):
    samples = sends(offset, delay_list)
    newest = max(r for r, _ in samples)
    in_window = [d for (r, _), d in zip(samples, delay_list, strict=True) if r // BUCKET * BUCKET > newest // BUCKET * BUCKET - WINDOW]
    got = estimate(samples, bucket_ms=BUCKET, window_ms=WINDOW).offset_ms()
    assert got == offset + min(in_window)  # never below the truth; above it by the least delay only


@settings(max_examples=200)
@given(before=offsets, after=offsets, delay_list=st.lists(st.integers(5, 400), min_size=260, max_size=260))
def test_a_jump_of_the_device_clock_is_followed_within_the_window(before, after, delay_list):
    """The clock is reset after 100 sends (7 s apart); 160 sends (~19 minutes, more than the
    15-minute window) later, the estimate is the new offset (within the delays)."""
    first = sends(before, delay_list[:100])
    start = first[-1][1] + before + 7_000
    second = sends(after, delay_list[100:], start=start)
    got = estimate(first + second, bucket_ms=BUCKET, window_ms=WINDOW).offset_ms()
    assert after <= got <= after + 400


@given(offset=offsets, delay_list=delays, cut=st.integers(0, 80), seed=st.randoms())
def test_merging_partial_estimates_in_any_order_is_estimating_all_samples(offset, delay_list, cut, seed):
    samples = sends(offset, delay_list)
    seed.shuffle(samples)
    whole = estimate(samples)
    a, b = estimate(samples[:cut]), estimate(samples[cut:])
    assert a.merge(b) == b.merge(a) == whole


def test_an_unknown_device_and_a_healthy_one_keep_their_event_times():
    assert ClockEstimate().offset_ms() is None
    assert corrected_event_time(1_000, None, tolerance_ms=1_000) == 1_000
    assert corrected_event_time(1_000, 250, tolerance_ms=1_000) == 1_000  # network delay, not a clock error
    assert corrected_event_time(1_000, 2 * HOUR, tolerance_ms=1_000) == 1_000 + 2 * HOUR
    assert corrected_event_time(10 * HOUR, -2 * HOUR, tolerance_ms=1_000) == 8 * HOUR


def test_events_buffered_offline_for_hours_land_at_their_time_on_our_clock():
    """The seed's example: a phone whose clock is 3 h behind records an event offline at 09:00
    our time, and sends it at 14:00 our time (4 ms on the wire): its sent time says 11:00, its
    event time 06:00; corrected, the event is at 09:00."""
    behind = 3 * HOUR
    happened, sent_at = 9 * HOUR, 14 * HOUR
    device_event, device_sent = happened - behind, sent_at - behind
    offset = estimate([(sent_at + 4, device_sent)]).offset_ms()
    assert corrected_event_time(device_event, offset, tolerance_ms=1_000) == happened + 4


def test_a_clock_set_forward_shows_at_once_and_a_delay_outlier_never_does():
    samples = sends(2 * HOUR, [20] * 30)
    state = estimate(samples)
    received, _ = samples[-1]
    assert state.observe(received + 7_000, received + 7_000 - HOUR).offset_ms() == HOUR  # forward: next send
    assert state.observe(received + 7_000, received - 2 * HOUR - 60_000).offset_ms() == 2 * HOUR + 20  # 67 s late
