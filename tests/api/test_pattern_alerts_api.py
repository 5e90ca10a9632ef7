"""Pattern alert rules through `/api/v1/alerts`: created with POST like any rule, refused with a
clear 400 when the pattern is unknown, and a match committed by a batch shows as a firing alert
with its events in the annotations and is POSTed once, with them, to a real webhook receiver.
No Spark: the match is committed to the store directly."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from alerts.service import AlertService
from alerts.source import StoreAlertData
from alerts.webhook import WebhookNotifier
from api.app import create_app
from catalog import Catalog, parse_catalog
from store import BatchCommit
from store.alerts import SqliteAlertStore
from store.patterns import NewMatch, PatternCommit
from tests.support.alerts import evaluate_every_rule
from tests.support.patterns import EXAMPLES_YAML

RULE = {"name": "stuffing", "kind": "pattern", "pattern": "credential_stuffing", "keep_firing_for": "1m",
        "labels": {"severity": "page"}, "annotations": {"summary": "credential stuffing on {{ $labels.key }}"}}


@pytest.fixture
def catalog() -> Catalog:
    return parse_catalog(EXAMPLES_YAML)  # the docs' example patterns, whose events the test makes up


@pytest.fixture
def alerts(ctx, tmp_path, clock, receiver):
    store = SqliteAlertStore(tmp_path / "alerts.db")
    hook = WebhookNotifier(receiver.url, timeout_s=2.0, clock=clock, memory_store=store)
    ctx.alerts = AlertService(ctx.catalog, store, StoreAlertData(ctx.catalog, ctx.store), notifiers=[hook],
                              clock=clock)
    yield ctx.alerts
    ctx.alerts.stop()
    store.close()


@pytest.fixture
def api(ctx, alerts):
    with TestClient(create_app(ctx)) as c:
        yield c


def test_a_pattern_rule_is_created_through_the_api_and_fires_on_a_match(api, ctx, alerts, now_ms, receiver):
    unknown = api.post("/api/v1/alerts/rules", json={**RULE, "pattern": "nope"})
    assert unknown.status_code == 400 and "pattern: unknown pattern 'nope'" in unknown.json()["detail"]
    waiting = api.post("/api/v1/alerts/rules", json={**RULE, "for": "1m"})
    assert waiting.status_code == 400 and "for: must be 0" in waiting.json()["detail"]
    created = api.post("/api/v1/alerts/rules", json=RULE)
    assert created.status_code == 201, created.text
    assert created.json()["kind"] == "pattern" and created.json()["pattern"] == "credential_stuffing"
    evaluate_every_rule(alerts)  # the first read: starts after the newest match (none)

    found = [{"step": "success", "stream": "logins", "partition": 0, "offset": 5, "time": now_ms - 1_000}]
    commit = BatchCommit(pipeline="main", batch_id=0, partials=[], events_read=0, patterns=[
        PatternCommit("credential_stuffing", now_ms, matches=[NewMatch("alice", now_ms - 1_000, found, {"attempts": 5})])])
    assert ctx.store.commit_batch(commit, lateness_ms={}, now_ms=now_ms).committed
    evaluate_every_rule(alerts)
    [active] = api.get("/api/v1/alerts").json()["active"]
    assert active["state"] == "firing" and active["labels"]["key"] == "alice"
    assert json.loads(active["annotations"]["events"]) == found
    assert json.loads(active["annotations"]["measures"]) == {"attempts": 5}
    assert active["annotations"]["summary"] == "credential stuffing on alice"

    [request] = receiver.wait_for(lambda reqs: reqs, timeout=10)
    [alert] = request.body["alerts"]
    assert request.body["groupLabels"] == {"alertname": "stuffing"} and alert["status"] == "firing"
    assert alert["labels"]["key"] == "alice" and json.loads(alert["annotations"]["events"]) == found
    evaluate_every_rule(alerts)  # nothing new: still firing (keep_firing_for), not sent again
    assert api.get("/api/v1/alerts").json()["active"][0]["state"] == "firing"
    [hook] = alerts.notifiers
    hook.close()  # sends what is queued first
    assert len(receiver.requests) == 1 and hook.stats()["deduplicated"] == 1
