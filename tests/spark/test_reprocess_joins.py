"""A reprocess of a stream that feeds a window join, switched in step with the serving pipeline
(docs/reprocessing.md, "A stream feeding a window join"): the run also reads the join's other
stream, only as far as the serving pipeline has; the switch holds the serving pipeline, lets the
run read the other stream exactly as far as it has, and moves the join's state and derived stream
with the stream. The other stream is appended to after the run caught up, read by the serving
pipeline before the switch and also left unread by it: every record reaches the rebuilt join once,
so the switched join equals one pipeline that read the whole log with the new definition. The
same for a pattern over both streams (its state is two-stream state like the join's). On both logs:
on Kafka the run reads in batches with chosen end offsets (aggregates/bounded_batches.py)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import pytest

from catalog import Catalog
from ingest.events import EventValidator
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.support.switch import SwitchScenario, hour_ago, nothing, plain_switch_refused

# The embedded stack alone: what the log adds to a switch (a run as a second consumer from the
# earliest retained offset, its batches cut at one append time) runs on Kafka in
# test_reprocess_enrichment.py and test_reprocess_enrichment_cut.py; here the dependents move.
pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]

STREAM = {"key_field": "search_id", "partitions": 2, "tiers": [], "allowed_lateness": "1s"}
OLD = {"streams": {"searches": {**STREAM, "dimensions": ["category"]},
                   "clicks": {**STREAM, "dimensions": ["bucket"]}},
       "joins": [{"name": "search_clicks", "left": {"stream": "searches", "key": "search_id"},
                  "right": {"stream": "clicks", "key": "search_id"}, "within": "2m", "late_horizon": "1m"}]}
# A dimension more on the left stream: the join's derived stream (the left's dimensions) changes too.
NEW = {**OLD, "streams": {**OLD["streams"], "searches": {**STREAM, "dimensions": ["category", "platform"]}}}


class Traffic:
    def __init__(self, log, catalog: Catalog, base_ms: int):
        self.log, self.catalog, self.base, self.rng, self.ids = log, catalog, base_ms, random.Random(16), 0
        self.sent: dict[str, list[str]] = {}  # the search ids of each phase

    def append(self, stream: str, events: list[dict]) -> None:
        validator = EventValidator(self.catalog.stream(stream))
        self.log.append(self.catalog.stream(stream), [validator.validate(e) for e in events], int(time.time() * 1000))

    def searches(self, n: int, start_s: int) -> list[str]:
        ids = [f"s{self.ids + i}" for i in range(n)]
        self.ids += n
        self.append("searches", [{"time": self.base + (start_s + i) * 1000, "search_id": s,
                                  "category": self.rng.choice(["books", "games"]),
                                  "platform": self.rng.choice(["ios", "web"])} for i, s in enumerate(ids)])
        return ids

    def phase(self, name: str, n: int, start_s: int, clicked: Callable[[dict[str, list[str]]], list[str]],
              before: Callable[[], None] = nothing) -> Callable[[], None]:
        """A phase of a switch scenario: `before()`, then `n` searches from second `start_s` (their
        ids kept as sent[name]), then clicks on those `clicked(sent)` names."""
        def append() -> None:
            before()
            self.sent[name] = self.searches(n, start_s)
            self.clicks(clicked(self.sent), start_s)
        return append

    def clicks(self, ids: list[str], start_s: int) -> None:
        """A click on some of `ids`, 0 to 3 minutes after `start_s` (some outside the 2-minute window)."""
        picked = [s for s in ids if self.rng.random() < 0.7]
        self.append("clicks", [{"time": self.base + (start_s + self.rng.randrange(180)) * 1000, "search_id": s,
                                "bucket": self.rng.choice(["top", "rest"])} for s in picked])


def panes(store, stream: str) -> dict:
    return {(p.key.start_ms, p.key.dims): (p.data.count, {n: (v.n, v.sum) for n, v in sorted(p.data.values.items())})
            for p in store.read_panes(stream, 0, 2**62) if p.data.count}


def join_totals(store) -> tuple[int, int]:
    rows = panes(store, "search_clicks").values()
    return (sum(v.get("pairs", (0, 0))[1] for _, v in rows), sum(v.get("unmatched_right", (0, 0))[1] for _, v in rows))


def test_a_reprocess_of_a_joins_stream_switched_in_step_gives_the_exact_join(tmp_path, spark, log_backend,
                                                                             store_backend):
    with SwitchScenario(tmp_path, spark, log_backend, OLD, NEW, batch=200) as scenario:
        traffic = Traffic(scenario.log, scenario.catalog, hour_ago())
        # The join's left stream gets a dimension between `first` and `changed`: reprocessed. After
        # the run: both streams appended to and read the old way by the serving pipeline, then
        # clicks it has not read yet when the switch comes (it reads them after, once); then
        # searches and clicks ten minutes on: every pipeline's join clock passes the state above.
        done = scenario.switch_of(
            "searches", first=traffic.phase("first", 150, 0, lambda ids: ids["first"]),
            changed=traffic.phase("second", 150, 150, lambda ids: ids["first"][100:] + ids["second"]),
            after_run=traffic.phase("third", 100, 300, lambda ids: ids["second"][100:] + ids["third"]),
            at_switch=lambda: traffic.clicks(traffic.sent["third"], 330),
            after_switch=traffic.phase("late", 50, 900, lambda ids: ids["late"]),
            caught_up=plain_switch_refused("sketchboard reprocess searches --switch"))
        root, reference = done.root, done.reference
        pairs, unmatched = join_totals(reference)
        assert pairs > 100 and unmatched > 10
        assert join_totals(root) == (pairs, unmatched)
        assert panes(root, "search_clicks") == panes(reference, "search_clicks")
        assert panes(root, "searches") == panes(reference, "searches")
        assert panes(root, "clicks") == panes(reference, "clicks")
        assert {json.loads(d).get("platform") for _, d in panes(root, "search_clicks")} >= {"ios", "web"}


# A pattern over both streams instead of a join: its state is two-stream state as the join's, and
# the same synchronized switch moves it (catalog/dependents.py aligned_patterns).
PATTERN = {"name": "search_click", "key": "search_id", "within": "2m",
           "steps": [{"name": "searched", "stream": "searches"}, {"name": "clicked", "stream": "clicks"}]}
# A lateness past the whole timeline: no record is late however batches cut the log (a pattern's
# watermark is its streams' lowest as of the batch before: which records are late would depend on
# how far each batch read either stream).
PATTERN_OLD = {"streams": {n: {**s, "allowed_lateness": "30m"} for n, s in OLD["streams"].items()},
               "patterns": [PATTERN]}
PATTERN_NEW = {**PATTERN_OLD, "streams": {**PATTERN_OLD["streams"],
                                          "searches": {**NEW["streams"]["searches"], "allowed_lateness": "30m"}}}


def pattern_matches(store) -> set:
    """The matches standing (retractions taken out), by key and the log records they hold."""
    rows = store.pattern_matches("search_click", limit=100_000)
    retracted = {m.retracts for m in rows if m.retracts is not None}
    return {(m.key, tuple((e["stream"], e["partition"], e["offset"]) for e in m.events)) for m in rows
            if m.retracts is None and m.id not in retracted}


class Timeline:
    """Searches one a second and a click on 70 % of them 1 s to 3 minutes later, made at once and
    appended in event-time order per stream, up to a cut."""

    def __init__(self, traffic: Traffic, searches: int):
        rng = random.Random(61)
        self.traffic = traffic
        self.events = {"searches": [{"time": traffic.base + i * 1000, "search_id": f"s{i}",
                                     "category": rng.choice(["books", "games"]), "platform": rng.choice(["ios", "web"])}
                                    for i in range(searches)]}
        self.events["clicks"] = sorted(  # never at its search's time (which of the two comes first is a tie)
            ({"time": e["time"] + rng.randrange(1, 180) * 1000, "search_id": e["search_id"],
              "bucket": rng.choice(["top", "rest"])} for e in self.events["searches"] if rng.random() < 0.7),
            key=lambda e: e["time"])
        self.sent = {"searches": 0, "clicks": 0}

    def upto(self, searches: int, clicks: int) -> Callable[[], None]:
        """A phase: the searches before second `searches`, then the clicks before `clicks`."""
        def append() -> None:
            self.until("searches", searches)
            self.until("clicks", clicks)
        return append

    def until(self, stream: str, second: int) -> None:
        """Append the stream's events before `second` not appended yet."""
        events = self.events[stream][self.sent[stream]:]
        due = [e for e in events if e["time"] < self.traffic.base + second * 1000]
        if due:
            self.traffic.append(stream, due)
        self.sent[stream] += len(due)


def test_a_reprocess_of_a_stream_a_two_stream_pattern_reads_switched_in_step_gives_the_exact_matches(
        tmp_path, spark, log_backend, store_backend):
    with SwitchScenario(tmp_path, spark, log_backend, PATTERN_OLD, PATTERN_NEW, batch=200) as scenario:
        traffic = Traffic(scenario.log, scenario.catalog, hour_ago())
        timeline = Timeline(traffic, 450)

        def late() -> None:
            """The rest, then searches and clicks 40 minutes on: the pattern's watermark passes the above."""
            timeline.until("searches", 10_000)
            timeline.until("clicks", 10_000)
            traffic.ids = 1_000  # ids of their own, past the timeline's
            traffic.clicks(traffic.searches(50, 2_500), 2_500)

        # A dimension more on one of the pattern's streams between `first` and `changed`. After
        # the run: both streams appended to and read the old way by the serving pipeline, then
        # clicks it has not read when the switch comes (it reads them after, once).
        done = scenario.switch_of(
            "searches", first=timeline.upto(150, 120), changed=timeline.upto(300, 250),
            after_run=timeline.upto(400, 350), at_switch=lambda: timeline.until("clicks", 420),
            after_switch=late, tail=lambda: traffic.clicks(traffic.searches(10, 2_600), 2_600),
            caught_up=plain_switch_refused("feeds pattern 'search_click'.*sketchboard reprocess searches --switch"))
        root, reference = done.root, done.reference
        want = pattern_matches(reference)
        # The exact answer too: the timeline's searches clicked within the pattern's 2 minutes.
        searched = {e["search_id"]: e["time"] for e in timeline.events["searches"]}
        exact = {e["search_id"] for e in timeline.events["clicks"] if e["time"] - searched[e["search_id"]] <= 120_000}
        assert {k for k, _ in want if k in searched} == exact and len(exact) > 150
        assert pattern_matches(root) == want
        assert panes(root, "search_click_matches") == panes(reference, "search_click_matches")
        assert panes(root, "searches") == panes(reference, "searches")
        assert panes(root, "clicks") == panes(reference, "clicks")
