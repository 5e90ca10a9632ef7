"""Fan-out: several named pipelines reading one log, each with its own checkpoint, offsets, store
namespace and lag, wired as `sketchboard pipeline --name N --from earliest|latest` wires them,
on both logs (the `log_backend` fixture). A pipeline started later from the earliest offset
ends with the same panes as the serving pipeline; one started from the latest sees only the
records appended after its first start. On Kafka, each pipeline's offsets are also copied to a
consumer group (kafka_commit_offsets), which must equal the store's."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from catalog import Catalog
from ingest.events import EventValidator
from sketchboard.settings import Settings
from sketchboard.wiring import build_api, build_pipeline
from sketches import HllSketch
from tests.conftest import DEMO_CONFIG
from tests.log_backends import TestLog
from tests.spark.events import T0, expected_panes, http_events

pytestmark = pytest.mark.spark

STREAM = "http_requests"


def recent_events(n: int, seed: int) -> list[dict]:
    """http_events moved to the last hour (well inside retention), with whole-number latencies,
    so sums are exact whatever order the batches add them in."""
    shift = (int(time.time() * 1000) // 3_600_000 - 1) * 3_600_000 - T0
    return [{**e, "time": e["time"] + shift, "latency_ms": float(round(e["latency_ms"]))}
            for e in http_events(n, seed, users=500)]


def append(log, catalog: Catalog, events: list[dict]) -> None:
    stream = catalog.stream(STREAM)
    validator = EventValidator(stream)
    log.append(stream, [validator.validate(e) for e in events], int(time.time() * 1000))


def settings_for(log: TestLog) -> Settings:
    extra = {"kafka_commit_offsets": True} if log.kafka else {}
    return Settings(data_dir=log.root, streams_config=DEMO_CONFIG, alerts_config=None, max_records_per_task=20_000,
                    **log.settings(), **extra)


def pane_contents(store) -> dict:
    """Every pane of the stream: count, per value field n/sum/min/max, per distinct field the
    HLL estimate. Not revisions or batch ids: those say how the panes were reached."""
    out = {}
    for p in store.read_panes(STREAM, 0, 2**62, with_sketches=True):
        out[(p.key.start_ms, p.key.dims)] = (
            p.data.count,
            {name: (v.n, v.sum, v.min, v.max) for name, v in sorted(p.data.values.items())},
            {name: HllSketch.from_bytes(b).estimate().estimate for name, b in sorted(p.data.distincts.items())})
    return out


def counts(contents: dict) -> dict:
    return {k: (c, v["latency_ms"][1], v["latency_ms"][2], v["latency_ms"][3]) for k, (c, v, _) in contents.items()}


def test_named_pipelines_on_one_log_replay_identical_panes_and_report_lag_per_consumer(
        tmp_path, spark, demo_catalog, log_backend):
    test_log = log_backend.new(tmp_path / "data")
    log = test_log.open(demo_catalog)
    settings = settings_for(test_log)
    first, later = recent_events(3_000, seed=1), recent_events(2_000, seed=2)
    append(log, demo_catalog, first)

    main = build_pipeline(settings, spark)  # the serving pipeline: the store's root
    main.run_until_drained()
    # Started from the latest offset before `later` arrives: finds nothing now, but its start is
    # kept (the checkpoint), so a later run reads exactly what came after.
    late = build_pipeline(settings, spark, name="late", starting_offsets="latest")
    late.run_until_drained()
    append(log, demo_catalog, later)
    main.run_until_drained()
    late.run_until_drained()
    # Started last, from the earliest offset: replays the whole log.
    audit = build_pipeline(settings, spark, name="audit", starting_offsets="earliest")
    audit.run_until_drained()
    pipelines = [main, late, audit]
    try:
        served, tail, replayed = (pane_contents(p.store) for p in pipelines)
        assert replayed == served  # identical panes, sketches' estimates included
        assert counts(served) == expected_panes(first + later)
        assert counts(tail) == expected_panes(later)
        # Each in its own namespace and checkpoint; the root stays the serving pipeline's.
        if settings.store_backend == "sqlite":
            assert [p.store.path for p in pipelines] == [test_log.root / "store.db",
                                                         test_log.root / "pipelines" / "late" / "store.db",
                                                         test_log.root / "pipelines" / "audit" / "store.db"]
        assert {p.config.checkpoint_dir.name for p in pipelines} == {"main", "late", "audit"}
        ends = {p: o.end for p, o in log.offsets(STREAM).items()}
        for p in pipelines:
            assert p.store.progress(p.config.name).end_offsets[STREAM] == ends
            assert p.listener_failures == 0
        if test_log.kafka:
            from ingest.log.kafka_groups import GroupOffsetCommitter

            for p in pipelines:  # the consumer groups outside tools read equal the stores' offsets
                group = GroupOffsetCommitter(test_log.bootstrap, f"sketchboard-{p.config.name}",
                                             topic_prefix=test_log.prefix)
                assert group.committed() == {k: dict(v) for k, v in p.store.progress(p.config.name).end_offsets.items()}

        # Lag per consumer through the API, as the API process samples it.
        app, ctx = build_api(settings)
        # One round written as the leader's sampler writes it (this replica does not hold the lease:
        # sample_and_store() would write nothing).
        ctx.lag.sampler.sink.write(ctx.lag.sampler.sample())
        with TestClient(app, base_url="http://127.0.0.1") as client:
            body = client.get("/api/v1/lag", params={"stream": STREAM}).json()
        consumers = {c["name"]: c for c in body["consumers"]}
        assert [c["name"] for c in body["consumers"]][0] == "main" and set(consumers) == {"main", "late", "audit"}
        assert consumers["main"]["serving"] and not consumers["audit"]["serving"]
        assert consumers["main"]["namespace"] is None and consumers["audit"]["namespace"] == "audit"
        assert consumers["late"]["started_from"] == "latest" and consumers["audit"]["started_from"] == "earliest"
        for c in consumers.values():
            assert c["lag_events"] == 0 and c["last_commit_ms"] is not None
            partitions = c["streams"][STREAM]["partitions"]
            assert {int(p): part["committed"] for p, part in partitions.items()} == ends
        assert body["pipeline"] == "main" and body["lag_events"] == 0  # the old shape: the serving pipeline's
        ctx.store.close()
    finally:
        for p in pipelines:
            p.store.close()
        log.close()
