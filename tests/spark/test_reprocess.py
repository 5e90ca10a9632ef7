"""Reprocessing the Kappa way (issue 16), wired as `sketchboard pipeline` and `sketchboard reprocess`
wire it, on both stacks: a stream's definition gains a dimension; the live pipeline, restarted with
the new configuration, keeps computing the served output the stored (old) way; a reprocessing run
reads the whole log into its own namespace with the new definition. The new output equals an exact
pandas computation with the new definition over the whole log; the old one equals the exact old
computation and is not touched by the run."""

from __future__ import annotations

import io
import json
import random
import threading
import time

import pandas as pd
import pytest
import yaml

from aggregates.reprocess import NeedsAlignment, ReprocessService
from catalog import Catalog
from catalog.versions import definition_version
from ingest.events import EventValidator
from sketchboard.live import run_pipeline
from sketchboard.reprocess import aligner, build_reprocess_service, run_reprocess
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline, open_consumer_registry, open_health_store, open_store
from store.definitions import DefinitionStore
from store.health import query_health
from tests.log_backends import ON_BOTH_STACKS

pytestmark = [pytest.mark.spark, ON_BOTH_STACKS]

PANE = 10_000
OLD = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"], "values": ["latency_ms"],
                            "partitions": 2, "tiers": []}}}
NEW = {"streams": {"http": {**OLD["streams"]["http"], "dimensions": ["endpoint", "region"]}}}


def events(n: int, rng: random.Random) -> list[dict]:
    """In the last hour (inside retention), whole-number latencies: sums are exact in any order."""
    base = (int(time.time() * 1000) // 3_600_000 - 1) * 3_600_000
    return [{"time": base + rng.randrange(600_000), "user": f"u{rng.randrange(200)}",
             "endpoint": rng.choice(["/a", "/b", "/c"]), "region": rng.choice(["eu", "us"]),
             "latency_ms": float(rng.randrange(1, 500))} for _ in range(n)]


def exact(logged: list[dict], dimensions: list[str]) -> dict:
    """(pane start, dims key) -> (count, sum, min, max) of latency_ms, with pandas."""
    from store import dims_key

    frame = pd.DataFrame(logged)
    frame["pane"] = frame["time"] // PANE * PANE
    out = {}
    for key, group in frame.groupby(["pane", *dimensions]):
        dims = dict(zip(dimensions, key[1:]))
        out[(int(key[0]), dims_key(dims))] = (len(group), group["latency_ms"].sum(), group["latency_ms"].min(),
                                              group["latency_ms"].max())
    return out


def stored(store) -> dict:
    out = {}
    for p in store.read_panes("http", 0, 2**62):
        v = p.data.values["latency_ms"]
        out[(p.key.start_ms, p.key.dims)] = (p.data.count, v.sum, v.min, v.max)
    return out


def wait_until(condition, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_a_reprocess_adds_a_dimension_and_leaves_the_served_output_alone(tmp_path, spark, log_backend, store_backend):
    test_log = log_backend.new(tmp_path / "data")
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(OLD))
    extra = {}
    if store_backend.kind == "postgres":
        extra = {"store_backend": "postgres", "postgres_dsn": store_backend.create().dsn, "postgres_pool_size": 2}
    settings = Settings(data_dir=test_log.root, streams_config=config, alerts_config=None,
                        max_records_per_task=20_000, **test_log.settings(), **extra)
    rng = random.Random(16)
    first, later = events(1_500, rng), events(700, rng)
    new_catalog = Catalog(**NEW)
    log = test_log.open(new_catalog)
    stream = new_catalog.stream("http")

    def append(batch: list[dict]) -> None:
        validator = EventValidator(stream)  # the API validates with the configured definition
        log.append(stream, [validator.validate(e) for e in batch], int(time.time() * 1000))

    append(first)
    main = build_pipeline(settings, spark)
    main.run_until_drained()
    main.store.close()

    # The configuration gains a dimension: the live pipeline keeps the served output's meaning.
    config.write_text(yaml.safe_dump(NEW))
    append(later)
    main = build_pipeline(settings, spark)
    root = main.store  # the served output: the API's view
    assert main.catalog.stream("http").dimensions == ("endpoint",)
    main.run_until_drained()
    served = stored(main.store)
    assert served == exact(first + later, ["endpoint"])

    out = io.StringIO()
    listening = len(spark.streams._jsqm.listListeners())
    run = run_reprocess(settings, "http", spark=spark, out=out, interval_s=0.05)
    # The run's progress listener is off the bus when it ends, as the serving pipeline's: left on,
    # `sketchboard reprocess` logged an ERROR StreamingQueryListenerBus ... Py4JException at exit.
    assert len(spark.streams._jsqm.listListeners()) == listening
    try:
        assert run.state == "caught_up" and run.version == definition_version(stream)
        assert "is complete from" in out.getvalue() and "100.0%" in out.getvalue()
        reprocessed = open_store(settings, run.id)
        try:
            assert stored(reprocessed) == exact(first + later, ["endpoint", "region"])
            recorded = DefinitionStore(reprocessed.side_db()).definitions()["http"]
            assert recorded.version == run.version
        finally:
            reprocessed.close()
        assert stored(main.store) == served  # the run wrote nothing into the served output
        definitions = DefinitionStore(main.store.side_db())
        assert definitions.definitions()["http"].version == definition_version(Catalog(**OLD).stream("http"))
        service = ReprocessService(new_catalog, definitions, open_consumer_registry(settings, main.store), log)
        progress = service.progress(service.run(run.id))
        assert progress.fraction == 1.0 and progress.to_do == len(first) + len(later)
        assert json.loads(json.dumps(service.to_json(run)))["state"] == "caught_up"

        # The switch, with the live pipeline running as `sketchboard pipeline` runs it: its next batch,
        # computed the old way, is refused whole (fenced); it restarts by itself with the new
        # definition, from the offsets the switch moved into its checkpoint.
        stopping, outcome = threading.Event(), []
        health = open_health_store(settings, root)
        live = threading.Thread(target=lambda: outcome.append(run_pipeline(settings, stopping, spark=spark)))
        live.start()
        try:
            # Up: Spark's query on Kafka, the pipeline's own batches on the embedded log (driver_serving.py).
            wait_until(lambda: (query_health(health, "main", int(time.time() * 1000)) or {}).get("running"))
            service = build_reprocess_service(settings, new_catalog, root, log)
            # Events after the run caught up: the live pipeline reads them, the run has not. The
            # switch then reads on to the log's end first (a process that can run the run's
            # pipeline: here this one), so the new output is never behind the served one.
            between = events(300, rng)
            append(between)
            so_far = first + later + between
            wait_until(lambda: stored(root) == exact(so_far, ["endpoint"]))
            with pytest.raises(NeedsAlignment, match="has read less of 'http' than the serving pipeline"):
                service.switch(run.id)
            # A reader polling throughout sees the old output or the new one, never a mix, nor
            # the new one without the events since the run caught up.
            old_answer, new_answer = exact(so_far, ["endpoint"]), exact(so_far, ["endpoint", "region"])
            seen, polling = [], threading.Event()

            def poll() -> None:
                reader = open_store(settings)
                try:
                    while not polling.is_set():
                        answer = stored(reader)
                        seen.append("old" if answer == old_answer else "new" if answer == new_answer else answer)
                finally:
                    reader.close()

            poller = threading.Thread(target=poll)
            poller.start()
            wait_until(lambda: len(seen) >= 3)
            switched = service.switch(run.id, align=aligner(settings, spark, service.full_catalog(), root))
            wait_until(lambda: seen[-1] == "new")
            polling.set()
            poller.join(30)
            assert set(seen) == {"old", "new"} and seen == sorted(seen, key=["old", "new"].index), seen[:5]
            assert switched["previous"] == f"previous-http-{definition_version(Catalog(**OLD).stream('http'))[:8]}"
            assert stored(root) == new_answer
            more = events(400, rng)
            append(more)
            wait_until(lambda: stored(root) == exact(so_far + more, ["endpoint", "region"]))
        finally:
            stopping.set()
            live.join(120)
            health.close()
        assert outcome == [0]
        previous = open_store(settings, switched["previous"])  # the old output, kept to switch back to
        try:
            assert stored(previous) == old_answer
        finally:
            previous.close()
    finally:
        root.close()
        log.close()
