"""The demo's mobile_app stream (demo/devices.py): devices whose clocks are off by seconds to
hours and that send hours of offline backlog at once; and that the pipeline's device clock rule
(aggregates/device_clocks.py, pure) puts those events back near when they happened. No JVM."""

from __future__ import annotations

from collections import Counter

import numpy as np

from aggregates.device_clocks import plan_batch
from aggregates.eventtime import FUTURE_SKEW, dead_letter_reason
from demo import DemoTraffic
from demo.devices import DeviceFleet
from demo.stragglers import OFFLINE, ON_TIME
from tests.support.clock import FakeClock

NOW = 1_700_000_000.0
HOUR = 3_600_000
BUCKET = 60_000


def test_device_clocks_are_off_by_seconds_to_hours_either_way():
    errors = np.abs(DeviceFleet(seed=1).errors_ms)
    assert 0.75 < np.mean(errors <= 1_000) < 0.85      # most devices are synced
    assert 0.04 < np.mean(errors > 10 * 60_000) < 0.12  # some are off by more than ten minutes
    assert np.mean(errors > 3 * HOUR) > 0.01            # a few by hours
    signed = DeviceFleet(seed=1).errors_ms
    assert (signed < -HOUR).any() and (signed > HOUR).any()  # ahead and behind


def test_mobile_app_events_carry_both_device_stamps_and_offline_backlogs(catalog):
    clock = FakeClock(NOW)
    traffic = DemoTraffic(catalog, seed=3, clock=clock)
    events, kinds = [], []
    for _ in range(40):  # 40 ticks, a second apart
        events += traffic.generate_stream("mobile_app", 2_000)
        kinds += traffic.last_kinds
        clock.now += 1.0
    stream = catalog.stream("mobile_app")
    assert all(set(e) == {stream.time_field, stream.sent_time_field, *stream.string_fields, *stream.values}
               for e in events)
    assert all(e["sent_at"] >= e["time"] for e in events)  # sent after it happened, by the same clock
    counts = Counter(kinds)
    assert counts[ON_TIME] == 80_000 and 1_000 < counts[OFFLINE] < 12_000  # backlogs come on top
    # A backlog: one device, one sent time, events from one to four hours before it.
    backlog = [e for e, k in zip(events, kinds, strict=True) if k == OFFLINE]
    by_send = Counter((e["device_id"], e["sent_at"]) for e in backlog)
    assert all(20 <= n < 120 for n in by_send.values())
    assert all(HOUR <= e["sent_at"] - e["time"] <= 4 * HOUR for e in backlog)
    # generate() sends the stream about a quarter of the HTTP requests' count, plus the backlogs.
    assert 400 < len(DemoTraffic(catalog, seed=4, clock=FakeClock(NOW)).generate(2_000)["mobile_app"]) < 700


def test_the_clock_rule_puts_the_demo_devices_events_back_near_when_they_happened(catalog):
    """Receive each event 20-400 ms after it was sent; plan one batch; every corrected event lies
    within the smallest delay of its true time, or is left alone when its device is within the
    tolerance; nothing is future-skewed any more, though hundreds were by their own stamps."""
    stream = catalog.stream("mobile_app")
    clock = FakeClock(NOW)
    traffic = DemoTraffic(catalog, seed=5, clock=clock)
    rng = np.random.default_rng(0)
    events = []
    for _ in range(20):
        events += traffic.generate_stream("mobile_app", 3_000)
        clock.now += 1.0
    fleet = traffic.fleet
    received = [e["sent_at"] + fleet.error_of(e["device_id"]) + int(rng.integers(20, 400)) for e in events]
    samples: dict[tuple[str, str, int], int] = {}
    for e, r in zip(events, received, strict=True):
        key = ("mobile_app", e["device_id"], r - r % BUCKET)
        samples[key] = min(samples.get(key, r - e["sent_at"]), r - e["sent_at"])
    plan = plan_batch({}, [(*k, o) for k, o in samples.items()], {"mobile_app": stream},
                      batch_now_ms=int(clock.now * 1000))
    skew = dict(batch_now_ms=int(clock.now * 1000), retention_ms=stream.retention, max_future_skew_ms=stream.max_future_skew)
    raw_future = corrected_future = 0
    for e, r in zip(events, received, strict=True):
        error = fleet.error_of(e["device_id"])
        correction = plan.corrections.get(("mobile_app", e["device_id"]), 0)
        corrected = e["time"] + correction
        if correction:
            assert 0 < corrected - (e["time"] + error) < 400  # the true time, plus at most the least delay
        else:
            assert abs(error) <= stream.clock_tolerance
        raw_future += dead_letter_reason(e["time"], r, None, **skew) == FUTURE_SKEW
        corrected_future += dead_letter_reason(corrected, r, None, **skew) == FUTURE_SKEW
    assert raw_future > 100 and corrected_future == 0
