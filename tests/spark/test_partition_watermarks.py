"""Per-partition watermarks with real Spark (issue 19), on the embedded log and on Kafka (the
`log_backend` fixture): a sensor stream whose keys are skewed over 3 partitions, 3 % of its events 3..30 minutes late, read once as it arrives and once as a
backlog in small fair batches. Both runs give the same panes; the catch-up run's corrections
are those of genuinely late events only (every record merged into a final pane is late within
its own partition), and about as many as the steady run's. With one stream-wide watermark the
catch-up run "corrected" panes whose events were still unread in a slower partition."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from aggregates.pipeline import Pipeline
from catalog import Catalog
from ingest.events import EventValidator
from ingest.log import EventLog
from store import SqlitePaneStore, pane_start
from tests.log_backends import TestLog
from tests.support.events import validate_many

pytestmark = pytest.mark.spark

STREAM = "sensors"
LATENESS_MS = 30_000
PANE_MS = 10_000
CATALOG = Catalog.model_validate({
    "streams": {STREAM: {
        "key_field": "device", "dimensions": ["site"], "values": ["temp"], "distinct": ["device"],
        "pane": "10s", "allowed_lateness": "30s", "partitions": 3, "tiers": [],
    }},
    "metrics": {"temperature": {"stream": STREAM, "value": "temp"}},
})
EVENTS = 9_000
STEADY_PARTS = 8
CATCH_UP_BATCH = 900


def sensor_events(now_ms: int, seed: int = 7) -> list[tuple[int, dict]]:
    """(arrival ms, event) in arrival order: 40 devices with Zipf-skewed traffic over 20 minutes
    of event time, most arriving within ~1 s, 3 % between 3 and 30 minutes late."""
    rng = np.random.default_rng(seed)
    base = now_ms - 3_600_000
    weights = 1.0 / np.arange(1, 41) ** 1.2
    devices = rng.choice(40, EVENTS, p=weights / weights.sum())
    times = base + rng.integers(0, 1_200_000, EVENTS)
    late = rng.random(EVENTS) < 0.03
    delay = np.where(late, rng.integers(180_000, 1_800_000, EVENTS), rng.exponential(500.0, EVENTS).astype(np.int64))
    arrival = times + delay
    order = np.argsort(arrival, kind="stable")
    return [(int(arrival[i]), {"time": int(times[i]), "device": f"d{devices[i]}", "site": f"s{devices[i] % 3}",
                               "temp": float(np.round(rng.normal(20, 3), 2))}) for i in order]


def append(log: EventLog, events: list[tuple[int, dict]], chunk: int = 300) -> None:
    stream = CATALOG.stream(STREAM)
    validator = EventValidator(stream)
    for i in range(0, len(events), chunk):
        part = events[i:i + chunk]
        good, rejected = validate_many(validator, [e for _, e in part])
        assert not rejected
        log.append(stream, good, max(a for a, _ in part))


def pipeline(spark, test_log: TestLog, now_ms: int, max_records: int) -> Pipeline:
    config = test_log.pipeline_config(max_records_per_batch=max_records, max_records_per_task=20_000)
    return Pipeline(spark, CATALOG, SqlitePaneStore(test_log.root / "store.db"), config, clock=lambda: now_ms / 1000)


def stored_panes(root: Path) -> dict:
    store = SqlitePaneStore(root / "store.db")
    try:
        return {(p.key.start_ms, p.key.dims): (p.data.count, round(p.data.values["temp"].sum, 6),
                                               p.data.values["temp"].min, p.data.values["temp"].max)
                for p in store.read_panes(STREAM, 0, 2**62)}
    finally:
        store.close()


def corrections_by_batch(root: Path) -> dict[tuple[int, int, str], int]:
    store = SqlitePaneStore(root / "store.db")
    try:
        return {(c.batch_id, c.pane_start_ms, c.dims["site"]): c.events_added for c in store.corrections(limit=10**6)}
    finally:
        store.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, spark, log_backend) -> tuple[TestLog, TestLog]:
    import time

    now_ms = int(time.time() * 1000)
    events = sensor_events(now_ms)
    steady = log_backend.new(tmp_path_factory.mktemp("steady"))
    catch_up = log_backend.new(tmp_path_factory.mktemp("catch_up"))
    # Steady: the events arrive in parts; each part is read in one batch as it lands.
    log = steady.open(CATALOG)
    size = -(-len(events) // STEADY_PARTS)
    for i in range(0, len(events), size):
        append(log, events[i:i + size])
        pipeline(spark, steady, now_ms, 10**6).run_until_drained()
    log.close()
    # Catch-up: all of it is in the log first, then read as a backlog in small fair batches.
    log = catch_up.open(CATALOG)
    append(log, events)
    log.close()
    pipeline(spark, catch_up, now_ms, CATCH_UP_BATCH).run_until_drained()
    return steady, catch_up


def accounts(root: Path) -> dict:
    """What a run's store says it read, aggregated and dead-lettered (with the first dead letters),
    and how far it read each partition: a failure says where a missing event went."""
    store = SqlitePaneStore(root / "store.db")
    try:
        progress = store.progress("main")
        stream = progress.streams.get(STREAM)
        dead = [(d.letter.partition, d.letter.offset, d.letter.reason, d.letter.error)
                for d in store.dead_letters(stream=STREAM, limit=5)]
        return {"read": progress.events_read, "end_offsets": dict(progress.end_offsets.get(STREAM, {})),
                "aggregated": None if stream is None else stream.events_aggregated,
                "dead": None if stream is None else dict(stream.dead_lettered_by_reason), "dead_letters": dead}
    finally:
        store.close()


def test_steady_and_catch_up_give_the_same_panes(runs):
    steady, catch_up = runs
    panes = stored_panes(steady.root)
    assert sum(c for c, *_ in panes.values()) == EVENTS, accounts(steady.root)
    caught_up = stored_panes(catch_up.root)
    differ = {k: (panes.get(k), caught_up.get(k)) for k in panes.keys() | caught_up.keys()
              if panes.get(k) != caught_up.get(k)}
    assert not differ, (f"(pane, dims): (steady, catch-up) {differ}; steady {accounts(steady.root)};"
                        f" catch-up {accounts(catch_up.root)}")


def test_catch_up_corrects_only_for_events_late_within_their_partition(runs):
    """Replay the catch-up batches from Spark's offset log: every record that went into a
    corrected (already final) pane must be older than its own partition's earlier records
    allow (newest before it - lateness). A pane final while a partition still held unread,
    on-time events for it would break this."""
    _, catch_up = runs
    stream = CATALOG.stream(STREAM)
    log = catch_up.open(CATALOG)
    corrected = corrections_by_batch(catch_up.root)
    checkpoints = catch_up.pipeline_config().checkpoint_dir
    assert corrected, "the late events must produce corrections"
    newest: dict[int, int] = {}
    start: dict[int, int] = defaultdict(int)
    merged_into_final: dict[tuple[int, int, str], int] = defaultdict(int)
    batch = 0
    while (checkpoints / "offsets" / str(batch)).exists():
        for p, hi in sorted(catch_up.end_offsets(CATALOG, checkpoints, batch).get(STREAM, {}).items()):
            for rows in catch_up.source_rows(log, CATALOG, stream, p, start[p], hi):
                for r in rows.to_pylist():
                    t = r["event_time"]
                    key = (batch, pane_start(t, PANE_MS), r["dims"][0])
                    if key in corrected:
                        merged_into_final[key] += 1
                        assert p in newest and t < newest[p] - LATENESS_MS, (
                            f"batch {batch}: partition {p} offset {r['offset']} (event {t}) went into a final pane"
                            f" but is not late in its partition (newest before it: {newest.get(p)})")
                    newest[p] = max(newest.get(p, t), t)
            start[p] = hi
        batch += 1
    log.close()
    assert batch >= EVENTS // CATCH_UP_BATCH
    assert dict(merged_into_final) == corrected


def test_catch_up_publishes_about_as_many_corrections_as_the_steady_run(runs):
    steady, catch_up = runs
    n_steady, n_catch_up = len(corrections_by_batch(steady.root)), len(corrections_by_batch(catch_up.root))
    assert n_steady >= 50, "3 % of 9 000 events are minutes late"
    assert n_catch_up <= 1.1 * n_steady, (n_catch_up, n_steady)
