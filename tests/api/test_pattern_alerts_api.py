"""Pattern alert rules through `/api/v1/alerts`: created with POST like any rule, refused with a
clear 400 when the pattern is unknown, and a match committed by a batch shows as a firing alert
with its events in the annotations. No Spark: the match is committed to the store directly."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from alerts.service import AlertService
from alerts.source import StoreAlertData
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
    return parse_catalog(EXAMPLES_YAML)  # the demo's streams declare no patterns


@pytest.fixture
def alerts(ctx, tmp_path, clock):
    store = SqliteAlertStore(tmp_path / "alerts.db")
    ctx.alerts = AlertService(ctx.catalog, store, StoreAlertData(ctx.catalog, ctx.store), clock=clock)
    yield ctx.alerts
    store.close()


@pytest.fixture
def api(ctx, alerts):
    with TestClient(create_app(ctx)) as c:
        yield c


def test_a_pattern_rule_is_created_through_the_api_and_fires_on_a_match(api, ctx, alerts, now_ms):
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
