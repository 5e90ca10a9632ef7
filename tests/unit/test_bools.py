"""ingest.log.records.bools: a boolean column as numpy booleans, from its bitmap, equal to what
Arrow's own conversion gives whatever the slice, the chunks or the nulls."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.log.records import bools

values = st.lists(st.booleans(), max_size=300)


@settings(max_examples=200, deadline=None)
@given(values=values, start=st.integers(0, 40), stop=st.integers(0, 40), cut=st.integers(0, 300))
def test_a_sliced_or_chunked_column_is_what_arrow_converts(values, start, stop, cut):
    array = pa.array(values, pa.bool_()).slice(start, max(0, len(values) - start - stop))
    expected = array.to_numpy(zero_copy_only=False)
    got = bools(array)
    assert got.dtype == np.bool_ and got.tolist() == expected.tolist()
    chunked = pa.chunked_array([array.slice(0, cut), array.slice(cut)], pa.bool_())
    assert bools(chunked).tolist() == expected.tolist()


def test_a_mask_of_a_computation_and_an_empty_one():
    data = pa.array([1.0, None, 3.0, None, 5.0, 6.0, 7.0, 8.0, 9.0])
    assert bools(data.is_valid()).tolist() == [True, False, True, False, True, True, True, True, True]
    assert bools(pc.greater(data.slice(2), 4.0).fill_null(False)).tolist() == [False, False, True, True, True,
                                                                              True, True]
    assert bools(pa.array([], pa.bool_())).tolist() == []
    assert bools(pa.chunked_array([], pa.bool_())).tolist() == []


def test_nulls_are_left_to_arrows_conversion():
    got = bools(pa.array([True, None, False]))
    assert got.dtype == object and got.tolist() == [True, None, False]
