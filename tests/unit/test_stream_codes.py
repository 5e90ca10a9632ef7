"""aggregates/stream_codes.py: a batch's stream column encoded once answers which rows are of which
stream and each row's per-stream constant as Arrow's own kernels did (is_in, index_in and take),
whatever the nulls, slices, chunks and the columns kept before."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates import stream_codes
from aggregates.driver_rules import stream_is
from aggregates.stream_codes import forget_stream_codes, per_stream_values, stream_rows

NAMES = ["http_requests", "orders", "sensor", "s", ""]
columns = st.lists(st.one_of(st.none(), st.sampled_from(NAMES)), max_size=60)


def arrow_rows(streams, names) -> list[bool]:
    return pc.fill_null(pc.is_in(streams, value_set=pa.array(list(names), pa.string())), False).to_pylist()


def arrow_values(streams, values) -> list:
    names = list(values)
    at = pc.index_in(streams, value_set=pa.array(names, pa.string()))
    return pa.array(np.array([values[n] for n in names], np.int64)).take(at).to_pylist() if names else \
        [None] * len(streams)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.tuples(columns, st.integers(0, 5), st.integers(0, 60)), min_size=1, max_size=4),
       asked=st.lists(st.sampled_from(NAMES), max_size=3),
       values=st.dictionaries(st.sampled_from(NAMES), st.integers(-5, 5)))
def test_every_answer_is_arrows_whatever_was_encoded_before(batches, asked, values):
    forget_stream_codes()
    for names, start, cut in batches:  # several columns in a row: each answered as its own
        column = pa.array(names, pa.string()).slice(start)
        chunked = pa.chunked_array([column.slice(0, cut), column.slice(cut)], pa.string())
        for streams in (column, chunked, column):  # the same column again: from what was kept
            assert stream_rows(streams, asked).tolist() == arrow_rows(column, asked)
            assert stream_is(streams, asked).to_pylist() == arrow_rows(column, asked)
            assert per_stream_values(streams, values).to_pylist() == arrow_values(column, values)


def test_a_column_kept_is_held_so_its_buffers_are_never_another_ones():
    forget_stream_codes()
    first = pa.array(["a", "b"] * 1000)
    assert stream_rows(first, ["a"])[:2].tolist() == [True, False]
    kept = stream_codes._kept[0][1]
    assert kept is first or kept.buffers()[2].address == first.buffers()[2].address
    del first  # its buffers stay with the entry: a new column cannot be given their addresses
    second = pa.array(["b", "a"] * 1000)
    assert stream_rows(second, ["a"])[:2].tolist() == [False, True]
    assert len(stream_codes._kept) == 2
    two_chunks = pa.chunked_array([pa.array(["a"]), pa.array(["b"])])
    assert stream_rows(two_chunks, ["b"]).tolist() == [False, True]
    assert len(stream_codes._kept) == 2  # put together anew at each call: not kept
    for i in range(stream_codes.KEPT + 2):  # a few columns at most
        stream_rows(pa.array([f"s{i}"] * 10), ["s0"])
    assert len(stream_codes._kept) == stream_codes.KEPT
    forget_stream_codes()  # the pipeline's, after each batch
    assert stream_codes._kept == ()
