"""The text checks of the Kafka source's JVM fast path (ingest/kafka_fast_path.py), without a JVM:
the patterns are plain regular expressions that Java reads as Python does. What Spark does with
them is in tests/spark/test_validation_fast_path.py."""

from __future__ import annotations

import re

import pytest

from catalog import load_catalog
from ingest.json_limits import JsonLimits
from ingest.kafka_fast_path import FLAT_OBJECT, has_fast_path, json_schema, near_limit_pattern, token_pattern
from tests.conftest import DEMO_CONFIG


@pytest.mark.parametrize("text, flat", [
    ('{"time": 1, "user_id": "u"}', True),
    (' \n{"time": 1, "tags": [1, [2]]}\r\n', True),
    ('{}', True),
    ('{"time": 1} trailing', False),  # Jackson stops at the brace, Python refuses the rest
    ('{"time": 1}}', False),
    ('{"a": {"b": 1}}', False),  # objects nest: depth is Python's to count
    ('{"a": "\\u00fc"}', False),  # an escape
    ('[{"time": 1}]', False),
    ('\ufeff{"time": 1}', False),  # a byte-order mark
    ('{"time": 1}\x0c', False),  # not JSON whitespace
])
def test_only_a_flat_object_without_escapes_or_trailing_text_matches(text, flat):
    assert bool(re.search(FLAT_OBJECT, text)) is flat


def test_numbers_near_a_limit_are_found_anywhere_in_the_text():
    near = re.compile(near_limit_pattern(JsonLimits()))
    assert not near.search('{"time": 1794999600000, "x": 0.30000000000000004, "y": -1.5e-99}')
    for text in ('{"x": 123456789012345678}', '{"x": 1e400}', '{"x": 1E+308}', '{"x": 0.0000000000000000001}'):
        assert near.search(text), text
    # Tight limits tighten the digit run: an integer of max_int_digits digits is near the limit.
    assert re.search(near_limit_pattern(JsonLimits(max_int_digits=5)), '{"x": 12345}')
    assert not re.search(near_limit_pattern(JsonLimits(max_int_digits=5)), '{"x": 1234}')


def test_the_token_pattern_finds_the_first_character_of_a_keys_value():
    text = '{"country" : "DE", "status":200, "ok":\ttrue, "note": "country: x"}'
    assert re.search(token_pattern("country"), text).group(1) == '"'
    assert re.search(token_pattern("status"), text).group(1) == "2"
    assert re.search(token_pattern("ok"), text).group(1) == "t"
    assert re.search(token_pattern("missing"), text) is None


def test_schema_and_limits():
    catalog = load_catalog(DEMO_CONFIG)
    assert json_schema(catalog.stream("orders")) == (
        "`time` bigint, `country` string, `payment_method` string, `customer_id` string, `amount` double,"
        " `items` double, `corrupt-record` string")
    assert has_fast_path(JsonLimits())
    assert not has_fast_path(JsonLimits(max_depth=0))
