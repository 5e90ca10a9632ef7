"""The demo's logins and checkout funnel (demo/logins.py, demo/checkouts.py) and the shipped
patterns over them (config/streams.yaml): two hours of the demo's clock through DemoTraffic as the
producer draws them; the matcher (patterns/), fed in event-time order, finds exactly the bursts
that broke in (one match each, with the burst's attempts) and exactly the checkouts not completed
within 30 minutes, and ordinary traffic matches nothing. Pure, seeded, no JVM."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from demo import DemoTraffic
from demo.checkouts import STAGE_COMPLETED, STAGE_STARTED
from demo.logins import MAX_USER_FAILURES, OUTCOME_FAILURE, OUTCOME_SUCCESS, home_ip
from patterns.events import PatternEvent
from patterns.matcher import PatternMatcher
from patterns.plan import compile_pattern
from tests.support.clock import FakeClock

HOURS = 2
TICK_S = 5.0
MIN = 60_000


@pytest.fixture(scope="module")
def demo(catalog):
    """Two hours of the demo's logins and checkouts, drawn every TICK_S of the clock; the traffic."""
    clock = FakeClock()
    traffic = DemoTraffic(catalog, seed=0, clock=clock)
    events: dict[str, list[dict]] = {"logins": [], "checkouts": []}
    for _ in range(int(HOURS * 3600 / TICK_S)):
        clock.advance(TICK_S)
        for name in events:
            events[name] += traffic.generate_stream(name, 0)
    return traffic, events, round(clock() * 1000)


def matches(catalog, name: str, events: list[dict], watermark: int):
    """The shipped pattern `name` over the events in event-time order, advanced to `watermark`."""
    pattern = next(p for p in catalog.patterns if p.name == name)
    matcher = PatternMatcher(compile_pattern(pattern, catalog))
    stream = pattern.streams[0]
    fed = sorted((PatternEvent(stream, 0, i, e["time"], e[pattern.key], e) for i, e in enumerate(events)),
                 key=lambda e: e.order)
    out = [m for e in fed if e.time <= watermark for m in matcher.feed(e).matches]
    return out + matcher.advance(watermark)


def test_logins_come_a_few_per_second_with_failures_retried_and_bursts(catalog, demo):
    traffic, events, end_ms = demo
    logins = events["logins"]
    stream = catalog.stream("logins")
    assert all(set(e) == {stream.time_field, "user_id", "ip", "outcome", "client"} for e in logins)
    per_s = len(logins) / (HOURS * 3600)
    assert 1.0 < per_s < 3.0  # LOGINS_PER_S x the morning's daily shape, and the bursts
    outcomes = Counter(e["outcome"] for e in logins)
    assert set(outcomes) == {OUTCOME_SUCCESS, OUTCOME_FAILURE} and 0.06 < outcomes[OUTCOME_FAILURE] / len(logins) < 0.2
    assert set(Counter(e["client"] for e in logins)) == {"web", "android", "ios"}
    # Users log in from home, or from a phone's network, now and then.
    homes = sum(e["ip"] == home_ip(e["user_id"]) for e in logins)
    assert 0.6 < homes / len(logins) < 0.95
    assert all(traffic.started_s * 1000 <= e["time"] <= end_ms for e in logins)

    bursts = traffic.login_traffic.bursts(round(traffic.started_s * 1000), end_ms)
    assert 8 <= len(bursts) <= 30  # one every few minutes
    assert 0 < sum(b.success for b in bursts) < len(bursts)  # some break in, some give up
    sent = {(e["user_id"], e["ip"], e["time"], e["outcome"]) for e in logins}
    for b in bursts:
        if b.end_ms <= end_ms:
            outcomes = [OUTCOME_FAILURE] * b.failures + [OUTCOME_SUCCESS] * b.success
            assert {(b.user_id, b.ip, t, o) for t, o in zip(b.times_ms, outcomes)} <= sent
            assert 5 <= b.failures <= 9 and b.end_ms - b.start_ms < 10 * MIN

    # An ordinary user fails at most MAX_USER_FAILURES times in a row (fewer than the pattern's 5).
    attackers = {(b.user_id, b.ip) for b in bursts}
    streak: dict[tuple, int] = defaultdict(int)
    longest = 0
    for e in sorted(logins, key=lambda e: e["time"]):
        who = (e["user_id"], e["ip"])
        if who not in attackers:
            streak[who] = streak[who] + 1 if e["outcome"] == OUTCOME_FAILURE else 0
            longest = max(longest, streak[who])
    assert longest == MAX_USER_FAILURES


def test_credential_stuffing_finds_exactly_the_bursts_that_broke_in(catalog, demo):
    traffic, events, end_ms = demo
    bursts = traffic.login_traffic.bursts(round(traffic.started_s * 1000), end_ms)
    found = matches(catalog, "credential_stuffing", events["logins"], end_ms)
    assert found
    broke_in = [b for b in bursts if b.success and b.end_ms <= end_ms]
    assert sorted((m.key, [e.time for e in m.events], m.measures["attempts"]) for m in found) == sorted(
        (b.user_id, list(b.times_ms), b.failures) for b in broke_in)
    assert all([e.step for e in m.events] == ["failures"] * (len(m.events) - 1) + ["success"] for m in found)


def test_checkouts_are_a_funnel_and_the_abandoned_ones_are_matched_at_30_minutes(catalog, demo):
    _, events, end_ms = demo
    checkouts = events["checkouts"]
    stream = catalog.stream("checkouts")
    assert all(set(e) == {stream.time_field, "checkout_id", "customer_id", "stage", "payment_method", "amount",
                          "items"} for e in checkouts)
    started = {e["checkout_id"]: e for e in checkouts if e["stage"] == STAGE_STARTED}
    completed = {e["checkout_id"]: e for e in checkouts if e["stage"] == STAGE_COMPLETED}
    assert 0.2 < len(started) / (HOURS * 3600) < 0.8 and set(completed) <= set(started)
    assert all(completed[k]["amount"] == started[k]["amount"] > 0 for k in completed)
    # Decided ones only: a start more than 30 minutes before the end.
    decided = {k: e for k, e in started.items() if e["time"] + 30 * MIN <= end_ms - 60_000}
    in_time = {k for k in decided if k in completed and completed[k]["time"] - decided[k]["time"] <= 30 * MIN}
    abandoned = set(decided) - in_time
    assert 0.2 < len(abandoned) / len(decided) < 0.4  # ~27 % never complete, ~3 % come back after the half hour
    assert any(k in completed for k in abandoned)

    found = matches(catalog, "checkout_abandoned", checkouts, end_ms - 60_000)
    assert sorted((m.key, m.decided_at, m.measures["amount"]) for m in found) == sorted(
        (k, e["time"] + 30 * MIN, e["amount"]) for k, e in decided.items() if k in abandoned)


def test_the_same_clock_gives_the_same_bursts_at_any_tick_and_the_benchmarks_mix_is_unchanged(catalog):
    def logins(tick_s: float, seconds: float) -> set:
        clock = FakeClock()
        traffic = DemoTraffic(catalog, seed=5, clock=clock)
        out = []
        for _ in range(int(seconds / tick_s)):
            clock.advance(tick_s)
            out += traffic.generate_stream("logins", 0)
        bursts = traffic.login_traffic.bursts(round(traffic.started_s * 1000), round(clock() * 1000) - 60_000)
        return {(b.user_id, b.times_ms) for b in bursts}, {(e["user_id"], e["time"]) for e in out}

    fine, fine_events = logins(0.25, 900)
    coarse, coarse_events = logins(3.0, 900)
    assert fine and fine == coarse  # a function of the seed and the clock's slots only
    assert all((user, t) in fine_events and (user, t) in coarse_events for user, times in fine for t in times)

    # The benchmarks draw as fast as the machine goes (bench/throughput.py: chunks of 50 000
    # requests' worth, each some tenths of a second): logins and checkouts are a trace of it.
    clock = FakeClock()
    traffic = DemoTraffic(catalog, seed=7, clock=clock)
    counts: Counter = Counter()
    for _ in range(4):
        clock.advance(0.5)
        counts.update({name: len(evs) for name, evs in traffic.generate(50_000).items()})
    assert (counts["logins"] + counts["checkouts"]) / sum(counts.values()) < 0.001


def test_a_second_producer_started_later_sends_bursts_of_its_own(catalog):
    """A `sketchboard demo` beside `make run` (both seed 0) sent every burst of the first again, the
    same user, address and times: the pattern saw each attempt twice. Its bursts are its own now."""
    start = FakeClock()()
    first = DemoTraffic(catalog, seed=0, clock=FakeClock(start)).login_traffic
    again = DemoTraffic(catalog, seed=0, clock=FakeClock(start)).login_traffic
    second = DemoTraffic(catalog, seed=0, clock=FakeClock(start + 37)).login_traffic
    span = (round(start * 1000) + 240_000, round(start * 1000) + 4 * 3_600_000)
    ours = {(b.user_id, b.ip, b.times_ms) for b in first.bursts(*span)}
    assert ours and ours == {(b.user_id, b.ip, b.times_ms) for b in again.bursts(*span)}  # still seeded
    theirs = {(b.user_id, b.ip, b.times_ms) for b in second.bursts(*span)}
    assert theirs and not ours & theirs
