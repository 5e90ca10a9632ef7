"""The patterns' events read from the batch's Arrow records column by column
(aggregates/patterns.py): the same values as reading each row's lists one by one, for null
lists, short lists, null elements and several chunks."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.patterns import list_slot

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
