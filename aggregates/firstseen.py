"""First-seen keys and membership filters, computed per micro-batch on the executors.

Per batch (inside the main pipeline's foreachBatch, before the store commit):

1. On the executors: every event of a stream with `first_seen` and/or `membership` yields
   (tag, key, bucket) rows (tag 0: first-seen, bucket 0; tag 1: membership, bucket = start
   of the event-time bucket); group by (stream, tag, bucket, key) -> earliest event time.
   So a key new in this batch counts once, in the pane of its earliest event.
2. Still on the executors: the k bit positions of each key, from Spark's native
   `xxhash64` with the filter's two derived seeds (sketches/bloom.py documents the formula;
   the Python side computes identical positions for lookups).
3. First-seen: each key is tested against the stream's long-lived filter, broadcast to the
   executors (a vectorised Arrow/numpy test in `mapInArrow`); count tested and "seen"
   keys per (stream, pane) on the executors; only those counts reach the driver.
4. Bits to add: positions -> (chunk, bit) -> Spark's `bitmap_construct_agg` per
   (stream, tag, bucket, chunk): 4 KiB bitmaps that the store ORs into its chunks.

The driver only assembles a BloomCommit: counts per pane, the undercount bound, chunk bytes.
Adding all keys of the batch (not just the new ones) sets the same bits, because a key
answered "seen" has all its bits set already.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from catalog import Catalog, StreamDef
from catalog.features import base_streams, source_field
from sketches.bloom import CHUNK_BITS, SALT2, BloomFilter, optimal_shape, undercount_bound
from store.bloom import FIRST_SEEN, MEMBERSHIP, BloomCommit, BloomReader, FilterUpdate, FirstSeenPartial

log = logging.getLogger("sketchboard.firstseen")

TAG_FIRST_SEEN = 0
TAG_MEMBERSHIP = 1
_ITEM = "struct<tag:int,key:string,bucket:bigint>"


def _key_column(stream: StreamDef, field: str) -> Column:
    column, index = source_field(stream, field)
    return F.get(F.col(column), index)


def _case(items: dict[tuple[str, int], object], cast: str) -> Column:
    """CASE over (stream, tag) -> a literal."""
    expr = None
    for (stream, tag), value in items.items():
        cond = (F.col("stream") == stream) & (F.col("tag") == tag)
        expr = (F.when if expr is None else expr.when)(cond, F.lit(value).cast(cast))
    return expr.otherwise(F.lit(None).cast(cast))


def bit_positions(h1: Column, h2: Column, m: Column, k: Column) -> Column:
    """The k positions by double hashing, as sketches.bloom.positions computes them."""
    a = F.pmod(h1, m)
    b = F.pmod(h2, m - F.lit(1)) + F.lit(1)
    return F.transform(F.sequence(F.lit(0), k - F.lit(1)), lambda i: F.pmod(a + i.cast("bigint") * b, m))


def with_positions(df: DataFrame, seed: Column, m: Column, k: Column) -> DataFrame:
    """Add `pos` (array<bigint>) for the `key` column: Spark's xxhash64 with the two derived seeds."""
    seed = seed.cast("bigint")
    h1 = F.xxhash64(seed, F.col("key"))
    h2 = F.xxhash64(seed.bitwiseXOR(F.lit(SALT2).cast("bigint")), F.col("key"))
    return df.withColumn("pos", bit_positions(h1, h2, m, k))


class BloomFeatures:
    """The first-seen and membership part of a micro-batch (see the module docstring)."""

    def __init__(self, spark: SparkSession, catalog: Catalog, reader: BloomReader):
        self.spark = spark
        self.streams = {n: s for n, s in base_streams(catalog).items() if s.first_seen or s.membership}
        self.reader = reader  # the store's (PaneStore.bloom_reader): the filters as last committed
        self._warned: set[str] = set()

    @property
    def enabled(self) -> bool:
        return bool(self.streams)

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

    def process(self, batch: DataFrame) -> BloomCommit | None:
        if not self.streams:
            return None
        filters: dict[str, BloomFilter] = {
            n: self._first_seen_filter(s) for n, s in self.streams.items() if s.first_seen
        }
        shapes: dict[tuple[str, int], tuple[int, int, int]] = {}
        items: dict[str, list[Column]] = {}
        for name, stream in self.streams.items():
            rows = []
            if stream.first_seen:
                shapes[(name, TAG_FIRST_SEEN)] = filters[name].shape
                rows.append(F.struct(F.lit(TAG_FIRST_SEEN).alias("tag"), _key_column(stream, stream.first_seen.field)
                                     .alias("key"), F.lit(0).cast("bigint").alias("bucket")))
            if stream.membership:
                decl = stream.membership
                shapes[(name, TAG_MEMBERSHIP)] = (*optimal_shape(decl.capacity, decl.fpp), decl.seed)
                bucket = F.col("event_time") - F.pmod(F.col("event_time"), F.lit(decl.bucket).cast("bigint"))
                rows.append(F.struct(F.lit(TAG_MEMBERSHIP).alias("tag"), _key_column(stream, decl.field).alias("key"),
                                     bucket.alias("bucket")))
            items[name] = rows
        case = None
        for name, rows in items.items():
            case = (F.when if case is None else case.when)(F.col("stream") == name, F.array(*rows))
        tagged = (
            batch.where(F.col("stream").isin(list(self.streams)))
            .select("stream", "event_time", F.explode(case.otherwise(F.array().cast(f"array<{_ITEM}>"))).alias("t"))
            .select("stream", "event_time", "t.tag", "t.key", "t.bucket")
            .where(F.col("key").isNotNull() & (F.col("key") != ""))
        )
        keys = tagged.groupBy("stream", "tag", "bucket", "key").agg(F.min("event_time").alias("first_ms"))
        keys = with_positions(
            keys,
            _case({st: s[2] for st, s in shapes.items()}, "bigint"),
            _case({st: s[0] for st, s in shapes.items()}, "bigint"),
            _case({st: s[1] for st, s in shapes.items()}, "int"),
        ).persist()
        try:
            chunk_rows = (
                keys.select("stream", "tag", "bucket", F.explode("pos").alias("p"))
                .select("stream", "tag", "bucket", F.floor(F.col("p") / CHUNK_BITS).cast("bigint").alias("chunk"),
                        F.pmod(F.col("p"), F.lit(CHUNK_BITS)).alias("bit"))
                .groupBy("stream", "tag", "bucket", "chunk")
                .agg(F.bitmap_construct_agg("bit").alias("bits"))
                .collect()
            )
            pane_rows = self._test_first_seen(keys, filters) if filters else []
        finally:
            keys.unpersist()

        chunks: dict[tuple[str, int, int], dict[int, bytes]] = defaultdict(dict)
        for row in chunk_rows:
            chunks[(row["stream"], row["tag"], row["bucket"])][row["chunk"]] = bytes(row["bits"])
        updates = []
        for (name, tag, bucket), parts in sorted(chunks.items()):
            m, k, seed = shapes[(name, tag)]
            kind = FIRST_SEEN if tag == TAG_FIRST_SEEN else MEMBERSHIP
            updates.append(FilterUpdate(name, kind, bucket, m, k, seed, parts))
        first_seen = []
        for row in pane_rows:
            name, tested, positives = row["stream"], row["tested"], row["positives"]
            fpp = filters[name].false_positive_probability()
            pane = self.streams[name].pane
            first_seen.append(FirstSeenPartial(
                name, row["pane_start"], row["pane_start"] + pane, tested - positives, tested, positives,
                tested * fpp, undercount_bound(tested, positives, fpp),
            ))
        return BloomCommit(filters=updates, first_seen=first_seen)

    def _test_first_seen(self, keys: DataFrame, filters: dict[str, BloomFilter]) -> list:
        broadcast = self.spark.sparkContext.broadcast({n: f.bits.tobytes() for n, f in filters.items()})
        try:
            seen = keys.where(F.col("tag") == TAG_FIRST_SEEN).select("stream", "first_ms", "pos").mapInArrow(
                _membership_tester(broadcast), "stream string, first_ms bigint, seen boolean"
            )
            pane = None
            for name in filters:
                p = F.lit(self.streams[name].pane).cast("bigint")
                pane = (F.when if pane is None else pane.when)(F.col("stream") == name, p)
            return (
                seen.withColumn("pane_start", F.col("first_ms") - F.pmod(F.col("first_ms"), pane))
                .groupBy("stream", "pane_start")
                .agg(F.count(F.lit(1)).alias("tested"), F.sum(F.col("seen").cast("bigint")).alias("positives"))
                .collect()
            )
        finally:
            broadcast.unpersist()


def _membership_tester(broadcast):
    """The mapInArrow function: are all of a row's positions set in its stream's filter?"""

    def test(batches: Iterator) -> Iterator:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        bits = {name: np.frombuffer(data, dtype=np.uint8) for name, data in broadcast.value.items()}
        for rb in batches:
            streams = rb.column("stream")
            seen = np.zeros(rb.num_rows, dtype=bool)
            for name in pc.unique(streams).to_pylist():
                mask = pc.equal(streams, name)
                idx = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
                lists = rb.column("pos").filter(mask)
                flat = lists.flatten().to_numpy()
                k = len(flat) // max(len(idx), 1)
                filt = bits[name]
                hit = (filt[flat >> 3] >> (flat & 7).astype(np.uint8)) & 1
                seen[idx] = hit.reshape(len(idx), k).all(axis=1) if k else False
            yield pa.RecordBatch.from_arrays([streams, rb.column("first_ms"), pa.array(seen)],
                                             names=["stream", "first_ms", "seen"])

    return test
