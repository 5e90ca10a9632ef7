"""Broadcast feeds for the websocket hub, and their registry.

A feed is any object with a `topic: str` and a `poll() -> list[dict]` returning the
messages new since its previous call (JSON-able, each with its "type"). The hub calls
poll() from its tailer thread, never on the event loop. Other packages provide feeds
(`corrections`, `lag`); this module provides `pipeline`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from catalog import Catalog
from ingest.log import EventLog
from store import PaneStore


class FeedRegistry:
    """The feeds an API process broadcasts, by topic (one feed per topic)."""

    def __init__(self, feeds: Iterable = ()):
        self._feeds: dict[str, object] = {}
        for feed in feeds:
            self.add(feed)

    def add(self, feed) -> None:
        topic = getattr(feed, "topic", None)
        if not isinstance(topic, str) or not callable(getattr(feed, "poll", None)):
            raise TypeError(f"{feed!r} is not a feed: it needs a 'topic' string and a poll() method")
        if topic in self._feeds:
            raise ValueError(f"a feed for topic {topic!r} is already registered")
        self._feeds[topic] = feed

    def __iter__(self):
        return iter(self._feeds.values())

    def __len__(self) -> int:
        return len(self._feeds)


class PipelineFeed:
    """`pipeline` messages from the store's progress and the log's end offsets, at most one
    per `interval_s`: last batch, events/s into the log and into panes, lag in events."""

    topic = "pipeline"

    def __init__(self, store: PaneStore, log: EventLog, catalog: Catalog, pipeline: str = "main",
                 clock: Callable[[], float] | None = None, interval_s: float = 1.0,
                 query_health: Callable[[int], dict | None] | None = None,
                 cdc_status: Callable[[], list[dict]] | None = None):
        self.store = store
        self.cdc_status = cdc_status  # the CDC followers' status (GET /api/v1/cdc), read at each poll
        self.query_health = query_health  # now_ms -> the Spark query's health (lag.feed.query_health)
        self.log = log
        self.catalog = catalog
        self.pipeline = pipeline
        self.clock = clock or time.time
        self.interval_s = interval_s
        self._last: tuple[float, int, int] | None = None  # (monotonic s, events in log, events aggregated)

    def poll(self) -> list[dict]:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return []
        progress = self.store.progress(self.pipeline, row_counts=False)  # every second: no scan of the panes
        log_end = lag = 0
        for name in self.catalog.streams:
            committed = progress.end_offsets.get(name, {})
            for p, o in self.log.offsets(name).items():
                log_end += o.end
                lag += max(0, o.end - max(committed.get(p, o.start), o.start))
        aggregated = sum(s.events_aggregated for s in progress.streams.values())
        rate_in = rate_agg = None
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            rate_in = round(max(0, log_end - self._last[1]) / dt, 1)
            rate_agg = round(max(0, aggregated - self._last[2]) / dt, 1)
        self._last = (now, log_end, aggregated)
        at_ms = int(self.clock() * 1000)
        return [{
            "type": "pipeline", "at_ms": at_ms, "pipeline": self.pipeline,
            "last_batch_id": progress.last_batch_id, "last_commit_ms": progress.last_commit_ms,
            "events_in_per_second": rate_in, "events_aggregated_per_second": rate_agg,
            "lag_events": lag, "query": self.query_health(at_ms) if self.query_health else None,
            "watermarks": {s: p.watermark_ms for s, p in progress.streams.items()},
            # Per stream, the partition whose unread records hold its watermark back (none: absent).
            "watermark_held_by": {s: p.held_by_partition for s, p in progress.streams.items()
                                  if p.held_by_partition is not None},
            # Per enriched stream and table, the events enriched with "" (no row for their key then).
            "enrich_misses": {s: {t: n for t, n in p.enrich_misses.items() if n}
                              for s, p in progress.streams.items() if any(p.enrich_misses.values())},
            "cdc": [cdc_summary(c) for c in (self.cdc_status() if self.cdc_status else ())],
        }]


def cdc_summary(status: dict) -> dict:
    """What the status strip shows of a CDC-fed table: its state, its lag, why it failed, and
    whether the source table's columns changed since the snapshot, a snapshot's progress (the full
    status: GET /api/v1/cdc)."""
    schema = status.get("schema") or {}
    changed = [*(f"+{c}" for c in schema.get("added", ())), *(f"-{c}" for c in schema.get("removed", ()))]
    return {"stream": status["stream"], "table": status["table"], "state": status["state"],
            "lag_bytes": status.get("lag_bytes"), "lag_seconds": status.get("lag_seconds"),
            "error": status.get("error"), "schema_changed": changed,
            # While snapshotting: rows appended so far, of PostgreSQL's estimate (None otherwise).
            "snapshot_rows_done": status.get("snapshot_rows_done"),
            "snapshot_rows_estimate": status.get("snapshot_rows_estimate")}
