"""A log with out-of-order events, stragglers past the allowed lateness, events beyond the
retention horizon, events from a clock far in the future, and four records that bypassed the
API (embedded: a corrupt segment and a record without an event time written straight into the
log's SQLite file; Kafka: malformed JSON produced straight to the topic). And the oracle: what
the pipeline must make of it, computed independently of the store from Spark's own offset
log (which records went in which batch) and the dead-letter rule. Both work on either log
(tests/log_backends.py)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aggregates.eventtime import dead_letter_reason
from catalog import Catalog
from ingest.events import EventValidator
from store import dims_key
from store.panes import advance_watermark, is_final, pane_start
from tests.log_backends import TestLog
from tests.support.events import validate_many

STREAM = "http_requests"
DAY = 86_400_000
ENDPOINTS = ["/", "/api/cart", "/api/search"]
REGIONS = ["eu", "us", "ap"]


@dataclass
class StragglerLog:
    base_ms: int
    bypassed: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset) of records that bypassed the API
    records: int = 0
    logins: int = 0  # records of the logins stream, beside the http_requests ones


LOGINS = "logins"  # the demo's credential_stuffing pattern reads it: its state crosses the crash too


def _login_bursts(rng, base_ms: int) -> list[tuple[int, dict]]:
    """(arrival, login): 24 users with 5-8 failures from one address then (3 in 4) a success
    from it, a few seconds apart in the first 3 minutes (credential_stuffing matches), and 200
    ordinary logins; arriving within ~1 s, one in ten 40-90 s late (behind the pattern's watermark)."""
    out = []
    for u in range(24):
        t, ip = base_ms + int(rng.integers(0, 180_000)), f"203.0.113.{u}"
        outcomes = ["failure"] * int(rng.integers(5, 9)) + ["success" if u % 4 else "failure"]
        for outcome in outcomes:
            t += int(rng.integers(1_000, 10_000))
            out.append({"time": t, "user_id": f"stuffed{u}", "outcome": outcome, "client": "web", "ip": ip})
    for _ in range(200):
        out.append({"time": base_ms + int(rng.integers(0, 300_000)), "user_id": f"u{rng.integers(0, 5000)}",
                    "outcome": "success", "client": "app", "ip": f"198.51.100.{rng.integers(0, 250)}"})
    late = rng.random(len(out)) < 0.1
    delay = np.where(late, rng.integers(40_000, 90_000, len(out)), rng.exponential(800.0, len(out)).astype(np.int64))
    return [(e["time"] + int(d), e) for e, d in zip(out, delay, strict=True)]


def _event(rng, t: int) -> dict:
    return {"time": int(t), "endpoint": str(rng.choice(ENDPOINTS)), "method": "GET", "status": 200,
            "region": str(rng.choice(REGIONS)), "latency_ms": float(np.round(rng.lognormal(3.5, 0.8), 3)),
            "response_bytes": 512, "user_id": f"u{rng.integers(0, 5000)}"}


def write_straggler_log(test_log: TestLog, catalog: Catalog, base_ms: int, *, n: int = 16_000, seed: int = 11,
                        chunk: int = 400) -> StragglerLog:
    """Events over 5 minutes of event time from base_ms, appended in arrival order (ingest
    time = arrival on the embedded log, the broker's clock on Kafka): most arrive within ~1 s,
    6 % are 40..150 s late (past the 30 s allowed lateness), 25 are 8 days old, 25 come from a
    clock an hour ahead; mid-way, 4 records that bypassed the API go into partition 0."""
    stream = catalog.stream(STREAM)
    rng = np.random.default_rng(seed)
    times = base_ms + rng.integers(0, 300_000, n)
    delay = np.where(rng.random(n) < 0.06, rng.integers(40_000, 150_000, n), rng.exponential(800.0, n).astype(np.int64))
    arrival = times + delay
    order = np.argsort(arrival, kind="stable")
    events = [(int(arrival[i]), _event(rng, times[i])) for i in order]
    # Beyond the horizon and from the future: arriving at random points in the sequence.
    for k in range(50):
        at = int(rng.integers(0, len(events)))
        arrive = events[at][0]
        t = base_ms - 8 * DAY + int(rng.integers(0, 60_000)) if k % 2 else arrive + 3_600_000 + k
        events.insert(at, (arrive, _event(rng, t)))
    validator = EventValidator(stream)
    logins = sorted(_login_bursts(rng, base_ms), key=lambda ae: ae[0]) if LOGINS in catalog.streams else []
    login_validator = EventValidator(catalog.stream(LOGINS)) if logins else None
    log = test_log.open(catalog)
    out = StragglerLog(base_ms)
    for i in range(0, len(events), chunk):
        part = events[i : i + chunk]
        good, rejected = validate_many(validator, [e for _, e in part])
        assert not rejected, rejected[:1]
        log.append(stream, good, max(a for a, _ in part))
        # The logins that arrived by then go in beside them (so batches hold both streams).
        due = [e for a, e in logins if a <= max(a for a, _ in part) or i + chunk >= len(events)]
        if due:
            logins = logins[len(due):]
            accepted, refused = validate_many(login_validator, due)
            assert not refused, refused[:1]
            log.append(catalog.stream(LOGINS), accepted, max(a for a, _ in part))
            out.logins += len(accepted)
        out.records += len(good)
        if i == chunk * 15:
            out.bypassed |= test_log.write_bad_records(log, stream, max(a for a, _ in part))
            out.records += 4
    log.close()
    return out


@dataclass
class Oracle:
    """What the store must hold after the pipeline drained, computed from the log alone."""

    panes: dict[tuple[int, str], tuple[int, float, float, float]]  # count, sum, min, max of latency
    corrections: dict[tuple[int, int, str], int]  # (batch, pane start, dims) -> events added
    dead: dict[tuple[int, int], str]  # (partition, offset) -> reason
    good_latencies: list[float]
    users_by_endpoint: dict[str, set[str]]
    max_event_ms: int
    read: int


def oracle(test_log: TestLog, checkpoint_dir: Path, catalog: Catalog, batch_now_ms: int) -> Oracle:
    """Replay the batches Spark logged (checkpoints/offsets/N), classify each record with the
    dead-letter rule, and apply the finality rule with the watermark as of each batch start.

    The watermark is per partition (docs/event-time.md: Watermark), written out here for a
    log that was complete before the pipeline started and a clock that stands still (no
    partition goes idle): the minimum of (newest merged event - lateness) over the partitions
    that still have unread records, held where it is while one of those has merged nothing;
    the newest event - lateness once none has; never backwards."""
    stream = catalog.stream(STREAM)
    log = test_log.open(catalog)
    start = {p: o.start for p, o in log.offsets(STREAM).items()}
    log_end = {p: o.end for p, o in log.offsets(STREAM).items()}
    newest: dict[int, int] = {}  # per partition: the newest event time merged from it
    panes: dict[tuple[int, str], list[float]] = defaultdict(list)
    corrections: dict[tuple[int, int, str], int] = defaultdict(int)
    dead: dict[tuple[int, int], str] = {}
    users: dict[str, set[str]] = defaultdict(set)
    wm = None
    max_event = None
    read = 0
    batch = 0
    while (checkpoint_dir / "offsets" / str(batch)).exists():
        end = test_log.end_offsets(catalog, checkpoint_dir, batch).get(STREAM, {})
        batch_max = None
        for p, hi in sorted(end.items()):
            for rows in test_log.source_rows(log, catalog, stream, p, start.get(p, 0), hi):
                for r in rows.to_pylist():
                    read += 1
                    reason = dead_letter_reason(r["event_time"], r["ingest_time"], r["error"], batch_now_ms=batch_now_ms,
                                                retention_ms=stream.retention, max_future_skew_ms=stream.max_future_skew,
                                                error_kind=r["error_kind"])
                    if reason is not None:
                        dead[(p, r["offset"])] = reason
                        continue
                    t = r["event_time"]
                    key = (pane_start(t, stream.pane), dims_key(dict(zip(stream.dimensions, r["dims"], strict=True))))
                    panes[key].append(r["vals"][0])
                    users[r["dims"][0]].add(r["ids"][0])
                    if is_final(wm, key[0] + stream.pane):
                        corrections[(batch, *key)] += 1
                    batch_max = t if batch_max is None else max(batch_max, t)
                    newest[p] = max(newest.get(p, t), t)
            start[p] = hi
        unread = [p for p in log_end if start.get(p, 0) < log_end[p]]
        if not unread:
            wm = advance_watermark(wm, max(newest.values(), default=None), stream.allowed_lateness)
        elif all(p in newest for p in unread):
            wm = advance_watermark(wm, min(newest[p] for p in unread), stream.allowed_lateness)
        if batch_max is not None:
            max_event = batch_max if max_event is None else max(max_event, batch_max)
        batch += 1
    log.close()
    return Oracle(
        panes={k: (len(v), float(np.sum(v)), min(v), max(v)) for k, v in panes.items()},
        corrections=dict(corrections), dead=dead,
        good_latencies=[x for v in panes.values() for x in v], users_by_endpoint=dict(users),
        max_event_ms=max_event, read=read,
    )
