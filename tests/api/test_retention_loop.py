"""The API process's background upkeep (sketchboard/retention.py, started by `sketchboard api`)
on a real SQLite store and embedded log, no JVM: a pass compacts a changelog table's log and drops
an unused reprocessing output once `reprocess_drop_after` has passed; a pass that fails is logged
and the loop goes on."""

from __future__ import annotations

import logging
import threading
import time

import yaml

from ingest.tables import TableRowValidator, tombstone
from sketchboard.definitions import pin_definitions
from sketchboard.retention import retention_loop, retention_pass
from sketchboard.settings import Settings
from sketchboard.wiring import build_api, open_catalog, open_store

USERS = {"kind": "table", "key_field": "user_id", "dimensions": ["plan"]}
OLD = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"], "values": ["latency_ms"]},
                   "users": USERS}}
NEW = {"streams": {**OLD["streams"], "http": {**OLD["streams"]["http"], "dimensions": ["endpoint", "region"]}}}
HOUR = 3_600_000


def test_a_pass_compacts_and_drops_an_old_unused_output_and_a_failed_pass_does_not_end_the_loop(tmp_path, caplog):
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(OLD))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None,
                        reprocess_drop_after="1h")
    root = open_store(settings)
    pin_definitions(root, open_catalog(settings), "main")  # the served output: the old definition
    root.close()
    config.write_text(yaml.safe_dump(NEW))
    app, ctx = build_api(settings)
    now = [time.time()]
    ctx.clock = ctx.reprocess.clock = lambda: now[0]  # the pass's time is the context's
    ctx.reprocess.launch = lambda run: None  # no child process: the run is marked failed below
    users = ctx.catalog.stream("users")
    rows = TableRowValidator(users)

    def upsert(*plans: str) -> None:
        at = int(now[0] * 1000)
        ctx.log.append(users, [rows.validate({"user_id": "u1", "plan": p}, at) for p in plans], at)

    try:
        ctx.leadership.tick()  # this replica leads: it is the one that drops outputs
        assert ctx.leadership.leading()
        run = ctx.reprocess.start("http")
        open_store(settings, run.id).close()  # the run's output, as its pipeline makes it
        ctx.reprocess.definitions.set_state(run.id, "failed", ctx.now_ms(), error="stopped by hand")
        assert ctx.reprocess.outputs.storage.exists(run.id)
        upsert("free", "pro", "team")  # u1's first two rows are superseded

        retention_pass(ctx, settings)
        assert ctx.log.compact(ctx.now_ms()) == 0  # the pass compacted the table: nothing left to drop
        assert ctx.reprocess.run(run.id) is not None  # unused, but for less than reprocess_drop_after
        assert ctx.reprocess.outputs.storage.exists(run.id)

        # An hour later, in the loop: its first pass fails (as on a locked disk), the next ones run.
        now[0] += HOUR / 1000 + 1
        upsert("free", "pro")
        compact, failures = ctx.log.compact, []

        def failing_once(now_ms: int, read_through=None) -> int:
            if not failures:
                failures.append(now_ms)
                raise OSError("disk I/O error")
            return compact(now_ms, read_through)

        ctx.log.compact = failing_once
        stop = threading.Event()
        caplog.set_level(logging.INFO, logger="sketchboard")
        loop = threading.Thread(target=retention_loop, args=(ctx, settings, stop), kwargs={"interval_s": 0.01})
        loop.start()
        try:
            deadline = time.monotonic() + 60
            while ctx.reprocess.run(run.id) is not None:
                assert loop.is_alive() and time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            stop.set()
            loop.join(10)
        assert not loop.is_alive()
        assert failures  # the failed pass happened, and passes went on after it
        failed = [r for r in caplog.records if "retention pass failed" in r.getMessage()]
        assert len(failed) == 1 and failed[0].levelno == logging.ERROR and "disk I/O error" in failed[0].exc_text
        assert not ctx.reprocess.outputs.storage.exists(run.id)
        assert f"reprocess_drop_after: dropped the unused output {run.id!r}" in caplog.text
        assert "compaction dropped 2 superseded records" in caplog.text  # u1's "team", then "free"
        assert compact(ctx.now_ms()) == 0
    finally:
        ctx.leadership.stop()
        ctx.store.close()


def test_a_pass_keeps_a_tombstone_the_pipeline_has_not_read_however_old(tmp_path):
    """The pipeline stored u1's row and stopped before reading its delete: dropping the old
    tombstone would leave the deleted row in the store, the views and enrichment for good."""
    from store import BatchCommit

    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump({"streams": {"users": {**USERS, "tombstone_retention": "1h"}}}))
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None)
    app, ctx = build_api(settings)
    now = [time.time()]
    ctx.clock = lambda: now[0]
    users = ctx.catalog.stream("users")
    try:
        at = int(now[0] * 1000)
        (p, (first, _)), = ctx.log.append(users, [TableRowValidator(users).validate({"user_id": "u1", "plan": "gold"},
                                                                                   at)], at).ranges.items()
        read = BatchCommit(pipeline=ctx.pipeline_name, batch_id=0, partials=[], events_read=1,
                           end_offsets={"users": {p: first + 1}})
        assert ctx.store.commit_batch(read, lateness_ms={}, now_ms=at).committed
        ctx.log.append(users, [tombstone(users, "u1", at)], at)  # the delete, not read
        now[0] += 2 * HOUR / 1000
        retention_pass(ctx, settings)
        # The row it superseded goes; the delete stays until the pipeline has read it.
        assert [r["op"] for b in ctx.log.read(users, p, first, first + 2) for r in b.to_pylist()] == ["delete"]
        read = BatchCommit(pipeline=ctx.pipeline_name, batch_id=1, partials=[], events_read=1,
                           end_offsets={"users": {p: first + 2}})
        assert ctx.store.commit_batch(read, lateness_ms={}, now_ms=ctx.now_ms()).committed
        # A named pipeline (fan-out) that stored the row too and is behind the delete holds it: the
        # pass looked at the serving pipeline's offsets only, and the audit kept u1 for good.
        ctx.lag.registry.register("audit", "audit", "earliest", at)
        ctx.lag.registry.record_commit("audit", 0, at, {"users": {p: first + 1}})
        retention_pass(ctx, settings)
        assert [r["op"] for b in ctx.log.read(users, p, first, first + 2) for r in b.to_pylist()] == ["delete"]
        # One whose first commit has not been copied yet (made just after it, or retried while it
        # fails) may have stored u1's row already: it is held at the start it recorded.
        ctx.lag.registry.register("late", "late", "earliest", at)
        ctx.lag.registry.record_start("late", {"users": {p: first}})
        ctx.lag.registry.record_commit("audit", 1, at, {"users": {p: first + 2}})
        retention_pass(ctx, settings)
        assert [r["op"] for b in ctx.log.read(users, p, first, first + 2) for r in b.to_pylist()] == ["delete"]
        ctx.lag.registry.record_commit("late", 0, at, {"users": {p: first + 2}})
        retention_pass(ctx, settings)  # read by every reader now: the old tombstone goes, with the row it deleted
        assert [r for b in ctx.log.read(users, p, first, first + 2) for r in b.to_pylist()] == []
    finally:
        ctx.leadership.stop()
        ctx.store.close()
