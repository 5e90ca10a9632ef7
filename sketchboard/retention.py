"""The API process's background upkeep of the log and the store, every `interval_s` (60 s in
`sketchboard api`): the log's retention (by age and size), the changelog tables' compaction
(docs/tables.md) and, with `reprocess_drop_after` set, the dropping of unused reprocessing outputs
(docs/reprocessing.md). The API process owns the log's writes, so it also trims it."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from lag.sources import with_start

if TYPE_CHECKING:
    from api.context import ApiContext
    from sketchboard.settings import Settings

log = logging.getLogger("sketchboard")


def retention_pass(ctx: ApiContext, settings: Settings) -> None:
    """One round, at the context's clock (`ctx.now_ms`, `ctx.reprocess.clock`)."""
    dropped = ctx.log.apply_retention(ctx.now_ms(), settings.log_retention, settings.log_retention_bytes)
    if dropped:
        log.info("retention dropped %d records", dropped)
    try:  # a tombstone a pipeline has not read stays (docs/tables.md)
        read_through = read_by_every_reader(ctx)
    except Exception:  # the store is down: no compaction this round, as nothing is known read
        log.exception("compaction skipped: the pipeline's committed offsets cannot be read")
    else:
        compacted = ctx.log.compact(ctx.now_ms(), read_through)  # changelog tables (docs/tables.md)
        if compacted:
            log.info("compaction dropped %d superseded records", compacted)
    if settings.reprocess_drop_after and ctx.reprocess is not None and ctx.leadership.leading():  # one replica
        try:
            for output in ctx.reprocess.drop_unused(settings.reprocess_drop_after):
                log.info("reprocess_drop_after: dropped the unused output %r", output)
        except Exception:  # the store is down: try again next time, the log was trimmed all the same
            log.exception("reprocess_drop_after: dropping unused outputs failed")


def read_by_every_reader(ctx: ApiContext) -> dict[str, dict[int, int]]:
    """Per stream and partition, the offset every reader of the log has committed up to: the least
    of the serving pipeline's and each registered consumer's (named pipelines, reprocessing runs:
    store/consumers.py, copies written after each of their commits, so never ahead of them). A
    consumer whose copy has not come yet (its first commit's, made just after it, or retried while
    it fails) is at its recorded start (the registry's `starts`): held back there, not left out,
    since it may already have stored rows whose deletes it has not read. A reader that has read
    none of a partition and recorded no start stored nothing of it: it does not hold the others back."""
    through = {stream: dict(parts) for stream, parts in ctx.store.progress(ctx.pipeline_name, row_counts=False).end_offsets.items()}
    registry = ctx.lag.registry if ctx.lag is not None else None  # the log's other consumers (fan-out)
    if registry is not None:
        for consumer in registry.consumers():
            if consumer.pipeline == ctx.pipeline_name:
                continue
            at = with_start(registry.offsets(consumer.pipeline), registry.starts(consumer.pipeline))
            for stream, parts in at.items():
                least = through.setdefault(stream, {})
                for partition, offset in parts.items():
                    least[partition] = min(least.get(partition, offset), offset)
    return through


def retention_loop(ctx: ApiContext, settings: Settings, stop: threading.Event, interval_s: float = 60.0) -> None:
    """A pass every `interval_s` until `stop` is set. A pass that fails (a locked or full disk, a
    store that is down) is logged and the next one runs as usual: the thread never dies of it,
    which would leave the log growing unseen for the rest of the process's life."""
    while not stop.wait(interval_s):
        try:
            retention_pass(ctx, settings)
        except Exception:
            log.exception("retention pass failed (retention, compaction): trying again in %.0f s", interval_s)
