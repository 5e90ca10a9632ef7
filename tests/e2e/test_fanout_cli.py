"""Fan-out as a user runs it: `sketchboard pipeline --once` (the serving pipeline), then
`sketchboard pipeline --once --name audit --from earliest` as its own process over the same
embedded log and data directory. The named pipeline replays the log into a store of its own
(data/pipelines/audit/store.db) with exactly the serving pipeline's panes, and registers itself
in the root store's consumer registry with the log's end offsets. tests/spark/test_fanout.py
covers the same in-process on both logs; this one is the CLI's flags and wiring."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from store import SqlitePaneStore
from store.consumers import ConsumerRegistry
from tests.spark.events import assert_panes_exact, http_events

pytestmark = [pytest.mark.e2e, pytest.mark.spark]


def pipeline(root, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SKETCHBOARD_SETTINGS_FILE": str(root / "sketchboard.yaml")}
    return subprocess.run([sys.executable, "-m", "sketchboard.cli", "pipeline", "--once", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_named_pipeline_started_from_earliest_replays_into_its_own_store(tmp_path, demo_catalog):
    (tmp_path / "sketchboard.yaml").write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"),
                                                                "spark_driver_memory": "1g"}))
    stream = demo_catalog.stream("http_requests")
    events = http_events(3000, seed=21)
    log = SqliteEventLog(tmp_path / "data" / "log.db")
    for s in demo_catalog.streams.values():
        log.ensure_topic(s)
    log.append(stream, [EventValidator(stream).validate(e) for e in events], int(time.time() * 1000))
    ends = {p: o.end for p, o in log.offsets("http_requests").items()}
    log.close()

    served = pipeline(tmp_path)
    assert served.returncode == 0, served.stderr[-3000:]
    audit = pipeline(tmp_path, "--name", "audit", "--from", "earliest")
    assert audit.returncode == 0, audit.stderr[-3000:]

    root = SqlitePaneStore(tmp_path / "data" / "store.db")
    own = SqlitePaneStore(tmp_path / "data" / "pipelines" / "audit" / "store.db")
    try:
        assert_panes_exact(root, events)
        assert_panes_exact(own, events)  # the same panes, replayed from the earliest offset
        assert own.progress("audit").end_offsets["http_requests"] == ends
        assert root.last_batch_id("audit") is None  # nothing of audit's in the serving store
    finally:
        root.close()
        own.close()
    registry = ConsumerRegistry(tmp_path / "data" / "store.db")
    try:
        consumers = {c.pipeline: c for c in registry.consumers()}
        copied = registry.offsets("audit")
    finally:
        registry.close()
    assert consumers["audit"].started_from == "earliest" and consumers["audit"].namespace == "audit"
    assert copied["http_requests"] == ends  # the offsets the API reads audit's lag from
