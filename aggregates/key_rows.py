"""The batch's per-key Spark job, shared by the Bloom features and the sessions.

First-seen and membership (aggregates/firstseen.py) group a batch's merged records by (stream,
key) for each key's earliest event time and hashes; sessions (aggregates/session_batch.py) group
the same records by (stream, key) for each key's event times. Where a stream's session key is its
first-seen field (the demo's `http_requests`: both `user_id`), that is the same shuffle twice.
So each feature describes the rows it wants per event (`KeyItem`), and one job explodes every
event into those rows, groups them by (stream, tag, bucket, key) and returns per group the
earliest event time, the key's two hashes (Bloom rows) and, for the rows sessions read, the key
and its event times. A session item rides on its stream's first-seen row when both read the same
field (one row, one shuffle for both); otherwise it is a row of its own (tag `TAG_SESSIONS`).

The driver cuts each key's times into runs with numpy (`runs_from_times`): sorted, a new run
wherever the next time is `gap` or more after the previous one, first/last/count per run. The
times reach the driver once, as one Arrow list column (8 bytes an event of the session streams).
Before, sessions were a job of their own: the batch scanned again, shuffled by key again, and
the runs cut in the JVM by higher-order functions (filter/transform/inline) per key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sketches.bloom import SALT2

TAG_FIRST_SEEN = 0
TAG_MEMBERSHIP = 1
TAG_SESSIONS = 2  # a session key that is no first-seen field of its stream
RUN_COLUMNS = ("stream", "key", "first_ms", "last_ms", "events")


@dataclass(frozen=True)
class KeyItem:
    """One row per event of `stream`: (tag, key, bucket). `seed`: the Bloom filter's seed, the row's
    key hashed with it (None: no hashes); `times`: the key's event times collected (sessions)."""
    stream: str
    tag: int
    field: str
    key: Column
    bucket: Column | None = None  # None: one row per key (bucket 0)
    seed: int | None = None
    times: bool = False
    bucket_ms: int | None = None  # a membership item's bucket width (its `bucket` column's), for the fold
    member: KeyItem | None = None  # a membership item folded into this bucket-less row (see `folded`)


def shared(items: Sequence[KeyItem]) -> list[KeyItem]:
    """The items with each session item folded into its stream's first-seen item on the same field
    (that row collects the times too); other session items stay rows of their own."""
    out = [i for i in items if not (i.times and i.seed is None)]
    for item in items:
        if not (item.times and item.seed is None):
            continue
        at = next((n for n, o in enumerate(out) if o.stream == item.stream and o.field == item.field
                   and o.tag == TAG_FIRST_SEEN and o.bucket is None), None)
        if at is None:
            out.append(item)
        else:
            out[at] = replace(out[at], times=True)
    return out


def _case(items: Sequence[KeyItem], value, cast: str) -> Column:
    """CASE over (stream, tag) -> value(item)."""
    expr = None
    for item in items:
        cond = (F.col("stream") == item.stream) & (F.col("tag") == item.tag)
        expr = (F.when if expr is None else expr.when)(cond, value(item))
    return expr.otherwise(F.lit(None).cast(cast))


def folded(items: Sequence[KeyItem]) -> list[KeyItem]:
    """`shared(items)`, then each membership item folded into its stream's bucket-less row on the
    same field that collects the key's times (sessions): one row per event and key for all three
    features. That row's key is hashed with the membership seed too, and the key's membership
    buckets are derived from its times on the driver (`unfolded`). Without times the membership
    row stays its own: a `collect_set` of buckets instead measured slower than the second row
    (an object hash aggregate against min() in Spark's code-generated one)."""
    out = shared(items)
    drop: list[int] = []
    for n, item in enumerate(out):
        if item.tag != TAG_MEMBERSHIP or item.bucket_ms is None:
            continue
        at = next((h for h, o in enumerate(out) if o.stream == item.stream and o.field == item.field
                   and o.bucket is None and o.member is None and o.times), None)
        if at is not None:
            out[at] = replace(out[at], member=item)
            drop.append(n)
    return [item for n, item in enumerate(out) if n not in drop]


def _empty_rows() -> pa.Table:
    return pa.table({"stream": pa.array([], pa.string()), "tag": pa.array([], pa.int32()),
                     "bucket": pa.array([], pa.int64()), "first_ms": pa.array([], pa.int64()),
                     "h1": pa.array([], pa.int64()), "h2": pa.array([], pa.int64()),
                     "key": pa.array([], pa.string()), "times": pa.array([], pa.list_(pa.int64()))})


def key_rows(batch: DataFrame, items: Sequence[KeyItem], *, fold: bool = True) -> pa.Table:
    """One Spark job over `batch` (records merged into panes: no dead letters): per (stream, tag,
    bucket, key) of the items, `first_ms` (earliest event time), `h1`/`h2` (the key's hashes with
    its item's seed; null without one), `key` (only on rows collecting times, else null) and `times`
    (the key's event times, unsorted; empty on rows not collecting them). Keys null or "" are none.
    With `fold` (the pipeline's way), a membership item on the field of a bucket-less row rides on
    that row (`folded`) and its (key, bucket) rows are derived on the driver (`unfolded`): the
    same rows, except that their `first_ms` is the bucket's start (nothing reads it)."""
    items = folded(items) if fold else shared(items)
    if not items:
        return _empty_rows()
    streams = sorted({i.stream for i in items})
    case = None
    for name in streams:
        rows = F.array(*(F.struct(F.lit(i.tag).alias("tag"), i.key.cast("string").alias("key"),
                                  (F.lit(0) if i.bucket is None else i.bucket).cast("bigint").alias("bucket"))
                         for i in items if i.stream == name))
        case = (F.when if case is None else case.when)(F.col("stream") == name, rows)
    item_type = "array<struct<tag:int,key:string,bucket:bigint>>"
    tagged = (batch.where(F.col("stream").isin(streams))
              .select("stream", "event_time", F.explode(case.otherwise(F.array().cast(item_type))).alias("t"))
              .select("stream", "event_time", "t.tag", "t.key", "t.bucket")
              .where(F.col("key").isNotNull() & (F.col("key") != "")))
    timed = [i for i in items if i.times]
    aggs = [F.min("event_time").alias("first_ms")]
    if timed:  # collect_list skips nulls: rows of other items carry an empty list
        wants = _case(timed, lambda i: F.lit(True), "boolean")
        aggs.append(F.collect_list(F.when(wants, F.col("event_time"))).alias("times"))
    members = [i for i in items if i.member is not None]
    keys = tagged.groupBy("stream", "tag", "bucket", "key").agg(*aggs)
    hashed = [i for i in items if i.seed is not None]
    seed = _case(hashed, lambda i: F.lit(i.seed).cast("bigint"), "bigint") if hashed else F.lit(None).cast("bigint")
    times = F.col("times") if timed else F.array().cast("array<bigint>")
    key = F.when(F.size(times) > 0, F.col("key")) if timed else F.lit(None).cast("string")
    extra = []
    if members:
        member_seed = _case(members, lambda i: F.lit(i.member.seed).cast("bigint"), "bigint")
        extra = [c.alias("m" + n) for c, n in zip(hash_columns(member_seed), ("h1", "h2"), strict=True)]
    table = keys.select("stream", "tag", "bucket", "first_ms", *hash_columns(seed), key.alias("key"),
                        times.alias("times"), *extra).toArrow()
    return unfolded(table, members) if members else table


def unfolded(table: pa.Table, members: Sequence[KeyItem]) -> pa.Table:
    """`key_rows`' rows with the folded membership items' (key, bucket) rows derived on the driver:
    per row carrying a member, the distinct buckets of its times, each a row (stream, TAG_MEMBERSHIP, bucket, first_ms = bucket, the member's hashes)."""
    base = table.select(list(_empty_rows().column_names))
    if table.num_rows == 0:
        return base
    stream = pc.dictionary_encode(table["stream"]).combine_chunks()
    names = stream.dictionary.to_pylist()
    stream_ix, tag = stream.indices.to_numpy(zero_copy_only=False), table["tag"].to_numpy()
    parts: list[pa.Table] = []
    for item in members:
        if item.stream not in names:
            continue
        rows = pa.array(np.flatnonzero((stream_ix == names.index(item.stream)) & (tag == item.tag)))
        if len(rows) == 0:
            continue
        lists = table["times"].take(rows).combine_chunks()
        values = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        values = values - np.mod(values, item.member.bucket_ms)  # as Spark's pmod: the bucket's start
        order = np.lexsort((values, parent))
        parent, values = parent[order], values[order]
        first = np.ones(len(values), bool)  # each (row, bucket) once
        first[1:] = (parent[1:] != parent[:-1]) | (values[1:] != values[:-1])
        at, bucket = pa.array(parent[first]), pa.array(values[first])
        n = len(bucket)
        parts.append(pa.table({"stream": pa.array(np.full(n, item.stream, object), pa.string()),
                               "tag": pa.array(np.full(n, TAG_MEMBERSHIP, np.int32)), "bucket": bucket,
                               "first_ms": bucket, "h1": table["mh1"].take(rows).take(at),
                               "h2": table["mh2"].take(rows).take(at), "key": pa.nulls(n, pa.string()),
                               "times": pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)),
                                                                 pa.array([], pa.int64()))}))
    return pa.concat_tables([base, *(p.cast(base.schema) for p in parts)])


def hash_columns(seed: Column) -> list[Column]:
    """h1 and h2 of the `key` column: Spark's xxhash64 with the filter's two derived seeds (null
    where the seed is: a row no Bloom filter reads)."""
    seed = seed.cast("bigint")
    salted = seed.bitwiseXOR(F.lit(SALT2).cast("bigint"))
    return [F.when(seed.isNotNull(), F.xxhash64(seed, F.col("key"))).alias("h1"),
            F.when(seed.isNotNull(), F.xxhash64(salted, F.col("key"))).alias("h2")]


def runs_from_times(rows: pa.Table, gaps: Mapping[str, int]) -> pa.Table:
    """The runs of the rows carrying times (stream, key, first_ms, last_ms, events), per key: its
    times sorted, a new run wherever the next is `gaps[stream]` or more after the previous one."""
    carrying = rows.filter(pc.greater(pc.list_value_length(rows["times"]), 0)) if rows.num_rows else rows
    lists = carrying["times"].combine_chunks() if carrying.num_rows else pa.array([], pa.list_(pa.int64()))
    values = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if len(values) == 0:
        return pa.table({"stream": pa.array([], pa.string()), "key": pa.array([], pa.string()),
                         **{c: pa.array([], pa.int64()) for c in RUN_COLUMNS[2:]}})
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    order = np.lexsort((values, parent))  # parent is already ascending: each key's times sorted in place
    values = values[order]
    streams = pc.dictionary_encode(carrying["stream"]).combine_chunks()
    gap_of_row = np.array([gaps[s] for s in streams.dictionary.to_pylist()], np.int64)[streams.indices.to_numpy()]
    starts = np.ones(len(values), bool)
    starts[1:] = (parent[1:] != parent[:-1]) | (np.diff(values) >= gap_of_row[parent[1:]])
    heads = np.flatnonzero(starts)
    ends = np.append(heads[1:], len(values)) - 1
    row = pa.array(parent[heads])
    return pa.table({"stream": carrying["stream"].take(row), "key": carrying["key"].take(row),
                     "first_ms": values[heads], "last_ms": values[ends], "events": ends - heads + 1})
