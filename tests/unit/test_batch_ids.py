"""A batch's ids hashed once (aggregates/batch_ids.py): each row's item at a slot is the one
Spark's get() reads (the strings `list_get` takes), whatever the lists' shape (Hypothesis)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.batch_ids import BatchIds
from aggregates.driver_rules import list_get

items = st.one_of(st.none(), st.sampled_from(["", "u1", "u2", "ключ", "🙂"]))
id_lists = st.lists(st.one_of(st.none(), st.lists(items, max_size=3)), max_size=30)


def as_column(rows, cut: int, skip: int):
    """The lists as a ChunkedArray of two chunks (cut) and sliced past `skip` rows, as a batch's
    columns come from segments."""
    whole = pa.array([["x", None]] * skip + rows, pa.list_(pa.string())).slice(skip)
    if 0 < cut < len(rows):
        return pa.chunked_array([whole.slice(0, cut), whole.slice(cut)])
    return whole


@settings(max_examples=200, deadline=None)
@given(id_lists, st.integers(0, 30), st.integers(0, 3), st.integers(0, 3), st.data())
def test_a_slots_codes_name_the_items_get_reads(rows, cut, skip, index, data):
    column = as_column(rows, cut, skip)
    ids = BatchIds.of(column)
    assert ids.rows == len(rows)
    picked = np.array(data.draw(st.lists(st.integers(0, max(len(rows) - 1, 0)), max_size=10)) if rows else [],
                      np.int64)
    for at in (None, picked):
        want = list_get(column, index, at).to_pylist()
        code = ids.slot(index, at)
        assert [None if c < 0 else ids.dictionary[int(c)].as_py() for c in code] == want


@settings(max_examples=100, deadline=None)
@given(id_lists, st.integers(0, 2), st.data())
def test_the_keys_used_are_the_distinct_ones_a_slot_holds_each_once(rows, index, data):
    ids = BatchIds.of(pa.array(rows, pa.list_(pa.string())))
    code = ids.slot(index)
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows))), bool)
    code = np.where(keep, code, -1)
    keys, where = ids.used(code)
    names = keys.to_pylist()
    assert len(set(names)) == len(names)
    assert set(names) == {ids.dictionary[int(c)].as_py() for c in code if c >= 0}
    assert [None if w < 0 else names[w] for w in where] == \
        [None if c < 0 else ids.dictionary[int(c)].as_py() for c in code]


def test_no_items_at_all():
    ids = BatchIds.of(pa.array([None, []], pa.list_(pa.string())))
    assert len(ids.dictionary) == 0 and ids.slot(0).tolist() == [-1, -1]
    assert ids.used(ids.slot(0))[0].to_pylist() == []
