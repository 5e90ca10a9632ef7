"""catalog: durations, the stream/metric model, and the YAML loader's line-numbered errors."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import (
    MAX_DURATION_MS,
    Catalog,
    ConfigError,
    MetricDef,
    StreamDef,
    format_duration_ms,
    load_catalog,
    parse_catalog,
    parse_duration_ms,
)

CONFIG = Path(__file__).resolve().parents[2] / "config" / "streams.yaml"


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line number of the n-th line containing needle."""
    seen = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            seen += 1
            if seen == occurrence:
                return number
    raise AssertionError(f"{needle!r} not in text")


def error_line(message: str) -> int:
    match = re.search(r"line (\d+)", message)
    assert match, f"no line number in {message!r}"
    return int(match.group(1))


def config_error(text: str, source: str = "streams.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_catalog(text, source=source)
    message = str(info.value)
    assert message.startswith(f"{source}:"), message
    return message


# -- the shipped configuration ----------------------------------------------------------


def test_shipped_config_loads() -> None:
    catalog = load_catalog(CONFIG)
    assert set(catalog.streams) == {"http_requests", "orders", "mobile_app", "searches", "clicks",
                                    # the changelog tables http_requests is enriched from, and their view:
                                    "users", "plans", "user_plans",
                                    # and the generated session streams:
                                    "http_requests_sessions", "mobile_app_sessions",
                                    # and the derived stream of the window join `search_clicks`:
                                    "search_clicks",
                                    # the logins and checkouts the patterns read, and their matches:
                                    "logins", "checkouts", "credential_stuffing_matches",
                                    "checkout_abandoned_matches",
                                    # the device clock estimates of mobile_app (sent_time_field):
                                    "mobile_app_clocks"}
    http = catalog.stream("http_requests")
    assert http.name == "http_requests"
    assert http.time_field == "time"
    assert http.key_field == "user_id"
    # with plan and country looked up in the users table and tier in plans, through the view (enrich):
    assert http.dimensions == ("endpoint", "method", "status", "region", "plan", "country", "tier")
    assert [(e.table, e.by, e.columns) for e in http.enrich] == [("user_plans", "user_id", ("plan", "country", "tier"))]
    view = catalog.views["user_plans"]
    assert (view.left, view.right, view.foreign_key, view.kind) == ("users", "plans", "plan", "left")
    assert catalog.stream("users").kind == "table" and catalog.stream("users").dimensions == ("op", "plan", "country")
    assert http.values == ("latency_ms", "response_bytes")
    assert http.distinct_fields == ("user_id",)
    assert http.pane == 10_000
    assert http.allowed_lateness == 30_000
    assert http.partitions == 4
    assert http.string_fields == ("endpoint", "method", "status", "region", "plan", "country", "tier", "user_id")
    orders = catalog.stream("orders")
    assert orders.allowed_lateness == 60_000
    assert orders.partitions == 2
    assert set(catalog.metrics) == {"requests", "latency", "response_size", "orders", "order_amount", "order_items",
                                    "new_users", "screen_views", "screen_time",
                                    "searches", "search_results", "clicks", "click_position"} | {
        f"{s}_{m}" for s in ("http_requests", "mobile_app") for m in ("sessions", "session_duration", "session_events")} | {
        f"search_clicks_{v}" for v in ("searches", "pairs", "clicked", "latency", "unmatched_right")} | {
        "logins", "checkouts", "credential_stuffing_matches", "credential_stuffing_matches_attempts",
        "checkout_abandoned_matches", "checkout_abandoned_matches_amount"} | {
        "mobile_app_clock_offset", "mobile_app_clock_devices"}
    # The demo's two patterns, each over one stream, keyed by a field the pipeline carries.
    assert [(p.name, p.streams, p.key) for p in catalog.patterns] == [
        ("credential_stuffing", ("logins",), "user_id"), ("checkout_abandoned", ("checkouts",), "checkout_id")]
    assert {"user_id", "ip"} <= set(catalog.stream("logins").source_ids)
    mobile = catalog.stream("mobile_app")
    assert (mobile.sent_time_field, mobile.device_key_field) == ("sent_at", "device_id")
    # The two sides of a window join on search_id: keyed alike, with as many partitions.
    searches, clicks = catalog.stream("searches"), catalog.stream("clicks")
    assert searches.key_field == clicks.key_field == "search_id"
    assert searches.partitions == clicks.partitions
    assert searches.dimensions == ("query_category", "platform") and searches.values == ("results",)
    assert clicks.dimensions == ("position_bucket", "platform") and clicks.values == ("position",)
    (join,) = catalog.joins
    assert (join.name, join.left.stream, join.right.stream, join.within) == ("search_clicks", "searches", "clicks", 30 * 60_000)
    assert catalog.stream("search_clicks").dimensions == searches.dimensions
    assert catalog.metrics["search_clicks_clicked"].ratio_of == "searches"
    for metric in catalog.metrics.values():
        assert metric.stream in catalog.streams
    assert catalog.metric("latency").value == "latency_ms"
    assert catalog.metric("requests").distinct == "user_id"


def test_unknown_stream_and_metric_lookups_name_the_choices() -> None:
    catalog = load_catalog(CONFIG)
    with pytest.raises(KeyError, match="nope.*checkouts, clicks, credential_stuffing_matches, http_requests, http_requests_sessions, logins, mobile_app, mobile_app_clocks, mobile_app_sessions, orders, plans, search_clicks, searches, user_plans, users"):
        catalog.stream("nope")
    with pytest.raises(KeyError, match="unknown metric 'nope'"):
        catalog.metric("nope")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read stream configuration"):
        load_catalog(tmp_path / "absent.yaml")


def test_load_catalog_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("streams:\n  s:\n    pane: 7s\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_catalog(path)
    assert str(info.value).startswith(f"{path}:")


# -- durations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("10s", 10_000),
        ("1.5m", 90_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1w", 604_800_000),
        (" 10 s ", 10_000),
        ("0s", 0),
        (10, 10_000),  # a bare number means seconds
        (1.5, 1_500),
        (0, 0),
    ],
)
def test_parse_duration(text: str | int | float, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "abc", "10", "10 sec", "-5s", "5 minutes", "1e3s", "s", "10S"])
def test_bad_duration_names_the_value(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_ms(text)
    assert repr(text) in str(info.value)
    assert "ms, s, m, h, d or w" in str(info.value)


@pytest.mark.parametrize("value", [True, False, -1, -0.5])
def test_bad_numeric_duration_names_the_value(value: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_ms(value)  # type: ignore[arg-type]
    assert repr(value) in str(info.value)


def test_infinite_duration_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="inf"):
        parse_duration_ms(float("inf"))


def test_nan_duration_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="(?i)nan"):
        parse_duration_ms(float("nan"))


@pytest.mark.parametrize("value", [
    "99999999999999999999d",   # finite as a float, but past any 64-bit millisecond count
    "9" * 400 + "s",           # float() of 400 digits is inf: was an OverflowError
    "36501d",
    "5218w",
    1e308,                     # 1e308 * 1000 is inf
    10**30,
    MAX_DURATION_MS // 1000 + 1,
])
def test_duration_over_the_maximum_is_a_value_error_naming_the_bound(value) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_ms(value)
    assert "exceeds the maximum of 36500d (100 years)" in str(info.value)
    assert len(str(info.value)) < 120  # a 400-digit value is cut short, not echoed


def test_the_maximum_duration_itself_is_accepted() -> None:
    assert parse_duration_ms("36500d") == MAX_DURATION_MS == parse_duration_ms(MAX_DURATION_MS // 1000)


def test_duration_digits_are_ascii_only() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ms("\u0663s")  # ARABIC-INDIC DIGIT THREE


def test_infinite_duration_in_yaml_is_a_config_error() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    pane: .inf\n")
    message = config_error(text)
    assert error_line(message) == line_of(text, "pane:")


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (500, "500ms"),
        (1_500, "1500ms"),
        (10_000, "10s"),
        (90_000, "90s"),
        (600_000, "10m"),
        (7_200_000, "2h"),
        (86_400_000, "1d"),
        (604_800_000, "1w"),
        (1_209_600_000, "2w"),
        (0, "0ms"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=MAX_DURATION_MS))
def test_format_then_parse_round_trips(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


# -- config errors name the line and the problem ----------------------------------------

GOOD = """\
streams:
  s:
    key_field: k
    dimensions: [a]
    values: [v]
metrics:
  m:
    stream: s
    value: v
"""


def test_minimal_config_is_good() -> None:
    catalog = parse_catalog(GOOD)
    assert catalog.stream("s").distinct_fields == ("k",)
    assert catalog.stream("s").pane == 10_000  # defaults
    assert catalog.stream("s").allowed_lateness == 30_000
    assert catalog.stream("s").partitions == 4
    assert catalog.metric("m").stream == "s"


def test_invalid_yaml() -> None:
    text = "streams:\n  s:\n    values: [v\n    pane: 10s\n"
    message = config_error(text)
    assert "invalid YAML" in message
    assert error_line(message) >= 3  # the unclosed list or where the parser gave up


def test_invalid_yaml_tab_names_its_line() -> None:
    text = "streams:\n  s:\n    values: [v]\n\tpane: 10s\n"
    message = config_error(text)
    assert "invalid YAML" in message
    assert error_line(message) == 4


def test_unknown_key_in_a_stream() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    colour: red\n")
    message = config_error(text)
    assert error_line(message) == line_of(text, "colour:")
    assert "streams.s.colour" in message
    assert "Extra inputs are not permitted" in message


def test_unknown_key_in_a_metric() -> None:
    text = GOOD + "    units: ms\n"
    message = config_error(text)
    assert error_line(message) == line_of(text, "units:")
    assert "metrics.m.units" in message


def test_bad_duration_names_line_and_value() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    allowed_lateness: 10 sec\n")
    message = config_error(text)
    assert error_line(message) == line_of(text, "allowed_lateness:")
    assert "streams.s.allowed_lateness" in message
    assert "'10 sec'" in message


def test_a_zero_partition_idle_timeout_is_refused_naming_the_stream_and_field() -> None:
    """0 would leave every partition with unread records out of the watermark at once (idle), so
    panes turned final while a partition still held their events: the per-partition hold silently off."""
    for value, shown in (("0s", "0ms"), ("0", "0ms"), ("500ms", "500ms")):
        text = GOOD.replace("    values: [v]\n", f"    values: [v]\n    partition_idle_timeout: {value}\n")
        message = config_error(text)
        assert error_line(message) == line_of(text, "partition_idle_timeout:")
        assert f"streams.s.partition_idle_timeout: must be at least 1s, not {shown}" in message
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    partition_idle_timeout: 1s\n")
    assert parse_catalog(text).stream("s").partition_idle_timeout == 1_000
    # Refused by the configuration, not in a stream declaration stored before (the configured
    # catalog's own timeout replaces it, catalog/versions.py with_layout): a store keeps opening.
    from catalog.versions import stored_stream

    assert stored_stream({"name": "s", "partition_idle_timeout": "0s"}).partition_idle_timeout == 0


def test_negative_duration() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    pane: -10\n")
    message = config_error(text)
    assert error_line(message) == line_of(text, "pane:")
    assert "negative" in message


def test_bare_number_duration_in_yaml_is_seconds() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    pane: 60\n    allowed_lateness: 2.5\n")
    stream = parse_catalog(text).stream("s")
    assert stream.pane == 60_000
    assert stream.allowed_lateness == 2_500


@pytest.mark.parametrize("pane", ["7s", "500ms", "11s", "7m"])
def test_pane_not_dividing_a_day(pane: str) -> None:
    text = GOOD.replace("    values: [v]\n", f"    values: [v]\n    pane: {pane}\n")
    message = config_error(text)
    # A whole-stream check: the line is within the stream's block (its header up to the pane key).
    assert line_of(text, "  s:") <= error_line(message) <= line_of(text, "pane:")
    assert "streams.s" in message
    assert "pane must be at least 1s and divide one day evenly" in message


@pytest.mark.parametrize("pane", ["1s", "10s", "1m", "5m", "1h", "1d"])
def test_panes_that_divide_a_day(pane: str) -> None:
    text = GOOD.replace("    values: [v]\n", f"    values: [v]\n    pane: {pane}\n")
    assert parse_catalog(text).stream("s").pane == parse_duration_ms(pane)


def test_duplicate_field_across_roles() -> None:
    text = GOOD.replace("    dimensions: [a]\n", "    dimensions: [a, v]\n")
    message = config_error(text)
    assert line_of(text, "  s:") <= error_line(message) <= line_of(text, "values:")
    assert "field 'v' is declared twice (in dimensions and values)" in message


def test_time_field_reused_as_a_value() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v, time]\n")
    message = config_error(text)
    assert "field 'time' is declared twice" in message


def test_distinct_field_that_is_a_value() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    distinct: [v]\n")
    message = config_error(text)
    assert "distinct field 'v' is also a values field" in message


def test_metric_referencing_unknown_stream() -> None:
    text = GOOD + "  other:\n    description: points nowhere\n    stream: nope\n"
    message = config_error(text)
    assert error_line(message) == line_of(text, "stream: nope")
    assert "metrics.other.stream" in message
    assert "unknown stream 'nope'" in message


def test_metric_value_field_not_declared() -> None:
    text = GOOD + "  other:\n    stream: s\n    unit: ms\n    value: w\n"
    message = config_error(text)
    assert error_line(message) == line_of(text, "value: w")
    assert "metrics.other.value" in message
    assert "'w' is not a value field of stream 's' (values: v)" in message


def test_metric_distinct_field_not_declared() -> None:
    text = GOOD + "  other:\n    stream: s\n    distinct: z\n"
    message = config_error(text)
    assert error_line(message) == line_of(text, "distinct: z")
    assert "'z' is not a distinct field of stream 's' (distinct: k)" in message


def test_duplicate_yaml_key() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    values: [w]\n")
    message = config_error(text)
    assert error_line(message) == line_of(text, "values: [w]")
    assert "duplicate key 'values'" in message


def test_duplicate_stream_name() -> None:
    text = GOOD.replace("metrics:\n", "  s:\n    values: [x]\nmetrics:\n")
    message = config_error(text)
    assert error_line(message) == line_of(text, "  s:", occurrence=2)
    assert "duplicate key 's'" in message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file(text: str) -> None:
    message = config_error(text)
    assert "empty" in message
    assert "streams" in message


def test_top_level_must_be_a_mapping() -> None:
    message = config_error("- a\n- b\n")
    assert error_line(message) == 1
    assert "mapping" in message


def test_no_streams() -> None:
    message = config_error("streams: {}\n")
    assert "at least one stream" in message


def test_bad_field_name() -> None:
    text = GOOD.replace("dimensions: [a]", "dimensions: [a, 'has space']")
    message = config_error(text)
    assert error_line(message) == line_of(text, "dimensions:")
    assert "streams.s.dimensions.1" in message


@pytest.mark.parametrize(("extra", "where"), [
    ("    partitions: true\n", "streams.s.partitions"),
    ("    first_seen: {field: k, capacity: true}\n", "streams.s.first_seen.capacity"),
    ("    membership: {field: k, seed: false}\n", "streams.s.membership.seed"),
])
def test_a_boolean_is_no_whole_number(extra: str, where: str) -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n" + extra)
    message = config_error(text)
    value = "true" if "true" in extra else "false"
    assert message == f"streams.yaml: line {line_of(text, extra.strip())}: {where}: expected a whole number, not a boolean ({value})"


@pytest.mark.parametrize(("written", "message"), [
    ("010", "010 is read as the number 8 (YAML 1.1 octal): write 8, or quote it ('010') if it is text"),
    ("1:04", "1:04 is read as the number 64 (YAML 1.1 base 60): write 64, or quote it ('1:04') if it is text"),
])
def test_an_integer_not_written_in_decimal_is_refused(written: str, message: str) -> None:
    text = GOOD.replace("    values: [v]\n", f"    values: [v]\n    partitions: {written}\n")
    assert config_error(text) == f"streams.yaml: line {line_of(text, 'partitions:')}: {message}"


@pytest.mark.parametrize("written", ["8", "+8", "0"])
def test_decimal_integers_are_read_as_written(written: str) -> None:
    text = GOOD.replace("    values: [v]\n", f"    values: [v]\n    first_seen: {{field: k, seed: {written}}}\n")
    assert parse_catalog(text).stream("s").first_seen.seed == int(written)


def test_every_problem_is_reported() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    colour: red\n    partitions: 0\n")
    message = config_error(text)
    lines = message.splitlines()
    assert len(lines) == 2
    assert {error_line(line) for line in lines} == {line_of(text, "colour:"), line_of(text, "partitions:")}


# -- JSON round trip --------------------------------------------------------------------


def test_catalog_json_round_trip() -> None:
    catalog = load_catalog(CONFIG)
    dumped = catalog.model_dump_json()
    assert '"pane":"10s"' in dumped  # durations are written as text
    again = Catalog.model_validate_json(dumped)
    assert again == catalog
    assert again.model_dump_json() == dumped


def test_catalog_json_round_trip_odd_durations() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    pane: 1.5m\n    allowed_lateness: 1500ms\n")
    catalog = parse_catalog(text)
    again = Catalog.model_validate_json(catalog.model_dump_json())
    assert again == catalog
    assert again.stream("s").pane == 90_000
    assert again.stream("s").allowed_lateness == 1_500


# -- stats ------------------------------------------------------------------------------

FULL = MetricDef(name="m", stream="s", value="v", distinct="k")
COUNT_ONLY = MetricDef(name="c", stream="s")


@pytest.mark.parametrize(
    ("stat", "expected"),
    [
        ("count", None),
        ("rate", None),
        ("sum", None),
        ("avg", None),
        ("min", None),
        ("max", None),
        ("distinct", None),
        ("p50", 0.5),
        ("p99", 0.99),
        ("p0", 0.0),
        ("p100", 1.0),
    ],
)
def test_check_stat(stat: str, expected: float | None) -> None:
    assert FULL.check_stat(stat) == expected


def test_check_stat_p99_9() -> None:
    assert FULL.check_stat("p99.9") == pytest.approx(0.999)


@pytest.mark.parametrize("stat", ["count", "rate"])
def test_count_stats_need_nothing(stat: str) -> None:
    assert COUNT_ONLY.check_stat(stat) is None


@pytest.mark.parametrize("stat", ["p50", "p99", "p99.9"])
def test_percentile_without_value(stat: str) -> None:
    with pytest.raises(ValueError, match="has no value field, so it has no percentiles"):
        COUNT_ONLY.check_stat(stat)


@pytest.mark.parametrize("stat", ["sum", "avg", "min", "max"])
def test_value_stat_without_value(stat: str) -> None:
    with pytest.raises(ValueError, match=f"has no value field, so it has no {stat}"):
        COUNT_ONLY.check_stat(stat)


def test_distinct_without_distinct_field() -> None:
    with pytest.raises(ValueError, match="declares no distinct field"):
        MetricDef(name="m", stream="s", value="v").check_stat("distinct")


@pytest.mark.parametrize("stat", ["median", "p", "p999", "p-1", "P50", "p50.", "COUNT", ""])
def test_unknown_stat_lists_the_answers(stat: str) -> None:
    with pytest.raises(ValueError) as info:
        FULL.check_stat(stat)
    message = str(info.value)
    assert f"unknown stat {stat!r}" in message
    assert "count, rate, sum, avg, min, max, pNN, distinct" in message


def test_stats_listing() -> None:
    assert COUNT_ONLY.stats() == ("count", "rate")
    assert FULL.stats() == ("count", "rate", "sum", "avg", "min", "max", "pNN", "distinct")


def test_stream_def_defaults_distinct_to_key() -> None:
    assert StreamDef(name="s", key_field="k").distinct_fields == ("k",)
    assert StreamDef(name="s").distinct_fields == ()
    assert StreamDef(name="s", key_field="k", distinct=()).distinct_fields == ()


def test_yaml_merge_key() -> None:
    text = "streams:\n  s: &base\n    values: [v]\n    pane: 1m\n  t:\n    <<: *base\n    partitions: 2\n"
    try:
        catalog = parse_catalog(text, source="streams.yaml")
    except ConfigError as exc:  # refusing merge keys with a located message would be acceptable too
        assert error_line(str(exc)) == line_of(text, "<<:")
        return
    assert catalog.stream("t").pane == 60_000
    assert catalog.stream("t").values == ("v",)
    assert catalog.stream("t").partitions == 2


def test_yaml_alias_is_resolved() -> None:
    text = "streams:\n  s: &base\n    values: [v]\n  t: *base\n"
    catalog = parse_catalog(text)
    assert catalog.stream("t").values == ("v",)
    assert catalog.stream("t").name == "t"


# -- values the YAML spells without one, and aliases ------------------------------------


def test_empty_value_is_null_as_a_tilde_is() -> None:
    # `distinct:` with nothing after it is null, as `distinct: ~`: the default (the key field).
    empty = parse_catalog("streams:\n  s:\n    key_field: k\n    distinct:\n")
    tilde = parse_catalog("streams:\n  s:\n    key_field: k\n    distinct: ~\n")
    assert empty.stream("s").distinct_fields == tilde.stream("s").distinct_fields == ("k",)


def test_empty_value_where_null_is_refused_names_its_line() -> None:
    text = "streams:\n  s:\n    key_field: k\n    description:\nmetrics:\n"
    message = config_error(text)
    assert f"line {line_of(text, 'description:')}: streams.s.description: Input should be a valid string" in message
    assert f"line {line_of(text, 'metrics:')}: metrics: Input should be a valid dictionary" in message


def test_aliases_are_not_expanded_per_use() -> None:
    # 10 ** 6 leaves from a few hundred bytes, were each alias built again where it is used.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 6)]
    text = "streams:\n  s:\n    key_field: k\n    description:\n      " + "\n      ".join(lines) + "\n"
    started = time.monotonic()
    message = config_error(text)
    assert time.monotonic() - started < 5
    assert f"line {line_of(text, 'a0:')}: streams.s.description: Input should be a valid string" in message


# -- YAML the catalog cannot use: a ConfigError naming the line, never a traceback ------


@pytest.mark.parametrize(("text", "needle", "reason"), [
    ("streams:\n  s:\n    key_field: k\n    description: !secret foo\n", "!secret",
     "the tag '!secret' is not supported (quote the value if it is text)"),
    ("streams:\n  s:\n    description: !!python/name:os.system\n", "!!python",
     "the tag 'tag:yaml.org,2002:python/name:os.system' is not supported"),
    ("streams:\n  s:\n    description: !!int abc\n", "!!int", "'abc' is not a valid int"),
    ("streams:\n  s: &a\n    key_field: k\n    tiers: [*a]\n", "&a",
     "an alias refers to a node that contains it (a recursive anchor)"),
    ("streams:\n  ? [a, b]\n  : {key_field: k}\n", "[a, b]",
     "a key must be a plain value such as a name, not a list"),
    ("streams:\n  s: {key_field: k}\n  {a: 1}: x\n", "{a: 1}",
     "a key must be a plain value such as a name, not a mapping"),
])
def test_yaml_the_catalog_cannot_use_is_a_located_config_error(text: str, needle: str, reason: str) -> None:
    message = config_error(text)
    assert error_line(message) == line_of(text, needle)
    assert reason in message
    assert len(message.splitlines()) == 1


def test_a_plain_equals_sign_is_text() -> None:
    text = GOOD.replace("    values: [v]\n", "    values: [v]\n    description: =\n")
    assert parse_catalog(text).stream("s").description == "="


def test_yaml_nested_too_deeply_is_a_config_error() -> None:
    message = config_error("streams: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested too deeply" in message


def test_a_file_not_in_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("streams:\n  s:\n    key_field: k\n    description: café\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_catalog(path)
    assert str(info.value) == (f"{path}: line 4: not UTF-8 text: byte 0xe9 cannot be decoded"
                               " (save the file as UTF-8)")


# -- merge keys as the YAML merge-key spec has them -------------------------------------


def test_merge_key_then_an_explicit_override() -> None:
    text = "streams:\n  s: &base\n    key_field: k\n    pane: 10s\n    partitions: 2\n  t:\n    <<: *base\n    pane: 5s\n"
    catalog = parse_catalog(text)
    assert catalog.stream("t").pane == 5_000  # the key written in the mapping wins
    assert (catalog.stream("t").partitions, catalog.stream("t").key_field) == (2, "k")
    assert catalog.stream("s").pane == 10_000


def test_a_list_of_merges_sharing_a_key_the_earlier_wins() -> None:
    text = ("streams:\n  a: &a {key_field: k, pane: 10s}\n  b: &b {key_field: j, pane: 5s, partitions: 3}\n"
            "  s:\n    <<: [*a, *b]\n")
    stream = parse_catalog(text).stream("s")
    assert (stream.pane, stream.key_field, stream.partitions) == (10_000, "k", 3)


def test_a_duplicate_explicit_key_beside_a_merge_is_still_refused() -> None:
    text = "streams:\n  s: &base\n    key_field: k\n  t:\n    <<: *base\n    pane: 5s\n    pane: 1s\n"
    message = config_error(text)
    assert error_line(message) == line_of(text, "pane: 1s")
    assert "duplicate key 'pane'" in message


@pytest.mark.parametrize(("merge", "reason"), [
    ("<<: 5", "a merge key (<<) takes a mapping or a list of mappings"),
    ("<<: [{pane: 5s}, 3]", "a merge key (<<) takes a mapping or a list of mappings"),
])
def test_a_merge_of_something_else_than_mappings_is_refused(merge: str, reason: str) -> None:
    text = f"streams:\n  s:\n    key_field: k\n    {merge}\n"
    message = config_error(text)
    assert error_line(message) == line_of(text, "<<:")
    assert reason in message


def test_an_error_in_a_merged_key_names_the_line_it_was_written_on() -> None:
    text = "streams:\n  s: &base\n    key_field: k\n    colour: red\n  t:\n    <<: *base\n"
    message = config_error(text)
    assert message.count(f"line {line_of(text, 'colour:')}:") == 2  # s's own, and t's merged copy


# -- a name is its key -------------------------------------------------------------------


@pytest.mark.parametrize(("text", "needle", "reason"), [
    ("streams:\n  orders: {key_field: customer_id}\n  refunds: {name: orders, key_field: customer_id, partitions: 8}\n",
     "refunds:", "streams.refunds.name: the name 'orders' differs from its key 'refunds'"),
    (GOOD + "  other:\n    name: m2\n    stream: s\n", "name: m2", "metrics.other.name: the name 'm2' differs from its key 'other'"),
])
def test_a_name_that_differs_from_its_key_is_refused(text: str, needle: str, reason: str) -> None:
    message = config_error(text)
    assert message == f"streams.yaml: line {line_of(text, needle)}: {reason}"


def test_a_name_equal_to_its_key_is_accepted() -> None:
    catalog = parse_catalog(GOOD.replace("  m:\n", "  m:\n    name: m\n").replace("  s:\n", "  s:\n    name: s\n", 1))
    assert catalog.stream("s").name == "s" and catalog.metric("m").name == "m"


def test_a_model_under_another_key_is_refused() -> None:
    with pytest.raises(ValueError, match="the name 'b' differs from its key 'a'"):
        Catalog(streams={"a": StreamDef(name="b")})
