"""The demo's searches and clicks (demo/searches.py): a click-through rate per category, several
clicks per search now and then, log-normal click delays with a tail past the 30-minute join
window, clicks a device buffered past the allowed lateness, and clicks on search ids no search
ever had; then the same through DemoTraffic with a stepping clock, as the producer sends them.
Pure, seeded, no JVM: figures over many samples within tolerances."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from demo import DemoTraffic
from demo.searches import (
    CATEGORY_NAMES,
    CLICK_DELAY_MAX_MS,
    CLICK_DELAY_MIN_MS,
    CLICK_LATE,
    CLICK_ON_TIME,
    CLICK_UNKNOWN,
    CTR,
    MAX_SEARCH_JITTER_MS,
    SearchClicks,
    position_bucket,
    run_id,
)
from demo.stragglers import ON_TIME
from tests.support.clock import FakeClock

NOW_MS = 1_700_000_000_000
MINUTE = 60_000
JOIN_WINDOW = 30 * MINUTE  # the demo join's `within` (issue 17)


@pytest.fixture(scope="module")
def drawn():
    """100 000 searches at one instant, and every click on them (sent within three hours)."""
    gen = SearchClicks(seed=1, run="t", late_after_ms=71_000, late_spread_ms=60_000)
    searches = gen.searches(100_000, NOW_MS)
    clicks = gen.due_clicks(NOW_MS + 3 * 3_600_000)
    assert gen.pending == 0
    return searches, clicks


def _rows(batch) -> list[dict]:
    columns = {"time": batch.time_ms, **batch.strings, **batch.numbers}
    if hasattr(batch, "kinds"):
        columns |= {"kind": batch.kinds, "delay": batch.delay_ms, "sent": batch.sent_ms}
    return [dict(zip(columns, row)) for row in zip(*columns.values(), strict=True)]


def test_the_click_through_rate_differs_per_category_as_declared(drawn):
    searches, clicks = drawn
    clicked = {c["search_id"] for c in _rows(clicks) if c["kind"] != CLICK_UNKNOWN}
    per = Counter(searches.strings["query_category"])
    hit = Counter(cat for sid, cat in zip(searches.strings["search_id"], searches.strings["query_category"])
                  if sid in clicked)
    assert set(per) == set(CATEGORY_NAMES)
    for cat in CATEGORY_NAMES:
        assert abs(hit[cat] / per[cat] - CTR[cat]) < 0.02, (cat, hit[cat] / per[cat])
    assert min(CTR.values()) >= 0.25 and max(CTR.values()) <= 0.60
    overall = sum(hit.values()) / len(searches.time_ms)
    assert 0.42 < overall < 0.52


def test_a_clicked_search_sometimes_gets_several_clicks_on_its_own_results(drawn):
    searches, clicks = drawn
    results = dict(zip(searches.strings["search_id"], searches.numbers["results"], strict=True))
    rows = [c for c in _rows(clicks) if c["kind"] != CLICK_UNKNOWN]
    per_search = Counter(c["search_id"] for c in rows)
    several = sum(n > 1 for n in per_search.values()) / len(per_search)
    assert 0.25 < several < 0.45
    assert max(per_search.values()) <= 10
    # Nothing found, nothing clicked; a click lands on one of the search's own results.
    assert sum(r == 0 for r in results.values()) / len(results) > 0.03
    assert all(1 <= c["position"] <= results[c["search_id"]] for c in rows)
    assert all(c["position_bucket"] == position_bucket(c["position"]) for c in rows)
    buckets = Counter(c["position_bucket"] for c in rows)
    assert buckets["1"] > buckets["2-3"] > buckets["11+"] and buckets["4-10"] > buckets["11+"]
    assert 0.40 < buckets["1"] / len(rows) < 0.60


def test_click_delays_are_log_normal_from_seconds_to_tens_of_minutes(drawn):
    _, clicks = drawn
    delays = np.array([d for d in clicks.delay_ms if d is not None])
    assert delays.min() >= CLICK_DELAY_MIN_MS and delays.max() <= CLICK_DELAY_MAX_MS
    assert 10_000 < np.median(delays) < 25_000               # seconds
    assert 0.5 < np.mean(delays < MINUTE) < 0.9
    assert 0.008 < np.mean(delays > 10 * MINUTE) < 0.025      # a tail of tens of minutes
    after = np.mean(delays > JOIN_WINDOW)
    assert 0.001 < after < 0.005                              # a few after the join window
    # Log-normal: the log of (delay - minimum) is symmetric about its median.
    logs = np.log(delays - CLICK_DELAY_MIN_MS + 1)
    assert abs(np.mean(logs) - np.median(logs)) < 0.05


def test_every_click_names_a_search_except_the_deliberate_unknown_ones(drawn):
    searches, clicks = drawn
    by_id = {s["search_id"]: s for s in _rows(searches)}
    assert len(by_id) == len(searches.time_ms)  # ids are unique
    rows = _rows(clicks)
    kinds = Counter(c["kind"] for c in rows)
    assert 0.003 < kinds[CLICK_UNKNOWN] / len(rows) < 0.008
    for c in rows:
        search = by_id.get(c["search_id"])
        if c["kind"] == CLICK_UNKNOWN:
            assert search is None and c["delay"] is None
            continue
        assert search is not None
        assert c["time"] == search["time"] + c["delay"]
        assert (c["user_id"], c["platform"]) == (search["user_id"], search["platform"])
        assert search["results"] > 0
    # Unknown ids look like the others (same run tag), so only the join can tell them apart.
    unknown = next(c["search_id"] for c in rows if c["kind"] == CLICK_UNKNOWN)
    assert unknown.rsplit("-", 1)[0] == next(iter(by_id)).rsplit("-", 1)[0]


def test_a_small_share_of_clicks_is_sent_after_the_allowed_lateness(drawn):
    _, clicks = drawn
    rows = _rows(clicks)
    late = [c for c in rows if c["kind"] == CLICK_LATE]
    assert 0.005 < len(late) / len(rows) < 0.015
    assert all(c["sent"] - c["time"] >= 71_000 for c in late)
    on_time = [c["sent"] - c["time"] for c in rows if c["kind"] == CLICK_ON_TIME]
    assert all(0 <= d < 10_000 for d in on_time) and np.mean(on_time) < 500
    assert [c["sent"] for c in rows] == sorted(c["sent"] for c in rows)  # due_clicks: in send order


def test_searches_happen_just_before_now_and_the_draws_are_seeded():
    a = SearchClicks(seed=4, run="r").searches(1_000, NOW_MS)
    assert all(NOW_MS - MAX_SEARCH_JITTER_MS <= t <= NOW_MS for t in a.time_ms)
    assert a == SearchClicks(seed=4, run="r").searches(1_000, NOW_MS)
    assert a != SearchClicks(seed=5, run="r").searches(1_000, NOW_MS)
    assert run_id(4, NOW_MS) == run_id(4, NOW_MS) != run_id(4, NOW_MS + 1)
    with pytest.raises(ValueError, match="late_share"):
        SearchClicks(late_share=1.5)


def test_demo_traffic_sends_searches_then_their_clicks_as_the_clock_moves(catalog):
    """Ticks a second apart for an hour and a half, ten searches a tick: clicks go out once their
    send time has come, never ahead of the clock, each after its search; buffered ones after the
    clicks stream's allowed lateness and pane (their pane is final by then: a correction)."""
    clicks_stream = catalog.stream("clicks")
    clock = FakeClock(NOW_MS / 1000)
    traffic = DemoTraffic(catalog, seed=2, clock=clock)
    seen: dict[str, int] = {}       # search id -> its time, in the order sent
    late_gaps, unknown, n_clicks = [], 0, 0
    for _ in range(5_400):
        for s in traffic.generate_stream("searches", 10):
            seen[s["search_id"]] = s["time"]
        now_ms = int(clock.now * 1000)
        clicks = traffic.generate_stream("clicks", 0)  # n is ignored: the clicks due by now
        for c, kind in zip(clicks, traffic.last_kinds, strict=True):
            assert set(c) == {clicks_stream.time_field, *clicks_stream.string_fields, *clicks_stream.values}
            assert c["time"] <= now_ms
            n_clicks += 1
            if kind == CLICK_UNKNOWN:
                assert c["search_id"] not in seen
                unknown += 1
                continue
            assert seen[c["search_id"]] <= c["time"]   # its search was sent before it
            if kind == CLICK_LATE:
                late_gaps.append(now_ms - c["time"])
        clock.now += 1.0
    assert 0.6 < n_clicks / len(seen) < 0.8  # ~0.7 clicks per search
    assert unknown > 0 and late_gaps
    assert min(late_gaps) > clicks_stream.allowed_lateness + clicks_stream.pane
    # The searches stream itself is sent on time (its stragglers are the clicks).
    traffic.generate_stream("searches", 10)
    assert traffic.last_kinds == [ON_TIME] * 10


def test_generate_sends_about_one_search_per_twenty_requests_and_the_clicks_that_are_due(catalog):
    clock = FakeClock(NOW_MS / 1000)
    traffic = DemoTraffic(catalog, seed=6, clock=clock)
    sent = Counter()
    for _ in range(120):
        sent.update({k: len(v) for k, v in traffic.generate(500).items()})
        clock.now += 1.0
    assert 0.04 < sent["searches"] / sent["http_requests"] < 0.06
    assert 0.2 < sent["clicks"] / sent["searches"] < 0.7  # two minutes in: the later clicks are still due


def test_search_ids_do_not_repeat_across_demo_runs(catalog):
    first = DemoTraffic(catalog, seed=0, clock=FakeClock(NOW_MS / 1000)).generate_stream("searches", 50)
    again = DemoTraffic(catalog, seed=0, clock=FakeClock(NOW_MS / 1000)).generate_stream("searches", 50)
    later = DemoTraffic(catalog, seed=0, clock=FakeClock(NOW_MS / 1000 + 60)).generate_stream("searches", 50)
    assert first == again  # seeded: the same run start, the same events
    assert not {e["search_id"] for e in first} & {e["search_id"] for e in later}


def test_searches_leave_the_other_streams_draws_as_they_were(catalog):
    """The search model has its own RNG: a configuration without searches and clicks gets exactly
    the events it got before they existed."""
    from catalog import Catalog

    without = Catalog(streams={k: v for k, v in catalog.streams.items() if k not in ("searches", "clicks")},
                      metrics={k: m for k, m in catalog.metrics.items() if m.stream not in ("searches", "clicks")},
                      views=catalog.views)
    a = DemoTraffic(catalog, seed=3, clock=FakeClock(NOW_MS / 1000))
    b = DemoTraffic(without, seed=3, clock=FakeClock(NOW_MS / 1000))
    for _ in range(3):
        x, y = a.generate(500), b.generate(500)
        assert {k: v for k, v in x.items() if k not in ("searches", "clicks")} == y
