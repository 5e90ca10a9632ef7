"""Batches with chosen end offsets on Kafka (aggregates/bounded_batches.py): a pipeline given
`end_offsets` reads a capped stream exactly to its caps and the others to the log's end, in
batches of at most max_records_per_batch, each logged in its Spark checkpoint; a batch logged but
not committed (a crash) runs again with its range, counted once; and Spark's own Kafka source
resumes from that checkpoint where the batches stopped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from aggregates.bounded_batches import offset_log_text
from aggregates.checkpoint_moves import logged_batches
from catalog import Catalog
from ingest.events import EventValidator
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline

pytestmark = [pytest.mark.spark, pytest.mark.kafka,
              pytest.mark.parametrize("log_backend", ["kafka"], indirect=True, scope="module")]

STREAM = {"key_field": "k", "partitions": 2, "dimensions": ["d"], "tiers": []}
CATALOG = {"streams": {"a": STREAM, "b": STREAM}}


def counted(store, stream: str) -> int:
    return sum(p.data.count for p in store.read_panes(stream, 0, 2**62))


def test_batches_with_chosen_end_offsets_stop_at_the_caps_replay_once_and_resume_in_spark(tmp_path, spark,
                                                                                           log_backend):
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(CATALOG))
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None, max_records_per_batch=40,
                        **test_log.settings())
    catalog = Catalog(**CATALOG)
    log = test_log.open(catalog)
    now = int(time.time() * 1000)
    sent = {"a": 0, "b": 0}

    def append(stream: str, n: int) -> None:
        validator = EventValidator(catalog.stream(stream))
        log.append(catalog.stream(stream), [validator.validate({"time": now, "k": f"k{sent[stream] + i}", "d": "x"})
                                            for i in range(n)], now)
        sent[stream] += n

    append("a", 100)
    append("b", 90)
    caps = {p: o.end // 2 for p, o in log.offsets("b").items()}
    pipeline = build_pipeline(settings, spark, name="run", starting_offsets="earliest", end_offsets={"b": caps})
    checkpoint = Path(pipeline.config.checkpoint_dir)
    try:
        pipeline.run_until_drained()
        assert counted(pipeline.store, "a") == 100 and counted(pipeline.store, "b") == sum(caps.values())
        logged = test_log.end_offsets(catalog, checkpoint, logged_batches(checkpoint / "offsets")[-1])
        assert logged["b"] == caps and logged["a"] == {p: o.end for p, o in log.offsets("a").items()}
        batches = logged_batches(checkpoint / "commits")
        assert len(batches) == -(-(100 + sum(caps.values())) // 40)  # full batches of 40 but the last
        assert pipeline.store.last_batch_id("run") == batches[-1]

        # A crash after a batch was logged, before it ran: the next drain runs it with its range, once.
        append("a", 20)
        crashed = batches[-1] + 1
        ends = {"a": {p: o.end for p, o in log.offsets("a").items()}, "b": caps}
        metadata = (checkpoint / "offsets" / str(batches[-1])).read_text().splitlines()[1]
        (checkpoint / "offsets" / str(crashed)).write_text(offset_log_text(ends, test_log.prefix, metadata))
        append("a", 5)  # after the crashed batch's range: read by the batch after it
        pipeline.run_until_drained()
        assert crashed in logged_batches(checkpoint / "commits") and pipeline.store.last_batch_id("run") == crashed + 1
        assert counted(pipeline.store, "a") == 125 and counted(pipeline.store, "b") == sum(caps.values())
    finally:
        pipeline.store.close()

    # Spark's own Kafka source, from the same checkpoint: b read on from its caps, a from its end.
    append("b", 10)
    streaming = build_pipeline(settings, spark, name="run")
    try:
        streaming.run_until_drained()
        assert counted(streaming.store, "a") == 125 and counted(streaming.store, "b") == 100
    finally:
        streaming.store.close()
        log.close()
