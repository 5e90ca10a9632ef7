"""The demo producer's straggler mix, without a JVM: the shares of delayed, late (past the
allowed lateness), beyond-retention and future events, and where their times fall."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from aggregates.eventtime import BEYOND_RETENTION, FUTURE_SKEW, dead_letter_reason
from catalog import load_catalog
from demo import BEYOND_HORIZON, DELAYED, FUTURE, LATE, ON_TIME, DemoTraffic, Stragglers, main
from store.panes import pane_start

CONFIG = Path(__file__).resolve().parents[2] / "config" / "streams.yaml"
NOW = 1_700_000_000.0
N = 100_000


@pytest.fixture(scope="module")
def mix():
    catalog = load_catalog(CONFIG)
    stragglers = Stragglers(delayed_fraction=0.1, delay_mean_s=4.0, late_fraction=0.02, horizon_fraction=0.005,
                            future_fraction=0.003)
    traffic = DemoTraffic(catalog, seed=3, clock=lambda: NOW, stragglers=stragglers)
    events = traffic.generate_stream("http_requests", N)
    return catalog.stream("http_requests"), stragglers, events, traffic.last_kinds


def test_shares_match_the_settings(mix):
    _, s, events, kinds = mix
    counts = Counter(kinds)
    assert len(kinds) == len(events) == N
    for kind, share in ((DELAYED, s.delayed_fraction), (LATE, s.late_fraction),
                        (BEYOND_HORIZON, s.horizon_fraction), (FUTURE, s.future_fraction)):
        expected = share * N
        assert abs(counts[kind] - expected) <= 5 * expected**0.5 + 1, (kind, counts[kind], expected)
    assert counts[ON_TIME] == N - sum(counts[k] for k in (DELAYED, LATE, BEYOND_HORIZON, FUTURE))


def test_each_kind_lands_where_the_pipeline_treats_it_as_such(mix):
    stream, s, events, kinds = mix
    now_ms = int(NOW * 1000)
    watermark = now_ms - stream.allowed_lateness  # as soon as on-time events of now are aggregated
    delays = []
    for event, kind in zip(events, kinds, strict=True):
        t = event["time"]
        reason = dead_letter_reason(t, now_ms, None, batch_now_ms=now_ms, retention_ms=stream.retention,
                                    max_future_skew_ms=stream.max_future_skew)
        if kind == FUTURE:
            assert reason == FUTURE_SKEW
        elif kind == BEYOND_HORIZON:
            assert reason == BEYOND_RETENTION
        else:
            assert reason is None
        if kind == LATE:  # its pane is final by the time it arrives: a correction
            assert pane_start(t, stream.pane) + stream.pane <= watermark
        if kind == ON_TIME:
            assert now_ms - 2_000 <= t <= now_ms
        if kind == DELAYED:
            delays.append(now_ms - t)
    mean = sum(delays) / len(delays)
    assert mean == pytest.approx(s.delay_mean_s * 1000, rel=0.1)


def test_off_by_default_in_the_generator_and_validated():
    catalog = load_catalog(CONFIG)
    traffic = DemoTraffic(catalog, seed=1, clock=lambda: NOW)
    traffic.generate_stream("orders", 1000)
    assert set(traffic.last_kinds) == {ON_TIME}
    with pytest.raises(ValueError, match="add up to at most 1"):
        Stragglers(delayed_fraction=0.9, late_fraction=0.2)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        Stragglers(future_fraction=-0.1)
    assert main(["--late-fraction", "2", "--config", str(CONFIG)]) == 2
