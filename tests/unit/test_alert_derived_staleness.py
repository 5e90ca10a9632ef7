"""A rule on a derived stream's metric is stale only past the stream's structural trail: a
sessions stream's watermark trails real time by 2 x (lateness + gap) under healthy traffic
(sessions are emitted only as they close), so a default `stale_after` (5m) read every sessions
rule as `nodata`, "the pipeline is behind", forever. Real store on both backends, the real
session step of the pipeline's batch (aggregates/session_batch.py), the alert evaluator's real
data source, the clock passed in."""

from __future__ import annotations

import pyarrow as pa

from aggregates.session_batch import SessionWindows, with_sessions
from alerts.kinds import evaluate_rule, expected_window_end
from alerts.outcome import WindowValue
from alerts.rules import parse_rule
from alerts.source import StoreAlertData
from catalog import parse_catalog
from catalog.features import watermark_trail_ms
from store import BatchCommit

T0 = 1_800_000_000_000  # a multiple of a minute
SECOND, MINUTE = 1_000, 60_000
CATALOG = parse_catalog("""
streams:
  web:
    key_field: user
    distinct: [user]
    pane: 10s
    allowed_lateness: 30s
    sessions: {key: user, gap: 5m}
""")
RUN_SCHEMA = pa.schema([("stream", pa.string()), ("key", pa.string()), ("first_ms", pa.int64()),
                        ("last_ms", pa.int64()), ("events", pa.int64())])


def test_the_structural_trail_of_each_derived_kind(catalog):
    """The demo's derived streams: sessions trail by their base's lateness + gap, a pattern's
    matches by its streams' lateness (its watermark, lateness 0), the others not at all."""
    trail = {name: watermark_trail_ms(catalog, name) for name in catalog.streams}
    assert trail["http_requests_sessions"] == 30 * SECOND + 5 * MINUTE
    assert trail["mobile_app_sessions"] == MINUTE + 5 * MINUTE
    assert trail["credential_stuffing_matches"] == 30 * SECOND
    assert trail["checkout_abandoned_matches"] == MINUTE
    for name in ("http_requests", "search_clicks", "mobile_app_clocks", "user_plans"):
        assert trail[name] == 0, name
    sessions = catalog.streams["http_requests_sessions"]
    now = T0 + 5 * SECOND
    assert expected_window_end(sessions, 0, now, provisional=False) == T0 - 330 * SECOND  # its lateness only
    assert expected_window_end(sessions, trail["http_requests_sessions"], now, provisional=False) == T0 - 660 * SECOND
    assert expected_window_end(sessions, trail["http_requests_sessions"], now, provisional=True) == T0 - 320 * SECOND


class WatermarkOnly:
    """A data source with just a watermark and windows without matches (a count of 0, as the
    store's source reads an empty window without group_by)."""

    def __init__(self, watermark_ms: int):
        self.watermark_ms = watermark_ms

    def watermark(self, stream):
        return self.watermark_ms

    def window_values(self, metric, stat, start_ms, end_ms, group_by, filters, *, now_ms):
        return [WindowValue({}, 0.0, 0)]


def test_a_matches_rule_allows_for_its_patterns_lateness_and_no_more(catalog):
    """credential_stuffing_matches has the watermark of logins (newest event - 30 s) and lateness 0:
    its final window ends 30 s before now when all is well. 5m20s behind now is 4m50s past that
    (read: 0 matches); 5m40s behind is 5m10s past it (stale)."""
    rule = parse_rule({"name": "stuffing", "kind": "threshold", "metric": "credential_stuffing_matches",
                       "stat": "count", "window": "1m", "op": ">", "threshold": 0}, catalog)
    outcome = evaluate_rule(rule, WatermarkOnly(T0 - 5 * MINUTE - 20 * SECOND), catalog, T0)
    assert not outcome.no_data and [s.value for s in outcome.samples] == [0]
    outcome = evaluate_rule(rule, WatermarkOnly(T0 - 5 * MINUTE - 40 * SECOND), catalog, T0)
    assert outcome.no_data and "past the 30s by which credential_stuffing_matches trails logins" in outcome.no_data


def batch(store, windows: SessionWindows, batch_id: int, now_ms: int, users: list[str]) -> None:
    """One pipeline batch at `now_ms`: an event of each new user 1 s before it (each a session of
    one event), the base stream's progress and the sessions its watermark closes."""
    at = now_ms - SECOND
    runs = pa.table({"stream": ["web"] * len(users), "key": users, "first_ms": [at] * len(users),
                     "last_ms": [at] * len(users), "events": [1] * len(users)}, schema=RUN_SCHEMA)
    commit = BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=len(users),
                         max_event_ms={"web": at})
    commit = with_sessions(commit, windows.sessionize(runs, commit, now_ms=now_ms), windows.names)
    lateness = {name: s.allowed_lateness for name, s in CATALOG.streams.items()}
    assert store.commit_batch(commit, lateness_ms=lateness, now_ms=now_ms).committed


def test_a_default_sessions_rule_reads_data_under_steady_traffic_and_nodata_once_the_pipeline_stops(store_backend):
    store = store_backend.create()
    windows, data = SessionWindows(CATALOG, store), StoreAlertData(CATALOG, store)
    final = parse_rule({"name": "sessions", "kind": "threshold", "metric": "web_sessions", "stat": "count",
                        "window": "1m", "op": "<", "threshold": 1}, CATALOG)
    provisional = parse_rule({"name": "sessions_now", "kind": "threshold", "metric": "web_sessions", "stat": "count",
                              "window": "1m", "op": "<", "threshold": 1, "provisional": True}, CATALOG)
    assert final.stale_after == provisional.stale_after == 5 * MINUTE  # the defaults, as in the report

    # 25 minutes of healthy traffic: a batch every 10 s, three new users a request each.
    now, user = T0, 0
    for batch_id in range(150):
        now += 10 * SECOND
        batch(store, windows, batch_id, now, [f"u{user + i}" for i in range(3)])
        user += 3
        if now - T0 < 13 * MINUTE:  # the first sessions close only after lateness + gap, final after twice that
            continue
        for rule in (final, provisional):
            outcome = evaluate_rule(rule, data, CATALOG, now)
            assert not outcome.no_data, (rule.name, now - T0, outcome.no_data)
            [sample] = outcome.samples
            # 3 sessions a 10 s pane: a full minute, the condition (no sessions) false.
            assert (sample.value, sample.condition) == (18, False), rule.name
    # The newest event is 1 s old: the base stream's watermark lags it by its lateness (31 s in
    # all), the sessions stream's by twice lateness + gap (the trail, then its own lateness).
    marks = store.watermarks()
    assert now - marks["web"] == SECOND + 30 * SECOND
    assert now - marks["web_sessions"] == SECOND + 2 * (30 * SECOND + 5 * MINUTE)

    # The pipeline stops: nothing more is committed. Within stale_after the last windows are read,
    # past it (and a pane's rounding) the rule has no data, judged by the base stream's windows.
    stopped = now
    for rule in (final, provisional):
        assert not evaluate_rule(rule, data, CATALOG, stopped + 4 * MINUTE + 20 * SECOND).no_data, rule.name
        outcome = evaluate_rule(rule, data, CATALOG, stopped + 5 * MINUTE + 20 * SECOND)
        assert outcome.no_data and "before expected" in outcome.no_data, rule.name
        assert "judged by web, whose sessions web_sessions counts" in outcome.no_data, outcome.no_data
    store.close()


def test_a_sessions_rule_reads_data_while_its_users_stay_active_longer_than_stale_after(store_backend):
    """Sessions of 10 minutes each (a user's request every 10 s): the sessions stream's windows
    trail by their length too, which no fixed trail covers. Its base stream says whether traffic
    comes (a reviewer's case: every evaluation read nodata, "the pipeline is behind")."""
    store = store_backend.create()
    windows, data = SessionWindows(CATALOG, store), StoreAlertData(CATALOG, store)
    rule = parse_rule({"name": "sessions", "kind": "threshold", "metric": "web_sessions", "stat": "count",
                       "window": "1m", "op": "<", "threshold": 1}, CATALOG)
    now, active_batches = T0, 10 * 6
    read = 0
    for batch_id in range(210):  # 35 minutes: three users start each batch, each active 10 minutes
        now += 10 * SECOND
        users = [f"u{k}_{i}" for k in range(max(0, batch_id - active_batches + 1), batch_id + 1) for i in range(3)]
        batch(store, windows, batch_id, now, users)
        if batch_id >= 180 and batch_id % 6 == 0:
            outcome = evaluate_rule(rule, data, CATALOG, now)
            assert not outcome.no_data, (now - T0, outcome.no_data)
            read += 1
    assert read == 5
    store.close()
