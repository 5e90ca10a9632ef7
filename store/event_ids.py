"""Event ids seen, for exact duplicate drops (a stream's `event_id_field`, aggregates/event_ids.py).

The ids a batch counted are written in the batch's own store transaction, with its panes and
its batch id: a batch replayed after a crash is either wholly recorded (skipped by its batch id)
or not at all (its ids are not there, so its own events are not taken for duplicates of
themselves).

Ids are remembered by ingest time, for the stream's `dedup_window`, and pruned after it. The
pruning horizon follows what the pipeline has read, not the wall clock: per partition, the
newest ingest time read from it (`event_id_partitions`); a partition read up to the log's end
counts as the newest of them (what it gets next is appended after that). The horizon is the oldest of
these minus the window, so a partition that lags (a replay, a catch-up after downtime) holds
pruning back and its later records still meet the ids of their earlier copies; the pipeline's
clock plays no part. (Spark's
global watermark, by contrast, would drop the lagging partition's records.) Pure, apart from
`apply` and `lookup`, which take a DB-API cursor and the backend's placeholder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EventIdCommit:
    """What a batch adds to the seen ids, saved in its transaction."""

    window_ms: Mapping[str, int]  # per stream that declares an event id: its dedup window
    counted: Sequence[tuple[str, str, int]] = ()  # (stream, event id, ingest ms) of each copy counted
    duplicates: Mapping[str, int] = field(default_factory=dict)  # per stream: events dropped
    # Per stream and partition: the newest ingest time read in this batch (records with an id).
    read_ingest_ms: Mapping[str, Mapping[int, int]] = field(default_factory=dict)


def advance_positions(before: Mapping[int, int], batch: Mapping[int, int]) -> dict[int, int]:
    """The newest ingest time read per partition after a batch (never goes back)."""
    out = dict(before)
    for p, t in batch.items():
        out[p] = max(out.get(p, t), t)
    return out


def prune_horizon(positions: Mapping[int, int], window_ms: int, *, read_offsets: Mapping[int, int],
                  log_end_offsets: Mapping[int, int]) -> int | None:
    """Ids counted before this ingest time can match no record still to be read: each such
    record has an ingest time of at least the oldest partition's position, and matches ids
    within `window_ms` of it. A partition read to the log's end counts as the newest position
    of all: what it gets next is appended after that. (The log's own time, never the pipeline's
    clock: an API whose clock is behind the pipeline's must not get its retries' ids pruned.)
    None: nothing known yet, or a partition with unread records and no position (no pruning)."""
    if not positions:
        return None
    newest = max(positions.values())
    lows = []
    for p in set(positions) | set(log_end_offsets):
        end = log_end_offsets.get(p)
        if end is not None and read_offsets.get(p, 0) >= end:
            lows.append(newest)  # caught up
        elif p in positions:
            lows.append(positions[p])
        elif end:  # unread records of an unknown age
            return None
    return min(lows) - window_ms


def lookup(cursor, stream: str, ids: Sequence[str], placeholder: str) -> dict[str, int]:
    """The ids of `ids` counted before, with their ingest times, in one query (each probe on the
    primary key): SQLite gets them as one JSON array, PostgreSQL as one array parameter."""
    if not ids:
        return {}
    if placeholder == "?":
        sql = ("SELECT event_id, ingest_ms FROM seen_event_ids WHERE stream = ?"
               " AND event_id IN (SELECT value FROM json_each(?))")
        args = (stream, json.dumps(list(ids)))
    else:
        sql = "SELECT event_id, ingest_ms FROM seen_event_ids WHERE stream = %s AND event_id = ANY(%s)"
        args = (stream, list(ids))
    cursor.execute(sql, args)
    return dict(cursor.fetchall())


def duplicate_counts(cursor) -> dict[str, int]:
    cursor.execute("SELECT stream, count FROM duplicate_counts")
    return dict(cursor.fetchall())


def apply(cursor, commit: EventIdCommit, *, end_offsets: Mapping[str, Mapping[int, int]],
          log_end_offsets: Mapping[str, Mapping[int, int]], placeholder: str) -> None:
    """Save a batch's event ids, partition positions and duplicate counts, then prune the ids
    past each stream's horizon; the caller owns the transaction."""
    q = placeholder
    if commit.counted:
        # A copy counted again after its window replaces the old record of its id.
        cursor.executemany(
            f"INSERT INTO seen_event_ids (stream, event_id, ingest_ms) VALUES ({q}, {q}, {q})"
            " ON CONFLICT (stream, event_id) DO UPDATE SET ingest_ms = excluded.ingest_ms", list(commit.counted))
    if any(commit.duplicates.values()):
        cursor.executemany(
            f"INSERT INTO duplicate_counts (stream, count) VALUES ({q}, {q})"
            " ON CONFLICT (stream) DO UPDATE SET count = duplicate_counts.count + excluded.count",
            [(s, n) for s, n in commit.duplicates.items() if n])
    for stream, window in commit.window_ms.items():
        cursor.execute(f"SELECT partition, read_ingest_ms FROM event_id_partitions WHERE stream = {q}", (stream,))
        before = dict(cursor.fetchall())
        positions = advance_positions(before, commit.read_ingest_ms.get(stream, {}))
        changed = [(stream, p, t) for p, t in positions.items() if before.get(p) != t]
        if changed:
            cursor.executemany(
                f"INSERT INTO event_id_partitions (stream, partition, read_ingest_ms) VALUES ({q}, {q}, {q})"
                " ON CONFLICT (stream, partition) DO UPDATE SET read_ingest_ms = excluded.read_ingest_ms", changed)
        horizon = prune_horizon(positions, window, read_offsets=end_offsets.get(stream, {}),
                                log_end_offsets=log_end_offsets.get(stream, {}))
        if horizon is not None:
            cursor.execute(f"DELETE FROM seen_event_ids WHERE stream = {q} AND ingest_ms < {q}", (stream, horizon))
