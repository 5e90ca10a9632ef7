"""Each kind of rule read through a fake `AlertData` at a fixed time: which window is read
(final by default, provisional on request, the day/week offsets), the values and
conditions, and when the answer is NoData or Error instead."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alerts.kinds import evaluate_rule
from alerts.outcome import Outcome, StreamLagView, WindowValue
from alerts.rules import RuleError, parse_rule

NOW = 1_800_000_000_000  # a multiple of a minute
PANE, LATENESS = 10_000, 30_000  # http_requests in the demo config
DAY, WEEK = 86_400_000, 7 * 86_400_000


class FakeData:
    """Answers from tables keyed by window; records every window asked for."""

    def __init__(self, watermark=NOW - LATENESS, windows=None, seen=None, lag=None, dead=None, fail=None):
        self.wm = watermark
        self.windows = windows or {}  # (start, end) -> list[WindowValue]
        self.seen = seen or {}
        self.lag_views = lag
        self.dead = dead or {}
        self.fail = fail
        self.asked: list[tuple[int, int]] = []

    def watermark(self, stream):
        if self.fail:
            raise self.fail
        return self.wm

    def window_values(self, metric, stat, start_ms, end_ms, group_by, filters, *, now_ms):
        self.asked.append((start_ms, end_ms))
        return self.windows.get((start_ms, end_ms), [])

    def last_seen(self, stream, start_ms, end_ms, group_by, filters):
        return self.seen

    def lag(self):
        return self.lag_views

    def dead_letter_counts(self, start_ms, end_ms):
        self.asked.append((start_ms, end_ms))
        return self.dead


def wv(value, group=None):
    return WindowValue(group or {}, value, 1)


def rule(catalog, **fields):
    return parse_rule({"name": "r", **fields}, catalog)


def threshold(catalog, **fields):
    return rule(catalog, kind="threshold", metric="latency", stat="p99", window="1m", threshold=250, **fields)


# -- threshold ---------------------------------------------------------------------------------------

def test_threshold_reads_the_newest_final_window(catalog):
    final_end = NOW - LATENESS  # the watermark sits on a pane boundary here
    data = FakeData(windows={(final_end - 60_000, final_end): [wv(300.0)]})
    outcome = evaluate_rule(threshold(catalog), data, catalog, NOW)
    [sample] = outcome.samples
    assert (sample.value, sample.condition) == (300.0, True)
    assert (sample.window_start_ms, sample.window_end_ms) == (final_end - 60_000, final_end)


def test_a_watermark_inside_a_pane_rounds_down_to_the_last_final_pane(catalog):
    data = FakeData(watermark=NOW - LATENESS + 7_000)
    evaluate_rule(threshold(catalog), data, catalog, NOW)
    assert data.asked == [(NOW - LATENESS - 60_000, NOW - LATENESS)]


def test_provisional_reads_up_to_the_pane_of_the_newest_event(catalog):
    data = FakeData(watermark=NOW - LATENESS - 3_000)  # newest event at NOW - 3 s
    evaluate_rule(threshold(catalog, provisional=True), data, catalog, NOW)
    assert data.asked == [(NOW - 60_000, NOW)]


@pytest.mark.parametrize("op,value,expected", [(">", 250, False), (">=", 250, True), ("<", 10, True),
                                               ("<=", 251, False), ("==", 250, True), ("!=", 250, False)])
def test_threshold_operators(catalog, op, value, expected):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(float(value))]})
    assert evaluate_rule(threshold(catalog, op=op), data, catalog, NOW).samples[0].condition is expected


def test_threshold_per_group(catalog):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(900.0, {"endpoint": "/api/search"}), wv(40.0, {"endpoint": "/"})]})
    outcome = evaluate_rule(threshold(catalog, group_by=["endpoint"]), data, catalog, NOW)
    assert {s.group["endpoint"]: s.condition for s in outcome.samples} == {"/api/search": True, "/": False}


def test_no_watermark_is_no_data(catalog):
    outcome = evaluate_rule(threshold(catalog), FakeData(watermark=None), catalog, NOW)
    assert outcome.no_data and "no events processed yet" in outcome.no_data


def test_an_empty_window_is_no_data(catalog):
    outcome = evaluate_rule(threshold(catalog, group_by=["endpoint"]), FakeData(), catalog, NOW)
    assert outcome.no_data and "no events in the window" in outcome.no_data


def test_an_outcome_names_the_window_it_read_even_without_samples(catalog):
    """What an instance without a sample of its own (a group gone, the rule without data) was
    decided on: its history entry names that window and counts the corrections to it."""
    final_end = NOW - LATENESS
    read = (final_end - 60_000, final_end)
    empty = evaluate_rule(threshold(catalog, group_by=["endpoint"]), FakeData(), catalog, NOW)
    assert (empty.window_start_ms, empty.window_end_ms) == read
    some = evaluate_rule(threshold(catalog), FakeData(windows={read: [wv(1.0)]}), catalog, NOW)
    assert (some.window_start_ms, some.window_end_ms) == read
    no_baseline = evaluate_rule(trend(catalog, threshold=2), FakeData(windows={read: [wv(1.0)]}), catalog, NOW)
    assert no_baseline.no_data and (no_baseline.window_start_ms, no_baseline.window_end_ms) == read
    both = FakeData(windows={read: [wv(3.0)], (read[0] - 60_000, read[0]): [wv(1.0)]})
    paired = evaluate_rule(trend(catalog, threshold=2), both, catalog, NOW)
    assert paired.samples and (paired.window_start_ms, paired.window_end_ms) == read
    unread = evaluate_rule(threshold(catalog), FakeData(watermark=None), catalog, NOW)  # no window chosen
    assert (unread.window_start_ms, unread.window_end_ms) == (None, None)


def test_an_undefined_stat_is_no_data_for_that_instance(catalog):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(None)]})
    [sample] = evaluate_rule(threshold(catalog), data, catalog, NOW).samples
    assert sample.condition is None and "undefined" in sample.reason


def test_a_stale_watermark_is_no_data(catalog):
    data = FakeData(watermark=NOW - LATENESS - 6 * 60_000)  # the pipeline stopped 6 min ago
    outcome = evaluate_rule(threshold(catalog), data, catalog, NOW)
    assert outcome.no_data and "before expected" in outcome.no_data
    data.asked.clear()
    evaluate_rule(threshold(catalog, stale_after="10m"), data, catalog, NOW)
    assert data.asked  # within the longer stale_after, the window is read


def test_a_failing_read_is_an_error_outcome(catalog):
    outcome = evaluate_rule(threshold(catalog), FakeData(fail=OSError("database is locked")), catalog, NOW)
    assert outcome.error == "OSError: database is locked"


# -- trend ---------------------------------------------------------------------------------------------

def trend(catalog, **fields):
    return rule(catalog, kind="trend", metric="requests", stat="count", window="1m", **fields)


@pytest.mark.parametrize("against,offset", [("previous", 60_000), ("1d", DAY), ("1w", WEEK)])
def test_trend_compares_with_the_previous_window_or_the_same_window_a_day_or_week_earlier(catalog, against, offset):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(300.0)],
                             (end - 60_000 - offset, end - offset): [wv(100.0)]})
    outcome = evaluate_rule(trend(catalog, against=against, mode="ratio", threshold=2), data, catalog, NOW)
    assert data.asked == [(end - 60_000, end), (end - 60_000 - offset, end - offset)]
    [sample] = outcome.samples
    assert (sample.value, sample.condition) == (3.0, True)


@pytest.mark.parametrize("mode,expected", [("ratio", 0.5), ("diff", -100.0), ("rate", -100.0 / 86_400)])
def test_trend_modes(catalog, mode, expected):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(100.0)], (end - 60_000 - DAY, end - DAY): [wv(200.0)]})
    [sample] = evaluate_rule(trend(catalog, against="1d", mode=mode, op="<", threshold=0), data, catalog, NOW).samples
    assert sample.value == pytest.approx(expected)


def test_trend_matches_groups_like_promql(catalog):
    end = NOW - LATENESS
    now_values = [wv(10.0, {"endpoint": "/a"}), wv(30.0, {"endpoint": "/new"})]
    data = FakeData(windows={(end - 60_000, end): now_values, (end - 120_000, end - 60_000): [wv(5.0, {"endpoint": "/a"})]})
    outcome = evaluate_rule(trend(catalog, group_by=["endpoint"], threshold=1.5), data, catalog, NOW)
    assert [(s.group, s.value) for s in outcome.samples] == [({"endpoint": "/a"}, 2.0)]


def test_trend_min_baseline_keeps_a_near_empty_baseline_from_firing(catalog):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(900.0)], (end - 120_000, end - 60_000): [wv(7.0)]})
    [quiet] = evaluate_rule(trend(catalog, threshold=2, min_baseline=100), data, catalog, NOW).samples
    assert (quiet.condition, quiet.value) == (False, pytest.approx(900 / 7)) and "below min_baseline" in quiet.reason
    [loud] = evaluate_rule(trend(catalog, threshold=2), data, catalog, NOW).samples
    assert loud.condition is True


def test_trend_without_a_baseline_is_no_data(catalog):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(10.0)]})
    outcome = evaluate_rule(trend(catalog, against="1w", threshold=2), data, catalog, NOW)
    assert outcome.no_data and "1w earlier" in outcome.no_data


def test_trend_ratio_over_a_zero_baseline_is_no_data_for_the_instance(catalog):
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(10.0)], (end - 120_000, end - 60_000): [wv(0.0)]})
    [sample] = evaluate_rule(trend(catalog, threshold=2), data, catalog, NOW).samples
    assert sample.condition is None and "baseline is 0" in sample.reason


def test_a_trend_ratio_past_a_double_is_no_data_for_the_instance_never_inf(catalog):
    # Ingest takes values up to 1e290 and down to 1e-300: their ratio is inf, which no store or
    # JSON answer holds (GET /api/v1/alerts answered 500 from then on).
    end = NOW - LATENESS
    data = FakeData(windows={(end - 60_000, end): [wv(1e290)], (end - 120_000, end - 60_000): [wv(1e-300)]})
    [sample] = evaluate_rule(trend(catalog, threshold=2), data, catalog, NOW).samples
    assert (sample.value, sample.condition) == (None, None) and "past a double" in sample.reason


def test_a_sample_of_a_value_that_is_no_finite_number_has_no_data():
    from alerts.outcome import Sample

    sample = Sample({}, float("-inf"), True)
    assert (sample.value, sample.condition) == (None, None) and "-inf" in sample.reason


# -- absence -------------------------------------------------------------------------------------------

def absence(catalog, **fields):
    return rule(catalog, kind="absence", stream="orders", duration="2m", **fields)


def test_absence_fires_once_the_newest_event_is_older_than_the_duration(catalog):
    fresh = evaluate_rule(absence(catalog), FakeData(seen={(): NOW - 60_000}), catalog, NOW).samples[0]
    silent = evaluate_rule(absence(catalog), FakeData(seen={(): NOW - 180_000}), catalog, NOW).samples[0]
    assert (fresh.value, fresh.condition) == (60.0, False)
    assert (silent.value, silent.condition) == (180.0, True)


def test_absence_of_anything_in_the_lookback_fires(catalog):
    [sample] = evaluate_rule(absence(catalog), FakeData(seen={}), catalog, NOW).samples
    assert sample.condition is True and "no events in the last 1h" in sample.reason


def test_absence_per_group(catalog):
    data = FakeData(seen={("DE",): NOW - 10_000, ("FR",): NOW - 300_000})
    outcome = evaluate_rule(absence(catalog, group_by=["country"]), data, catalog, NOW)
    assert {s.group["country"]: s.condition for s in outcome.samples} == {"DE": False, "FR": True}


class Panes:
    """AlertData.last_seen over panes given by their start: only those inside [start, end) count,
    as the store's newest_pane_ends reads them."""

    def __init__(self, pane_starts, pane=PANE):
        self.pane_starts, self.pane = pane_starts, pane

    def last_seen(self, stream, start_ms, end_ms, group_by, filters):
        ends = [p + self.pane for p in self.pane_starts if start_ms <= p < end_ms]
        return {(): max(ends)} if ends else {}


def test_absence_sees_events_stamped_ahead_of_the_clock_within_the_future_skew(catalog):
    # orders accepts events up to max_future_skew (5m) ahead: a fast clock's events are no silence.
    assert catalog.streams["orders"].max_future_skew >= 60_000
    [sample] = evaluate_rule(absence(catalog), Panes([NOW + 60_000]), catalog, NOW).samples
    assert (sample.value, sample.condition) == (0.0, False)
    assert sample.window_end_ms >= NOW + catalog.streams["orders"].max_future_skew


# -- pipeline rules --------------------------------------------------------------------------------------

LAG = {"http_requests": StreamLagView("OK", "fine", 3.0), "orders": StreamLagView("STOP", "no commits", 95.0)}


def test_lag_seconds_per_stream(catalog):
    outcome = evaluate_rule(rule(catalog, kind="lag", threshold=60), FakeData(lag=LAG), catalog, NOW)
    assert [(s.group, s.value, s.condition) for s in outcome.samples] == [
        ({"stream": "http_requests"}, 3.0, False), ({"stream": "orders"}, 95.0, True)]


def test_lag_of_one_stream_and_unknown_lag(catalog):
    views = {"orders": StreamLagView("OK", "", None)}
    [sample] = evaluate_rule(rule(catalog, kind="lag", stream="orders", threshold=60), FakeData(lag=views),
                             catalog, NOW).samples
    assert sample.condition is None


def test_lag_status_in_a_set(catalog):
    outcome = evaluate_rule(rule(catalog, kind="lag_status", statuses=["STALL", "STOP"]), FakeData(lag=LAG),
                            catalog, NOW)
    assert [(s.value, s.condition) for s in outcome.samples] == [("OK", False), ("STOP", True)]


def test_lag_rules_without_a_lag_monitor_are_errors(catalog):
    outcome = evaluate_rule(rule(catalog, kind="lag_status"), FakeData(lag=None), catalog, NOW)
    assert outcome.error == "consumer lag is not monitored in this process"
    assert evaluate_rule(rule(catalog, kind="lag", threshold=1), FakeData(lag={}), catalog, NOW).no_data


def test_dead_letter_rate(catalog):
    data = FakeData(dead={"orders": 600})
    outcome = evaluate_rule(rule(catalog, kind="dead_letters", window="5m", threshold=1), data, catalog, NOW)
    assert data.asked == [(NOW - 300_000, NOW)]
    assert sorted((s.group["stream"], s.value, s.condition) for s in outcome.samples) == sorted(
        (name, 2.0, True) if name == "orders" else (name, 0.0, False) for name in catalog.streams)


def test_every_kind_returns_an_outcome(catalog):
    assert isinstance(evaluate_rule(rule(catalog, kind="dead_letters", threshold=1), FakeData(), catalog, NOW), Outcome)


@pytest.mark.parametrize("name", [".", ".."])
def test_a_rule_cannot_be_named_what_a_url_path_resolves_away(catalog, name):
    # GET/DELETE /api/v1/alerts/rules/.. : clients send /api/v1/alerts instead (RFC 3986 dot segments).
    with pytest.raises(RuleError, match="cannot name a rule"):
        parse_rule({"name": name, "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m",
                    "threshold": 250}, catalog)
    assert threshold(catalog).name == "r"  # any other name as before, "..." too
    assert parse_rule({"name": "...", "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m",
                       "threshold": 250}, catalog).name == "..."


def test_a_threshold_yaml_reads_as_text_is_a_number_but_a_boolean_is_not(catalog):
    # PyYAML (YAML 1.1) reads 6e1 as the text '6e1': a rules file with one loaded before strict
    # numbers and must still; `true` is a typo, not 1.0.
    assert rule(catalog, kind="threshold", metric="latency", stat="p99", window="1m", threshold="6e1").threshold == 60.0
    with pytest.raises(RuleError, match="threshold"):
        rule(catalog, kind="threshold", metric="latency", stat="p99", window="1m", threshold=True)


RETENTION = 8 * DAY  # http_requests in the demo config


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(window_panes=st.integers(1, 7 * DAY // PANE), offset_panes=st.integers(1, 8 * DAY // PANE),
       into_pane=st.integers(0, PANE - 1))
def test_a_trend_rule_is_accepted_only_where_its_baseline_lies_within_the_retention(catalog, window_panes,
                                                                                  offset_panes, into_pane):
    """The rule's window ends at the watermark (the clock less allowed_lateness at best) floored to
    the pane, so its baseline starts offset + window + lateness and up to a pane before the clock:
    accepted, the baseline never reaches back past the retention horizon (clock - retention)
    where the panes are dropped already; refused with a message saying why otherwise."""
    window, offset = window_panes * PANE, max(offset_panes * PANE, window_panes * PANE)
    fields = dict(kind="trend", metric="requests", stat="count", window=f"{window // 1000}s",
                  against=f"{offset // 1000}s", mode="ratio", threshold=2)
    clock = NOW + into_pane
    try:
        parsed = rule(catalog, **fields)
    except RuleError as exc:
        assert offset + window + LATENESS + PANE > RETENTION
        assert "older than the stream's retention (8d)" in str(exc) and "allowed_lateness 30s" in str(exc)
        return
    data = FakeData(watermark=clock - LATENESS)
    evaluate_rule(parsed, data, catalog, clock)
    assert min(start for start, _ in data.asked) >= clock - RETENTION


def test_a_day_against_a_week_does_not_fit_an_eight_day_retention(catalog):
    """1d + 1w is the retention exactly, but the window ends lateness and up to a pane before the
    clock: its baseline's first seconds are dropped already (it read 20 events of 40)."""
    with pytest.raises(RuleError, match="against: the baseline window would start up to"):
        rule(catalog, kind="trend", metric="requests", stat="count", window="1d", against="1w", mode="ratio",
             threshold=2)
    rule(catalog, kind="trend", metric="requests", stat="count", window="23h", against="1w", mode="ratio", threshold=2)
