"""`/api/v1/alerts`: rule CRUD with clear 4xx errors that change nothing, file rules being
read-only, silences, and alerts computed from real panes in a real SQLite store (events go
in through the ingest API and the in-process stand-in for the pipeline). No Spark."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from alerts.loader import load_rules_file
from alerts.rules import RuleError
from alerts.service import AlertService
from alerts.source import StoreAlertData
from api.alert_routes import AlertsFeed
from api.app import create_app
from store.alerts import SqliteAlertStore
from tests.api.test_ws import ev
from tests.api.test_ws_support import drain_log_into_store
from tests.support.alerts import evaluate_every_rule

RULE = {"name": "cart_p99", "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m",
        "filters": {"endpoint": "/api/cart"}, "group_by": ["endpoint"], "op": ">", "threshold": 500,
        "for": "20s", "labels": {"severity": "page"},
        "annotations": {"summary": "p99 of {{ $labels.endpoint }} is {{ $value }} ms"}}


@pytest.fixture
def alerts(ctx, tmp_path, clock):
    store = SqliteAlertStore(tmp_path / "store.db")
    service = AlertService(ctx.catalog, store, StoreAlertData(ctx.catalog, ctx.store), clock=clock)
    ctx.alerts = service
    yield service
    store.close()


@pytest.fixture
def api(ctx, alerts):
    with TestClient(create_app(ctx)) as c:
        yield c


def rules(api) -> list[dict]:
    return api.get("/api/v1/alerts/rules").json()["rules"]


# -- CRUD ------------------------------------------------------------------------------------------

def test_create_list_get_update_delete(api):
    created = api.post("/api/v1/alerts/rules", json=RULE)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["source"] == "api" and body["state"] == "normal" and body["for"] == "20s" and body["window"] == "1m"
    assert [r["name"] for r in rules(api)] == ["cart_p99"]
    assert api.get("/api/v1/alerts/rules/cart_p99").json()["threshold"] == 500
    changed = api.put("/api/v1/alerts/rules/cart_p99", json={**RULE, "threshold": 800})
    assert changed.status_code == 200 and changed.json()["threshold"] == 800
    assert changed.json()["updated_ms"] > body["updated_ms"] or changed.json()["updated_ms"] == body["updated_ms"] + 1
    assert api.delete("/api/v1/alerts/rules/cart_p99").status_code == 204
    assert rules(api) == []
    assert api.get("/api/v1/alerts/rules/cart_p99").status_code == 404
    assert api.delete("/api/v1/alerts/rules/cart_p99").status_code == 404


@pytest.mark.parametrize("change,message", [
    ({"metric": "latencyy"}, "metric: unknown metric 'latencyy'"),
    ({"for": "5 parsecs"}, "for: "),
    ({"window": "-1m"}, "window: "),
    ({"window": "15s"}, "window: must be a multiple of the stream's pane (10s)"),
    ({"threshold": "high"}, "threshold: "),
    ({"threshold": float("nan")}, "threshold"),
    ({"stat": "p999x"}, "stat: "),
    ({"group_by": ["colour"]}, "unknown dimension 'colour'"),
    ({"op": "=>"}, "op: "),
    ({"kind": "thresh"}, "kind: must be one of"),
    ({"bogus": 1}, "bogus: unknown field"),
    ({"name": "has space"}, "name: "),
    ({"annotations": {"summary": "{{ $valu }}"}}, "unknown placeholder"),
    ({"annotations": {"summary": '{{ printf\n "x" }}'}}, "unknown placeholder"),  # over two lines
    ({"threshold": True}, "threshold: "),  # not read as 1
    ({"stat": "p99\n"}, "stat: "),
    ({"stat": "p\u0669\u0669"}, "stat: "),  # Arabic-Indic digits
    ({"labels": {"alertname": "x"}}, "'alertname' is set from the rule's name"),
])
def test_bad_rules_get_a_clear_400_and_change_nothing(api, change, message):
    body = {**RULE, **change}
    if body.get("threshold") != body.get("threshold"):  # NaN is not JSON: send it as the literal
        response = api.post("/api/v1/alerts/rules", content=b'{"name": "x", "kind": "threshold", "metric": "latency",'
                            b' "threshold": NaN}', headers={"content-type": "application/json"})
    else:
        response = api.post("/api/v1/alerts/rules", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["detail"]
    assert rules(api) == []


def test_a_bad_update_changes_nothing(api):
    api.post("/api/v1/alerts/rules", json=RULE)
    before = api.get("/api/v1/alerts/rules/cart_p99").json()
    assert api.put("/api/v1/alerts/rules/cart_p99", json={**RULE, "metric": "nope"}).status_code == 400
    assert api.put("/api/v1/alerts/rules/cart_p99", json={**RULE, "name": "other"}).status_code == 400
    assert api.put("/api/v1/alerts/rules/missing", json={**RULE, "name": "missing"}).status_code == 404
    assert api.get("/api/v1/alerts/rules/cart_p99").json() == before


def test_name_taken_and_bodies_that_are_not_objects(api):
    assert api.post("/api/v1/alerts/rules", json=RULE).status_code == 201
    taken = api.post("/api/v1/alerts/rules", json=RULE)
    assert taken.status_code == 409 and "already exists" in taken.json()["detail"]
    assert api.post("/api/v1/alerts/rules", json=[RULE]).status_code == 400
    assert "not valid JSON" in api.post("/api/v1/alerts/rules", content=b"{",
                                         headers={"content-type": "application/json"}).json()["detail"]


def test_file_rules_are_read_only_but_can_be_silenced(api, alerts, catalog, tmp_path):
    path = tmp_path / "alerts.yaml"
    path.write_text("rules:\n  - {name: stalled, kind: lag_status, statuses: [STALL, STOP]}\n")
    alerts.sync_file(load_rules_file(path, catalog))
    assert rules(api)[0]["source"] == "file"
    refused = api.put("/api/v1/alerts/rules/stalled", json={"kind": "lag_status"})
    assert refused.status_code == 409 and "alerts file" in refused.json()["detail"]
    assert api.delete("/api/v1/alerts/rules/stalled").status_code == 409
    assert api.post("/api/v1/alerts/rules/stalled/silence", json={"duration": "1h"}).status_code == 200
    path.write_text("rules: []\n")  # removed from the file: gone at the next load
    alerts.sync_file(load_rules_file(path, catalog))
    assert rules(api) == []


def test_the_rules_file_reports_the_rule_at_fault(catalog, tmp_path):
    path = tmp_path / "alerts.yaml"
    path.write_text("rules:\n  - {name: ok, kind: lag_status}\n  - {name: bad, kind: lag, threshold: soon}\n")
    with pytest.raises(RuleError, match=r"rules\[1\]: rule 'bad': threshold"):
        load_rules_file(path, catalog)
    path.write_text("rules:\n  - {name: a, kind: lag_status}\n  - {name: a, kind: lag_status}\n")
    with pytest.raises(RuleError, match="a second rule named 'a'"):
        load_rules_file(path, catalog)


def test_the_rules_file_is_read_as_strictly_as_the_streams_file(catalog, tmp_path):
    """A second `rules:` replaced the first without a word (yaml.safe_load keeps the last key), and
    a file not in UTF-8 was a traceback: both are one line naming the file and the line."""
    path = tmp_path / "alerts.yaml"
    path.write_text("rules:\n  - {name: a, kind: lag_status}\nrules: []\n")
    with pytest.raises(RuleError, match=rf"^{path}: line 3: duplicate key 'rules'$"):
        load_rules_file(path, catalog)
    path.write_bytes(b"rules:\n  - {name: caf\xe9, kind: lag_status}\n")
    with pytest.raises(RuleError, match=rf"^{path}: line 2: not UTF-8 text"):
        load_rules_file(path, catalog)


def test_silence_and_unsilence(api, clock, now_ms):
    api.post("/api/v1/alerts/rules", json=RULE)
    silenced = api.post("/api/v1/alerts/rules/cart_p99/silence", json={"duration": "1h"}).json()
    assert silenced["silenced_until_ms"] == now_ms + 3_600_000
    for bad in ({"duration": "forever"}, {"duration": "0s"}, {}):
        assert api.post("/api/v1/alerts/rules/cart_p99/silence", json=bad).status_code == 400
    assert api.post("/api/v1/alerts/rules/nope/silence", json={"duration": "1h"}).status_code == 404
    assert api.delete("/api/v1/alerts/rules/cart_p99/silence").json()["silenced_until_ms"] is None


# -- alerts from real panes ---------------------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.batches = []

    def observe(self, batch):
        self.batches.append(batch)

    def close(self, timeout_s=5.0):
        pass


def send(api, ctx, clock, t_ms, latency):
    """Events of one pane (10 s) for /api/cart and /, then the stand-in pipeline commits them."""
    events = [ev(t_ms + i * 100, "/api/cart", latency) for i in range(50)] + [ev(t_ms + i * 100, "/", 20) for i in range(50)]
    assert api.post("/api/v1/events", params={"stream": "http_requests"}, json=events).status_code == 200
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(clock.now * 1000))


def test_a_spike_goes_pending_firing_resolved_with_history_feed_and_notices(api, ctx, alerts, clock):
    recorder = Recorder()
    alerts.notifiers.append(recorder)
    feed = AlertsFeed(alerts.store)
    api.post("/api/v1/alerts/rules", json={**RULE, "window": "10s", "for": "10s", "interval": "10s"})
    timeline = []
    latencies = [20, 20, 900, 900, 900, 20, 20, 20]  # one 10 s pane each; the spike lasts three panes
    for i, latency in enumerate(latencies):
        pane = int(clock.now * 1000) // 10_000 * 10_000
        send(api, ctx, clock, pane, latency)
        clock.now += 10 + 30  # move past this pane's end + the allowed lateness: the pane is final
        send(api, ctx, clock, pane + 40_000, 20)  # a later event moves the watermark past the pane
        evaluate_every_rule(alerts)
        timeline.append(api.get("/api/v1/alerts/rules/cart_p99").json()["state"])
        clock.now -= 30
    assert timeline == ["normal", "normal", "pending", "firing", "firing", "resolved", "normal", "normal"], timeline

    body = api.get("/api/v1/alerts?rule=cart_p99").json()
    changes = [(e["from_state"], e["to_state"]) for e in reversed(body["history"])]
    assert changes == [("normal", "pending"), ("pending", "firing"), ("firing", "resolved")]
    firing = body["history"][1]
    assert firing["labels"] == {"alertname": "cart_p99", "severity": "page", "endpoint": "/api/cart"}
    assert firing["annotations"]["summary"] == "p99 of /api/cart is 900 ms"
    assert firing["window_end_ms"] - firing["window_start_ms"] == 10_000 and firing["revision"] == 1

    # A straggler lands in the window the firing decision read: the decision stands, and says so.
    assert firing["corrections_since"] == 0
    # One for another endpoint corrects the same panes' time but not the rule's input: not counted.
    elsewhere = [ev(firing["window_start_ms"] + 500, "/", 5.0)]
    assert api.post("/api/v1/events", params={"stream": "http_requests"}, json=elsewhere).status_code == 200
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(clock.now * 1000))
    entry = next(e for e in api.get("/api/v1/alerts").json()["history"] if e["id"] == firing["id"])
    assert entry["corrections_since"] == 0
    straggler = [ev(firing["window_start_ms"] + 500, "/api/cart", 5.0)]
    assert api.post("/api/v1/events", params={"stream": "http_requests"}, json=straggler).status_code == 200
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(clock.now * 1000))
    entry = next(e for e in api.get("/api/v1/alerts").json()["history"] if e["id"] == firing["id"])
    assert entry["corrections_since"] == 1 and entry["value"] == firing["value"] and entry["to_state"] == "firing"

    assert [m["event"]["to_state"] for m in feed.poll()] == ["pending", "firing", "resolved"]
    assert feed.poll() == []
    statuses = [[n.status for n in b.notices] for b in recorder.batches]
    assert statuses.count(["firing"]) == 2 and statuses.count(["resolved"]) == 1


def post_and_commit(api, ctx, clock, events):
    assert api.post("/api/v1/events", params={"stream": "http_requests"}, json=events).status_code == 200
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(clock.now * 1000))


def corrections_since(api, entry) -> int | None:
    return next(e for e in api.get("/api/v1/alerts").json()["history"] if e["id"] == entry["id"])["corrections_since"]


def test_a_trend_decision_counts_corrections_to_its_baseline_window_too(api, ctx, alerts, clock):
    """A trend rule's decision read two windows, now and `against` earlier: a straggler in the
    baseline changed its value as much as one in the window now (docs/alerts.md)."""
    t0 = int(clock.now * 1000) // 10_000 * 10_000
    clock.now = (t0 + 55_000) / 1000
    api.post("/api/v1/alerts/rules", json={
        "name": "cart_surge", "kind": "trend", "metric": "requests", "stat": "count", "window": "10s",
        "against": "previous", "mode": "ratio", "op": ">", "threshold": 2, "filters": {"endpoint": "/api/cart"}})
    post_and_commit(api, ctx, clock, [ev(t0 + i * 100) for i in range(10)]             # baseline: 10
                    + [ev(t0 + 10_000 + i * 100) for i in range(50)] + [ev(t0 + 50_000, "/")])  # now: 50
    evaluate_every_rule(alerts)
    [firing] = api.get("/api/v1/alerts?rule=cart_surge").json()["history"]
    assert firing["to_state"] == "firing" and (firing["window_start_ms"], firing["window_end_ms"]) == (t0 + 10_000,
                                                                                                     t0 + 20_000)
    assert firing["corrections_since"] == 0
    clock.now += 1
    post_and_commit(api, ctx, clock, [ev(t0 + 5_000 + i) for i in range(40)] + [ev(t0 + 5_000, "/")])  # baseline
    assert corrections_since(api, firing) == 1  # not the other endpoint's
    clock.now += 1
    post_and_commit(api, ctx, clock, [ev(t0 + 15_000)])  # the window now
    assert corrections_since(api, firing) == 2
    clock.now += 1
    post_and_commit(api, ctx, clock, [ev(t0 - 5_000)])  # a correction of a window the decision did not read
    assert len(ctx.store.corrections(stream="http_requests", start_ms=t0 - 10_000, end_ms=t0)) == 1
    assert corrections_since(api, firing) == 2


def test_decisions_without_a_sample_count_corrections_to_the_window_they_read(api, ctx, alerts, clock):
    """A rule without data in an empty window, and a group that left the window, were decided on
    that window: a straggler filling it is a correction of their input (docs/alerts.md)."""
    t0 = int(clock.now * 1000) // 10_000 * 10_000
    clock.now = (t0 + 55_000) / 1000
    for name, fields in (("cart_count", {"metric": "requests", "stat": "count", "op": "<", "threshold": 5,
                                         "filters": {"endpoint": "/api/cart"}}),
                         ("slow", {"metric": "latency", "stat": "max", "op": ">", "threshold": 500})):
        api.post("/api/v1/alerts/rules", json={"name": name, "kind": "threshold", "window": "10s",
                                               "group_by": ["endpoint"], **fields})
    # [t0+10s, t0+20s) is final: no cart requests there (cart_count: nodata), /api/cart slow (slow fires)
    post_and_commit(api, ctx, clock, [ev(t0 + 12_000, "/", 900)] + [ev(t0 + 50_000, "/", 10)])
    evaluate_every_rule(alerts)
    clock.now += 10  # [t0+20s, t0+30s) is final: / only, fast (slow's group "/" resolves: gone)
    post_and_commit(api, ctx, clock, [ev(t0 + 22_000, "/api/cart", 10), ev(t0 + 60_000, "/api/cart", 10)])
    evaluate_every_rule(alerts)
    history = api.get("/api/v1/alerts").json()["history"]
    nodata = next(e for e in history if e["rule"] == "cart_count" and e["to_state"] == "nodata")
    gone = next(e for e in history if e["rule"] == "slow" and e["to_state"] == "resolved")
    assert (nodata["window_start_ms"], nodata["window_end_ms"], nodata["corrections_since"]) == (t0 + 10_000,
                                                                                               t0 + 20_000, 0)
    assert (gone["window_start_ms"], gone["window_end_ms"], gone["corrections_since"]) == (t0 + 20_000,
                                                                                         t0 + 30_000, 0)
    clock.now += 1
    post_and_commit(api, ctx, clock, [ev(t0 + 12_500, "/api/cart"), ev(t0 + 25_000, "/", 900)])  # stragglers
    assert (corrections_since(api, nodata), corrections_since(api, gone)) == (1, 1)


def test_a_decision_counts_the_corrections_to_what_it_read_after_its_rule_is_replaced(api, ctx, alerts, clock):
    """The entry records what it read (stream, filter and group values, windows): a PUT that
    changes the filter does not make an older decision count another endpoint's corrections."""
    t0 = int(clock.now * 1000) // 10_000 * 10_000
    clock.now = (t0 + 55_000) / 1000
    rule = {"name": "cart_slow", "kind": "threshold", "metric": "latency", "stat": "max", "window": "10s",
            "filters": {"endpoint": "/api/cart"}, "op": ">", "threshold": 500}
    api.post("/api/v1/alerts/rules", json=rule)
    feed = AlertsFeed(alerts.store)
    post_and_commit(api, ctx, clock, [ev(t0 + 10_000, "/api/cart", 900), ev(t0 + 10_000, "/search", 10),
                                      ev(t0 + 50_000, "/", 10)])
    evaluate_every_rule(alerts)
    [firing] = api.get("/api/v1/alerts?rule=cart_slow").json()["history"]
    assert firing["to_state"] == "firing" and "input" not in firing
    assert "input" not in feed.poll()[0]["event"]  # what the decision read is not shown, only counted
    assert api.put("/api/v1/alerts/rules/cart_slow", json={**rule, "filters": {"endpoint": "/search"}}).status_code == 200
    clock.now += 1
    post_and_commit(api, ctx, clock, [ev(t0 + 15_000, "/api/cart", 100)])  # in what the decision read
    assert corrections_since(api, firing) == 1
    # an entry saved before the input was recorded is read with the rule as it is now
    [older] = alerts.with_corrections_since([{k: v for k, v in firing.items() if k != "corrections_since"}])
    assert older["corrections_since"] == 0
    clock.now += 1
    post_and_commit(api, ctx, clock, [ev(t0 + 15_000, "/search", 100)])  # what the new filter reads, not it
    assert corrections_since(api, firing) == 1


def test_a_pending_period_survives_a_restart_of_the_service(ctx, alerts, clock, tmp_path):
    """Like Prometheus restoring ALERTS_FOR_STATE: a new process goes on counting `for`."""
    alerts.create({"name": "quiet", "kind": "absence", "stream": "orders", "duration": "1m", "for": "30s"})
    evaluate_every_rule(alerts)
    [pending] = alerts.store.instances()
    assert pending["state"] == "pending"
    clock.now += 30
    restarted = AlertService(ctx.catalog, SqliteAlertStore(tmp_path / "store.db"),
                             StoreAlertData(ctx.catalog, ctx.store), clock=clock)
    evaluate_every_rule(restarted)
    [firing] = restarted.store.instances()
    assert firing["state"] == "firing" and firing["active_since_ms"] == pending["active_since_ms"]


def test_deleting_a_firing_rule_resolves_it_and_records_why(api, alerts, clock):
    recorder = Recorder()
    alerts.notifiers.append(recorder)
    api.post("/api/v1/alerts/rules", json={"name": "gone", "kind": "absence", "stream": "orders", "duration": "1m"})
    evaluate_every_rule(alerts)
    assert api.get("/api/v1/alerts").json()["active"][0]["state"] == "firing"  # no orders at all
    assert api.delete("/api/v1/alerts/rules/gone").status_code == 204
    body = api.get("/api/v1/alerts").json()
    assert body["active"] == []
    assert (body["history"][0]["to_state"], body["history"][0]["reason"]) == ("normal", "rule deleted")
    assert [n.status for n in recorder.batches[-1].notices] == ["resolved"]


def test_a_rule_whose_metric_disappeared_reads_as_error(ctx, alerts, clock):
    alerts.store.create_rule("orphan", {"name": "orphan", "kind": "threshold", "metric": "removed", "threshold": 1},
                             source="api", now_ms=1)
    evaluate_every_rule(alerts)
    [inst] = alerts.store.instances("orphan")
    assert inst["state"] == "error" and "no longer valid" in inst["reason"]


def test_metrics_count_alert_instances_per_rule_and_state(api, alerts):
    from prometheus_client.parser import text_string_to_metric_families

    api.post("/api/v1/alerts/rules", json={"name": "quiet", "kind": "absence", "stream": "orders", "duration": "1m"})
    evaluate_every_rule(alerts)
    families = {f.name: f for f in text_string_to_metric_families(api.get("/metrics").text)}
    samples = {(s.labels["alertname"], s.labels["alertstate"]): s.value for s in families["sketchboard_alerts"].samples}
    assert samples[("quiet", "firing")] == 1 and samples[("quiet", "pending")] == 0


def test_absence_per_group_reads_the_newest_pane_of_each_group(api, ctx, alerts, clock):
    now = int(clock.now * 1000)
    events = [ev(now - 300_000, region="eu"), ev(now - 20_000, region="us"), ev(now - 15_000, region="us")]
    assert api.post("/api/v1/events", params={"stream": "http_requests"}, json=events).status_code == 200
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now)
    api.post("/api/v1/alerts/rules", json={"name": "silent_region", "kind": "absence", "stream": "http_requests",
                                           "duration": "2m", "group_by": ["region"], "filters": {"method": "GET"}})
    evaluate_every_rule(alerts)
    active = api.get("/api/v1/alerts").json()["active"]
    assert [(a["labels"]["region"], a["state"], a["value"]) for a in active] == [("eu", "firing", 290.0)]


def test_metrics_sum_notification_outcomes_over_notifiers_and_include_standby(api, alerts):
    """Two notifiers, one of which does not lead: one sample per outcome, standby counted."""
    from prometheus_client.parser import text_string_to_metric_families

    from alerts.webhook import WebhookNotifier

    standby = [WebhookNotifier("http://127.0.0.1:9/hook", active=lambda: False) for _ in range(2)]
    alerts.notifiers.extend(standby)
    try:
        api.post("/api/v1/alerts/rules", json={"name": "quiet", "kind": "absence", "stream": "orders", "duration": "1m"})
        evaluate_every_rule(alerts)
        families = {f.name: f for f in text_string_to_metric_families(api.get("/metrics").text)}
        samples = [(s.labels["outcome"], s.value) for s in families["sketchboard_alert_notifications"].samples]
        assert len(samples) == len({outcome for outcome, _ in samples})  # no duplicate series
        assert dict(samples)["standby"] == 2.0
    finally:
        for notifier in standby:
            notifier.close()
