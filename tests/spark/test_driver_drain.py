"""The embedded log drained on the driver in batches of the pipeline's own (aggregates/bounded_batches.py
`drains_on_driver`): with every batch held on the driver (a local master), a backlog is planned as
the embedded source plans it and processed with no Spark query at all; each batch logged in the
query's checkpoint in the very text the source gives Spark, so Spark's query resumes there with no
batch of its own until new records come; a batch logged but not committed (a crash) runs again
with its range, counted once; a new checkpoint keeps where it started, as the source pins it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from aggregates.bounded_batches import drain_bounded, records_between
from aggregates.checkpoint_moves import logged_batches
from aggregates.pipeline import drain
from aggregates.read_ahead import ReadAhead
from catalog import Catalog
from demo import DemoTraffic
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from ingest.spark_source import initial_offsets, offsets_text
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline
from store.health import query_health

pytestmark = [pytest.mark.spark]

STREAM = {"key_field": "k", "partitions": 2, "dimensions": ["d"], "tiers": []}
CATALOG = {"streams": {"a": STREAM, "b": STREAM}}


def counted(store, stream: str) -> int:
    return sum(p.data.count for p in store.read_panes(stream, 0, 2**62))


def no_query(**_) -> None:
    pytest.fail("the pipeline started a Spark query to drain a backlog it holds on the driver")


class Log:
    def __init__(self, root: Path, catalog: Catalog, log=None):
        """The embedded log under `root`, or `log` (another backend's, tests/log_backends.py)."""
        self.catalog, self.sent = catalog, {"a": 0, "b": 0}
        self.log = log if log is not None else SqliteEventLog(root / "log.db")
        for stream in catalog.streams.values():
            self.log.ensure_topic(stream)

    def append(self, stream: str, n: int) -> None:
        now = int(time.time() * 1000)
        validator = EventValidator(self.catalog.stream(stream))
        self.log.append(self.catalog.stream(stream), [validator.validate({"time": now, "k": f"k{self.sent[stream] + i}",
                                                                          "d": "x"}) for i in range(n)], now)
        self.sent[stream] += n

    def ends(self) -> dict[str, dict[int, int]]:
        return {s: {p: o.end for p, o in self.log.offsets(s).items()} for s in self.catalog.streams}


@pytest.fixture
def small(tmp_path):
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(CATALOG))
    catalog = Catalog(**CATALOG)
    log = Log(tmp_path / "data", catalog)
    yield tmp_path, config, catalog, log
    log.log.close()


def settings_for(tmp_path: Path, config: Path, **kwargs) -> Settings:
    return Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None,
                    **{"log_backend": "embedded", "max_records_per_batch": 40, **kwargs})


def read_ahead_taken(monkeypatch) -> list[int]:
    """How many rows each batch's read-ahead handed over (aggregates/read_ahead.py); 0 where the
    pipeline read the batch itself. Each take first waits for the worker to have started, and
    waits for its read as long as it takes (a batch otherwise reads itself what the worker has not
    read as soon: how soon is the machine's, not what these tests are about)."""
    taken, take = [], ReadAhead.take

    def counting(self, catalog, start, end):
        if self.started is not None:
            assert self.started.wait(60), "the read-ahead worker did not start"
        self.read_here(1, 60.0)
        rows = take(self, catalog, start, end)
        taken.append(0 if rows is None else rows.num_rows)
        return rows

    monkeypatch.setattr(ReadAhead, "take", counting)
    return taken


def backlog(small, spark, **settings):
    """The two-stream log with a backlog of 190 events, and a pipeline on it that must not start a query."""
    tmp_path, config, catalog, log = small
    log.append("a", 100)
    log.append("b", 90)
    pipeline = build_pipeline(settings_for(tmp_path, config, **settings), spark, name="main")
    pipeline.start = no_query
    return pipeline, Path(pipeline.config.checkpoint_dir)


def test_a_backlog_drains_in_batches_of_our_own_without_a_query_replays_once_and_resumes_in_spark(small, spark,
                                                                                                  monkeypatch):
    tmp_path, config, catalog, log = small
    pipeline, checkpoint = backlog(small, spark)
    taken = read_ahead_taken(monkeypatch)
    try:
        pipeline.run_until_drained()
        assert counted(pipeline.store, "a") == 100 and counted(pipeline.store, "b") == 90
        batches = logged_batches(checkpoint / "commits")
        assert batches == logged_batches(checkpoint / "offsets") == list(range(-(-190 // 40)))  # 40 each but the last
        # Every batch after the first was read by the read-ahead worker while the one before ran.
        assert taken == [0, 40, 40, 40, 30] and pipeline.read_ahead is None
        assert pipeline.store.last_batch_id("main") == batches[-1]
        # Batch 0's start pinned where the source pins it; every batch's offsets in the source's own text.
        assert initial_offsets(checkpoint) == {"a": {0: 0, 1: 0}, "b": {0: 0, 1: 0}}
        lines = [(checkpoint / "offsets" / str(b)).read_text().splitlines() for b in batches]
        assert all(len(line) == 3 and line[0] == "v1" and line[2] == offsets_text(json.loads(line[2])) for line in lines)
        assert json.loads(lines[-1][2]) == {s: {str(p): o for p, o in parts.items()} for s, parts in log.ends().items()}
        # No Spark query, but the query's health tells the run and each batch (GET /api/v1/pipeline).
        health = query_health(pipeline.health, "main", int(time.time() * 1000))
        assert health["run_id"].startswith("own-") and not health["running"] and health["last_error"] is None
        assert health["batch_id"] == batches[-1] and health["num_input_rows"] == 190 - 40 * batches[-1]
        assert health["query_id"] == json.loads((checkpoint / "metadata").read_text())["id"]

        # A crash after a batch was logged, before it ran: the next drain runs it with its range, once.
        log.append("a", 20)
        crashed = batches[-1] + 1
        (checkpoint / "offsets" / str(crashed)).write_text("\n".join(lines[-1][:2] + [offsets_text(log.ends())]))
        log.append("a", 5)  # after the crashed batch's range: read by the batch after it
        pipeline.run_until_drained()
        assert logged_batches(checkpoint / "commits")[-2:] == [crashed, crashed + 1]
        assert pipeline.store.last_batch_id("main") == crashed + 1
        assert counted(pipeline.store, "a") == 125 and counted(pipeline.store, "b") == 90
    finally:
        pipeline.store.close()

    # Spark's own query over the same checkpoint (batches too big for the driver): nothing new, no
    # batch at all, not even an empty one; then only what came after.
    spark_side = build_pipeline(settings_for(tmp_path, config, driver_batch_rows=10), spark, name="main")
    try:
        before = logged_batches(checkpoint / "offsets")
        drain(spark_side.start(available_now=True), "pipeline")
        assert logged_batches(checkpoint / "offsets") == before
        log.append("b", 10)
        spark_side.run_until_drained()
        assert logged_batches(checkpoint / "offsets") == before + [before[-1] + 1]
        assert counted(spark_side.store, "a") == 125 and counted(spark_side.store, "b") == 100
    finally:
        spark_side.store.close()


def batch_sizes(checkpoint: Path) -> list[int]:
    """Records per logged batch, from the checkpoint's offset log."""
    ends = [sum(o for parts in json.loads((checkpoint / "offsets" / str(b)).read_text().splitlines()[2]).values()
                for o in parts.values()) for b in logged_batches(checkpoint / "offsets")]
    return [b - a for a, b in zip([0, *ends], ends)]


def read_ahead_asked(monkeypatch) -> list[int]:
    """How many records each range handed to the read-ahead worker holds."""
    asked, ask = [], ReadAhead.ask

    def counting(self, catalog, start, end, left=None):
        asked.append(records_between(start, end))
        return ask(self, catalog, start, end, left)

    monkeypatch.setattr(ReadAhead, "ask", counting)
    return asked


def arriving_during(pipeline, log, batches: set[int], records: int) -> None:
    """`records` more for stream a appended while each batch of `batches` (counted from 0) runs."""
    process, ran = pipeline.process_batch, []

    def arriving(*args, **kwargs):
        if len(ran) in batches:
            log.append("a", records)
        ran.append(True)
        return process(*args, **kwargs)

    pipeline.process_batch = arriving


@pytest.mark.parametrize("serving", [True, False], ids=["serving loop", "available now"])
@pytest.mark.parametrize("rest", [3, 30], ids=["a rest of 3", "a rest of three quarters of a batch"])
def test_a_rest_of_a_serving_loops_backlog_is_planned_with_what_came_while_the_batch_before_ran(
        small, spark, monkeypatch, serving, rest):
    """(bounded_batches.is_remainder) In the serving loop's drain, the rest of a backlog, less
    than a batch, is not read ahead; it is planned when the batch before it ends, so the
    records that came meanwhile join it instead of making a batch of their own after it. Any other
    drain (`--once`, a reprocessing run, a switch's final batch) stops at the log's end as of its start."""
    tmp_path, config, catalog, log = small
    log.append("a", 40 + rest)
    log.append("b", 40)  # batches of 40, 40, and the rest
    pipeline = build_pipeline(settings_for(tmp_path, config), spark, name="main")
    pipeline.start = no_query
    taken, asked = read_ahead_taken(monkeypatch), read_ahead_asked(monkeypatch)
    # A worker started for any backlog (test_read_ahead.py tests for which): what is read ahead is the question here.
    monkeypatch.setattr("aggregates.read_ahead.WORTH_STARTING", 0)
    arriving_during(pipeline, log, {1}, 5)
    try:
        drain_bounded(pipeline, {}, follow_rest=serving)
        sizes = batch_sizes(Path(pipeline.config.checkpoint_dir))
        if serving:
            assert sizes == [40, 40, rest + 5] and asked == [40] and taken == [0, 40, 0]  # the rest: read here
            assert counted(pipeline.store, "a") == 45 + rest and counted(pipeline.store, "b") == 40
        else:
            assert sizes == [40, 40, rest] and asked == [40, rest] and taken == [0, 40, rest]
            assert counted(pipeline.store, "a") == 40 + rest and counted(pipeline.store, "b") == 40
    finally:
        pipeline.store.close()


def test_a_serving_loops_drain_follows_a_rest_once_and_ends_beside_a_stream_as_fast_as_it(small, spark,
                                                                                             monkeypatch):
    """A stream that brings a batch's worth while every batch runs: the drain follows its rest
    once, then ends at the next rest, which is no batch of its own: the serving loop's next
    drain plans it with what came meanwhile. Before, that rest of 3 ran alone (the end to end's
    80 000 events, then 310 000: a batch's fixed cost twice)."""
    tmp_path, config, catalog, log = small
    log.append("a", 23)
    log.append("b", 20)  # a batch of 40 and a rest of 3
    pipeline = build_pipeline(settings_for(tmp_path, config), spark, name="main")
    pipeline.start = no_query
    arriving_during(pipeline, log, set(range(100)), 40)
    try:
        ran = drain_bounded(pipeline, {}, follow_rest=True)
        # 40; then the rest of 3 and the 40 that came: 40, and the new rest of 3 left to the next drain.
        assert batch_sizes(Path(pipeline.config.checkpoint_dir)) == [40, 40] and ran == 2
        ran = drain_bounded(pipeline, {}, follow_rest=True)  # the loop's next trigger
        assert batch_sizes(Path(pipeline.config.checkpoint_dir)) == [40, 40, 40, 40] and ran == 2
        assert counted(pipeline.store, "a") + counted(pipeline.store, "b") == 160
    finally:
        pipeline.store.close()


def test_a_new_checkpoint_from_the_logs_end_keeps_where_it_started(small, spark):
    tmp_path, config, catalog, log = small
    log.append("a", 30)
    settings = settings_for(tmp_path, config)
    first = build_pipeline(settings, spark, name="late", starting_offsets="latest")
    first.start = no_query
    try:
        first.run_until_drained()  # nothing after its start: no batch, its start kept
        assert logged_batches(Path(first.config.checkpoint_dir) / "offsets") == []
        assert initial_offsets(first.config.checkpoint_dir) == log.ends()
    finally:
        first.store.close()
    log.append("a", 7)  # between the two starts: read by the second, as Spark's query would
    second = build_pipeline(settings, spark, name="late")
    second.start = no_query
    try:
        second.run_until_drained()
        assert counted(second.store, "a") == 7
    finally:
        second.store.close()


def test_spark_resumes_a_demo_catalogs_own_batches_with_no_batch_of_its_own(tmp_path, spark):
    """The demo catalog enriches (its tables and enriched streams are cut at one append time):
    the offsets its own batches logged are still the very ones Spark's source plans from them."""
    settings = Settings(data_dir=tmp_path / "data", alerts_config=None, log_backend="embedded",
                        max_records_per_batch=3_000)
    pipeline = build_pipeline(settings, spark, name="main")
    checkpoint = Path(pipeline.config.checkpoint_dir)
    catalog = pipeline.catalog
    log = SqliteEventLog(settings.data_dir / "log.db")
    try:
        traffic = DemoTraffic(catalog, seed=3)
        validators = {name: EventValidator(s) for name, s in catalog.streams.items()}
        for name, raws in traffic.generate(8_000).items():
            log.append(catalog.stream(name), [validators[name].validate(e) for e in raws], int(time.time() * 1000))
        pipeline.start = no_query
        pipeline.run_until_drained()
        before = logged_batches(checkpoint / "offsets")
        assert len(before) >= 3 and pipeline.store.progress("main").events_read >= 8_000
    finally:
        pipeline.store.close()
    spark_side = build_pipeline(settings.model_copy(update={"driver_batch_rows": 10}), spark, name="main")
    try:
        drain(spark_side.start(available_now=True), "pipeline")
        assert logged_batches(checkpoint / "offsets") == before
    finally:
        spark_side.store.close()
        log.close()


def test_a_read_ahead_that_fails_leaves_the_batch_to_the_pipeline_with_the_same_rows(small, spark, monkeypatch):
    tmp_path, config, catalog, log = small
    monkeypatch.setattr("aggregates.read_ahead._folder", lambda: str(tmp_path / "no such folder"))  # the worker cannot write
    taken = read_ahead_taken(monkeypatch)
    reads, ask = [], ReadAhead.ask

    def asking(self, catalog, start, end, left=None):
        before = len(self.pending)
        ask(self, catalog, start, end, left)
        reads.append(len(self.pending) > before)

    monkeypatch.setattr(ReadAhead, "ask", asking)
    pipeline, _ = backlog(small, spark)
    try:
        pipeline.run_until_drained()
        assert counted(pipeline.store, "a") == 100 and counted(pipeline.store, "b") == 90
        assert taken == [0] * 5 and pipeline.store.progress("main").events_read == 190
        # Batch 2 is asked for before batch 1's read is found failed; after that, never again.
        assert reads == [True, True, False, False]
    finally:
        pipeline.store.close()


def test_a_batch_an_earlier_run_logged_larger_than_the_batches_now_runs_again_on_the_driver(small, spark):
    """A crash left a batch logged and not committed; the pipeline now has a smaller
    max_records_per_batch (so a smaller driver limit): the batch still runs again whole, once."""
    tmp_path, config, catalog, log = small
    pipeline, checkpoint = backlog(small, spark)
    try:
        (checkpoint / "metadata").parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / "metadata").write_text(json.dumps({"id": "q"}))
        (checkpoint / "offsets").mkdir()
        metadata = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}, separators=(",", ":"))
        (checkpoint / "offsets" / "0").write_text("\n".join(["v1", metadata, offsets_text(log.ends())]))
        pin = {s: {p: 0 for p in parts} for s, parts in log.ends().items()}
        (checkpoint / "sketchboard-initial-offsets.json").write_text(offsets_text(pin))
        pipeline.run_until_drained()
        assert counted(pipeline.store, "a") == 100 and counted(pipeline.store, "b") == 90
        assert logged_batches(checkpoint / "commits") == [0] and pipeline.store.last_batch_id("main") == 0
    finally:
        pipeline.store.close()


def test_a_batch_over_records_retention_dropped_counts_the_rows_it_read(small, spark):
    """A batch's input rows in the query's health were its offset span: records the log's retention
    dropped before the pipeline read them (or a compacted table's gaps) were counted as read."""
    tmp_path, config, catalog, log = small
    log.append("a", 40)
    pipeline = build_pipeline(settings_for(tmp_path, config, max_records_per_batch=1_000), spark, name="main")
    pipeline.start = no_query
    pipeline.run_until_drained()  # batch 0: 40
    log.append("a", 100)  # then dropped by the log's retention before the pipeline reads them
    assert log.log.apply_retention(int(time.time() * 1000) + 7_200_000, 3_600_000, 1 << 30) == 140
    log.append("a", 30)
    pipeline.run_until_drained()  # batch 1: offsets 40..170, 30 records left there
    assert counted(pipeline.store, "a") == 70
    health = query_health(pipeline.health, "main", int(time.time() * 1000))
    assert health["batch_id"] == 1 and health["num_input_rows"] == 30


def test_records_retention_dropped_before_the_pipeline_read_them_are_skipped_with_a_warning(small, spark, caplog):
    """docs/scale-out.md: records a Kafka topic's retention deleted are skipped with a warning, "as
    the embedded log's retention skips them"; the embedded log skipped them without a word."""
    tmp_path, config, catalog, log = small
    pipeline, checkpoint = backlog(small, spark)
    try:
        pipeline.run_until_drained()
        read_to = log.ends()
        log.append("a", 20)
        # Logged as the next batch (a crash before it ran), then retention cuts the log under it.
        lines = (checkpoint / "offsets" / "0").read_text().splitlines()
        crashed = logged_batches(checkpoint / "offsets")[-1] + 1
        (checkpoint / "offsets" / str(crashed)).write_text("\n".join(lines[:2] + [offsets_text(log.ends())]))
        planned_to = log.ends()
        log.append("a", 6)
        log.log.apply_retention(int(time.time() * 1000), max_age_ms=10**9, max_bytes_per_partition=1)  # newest only
        kept = {p: o.start for p, o in log.log.offsets("a").items()}
        lost = sum(min(planned_to["a"][p], max(kept[p], read_to["a"][p])) - read_to["a"][p] for p in kept)
        assert lost > 0
        with caplog.at_level("WARNING", logger="sketchboard.pipeline"):
            pipeline.run_until_drained()
        assert f"batch {crashed}: {lost} records of stream 'a' were dropped by the log's retention" in caplog.text
        assert "stream 'b'" not in caplog.text
        assert counted(pipeline.store, "a") == 100 + 20 - lost + 6
    finally:
        pipeline.store.close()
