"""The `joins:` declaration (catalog/joins.py): the derived stream and metrics it generates, and
errors that name the line and the problem."""

from __future__ import annotations

import pytest
import yaml

from catalog import parse_catalog
from catalog.loader import ConfigError

STREAMS = """
streams:
  searches: {key_field: search_id, dimensions: [query_category, platform], allowed_lateness: 1m}
  clicks: {key_field: search_id, dimensions: [position], allowed_lateness: 2m}
"""
JOIN = """
joins:
  - name: search_clicks
    left: {stream: searches, key: search_id}
    right: {stream: clicks, key: search_id}
    within: 30m
"""


def test_a_join_generates_its_derived_stream_and_metrics_and_survives_a_round_trip():
    catalog = parse_catalog(STREAMS + JOIN)
    derived = catalog.streams["search_clicks"]
    assert derived.dimensions == ("query_category", "platform")
    assert derived.values == ("searches", "pairs", "clicked", "latency_ms", "unmatched_right")
    assert derived.derived_from == "searches"
    assert derived.allowed_lateness == 2 * 60_000 + 30 * 60_000  # the later side's lateness + within
    assert catalog.joins[0].late_horizon == 3_600_000
    assert catalog.metric("search_clicks_clicked").ratio_of == "searches"
    assert "ratio" in catalog.metric("search_clicks_clicked").stats()
    assert catalog.metric("search_clicks_latency").unit == "ms"
    assert parse_catalog(yaml.safe_dump(catalog.model_dump(mode="json"))) == catalog


@pytest.mark.parametrize("join, message", [
    (JOIN.replace("stream: clicks", "stream: nope"), "line 9: joins.0.right.stream: unknown stream 'nope'"),
    (JOIN.replace("key: search_id}\n    within", "key: session}\n    within"),
     "joins.0.right.key: field 'session' must be the key_field, a dimension or a distinct field of stream 'clicks'"),
    (JOIN.replace("stream: clicks", "stream: searches"), "two different streams"),
    (JOIN.replace("30m", "10ms"), "within must be at least 1s"),
    (JOIN + JOIN.replace("joins:\n", ""), "join 'search_clicks' is declared twice"),
    (JOIN.replace("name: search_clicks", "name: clicks"), "the derived stream name 'clicks' is already declared"),
])
def test_bad_join_declarations_say_what_is_wrong(join, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_catalog(STREAMS + join)


def test_ratio_of_must_name_another_value_field():
    config = STREAMS + "metrics:\n  bad: {stream: clicks, value: nope, ratio_of: x}\n"
    with pytest.raises(ConfigError, match="is not a value field|ratio_of"):
        parse_catalog(config.replace("value: nope, ", ""))


def test_a_key_that_is_neither_dimension_nor_distinct_is_carried_by_the_source_for_the_join():
    streams = STREAMS.replace("allowed_lateness: 1m}", "allowed_lateness: 1m, distinct: [user_id]}")
    catalog = parse_catalog(streams + JOIN)
    searches = catalog.streams["searches"]
    assert searches.distinct_fields == ("user_id",)
    assert searches.source_ids == ("user_id", "search_id") and searches.join_keys == ("search_id",)
    assert catalog.streams["clicks"].source_ids == ("search_id",)  # the key is its distinct field already
    assert "join_keys" not in catalog.model_dump()["streams"]["searches"]  # never written out
    assert parse_catalog(yaml.safe_dump(catalog.model_dump(mode="json"))) == catalog
    assert parse_catalog(streams).streams["searches"].source_ids == ("user_id",)  # no join: nothing more


def test_a_join_name_too_long_for_its_generated_metrics_is_refused_at_the_join():
    name = "j" * 48  # the stream j*48 fits; j*48_unmatched_right has 64 characters
    text = STREAMS + JOIN.replace("search_clicks", name)
    with pytest.raises(ConfigError) as info:
        parse_catalog(text, source="t.yaml")
    line = text.splitlines().index(f"  - name: {name}") + 1
    assert str(info.value) == (
        f"t.yaml: line {line}: joins.0.name: join name {name!r} is too long for its derived stream and metric"
        f" names: '{name}_unmatched_right' has 64 characters, at most 63 (shorten the name to at most 47)")
    assert f"{'j' * 47}_unmatched_right" in parse_catalog(STREAMS + JOIN.replace("search_clicks", "j" * 47)).metrics
