"""Bloom filters and first-seen counts in the serving store (SQLite).

A filter is stored as a header row (its shape and the number of bits set) plus 4 KiB chunks
(32768 bits, the bucket of Spark's bitmap_construct_agg), so a batch rewrites only the
chunks it touched. Filters are keyed by (stream, kind, bucket_ms, m, k, seed): kind is
'first_seen' (one long-lived filter per stream, bucket_ms 0) or 'membership' (one per
coarse event-time bucket); a configuration change of shape starts a new filter instead of
corrupting an old one.

`apply_bloom_commit` runs inside SqlitePaneStore's batch transaction (same connection), so
the filter bits and first-seen counts are saved exactly once with the panes and the batch id.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sketches.bloom import CHUNK_BYTES, BloomFilter
from store.tables import BLOOM_TABLES
from store.connection import open_connection, read_snapshot

if TYPE_CHECKING:  # store.commit_plan imports store.base, which imports this module
    from store.commit_plan import BloomHorizons

FIRST_SEEN = "first_seen"
MEMBERSHIP = "membership"



@dataclass(frozen=True)
class FilterUpdate:
    """Bits to OR into one stored filter (created empty when missing)."""

    stream: str
    kind: str
    bucket_ms: int
    m: int
    k: int
    seed: int
    chunks: Mapping[int, bytes]  # chunk index -> up to 4 KiB of bits (Spark bitmap layout)


@dataclass(frozen=True)
class FirstSeenPartial:
    """One batch's first-seen result for one pane of one stream."""

    stream: str
    start_ms: int
    end_ms: int
    new_keys: int
    tested: int
    positives: int
    expected_fp: float
    bound: int


@dataclass(frozen=True)
class BloomCommit:
    """What a batch writes for Bloom filters, inside the batch's one transaction."""

    filters: Sequence[FilterUpdate] = field(default_factory=tuple)
    first_seen: Sequence[FirstSeenPartial] = field(default_factory=tuple)


@dataclass(frozen=True)
class FirstSeenRow(FirstSeenPartial):
    """A stored pane's first-seen counts (the batches' partials summed) and its newest batch."""

    last_batch: int


def create_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(BLOOM_TABLES)


def merge_chunk(update: FilterUpdate, index: int, incoming: bytes, stored: bytes | None) -> tuple[bytes, int]:
    """A filter chunk after OR-ing a batch's bits into the stored ones, and how many bits that
    set (what the filter's bits_set grows by). Pure: every store backend uses it."""
    n_chunks = -(-update.m // (CHUNK_BYTES * 8))
    if not 0 <= index < n_chunks:
        raise ValueError(f"chunk {index} is outside a filter of {update.m} bits ({update.stream}, {update.kind})")
    size = min(CHUNK_BYTES, update.m // 8 - index * CHUNK_BYTES)
    new = np.frombuffer(bytes(incoming), dtype=np.uint8)[:size]
    if len(new) < size:
        new = np.pad(new, (0, size - len(new)))
    if stored is None:
        return new.tobytes(), int(np.bitwise_count(new).sum())
    old = np.frombuffer(bytes(stored), dtype=np.uint8)
    merged = np.bitwise_or(old, new)
    return merged.tobytes(), int(np.bitwise_count(merged).sum()) - int(np.bitwise_count(old).sum())


def apply_bloom_commit(conn: sqlite3.Connection, bloom: BloomCommit, batch_id: int, now_ms: int) -> None:
    """OR the filter chunks in and add the first-seen counts; the caller owns the transaction."""
    for update in bloom.filters:
        shape = (update.stream, update.kind, update.bucket_ms, update.m, update.k, update.seed)
        row = conn.execute(
            "SELECT bits_set FROM bloom_filters WHERE stream = ? AND kind = ? AND bucket_ms = ? AND m = ? AND k = ?"
            " AND seed = ?", shape,
        ).fetchone()
        bits_set = row[0] if row else 0
        old = dict(conn.execute(
            "SELECT chunk, data FROM bloom_chunks WHERE stream = ? AND kind = ? AND bucket_ms = ? AND m = ? AND k = ?"
            " AND seed = ? AND chunk IN (SELECT value FROM json_each(?))", (*shape, json.dumps(list(update.chunks))),
        ).fetchall())
        merged = []
        for index, incoming in update.chunks.items():
            data, added = merge_chunk(update, index, incoming, old.get(index))
            bits_set += added
            merged.append((*shape, index, data))
        # One read and one write of the chunks (~350 a batch of the demo), as PostgreSQL's does: a
        # statement each cost ~30 ms a batch.
        conn.executemany(
            "INSERT INTO bloom_chunks (stream, kind, bucket_ms, m, k, seed, chunk, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (stream, kind, bucket_ms, m, k, seed, chunk) DO UPDATE SET data = excluded.data", merged,
        )
        conn.execute(
            "INSERT INTO bloom_filters (stream, kind, bucket_ms, m, k, seed, bits_set, updated_batch, updated_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, kind, bucket_ms, m, k, seed) DO UPDATE SET"
            " bits_set = excluded.bits_set, updated_batch = excluded.updated_batch, updated_at_ms = excluded.updated_at_ms",
            (*shape, bits_set, batch_id, now_ms),
        )
    conn.executemany(
        "INSERT INTO first_seen (stream, start_ms, end_ms, new_keys, tested, positives, expected_fp, bound,"
        " updated_at_ms, last_batch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, start_ms) DO UPDATE SET"
        " new_keys = new_keys + excluded.new_keys, tested = tested + excluded.tested,"
        " positives = positives + excluded.positives, expected_fp = expected_fp + excluded.expected_fp,"
        " bound = bound + excluded.bound, updated_at_ms = excluded.updated_at_ms, last_batch = excluded.last_batch",
        [(p.stream, p.start_ms, p.end_ms, p.new_keys, p.tested, p.positives, p.expected_fp, p.bound, now_ms, batch_id)
         for p in bloom.first_seen],
    )


def drop_expired(cursor, horizons: Mapping[str, BloomHorizons], placeholder: str) -> None:
    """Delete what a retention run drops of each stream's Bloom features (the horizons are
    store.commit_plan.bloom_horizons'), on any backend: the caller owns the transaction, the
    batch's own, so the filters and counts go with the panes they describe."""
    q = placeholder
    for stream, horizon in horizons.items():
        if horizon.membership_through_ms is not None:
            for table in ("bloom_chunks", "bloom_filters"):
                cursor.execute(f"DELETE FROM {table} WHERE stream = {q} AND kind = {q} AND bucket_ms <= {q}",
                               (stream, MEMBERSHIP, horizon.membership_through_ms))
        cursor.execute(f"DELETE FROM first_seen WHERE stream = {q} AND end_ms <= {q} AND start_ms < {q}",
                       (stream, horizon.first_seen_ends_by_ms, horizon.first_seen_starts_before_ms))


class BloomReader(ABC):
    """Reads Bloom filters and first-seen counts, whatever the store backend; a pane store gives
    its own (PaneStore.bloom_reader), so no caller needs to know where the store lives."""

    @abstractmethod
    def first_seen_filter(self, stream: str) -> BloomFilter | None:
        """The stream's long-lived first-seen filter (the most recently updated shape), or None."""

    @abstractmethod
    def membership_filters(self, stream: str, start_ms: int, end_ms: int) -> list[tuple[int, BloomFilter]]:
        """(bucket start, filter) for the membership buckets starting in [start_ms, end_ms)."""

    @abstractmethod
    def first_seen_rows(self, stream: str, start_ms: int, end_ms: int) -> list[FirstSeenRow]:
        """The first-seen counts of the panes starting in [start_ms, end_ms), by start."""

    def close(self) -> None:
        """Readers that own a connection release it."""


class BloomStore(BloomReader):
    """Reads filters and first-seen counts from the store file, on its own connection (WAL:
    readers see the last committed batch while the pipeline writes)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self._conn = open_connection(self.path, synchronous=None, busy_timeout_s=busy_timeout_s)
        self._lock = threading.Lock()
        with self._lock, read_snapshot(self._conn):  # the header and the chunks of one commit
            create_schema(self._conn)

    def _filter(self, stream: str, kind: str, bucket_ms: int, m: int, k: int, seed: int) -> BloomFilter:
        bloom = BloomFilter(m, k, seed)
        for index, data in self._conn.execute(
            "SELECT chunk, data FROM bloom_chunks WHERE stream = ? AND kind = ? AND bucket_ms = ? AND m = ? AND k = ?"
            " AND seed = ?", (stream, kind, bucket_ms, m, k, seed),
        ):
            bloom.or_chunk(index, data)
        return bloom

    def first_seen_filter(self, stream: str) -> BloomFilter | None:
        """The stream's long-lived first-seen filter (the most recently updated shape), or None."""
        with self._lock, read_snapshot(self._conn):  # the header and the chunks of one commit
            row = self._conn.execute(
                "SELECT m, k, seed FROM bloom_filters WHERE stream = ? AND kind = ? AND bucket_ms = 0"
                " ORDER BY updated_batch DESC LIMIT 1", (stream, FIRST_SEEN),
            ).fetchone()
            return None if row is None else self._filter(stream, FIRST_SEEN, 0, *row)

    def membership_filters(self, stream: str, start_ms: int, end_ms: int) -> list[tuple[int, BloomFilter]]:
        """(bucket start, filter) for the membership buckets starting in [start_ms, end_ms)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT bucket_ms, m, k, seed FROM bloom_filters WHERE stream = ? AND kind = ? AND bucket_ms >= ?"
                " AND bucket_ms < ? ORDER BY bucket_ms", (stream, MEMBERSHIP, start_ms, end_ms),
            ).fetchall()
            return [(b, self._filter(stream, MEMBERSHIP, b, m, k, seed)) for b, m, k, seed in rows]

    def first_seen_rows(self, stream: str, start_ms: int, end_ms: int) -> list[FirstSeenRow]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT stream, start_ms, end_ms, new_keys, tested, positives, expected_fp, bound, last_batch"
                " FROM first_seen WHERE stream = ? AND start_ms >= ? AND start_ms < ? ORDER BY start_ms",
                (stream, start_ms, end_ms),
            ).fetchall()
        return [FirstSeenRow(*row) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def overlay_first_seen(points: Sequence, rows: Sequence[FirstSeenRow], window_ms: int) -> list:
    """Points of a `count` roll-up (t, count, final, revision) with the value replaced by the
    first-seen keys of the window and an error bound: the true count lies in [value, value + bound]
    (a false positive can only hide a new key), expected_undercount = sum of tested * fpp."""
    from store.rollup import ErrorBound, Point

    starts = np.array([r.start_ms for r in rows], dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    starts = starts[order]
    new = np.concatenate([[0], np.cumsum([rows[i].new_keys for i in order])])
    bound = np.concatenate([[0], np.cumsum([rows[i].bound for i in order])])
    expected = np.concatenate([[0.0], np.cumsum([rows[i].expected_fp for i in order])])
    out = []
    for p in points:
        lo, hi = np.searchsorted(starts, p.t_ms, "left"), np.searchsorted(starts, p.t_ms + window_ms, "left")
        value = float(new[hi] - new[lo])
        error = ErrorBound("bloom", lower=value, upper=value + float(bound[hi] - bound[lo]),
                           expected_undercount=float(expected[hi] - expected[lo]))
        out.append(Point(t_ms=p.t_ms, value=value, count=p.count, final=p.final, revision=p.revision, error=error))
    return out
