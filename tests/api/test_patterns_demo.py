"""The shipped patterns (config/streams.yaml: credential_stuffing, checkout_abandoned) and the
shipped `pattern` alert rule (config/alerts.yaml) over the demo's own logins and checkouts
(demo/logins.py, demo/checkouts.py): 36 minutes of the demo's clock, drawn every 5 s as the
producer does, POSTed to the API and committed every 30 s by the pipeline's driver side (tests/api/test_ws_support.py
runs aggregates/patterns.py, as a batch does; no Spark), the rule evaluated after each commit and
its alerts POSTed to a real webhook receiver on loopback.

Each credential-stuffing burst that broke in fires the rule once, with the burst's logins in the
webhook payload; and the matches GET /api/v1/patterns/{name}/matches pages through are exactly
those of the brute-force definition (tests/support/patterns.py) over the events in the log, up to
each pattern's watermark."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from alerts.loader import load_rules_file
from alerts.service import AlertService
from alerts.source import StoreAlertData
from alerts.webhook import WebhookNotifier
from dashboard.provisioning import load_dashboard_file
from demo.traffic import DemoTraffic
from ingest.log.records import EVENT_TIME, OFFSET
from patterns.events import PatternEvent
from patterns.plan import compile_pattern
from sketchboard.settings import DEFAULT_ALERTS
from store.alerts import SqliteAlertStore
from tests.api.test_join_demo import post_all
from tests.api.test_ws_support import drain_log_into_store
from tests.support.alerts import evaluate_every_rule
from tests.support.patterns import brute_force

RULE = "credential_stuffing"   # the shipped rule of kind pattern
SEED = 0
TICK_S = 5                     # the demo's clock moves this much between two draws...
BATCH_S = 30                   # ...and the pipeline commits a batch this often
RUN_S = 36 * 60                # past the 30 minutes an abandoned checkout is decided at
STREAMS = ("logins", "checkouts")


@pytest.fixture
def alerts(ctx, tmp_path, clock, receiver):
    """The API's alert service with the shipped file's pattern rule (its other rules watch
    streams this test does not send) and a webhook notifier to the receiver."""
    store = SqliteAlertStore(tmp_path / "alerts.db")
    hook = WebhookNotifier(receiver.url, timeout_s=2.0, clock=clock, memory_store=store)
    service = AlertService(ctx.catalog, store, StoreAlertData(ctx.catalog, ctx.store), notifiers=[hook], clock=clock)
    shipped = load_rules_file(DEFAULT_ALERTS, ctx.catalog)
    assert shipped[RULE].kind == "pattern" and shipped[RULE].pattern == "credential_stuffing"
    service.sync_file({RULE: shipped[RULE]})
    yield service
    service.stop()
    store.close()


def log_events(ctx, stream_name: str, key: str) -> list[PatternEvent]:
    """Every event of the stream in the log, as the matcher reads it, in matching order."""
    stream = ctx.catalog.stream(stream_name)
    out = []
    for partition, offsets in ctx.log.offsets(stream_name).items():
        for batch in ctx.log.read(stream, partition, offsets.start, offsets.end):
            for row in batch.to_pylist():
                out.append(PatternEvent(stream_name, partition, row[OFFSET], row[EVENT_TIME], row[key], row))
    return sorted(out, key=lambda e: e.order)


def stored_matches(client, name: str) -> list[dict]:
    out, cursor = [], None
    while True:
        page = client.get(f"/api/v1/patterns/{name}/matches", params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        out += page.json()["matches"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return out


def test_the_demos_bursts_fire_the_pattern_alert_once_each_and_matches_equal_the_definition(
        client, ctx, clock, alerts, receiver):
    traffic = DemoTraffic(ctx.catalog, seed=SEED, clock=clock)
    start_ms = round(clock() * 1000)
    evaluate_every_rule(alerts)  # a new rule reads from the newest match on (none yet)
    sent = 0
    drawn: dict[str, list[dict]] = {name: [] for name in STREAMS}
    for tick in range(1, RUN_S // TICK_S + 1):
        clock.advance(TICK_S)
        for name in STREAMS:
            drawn[name] += traffic.generate_stream(name, 0)
        if tick * TICK_S % BATCH_S == 0:
            # One body per stream and batch (fewer requests than the producer's one per tick; the
            # log and the batch see the same events either way), then the batch, then the rule.
            for name in STREAMS:
                post_all(client, name, drawn[name])
                sent += len(drawn[name])
                drawn[name] = []
            drain_log_into_store(ctx.catalog, ctx.log, ctx.store, round(clock() * 1000))
            evaluate_every_rule(alerts)
    assert sent > 3_000

    status = client.get("/api/v1/pipeline").json()["patterns"]
    watermark = {name: status[name]["watermark_ms"] for name in ("credential_stuffing", "checkout_abandoned")}
    assert all(w is not None and w > start_ms + 30 * 60_000 for w in watermark.values())
    assert status["credential_stuffing"]["late_events"] == status["checkout_abandoned"]["late_events"] == 0

    # Every burst that broke in (and was released by the watermark) fired the rule once, its logins in the payload.
    bursts = [b for b in traffic.login_traffic.bursts(start_ms, watermark["credential_stuffing"] + 1)
              if b.success and b.end_ms <= watermark["credential_stuffing"]]
    assert bursts  # the seed's first one breaks in some eight minutes in
    [hook] = alerts.notifiers
    hook.close()  # sends what is queued first
    sent_firing = [a for r in receiver.requests for a in r.body["alerts"]
                   if a["labels"]["alertname"] == RULE and a["status"] == "firing"]
    # A new match resends the rule's group (docs/alerts.md): a match still firing then (keep_firing_for)
    # comes again, the same alert (its labels, start and logins). One alert per match, as first sent.
    # (A resend's summary reads "no data logins": its $value is rendered anew, after the match.)
    fired = list({a["labels"]["match_id"]: a for a in reversed(sent_firing)}.values())
    same = {a["labels"]["match_id"]: (a["labels"], a["startsAt"], a["annotations"]["events"]) for a in fired}
    assert all(same[a["labels"]["match_id"]] == (a["labels"], a["startsAt"], a["annotations"]["events"])
               for a in sent_firing)
    got = sorted((a["labels"]["key"], [e["time"] for e in json.loads(a["annotations"]["events"])],
                  json.loads(a["annotations"]["measures"])["attempts"]) for a in fired)
    assert got == sorted((b.user_id, list(b.times_ms), b.failures) for b in bursts)
    for a in fired:
        events = json.loads(a["annotations"]["events"])
        assert [e["step"] for e in events] == ["failures"] * (len(events) - 1) + ["success"]
        assert {e["stream"] for e in events} == {"logins"} and a["labels"]["severity"] == "page"
        assert a["annotations"]["summary"].startswith(f"credential stuffing against {a['labels']['key']}: {len(events)} logins")

    # The stored matches are the definition's, over the log's events up to each pattern's watermark.
    for pattern in ctx.catalog.patterns:
        plan = compile_pattern(pattern, ctx.catalog)
        by_key: dict[str, list[PatternEvent]] = defaultdict(list)
        for e in log_events(ctx, pattern.streams[0], pattern.key):
            if e.time <= watermark[pattern.name]:
                by_key[e.key].append(e)
        want = sorted((key, decided, [list(e) for e in events])
                      for key, evs in by_key.items() for decided, events in brute_force(plan, evs, watermark[pattern.name]))
        stored = stored_matches(client, pattern.name)
        assert sorted((m["key"], m["decided_at_ms"], [[e["step"], e["stream"], e["partition"], e["offset"], e["time"]]
                                                       for e in m["events"]]) for m in stored) == want
        assert want and not any(m["late"] for m in stored)

    # The demo dashboard's panel: credential-stuffing matches by the client of the burst's first
    # failure (the pattern's `dimensions:`), each burst that broke in counted under its own client.
    dashboard = load_dashboard_file(Path(__file__).parents[2] / "config" / "dashboards" / "patterns.yaml", ctx.catalog)
    panel = next(p for p in dashboard.panels if p.metric == "credential_stuffing_matches")
    assert list(panel.group_by) == ["client"]
    answer = client.get("/api/v1/query", params={"metric": panel.metric, "stat": panel.stat, "group_by": "client",
                                                 "from": start_ms, "to": watermark["credential_stuffing"] + 1,
                                                 "step": "1h"}).json()
    counted = {s["group"]["client"]: sum(p["value"] or 0 for p in s["points"]) for s in answer["series"]}
    assert counted == dict(Counter(b.client for b in bursts))
