"""GET /api/v1/query writes its answer point by point (query.compute.answer_text): the very
bytes a JSONResponse renders of answer_json(), for every kind of value a point may hold."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from query import StatSeries, answer_json, answer_text
from query.model import Query
from store.rollup import ErrorBound, Point

QUERY = Query(metric="latency", stream="http_requests", stats=("p99",), quantiles=(0.99,), unit="ms",
              value_field="latency_ms", distinct_field=None, pane_ms=10_000, group_by=("endpoint",), filters=(),
              step_ms=60_000, window_ms=60_000)

floats = st.floats(allow_nan=True, allow_infinity=True)
finite = st.floats(allow_nan=False, allow_infinity=False)  # what point_json passes through as is
values = st.one_of(st.none(), floats, st.integers(-2**63, 2**63))
errors = st.one_of(
    st.none(),
    st.builds(ErrorBound, st.sampled_from(["kll", "hll", "bloom"]), floats, floats, st.one_of(st.none(), finite),
              st.one_of(st.none(), finite), st.one_of(st.none(), finite)),
)
points = st.builds(Point, st.integers(-2**62, 2**62), values, st.integers(0, 2**62), st.booleans(),
                   st.integers(0, 10**6), errors)
series = st.builds(StatSeries, st.sampled_from(["p99", "count", "distinct"]),
                   st.dictionaries(st.sampled_from(["endpoint", "région"]), st.text()), st.lists(points, max_size=5))


def rendered(obj) -> str:
    """What starlette's JSONResponse.render writes."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


@settings(max_examples=100, deadline=None)
@given(answer=st.lists(series, max_size=4), watermark=st.one_of(st.none(), st.integers(0, 2**62)))
def test_answer_text_is_what_a_json_response_renders(answer, watermark):
    text = answer_text(QUERY, 0, 60_000, watermark, answer)
    assert text == rendered(answer_json(QUERY, 0, 60_000, watermark, answer))


def test_no_series_and_unusual_values():
    answer = [StatSeries("p99", {"endpoint": '/a"b\\ü'}, [Point(0, float("inf"), 1, True, 2, None),
                                                         Point(60_000, 5, 0, False, 0, ErrorBound("kll", 1.0, 2.0))])]
    for series_list in ([], answer):
        assert answer_text(QUERY, 0, 120_000, None, series_list) == rendered(
            answer_json(QUERY, 0, 120_000, None, series_list))

