"""query.resolve: one set of checks, each naming its parameter, for REST, websocket and alerts.
Pure: the demo catalog and a fixed `now`, no store."""

from __future__ import annotations

import pytest

from query import Query, QueryError, parse_filters, resolve, resolve_target

NOW = 1_800_000_000_000
MINUTE = 60_000


def ask(catalog, **kw) -> Query:
    return resolve(catalog, **{"metric": "latency", "stats": ["count"], "now_ms": NOW, "max_points": 11_000, **kw})


def test_defaults_the_first_nice_step_within_300_points_that_fits_the_pane_and_a_window_of_one_step(catalog):
    q = ask(catalog)
    assert (q.stream, q.pane_ms, q.step_ms, q.window_ms) == ("http_requests", 10_000, 30_000, 30_000)
    assert q.relative and q.range_at(NOW) == (NOW - 3_600_000, NOW)
    assert q.range_at(NOW + MINUTE) == (NOW - 3_600_000 + MINUTE, NOW + MINUTE)  # relative: it slides


def test_an_absolute_range_stays_still_and_is_aligned_to_the_step(catalog):
    q = ask(catalog, start=str(NOW - 95_000), end=str(NOW - 5_000), step="30s")
    assert not q.relative
    assert q.range_at(NOW) == q.range_at(NOW + MINUTE) == (NOW - 120_000, NOW)


def test_stats_are_deduplicated_with_their_quantiles_and_bounded(catalog):
    q = ask(catalog, stats=["p99", "avg", "p99", "p50"])
    assert q.stats == ("p99", "avg", "p50") and q.quantiles == (0.99, None, 0.5) and q.needs_sketches
    with pytest.raises(QueryError) as info:
        ask(catalog, stats=[f"p{i}" for i in range(1, 10)])
    assert info.value.param == "stats" and "limit of 8" in str(info.value)


@pytest.mark.parametrize(("kw", "param", "fragment"), [
    ({"metric": "nope"}, "metric", "unknown metric 'nope'"),
    ({"stats": ["p99"], "metric": "requests"}, "stat", "has no value field, so it has no percentiles"),
    ({"step": "15s"}, "step", "multiple of the pane (10000 ms)"),
    ({"step": "0s"}, "step", "positive"),
    ({"step": "30s", "window": "15s"}, "window", "multiple of the pane"),
    ({"step": "1m", "window": "30s"}, "window", "at least the step"),
    ({"start": "now-30d", "step": "10s"}, "step", "259200 points per series exceed the limit of 11000"),
    ({"start": "now", "end": "now-1h"}, "to", "must be after"),
    ({"step": "ten seconds"}, "step", "step: "),
    ({"group_by": "planet"}, "group_by", "unknown dimension 'planet' in group_by"),
    ({"filters": {"planet": "mars"}}, "filter", "unknown dimension 'planet' in filter"),
    # Refused at ingest, so it matches nothing; PostgreSQL could not bind it (REST and websocket alike).
    ({"filters": {"endpoint": "/a\x00"}}, "filter", "filter endpoint='/a\\x00': contains a NUL character (U+0000)"),
    ({"metric": "new_users", "stats": ["first_seen"], "group_by": "region"}, "stat", "counted per stream"),
])
def test_each_refusal_names_its_parameter(catalog, kw, param, fragment):
    with pytest.raises(QueryError) as info:
        ask(catalog, **kw)
    assert info.value.param == param and fragment in str(info.value)
    assert info.value.not_found == (param == "metric")


def test_a_filter_value_is_what_follows_its_first_equals_sign_commas_and_spaces_included():
    # Labels may hold commas and spaces (a hunt: region "eu,west" could not be filtered over REST,
    # and "eu " matched "eu"); a comma starts the next filter only before a dimension's name and =.
    assert parse_filters("region=eu,west") == {"region": "eu,west"}
    assert parse_filters("region=eu ,method=GET") == {"region": "eu ", "method": "GET"}
    assert parse_filters(["region=eu, west", "status=500"]) == {"region": "eu, west", "status": "500"}
    assert parse_filters(["region=a=b"]) == {"region": "a=b"}
    with pytest.raises(QueryError, match="names 'region' twice"):  # was: the later one, the other dropped
        parse_filters(["region=eu", "region=us"])
    assert parse_filters(["region=eu", "region=eu"]) == {"region": "eu"}


def test_group_by_and_filters_as_the_api_writes_them(catalog):
    q = ask(catalog, group_by=["region, endpoint", "method"], filters=parse_filters(["status=500", "region=eu"]))
    assert q.group_by == ("region", "endpoint", "method")
    assert q.filters == (("region", "eu"), ("status", "500"))
    with pytest.raises(QueryError, match="must look like dimension=value"):
        parse_filters("region")


def test_the_target_alone_is_what_alert_rules_check(catalog):
    target = resolve_target(catalog, "new_users", ["first_seen"])
    assert target.stats == ("first_seen",) and target.group_by == () and target.filters == ()
    assert ask(catalog).shape_key() == ask(catalog).shape_key() != ask(catalog, stats=["avg"]).shape_key()
