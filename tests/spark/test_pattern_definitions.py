"""A pattern defined through the API while one pipeline runs on (issue 24), with real Spark: the
pipeline polls the definitions once per batch (Pipeline.follow_patterns), runs the new pattern
from its next batch on (its derived stream's topic and tiers made then), matches exactly the
brute-force definition over the events read after the creation, and drops its state in the
batch after its deletion, keeping the matches."""

from __future__ import annotations

import pytest

from aggregates.pattern_definitions import PatternFollower
from aggregates.pipeline import Pipeline
from catalog import parse_catalog
from catalog.defined_patterns import check_pattern, declaration
from store.pattern_definitions import PatternDefinitionStore
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0
from tests.spark.test_patterns import oracle, stored
from tests.spark.test_pipeline import Service

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]  # the definitions on PostgreSQL: tests/api/test_pattern_definitions_pipeline.py

MIN = 60_000
CONFIG = """
streams:
  logins: {key_field: user_id, dimensions: [outcome, ip], partitions: 2, allowed_lateness: 30s, max_future_skew: 2h}
"""
BURST = {"name": "burst", "key": "user_id", "within": "5m", "steps": [
    {"name": "failures", "stream": "logins", "where": {"outcome": "failure"}, "times": 3},
    {"name": "success", "stream": "logins", "where": {"outcome": "success", "ip": {"same_as": "failures.ip"}}}]}


def burst(user: str, start_ms: int, ip: str = "203.0.113.7") -> list[dict]:
    return [{"time": start_ms + i * 10_000, "user_id": user, "outcome": "failure" if i < 3 else "success", "ip": ip}
            for i in range(4)]


def flush(t_ms: int) -> list[dict]:
    return [{"time": t_ms, "user_id": "flush", "outcome": "x", "ip": "x"}]


def test_a_pattern_defined_while_the_pipeline_runs_matches_the_events_after_it(tmp_path, spark, log_backend,
                                                                               store_backend):
    catalog = parse_catalog(CONFIG)
    service = Service(log_backend.new(tmp_path), catalog, spark, store_backend)
    config = service.test_log.pipeline_config(max_records_per_batch=100_000, max_records_per_task=20_000)
    pipeline = Pipeline(spark, catalog, store_backend.reopen(service.store), config,
                        log=service.test_log.open(catalog), clock=lambda: (T0 + 600_000) / 1000)
    definitions = PatternDefinitionStore(service.store.side_db())
    pipeline.pattern_definitions = PatternFollower(catalog, definitions)
    try:
        service.post("logins", burst("alice", T0))  # read before the pattern exists: never matched
        pipeline.run_until_drained()
        definitions.create("burst", declaration(check_pattern(catalog, [], BURST)), now_ms=T0)
        after = burst("bob", T0 + 5 * MIN) + burst("carol", T0 + 6 * MIN, ip="10.0.0.1")
        service.post("logins", after + flush(T0 + 20 * MIN))
        pipeline.run_until_drained()
        service.post("logins", flush(T0 + 21 * MIN))  # the pattern's watermark is one batch behind
        pipeline.run_until_drained()
        assert [p.name for p in pipeline.catalog.patterns] == ["burst"]
        sizes = pipeline.store.pattern_sizes()["burst"]
        want = oracle(pipeline.catalog, "burst", [("logins", e) for e in after], sizes.watermark_ms)
        assert [key for _, key, _ in want] == ["bob", "carol"] and stored(service.store, "burst") == want
        assert sizes.matches == 2 and sizes.definition_id.endswith("@1")

        assert definitions.delete("burst")
        service.post("logins", flush(T0 + 22 * MIN))
        pipeline.run_until_drained()
        assert "burst" not in pipeline.store.pattern_sizes() and stored(service.store, "burst") == want
    finally:
        definitions.close()
        service.log.close()
