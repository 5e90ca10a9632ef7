"""The patterns' events read from the batch's Arrow records column by column
(aggregates/patterns.py): the same values as reading each row's lists one by one, for null
lists, short lists, null elements and several chunks; events that no step might take left out
with the matches and late events unchanged (against the brute-force definition)."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.patterns import list_slot, pattern_events
from catalog.loader import parse_catalog
from patterns.events import PatternEvent
from patterns.plan import compile_pattern
from tests.support.patterns import EXAMPLES_YAML
from tests.unit.test_pattern_batches import FakeStore, arrivals, net
from tests.unit.test_pattern_matcher import oracle, patterns

rows = st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "10.0.0.1"])),
                                              max_size=4)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(rows, min_size=1, max_size=3), i=st.integers(0, 4))
def test_a_list_slot_reads_what_each_rows_list_holds(chunks, i):
    column = pa.chunked_array([pa.array(c, pa.list_(pa.string())) for c in chunks], pa.list_(pa.string()))
    expected = [None if row is None or i >= len(row) else row[i] for c in chunks for row in c]
    assert list_slot(column, i) == expected
    sliced = column.slice(1)  # a filtered or sliced table's column starts inside its buffers
    assert list_slot(sliced, i) == expected[1:]


def records(catalog, events) -> pa.Table:
    """The batch's records as the pipeline collects them: each stream's dimensions, ids, values."""
    def slots(e, names):
        return [None if e.fields.get(n) is None else e.fields[n] for n in names]

    streams = catalog.streams
    return pa.table({
        "stream": pa.array([e.stream for e in events], pa.string()),
        "partition": pa.array([e.partition for e in events], pa.int32()),
        "offset": pa.array([e.offset for e in events], pa.int64()),
        "event_time": pa.array([e.time for e in events], pa.int64()),
        "dims": pa.array([slots(e, streams[e.stream].dimensions) for e in events], pa.list_(pa.string())),
        "vals": pa.array([[None if v is None else float(v) for v in slots(e, streams[e.stream].values)] for e in events],
                         pa.list_(pa.float64())),
        "ids": pa.array([slots(e, streams[e.stream].source_ids) for e in events], pa.list_(pa.string())),
    })


@settings(max_examples=300, deadline=None)
@given(catalog=patterns(), batches=arrivals())
def test_events_no_step_might_take_are_left_out_and_the_matches_and_late_events_stay_the_same(catalog, batches):
    pattern = catalog.patterns[0]
    plan = compile_pattern(pattern, catalog)
    store = FakeStore()
    accepted, late = [], []
    fed = []  # the events read and fed (or corrected): a late event after one of its key's is replayed
    for events, mark in batches:
        read = pattern_events(records(catalog, events), catalog, plan, pattern, late_through_ms=store.watermark)
        assert {(e.stream, e.offset) for e in read} <= {(e.stream, e.offset) for e in events}
        places = {(e.stream, e.offset) for e in read}
        for e in events:
            if e.stream in pattern.streams:  # the pipeline reads no other stream for the pattern
                if store.watermark is not None and e.time <= store.watermark:
                    late.append(e)
                    if any(f.key == e.key and f.order < e.order for f in fed):
                        accepted.append(e)
                        fed.append(e)
                else:
                    accepted.append(e)
                    if (e.stream, e.offset) in places:
                        fed.append(e)
        store.batch(plan, read, mark)
    assert sorted(net(store)) == sorted(oracle(plan, sorted(accepted, key=lambda e: e.order), 10_000))
    assert sorted((e.stream, e.offset) for e in store.late) == sorted((e.stream, e.offset) for e in late)
    assert store.keys == {} and store.buffer == {}


def test_an_event_no_step_might_take_is_neither_buffered_nor_fed_unless_a_step_is_next():
    catalog = parse_catalog(EXAMPLES_YAML)
    pattern = catalog.patterns[1]  # abandoned_checkout: started, not followed by completed
    plan = compile_pattern(pattern, catalog)
    events = [PatternEvent("checkouts", 0, i, 1000 + i, "s1", {"session_id": "s1", "stage": stage})
              for i, stage in enumerate(["started", "browsing", "completed", "paid"])]
    table = records(catalog, events)
    assert [e.fields["stage"] for e in pattern_events(table, catalog, plan, pattern)] == ["started", "completed"]
    # Late events are all kept (each is recorded), whether a step might take them or not.
    assert len(pattern_events(table, catalog, plan, pattern, late_through_ms=1001)) == 3
    strict = dataclasses.replace(plan, steps=tuple(dataclasses.replace(s, strict=True) for s in plan.steps))
    assert len(pattern_events(table, catalog, strict, pattern)) == 4  # under `next` every event of a key matters
