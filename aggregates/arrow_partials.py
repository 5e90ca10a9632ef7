"""The partial aggregation as a group-by over an Arrow table: numpy, no Spark aggregate objects.

Spark's object aggregates (a KLL or HLL object per group, serialized for the shuffle and merged
after it) cost ~80-100 us per (stream, pane, dims) group, and when a batch's events spread over a
day (a backfill) nearly every event is a group of its own: that was the batch
(docs/benchmarks.md, "The day-of-data backfill through Spark"). Here one partition's rows are
sorted by group (numpy lexsort, stable: a group keeps its rows' order) and each column is reduced
per group at once (`reduceat`); only the sketches are written per group, and from their items:
a KLL of at most k items is DataSketches' exact-mode bytes (`sketches.kll_exact`), an HLL of
fewer than 8 distinct coupons its LIST-mode bytes in Spark's updatable layout (each distinct item's
coupon taken once from a one-item sketch); bigger groups go through DataSketches.

The input is what `aggregates.partials.arrow_input` projects: the rows with their dead-letter
reason and pane start already computed by Spark (one rule, `aggregates.partials`); the output has
exactly the columns and meaning of Spark's `partial_aggregates` (one row per (stream,
dead_reason, pane_start, dims) group). Pure: tests/unit/test_arrow_partials.py checks it against
a per-group computation written the obvious way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggregates.batch_ids import BatchIds
from aggregates.stream_codes import value_codes
from ingest.log.records import bools, one_chunk
from sketches import grouped, kll_exact
from sketches.hll_build import promoted_hll_bytes, promotion, updated_hll_bytes
from sketches.hll_coupons import coupons_of_strings


# The fields of a dead record, as Spark's F.struct in aggregates.partials names and types them.
DEAD_RECORD = pa.struct([
    pa.field("partition", pa.int32()), pa.field("offset", pa.int64()), pa.field("event_time", pa.int64()),
    pa.field("ingest_time", pa.int64()), pa.field("error", pa.string()),
    pa.field("dims", pa.list_(pa.field("element", pa.string()))), pa.field("raw_event_time", pa.int64()),
    pa.field("clock_correction", pa.int64()),
])
DEAD_RECORD_DDL = ("struct<partition: int, offset: bigint, event_time: bigint, ingest_time: bigint, error: string,"
                   " dims: array<string>, raw_event_time: bigint, clock_correction: bigint>")
_STRINGS = pa.list_(pa.field("element", pa.string()))
_LONGS = pa.list_(pa.field("element", pa.int64()))


@dataclass(frozen=True)
class Layout:
    """The slot widths of a catalog (every stream's values, distinct fields and partitions, the
    widest) and the sketches' sizes: what the output columns are."""

    values: int
    distincts: int
    partitions: int
    kll_k: int
    lg_k: int

    def ddl(self) -> str:
        """The output's schema as Spark DDL (mapInArrow's return type)."""
        cols = ["stream string", "dead_reason string", "pane_start bigint", "dims array<string>", "count bigint",
                "max_event_time bigint", "partition_max_event_time array<bigint>",
                f"dead_records array<{DEAD_RECORD_DDL}>", "clock_corrected bigint"]
        for i in range(self.values):
            cols += [f"n_{i} bigint", f"sum_{i} double", f"min_{i} double", f"max_{i} double", f"kll_{i} binary"]
        cols += [f"hll_{j} binary" for j in range(self.distincts)]
        return ", ".join(cols)


def group_partials(table: pa.Table, layout: Layout, ids: BatchIds | None = None) -> pa.Table:
    """One row per (stream, dead_reason, pane_start, dims) group of `table`'s rows (columns stream,
    dead_reason, pane_start, dims, event_time, partition, vals, ids, clock_correction and
    dead_record, the last null for a good row) with Spark's partial aggregates: count, newest event
    time overall and per partition slot, the dead records (an empty list for a good group),
    records whose clock was corrected, per value slot n/sum/min/max/KLL, per distinct slot an HLL.
    `ids`: `table`'s ids already encoded (aggregates/batch_ids.py; the same rows in the same order),
    not hashed again here; encoded here when None."""
    table = table.combine_chunks()
    order, starts, ends = _groups(table)
    first = order[starts]
    take = pa.array(first, pa.int64())
    event_time, event_valid = _ints(table["event_time"])
    event_time, event_valid = event_time[order], event_valid[order]
    out: dict[str, pa.Array] = {
        "stream": table["stream"].take(take),
        "dead_reason": table["dead_reason"].take(take),
        "pane_start": table["pane_start"].take(take),
        "dims": table["dims"].take(take).cast(_STRINGS),
        "count": pa.array(ends - starts, pa.int64()),
        "max_event_time": _group_max(event_time, event_valid, starts),
    }
    partition, partition_valid = _ints(table["partition"])
    partition, partition_valid = partition[order], partition_valid[order]
    per_partition = [_group_max(event_time, event_valid & partition_valid & (partition == k), starts)
                     for k in range(layout.partitions)]
    out["partition_max_event_time"] = _fixed_lists(per_partition, len(starts), pa.int64())
    out["dead_records"] = _dead_records(table["dead_record"], order, starts)
    out["clock_corrected"] = pa.array(_group_sum(bools(table["clock_correction"].is_valid())[order].astype(np.int64),
                                                 starts), pa.int64())
    begins, lengths, vals_flat = _sorted_list_rows(table["vals"], order)
    flat_values = vals_flat.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
    flat_valid = bools(vals_flat.is_valid())
    groups = len(starts)
    for i in range(layout.values):
        if not (lengths > i).any():
            # No row has this slot (a catalog's widest stream sets the width): its groups' stats are
            # those of one row without a value each, from arrays of the groups, not of the rows.
            out.update(value_stats_per_group(i, np.zeros(groups), np.zeros(groups, bool), np.arange(groups),
                                             np.arange(1, groups + 1), layout.kll_k))
            continue
        has, at = _slot_at(begins, lengths, i, len(flat_values))
        valid = has & flat_valid[at]
        out.update(value_stats_per_group(i, np.where(valid, flat_values[at], 0.0), valid, starts, ends, layout.kll_k))
    if ids is None:
        ids = BatchIds.of(table["ids"])
    elif ids.rows != table.num_rows:
        raise ValueError(f"the encoded ids are of {ids.rows} rows, the table has {table.num_rows}")
    begins, lengths = ids.begins[order], ids.lengths[order]
    coupon_of = _coupons_once(ids.dictionary)
    for j in range(layout.distincts):
        out[f"hll_{j}"] = _hlls(ids.dictionary, _slot_codes(begins, lengths, j, ids.codes), starts, layout.lg_k,
                                coupon_of)
    return pa.table(out)


def _groups(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of `table` (columns stream, dead_reason, pane_start, dims) sorted by group, stably
    (a group keeps its rows' order), and where each group starts and ends in that order."""
    n = table.num_rows
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys = [_codes(table["stream"]), _codes(table["dead_reason"])]
    pane, pane_valid = _ints(table["pane_start"])
    keys += [np.where(pane_valid, pane, 0), pane_valid]
    keys += _dims_keys(table["dims"])
    composite = _composite(keys, n)
    if composite is not None:  # one int64 per row: the lexsort's order from one sort of it
        return _sorted_runs(composite)
    order = np.lexsort(keys[::-1])
    changed = np.zeros(n - 1, bool)
    for key in keys:
        s = key[order]
        changed |= s[1:] != s[:-1]
    starts = np.concatenate(([0], np.flatnonzero(changed) + 1)).astype(np.int64)
    return order, starts, np.append(starts[1:], n).astype(np.int64)


def _dims_keys(column) -> list[np.ndarray]:
    """Keys that are equal exactly where two rows' dims lists are: the list's length (-1: null), a
    code of the row's items' bytes end to end, and a code of its items' byte lengths (which tell
    ("ab", "c") from ("a", "bc")). Both are read in place as binary arrays over the list's own
    buffers, one hash of a string per row each: where the items were joined into a new string
    first (pc.binary_join), a batch of 700 000 rows took ~110 ms instead of ~60, and a code per item
    and a key per slot ~3 times that. A null item (an empty string's bytes and length both) is told
    apart only item by item: then, and for any other layout of the lists, a code per slot."""
    column = one_chunk(column)
    lengths = pc.list_value_length(column).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    in_place = _dims_in_place(column)
    if in_place is not None:
        return [lengths] + [np.where(lengths < 0, -1, _codes(keys)) for keys in in_place]
    _, dims_idx, dims_flat = _list_slots(column)
    dims_codes = _codes(dims_flat) if len(dims_flat) else np.zeros(0, np.int64)
    return [lengths] + [np.where(dims_idx[:, j] >= 0, dims_codes[np.maximum(dims_idx[:, j], 0)], -1)
                        for j in range(dims_idx.shape[1])]


def _dims_in_place(column: pa.Array) -> tuple[pa.Array, pa.Array] | None:
    """Per row of a list<string> column, its items' bytes end to end and its items' lengths (a
    byte each where every item is shorter than 256 bytes, else 4), both binary arrays sharing the
    column's buffers (only the rows' offsets are new); None where an item is null or the layout is
    another (large offsets, another item type)."""
    items = column.values
    if not pa.types.is_list(column.type) or items.type != pa.string() or items.null_count or len(items) >= 1 << 29:
        return None
    n = len(column)
    rows = np.frombuffer(column.buffers()[1], np.int32, n + 1, column.offset * 4)
    item_offsets = np.frombuffer(items.buffers()[1], np.int32, len(items) + 1, items.offset * 4)
    data = items.buffers()[2] or pa.py_buffer(b"")
    item_lengths = np.diff(item_offsets)
    joined = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.ascontiguousarray(item_offsets[rows])), data])
    if item_lengths.max(initial=0) < 256:  # a byte a length: shorter strings to hash (19.5 -> 13.6 ms a 700 000 rows)
        shape_offsets, item_lengths = rows, item_lengths.astype(np.uint8)
    else:
        shape_offsets = rows * np.int32(4)
    shapes = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(shape_offsets), pa.py_buffer(item_lengths)])
    return joined, shapes


def _dense_ranks(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's rank among the distinct values (0 for the least), and how many there are: what
    np.unique(return_inverse=True) gives, from a hash table and a sort of the distinct values only
    (a batch's rows have few: ~5 times faster than np.unique's sort of them all)."""
    encoded = pc.dictionary_encode(pa.array(values, pa.int64()))
    distinct = encoded.dictionary.to_numpy()
    rank_of = np.empty(len(distinct), np.int64)
    rank_of[np.argsort(distinct)] = np.arange(len(distinct))
    return rank_of[encoded.indices.to_numpy()], len(distinct)


def _sorted_runs(composite: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stable order of the rows by `composite` and where each run of equal values starts and
    ends in it. A batch has few groups for its rows (a live batch of 1 M events: ~3 400), so the
    values are ranked first and the ranks sorted as 16-bit integers, which numpy sorts stably by
    radix: ~5 times faster than a stable sort of the int64s. Many groups (a backfill spread over
    a day) sort the int64s themselves."""
    n = len(composite)
    ranks, width = _dense_ranks(composite)
    if width > 1 << 16:
        order = np.argsort(composite, kind="stable")
        s = composite[order]
        starts = np.concatenate(([0], np.flatnonzero(s[1:] != s[:-1]) + 1)).astype(np.int64)
        return order, starts, np.append(starts[1:], n).astype(np.int64)
    order = np.argsort(ranks.astype(np.uint16), kind="stable").astype(np.int64)
    ends = np.cumsum(np.bincount(ranks, minlength=width)).astype(np.int64)
    return order, np.concatenate(([0], ends[:-1])).astype(np.int64), ends


def _composite(keys: list[np.ndarray], n: int) -> np.ndarray | None:
    """The keys (the first the most significant) as one int64 per row in the same order: each key
    offset to start at 0 (or ranked, where its range is much wider than the rows, as the panes'
    starts are) and weighted by the ranges after it; None where the ranges multiply past int64."""
    out = np.zeros(n, np.int64)
    span = 1
    for key in keys:
        key = key.astype(np.int64, copy=False)
        lo, hi = int(key.min()), int(key.max())
        width = hi - lo + 1
        if width > 4 * n:
            key, width = _dense_ranks(key)
        else:
            key = key - lo
        span *= width
        if span >= 1 << 62:
            return None
        out = out * width + key
    return out


def value_stats_per_group(i: int, values: np.ndarray, valid: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 k: int) -> dict[str, pa.Array]:
    counts = _group_sum(valid.astype(np.int64), starts)
    some = counts > 0
    # Summed in the group's row order, as one task's partial sum would be (a group never spans tasks here).
    sums = _group_sum(values, starts)
    lo = np.minimum.reduceat(np.where(valid, values, np.inf), starts) if len(starts) else np.zeros(0)
    hi = np.maximum.reduceat(np.where(valid, values, -np.inf), starts) if len(starts) else np.zeros(0)
    items = values[valid]
    klls = kll_exact.exact_bytes_per_group(items, counts, lo, hi, k)
    big = np.flatnonzero(counts > k)
    if len(big):  # compacting sketches: DataSketches, from the group's items sorted
        from datasketches import kll_doubles_sketch

        blobs = klls.to_pylist()
        first = np.concatenate(([0], np.cumsum(counts)))
        for g in big.tolist():
            sketch = kll_doubles_sketch(k)
            # Sorted first: each compaction then sorts a level already in order. 3 300 groups of 300
            # items took 7 ms against 25 in row order, 5 more for the sorts (a value slot of a 1 M
            # batch: ~30 ms less). A KLL's error bound holds for any order of its items.
            sketch.update(np.sort(items[first[g]:first[g + 1]]))
            blobs[g] = sketch.serialize()
        klls = pa.array(blobs, pa.binary())
    return {
        f"n_{i}": pa.array(counts, pa.int64()),
        f"sum_{i}": pa.array(sums, pa.float64(), mask=~some),
        f"min_{i}": pa.array(lo, pa.float64(), mask=~some),
        f"max_{i}": pa.array(hi, pa.float64(), mask=~some),
        f"kll_{i}": klls,
    }


# HLL bytes in Spark's layout (hll_sketch_agg writes the updatable form): a LIST of up to 7 coupons
# in 8 slots, empty slots 0; preamble ints, serial version, family, lg_k, lg_arr, flags, count, mode.
_HLL_FAMILY, _HLL_LIST_LG_ARR, _HLL_EMPTY, _HLL_LIST_HLL8 = 7, 3, 4, 2 << 2
_HLL_SLOTS = 1 << _HLL_LIST_LG_ARR


def hlls_per_group(flat: pa.Array, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray, lg_k: int) -> pa.Array:
    """Per group, the HLL of the items at `idx` (-1: none) into `flat`, in the group's row order."""
    dictionary, codes = _encoded(flat)
    item_code = np.where(idx >= 0, codes[np.maximum(idx, 0)], -1) if len(codes) else np.full(len(idx), -1)
    return _hlls(dictionary, item_code, starts, lg_k, _coupons_once(dictionary))


def _coupons_once(dictionary: pa.Array) -> Callable[[], np.ndarray]:
    """Every item of `dictionary`'s coupon, hashed at the first call only: where a group is large
    enough to need them, and once for all of a batch's distinct slots."""
    return functools.cache(lambda: coupons_of_strings(dictionary.cast(pa.string())))


def _encoded(flat: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """`flat`'s distinct strings and each item's code among them (-1: null): the sessions' keys
    (`hlls_per_group`); a batch's ids lists are encoded once by aggregates/batch_ids.py."""
    if not len(flat):
        return pa.array([], pa.string()), np.zeros(0, np.int64)
    encoded = flat.dictionary_encode()
    return encoded.dictionary, encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def _slot_codes(begins: np.ndarray, lengths: np.ndarray, j: int, codes: np.ndarray) -> np.ndarray:
    """Per row (of _sorted_list_rows) the code of its slot j's item, -1 where it has none."""
    if not len(codes):
        return np.full(len(lengths), -1, np.int64)
    has, at = _slot_at(begins, lengths, j, len(codes))
    return np.where(has, codes[at], -1)


def _hlls(dictionary: pa.Array, item_code: np.ndarray, starts: np.ndarray, lg_k: int,
          coupon_of: Callable[[], np.ndarray]) -> pa.Array:
    """Per group (rows from starts[g], in order) the HLL of its rows' items (`item_code` into
    `dictionary`, -1: none; `coupon_of()`: every dictionary item's coupon). A group with rows enough
    to reach HLL mode is built from its coupons in one compiled pass for all of them
    (sketches/hll_build.py `promoted_hll_bytes`); the others, and any such group whose sketch stays
    below HLL mode, from their distinct items: LIST-mode bytes written for every group of fewer than
    8 at once, DataSketches updates of each distinct item in row order for the rest (a repeat
    changes neither the coupons, the registers nor the HIP estimate: the same bytes). A group of 8
    items or more whose coupons are fewer (a collision, the empty string DataSketches ignores) gets
    from DataSketches the LIST bytes written here, so which way it goes changes no byte; deciding by
    items needs the coupons of the small groups' items only."""
    groups = len(starts)
    present = item_code >= 0
    group_of = np.repeat(np.arange(groups), _group_sum(present.astype(np.int64), starts))
    items = item_code[present]
    per_group = np.bincount(group_of, minlength=groups)
    built: dict[int, bytes] = {}
    candidates = np.flatnonzero(per_group >= promotion(lg_k)[0])
    if len(candidates):
        ends = np.cumsum(per_group)
        begins = ends - per_group
        blobs = promoted_hll_bytes(coupon_of()[items], begins[candidates], ends[candidates], lg_k)
        built = {g: blob for g, blob in zip(candidates.tolist(), blobs) if blob is not None}
        if built:  # their rows are done: the rest of the groups' rows go on below
            rest = np.ones(groups, bool)
            rest[list(built)] = False
            group_of, items = group_of[rest[group_of]], items[rest[group_of]]
    kept = grouped.first_comings(group_of, items)
    group_of, items = group_of[kept], items[kept]  # each group's distinct items, in row order
    distinct = np.bincount(group_of, minlength=groups)
    fed = distinct >= _HLL_SLOTS
    listed = ~fed[group_of]
    blobs = _list_hlls(dictionary, group_of[listed], items[listed], groups, lg_k)
    if not fed.any() and not built:
        return blobs
    out = blobs.to_pylist()
    for g, blob in built.items():
        out[g] = blob
    if fed.any():
        fed_groups = np.flatnonzero(fed)
        fed_items = items[~listed]  # group after group, each group's in row order
        ends = np.cumsum(distinct[fed_groups])
        begins = (ends - distinct[fed_groups]).tolist()
        # The fed groups' strings made by Arrow in one take, sliced per group (a take call a group
        # cost ~20 % more), turned into Python strings only where DataSketches is fed them.
        strings = dictionary.take(pa.array(fed_items, pa.int64())).cast(pa.string())
        for g, begin, end in zip(fed_groups.tolist(), begins, ends.tolist()):
            out[g] = updated_hll_bytes(strings.slice(begin, end - begin), None, lg_k)
    return pa.array(out, pa.binary())


def _list_hlls(dictionary: pa.Array, group_of: np.ndarray, items: np.ndarray, groups: int, lg_k: int) -> pa.Array:
    """Per group, the LIST-mode bytes of its distinct `items` (codes into `dictionary`, fewer
    than 8 a group, each group's in row order; a group with none: an empty sketch): a coupon
    kept where it first comes, as DataSketches keeps it."""
    needed = np.unique(items)
    coupon_of = np.zeros(len(dictionary), np.uint32)
    # Each distinct item hashed once, all at once; 0 for an item DataSketches ignores (the empty string).
    coupon_of[needed] = coupons_of_strings(dictionary.take(pa.array(needed, pa.int64())).cast(pa.string()))
    coupons = coupon_of[items]
    hashed = coupons != 0
    group_of, coupons = group_of[hashed], coupons[hashed]
    kept = grouped.first_comings(group_of, coupons)
    group_of, coupons = group_of[kept], coupons[kept]  # first comings, in place order
    distinct = np.bincount(group_of, minlength=groups)
    slot = np.arange(len(coupons)) - (np.cumsum(distinct) - distinct)[group_of]
    slots = np.zeros((groups, _HLL_SLOTS), "<u4")
    slots[group_of, slot] = coupons
    head = np.zeros((groups, 8), np.uint8)
    head[:] = (2, 1, _HLL_FAMILY, lg_k, _HLL_LIST_LG_ARR, 0, 0, _HLL_LIST_HLL8)
    head[:, 5] = np.where(distinct == 0, _HLL_EMPTY, 0)
    head[:, 6] = distinct
    out = np.concatenate([head, slots.view(np.uint8).reshape(groups, 4 * _HLL_SLOTS)], axis=1)
    width = out.shape[1]
    return pa.Array.from_buffers(pa.binary(), groups, [None, pa.py_buffer(np.arange(0, (groups + 1) * width, width,
                                                                                     dtype=np.int32)),
                                                       pa.py_buffer(np.ascontiguousarray(out))])


def _codes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A code per row, equal exactly when the values are (nulls one code of their own)."""
    return value_codes(column)[0].astype(np.int64)


def _ints(column) -> tuple[np.ndarray, np.ndarray]:
    """An integer column's values (0 where null) and validity."""
    valid = bools(column.is_valid())
    return column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def _list_slots(column, width: int | None = None) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """A list column's lengths (-1: a null list), its items flattened, and per row and slot the
    item's index into them (-1 past the row's end: Spark's get() is null there)."""
    column = one_chunk(column)
    lengths = pc.list_value_length(column).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(column)
    starts = np.concatenate(([0], np.cumsum(np.maximum(lengths, 0))[:-1])).astype(np.int64) if len(lengths) \
        else np.zeros(0, np.int64)
    if width is None:
        width = int(lengths.max(initial=0))
    slots = np.arange(width, dtype=np.int64)
    idx = np.where(slots[None, :] < lengths[:, None], starts[:, None] + slots[None, :], -1)
    return lengths, idx.reshape(len(lengths), width), flat


def _sorted_list_rows(column, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Per row of a list column, in `order`, where its items begin in the flattened items and how
    many it has (0 for a null list), and the items flattened: a row's slot i is items[begin + i]
    where i < its length. Two arrays of the rows, not a (rows, width) index matrix whose rows were
    gathered per slot: with the slots no row reaches skipped, a 1 M-row batch's value slots
    took 200-230 ms instead of ~390 ms."""
    column = one_chunk(column)
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    begins = np.cumsum(lengths) - lengths
    return begins[order], lengths[order], pc.list_flatten(column)


def _slot_at(begins: np.ndarray, lengths: np.ndarray, i: int, items: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row (of _sorted_list_rows) whether it has a slot i, and that item's index into the
    `items` flattened ones (some other item's where it has none: a place to mask)."""
    return lengths > i, np.minimum(begins + i, items - 1)


def _group_sum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(values, starts) if len(starts) else np.zeros(0, values.dtype)


def _group_max(values: np.ndarray, valid: np.ndarray, starts: np.ndarray) -> pa.Array:
    """Per group the max of the valid values, null where it has none."""
    if not len(starts):
        return pa.array([], pa.int64())
    low = np.iinfo(np.int64).min
    best = np.maximum.reduceat(np.where(valid, values, low), starts)
    any_valid = np.add.reduceat(valid.astype(np.int64), starts) > 0
    return pa.array(best, pa.int64(), mask=~any_valid)


def _fixed_lists(columns: list[pa.Array], n: int, value_type: pa.DataType) -> pa.Array:
    """Row g is [columns[0][g], columns[1][g], ...]."""
    width = len(columns)
    offsets = pa.array(np.arange(0, n * width + 1, width, dtype=np.int32) if width else np.zeros(n + 1, np.int32))
    if not width:
        return pa.ListArray.from_arrays(offsets, pa.array([], value_type), type=pa.list_(pa.field("element", value_type)))
    order = (np.arange(n)[:, None] + np.arange(width)[None, :] * n).ravel()
    values = pa.concat_arrays(columns).take(pa.array(order, pa.int64()))
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(pa.field("element", value_type)))


def _dead_records(column, order: np.ndarray, starts: np.ndarray) -> pa.Array:
    """Per group its rows' non-null dead records, in the group's row order (collect_list)."""
    column = one_chunk(column)
    column = column.cast(DEAD_RECORD)
    valid = bools(column.is_valid())[order]
    kept = order[valid]
    counts = _group_sum(valid.astype(np.int64), starts)
    offsets = pa.array(np.concatenate(([0], np.cumsum(counts))).astype(np.int32))
    values = column.take(pa.array(kept, pa.int64()))
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(pa.field("element", DEAD_RECORD)))


def merge_partials(table: pa.Table, layout: Layout) -> pa.Table:
    """`table`'s partials (group_partials' rows, several per group where they come from several
    partitions) merged into one row per group, as group_partials of all their rows would give:
    counts, n and sums added (a sum in the parts' order, as Spark adds its partial sums), the
    newest event times and min/max reduced, dead records concatenated in the parts' order, and the
    sketches of a group of several parts merged (sketches.grouped: small ones byte-level, for all
    groups at once, DataSketches past that). A group of one part keeps its row's bytes."""
    table = table.combine_chunks()
    order, starts, _ = _groups(table)
    if len(starts) == table.num_rows:  # no group of several parts: nothing to merge
        return table
    cols = {name: one_chunk(table[name]) for name in table.column_names}
    take = pa.array(order[starts], pa.int64())
    out: dict[str, pa.Array] = {name: cols[name].take(take) for name in ("stream", "dead_reason", "pane_start", "dims")}
    out["count"] = pa.array(_group_sum(_ints(cols["count"])[0][order], starts), pa.int64())
    out["max_event_time"] = _group_max(*_sorted_ints(cols["max_event_time"], order), starts)
    slots = pc.list_flatten(cols["partition_max_event_time"])
    width = layout.partitions
    times, valid = (a.reshape(-1, width)[order] for a in _ints(slots)) if width else (None, None)
    out["partition_max_event_time"] = _fixed_lists(
        [_group_max(times[:, k], valid[:, k], starts) for k in range(width)], len(starts), pa.int64())
    out["dead_records"] = _concatenated(cols["dead_records"], order, starts)
    out["clock_corrected"] = pa.array(_group_sum(_ints(cols["clock_corrected"])[0][order], starts), pa.int64())
    sort = pa.array(order, pa.int64())
    for i in range(layout.values):
        n = _group_sum(_ints(cols[f"n_{i}"])[0][order], starts)
        some = n > 0
        out[f"n_{i}"] = pa.array(n, pa.int64())
        sums = cols[f"sum_{i}"].fill_null(0.0).to_numpy(zero_copy_only=False)[order]
        out[f"sum_{i}"] = pa.array(_group_sum(sums, starts), pa.float64(), mask=~some)
        for name, ufunc, none in ((f"min_{i}", np.minimum, np.inf), (f"max_{i}", np.maximum, -np.inf)):
            column = cols[name].fill_null(none).to_numpy(zero_copy_only=False)[order]
            out[name] = pa.array(ufunc.reduceat(column, starts), pa.float64(), mask=~some)
        out[f"kll_{i}"] = grouped.merged_klls(cols[f"kll_{i}"].take(sort), starts, layout.kll_k)
    for j in range(layout.distincts):
        out[f"hll_{j}"] = grouped.merged_hlls(cols[f"hll_{j}"].take(sort), starts, layout.lg_k)
    return pa.table(out, schema=table.schema)


def _sorted_ints(column, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values, valid = _ints(column)
    return values[order], valid[order]


def _concatenated(column, order: np.ndarray, starts: np.ndarray) -> pa.Array:
    """Per group the concatenation of its rows' lists, in the group's row order."""
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    begins = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    sorted_lengths = lengths[order]
    ends = np.cumsum(sorted_lengths)
    items = (np.repeat(begins[order] - ends + sorted_lengths, sorted_lengths) + np.arange(ends[-1] if len(ends) else 0))
    large = pa.types.is_large_list(column.type)  # Spark's toArrow may give large types
    offsets = pa.array(np.concatenate(([0], np.cumsum(_group_sum(sorted_lengths, starts))))
                       .astype(np.int64 if large else np.int32))
    values = pc.list_flatten(column).take(pa.array(items, pa.int64()))
    return (pa.LargeListArray if large else pa.ListArray).from_arrays(offsets, values, type=column.type)


def group_batches(batches, layout: Layout):
    """mapInArrow: one partition's record batches (all of them together: a group may span them)
    -> its groups' partial aggregates, as one record batch (none for an empty partition)."""
    batches = list(batches)
    if not batches or not sum(b.num_rows for b in batches):
        return
    out = group_partials(pa.Table.from_batches(batches), layout)
    yield from out.to_batches()


def merge_batches(batches, layout: Layout):
    """mapInArrow: one partition's partials (every part of a group in it) -> one row per group."""
    batches = list(batches)
    if not batches or not sum(b.num_rows for b in batches):
        return
    yield from merge_partials(pa.Table.from_batches(batches), layout).to_batches()
