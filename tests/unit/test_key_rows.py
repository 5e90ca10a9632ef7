"""The shared per-key job's pure parts (aggregates/key_rows.py): which rows a batch's events
explode into when sessions and first-seen read the same key, and the runs cut from each key's
event times on the driver, against a brute-force sessionization (Hypothesis)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggregates.batch_ids import BatchIds
from aggregates.key_rows import TAG_FIRST_SEEN, TAG_MEMBERSHIP, TAG_SESSIONS, KeyItem, key_rows_on_driver, runs_from_times
from tests.unit.test_session_window import sessionize

GAPS = {"a": 10, "b": 3}


def rows_table(rows: list[tuple[str, str | None, list[int]]]) -> pa.Table:
    """key_rows' output shape: stream, key (null where no times are carried), times (maybe empty)."""
    return pa.table({"stream": pa.array([r[0] for r in rows], pa.string()),
                     "tag": pa.array([TAG_SESSIONS] * len(rows), pa.int32()),
                     "key": pa.array([r[1] for r in rows], pa.string()),
                     "times": pa.array([r[2] for r in rows], pa.list_(pa.int64()))})


def run_rows(t: pa.Table) -> list[tuple]:
    return sorted(zip(*(t[c].to_pylist() for c in ("stream", "key", "first_ms", "last_ms", "events")), strict=True))


keyed_times = st.dictionaries(st.tuples(st.sampled_from(sorted(GAPS)), st.text("xyz", min_size=1, max_size=2)),
                              st.lists(st.integers(-50, 50), min_size=1, max_size=12), max_size=8)


@settings(max_examples=200, deadline=None)
@given(keyed_times, st.integers(0, 3), st.data())
def test_runs_from_times_are_the_sessionization_of_each_keys_times(keys, bloom_rows, data):
    """Each key's unsorted times (and rows without times, as Bloom-only rows come) give exactly
    the runs of a brute-force sessionization per stream, whatever the row order and chunking."""
    rows = [(s, k, times) for (s, k), times in keys.items()] + [("a", None, [])] * bloom_rows
    rows = data.draw(st.permutations(rows))
    table = rows_table(rows)
    if table.num_rows > 1:  # several chunks, as toArrow gives them
        cut = data.draw(st.integers(1, table.num_rows - 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    want = sorted((s, x.key, x.first_ms, x.last_ms, x.events)
                  for s, gap in GAPS.items()
                  for x in sessionize([(k, t) for (st_, k), ts in keys.items() if st_ == s for t in ts], gap))
    assert run_rows(runs_from_times(table, GAPS)) == want


def test_runs_from_times_of_no_rows_is_an_empty_table():
    assert runs_from_times(rows_table([]), GAPS).num_rows == 0
    assert runs_from_times(rows_table([("a", None, [])]), GAPS).column_names == \
        ["stream", "key", "first_ms", "last_ms", "events"]



KEY_ITEMS = [KeyItem("a", TAG_FIRST_SEEN, "user", key=None, seed=7, source=("ids", 0)),
             KeyItem("a", TAG_MEMBERSHIP, "user", key=None, seed=9, bucket_ms=20, source=("ids", 0)),
             KeyItem("b", TAG_SESSIONS, "region", key=None, gap=30, times=True, source=("dims", 1))]
labels = st.one_of(st.none(), st.sampled_from(["", "x", "y", "zz"]))
records_rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans(), st.integers(0, 200),
                                  st.one_of(st.none(), st.lists(labels, max_size=3)),
                                  st.one_of(st.none(), st.lists(labels, max_size=2))), max_size=40)


@settings(max_examples=150, deadline=None)
@given(records_rows, st.integers(0, 40))
def test_key_rows_of_the_kept_records_picked_by_position_are_those_of_the_kept_records_alone(rows, cut):
    """`key_rows_on_driver` with `keep` (a driver batch's merged rows, picked from the batch's whole
    columns) gives the very rows it gives for the kept records filtered out first (what it was
    given before), whatever the dead rows hold (no event time, short or null lists) and the chunks."""
    records = pa.table({"stream": pa.array([r[0] for r in rows], pa.string()),
                        "event_time": pa.array([r[2] if r[1] else None for r in rows], pa.int64()),
                        "dims": pa.array([r[3] for r in rows], pa.list_(pa.string())),
                        "ids": pa.array([r[4] for r in rows], pa.list_(pa.string()))})
    keep = pa.array([r[1] for r in rows], pa.bool_())
    if 0 < cut < len(rows):  # several chunks, as a batch read from several segments has
        records = pa.concat_tables([records.slice(0, cut), records.slice(cut)])
    picked = key_rows_on_driver(records, KEY_ITEMS, keep=keep)
    filtered = key_rows_on_driver(records.filter(keep), KEY_ITEMS)
    assert picked.slots.equals(filtered.slots) and picked.groups == filtered.groups
    # The ids encoded once for the batch's steps (aggregates/batch_ids.py): the same rows.
    encoded = key_rows_on_driver(records, KEY_ITEMS, keep=keep, ids=BatchIds.of(records.column("ids")))
    assert encoded.slots.equals(picked.slots)


slot_keys = st.one_of(st.none(), st.sampled_from(["", "a", "b", "ab", "é", "ключ", "🙂", "a "]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(slot_keys, st.integers(-10_000, 10_000)), max_size=60),
       st.sampled_from([0, 1, 7, 1000, 30_000]), st.sampled_from([None, 0, 1 << 40]))
def test_slot_stats_are_each_key_and_slots_min_max_and_count_in_key_then_slot_order(rows, slot_ms, dense_limit):
    """Per (key, slot) of the rows with a key (not null, not ""): the earliest and latest time
    and the count, keys in byte order (UTF-8's is the code points'), whichever way it is computed
    (the dense table: 1 << 40 cells allowed; sorting: none)."""
    from aggregates.key_rows import slot_stats

    keys = pa.array([k for k, _ in rows], pa.string())
    times = np.array([t for _, t in rows], np.int64)
    want: dict[tuple[str, int], list[int]] = {}
    for k, t in rows:
        if k:
            want.setdefault((k, t - t % slot_ms if slot_ms else 0), []).append(t)
    got = slot_stats(keys, times, slot_ms, dense_limit=dense_limit)
    if not want:
        assert got is None
        return
    distinct, key_at, slot, first, last, events = got
    assert distinct.to_pylist() == sorted({k for k, _ in want})
    assert list(zip(distinct.take(pa.array(key_at)).to_pylist(), slot.tolist(), first.tolist(), last.tolist(),
                    events.tolist(), strict=True)) == \
        [(k, s, min(ts), max(ts), len(ts)) for (k, s), ts in sorted(want.items())]


@settings(max_examples=100, deadline=None)
@given(records_rows)
def test_key_rows_on_driver_are_each_groups_keys_slots_and_hashes(rows):
    """The rows of every group (stream, key field) against a brute-force count, in (group, key,
    slot) order, with the key's hashes for each Bloom item's seed and nulls where the group has
    none."""
    from sketches.bloom import hashes

    records = pa.table({"stream": pa.array([r[0] for r in rows], pa.string()),
                        "event_time": pa.array([r[2] for r in rows], pa.int64()),
                        "dims": pa.array([r[3] for r in rows], pa.list_(pa.string())),
                        "ids": pa.array([r[4] for r in rows], pa.list_(pa.string()))})
    got = key_rows_on_driver(records, KEY_ITEMS).slots.to_pylist()
    assert key_rows_on_driver(records, KEY_ITEMS, ids=BatchIds.of(records.column("ids"))).slots.to_pylist() == got
    groups = [("a", "ids", 0, 20, 7, 9), ("b", "dims", 1, 30, None, None)]  # stream, source, slot_ms, seeds
    want = []
    for gid, (stream, column, index, slot_ms, seed, mseed) in enumerate(groups):
        cells: dict[tuple[str, int], list[int]] = {}
        for r in rows:
            lists = r[3] if column == "dims" else r[4]
            key = lists[index] if r[0] == stream and lists is not None and len(lists) > index else None
            if key:
                cells.setdefault((key, r[2] - r[2] % slot_ms), []).append(r[2])
        for (key, slot), ts in sorted(cells.items()):
            h = [int(x[0]) for x in hashes([key], seed)] if seed is not None else [None, None]
            mh = [int(x[0]) for x in hashes([key], mseed)] if mseed is not None else [None, None]
            want.append({"group": gid, "key": key, "slot": slot, "first_ms": min(ts), "last_ms": max(ts),
                         "events": len(ts), "h1": h[0], "h2": h[1], "mh1": mh[0], "mh2": mh[1]})
    assert got == want


@settings(max_examples=150, deadline=None)
@given(records_rows, st.sampled_from([5, 20, 60]), st.sampled_from([1, 30, 100]))
# A key's events in two buckets and two sessions, another key's in one.
@example(rows=[("a", True, 0, [], ["x"]), ("a", True, 150, [], ["x"]), ("a", True, 7, [], ["y"])], bucket_ms=20, gap=30)
def test_sorted_slots_give_the_bloom_rows_and_runs_the_group_by_gives(rows, bucket_ms, gap):
    """`key_rows_on_driver` gives its slots sorted (`ordered`): the first-seen rows, membership
    buckets and sessions' runs cut from each key's run of slots are the rows (in the same order)
    that the group-by and sort over slots in any order (Spark's job) give."""
    from dataclasses import replace as replaced

    items = [KeyItem("a", TAG_FIRST_SEEN, "user", key=None, seed=7, source=("ids", 0)),
             KeyItem("a", TAG_MEMBERSHIP, "user", key=None, seed=9, bucket_ms=bucket_ms, source=("ids", 0)),
             KeyItem("a", TAG_SESSIONS, "user", key=None, gap=gap, times=True, source=("ids", 0)),
             KeyItem("b", TAG_SESSIONS, "region", key=None, gap=gap, times=True, source=("dims", 1))]
    records = pa.table({"stream": pa.array([r[0] for r in rows], pa.string()),
                        "event_time": pa.array([r[2] for r in rows], pa.int64()),
                        "dims": pa.array([r[3] for r in rows], pa.list_(pa.string())),
                        "ids": pa.array([r[4] for r in rows], pa.list_(pa.string()))})
    ordered = key_rows_on_driver(records, items)
    assert ordered.ordered
    anyhow = replaced(ordered, ordered=False)
    assert ordered.bloom_rows().equals(anyhow.bloom_rows())
    assert ordered.runs().equals(anyhow.runs())
