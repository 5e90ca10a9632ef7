"""Exact duplicate drops by event id with real Spark (aggregates/duplicates.py): a stream with
`event_id_field` counts each id once, for copies in one batch, across batches and across a
crash in the middle of a store commit (the batch's ids are written in its transaction, so the
replayed batch neither double-counts nor takes its own events for duplicates), compared with an
exact oracle over the events with their copies removed. Once on the embedded log with SQLite
and once on a real Kafka broker with PostgreSQL, so both logs and both stores are covered
without running the four pairs."""

from __future__ import annotations

import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aggregates.pipeline import Pipeline
from catalog import parse_catalog
from store import event_ids as store_event_ids
from tests.spark.events import T0, amounts_by_pane_and_country, stored_amounts_by_pane_and_country
from tests.spark.test_pipeline import Service
from tests.log_backends import ON_BOTH_STACKS

pytestmark = [
    pytest.mark.spark,
    ON_BOTH_STACKS,
]

CONFIG = """
streams:
  orders:
    key_field: user_id
    dimensions: [country]
    values: [amount]
    partitions: 3
    event_id_field: request_id
    dedup_window: 1h
"""
PANE = 10_000


def orders(n: int, first: int, rng: random.Random) -> list[dict]:
    return [{"time": T0 + rng.randrange(300_000), "user_id": f"u{rng.randrange(500)}",
             "country": rng.choice(["de", "fr", "us"]), "amount": round(rng.uniform(1, 500), 2),
             "request_id": f"r{first + k}"} for k in range(n)]


def with_copies(events: list[dict], copies: int, rng: random.Random) -> list[dict]:
    """The events and `copies` retries of some of them, shuffled (a retry is the same event)."""
    out = events + [dict(e) for e in rng.sample(events, copies)]
    rng.shuffle(out)
    return out


def assert_exact(store, events: list[dict]) -> None:
    """The panes equal the oracle over the events with each request id once."""
    unique = {e["request_id"]: e for e in events}.values()
    counts, sums = amounts_by_pane_and_country(((e["time"], e["country"], e["amount"]) for e in unique), PANE)
    got_counts, got_sums = stored_amounts_by_pane_and_country(store, "orders")
    assert got_counts == counts
    assert got_sums.keys() == sums.keys()
    for key, total in sums.items():
        assert got_sums[key] == pytest.approx(total, rel=1e-9), key


def test_each_event_id_counts_once_in_a_batch_across_batches_and_across_a_crash(tmp_path, spark, log_backend,
                                                                                 store_backend, monkeypatch):
    catalog = parse_catalog(CONFIG)
    service = Service(log_backend.new(tmp_path), catalog, spark, store_backend)
    rng = random.Random(23)

    def pipeline() -> Pipeline:
        config = service.test_log.pipeline_config(max_records_per_batch=100_000, max_records_per_task=20_000)
        return Pipeline(spark, catalog, store_backend.reopen(service.store), config,
                        log=service.test_log.open(catalog), clock=lambda: (T0 + 600_000) / 1000)

    # 1. Copies within one batch, and records logged without an id (before the stream declared one).
    first = orders(3000, 0, rng)
    service.post("orders", with_copies(first, 300, rng))
    no_id = catalog.streams["orders"].model_copy(update={"event_id_field": None, "dedup_window": None})
    from ingest.events import EventValidator

    service.log.append(no_id, [EventValidator(no_id).validate({k: v for k, v in e.items() if k != "request_id"})
                               for e in orders(4, 10_000, rng)], T0 + 1_000)
    pipeline().run_until_drained()
    assert_exact(service.store, first)
    s = service.store.progress("main").streams["orders"]
    assert (s.duplicates_dropped, s.events_dead_lettered) == (300, 4)
    assert s.dead_lettered_by_reason == {("invalid" if service.test_log.kafka else "missing_event_id"): 4}

    # 2. Retries of events counted in an earlier batch, new events and their copies; the pipeline
    # dies inside its store commit, after the batch's ids were written: nothing of it stays, and
    # the batch Spark replays at the next start is judged afresh. (A batch replayed after its
    # commit is skipped by its batch id before any of this: test_pipeline.py.)
    second = orders(1500, 3000, rng)
    service.post("orders", with_copies(rng.sample(first, 400) + with_copies(second, 100, rng), 0, rng))
    real_apply = store_event_ids.apply

    def crash(*args, **kwargs):
        real_apply(*args, **kwargs)
        raise RuntimeError("killed in the middle of the store commit")

    monkeypatch.setattr(store_event_ids, "apply", crash)
    with pytest.raises(Exception, match="killed in the middle"):  # the query fails (Spark wraps the error)
        pipeline().run_until_drained()
    monkeypatch.setattr(store_event_ids, "apply", real_apply)
    last = service.store.last_batch_id("main")
    pipeline().run_until_drained()  # replays the batch Spark logged but the store did not record
    assert service.store.last_batch_id("main") > last
    assert_exact(service.store, first + second)

    # The counters, in the pipeline's status and in /metrics.
    status = service.client.get("/api/v1/pipeline").json()["streams"]["orders"]
    assert status["duplicates_dropped"] == 300 + 400 + 100
    assert status["events_read"] == status["events_aggregated"] + status["events_dead_lettered"] + 800
    assert status["events_aggregated"] == len(first) + len(second)
    families = {f.name: f for f in text_string_to_metric_families(service.client.get("/metrics").text)}
    samples = {s.name: s.value for s in families["sketchboard_duplicate_events_dropped"].samples}
    assert samples == {"sketchboard_duplicate_events_dropped_total": 800}
    service.log.close()
