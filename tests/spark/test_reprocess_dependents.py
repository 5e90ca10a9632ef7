"""A reprocess of a stream that a pattern reads alone (issue 16; docs/reprocessing.md, "Streams a
switch refuses"): the run rebuilds the pattern's state and matches with the stream, the switch
moves them with it, and the serving pipeline goes on from the run's end. The pattern's matches
then equal those of a pipeline that read the whole log once with the new configuration (the
exact computation), although the live pipeline had read records past the run's end the old way
before the switch (they are fed to the rebuilt state once, after it)."""

from __future__ import annotations

import io
import random
import time

import pytest
import yaml

from catalog import Catalog
from ingest.events import EventValidator
from sketchboard.reprocess import build_reprocess_service, run_reprocess
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline
from tests.log_backends import ON_THE_EMBEDDED_STACK

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
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(OLD))
    # Small batches: a pattern's watermark is the streams' as stored before a batch (one batch behind).
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None, max_records_per_batch=150,
                        **test_log.settings())
    rng = random.Random(24)
    base = (int(time.time() * 1000) // 3_600_000 - 1) * 3_600_000
    new_catalog = Catalog(**NEW)
    log = test_log.open(new_catalog)
    stream = new_catalog.stream("logins")

    def append(batch: list[dict]) -> None:
        validator = EventValidator(stream)
        log.append(stream, [validator.validate(e) for e in batch], int(time.time() * 1000))

    append(logins(300, base, rng))
    main = build_pipeline(settings, spark)
    main.run_until_drained()
    main.store.close()
    config.write_text(yaml.safe_dump(NEW))  # a dimension more: the pattern's stream is reprocessed
    append(logins(200, base + 30_000, rng))
    main = build_pipeline(settings, spark)
    root = main.store
    reference = None
    try:
        main.run_until_drained()
        run = run_reprocess(settings, "logins", spark=spark, out=io.StringIO(), interval_s=0.05)
        assert run.state == "caught_up"
        append(logins(200, base + 50_000, rng))  # read by the live pipeline the old way, before the switch
        main.run_until_drained()
        service = build_reprocess_service(settings, new_catalog, root, log)
        switched = service.switch(run.id)  # refused (409) before: the pattern reads the stream
        assert switched["serving_version"] == run.version
        # Events of no step, 10 minutes on: every pipeline's pattern watermark passes the logins above.
        append([{**e, "user": "tail", "outcome": "other"} for e in logins(300, base + 600_000, rng)])
        again = build_pipeline(settings, spark)  # as `sketchboard pipeline` restarts after a switch
        assert again.store is not root
        again.run_until_drained()
        again.store.close()
        reference = build_pipeline(settings, spark, name="reference", starting_offsets="earliest")
        reference.run_until_drained()
        expected = matches(reference.store)
        assert len(expected) > 20
        assert matches(root) == expected
        assert match_counts(root) == match_counts(reference.store)
    finally:
        if reference is not None:
            reference.store.close()
        root.close()
        log.close()
