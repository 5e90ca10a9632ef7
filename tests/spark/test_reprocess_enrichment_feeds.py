"""A reprocess of a table whose enriched stream feeds a window join or a pattern (docs/reprocessing.md,
"Through a view, or feeding a join or a pattern"): the table's run rebuilds the stream and the
state it feeds, reading the stream and that state's other stream only as far as the serving
pipeline has, and the synchronized switch moves them with the table. The phases of
tests/spark/test_reprocess_joins.py (both streams appended to after the run, read by the serving
pipeline and left unread by it at the switch, and after it), with table changes valid from the
next search: the join's totals and panes, the pattern's matches, both streams' panes equal a
reference pipeline's over the whole log. On both logs: on Kafka the run drives its batches, capped
(aggregates/bounded_batches.py), and the broker stamps every append time (LogAppendTime), so the
events are timed ahead of their appends: each is looked up as of its append time on either log."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import pytest

from catalog import Catalog
from ingest.tables import TableRowValidator
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.support.switch import SwitchScenario, plain_switch_refused
from tests.spark.test_reprocess_joins import OLD as JOINED_OLD, PATTERN_OLD, Timeline, Traffic as JoinTraffic, \
    join_totals, panes, pattern_matches

# The embedded stack alone: what the log adds to a switch (a run as a second consumer from the
# earliest retained offset, its batches cut at one append time) runs on Kafka in
# test_reprocess_enrichment.py and test_reprocess_enrichment_cut.py; here the dependents move.
pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]


# `searches` is enriched from the table `categories` by its category and is the join's left stream.
# The table gains `shelf` and `searches` is enriched with it too: the run of the table rebuilds
# `searches` and the join, both read as far as the serving pipeline has (`searches` too), and the
# synchronized switch moves them with the table.
TABLE = {"kind": "table", "key_field": "category", "partitions": 1, "tiers": []}
# An event is looked up as of min(its time, its append time), and on Kafka the broker stamps the
# append time: the events are timed an hour or more ahead of their appends (`future_base`), so
# every lookup is as of the append time on both logs and a table change is seen by the events
# appended after it. Their streams accept that skew.
AHEAD = {"max_future_skew": "3h"}
FED_OLD = {**JOINED_OLD, "streams": {
    **JOINED_OLD["streams"], "categories": {**TABLE, "dimensions": ["group"]},
    "clicks": {**JOINED_OLD["streams"]["clicks"], **AHEAD},
    "searches": {**JOINED_OLD["streams"]["searches"], **AHEAD,
                 "enrich": [{"table": "categories", "by": "category", "columns": ["group"]}]}}}
FED_NEW = {**FED_OLD, "streams": {
    **FED_OLD["streams"], "categories": {**TABLE, "dimensions": ["group", "shelf"]},
    "searches": {**FED_OLD["streams"]["searches"],
                 "enrich": [{"table": "categories", "by": "category", "columns": ["group", "shelf"]}]}}}


def future_base() -> int:
    """An hour boundary one to two hours ahead: the timelines' seconds count from it (the pattern's
    reach 45 minutes past it)."""
    return (int(time.time() * 1000) // 3_600_000 + 2) * 3_600_000


def change_categories(traffic: JoinTraffic, catalog: Catalog, rows: list[dict]) -> None:
    """Changes of the table `categories` appended apart from the searches before and after them (a
    few ms each side: no append time shared with either, whichever log stamps it), so the searches
    appended after them see them and none before does, however batches cut the log."""
    table = catalog.streams["categories"]
    time.sleep(0.005)
    at = int(time.time() * 1000)
    traffic.log.append(table, [TableRowValidator(table).validate(r, at) for r in rows], at)
    time.sleep(0.005)


def test_a_reprocess_of_a_table_whose_enriched_stream_feeds_a_join_rebuilds_the_join_switched_in_step(
        tmp_path, spark, log_backend, store_backend):
    with SwitchScenario(tmp_path, spark, log_backend, FED_OLD, FED_NEW, batch=200) as scenario:
        traffic = JoinTraffic(scenario.log, scenario.catalog, future_base())
        rng = random.Random(7)

        def categories() -> None:
            """Changes of both categories, seen by the searches appended from now on."""
            change_categories(traffic, scenario.catalog, [
                {"category": c, "_deleted": True} if rng.random() < 0.2 else
                {"category": c, "group": rng.choice(["media", "fun"]), "shelf": rng.choice(["a", "b", "c"])}
                for c in ("books", "games")])

        # After the run: all three appended to and read the old way by the serving pipeline, then
        # changes, searches and clicks it has not read when the switch comes; then ten minutes on
        # (every pipeline's join clock passes the state above), read with them when the serving
        # pipeline restarts. That backlog under max_records_per_batch (20 searches ten minutes on
        # are enough to move the clock): on Kafka the serving pipeline's batches are Spark's
        # source's, which shares one in proportion to each partition's backlog and can enrich a
        # search before a change appended ahead of it is read (docs/tables.md "In the pipeline");
        # the run's are planned the embedded way.
        done = scenario.switch_of(
            "categories", first=traffic.phase("first", 150, 0, lambda ids: ids["first"], categories),
            changed=traffic.phase("second", 150, 150, lambda ids: ids["first"][100:] + ids["second"], categories),
            after_run=traffic.phase("third", 100, 300, lambda ids: ids["second"][100:] + ids["third"], categories),
            at_switch=traffic.phase("fourth", 30, 400, lambda ids: ids["third"] + ids["fourth"], categories),
            after_switch=traffic.phase("late", 20, 900, lambda ids: ids["late"], categories),
            caught_up=plain_switch_refused("feeds join 'search_clicks'.*sketchboard reprocess categories --switch"),
            # The whole log in one batch: no batch plan can change its answer.
            reference_batch=1_000_000)
        root, reference = done.root, done.reference
        assert done.switched["enriched"] == ["searches"] and done.service.changes() == {}
        pairs, unmatched = join_totals(reference)
        assert pairs > 100 and unmatched > 10
        assert join_totals(root) == (pairs, unmatched)
        for stream in ("search_clicks", "searches", "clicks"):
            assert panes(root, stream) == panes(reference, stream), stream
        shelves = {json.loads(d).get("shelf") for _, d in panes(root, "searches")}
        assert shelves >= {"", "a", "b"}  # enriched the new way, misses ("") included
        assert root.progress("main").streams["searches"].enrich_misses == \
            reference.progress("reference").streams["searches"].enrich_misses
        assert root.table_versions("categories") == reference.table_versions("categories")


# The same with a pattern over both streams instead of the join (its state and matches, like the
# join's, are rebuilt by the table's run and moved by its synchronized switch); a lateness past the
# whole timeline, as in tests/spark/test_reprocess_joins.py, so no record is late however batches
# cut the log.
FED_PATTERN_OLD = {**PATTERN_OLD, "streams": {
    **PATTERN_OLD["streams"], "categories": FED_OLD["streams"]["categories"],
    "clicks": {**PATTERN_OLD["streams"]["clicks"], **AHEAD},
    "searches": {**PATTERN_OLD["streams"]["searches"], **AHEAD, "enrich": FED_OLD["streams"]["searches"]["enrich"]}}}
FED_PATTERN_NEW = {**FED_PATTERN_OLD, "streams": {
    **FED_PATTERN_OLD["streams"], "categories": FED_NEW["streams"]["categories"],
    "searches": {**FED_PATTERN_OLD["streams"]["searches"], "enrich": FED_NEW["streams"]["searches"]["enrich"]}}}


def test_a_reprocess_of_a_table_whose_enriched_stream_feeds_a_pattern_rebuilds_its_matches_switched_in_step(
        tmp_path, spark, log_backend, store_backend):
    with SwitchScenario(tmp_path, spark, log_backend, FED_PATTERN_OLD, FED_PATTERN_NEW, batch=200) as scenario:
        traffic = JoinTraffic(scenario.log, scenario.catalog, future_base())
        timeline = Timeline(traffic, 450)
        rng = random.Random(7)

        def upto(searches: int, clicks: int) -> Callable[[], None]:
            """A change of both categories seen from the first search not appended yet, then the
            searches before second `searches` and the clicks before `clicks`."""
            def append() -> None:
                change_categories(traffic, scenario.catalog, [
                    {"category": c, "group": rng.choice(["media", "fun"]), "shelf": rng.choice(["a", "b", "c"])}
                    for c in ("books", "games")])
                timeline.upto(searches, clicks)()
            return append

        def late() -> None:
            """The rest, then 40 minutes on (the pattern's watermark passes the above)."""
            upto(10_000, 10_000)()
            traffic.ids = 1_000
            traffic.clicks(traffic.searches(50, 2_500), 2_500)

        # After the run: read by the serving pipeline before the switch; then left unread by it,
        # read when it restarts (as `sketchboard pipeline` does after a switch); then the rest,
        # then one batch more each (a pattern's watermark is its streams' as of the batch before).
        # Each backlog under max_records_per_batch, as for the join: the rest is read apart.
        done = scenario.switch_of(
            "categories", first=upto(150, 120), changed=upto(300, 250), after_run=upto(400, 350),
            at_switch=upto(430, 420), after_restart=late,
            tail=lambda: traffic.clicks(traffic.searches(10, 2_600), 2_600),
            reference_batch=1_000_000)
        root, reference = done.root, done.reference
        assert done.switched["enriched"] == ["searches"]
        want = pattern_matches(reference)
        assert len(want) > 150
        assert pattern_matches(root) == want
        for stream in ("search_click_matches", "searches", "clicks"):
            assert panes(root, stream) == panes(reference, stream), stream
        assert {json.loads(d).get("shelf") for _, d in panes(root, "searches")} >= {"a", "b"}
