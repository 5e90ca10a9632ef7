"""A reprocess of a stream that a pattern reads alone (issue 16; docs/reprocessing.md, "Streams a
switch refuses"): the run rebuilds the pattern's state and matches with the stream, the switch
moves them with it, and the serving pipeline goes on from the run's end. The pattern's matches
then equal those of a pipeline that read the whole log once with the new configuration (the
exact computation), although the live pipeline had read records past the run's end the old way
before the switch (they are fed to the rebuilt state once, after it)."""

from __future__ import annotations

import random
import time

import pytest

from ingest.events import EventValidator
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.support.switch import SwitchScenario, hour_ago, nothing

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]

PATTERN = {"name": "stuffing", "key": "user", "within": "10m",
           "steps": [{"name": "failures", "stream": "logins", "where": {"outcome": "failure"}, "times": 2},
                     {"name": "success", "stream": "logins", "where": {"outcome": "success"}}]}
OLD = {"streams": {"logins": {"key_field": "user", "dimensions": ["outcome"], "partitions": 2, "tiers": [],
                              "allowed_lateness": "1s"}},
       "patterns": [PATTERN]}
NEW = {**OLD, "streams": {"logins": {**OLD["streams"]["logins"], "dimensions": ["outcome", "region"]}}}


def logins(n: int, start_ms: int, rng: random.Random) -> list[dict]:
    """In event-time order, 100 ms apart: the matches do not depend on how batches cut them."""
    return [{"time": start_ms + 100 * i, "user": f"u{rng.randrange(20)}", "region": rng.choice(["eu", "us"]),
             "outcome": "failure" if rng.random() < 0.6 else "success"} for i in range(n)]


def matches(store) -> set:
    """The pattern's matches standing (retractions taken out), by key and the log records they hold."""
    rows = store.pattern_matches("stuffing", limit=100_000)
    retracted = {m.retracts for m in rows if m.retracts is not None}
    return {(m.key, tuple((e["partition"], e["offset"]) for e in m.events)) for m in rows
            if m.retracts is None and m.id not in retracted}


def match_counts(store) -> dict:
    return {p.key.start_ms: p.data.count for p in store.read_panes("stuffing_matches", 0, 2**62) if p.data.count}


def test_a_reprocess_of_a_patterns_stream_switched_gives_the_exact_matches(tmp_path, spark, log_backend,
                                                                           store_backend):
    # Small batches: a pattern's watermark is the streams' as stored before a batch (one batch behind).
    with SwitchScenario(tmp_path, spark, log_backend, OLD, NEW, batch=150) as scenario:
        rng = random.Random(24)
        base = hour_ago()
        stream = scenario.catalog.stream("logins")

        def append(batch: list[dict]) -> None:
            validator = EventValidator(stream)
            scenario.log.append(stream, [validator.validate(e) for e in batch], int(time.time() * 1000))

        # A dimension more between `first` and `changed`: the pattern's stream is reprocessed. After
        # the run: read by the live pipeline the old way, before the switch. The switch is the
        # plain one (refused, 409, before: the pattern reads the stream). Then events of no step,
        # 10 minutes on: every pipeline's pattern watermark passes the logins above.
        done = scenario.switch_of(
            "logins", first=lambda: append(logins(300, base, rng)),
            changed=lambda: append(logins(200, base + 30_000, rng)),
            after_run=lambda: append(logins(200, base + 50_000, rng)), at_switch=nothing,
            after_switch=lambda: append([{**e, "user": "tail", "outcome": "other"}
                                         for e in logins(300, base + 600_000, rng)]),
            synchronized=False)
        expected = matches(done.reference)
        assert len(expected) > 20
        assert matches(done.root) == expected
        assert match_counts(done.root) == match_counts(done.reference)
