"""The Arrow group-by of the partial aggregation (aggregates/arrow_partials.py) against a per-group
computation written the obvious way: same groups, counts, newest event times, dead records, n/min/max
identical, sums within float rounding of math.fsum, KLL sketches holding the same items (quantiles
identical at most k items, within the sketch's bounds above), HLL bytes those of a DataSketches
sketch fed the group's items in order (so the same coupons), and empty slots as Spark writes them."""

from __future__ import annotations

import functools
import math
from collections import defaultdict

import pyarrow as pa
from datasketches import hll_sketch, kll_doubles_sketch, tgt_hll_type
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.batch_ids import BatchIds
from aggregates.arrow_partials import DEAD_RECORD, Layout, group_partials, merge_partials
from sketches import HllSketch, KllSketch

STRINGS = pa.list_(pa.field("element", pa.string()))
INPUT = pa.schema([
    pa.field("stream", pa.string()), pa.field("dead_reason", pa.string()), pa.field("pane_start", pa.int64()),
    pa.field("dims", STRINGS), pa.field("event_time", pa.int64()), pa.field("partition", pa.int32()),
    pa.field("vals", pa.list_(pa.field("element", pa.float64()))), pa.field("ids", STRINGS),
    pa.field("clock_correction", pa.int64()), pa.field("dead_record", DEAD_RECORD),
])
# What Spark's kll_sketch_agg_double(v, 200) and hll_sketch_agg(s, 12) write for a group whose
# values are all null (seen from Spark 4 in this repository's session: never a null column).
SPARK_EMPTY_KLL_200 = bytes.fromhex("02010f01c8000800")
SPARK_EMPTY_HLL_12 = bytes.fromhex("0201070c03040008" + "00" * 32)

floats = st.floats(-1e12, 1e12).map(lambda f: f + 0.0)  # no -0.0


IDS_POOLS = (["u1", "u2", ""], [f"u{i}" for i in range(12)])


@functools.cache
def row_strategies(values: int, distincts: int) -> dict:
    """The strategies a row is drawn from, built once: a strategy made anew for every row of every
    example was validated anew each time, most of these tests' time. The same draws either way."""
    maybe_int = st.none() | st.integers(0, 10**6)
    return {
        "n": st.integers(0, 60),
        "reason": st.sampled_from([None, None, None, "invalid", "beyond_retention"]),
        # ("xy", "z") and ("x", "yz") hold the same bytes end to end, ("",) and () too: told apart all the same
        "dims": st.sampled_from([("x",), ("x", None), ("y", "z"), (), None, ("xy", "z"), ("x", "yz"), ("",),
                                 ("x\x1fy", "z"), ("x", "y\x1fz")]),
        "pool": st.sampled_from(range(len(IDS_POOLS))),
        "partition": st.integers(0, 2), "offset": st.integers(0, 10**6), "maybe_int": maybe_int,
        "ingest_time": st.integers(0, 10**6), "error": st.none() | st.just("bad"),
        "record_dims": st.none() | st.just(("q",)),
        "stream": st.sampled_from(["a", "b"]), "pane_start": st.sampled_from([0, 10, 20]),
        "event_time": st.none() | st.integers(-5, 10**6), "row_partition": st.none() | st.integers(0, 3),
        "vals": st.none() | st.lists(st.none() | floats, max_size=values + 1),
        "ids": [st.none() | st.lists(st.none() | st.sampled_from(pool), max_size=distincts + 1) for pool in IDS_POOLS],
        "clock_correction": st.none() | st.integers(-100, 100),
    }


@st.composite
def rows(draw, values: int, distincts: int):
    s = row_strategies(values, distincts)
    n = draw(s["n"])
    out = []
    for _ in range(n):
        reason = draw(s["reason"])
        good = reason is None
        dims = draw(s["dims"]) if good else None
        dims = None if dims is None else list(dims)  # a list of its own per row, as before
        pool = draw(s["pool"])
        record = None if good else {
            "partition": draw(s["partition"]), "offset": draw(s["offset"]),
            "event_time": draw(s["maybe_int"]), "ingest_time": draw(s["ingest_time"]),
            "error": draw(s["error"]), "dims": None if (d := draw(s["record_dims"])) is None else list(d),
            "raw_event_time": draw(s["maybe_int"]), "clock_correction": None,
        }
        out.append({
            "stream": draw(s["stream"]),
            "dead_reason": reason,
            "pane_start": draw(s["pane_start"]) if good else None,
            "dims": dims,
            "event_time": draw(s["event_time"]),
            "partition": draw(s["row_partition"]),
            "vals": draw(s["vals"]),
            "ids": draw(s["ids"][pool]),
            "clock_correction": draw(s["clock_correction"]),
            "dead_record": record,
        })
    return out


def expected(rows: list[dict], layout: Layout) -> dict:
    """Per group, what Spark's aggregates give, computed row by row."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["stream"], r["dead_reason"], r["pane_start"], None if r["dims"] is None else tuple(r["dims"]))].append(r)
    out = {}
    for key, members in groups.items():
        times = [r["event_time"] for r in members if r["event_time"] is not None]
        g = {
            "count": len(members),
            "max_event_time": max(times, default=None),
            "partition_max_event_time": [max((r["event_time"] for r in members if r["partition"] == k
                                              and r["event_time"] is not None), default=None)
                                         for k in range(layout.partitions)],
            "dead_records": [r["dead_record"] for r in members if r["dead_record"] is not None],
            "clock_corrected": sum(r["clock_correction"] is not None for r in members),
        }
        for i in range(layout.values):
            items = [r["vals"][i] for r in members if r["vals"] is not None and i < len(r["vals"])
                     and r["vals"][i] is not None]
            g[f"items_{i}"] = items
        for j in range(layout.distincts):
            sketch = hll_sketch(layout.lg_k, tgt_hll_type.HLL_8)
            for r in members:
                if r["ids"] is not None and j < len(r["ids"]) and r["ids"][j] is not None:
                    sketch.update(r["ids"][j])
            g[f"hll_{j}"] = sketch.serialize_updatable()
        out[key] = g
    return out


def check(rows: list[dict], layout: Layout, partitions: list[int] | None = None) -> None:
    """`partitions`: each row's input partition (None: one): each partition grouped on its own,
    then their partials merged (merge_partials), as the map-side path does."""
    if partitions is None:
        table = pa.Table.from_pylist(rows, schema=INPUT)
        got = group_partials(table, layout).to_pylist()
        # The ids encoded once for the batch's steps (aggregates/batch_ids.py): the same partials
        # (a KLL past k compacts at random: not the same bytes twice, whatever the ids).
        given_ids = group_partials(table, layout, ids=BatchIds.of(table.column("ids"))).to_pylist()
        assert [{k: v for k, v in r.items() if not k.startswith("kll")} for r in given_ids] == \
            [{k: v for k, v in r.items() if not k.startswith("kll")} for r in got]
    else:
        got = merge_partials(map_side(rows, partitions, layout), layout).to_pylist()
    want = expected(rows, layout)
    assert len(got) == len(want)
    for row in got:
        key = (row["stream"], row["dead_reason"], row["pane_start"], None if row["dims"] is None else tuple(row["dims"]))
        g = want[key]
        for name in ("count", "max_event_time", "partition_max_event_time", "clock_corrected"):
            assert row[name] == g[name], name
        # Merged: each partition's dead records in turn (as Spark's collect_list meets them).
        assert row["dead_records"] == (g["dead_records"] if partitions is None else [
            r["dead_record"] for members in part_members(rows, partitions, key) for r in members
            if r["dead_record"] is not None])
        for i in range(layout.values):
            items = g[f"items_{i}"]
            assert row[f"n_{i}"] == len(items)
            if not items:
                assert (row[f"sum_{i}"], row[f"min_{i}"], row[f"max_{i}"]) == (None, None, None)
                assert KllSketch.from_bytes(row[f"kll_{i}"]).is_empty
                continue
            assert (row[f"min_{i}"], row[f"max_{i}"]) == (min(items), max(items))
            assert math.isclose(row[f"sum_{i}"], math.fsum(items), rel_tol=1e-9, abs_tol=1e-9 * max(map(abs, items)))
            sketch = kll_doubles_sketch.deserialize(row[f"kll_{i}"])
            assert (sketch.n, sketch.k, sketch.get_min_value(), sketch.get_max_value()) == (
                len(items), layout.kll_k, min(items), max(items))
            if len(items) <= layout.kll_k:
                oracle = kll_doubles_sketch(layout.kll_k)
                for v in items:
                    oracle.update(v)
                for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
                    assert sketch.get_quantile(q) == oracle.get_quantile(q)
            else:
                bound = kll_doubles_sketch.get_normalized_rank_error(layout.kll_k, False)
                ordered = sorted(items)
                for q in (0.1, 0.5, 0.9):
                    v = sketch.get_quantile(q)
                    rank = sum(x <= v for x in ordered) / len(ordered)
                    low = sum(x < v for x in ordered) / len(ordered)
                    assert low - 3 * bound <= q <= rank + 3 * bound
        for j in range(layout.distincts):
            if partitions is None:
                assert row[f"hll_{j}"] == g[f"hll_{j}"]
            else:  # DataSketches' union of the partitions' sketches, which it fed their items in order
                parts = [hll_of(members, j, layout) for members in part_members(rows, partitions, key)]
                assert row[f"hll_{j}"] == (parts[0] if len(parts) == 1 else HllSketch.library_union(parts).to_bytes())


def map_side(rows: list[dict], partitions: list[int], layout: Layout) -> pa.Table:
    """Each partition's rows grouped on their own, the partials one after the other."""
    return pa.concat_tables([group_partials(pa.Table.from_pylist([r for r, p in zip(rows, partitions) if p == q],
                                                                 schema=INPUT), layout)
                             for q in sorted(set(partitions) | {0})])


def group_key(r: dict) -> tuple:
    return (r["stream"], r["dead_reason"], r["pane_start"], None if r["dims"] is None else tuple(r["dims"]))


def part_members(rows: list[dict], partitions: list[int], key: tuple) -> list[list[dict]]:
    """The group's rows per input partition that holds some, in partition order."""
    return [members for q in sorted(set(partitions))
            if (members := [r for r, p in zip(rows, partitions) if p == q and group_key(r) == key])]


def hll_of(members: list[dict], j: int, layout: Layout) -> bytes:
    sketch = hll_sketch(layout.lg_k, tgt_hll_type.HLL_8)
    for r in members:
        if r["ids"] is not None and j < len(r["ids"]) and r["ids"][j] is not None:
            sketch.update(r["ids"][j])
    return sketch.serialize_updatable()


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_equals_a_per_group_computation(data):
    layout = Layout(values=2, distincts=2, partitions=3, kll_k=200, lg_k=12)
    check(data.draw(rows(layout.values, layout.distincts)), layout)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_partials_merged_across_partitions_equal_a_per_group_computation(data):
    """The map-side path: each input partition grouped on its own, then the partials of a group
    merged: the same as grouping all rows at once (sketches: DataSketches' union of the parts)."""
    layout = Layout(values=2, distincts=2, partitions=3, kll_k=200, lg_k=12)
    rows_ = data.draw(rows(layout.values, layout.distincts))
    check(rows_, layout, data.draw(st.lists(st.integers(0, 3), min_size=len(rows_), max_size=len(rows_))))


@settings(max_examples=40, deadline=None)
@given(st.lists(floats, min_size=1, max_size=120), st.lists(st.sampled_from([f"u{i}" for i in range(30)]), max_size=120),
       st.lists(st.integers(0, 2), min_size=120, max_size=120))
def test_big_partials_merge_with_datasketches_within_bounds(values, ids, partitions):
    """Parts past k items together merge compacting (DataSketches), past 7 coupons leave LIST mode."""
    layout = Layout(values=1, distincts=1, partitions=1, kll_k=8, lg_k=12)
    n = max(len(values), len(ids))
    check([{"stream": "a", "dead_reason": None, "pane_start": 0, "dims": [], "event_time": 1, "partition": 0,
            "vals": [values[i % len(values)]], "ids": [ids[i]] if i < len(ids) else None, "clock_correction": None,
            "dead_record": None} for i in range(n)], layout, partitions[:n])


def test_partials_without_a_shared_group_are_returned_as_they_are():
    layout = Layout(values=1, distincts=1, partitions=2, kll_k=200, lg_k=12)
    rows_ = [{"stream": "a", "dead_reason": None, "pane_start": 10 * i, "dims": ["x"], "event_time": 10 * i,
              "partition": i % 2, "vals": [float(i)], "ids": ["u1"], "clock_correction": None, "dead_record": None}
             for i in range(4)]
    table = map_side(rows_, [0, 1, 0, 1], layout)
    assert merge_partials(table, layout).equals(table.combine_chunks())


@settings(max_examples=40, deadline=None)
@given(st.lists(floats, min_size=1, max_size=120), st.lists(st.sampled_from([f"u{i}" for i in range(30)]), max_size=120))
def test_big_groups_use_datasketches_within_bounds(values, ids):
    """Past k items a group's KLL compacts (DataSketches), past 7 distinct items its HLL leaves LIST mode."""
    layout = Layout(values=1, distincts=1, partitions=1, kll_k=8, lg_k=12)
    n = max(len(values), len(ids))
    check([{"stream": "a", "dead_reason": None, "pane_start": 0, "dims": [], "event_time": 1, "partition": 0,
            "vals": [values[i % len(values)]], "ids": [ids[i]] if i < len(ids) else None, "clock_correction": None,
            "dead_record": None} for i in range(n)], layout)


def test_empty_slots_are_what_spark_writes():
    layout = Layout(values=2, distincts=2, partitions=1, kll_k=200, lg_k=12)
    out = group_partials(pa.Table.from_pylist([
        {"stream": "a", "dead_reason": None, "pane_start": 0, "dims": ["x"], "event_time": 5, "partition": 0,
         "vals": [1.5], "ids": [], "clock_correction": None, "dead_record": None},
    ], schema=INPUT), layout).to_pylist()[0]
    assert out["kll_1"] == SPARK_EMPTY_KLL_200
    assert out["hll_0"] == out["hll_1"] == SPARK_EMPTY_HLL_12
    assert (out["n_1"], out["sum_1"], out["min_1"], out["max_1"]) == (0, None, None, None)
    assert out["dead_records"] == []
    # One item: the same bytes as Spark's (its one-item KLL, its updatable one-coupon LIST).
    assert out["kll_0"] == bytes.fromhex("02020f04c8000800" "000000000000f83f")


def test_a_value_slot_no_row_reaches_equals_one_every_row_holds_null():
    """A value slot past every row's list (the widest stream's, say) is written from one empty row
    per group rather than from the rows: the same columns as when every row's list reaches it
    with nulls, which go the ordinary way."""
    layout = Layout(values=3, distincts=1, partitions=1, kll_k=200, lg_k=12)
    vals = [[1.0], None, [], [2.5], [None], [3.0], [-4.0]] * 3

    def grouped(pad: bool) -> pa.Table:
        return group_partials(pa.Table.from_pylist([
            {"stream": "a", "dead_reason": None, "pane_start": 10 * (i % 4), "dims": ["x"], "event_time": i,
             "partition": 0, "vals": None if v is None else (v + [None] * (3 - len(v)) if pad else v),
             "ids": ["u1"], "clock_correction": None, "dead_record": None} for i, v in enumerate(vals)
        ], schema=INPUT), layout)

    short, padded = grouped(False), grouped(True)
    assert short.num_rows == 4
    assert short.column("n_0").to_pylist() == padded.column("n_0").to_pylist() != [0] * 4
    assert short.equals(padded)


def test_a_group_of_8_items_but_7_coupons_gets_the_list_bytes_either_way():
    """A group of 8 distinct items or more goes to DataSketches, decided by items, not coupons: one
    whose items hash to fewer than 8 coupons (here the empty string, which DataSketches ignores)
    gets the same LIST bytes the group-by writes for those coupons itself."""
    layout = Layout(values=1, distincts=1, partitions=1, kll_k=200, lg_k=12)
    seven = [f"u{i}" for i in range(7)]
    out = group_partials(pa.Table.from_pylist([
        {"stream": stream, "dead_reason": None, "pane_start": 0, "dims": [], "event_time": 1, "partition": 0,
         "vals": [1.0], "ids": [item], "clock_correction": None, "dead_record": None}
        for stream, items in (("fed", ["", *seven, "u3", ""]), ("listed", seven)) for item in items
    ], schema=INPUT), layout)
    hll = dict(zip(out.column("stream").to_pylist(), out.column("hll_0").to_pylist(), strict=True))
    sketch = hll_sketch(layout.lg_k, tgt_hll_type.HLL_8)
    for item in seven:
        sketch.update(item)
    assert hll["fed"] == hll["listed"] == sketch.serialize_updatable()
    assert hll["listed"][6] == 7  # LIST mode, 7 coupons


def test_an_empty_table_has_no_groups():
    layout = Layout(values=1, distincts=1, partitions=2, kll_k=200, lg_k=12)
    out = group_partials(INPUT.empty_table(), layout)
    assert out.num_rows == 0
    assert out.column_names[:9] == ["stream", "dead_reason", "pane_start", "dims", "count", "max_event_time",
                                   "partition_max_event_time", "dead_records", "clock_corrected"]


def test_the_commit_read_from_the_table_equals_the_one_read_from_its_rows():
    """aggregates.commit reads the Arrow table column by column; the same rows as dicts (the Spark
    path's reading) give the same commit: partials, newest event times, per-partition ones, dead
    letters, counts read and dead per reason (a stream not in the catalog skipped by both)."""
    from aggregates.commit import build_commit
    from aggregates.partials import catalog_layout
    from catalog import load_catalog
    from sketchboard.settings import DEFAULT_STREAMS
    from store.commit_plan import column_partials
    from store.panes import dims_key

    catalog = load_catalog(DEFAULT_STREAMS)
    layout = catalog_layout(catalog, 12, 200)
    rng = __import__("random").Random(3)
    rows = []
    for i in range(400):
        name = rng.choice(["http_requests", "orders", "gone"])
        stream = catalog.streams.get(name) or catalog.streams["orders"]
        dead = i % 37 == 0
        t = 1_700_000_000_000 + rng.randrange(120_000)
        dims = [rng.choice(["a", "b", None]) for _ in stream.dimensions]
        rows.append({
            "stream": name, "dead_reason": "beyond_retention" if dead else None,
            "pane_start": None if dead else t - t % stream.pane, "dims": None if dead else dims, "event_time": t,
            "partition": i % stream.partitions,
            "vals": [rng.choice([None, rng.random()]) for _ in stream.values],
            "ids": [rng.choice(["u1", "u2", None, "u3"]) for _ in stream.distinct_fields],
            "clock_correction": None,
            "dead_record": {"partition": i % stream.partitions, "offset": i, "event_time": t, "ingest_time": t,
                            "error": None, "dims": dims, "raw_event_time": t, "clock_correction": None} if dead else None,
        })
    table = group_partials(pa.Table.from_pylist(rows, schema=INPUT), layout)
    ends = {"http_requests": {0: 10}, "orders": {0: 10}}
    by_column = build_commit("p", 1, table, catalog, ends, batch_now_ms=1)
    by_row = build_commit("p", 1, table.to_pylist(), catalog, ends, batch_now_ms=1)
    # Read from the table, each stream's partials come as columns (store/partial_columns.py), no
    # objects: row g stands for the partial the rows' path makes (its combination, a field where
    # its n is above 0, a sketch where not null).
    assert not by_column.partials and by_column.dead_letters and by_row.partials
    assert set(by_column.partial_columns) == {"http_requests", "orders"} and not by_row.partial_columns
    from_columns = [p for cols in by_column.partial_columns.values() for p in column_partials(cols, range(len(cols)))]
    key = lambda p: repr((p.stream, p.start_ms, sorted(p.dims.items())))  # noqa: E731
    assert sorted(from_columns, key=key) == sorted(by_row.partials, key=key)
    for cols in by_column.partial_columns.values():
        assert len(cols.keys) == len(set(cols.keys)) == len(cols.dims)  # each combination once
        assert [dims_key(d) for d in cols.dims] == list(cols.keys)
    assert by_column.partial_count == by_row.partial_count == len(by_row.partials)
    assert by_column == type(by_row)(**{**by_row.__dict__, "partials": [], "partial_columns": by_column.partial_columns})


def test_an_unknown_partials_mode_is_refused_with_its_name():
    from pathlib import Path

    import pytest
    from pydantic import ValidationError

    from aggregates.pipeline import PipelineConfig
    from sketchboard.settings import Settings

    with pytest.raises(ValueError, match="partials must be one of arrow, spark, not 'duck'"):
        PipelineConfig("p", Path("log.db"), Path("checkpoints"), partials="duck")
    with pytest.raises(ValidationError, match="partials"):
        Settings(partials="duck")


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 60).flatmap(lambda n: st.lists(st.one_of(
    st.lists(st.integers(-1, 5), min_size=n, max_size=n),  # codes (-1: past a list's end)
    st.lists(st.booleans(), min_size=n, max_size=n),  # validity
    st.lists(st.sampled_from([1_795_000_000_000, 1_795_000_010_000, -10_000, 0]), min_size=n, max_size=n),  # panes
    st.lists(st.integers(0, 2**40), min_size=n, max_size=n),  # wide: ranked, or past int64 together
), min_size=1, max_size=8)))
def test_the_groups_one_key_per_row_sorts_as_the_lexsort_does(keys):
    """_groups sorts the rows by one int64 per row made of its keys where they fit (_composite):
    the same order as numpy's lexsort of the keys (stable), the same group boundaries."""
    import numpy as np

    from aggregates.arrow_partials import _composite

    arrays = [np.asarray(k, np.int64) for k in keys]
    n = len(arrays[0])
    composite = _composite(arrays, n)
    if composite is None:  # too wide together: _groups uses the lexsort itself
        return
    order = np.lexsort(arrays[::-1])
    assert np.argsort(composite, kind="stable").tolist() == order.tolist()
    distinct = {tuple(int(a[i]) for a in arrays) for i in range(n)}
    assert len(set(composite.tolist())) == len(distinct)  # equal exactly when every key is


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62) | st.integers(0, 5), min_size=1, max_size=80))
def test_the_groups_sort_by_rank_is_the_stable_sort(values):
    """_sorted_runs ranks the composite keys and sorts the ranks: numpy's stable sort's order and runs."""
    import numpy as np

    from aggregates.arrow_partials import _sorted_runs

    composite = np.asarray(values, np.int64)
    order, starts, ends = _sorted_runs(composite)
    assert order.tolist() == np.argsort(composite, kind="stable").tolist()
    s = composite[order]
    assert starts.tolist() == [i for i in range(len(s)) if i == 0 or s[i] != s[i - 1]]
    assert ends.tolist() == starts.tolist()[1:] + [len(s)]


def test_the_groups_sort_of_many_groups_is_the_stable_sort():
    import numpy as np

    from aggregates.arrow_partials import _sorted_runs

    composite = np.random.default_rng(7).integers(0, 200_000, 150_000)  # more groups than 16 bits rank
    order, starts, ends = _sorted_runs(composite)
    assert order.tolist() == np.argsort(composite, kind="stable").tolist()
    assert len(starts) == len(np.unique(composite)) and ends[-1] == len(composite)


DIMS_ITEMS = st.sampled_from(["", "a", "ab", "b", "ba", "\x1f", "a\x1fb", "é"])


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.none() | st.lists(DIMS_ITEMS, max_size=4), min_size=1, max_size=40),
       null_item=st.booleans(), cut=st.integers(0, 5), split=st.integers(0, 40))
def test_the_dims_keys_are_equal_exactly_where_the_lists_are(rows, null_item, cut, split):
    """_groups' keys of the dims (read in place over the list's buffers, or slot by slot where an
    item is null): two rows' keys equal exactly when their lists do, for lists whose items run
    together into the same bytes, empty strings and empty lists, null lists, a column that is a
    slice of a longer one (its offsets start past 0) and one in two chunks."""
    import numpy as np

    from aggregates.arrow_partials import _dims_keys

    rows = [None, ["a"]] * (cut // 2) + rows
    if null_item:
        rows.append(["a", None])
    column = pa.array(rows, STRINGS).slice(cut)
    if 0 < split < len(column):
        column = pa.chunked_array([column.slice(0, split), column.slice(split)])
    values = column.to_pylist()
    keys = _dims_keys(column)
    assert all(len(k) == len(values) for k in keys)
    per_row = [tuple(int(k[i]) for k in keys) for i in range(len(values))]
    for i in range(len(values)):
        for j in range(len(values)):
            assert (per_row[i] == per_row[j]) == (values[i] == values[j]), (values[i], values[j])
    assert np.asarray(keys[0]).tolist() == [-1 if v is None else len(v) for v in values]


def test_the_dims_keys_are_read_in_place_unless_an_item_is_null():
    """Without a null item the keys are the length and two codes of binary arrays sharing the
    column's buffers (the one hash per row that replaced a joined copy of the items); a null item
    anywhere takes the slot-by-slot keys."""
    from aggregates.arrow_partials import _dims_in_place, _dims_keys

    column = pa.array([["ab", "c"], ["a", "bc"], None, [], [""]], STRINGS)
    joined, shapes = _dims_in_place(column)
    assert joined.to_pylist() == [b"abc", b"abc", b"", b"", b""]
    assert joined.buffers()[2].address == column.values.buffers()[2].address  # no copy of the items
    assert shapes.to_pylist() == [bytes([2, 1]), bytes([1, 2]), b"", b"", bytes([0])]
    assert len(_dims_keys(column)) == 3
    with_null = pa.array([["ab", None], ["a"]], STRINGS)
    assert _dims_in_place(with_null) is None
    items_sliced = pa.ListArray.from_arrays(pa.array([0, 2, 3], pa.int32()), pa.array(["x", "ab", "c", "d"]).slice(1))
    assert [keys.to_pylist() for keys in _dims_in_place(items_sliced)] == [[b"abc", b"d"], [bytes([2, 1]), bytes([1])]]
    long_items = pa.array([["x" * 300, "y"], ["x", "y" * 300]], STRINGS)  # lengths past a byte: 4 bytes each
    assert _dims_in_place(long_items)[1].to_pylist() == [
        (300).to_bytes(4, "little") + (1).to_bytes(4, "little"), (1).to_bytes(4, "little") + (300).to_bytes(4, "little")]
    assert len(set(zip(*(k.tolist() for k in _dims_keys(long_items))))) == 2


def test_groups_of_many_users_are_datasketches_updates_in_row_order():
    """Groups past a few hundred distinct users (sketches/hll_build.py replays the rest of their
    updates in numpy): the bytes of DataSketches fed each group's items in row order, repeats and
    the empty string included."""
    layout = Layout(values=1, distincts=1, partitions=2, kll_k=200, lg_k=12)
    rows, items = [], {}
    for g, (count, step) in enumerate(((3_000, 1), (1_500, 7), (700, 3), (400, 1))):
        group = [f"u{(i * step) % 2_500:05d}" for i in range(count)] + ["", "u00001"]
        items[g] = group
        rows += [{"stream": "a", "dead_reason": None, "pane_start": 10 * g, "dims": [], "event_time": i,
                  "partition": i % 2, "vals": [1.0], "ids": [item], "clock_correction": None, "dead_record": None}
                 for i, item in enumerate(group)]
    out = group_partials(pa.Table.from_pylist(rows, schema=INPUT), layout)
    got = dict(zip(out.column("pane_start").to_pylist(), out.column("hll_0").to_pylist(), strict=True))
    for g, group in items.items():
        sketch = hll_sketch(layout.lg_k, tgt_hll_type.HLL_8)
        for item in group:
            sketch.update(item)
        assert got[10 * g] == sketch.serialize_updatable(), g


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", ""])), max_size=12), st.integers(0, 12))
def test_codes_are_equal_exactly_where_the_values_are(values, cut):
    """`_codes` (the group keys' columns: a batch's one stream and all-null dead reasons take the
    one-value shortcut), over plain and chunked columns."""
    from aggregates.arrow_partials import _codes

    column = pa.array(values, pa.string())
    for c in (column, pa.chunked_array([column.slice(0, cut), column.slice(cut)], pa.string())):
        codes = _codes(c).tolist()
        assert len(codes) == len(values)
        assert all((codes[i] == codes[j]) == (values[i] == values[j])
                   for i in range(len(values)) for j in range(len(values)))
