"""ingest.source_rows.interleave: row i of the result is [columns[0][i], columns[1][i], ...], for
numbers (written into one numpy array) and strings (one take), whole, sliced or in chunks, with
nulls."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.source_rows import interleave


def reference(columns: list[list], n: int, value_type: pa.DataType, fill=None) -> pa.Array:
    rows = [[fill if c[i] is None and fill is not None else c[i] for c in columns] for i in range(n)]
    return pa.array(rows, pa.list_(pa.field("element", value_type)))


def chunked(values: list, value_type: pa.DataType, cuts: list[int]) -> pa.ChunkedArray:
    bounds = sorted({0, len(values), *(c % (len(values) + 1) for c in cuts)})
    return pa.chunked_array([pa.array(values[a:b], value_type) for a, b in zip(bounds, bounds[1:])] or
                            [pa.array([], value_type)], value_type)


numbers = st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-2**40, 2**40).map(float))
# Up to 20 characters, some past ASCII.
texts = st.one_of(st.none(), st.text(max_size=20), st.text(alphabet="aé€😀", max_size=9))


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(0, 30), st.integers(0, 4), st.lists(st.integers(0, 40), max_size=3))
def test_numbers_are_interleaved_row_by_row_with_their_nulls(data, n, width, cuts):
    columns = [data.draw(st.lists(numbers, min_size=n, max_size=n)) for _ in range(width)]
    arrays = [chunked(c, pa.float64(), cuts) if j % 2 else pa.array(c, pa.float64()) for j, c in enumerate(columns)]
    got = interleave(arrays, n, pa.float64())
    assert got.to_pylist() == reference(columns, n, pa.float64()).to_pylist()
    assert got.type == pa.list_(pa.field("element", pa.float64()))
    assert got.values.null_count == sum(v is None for c in columns for v in c)


def sliced(values: list, skip: list) -> pa.Array:
    """`values` as an array that is a slice of a longer one (its offsets start past 0)."""
    return pa.array(skip + values, pa.string()).slice(len(skip))


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(0, 30), st.integers(1, 4), st.lists(st.integers(0, 40), max_size=3),
       st.sampled_from([None, ""]), st.lists(texts, max_size=3))
def test_texts_are_interleaved_row_by_row_nulls_kept_or_filled(data, n, width, cuts, fill, skip):
    columns = [data.draw(st.lists(texts, min_size=n, max_size=n)) for _ in range(width)]
    arrays = [chunked(c, pa.string(), cuts) if j % 3 == 1 else sliced(c, skip) if j % 3 == 2
              else pa.array(c, pa.string()) for j, c in enumerate(columns)]
    got = interleave(arrays, n, pa.string(), fill=fill)
    expected = reference(columns, n, pa.string(), fill)
    assert got.to_pylist() == expected.to_pylist()
    assert got.values.null_count == expected.values.null_count  # "" filled in, or the nulls kept
    got.validate(full=True)


def test_integers_given_as_numbers_are_cast():
    got = interleave([pa.array([1, None, 3], pa.int64()), pa.array([0.5, 1.5, None])], 3, pa.float64())
    assert got.to_pylist() == [[1.0, 0.5], [None, 1.5], [3.0, None]]
