"""Catalog declarations of first_seen, membership and sessions: validation and generated streams."""

from __future__ import annotations

import pytest

from catalog import Catalog, ConfigError, parse_catalog

BASE = """
streams:
  s:
    key_field: user_id
    dimensions: [page]
    values: [v]
"""


def test_declarations_parse_and_sessions_generate_a_stream_and_metrics():
    catalog = parse_catalog(BASE + """    first_seen: {field: user_id, capacity: 1000, fpp: 0.02, seed: 4}
    membership: {field: page, bucket: 1d}
    sessions: {key: user_id, gap: 30m}
metrics:
  new_users: {stream: s, first_seen: true}
""")
    s = catalog.stream("s")
    assert (s.first_seen.capacity, s.first_seen.fpp, s.first_seen.seed) == (1000, 0.02, 4)
    assert s.membership.bucket == 86_400_000 and s.membership.field == "page"
    derived = catalog.stream("s_sessions")
    assert derived.derived_from == "s" and derived.values == ("duration_ms", "events")
    assert derived.distinct_fields == ("user_id",) and derived.pane == s.pane
    assert derived.allowed_lateness == s.allowed_lateness + 1_800_000
    assert catalog.metric("s_session_duration").value == "duration_ms"
    assert catalog.metric("new_users").stats() == ("count", "rate", "first_seen")
    # A dumped catalog parses back to the same one (what the Spark source does with it).
    assert Catalog.model_validate_json(catalog.model_dump_json()) == catalog


@pytest.mark.parametrize("decl, message", [
    ("first_seen: {field: nope}", "line 4: streams.s: first_seen.field: field 'nope' must be a distinct field"),
    ("first_seen: {field: user_id, fpp: 0}", "first_seen.fpp"),
    ("first_seen: {field: user_id, capacity: 0}", "first_seen.capacity"),
    ("membership: {field: user_id, bucket: 7m}", "divide one day"),
    ("membership: {field: user_id, bucket: 10s}", "at least 1m"),
    ("sessions: {key: user_id, gap: 500ms}", "at least 1s"),
    ("sessions: {key: v}", "sessions.key: field 'v' must be a distinct field or a dimension"),
    ("sessions: {user: user_id}", "sessions.user"),
])
def test_bad_declarations_name_the_line_and_the_problem(decl, message):
    with pytest.raises(ConfigError, match=message):
        parse_catalog(BASE + "    " + decl + "\n")


def test_first_seen_metric_needs_the_stream_declaration_and_names_collide_clearly():
    with pytest.raises(ConfigError, match="declares no first_seen"):
        parse_catalog(BASE + "metrics:\n  m: {stream: s, first_seen: true}\n")
    with pytest.raises(ConfigError, match="already declared"):
        parse_catalog(BASE + "    sessions: {key: user_id}\n  s_sessions:\n    key_field: x\n")
    with pytest.raises(ConfigError, match="taken by the metrics generated"):
        parse_catalog(BASE + "    sessions: {key: user_id}\nmetrics:\n  s_sessions: {stream: s}\n")


def test_a_sessions_stream_keeps_its_streams_retention_and_tiers():
    """The generated `<stream>_sessions` had the default 7 days whatever its stream's: sessions
    of events the stream still accepts (30 days) were dropped, and a valid stream (lateness 7d)
    was refused with an error about values nobody wrote."""
    catalog = parse_catalog("streams:\n  web: {key_field: user, allowed_lateness: 7d, retention: 30d,"
                            " tiers: [{every: 1h, keep: 90d}], sessions: {key: user, gap: 1m}}\n")
    web, sessions = catalog.streams["web"], catalog.streams["web_sessions"]
    assert sessions.retention == web.retention == 30 * 86_400_000
    assert sessions.tiers == web.tiers


@pytest.mark.parametrize(("yaml", "where", "names"), [
    ("streams:\n  web: {key_field: user, allowed_lateness: 59m, retention: 1h, sessions: {key: user, gap: 30m}}\n",
     "streams.web.sessions", ["'web_sessions'", "retention (1h)", "89m"]),
    ("streams:\n  s: {key_field: k, retention: 1h, allowed_lateness: 30m}\n"
     "  c: {key_field: k, retention: 1h, allowed_lateness: 30m}\n"
     "joins:\n  - {name: sc, left: {stream: s, key: k}, right: {stream: c, key: k}, within: 40m}\n",
     "joins.0", ["'sc'", "retention (1h)", "70m"]),
    ("streams:\n  app: {key_field: d, retention: 50s, allowed_lateness: 10s, pane: 10s, sent_time_field: t}\n",
     "streams.app.sent_time_field", ["'app_clocks'", "retention (50s)", "1m"]),
], ids=["sessions", "join", "clocks"])
def test_a_generated_stream_that_breaks_a_rule_is_an_error_at_its_declaration(yaml, where, names):
    with pytest.raises(ConfigError) as err:
        parse_catalog(yaml)
    message = str(err.value)
    assert where in message and "top level" not in message, message
    assert all(n in message for n in names), message


def test_a_stream_name_too_long_for_its_session_metrics_is_refused_at_sessions():
    name = "s" * 47  # s*47_sessions fits; s*47_session_duration has 64 characters
    text = BASE.replace("  s:\n", f"  {name}:\n") + "    sessions: {key: user_id}\n"
    with pytest.raises(ConfigError) as info:
        parse_catalog(text, source="t.yaml")
    assert str(info.value) == (
        f"t.yaml: line {text.splitlines().index('    sessions: {key: user_id}') + 1}: streams.{name}.sessions: stream name {name!r} is too long for its derived stream and"
        f" metric names: '{name}_session_duration' has 64 characters, at most 63 (shorten the name to at most 46)")
    assert f"{'s' * 46}_session_duration" in parse_catalog(text.replace(name, "s" * 46)).metrics
