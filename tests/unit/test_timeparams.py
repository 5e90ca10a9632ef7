"""catalog.times: instants and duration parameters are bounded (1970..9999, at most 36500d)
and every error is a BadParam naming the parameter. Pure: no app, no store."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.times import BadParam, MAX_TIME_MS, parse_duration_param, parse_instant_ms, parse_range_ms
from api.ws_protocol import ProtocolError, QueryIn, resolve_query
from catalog import MAX_DURATION_MS, load_catalog
from tests.conftest import DEMO_CONFIG

NOW = 1_800_000_000_000


@pytest.mark.parametrize("text,ms", [
    ("now", NOW), ("now-15m", NOW - 900_000), ("now + 1h", NOW + 3_600_000), ("0", 0),
    ("1800000000", NOW), (str(NOW), NOW), ("2027-01-15T08:00:00Z", NOW),
    (str(MAX_TIME_MS), MAX_TIME_MS), ("9999-12-31T23:59:59.999Z", MAX_TIME_MS),
])
def test_instants_in_range(text, ms):
    assert parse_instant_ms(text, NOW, "from") == ms


@pytest.mark.parametrize("text,fragment", [
    ("now-99999999999999999999d", "exceeds the maximum of 36500d"),
    ("now-" + "9" * 400 + "s", "exceeds the maximum of 36500d"),
    ("now-36500d", "is outside 1970-01-01"),
    ("1e400", "is not a finite number"),
    ("-inf", "is not a finite number"),
    ("9" * 400, "is not a finite number"),
    (str(MAX_TIME_MS + 1), "outside 1970..9999"),
    ("-1", "outside 1970"),
    ("soon", "is not a time in 1970-01-01"),
])
def test_instants_out_of_range_name_the_parameter(text, fragment):
    with pytest.raises(BadParam) as info:
        parse_instant_ms(text, NOW, "to")
    assert info.value.param == "to" and str(info.value).startswith("to: ") and fragment in str(info.value)
    assert len(str(info.value)) < 250


def test_a_range_must_go_forward():
    with pytest.raises(BadParam, match="must be after") as info:
        parse_range_ms("now", "now-1h", NOW)
    assert info.value.param == "to"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"now[+-][0-9]{1,40}(\.[0-9]{1,5})?(ms|s|m|h|d|w)", fullmatch=True))
def test_any_text_is_an_instant_in_range_or_a_bad_param(text):
    try:
        ms = parse_instant_ms(text, NOW, "from")
    except BadParam as exc:
        assert exc.param == "from"
    else:
        assert 0 <= ms <= MAX_TIME_MS


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"[0-9]{1,400}(\.[0-9]{1,5})?(ms|s|m|h|d|w)", fullmatch=True))
def test_any_text_is_a_bounded_duration_or_a_bad_param(text):
    try:
        ms = parse_duration_param(text, "step")
    except BadParam as exc:
        assert exc.param == "step"
    else:
        assert 0 <= ms <= MAX_DURATION_MS


@pytest.mark.parametrize("query,fragment", [
    ({"step": "99999999999999999999d"}, "step: duration"),
    ({"window": "9" * 400 + "s"}, "window: duration"),
    ({"from": "now-99999999999d"}, "from: duration"),
    ({"from": 10**400}, "from: "),
])
def test_a_websocket_subscription_is_bounded_the_same_way(query, fragment):
    with pytest.raises(ProtocolError) as info:
        resolve_query(QueryIn(metric="latency", **query), load_catalog(DEMO_CONFIG), NOW, 11_000)
    assert fragment in info.value.reason


@settings(max_examples=200, deadline=None)
@given(epoch=st.one_of(st.integers(0, NOW // 1000 - 1), st.integers(100_000_000_000, NOW - 1),
                       st.floats(0, NOW // 1000 - 1), st.floats(100_000_000_000, NOW - 1),
                       st.integers(0, NOW // 1000 - 1).map(lambda s: s + 0.5)))
def test_a_websocket_epoch_number_is_the_instant_rest_reads_from_its_text(epoch, demo_catalog):
    """A subscription's from/to as a JSON number (ms or s, fractional too) is the instant GET
    /api/v1/query reads from the same number as text: one parser, catalog.times.parse_instant_ms.
    (Any range back to 1970 resolves: its default step is one the kept tiers answer.) The demo
    catalog is the session's (the same file): loading it per example was 11 s of the 200."""
    import json

    from api.ws_protocol import parse_message
    msg = parse_message(json.dumps({"type": "subscribe", "id": "a", "query": {"metric": "latency", "from": epoch}}))
    q = resolve_query(msg.query, demo_catalog, NOW, 11_000)
    rest = parse_instant_ms(json.dumps(epoch), NOW, "from")  # the number as a query string carries it
    assert parse_instant_ms(q.from_text, NOW, "from") == rest


@pytest.mark.parametrize("value", [True, False])
def test_a_websocket_from_or_to_is_never_a_boolean(value):
    """JSON true was epoch 1 s (Python's bool is an int): a subscription from 1970."""
    import json

    from api.ws_protocol import parse_message
    for field in ("from", "to"):
        with pytest.raises(ProtocolError, match="not a boolean"):
            parse_message(json.dumps({"type": "subscribe", "id": "a", "query": {"metric": "latency", field: value}}))


@pytest.mark.parametrize("text,ms", [
    ("2027-01-15t08:00:00z", NOW), ("2027-01-15T08:00:00z", NOW), ("2027-01-15t09:00:00+01:00", NOW),
    # A leap second is the last millisecond of its minute, in UTC or written in an offset.
    ("2016-12-31T23:59:60Z", 1_483_228_799_999), ("2016-12-31T23:59:60.5Z", 1_483_228_799_999),
    ("2017-01-01T00:59:60+01:00", 1_483_228_799_999),
])
def test_rfc3339_lowercase_letters_and_leap_seconds_are_times(text, ms):
    """RFC 3339 allows 't' and 'z' in lowercase and second 60 (a leap second, 23:59:60 UTC)."""
    assert parse_instant_ms(text, 0, "from") == ms


@pytest.mark.parametrize("text,fragment", [
    ("2027-01-15", "is a date without a time; add one, e.g. 2027-01-15T00:00:00Z"),
    ("2027-01-15Z", "is a date without a time; add one, e.g. 2027-01-15T00:00:00Z"),
    ("2027-01-15+01:00", "is a date without a time"),
    ("2016-12-31T22:59:60Z", "a leap second, which is only 23:59:60 UTC"),
])
def test_a_date_without_a_time_and_a_leap_second_elsewhere_say_what_is_wrong(text, fragment):
    with pytest.raises(BadParam, match=fragment):
        parse_instant_ms(text, NOW, "from")


def test_a_window_shorter_than_the_default_step_names_it():
    """The user gave no step: the message names the default one (and how to choose another)."""
    from query import QueryError, resolve
    with pytest.raises(QueryError, match=r"at least the default step for this range \(5m, 300000 ms; pass a step\)"):
        resolve(load_catalog(DEMO_CONFIG), metric="latency", stats=["count"], start="now-1d", window="1m",
                now_ms=NOW, max_points=11_000)
