"""Batches with chosen end offsets on Kafka (aggregates/bounded_batches.py): how far a run reads
each partition, how its batches are cut, the offset log entry the batch body reads its range from,
and the batch read's options (ingest/kafka_source.py range_options). Pure: no Spark, no broker."""

from __future__ import annotations

import json

import pytest

from aggregates.bounded_batches import capped_targets, next_batch, offset_log_text, records_between, with_starts
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
    log = SimpleNamespace(offsets=lambda stream: ends.get(stream, {0: PartitionOffsets(0, 100)}))

    def pipeline(catalog=enriched, max_rows=10, starting="earliest", kafka=True):
        config = PipelineConfig(name="main", log_path=tmp_path / "log.db", checkpoint_dir=tmp_path / "cp",
                                max_records_per_batch=max_rows, starting_offsets=starting,
                                kafka=KafkaSourceConfig("127.0.0.1:9", topic_prefix="t.") if kafka else None)
        return SimpleNamespace(config=config, catalog=catalog, log=log)

    assert catches_up_cut(pipeline())  # 8 + 3 + 4 = 15 records from the log's start
    assert not catches_up_cut(pipeline(max_rows=15))  # one batch either way
    assert not catches_up_cut(pipeline(starting="latest"))  # a new query from the end: Spark's
    assert not catches_up_cut(pipeline(kafka=False))  # the embedded source cuts its own batches
    assert not catches_up_cut(pipeline(catalog=CATALOG))  # nothing enriched
    (tmp_path / "cp" / "offsets").mkdir(parents=True)
    (tmp_path / "cp" / "offsets" / "0").write_text(
        offset_log_text({"users": {0: 3}, "http_requests": {0: 4, 1: 0}}, "t.", "{}"))
    assert catches_up_cut(pipeline(starting="latest", max_rows=5))  # 5 + 1 + 4 = 10 from the logged batch
    assert not catches_up_cut(pipeline(max_rows=10))
