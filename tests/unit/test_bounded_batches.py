"""Batches with chosen end offsets on Kafka (aggregates/bounded_batches.py): how far a run reads
each partition, how its batches are cut, the offset log entry the batch body reads its range from,
and the batch read's options (ingest/kafka_source.py range_options). Pure: no Spark, no broker."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.bounded_batches import (SplitBySpark, capped_targets, is_remainder, may_be_split, next_batch,
                                        offset_log_text, records_between, refuse_split, split_by_spark, with_starts)
from aggregates.checkpoint_moves import logged_batches, settle_last_batch
from aggregates.pipeline import PipelineConfig, batch_end_offsets
from catalog import Catalog
from ingest.kafka_source import KafkaSourceConfig, range_options

CATALOG = Catalog(streams={"searches": {"key_field": "search_id", "partitions": 2},
                           "clicks": {"key_field": "search_id", "partitions": 2}})


def test_a_capped_stream_is_read_to_its_cap_and_the_others_to_the_logs_end():
    start = {"searches": {0: 0, 1: 0}, "clicks": {0: 10, 1: 4}}
    available = {"searches": {0: 50, 1: 70}, "clicks": {0: 90, 1: 80}}
    assert capped_targets(start, available, {"clicks": {0: 40, 1: 60}}) == {
        "searches": {0: 50, 1: 70}, "clicks": {0: 40, 1: 60}}


def test_a_cap_never_moves_the_reader_back_nor_past_where_it_stands_where_the_cap_says_nothing():
    start = {"clicks": {0: 30, 1: 4}}
    available = {"clicks": {0: 90, 1: 80, 2: 5}}
    # Partition 0: capped below where the run stands (cannot happen, but never read backwards);
    # partitions 1 and 2: no cap (the serving pipeline read nothing there): not read on.
    assert capped_targets(start, available, {"clicks": {0: 20}}) == {"clicks": {0: 30, 1: 4, 2: 0}}
    # The log's end below a cap: the end.
    assert capped_targets(start, available, {"clicks": {0: 200, 1: 200, 2: 200}}) == {"clicks": {0: 90, 1: 80, 2: 5}}


@pytest.mark.parametrize("max_rows", [1, 7, 64, 1_000])
def test_batches_reach_the_targets_exactly_each_within_the_batch_limit(max_rows):
    start = {"searches": {0: 3, 1: 0}, "clicks": {0: 10, 1: 4}}
    targets = {"searches": {0: 53, 1: 71}, "clicks": {0: 40, 1: 4}}
    batches = []
    position = start
    while (end := next_batch(position, targets, max_rows)) is not None:
        assert 0 < records_between(position, end) <= max_rows
        assert all(end[s][p] >= position[s][p] for s in position for p in position[s])  # never backwards
        batches.append(end)
        position = end
    assert position == targets
    assert len(batches) == -(-records_between(start, targets) // max_rows)  # full batches but the last
    assert next_batch(targets, targets, max_rows) is None


def test_a_batch_is_shared_fairly_across_partitions():
    end = next_batch({"searches": {0: 0, 1: 0}, "clicks": {0: 0, 1: 0}},
                     {"searches": {0: 1_000, 1: 1_000}, "clicks": {0: 1_000, 1: 3}}, 103)
    assert end == {"searches": {0: 34, 1: 33}, "clicks": {0: 33, 1: 3}}


def test_partitions_not_read_yet_start_at_the_logs_start():
    assert with_starts({"searches": {0: 12}}, {"searches": {0: 5, 1: 7}, "clicks": {0: 0}}) == {
        "searches": {0: 12, 1: 7}, "clicks": {0: 0}}


def test_the_offset_log_entry_is_keyed_by_topic_and_read_back_as_the_batch_body_reads_it(tmp_path):
    config = PipelineConfig(name="run", log_path=tmp_path / "log.db", checkpoint_dir=tmp_path / "cp",
                            kafka=KafkaSourceConfig("127.0.0.1:9", topic_prefix="t."))
    metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
    text = offset_log_text({"searches": {1: 9, 0: 4}, "clicks": {0: 2}}, "t.", metadata)
    lines = text.splitlines()
    assert lines[0] == "v1" and lines[1] == metadata
    assert json.loads(lines[2]) == {"t.searches": {"0": 4, "1": 9}, "t.clicks": {"0": 2}}
    (tmp_path / "cp" / "offsets").mkdir(parents=True)
    (tmp_path / "cp" / "offsets" / "3").write_text(text)
    assert batch_end_offsets(config, CATALOG, tmp_path / "cp", 3) == {"searches": {0: 4, 1: 9}, "clicks": {0: 2}}


def test_a_batch_read_is_assigned_the_partitions_of_its_range_with_both_ends():
    config = KafkaSourceConfig("127.0.0.1:9", topic_prefix="t.", kafka_options={"security.protocol": "PLAINTEXT"})
    options = range_options(config, {"searches": {0: 4, 1: 9}, "clicks": {0: 2, 1: 5}},
                            {"searches": {0: 10, 1: 9}, "clicks": {0: 2, 1: 8}})
    assert "subscribe" not in options and "maxOffsetsPerTrigger" not in options  # a streaming query's
    assert json.loads(options["assign"]) == {"t.searches": [0], "t.clicks": [1]}  # partitions with records only
    assert json.loads(options["startingOffsets"]) == {"t.searches": {"0": 4}, "t.clicks": {"1": 5}}
    assert json.loads(options["endingOffsets"]) == {"t.searches": {"0": 10}, "t.clicks": {"1": 8}}
    assert options["kafka.isolation.level"] == "read_committed"  # as the streaming source reads
    assert options["kafka.security.protocol"] == "PLAINTEXT"
    assert range_options(config, {"clicks": {0: 2}}, {"clicks": {0: 2}}) is None


def test_a_serving_pipeline_on_kafka_that_enriches_catches_up_a_backlog_over_a_batch_in_batches_of_its_own(tmp_path):
    """`catches_up_cut`: more than max_records_per_batch to catch up, from the checkpoint's last
    logged batch (or the log's start for a new query from the earliest), with enriched streams:
    batches of its own, cut at one append time; else Spark's Kafka source (a backlog within the
    bound is one batch; a new query from the log's end is Spark's to start)."""
    from types import SimpleNamespace

    from aggregates.bounded_batches import catches_up_cut
    from ingest.log.base import PartitionOffsets

    enriched = Catalog(streams={"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan"],
                                          "partitions": 1},
                                "http_requests": {"key_field": "user_id", "dimensions": ["method"], "partitions": 2,
                                                  "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]}})
    ends = {"users": {0: PartitionOffsets(0, 8)}, "http_requests": {0: PartitionOffsets(2, 5), 1: PartitionOffsets(0, 4)}}
    offsets = lambda stream: ends.get(stream, {0: PartitionOffsets(0, 100)})  # noqa: E731
    log = SimpleNamespace(offsets=offsets, offsets_of=lambda streams: {s: offsets(s) for s in streams})

    def pipeline(catalog=enriched, max_rows=10, starting="earliest", kafka=True):
        config = PipelineConfig(name="main", log_path=tmp_path / "log.db", checkpoint_dir=tmp_path / "cp",
                                max_records_per_batch=max_rows, starting_offsets=starting,
                                kafka=KafkaSourceConfig("127.0.0.1:9", topic_prefix="t.") if kafka else None)
        return SimpleNamespace(config=config, catalog=catalog, log=log)

    assert catches_up_cut(pipeline())  # 8 + 3 + 4 = 15 records from the log's start
    assert catches_up_cut(pipeline(max_rows=15))  # all of it, but Spark's shares could lose one to rounding
    assert not catches_up_cut(pipeline(max_rows=19))  # 15 < 19 - 3 partitions: one whole batch
    assert not catches_up_cut(pipeline(starting="latest"))  # a new query from the end: Spark's
    assert not catches_up_cut(pipeline(kafka=False))  # the embedded source cuts its own batches
    assert not catches_up_cut(pipeline(catalog=CATALOG))  # nothing enriched
    (tmp_path / "cp" / "offsets").mkdir(parents=True)
    (tmp_path / "cp" / "offsets" / "0").write_text(
        offset_log_text({"users": {0: 3}, "http_requests": {0: 4, 1: 0}}, "t.", "{}"))
    assert catches_up_cut(pipeline(starting="latest", max_rows=5))  # 5 + 1 + 4 = 10 from the logged batch
    assert not catches_up_cut(pipeline(max_rows=14))


def spark_rate_limit(limit: int, start: dict, until: dict) -> dict:
    """Spark's Kafka source's `rateLimit` (KafkaMicroBatchStream, Spark 4), line for line: each
    partition with a backlog gets `limit * (size / total)` records, floored, or one where that is
    under one; never past its end."""
    sizes = {tp: end - start[tp] for tp, end in until.items() if end - start[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(until)
    out = {}
    for tp, end in until.items():
        if tp not in sizes:
            out[tp] = end
            continue
        prorate = limit * (sizes[tp] / total)
        out[tp] = min(end, start[tp] + int(math.ceil(prorate) if prorate < 1 else math.floor(prorate)))
    return out


@settings(max_examples=400, deadline=None)
@given(limit=st.integers(1, 2_000), backlog=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3_000)),
                                                      min_size=1, max_size=40))
def test_a_batch_spark_cut_short_is_always_one_that_may_be_split(limit, backlog):
    """`may_be_split` never says no to a batch Spark's `maxOffsetsPerTrigger` cut short (some
    partition not read to the end it found), whatever the partitions' backlogs; and says no to
    every batch of fewer records than the limit less its partitions."""
    start = {("t", p): lo for p, (lo, _) in enumerate(backlog)}
    until = {("t", p): lo + size for p, (lo, size) in enumerate(backlog)}
    end = spark_rate_limit(limit, start, until)
    records = sum(end[tp] - start[tp] for tp in end)
    partitions = sum(1 for tp in end if end[tp] > start[tp])
    if end != until:
        assert may_be_split(records, partitions, limit), (records, partitions, limit)
    if records < limit - partitions:
        assert not may_be_split(records, partitions, limit)
    assert not may_be_split(0, 0, limit)


def test_a_batch_spark_logged_and_did_not_commit_is_planned_again_unless_the_store_has_it(tmp_path):
    """`settle_last_batch`: the last logged batch without Spark's commit is removed (with its
    checksum file) when the store has not recorded it, committed when it has."""
    offsets, commits = tmp_path / "offsets", tmp_path / "commits"
    for batch in (0, 1, 2):
        (offsets / str(batch)).parent.mkdir(exist_ok=True)
        (offsets / str(batch)).write_text(f"v1\n{{}}\n{{\"t\":{{\"0\":{batch}}}}}")
    (offsets / ".2.crc").write_text("x")
    commits.mkdir()
    for batch in (0, 1):
        (commits / str(batch)).write_text("v1\n{}")
    assert settle_last_batch(tmp_path, store_last_batch=1) == 1
    assert logged_batches(offsets) == [0, 1] and not (offsets / ".2.crc").exists()
    (offsets / "2").write_text("v1\n{}\n{}")
    assert settle_last_batch(tmp_path, store_last_batch=2) == 2  # the store has it: Spark's commit written
    assert logged_batches(commits) == [0, 1, 2]
    assert settle_last_batch(tmp_path, store_last_batch=2) == 2  # settled: nothing to do
    assert settle_last_batch(tmp_path / "none", None) is None


def test_a_spark_batch_that_may_be_split_is_refused_before_anything_is_stored(tmp_path):
    """`refuse_split`, on Kafka with enriched streams: a batch Spark planned that may have been
    cut short by partition raises SplitBySpark (its mark is what the query's failure carries);
    a smaller one, one the store has, the first of a query from the log's end, one of a pipeline
    that enriches nothing or reads the embedded log pass."""
    from types import SimpleNamespace

    from ingest.log.base import PartitionOffsets

    enriched = Catalog(streams={"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan"],
                                          "partitions": 1},
                                "http_requests": {"key_field": "user_id", "dimensions": ["method"], "partitions": 2,
                                                  "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]}})
    # Every record appended in one millisecond: a table's unread records were appended at or before
    # the batch's newest event (a split that matters: tested apart below).
    log = SimpleNamespace(offsets=lambda stream: {p: PartitionOffsets(2, 100) for p in range(2)},
                          offsets_of=lambda streams: {s: {p: PartitionOffsets(2, 100) for p in range(2)} for s in streams},
                          ingest_time_ms=lambda stream, partition, offset: 1_000,
                          first_appended_after=lambda stream, starts, cut: {p: None for p in starts})

    def pipeline(start, end, *, catalog=enriched, stored=None, starting="earliest", kafka=True, max_rows=10):
        config = PipelineConfig(name="main", log_path=tmp_path / "log.db", checkpoint_dir=tmp_path / "cp",
                                max_records_per_batch=max_rows, starting_offsets=starting,
                                kafka=KafkaSourceConfig("127.0.0.1:9", topic_prefix="t.") if kafka else None)
        return SimpleNamespace(config=config, catalog=catalog, log=log, logged_offsets=lambda batch_id: (start, end),
                               store=SimpleNamespace(last_batch_id=lambda name: stored))

    split = ({"users": {0: 10}, "http_requests": {0: 4, 1: 7}}, {"users": {0: 16}, "http_requests": {0: 5, 1: 8}})
    with pytest.raises(SplitBySpark) as refused:
        refuse_split(pipeline(*split), 3)  # 8 records in 3 partitions, 8 >= 10 - 3
    assert split_by_spark(f"StreamingQueryException: ... {refused.value}")
    refuse_split(pipeline(*split, max_rows=12), 3)  # 8 < 12 - 3: the whole backlog
    refuse_split(pipeline(*split, stored=3), 3)  # a replay the store has: skipped anyway
    refuse_split(pipeline(*split, catalog=CATALOG), 3)
    refuse_split(pipeline(*split, kafka=False), 3)
    refuse_split(pipeline({}, {"users": {0: 9}}, starting="latest"), 0)  # where Spark's query started
    with pytest.raises(SplitBySpark):  # 9 records from the log's start (2), 9 >= 10 - 1
        refuse_split(pipeline({}, {"users": {0: 2}, "http_requests": {0: 11}}), 0)
    refuse_split(pipeline({}, {"users": {0: 2}, "http_requests": {0: 10}}), 0)  # 8 from 2; 10 from 0 would be refused
    refuse_split(pipeline({}, {"users": {0: 11}}), 0)  # no enriched event read: a table's share alone is harmless
    # A partition new to the query counts from the log's start, not from 0: 1 + (8 - 2) = 7 < 10 - 2.
    refuse_split(pipeline({"users": {0: 10}}, {"users": {0: 11}, "http_requests": {0: 8}}), 4)


def test_a_split_matters_only_where_a_table_stops_before_a_change_appended_ahead_of_an_event_read():
    """`reads_an_event_before_a_change`: the batch's newest enriched event against each table
    partition's first unread record (the log's append times): a table read past every change
    appended by then, a batch of no enriched event, or a table read to the log's end: harmless;
    a table stopping before a change appended before that event: it matters; an append time the
    log cannot tell: it may."""
    from types import SimpleNamespace

    from aggregates.bounded_batches import reads_an_event_before_a_change
    from ingest.log.base import PartitionOffsets

    catalog = Catalog(streams={"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan"],
                                         "partitions": 1},
                               "http_requests": {"key_field": "user_id", "dimensions": ["method"], "partitions": 1,
                                                 "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]},
                               "orders": {"key_field": "id", "partitions": 1}})
    appended = {"users": [10, 20, 30, 40], "http_requests": [15, 25, 35], "orders": [1, 50]}

    def first_appended_after(stream, starts, cut):
        times = appended[stream]
        return {p: next((o for o in range(at, len(times)) if times[o] > cut), None) for p, at in starts.items()}

    def log(known=True):
        return SimpleNamespace(
            offsets=lambda stream: {0: PartitionOffsets(0, len(appended[stream]))},
            ingest_time_ms=lambda stream, partition, offset: appended[stream][offset] if known else None,
            first_appended_after=first_appended_after)

    def matters(start, end, known=True):
        return reads_an_event_before_a_change(SimpleNamespace(catalog=catalog, log=log(known)), start, end)

    # Events up to 25 read, users up to 20: the next change (30) came after them.
    assert not matters({}, {"users": {0: 2}, "http_requests": {0: 2}, "orders": {0: 2}})
    # Events up to 35 read, users only to 20: the change at 30 is read a batch after the event at 35.
    assert matters({}, {"users": {0: 2}, "http_requests": {0: 3}})
    # The same with users read to the log's end: nothing left to read late.
    assert not matters({}, {"users": {0: 4}, "http_requests": {0: 3}})
    # No enriched event in the batch (orders only, users partly): harmless.
    assert not matters({"http_requests": {0: 3}}, {"users": {0: 1}, "http_requests": {0: 3}, "orders": {0: 2}})
    # The log cannot tell the event's append time: it may matter.
    assert matters({}, {"users": {0: 2}, "http_requests": {0: 2}}, known=False)


def test_a_rest_is_less_than_a_full_batch():
    """The serving loop plans a rest after the running batch; a full batch's worth is read ahead."""
    assert is_remainder(1, 40) and is_remainder(39, 40)
    assert not is_remainder(40, 40) and not is_remainder(41, 40)
