"""The batch's per-key Spark job, shared by the Bloom features and the sessions.

First-seen (aggregates/firstseen.py) wants each key's earliest event time and hashes; membership
the (key, event-time bucket) pairs and their hashes; sessions (aggregates/session_batch.py) each
key's runs of events closer than `gap`. The features of one stream that read the same field (the
demo's `http_requests`: all three on `user_id`) form one `KeyGroup`, and every event is ONE row of
each group of its stream: (group, key, slot) where the slot is the event time rounded down to
`slot_ms` = gcd(the sessions' gap, the membership bucket), or 0 (one slot a key) for first-seen
alone. The job groups by (group, key, slot) with min/max/count of the event time and the key's
hashes per filter seed: only fixed-width aggregates, so Spark's code-generated hash aggregate
combines them on the map side, and the driver gets one Arrow row per key and slot.

On the driver (numpy/Arrow over whole columns, `KeyRows`):
- first-seen: each key's earliest time, the minimum over its slots;
- membership: the distinct (key, bucket) of the slots (a slot lies in one bucket: its width
  divides the bucket's), each with its earliest time;
- sessions: a key's slots sorted by time; no run is cut inside a slot (its events lie within
  less than `slot_ms` <= gap of each other), and between two consecutive slots exactly where the
  next one's first event is `gap` or more after the previous one's last: the runs of the key's
  events, exact (`runs_from_times` is the same cut over every event time, the reference).

Before (until 2026-11-24) the job exploded each event into a row per feature (first-seen,
membership bucket, sessions' key) and collected every session key's event times with
`collect_list` (an object hash aggregate, 8 bytes an event through the shuffle and into Arrow).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from aggregates.batch_ids import BatchIds
from aggregates.driver_batch import arrow_on_driver, no_records
from aggregates.driver_rules import list_get
from aggregates.stream_codes import stream_rows
from ingest.log.records import bools, one_chunk
from ingest.source_rows import repeated_text
from sketches.bloom import SALT2, hashes

TAG_FIRST_SEEN = 0
TAG_MEMBERSHIP = 1
TAG_SESSIONS = 2  # a session key that is no first-seen field of its stream
RUN_COLUMNS = ("stream", "key", "first_ms", "last_ms", "events")


@dataclass(frozen=True)
class KeyItem:
    """What one feature of `stream` reads per event: the key (`field`, `key` its column), for Bloom
    items the filter's `seed`, for membership its bucket width, for sessions their gap. (`bucket`
    and `times` describe the per-event rows of `shared`, the job's form before the key groups.)"""
    stream: str
    tag: int
    field: str
    key: Column
    bucket: Column | None = None  # None: one row per key (bucket 0)
    seed: int | None = None
    times: bool = False
    bucket_ms: int | None = None  # a membership item's bucket width
    gap: int | None = None  # a sessions item's gap
    source: tuple[str, int] | None = None  # where the source row carries the key: ("ids" | "dims", index)


@dataclass(frozen=True)
class KeyGroup:
    """The features of one stream that read one key field: one row per event and key slot."""
    id: int
    stream: str
    field: str
    key: Column
    first_seen: KeyItem | None = None
    membership: KeyItem | None = None
    sessions: KeyItem | None = None
    source: tuple[str, int] | None = None  # where the source row carries the key (`key_rows_on_driver`)

    @property
    def slot_ms(self) -> int:
        """The slot width: divides the sessions' gap and the membership bucket (0: one slot a key)."""
        widths = [w for w in (self.sessions and self.sessions.gap, self.membership and self.membership.bucket_ms) if w]
        return math.gcd(*widths) if widths else 0


def key_groups(items: Sequence[KeyItem]) -> list[KeyGroup]:
    """The items grouped by (stream, field), in the order they come."""
    groups: dict[tuple[str, str], KeyGroup] = {}
    for item in items:
        at = (item.stream, item.field)
        group = groups.setdefault(at, KeyGroup(len(groups), item.stream, item.field, item.key, source=item.source))
        role = {TAG_FIRST_SEEN: "first_seen", TAG_MEMBERSHIP: "membership"}.get(item.tag, "sessions")
        if getattr(group, role) is not None:
            raise ValueError(f"stream {item.stream}: two {role} items on {item.field}")
        groups[at] = replace(group, **{role: item})
    return list(groups.values())


SLOT_SCHEMA = pa.schema([("group", pa.int32()), ("key", pa.string()), ("slot", pa.int64()),
                         ("first_ms", pa.int64()), ("last_ms", pa.int64()), ("events", pa.int64()),
                         ("h1", pa.int64()), ("h2", pa.int64()), ("mh1", pa.int64()), ("mh2", pa.int64())])
BLOOM_ROW_SCHEMA = pa.schema([("stream", pa.string()), ("tag", pa.int32()), ("bucket", pa.int64()),
                              ("first_ms", pa.int64()), ("h1", pa.int64()), ("h2", pa.int64())])


def _by_group(groups: Sequence[KeyGroup], value, cast: str) -> Column:
    """CASE group -> value(group) (null where it is None)."""
    expr = None
    for g in groups:
        v = value(g)
        if v is not None:
            expr = (F.when if expr is None else expr.when)(F.col("group") == g.id, v)
    return F.lit(None).cast(cast) if expr is None else expr.otherwise(F.lit(None).cast(cast))


def key_rows(batch: DataFrame, items: Sequence[KeyItem]) -> KeyRows:
    """One Spark job over `batch` (records merged into panes: no dead letters): per (group, key,
    slot) of the items' groups, the earliest and latest event time and the count, and the key's
    hashes with the first-seen seed (h1, h2) and the membership seed (mh1, mh2), null where the
    group has no such filter. Keys null or "" are none."""
    groups = key_groups(items)
    if not groups:
        return KeyRows(SLOT_SCHEMA.empty_table(), [])
    streams = sorted({g.stream for g in groups})
    per_stream = {n: [g for g in groups if g.stream == n] for n in streams}
    if all(len(gs) == 1 for gs in per_stream.values()):  # one group a stream: no explode
        group = key = None
        for n, (g,) in per_stream.items():
            group = (F.when if group is None else group.when)(F.col("stream") == n, F.lit(g.id))
            key = (F.when if key is None else key.when)(F.col("stream") == n, g.key.cast("string"))
        keyed = batch.where(F.col("stream").isin(streams)).select(
            group.alias("group"), key.alias("key"), "event_time")
    else:
        case = None
        for n, gs in per_stream.items():
            rows = F.array(*(F.struct(F.lit(g.id).alias("group"), g.key.cast("string").alias("key")) for g in gs))
            case = (F.when if case is None else case.when)(F.col("stream") == n, rows)
        keyed = (batch.where(F.col("stream").isin(streams))
                 .select("event_time", F.explode(case.otherwise(F.array().cast("array<struct<group:int,key:string>>")))
                         .alias("t"))
                 .select("t.group", "t.key", "event_time"))
    t = F.col("event_time")
    slot = _by_group(groups, lambda g: t - F.pmod(t, F.lit(g.slot_ms).cast("bigint")) if g.slot_ms else F.lit(0)
                     .cast("bigint"), "bigint")
    slots = (keyed.where(F.col("key").isNotNull() & (F.col("key") != ""))
             .select(F.col("group").cast("int").alias("group"), "key", slot.alias("slot"), "event_time")
             .groupBy("group", "key", "slot")
             .agg(F.min(t).alias("first_ms"), F.max(t).alias("last_ms"), F.count(F.lit(1)).alias("events")))

    def seed(role: str) -> Column:
        return _by_group(groups, lambda g: None if getattr(g, role) is None else F.lit(getattr(g, role).seed)
                         .cast("bigint"), "bigint")

    mh1, mh2 = hash_columns(seed("membership"))
    table = slots.select("group", "key", "slot", "first_ms", "last_ms", "events", *hash_columns(seed("first_seen")),
                         mh1.alias("mh1"), mh2.alias("mh2")).toArrow()
    return KeyRows(table.cast(SLOT_SCHEMA), groups)


KEY_RECORD_COLUMNS = ("stream", "event_time", "dims", "ids")  # what `key_rows_on_driver` reads of a record


def key_records(batch: DataFrame, items: Sequence[KeyItem]) -> pa.Table:
    """The records of `batch` (a few rows: collected without a Spark job, `arrow_on_driver`) of the items'
    streams, with what `key_rows_on_driver` reads."""
    streams = sorted({i.stream for i in items})
    if not streams:
        return no_records(KEY_RECORD_COLUMNS)
    return arrow_on_driver(batch.where(F.col("stream").isin(streams)).select(*KEY_RECORD_COLUMNS))


def key_rows_on_driver(records: pa.Table, items: Sequence[KeyItem], keep: pa.Array | pa.ChunkedArray | None = None,
                       ids: BatchIds | None = None) -> KeyRows:
    """What `key_rows` computes, without its Spark job: from the batch's records (KEY_RECORD_COLUMNS;
    merged ones, so every event time is set) already on the driver, per (group, key, slot) the
    earliest and latest event time and the count, numpy and Arrow over whole columns, and the hashes
    of each distinct key with `sketches.bloom.hashes`, equal to Spark's xxhash64 with the same seeds
    (tests/spark/test_firstseen.py pins the rows equal to the job's). Rows sorted by group, key, slot.
    `keep`: which of `records` to read (true; the batch's merged ones), None: all. A group's rows are
    picked by position from whole columns: its key out of the list column, no list copied.
    `ids`: `records`' ids already encoded (aggregates/batch_ids.py; the same rows in the same
    order): a key read from them is taken by its code, not hashed again."""
    groups = key_groups(items)
    parts = []
    streams = records["stream"]
    keep_rows = None if keep is None else bools(pc.fill_null(keep, False))
    # (a record not kept may have no event time: 0 there, never read)
    times = (pc.fill_null(records["event_time"], 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
             if groups else None)
    for g in groups:
        mine = stream_rows(streams, [g.stream])
        at = np.flatnonzero(mine if keep_rows is None else mine & keep_rows)
        if len(at) == 0:
            continue
        column, index = g.source
        if column == "ids" and ids is not None:
            stats = slot_stats_of_codes(ids.dictionary, ids.slot(index, at), times[at], g.slot_ms)
        else:  # F.get: null past the end of the array; the key cast to string (the arrays hold strings)
            stats = slot_stats(list_get(records[column], index, at).cast(pa.string()), times[at], g.slot_ms)
        if stats is None:
            continue
        distinct, key_at, slot, first_ms, last_ms, events = stats
        out = {"group": pa.array(np.full(len(key_at), g.id, np.int32)), "key": distinct.take(key_at), "slot": slot,
               "first_ms": first_ms, "last_ms": last_ms, "events": events}
        for role, (a, b) in (("first_seen", ("h1", "h2")), ("membership", ("mh1", "mh2"))):
            item = getattr(g, role)
            if item is None:
                out[a] = out[b] = pa.nulls(len(key_at), pa.int64())
            else:
                h1, h2 = hashes(distinct, item.seed)
                out[a], out[b] = h1[key_at], h2[key_at]
        parts.append(pa.table(out).cast(SLOT_SCHEMA))
    if not parts:
        return KeyRows(SLOT_SCHEMA.empty_table(), groups, ordered=True)
    # Each part is in (key, slot) order and the groups come in id order: the rows are sorted.
    return KeyRows(pa.concat_tables(parts), groups, ordered=True)


# A dense (key x slot) table is used while it has at most this many cells per row (and at least
# this floor): a batch's slots span minutes, its keys tens of thousands; a backlog spanning days
# of 1-minute slots would not fit and is sorted instead.
_DENSE_CELLS_PER_ROW = 4
_DENSE_CELLS_FLOOR = 1 << 16


def slot_stats(keys: pa.Array, times: np.ndarray, slot_ms: int, *, dense_limit: int | None = None):
    """Per (key, slot) of the rows whose key is set (not null, not ""): the earliest and latest
    time and the count, in (key, slot) order with keys in byte order (Arrow's sort of strings, as
    Spark's). Returns (distinct keys sorted, each row's index into them, slot, first, last, count)
    or None when no row has a key. `dense_limit`: the most cells of the dense table (the default
    from the rows' count; tests take each way).

    One hash pass (the dictionary encoding) finds the keys; the rest is integers. Where Arrow's
    group-by on (key string, slot) hashed every row's string and its result then had to be
    hashed again (unique, index_in) and sorted by string: 110-160 ms against ~60 for 700 000
    events of ~50 000 users (docs/benchmarks.md, session 78)."""
    encoded = pc.dictionary_encode(keys)
    code = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    return slot_stats_of_codes(encoded.dictionary, code, times, slot_ms, dense_limit=dense_limit)


def slot_stats_of_codes(dictionary: pa.Array, code: np.ndarray, times: np.ndarray, slot_ms: int, *,
                        dense_limit: int | None = None):
    """`slot_stats` of keys given as each row's `code` into `dictionary` (-1: null)."""
    order = pc.sort_indices(dictionary).to_numpy()  # the keys in byte order
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    empty = bools(pc.equal(dictionary, ""))
    set_ = code >= 0
    set_[set_] = ~empty[code[set_]]
    if not set_.any():
        return None
    r, t = rank[code[set_]], np.asarray(times, np.int64)[set_]
    if slot_ms:
        slot_of = t - np.mod(t, slot_ms)
        low = int(slot_of.min())
        s = (slot_of - low) // slot_ms
    else:
        low, s = 0, np.zeros(len(t), np.int64)
    width = int(s.max()) + 1
    cells = len(order) * width
    if dense_limit is None:
        dense_limit = max(_DENSE_CELLS_PER_ROW * len(t), _DENSE_CELLS_FLOOR)
    if cells <= dense_limit:
        cell = r * width + s
        events = np.bincount(cell, minlength=cells)
        first = np.full(cells, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, cell, t)
        last = np.full(cells, np.iinfo(np.int64).min, np.int64)
        np.maximum.at(last, cell, t)
        present = np.flatnonzero(events)
        key_rank, slot = present // width, present % width
        first, last, events = first[present], last[present], events[present]
    else:  # sorted by (key, slot), then each run's min, max and length
        by = np.lexsort((s, r))
        r, s, t = r[by], s[by], t[by]
        starts = np.flatnonzero(np.concatenate(([True], (r[1:] != r[:-1]) | (s[1:] != s[:-1]))))
        key_rank, slot = r[starts], s[starts]
        first, last = np.minimum.reduceat(t, starts), np.maximum.reduceat(t, starts)
        events = np.diff(np.append(starts, len(t)))
    slot = slot * slot_ms + low if slot_ms else np.zeros(len(slot), np.int64)
    # Only the keys present, renumbered in order: the hashes are computed for these alone.
    used = np.unique(key_rank)
    distinct = dictionary.take(pa.array(order[used]))
    key_at = np.searchsorted(used, key_rank)
    return distinct, key_at, slot, first, last, events.astype(np.int64)


@dataclass(frozen=True)
class KeyRows:
    """The per-key job's slots (SLOT_SCHEMA) and the groups they belong to; what each feature
    reads of them, derived on the driver over whole columns. `ordered`: the slots are sorted by
    (group, key, slot), as `key_rows_on_driver` makes them (Spark's job gives them in any order):
    a key's slots are then one run, in time order, and its first-seen row, membership buckets and
    sessions' runs are cut from the runs, with no group-by hashing the keys again."""
    slots: pa.Table
    groups: list[KeyGroup]
    ordered: bool = False

    def _of(self, group: KeyGroup) -> pa.Table:
        return self.slots.filter(pc.equal(self.slots["group"], group.id))

    def bloom_rows(self) -> pa.Table:
        """Per Bloom item (BLOOM_ROW_SCHEMA): first-seen, a row per key (bucket 0) with its earliest
        time; membership, a row per (key, bucket) with its earliest time in the bucket; each with
        the key's hashes for the item's filter."""
        parts = []
        for g in self.groups:
            if g.first_seen is None and g.membership is None:
                continue
            rows = self._of(g)
            new_key = _new_keys(rows) if self.ordered else None
            if g.first_seen is not None:
                if g.slot_ms == 0:  # already one row a key
                    first_ms, h1, h2 = rows["first_ms"], rows["h1"], rows["h2"]
                elif new_key is not None:  # a key's slots are one run: its first row's hashes, their earliest time
                    heads = np.flatnonzero(new_key)
                    first_ms = _reduced(np.minimum, rows["first_ms"], heads)
                    h1, h2 = (rows[c].take(pa.array(heads)) for c in ("h1", "h2"))
                else:  # h1/h2 are the key's, the same in each of its slots
                    per_key = rows.group_by("key", use_threads=False).aggregate(
                        [("first_ms", "min"), ("h1", "min"), ("h2", "min")])
                    first_ms, h1, h2 = per_key["first_ms_min"], per_key["h1_min"], per_key["h2_min"]
                parts.append(_bloom_part(g.stream, TAG_FIRST_SEEN, np.zeros(len(first_ms), np.int64), first_ms, h1, h2))
            if g.membership is not None and new_key is not None:
                # A key's slots in time order: each bucket's slots are one run within it.
                slot = rows["slot"].to_numpy(zero_copy_only=False)
                bucket = slot - np.mod(slot, g.membership.bucket_ms)
                starts = new_key.copy()
                starts[1:] |= bucket[1:] != bucket[:-1]
                heads = np.flatnonzero(starts)
                parts.append(_bloom_part(g.stream, TAG_MEMBERSHIP, bucket[heads],
                                         _reduced(np.minimum, rows["first_ms"], heads),
                                         rows["mh1"].take(pa.array(heads)), rows["mh2"].take(pa.array(heads))))
            elif g.membership is not None:
                slot = rows["slot"].to_numpy(zero_copy_only=False)
                bucket = pa.array(slot - np.mod(slot, g.membership.bucket_ms))
                per_bucket = pa.table({"key": rows["key"], "bucket": bucket, "first_ms": rows["first_ms"],
                                       "h1": rows["mh1"], "h2": rows["mh2"]}).group_by(
                    ["key", "bucket"], use_threads=False).aggregate([("first_ms", "min"), ("h1", "min"), ("h2", "min")])
                parts.append(_bloom_part(g.stream, TAG_MEMBERSHIP, per_bucket["bucket"], per_bucket["first_ms_min"],
                                         per_bucket["h1_min"], per_bucket["h2_min"]))
        return pa.concat_tables(parts) if parts else BLOOM_ROW_SCHEMA.empty_table()

    def runs(self) -> pa.Table:
        """The sessions' runs (RUN_COLUMNS) of every group with sessions: per key its slots by time,
        a new run where the next slot's first event is `gap` or more after the previous one's last."""
        parts = []
        for g in self.groups:
            rows = self._of(g) if g.sessions is not None else None
            if rows is None or rows.num_rows == 0:
                continue
            first, last, events = (rows[c].to_numpy(zero_copy_only=False) for c in ("first_ms", "last_ms", "events"))
            if self.ordered:  # each key's slots one run, in time order already
                starts = _new_keys(rows)
                key_text = one_chunk(rows["key"])
            else:
                keys = pc.dictionary_encode(rows["key"]).combine_chunks()
                key_ix = keys.indices.to_numpy(zero_copy_only=False)
                order = np.lexsort((first, key_ix))
                key_ix, first, last, events = key_ix[order], first[order], last[order], events[order]
                starts = np.ones(len(first), bool)
                starts[1:] = key_ix[1:] != key_ix[:-1]
                key_text = keys.dictionary.take(pa.array(key_ix))
            starts[1:] |= first[1:] - last[:-1] >= g.sessions.gap
            heads = np.flatnonzero(starts)
            ends = np.append(heads[1:], len(first)) - 1
            parts.append(pa.table({"stream": repeated_text(g.stream, len(heads)),
                                   "key": key_text.take(pa.array(heads)),
                                   "first_ms": first[heads], "last_ms": last[ends],
                                   "events": np.add.reduceat(events, heads)}))
        return pa.concat_tables(parts) if parts else _empty_runs()


def _new_keys(rows: pa.Table) -> np.ndarray:
    """Per row of sorted slots, whether its key differs from the row before's (the first: true)."""
    keys = one_chunk(rows["key"])
    out = np.ones(len(keys), bool)
    if len(keys) > 1:
        out[1:] = bools(pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)))
    return out


def _reduced(ufunc, column, heads: np.ndarray) -> np.ndarray:
    values = one_chunk(column).to_numpy(zero_copy_only=False)
    return ufunc.reduceat(values, heads) if len(heads) else values[:0]


def _bloom_part(stream: str, tag: int, bucket, first_ms, h1, h2) -> pa.Table:
    n = len(first_ms)
    return pa.table({"stream": repeated_text(stream, n),
                     "tag": pa.array(np.full(n, tag, np.int32)), "bucket": bucket, "first_ms": first_ms,
                     "h1": h1, "h2": h2}, schema=BLOOM_ROW_SCHEMA)


def _empty_runs() -> pa.Table:
    return pa.table({"stream": pa.array([], pa.string()), "key": pa.array([], pa.string()),
                     **{c: pa.array([], pa.int64()) for c in RUN_COLUMNS[2:]}})


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
        return _empty_runs()
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
