"""Patterns defined through the API, checked against the configured catalog exactly as the
streams file's are (catalog/defined_patterns.py): the same reasons for the same mistakes, the
derived streams and metrics added, the configured catalog left as it was."""

from __future__ import annotations

import pytest
import yaml

from catalog.defined_patterns import PatternInvalid, catalog_with_patterns, check_pattern, definition_id
from catalog.loader import parse_catalog
from tests.unit.test_pattern_catalog import MISTAKES, STREAMS

CONFIGURED = parse_catalog(STREAMS)
BURSTS = {"name": "bursts", "key": "user_id", "within": "1m", "steps": [
    {"name": "fail", "stream": "logins", "where": {"outcome": "failure"}, "times": 3},
    {"name": "ok", "stream": "logins", "where": {"outcome": "success", "ip": {"same_as": "fail.ip"}}}],
    "measures": {"slowest": {"sum": "ok.latency_ms"}}}


@pytest.mark.parametrize("pattern, line, message", MISTAKES)
def test_each_mistake_gets_the_config_file_s_reason(pattern, line, message):
    declared = yaml.safe_load("patterns:\n" + pattern)["patterns"]
    *others, data = declared
    others = [check_pattern(CONFIGURED, [], o) for o in others]
    with pytest.raises(PatternInvalid) as caught:
        check_pattern(CONFIGURED, others, data)
    # The config file's reason, with its path inside the pattern rather than `patterns.0.`.
    assert message.removeprefix("patterns.0.") in str(caught.value)
    assert not str(caught.value).startswith("patterns.")


@pytest.mark.parametrize("data, reason", [
    ([1, 2], "the body must be a JSON object"),
    ({"key": "user_id", "steps": []}, "name: Field required"),
    ({**BURSTS, "colour": "red"}, "colour: Extra inputs are not permitted"),
    ({**BURSTS, "name": "x" * 60}, "too long for its derived stream"),
    ({**BURSTS, "within": "soon"}, "within:"),
])
def test_malformed_declarations_are_refused_with_the_field(data, reason):
    with pytest.raises(PatternInvalid, match=reason):
        check_pattern(CONFIGURED, [], data)


def test_stored_patterns_join_the_configured_catalog_with_their_streams_and_metrics():
    catalog, skipped = catalog_with_patterns(CONFIGURED, [BURSTS])
    assert skipped == [] and [p.name for p in catalog.patterns] == ["bursts"]
    assert "bursts_matches" in catalog.streams and "bursts_matches_slowest" in catalog.metrics
    assert "bursts_matches" not in CONFIGURED.streams and not CONFIGURED.patterns  # left as it was
    # A stored pattern the configuration no longer accepts is left out with its reason, not fatal.
    gone = {**BURSTS, "name": "gone", "steps": [{"name": "a", "stream": "removed"}]}
    catalog, skipped = catalog_with_patterns(CONFIGURED, [gone, BURSTS])
    assert [p.name for p in catalog.patterns] == ["bursts"]
    assert [(s.name, "unknown stream 'removed'" in s.reason) for s in skipped] == [("gone", True)]


def test_a_definition_id_changes_with_the_declaration_and_the_stored_version():
    pattern = check_pattern(CONFIGURED, [], BURSTS)
    again = check_pattern(CONFIGURED, [], {**BURSTS, "after_match": "skip_past_last"})  # the default, spelled out
    assert definition_id(pattern) == definition_id(again)
    assert definition_id(pattern, 3) != definition_id(pattern, 4) != definition_id(pattern)
    other = check_pattern(CONFIGURED, [], {**BURSTS, "within": "2m"})
    assert definition_id(other) != definition_id(pattern)
