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

import io
import json
import random
import time

import pytest
import yaml

from catalog import Catalog
from ingest.tables import TableRowValidator
from sketchboard.reprocess import build_reprocess_service, run_reprocess, switch_run
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline
from store.definitions import DefinitionStore
from tests.log_backends import ON_BOTH_LOGS
from tests.spark.test_reprocess_joins import OLD as JOINED_OLD, PATTERN_OLD, Timeline, Traffic as JoinTraffic, \
    join_totals, panes, pattern_matches

pytestmark = [pytest.mark.spark, ON_BOTH_LOGS]


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
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(FED_OLD))
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None, max_records_per_batch=200,
                        **test_log.settings())
    base = future_base()
    new_catalog = Catalog(**FED_NEW)
    traffic = JoinTraffic(test_log.open(new_catalog), new_catalog, base)
    rng = random.Random(7)

    def categories() -> None:
        """Changes of both categories, seen by the searches appended from now on."""
        change_categories(traffic, new_catalog, [
            {"category": c, "_deleted": True} if rng.random() < 0.2 else
            {"category": c, "group": rng.choice(["media", "fun"]), "shelf": rng.choice(["a", "b", "c"])}
            for c in ("books", "games")])

    categories()
    first = traffic.searches(150, 0)
    traffic.clicks(first, 0)
    main = build_pipeline(settings, spark)
    main.run_until_drained()
    main.store.close()
    config.write_text(yaml.safe_dump(FED_NEW))
    categories()
    second = traffic.searches(150, 150)
    traffic.clicks(first[100:] + second, 150)
    main = build_pipeline(settings, spark)
    root = main.store
    reference = None
    try:
        main.run_until_drained()
        run = run_reprocess(settings, "categories", spark=spark, out=io.StringIO(), interval_s=0.05)
        assert run.state == "caught_up"
        service = build_reprocess_service(settings, new_catalog, root, traffic.log)
        with pytest.raises(ValueError, match="feeds join 'search_clicks'.*sketchboard reprocess categories --switch"):
            service.switch(run.id)  # a plain switch (the API's) cannot run the run's final batch
        # After the run: all three appended to and read the old way by the serving pipeline, then
        # changes, searches and clicks it has not read when the switch comes.
        categories()
        third = traffic.searches(100, 300)
        traffic.clicks(second[100:] + third, 300)
        main.run_until_drained()
        categories()
        fourth = traffic.searches(30, 400)
        traffic.clicks(third + fourth, 400)
        switched = switch_run(settings, service, service.run(run.id), spark, root)
        assert switched["serving_version"] == run.version and switched["enriched"] == ["searches"]
        assert service.changes() == {} and DefinitionStore(root.side_db()).holds() == {}
        # After the switch the serving pipeline restarts (as `sketchboard pipeline` does) and reads
        # what it left unread; then ten minutes on: every pipeline's join clock passes the state
        # above. Each backlog under max_records_per_batch: on Kafka the serving pipeline's batches
        # are Spark's source's, which shares one in proportion to each partition's backlog and can
        # enrich a search before a change appended ahead of it is read (docs/tables.md "In the
        # pipeline"); the run's are planned the embedded way.
        again = build_pipeline(settings, spark)
        again.run_until_drained()
        categories()
        late = traffic.searches(50, 900)
        traffic.clicks(late, 900)
        again.run_until_drained()
        again.store.close()
        # The whole log in one batch: no batch plan can change its answer.
        reference = build_pipeline(settings.model_copy(update={"max_records_per_batch": 1_000_000}), spark,
                                   name="reference", starting_offsets="earliest")
        reference.run_until_drained()
        pairs, unmatched = join_totals(reference.store)
        assert pairs > 100 and unmatched > 10
        assert join_totals(root) == (pairs, unmatched)
        for stream in ("search_clicks", "searches", "clicks"):
            assert panes(root, stream) == panes(reference.store, stream), stream
        shelves = {json.loads(d).get("shelf") for _, d in panes(root, "searches")}
        assert shelves >= {"", "a", "b"}  # enriched the new way, misses ("") included
        assert root.progress("main").streams["searches"].enrich_misses == \
            reference.store.progress("reference").streams["searches"].enrich_misses
        assert root.table_versions("categories") == reference.store.table_versions("categories")
    finally:
        if reference is not None:
            reference.store.close()
        root.close()
        traffic.log.close()


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
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(FED_PATTERN_OLD))
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None, max_records_per_batch=200,
                        **test_log.settings())
    base = future_base()
    new_catalog = Catalog(**FED_PATTERN_NEW)
    traffic = JoinTraffic(test_log.open(new_catalog), new_catalog, base)
    timeline = Timeline(traffic, 450)
    rng = random.Random(7)

    def searches_until(second: int) -> None:
        """A change of both categories seen from the first search not appended yet, then those searches."""
        change_categories(traffic, new_catalog, [
            {"category": c, "group": rng.choice(["media", "fun"]), "shelf": rng.choice(["a", "b", "c"])}
            for c in ("books", "games")])
        timeline.until("searches", second)

    searches_until(150)
    timeline.until("clicks", 120)
    main = build_pipeline(settings, spark)
    main.run_until_drained()
    main.store.close()
    config.write_text(yaml.safe_dump(FED_PATTERN_NEW))
    searches_until(300)
    timeline.until("clicks", 250)
    main = build_pipeline(settings, spark)
    root = main.store
    reference = None
    try:
        main.run_until_drained()
        run = run_reprocess(settings, "categories", spark=spark, out=io.StringIO(), interval_s=0.05)
        assert run.state == "caught_up"
        service = build_reprocess_service(settings, new_catalog, root, traffic.log)
        # After the run: read by the serving pipeline before the switch; then left unread by it.
        searches_until(400)
        timeline.until("clicks", 350)
        main.run_until_drained()
        searches_until(430)
        timeline.until("clicks", 420)
        switched = switch_run(settings, service, service.run(run.id), spark, root)
        assert switched["serving_version"] == run.version and switched["enriched"] == ["searches"]
        assert DefinitionStore(root.side_db()).holds() == {}
        # The serving pipeline restarts (as `sketchboard pipeline` does after a switch) and reads
        # what it left unread; then the rest, then 40 minutes on (the pattern's watermark passes the
        # above), then one batch more each. Each backlog under max_records_per_batch, as for the join.
        again = build_pipeline(settings, spark)
        again.run_until_drained()
        searches_until(10_000)
        timeline.until("clicks", 10_000)
        traffic.ids = 1_000
        late = traffic.searches(50, 2_500)
        traffic.clicks(late, 2_500)
        again.run_until_drained()
        reference = build_pipeline(settings.model_copy(update={"max_records_per_batch": 1_000_000}), spark,
                                   name="reference", starting_offsets="earliest")
        reference.run_until_drained()
        traffic.clicks(traffic.searches(10, 2_600), 2_600)
        for pipeline in (again, reference):
            pipeline.run_until_drained()
        again.store.close()
        want = pattern_matches(reference.store)
        assert len(want) > 150
        assert pattern_matches(root) == want
        for stream in ("search_click_matches", "searches", "clicks"):
            assert panes(root, stream) == panes(reference.store, stream), stream
        assert {json.loads(d).get("shelf") for _, d in panes(root, "searches")} >= {"a", "b"}
    finally:
        if reference is not None:
            reference.store.close()
        root.close()
        traffic.log.close()
