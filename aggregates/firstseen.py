"""First-seen keys and membership filters, computed per micro-batch: one Spark job, then numpy.

Per batch (inside the main pipeline's foreachBatch, before the store commit):

1. On the executors, the batch's one per-key job (aggregates/key_rows.py, shared with the
   sessions): every event of a stream with `first_seen` and/or `membership` is one row per key
   slot (the slot divides the membership bucket, or is the whole batch), grouped for the earliest
   event time; each key's hashes come from Spark's native `xxhash64` with the filter's two
   derived seeds (sketches/bloom.py documents the formula; its Python side computes the identical
   values). So a key new in this batch counts once, in the pane of its earliest event.
2. The slots reach the driver as one Arrow table; from them, per key its earliest time (tag 0,
   bucket 0) and per (key, membership bucket) a row (tag 1): `KeyRows.bloom_rows`.
3. On the driver, numpy over whole columns: the k bit positions by double hashing; the
   first-seen test of each key against the stream's long-lived filter as the store last
   committed it, counted per (stream, pane); the bits to add as the 4 KiB chunks of the
   filter they touch (the layout of Spark's `bitmap_construct_agg`, which the store ORs in).

Before, steps 2-3 ran on the executors too (positions exploded into rows, a bitmap aggregate
per chunk, a mapInArrow test against a broadcast filter): two more Spark jobs, a shuffle of
k rows per key and a Python worker per batch, several times the cost of this driver work.
Adding all keys of the batch (not just the new ones) sets the same bits, because a key
answered "seen" has all its bits set already.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from aggregates.driver_batch import among
from aggregates.key_rows import TAG_FIRST_SEEN, TAG_MEMBERSHIP, KeyItem, KeyRows, hash_columns, key_rows
from aggregates.spark import LazyColumn
from aggregates.stream_codes import stream_rows
from catalog import Catalog, StreamDef
from catalog.features import base_streams, source_field
from sketches.bloom import CHUNK_BITS, BloomFilter, optimal_shape, positions, undercount_bound
from store.bloom import FIRST_SEEN, MEMBERSHIP, BloomCommit, BloomReader, FilterUpdate, FirstSeenPartial

log = logging.getLogger("sketchboard.firstseen")


def _key_column(stream: StreamDef, field: str) -> Column:
    column, index = source_field(stream, field)
    return F.get(F.col(column), index)


@dataclass(frozen=True)
class BloomPlan:
    """What a batch's Bloom work needs before its Spark job: what it reads per event (`key_rows`), each
    filter's (m, k, seed) per (stream, tag), and the first-seen filters as last committed."""
    items: list[KeyItem]
    shapes: dict[tuple[str, int], tuple[int, int, int]]
    filters: dict[str, BloomFilter]


class BloomFeatures:
    """The first-seen and membership part of a micro-batch (see the module docstring)."""

    def __init__(self, spark: SparkSession, catalog: Catalog, reader: BloomReader):
        self.spark = spark
        self.streams = {n: s for n, s in base_streams(catalog).items() if s.first_seen or s.membership}
        self.reader = reader  # the store's (PaneStore.bloom_reader): the filters as last committed
        self._warned: set[str] = set()
        self._columns: dict[tuple, Column] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.streams)

    def _column(self, stream: StreamDef, field: str | None, *, bucket: int | None = None) -> Column:
        """A key's column (or with `bucket`, the event time's bucket), built once: each is a few
        calls into the JVM, which a small batch's driver time is made of."""
        at = (stream.name, field, bucket)
        if at not in self._columns:
            # Built at the Spark path's first use: the driver path reads the key by its place in the
            # row (KeyItem.source) and runs without a SparkContext (aggregates/spark.py LazySpark).
            self._columns[at] = LazyColumn(lambda: _key_column(stream, field) if bucket is None else
                                           F.col("event_time") - F.pmod(F.col("event_time"),
                                                                        F.lit(bucket).cast("bigint")))
        return self._columns[at]

    def _first_seen_filter(self, stream: StreamDef) -> BloomFilter:
        decl = stream.first_seen
        stored = self.reader.first_seen_filter(stream.name)
        if stored is None:
            return BloomFilter.for_capacity(decl.capacity, decl.fpp, decl.seed)
        configured = (*optimal_shape(decl.capacity, decl.fpp), decl.seed)
        if stored.shape != configured and stream.name not in self._warned:
            # A new shape would forget every key seen so far (all would look new): keep the stored one.
            log.warning("stream %s: first_seen filter stored with (m, k, seed) = %s, configured %s; keeping the"
                        " stored shape", stream.name, stored.shape, configured)
            self._warned.add(stream.name)
        return stored

    def plan(self, streams: Collection[str] | None = None) -> BloomPlan:
        """`streams`: those with records in the batch (None: unknown); the others' filters are not read."""
        present = {n: self.streams[n] for n in among(self.streams, streams)}
        filters: dict[str, BloomFilter] = {
            n: self._first_seen_filter(s) for n, s in present.items() if s.first_seen
        }
        shapes: dict[tuple[str, int], tuple[int, int, int]] = {}
        items: list[KeyItem] = []
        for name, stream in present.items():
            if stream.first_seen:
                field = stream.first_seen.field
                shapes[(name, TAG_FIRST_SEEN)] = filters[name].shape
                items.append(KeyItem(name, TAG_FIRST_SEEN, field, self._column(stream, field),
                                     seed=filters[name].seed, source=source_field(stream, field)))
            if stream.membership:
                decl = stream.membership
                shapes[(name, TAG_MEMBERSHIP)] = (*optimal_shape(decl.capacity, decl.fpp), decl.seed)
                items.append(KeyItem(name, TAG_MEMBERSHIP, decl.field, self._column(stream, decl.field),
                                     self._column(stream, None, bucket=decl.bucket), seed=decl.seed,
                                     bucket_ms=decl.bucket, source=source_field(stream, decl.field)))
        return BloomPlan(items, shapes, filters)

    def process(self, batch: DataFrame) -> BloomCommit | None:
        """The batch's Bloom work alone (the pipeline shares the job with sessions: `bloom_and_runs`)."""
        if not self.streams:
            return None
        plan = self.plan()
        # The batch's one Spark job for Bloom filters: its distinct keys' two hashes (16 bytes a
        # key, a few hundred thousand at most per batch) reach the driver as one Arrow table.
        return self.commit(key_rows(batch, plan.items), plan)

    def commit(self, rows: KeyRows, plan: BloomPlan) -> BloomCommit:
        return self.commit_of(rows.bloom_rows(), plan.shapes, plan.filters)

    def commit_of(self, keys: pa.Table, shapes: dict[tuple[str, int], tuple[int, int, int]],
                  filters: dict[str, BloomFilter]) -> BloomCommit:
        """The BloomCommit of a batch's distinct keys (columns stream, tag, bucket, first_ms, h1,
        h2), on the driver: the positions, the first-seen test and the bits to add are numpy over
        whole columns (no Python per key). Rows without hashes (a session key no filter reads) are skipped."""
        keys = keys.filter(pc.is_valid(keys["h1"]))
        stream = keys.column("stream")
        tag, bucket, first_ms, h1, h2 = (keys.column(c).to_numpy() for c in ("tag", "bucket", "first_ms", "h1", "h2"))
        updates: list[FilterUpdate] = []
        first_seen: list[FirstSeenPartial] = []
        for (name, t), (m, k, seed) in sorted(shapes.items()):
            mask = stream_rows(stream, [name]) & (tag == t)
            if not mask.any():
                continue
            pos = positions(h1[mask], h2[mask], m, k)
            kind = FIRST_SEEN if t == TAG_FIRST_SEEN else MEMBERSHIP
            buckets = bucket[mask]
            for b in np.unique(buckets):
                updates.append(FilterUpdate(name, kind, int(b), m, k, seed, chunks_of(pos[buckets == b], m)))
            if t == TAG_FIRST_SEEN:
                first_seen += self._first_seen_partials(name, filters[name], first_ms[mask], pos)
        return BloomCommit(filters=updates, first_seen=first_seen)

    def _first_seen_partials(self, name: str, filt: BloomFilter, first_ms: np.ndarray,
                             pos: np.ndarray) -> list[FirstSeenPartial]:
        """Per pane of each key's earliest event: keys tested against the filter as the store
        last committed it, and those it answered "seen" (every bit set)."""
        seen = filt.test_positions(pos)
        pane = self.streams[name].pane
        starts, inverse = np.unique(first_ms - np.mod(first_ms, pane), return_inverse=True)
        tested = np.bincount(inverse, minlength=len(starts))
        positives = np.bincount(inverse, weights=seen, minlength=len(starts)).astype(np.int64)
        fpp = filt.false_positive_probability()
        return [FirstSeenPartial(name, int(s), int(s) + pane, int(n - p), int(n), int(p), int(n) * fpp,
                                 undercount_bound(int(n), int(p), fpp))
                for s, n, p in zip(starts, tested, positives, strict=True)]


def chunks_of(pos: np.ndarray, m: int) -> dict[int, bytes]:
    """The filter chunks that `pos` (bit positions of an m-bit filter) touch, each as the 4 KiB
    bitmap Spark's bitmap_construct_agg builds: bit p is bit p mod 8 of byte p div 8, a last
    partial chunk padded with zeros."""
    flat = np.asarray(pos, dtype=np.int64).ravel()
    n_chunks = -(-m // CHUNK_BITS)
    bits = np.zeros(n_chunks * CHUNK_BITS, dtype=bool)
    bits[flat] = True
    packed = np.packbits(bits, bitorder="little").reshape(n_chunks, CHUNK_BITS // 8)
    # A count per chunk rather than np.unique of the chunk numbers: a batch's ~350 000 positions
    # (50 000 keys, k = 7) sorted took 12 of the 20 ms this function cost a batch.
    touched = np.flatnonzero(np.bincount(flat // CHUNK_BITS, minlength=n_chunks))
    return {int(c): packed[c].tobytes() for c in touched.tolist()}


__all__ = ["BloomFeatures", "BloomPlan", "chunks_of", "hash_columns"]  # hash_columns: kept importable from here
