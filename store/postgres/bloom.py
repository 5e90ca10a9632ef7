"""Bloom filters and first-seen counts on PostgreSQL: the batch's bits OR-ed in inside the
batch transaction (store.bloom.merge_chunk decides the bits), and the reader the API and the
pipeline driver use (store.bloom.BloomReader)."""

from __future__ import annotations

import psycopg
from psycopg_pool import ConnectionPool

from sketches.bloom import BloomFilter
from store.postgres.db import snapshot
from store.bloom import FIRST_SEEN, MEMBERSHIP, BloomCommit, BloomReader, FirstSeenRow, merge_chunk

_SHAPE = "stream = %s AND kind = %s AND bucket_ms = %s AND m = %s AND k = %s AND seed = %s"


def apply_bloom_commit(conn: psycopg.Connection, bloom: BloomCommit, batch_id: int, now_ms: int) -> None:
    """OR the filter chunks in and add the first-seen counts; the caller owns the transaction."""
    for update in bloom.filters:
        shape = (update.stream, update.kind, update.bucket_ms, update.m, update.k, update.seed)
        row = conn.execute(f"SELECT bits_set FROM bloom_filters WHERE {_SHAPE}", shape).fetchone()
        bits_set = row[0] if row else 0
        old = dict(conn.execute(f"SELECT chunk, data FROM bloom_chunks WHERE {_SHAPE} AND chunk = ANY(%s)",
                                (*shape, list(update.chunks))).fetchall())
        merged = []
        for index, incoming in update.chunks.items():
            data, added = merge_chunk(update, index, incoming, old.get(index))
            bits_set += added
            merged.append((*shape, index, data))
        with conn.cursor() as cur:
            if merged:
                cur.executemany(
                    "INSERT INTO bloom_chunks (stream, kind, bucket_ms, m, k, seed, chunk, data)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, kind, bucket_ms, m, k, seed, chunk)"
                    " DO UPDATE SET data = excluded.data", merged)
        conn.execute(
            "INSERT INTO bloom_filters (stream, kind, bucket_ms, m, k, seed, bits_set, updated_batch, updated_at_ms)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, kind, bucket_ms, m, k, seed) DO UPDATE SET"
            " bits_set = excluded.bits_set, updated_batch = excluded.updated_batch,"
            " updated_at_ms = excluded.updated_at_ms", (*shape, bits_set, batch_id, now_ms))
    if bloom.first_seen:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO first_seen (stream, start_ms, end_ms, new_keys, tested, positives, expected_fp, bound,"
                " updated_at_ms, last_batch) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (stream, start_ms) DO UPDATE SET new_keys = first_seen.new_keys + excluded.new_keys,"
                " tested = first_seen.tested + excluded.tested, positives = first_seen.positives + excluded.positives,"
                " expected_fp = first_seen.expected_fp + excluded.expected_fp,"
                " bound = first_seen.bound + excluded.bound, updated_at_ms = excluded.updated_at_ms,"
                " last_batch = excluded.last_batch",
                [(p.stream, p.start_ms, p.end_ms, p.new_keys, p.tested, p.positives, p.expected_fp, p.bound, now_ms,
                  batch_id) for p in bloom.first_seen])


class PostgresBloomReader(BloomReader):
    """On the pane store's pool (the pool is the store's to close)."""

    def __init__(self, pool: ConnectionPool):
        self._pool = pool

    @staticmethod
    def _filter(conn: psycopg.Connection, stream: str, kind: str, bucket_ms: int, m: int, k: int,
                seed: int) -> BloomFilter:
        bloom = BloomFilter(m, k, seed)
        for index, data in conn.execute(f"SELECT chunk, data FROM bloom_chunks WHERE {_SHAPE}",
                                        (stream, kind, bucket_ms, m, k, seed)):
            bloom.or_chunk(index, data)
        return bloom

    def first_seen_filter(self, stream: str) -> BloomFilter | None:
        with self._pool.connection() as conn, snapshot(conn):  # header and chunks of one commit
            row = conn.execute("SELECT m, k, seed FROM bloom_filters WHERE stream = %s AND kind = %s AND bucket_ms = 0"
                               " ORDER BY updated_batch DESC LIMIT 1", (stream, FIRST_SEEN)).fetchone()
            return None if row is None else self._filter(conn, stream, FIRST_SEEN, 0, *row)

    def membership_filters(self, stream: str, start_ms: int, end_ms: int) -> list[tuple[int, BloomFilter]]:
        with self._pool.connection() as conn, snapshot(conn):
            rows = conn.execute(
                "SELECT bucket_ms, m, k, seed FROM bloom_filters WHERE stream = %s AND kind = %s AND bucket_ms >= %s"
                " AND bucket_ms < %s ORDER BY bucket_ms", (stream, MEMBERSHIP, start_ms, end_ms)).fetchall()
            return [(b, self._filter(conn, stream, MEMBERSHIP, b, m, k, seed)) for b, m, k, seed in rows]

    def first_seen_rows(self, stream: str, start_ms: int, end_ms: int) -> list[FirstSeenRow]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT stream, start_ms, end_ms, new_keys, tested, positives, expected_fp, bound, last_batch"
                " FROM first_seen WHERE stream = %s AND start_ms >= %s AND start_ms < %s ORDER BY start_ms",
                (stream, start_ms, end_ms)).fetchall()
        return [FirstSeenRow(*row) for row in rows]
