"""store/row_columns.py: pane rows encoded column-wise equal row_codec's row-by-row texts and
blobs, byte for byte."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from store import PaneData, PanePartial, ValueStats
from store.partial_columns import PartialColumns
from store.row_codec import sketches_blob, stats_text
from store.row_columns import encode_columns

VALUES = ("latency_ms", "response_bytes", "a\"b")  # a name JSON must escape
DISTINCTS = ("user_id", "é")

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e6, 1e6).map(lambda x: round(x, 2)),  # what demo values look like
    st.integers(-10**6, 10**6).map(float),
    st.sampled_from([0.0, -0.0, 1e-4, 9.9e-5, 1e16, 9999999999999998.0, 1e15 + 0.5, 5e-324]),
)
sketch = st.binary(min_size=0, max_size=40)


@st.composite
def stats(draw):
    return ValueStats(draw(st.integers(1, 10**12)), draw(numbers), draw(numbers), draw(numbers),
                      draw(st.none() | sketch))


@st.composite
def partials(draw):
    rows = []
    for start in range(draw(st.integers(0, 12))):
        values = {name: draw(stats()) for name in VALUES if draw(st.booleans())}
        distincts = {name: draw(sketch) for name in DISTINCTS if draw(st.booleans())}
        rows.append(PanePartial("s", start * 10_000, start * 10_000 + 10_000, {}, PaneData(draw(st.integers(1, 9)),
                                                                                        values, distincts)))
    return rows


def _ordinary(v: ValueStats) -> bool:
    """Numbers whose text Arrow writes without an exponent, as repr does (beyond 1e10 it may not)."""
    return all(x == 0 or (math.isfinite(x) and 1e-4 <= abs(x) < 1e10) for x in (v.sum, v.min, v.max))


@settings(max_examples=300)
@given(partials())
def test_the_columns_encode_every_row_as_row_codec_does(rows):
    cols = PartialColumns.of("s", rows, VALUES, DISTINCTS)
    texts, blobs = encode_columns(cols)
    assert blobs == [sketches_blob(p.data) for p in rows]
    for p, text in zip(rows, texts, strict=True):
        if text is not None:
            assert text == stats_text(p.data)
        else:  # left to row_codec only for a row with an unusual number
            assert not all(_ordinary(v) for v in p.data.values.values())


def test_ordinary_numbers_are_all_encoded_here_and_a_row_without_values_is_empty():
    rows = [PanePartial("s", 0, 10_000, {}, PaneData(2, {"latency_ms": ValueStats(2, 123.5, 12.25, 111.25, b"k"),
                                                          "response_bytes": ValueStats(2, 2048.0, 1000.0, 1048.0)},
                                                     {"user_id": b"h"})),
            PanePartial("s", 10_000, 20_000, {}, PaneData(1, {}, {}))]
    texts, blobs = encode_columns(PartialColumns.of("s", rows, VALUES, DISTINCTS))
    assert texts == ['{"latency_ms":[2,123.5,12.25,111.25],"response_bytes":[2,2048.0,1000.0,1048.0]}', "{}"]
    assert blobs == [sketches_blob(p.data) for p in rows]


def test_a_whole_number_sum_given_as_an_int_is_left_to_row_codec():
    rows = [PanePartial("s", 0, 10_000, {}, PaneData(1, {"latency_ms": ValueStats(1, 5, 5.0, 5.0)}, {}))]
    assert stats_text(rows[0].data) == '{"latency_ms":[1,5,5.0,5.0]}'  # "5", where a float writes "5.0"
    assert encode_columns(PartialColumns.of("s", rows, VALUES, DISTINCTS)) is None
