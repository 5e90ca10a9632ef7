"""Patterns defined through the API (`/api/v1/patterns`, issue 24): create, list, get, replace,
delete; each refusal with its status and reason, leaving the definitions as they were;
provisioned patterns read-only; the scopes; the API's catalog following the changes (the
derived stream and its metrics queryable, listed for the dashboard) in this replica at once and
in another within its refresh. On every store backend (SQLite, PostgreSQL)."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from api.app import create_app
from api.context import ApiContext
from api.pattern_definitions import PatternDefinitions
from api.security.config import SecurityConfig
from api.security.scopes import Scope
from api.security.token_file import TokenRegistry
from api.security.tokens import TokenRecord, hash_token
from store.pattern_definitions import PatternDefinitionStore

BURST = {"name": "login_burst", "description": "three failures then a success from the same address",
         "key": "user_id", "within": "5m", "steps": [
             {"name": "failures", "stream": "logins", "where": {"outcome": "failure"}, "times": 3},
             {"name": "success", "stream": "logins", "where": {"outcome": "success", "ip": {"same_as": "failures.ip"}}}],
         "measures": {"attempts": {"count": "failures"}}}
PATTERNS = "/api/v1/patterns"


@pytest.fixture
def pane_store(store_backend):
    return store_backend.create()


@pytest.fixture
def definitions(ctx, clock):
    store = PatternDefinitionStore(ctx.store.side_db())
    ctx.pattern_definitions = PatternDefinitions(ctx.catalog, store, refresh_s=0, clock=clock)
    yield ctx.pattern_definitions
    store.close()


@pytest.fixture
def api(ctx, definitions):
    with TestClient(create_app(ctx)) as c:
        yield c


def listed(api) -> dict[str, bool]:
    return {p["name"]: p["provisioned"] for p in api.get(PATTERNS).json()["patterns"]}


def metric_names(api) -> set[str]:
    return {m["name"] for m in api.get("/api/v1/metrics").json()["metrics"]}


def test_create_list_get_replace_delete_and_the_catalog_follows(api, ctx):
    assert listed(api) == {"credential_stuffing": True, "checkout_abandoned": True}
    assert api.get("/api/v1/query", params={"metric": "login_burst_matches", "from": "now-1h"}).status_code == 404

    created = api.post(PATTERNS, json=BURST)
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["provisioned"], body["version"], body["matches_stream"]) == (False, 1, "login_burst_matches")
    assert body["metrics"] == ["login_burst_matches", "login_burst_matches_attempts"]
    assert body["definition"]["steps"][0]["times"] == 3
    assert listed(api) == {"credential_stuffing": True, "checkout_abandoned": True, "login_burst": False}
    assert api.get(f"{PATTERNS}/login_burst").json() == body
    # Its derived stream and metrics are the catalog's now: queryable, listed for the dashboard.
    assert {"login_burst_matches", "login_burst_matches_attempts"} <= metric_names(api)
    q = api.get("/api/v1/query", params={"metric": "login_burst_matches_attempts", "stat": "p99", "from": "now-1h",
                                         "step": "1m"})
    assert q.status_code == 200, q.text
    assert "login_burst_matches" in {s["name"] for s in api.get("/api/v1/streams").json()["streams"]}
    assert api.get(f"{PATTERNS}/login_burst/matches").json()["matches"] == []

    replaced = api.put(f"{PATTERNS}/login_burst", json={**BURST, "within": "10m", "measures": {}})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["version"] == 2 and replaced.json()["definition"]["within"] == "10m"
    assert replaced.json()["created_ms"] == body["created_ms"]
    assert "login_burst_matches_attempts" not in metric_names(api)  # the measure is gone with its metric
    again = api.put(f"{PATTERNS}/login_burst", json={k: v for k, v in BURST.items() if k != "name"})
    assert again.status_code == 200 and again.json()["version"] == 3
    # The same declaration once more changes nothing: the pipeline has no reason to start it over.
    assert api.put(f"{PATTERNS}/login_burst", json={**BURST, "after_match": "skip_past_last"}).json()["version"] == 3

    assert api.delete(f"{PATTERNS}/login_burst").status_code == 204
    assert listed(api) == {"credential_stuffing": True, "checkout_abandoned": True}
    assert "login_burst_matches" not in metric_names(api) and "login_burst_matches" not in ctx.catalog.streams
    assert api.get(f"{PATTERNS}/login_burst").status_code == 404
    assert api.get(f"{PATTERNS}/login_burst/matches").status_code == 404  # no match was ever stored


@pytest.mark.parametrize("change, param, reason", [
    ({"steps": [{"name": "a", "stream": "nowhere"}]}, "steps.0.stream", "unknown stream 'nowhere'"),
    ({"steps": [{"name": "a", "stream": "logins", "where": {"colour": "red"}}]}, "steps.0.where.colour",
     "'colour' is not a field of stream 'logins'"),
    ({"steps": [{"name": "a", "stream": "logins", "times": [3, 2]}]}, "steps.0",
     "times: [n, m] needs 1 <= n <= m"),
    ({"steps": [{"name": "a", "stream": "logins", "where": {"ip": {"same_as": "later.ip"}}}]},
     "steps.0.where.ip.same_as", "same_as names 'later', which is not an earlier step"),
    ({"within": "soon"}, "within", "not a duration"),
    ({"key": "nobody"}, "key", "key 'nobody' is not a string field of stream 'logins'"),
    ({"steps": "failures"}, "steps", "valid tuple"),
    ({"name": "bad name"}, "name", "String should match pattern"),
    ({"measures": {"n": {"sum": "failures.ip"}}}, "measures.n", "'ip' is not a value field of stream 'logins'"),
    ({"dimensions": ["success.ip", "failures.ip"]}, "dimensions.1",
     "dimensions 'success.ip' and 'failures.ip' would both be named 'ip'"),
    ({"dimensions": ["absent.client"]}, "dimensions.0", "dimension 'absent.client' must name a field of a step"),
])
def test_an_invalid_declaration_is_a_400_naming_the_field_as_the_config_file_would(api, change, param, reason):
    answer = api.post(PATTERNS, json={**BURST, **change})
    assert answer.status_code == 400, answer.text
    assert answer.json()["param"] == param and reason in answer.json()["detail"]
    assert listed(api) == {"credential_stuffing": True, "checkout_abandoned": True}


def test_conflicts_provisioned_patterns_and_unknown_names_are_refused_changing_nothing(api, definitions):
    assert api.post(PATTERNS, json=BURST).status_code == 201
    before = definitions.store.patterns()
    for method, path, body, status, words in [
        ("POST", PATTERNS, BURST, 409, "already exists"),
        ("POST", PATTERNS, {**BURST, "name": "credential_stuffing"}, 409, "declared in the configuration"),
        ("PUT", f"{PATTERNS}/credential_stuffing", BURST, 409, "provisioned"),
        ("DELETE", f"{PATTERNS}/credential_stuffing", None, 409, "provisioned"),
        ("PUT", f"{PATTERNS}/nope", {**BURST, "name": "nope"}, 404, "no pattern defined through the API"),
        ("DELETE", f"{PATTERNS}/nope", None, 404, "no pattern defined through the API"),
        ("PUT", f"{PATTERNS}/login_burst", {**BURST, "name": "renamed"}, 400, "is not the path's"),
        ("PUT", f"{PATTERNS}/login_burst", [BURST], 400, "must be a JSON object"),
        ("POST", PATTERNS, None, 400, "must be a JSON object"),
    ]:
        answer = api.request(method, path, json=body)
        assert answer.status_code == status, (method, path, answer.text)
        assert words in answer.json()["detail"], (method, path, answer.text)
    assert definitions.store.patterns() == before


def test_reads_need_the_read_scope_and_changes_the_admin_scope(ctx, definitions):
    tokens = {scope: f"sb_{scope}-token-for-this-test" for scope in ("read", "admin")}
    ctx.security = SecurityConfig(tokens=TokenRegistry(
        [TokenRecord(scope, hash_token(token), frozenset({Scope(scope)})) for scope, token in tokens.items()]))
    with TestClient(create_app(ctx)) as api:
        def as_(scope: str) -> dict:
            return {"Authorization": f"Bearer {tokens[scope]}"}

        assert api.get(PATTERNS).status_code == 401
        assert api.get(PATTERNS, headers=as_("read")).status_code == 200
        for method, path in (("POST", PATTERNS), ("PUT", f"{PATTERNS}/login_burst"),
                             ("DELETE", f"{PATTERNS}/login_burst")):
            answer = api.request(method, path, json=BURST, headers=as_("read"))
            assert answer.status_code == 403 and "'admin'" in answer.json()["detail"]
        assert api.post(PATTERNS, json=BURST, headers=as_("admin")).status_code == 201
        assert api.get(f"{PATTERNS}/login_burst", headers=as_("read")).status_code == 200
        assert api.delete(f"{PATTERNS}/login_burst", headers=as_("admin")).status_code == 204


def test_another_replica_follows_within_its_refresh(api, ctx, clock):
    """Two API processes over one store: a pattern defined through one shows in the other's
    catalog once its refresh interval has passed (the counter is read on a request)."""
    now = [0.0]
    other_store = PatternDefinitionStore(ctx.store.side_db())
    other = ApiContext(catalog=ctx.pattern_definitions.configured, log=ctx.log, store=ctx.store, clock=clock)
    other.pattern_definitions = PatternDefinitions(other.catalog, other_store, refresh_s=5, clock=clock,
                                                   monotonic=lambda: now[0])
    try:
        with TestClient(create_app(other)) as replica:
            assert api.post(PATTERNS, json=BURST).status_code == 201
            assert "login_burst_matches" not in metric_names(replica)  # not looked yet
            now[0] = 5.0
            assert "login_burst_matches" in metric_names(replica) and "login_burst" in listed(replica)
            assert api.delete(f"{PATTERNS}/login_burst").status_code == 204
            now[0] = 10.0
            assert "login_burst_matches" not in metric_names(replica)
    finally:
        other_store.close()


def test_a_pattern_an_alert_rule_watches_is_not_deleted_under_it(wired_ctx):
    with TestClient(create_app(wired_ctx)) as api:
        assert api.post(PATTERNS, json=BURST).status_code == 201
        rule = {"name": "bursts", "kind": "pattern", "pattern": "login_burst"}
        assert api.post("/api/v1/alerts/rules", json=rule).status_code == 201, "the rule sees the new pattern"
        answer = api.delete(f"{PATTERNS}/login_burst")
        assert answer.status_code == 409 and "alert rules watch pattern 'login_burst'" in answer.json()["detail"]
        assert "bursts" in answer.json()["detail"] and "login_burst" in listed(api)
        assert api.delete("/api/v1/alerts/rules/bursts").status_code == 204
        assert api.delete(f"{PATTERNS}/login_burst").status_code == 204
    # Each change is in the audit log with its body; the refused delete is not.
    actions = [e.action for e in wired_ctx.audit.entries(limit=10) if "/patterns" in e.action]
    assert actions == ["DELETE /api/v1/patterns/login_burst", "POST /api/v1/patterns"]


def test_a_pattern_defined_with_dimensions_has_them_and_late_on_its_metrics(api):
    created = api.post(PATTERNS, json={**BURST, "dimensions": ["failures.client"]})
    assert created.status_code == 201, created.text
    assert created.json()["definition"]["dimensions"] == ["failures.client"]
    dims = {m["name"]: m["dimensions"] for m in api.get("/api/v1/metrics").json()["metrics"]}
    assert dims["login_burst_matches"] == dims["login_burst_matches_attempts"] == ["client", "late"]
    # Without a declaration: the first step's stream's dimensions (logins: outcome, client), then late.
    api.put(f"{PATTERNS}/login_burst", json=BURST).raise_for_status()
    dims = {m["name"]: m["dimensions"] for m in api.get("/api/v1/metrics").json()["metrics"]}
    assert dims["login_burst_matches"] == ["outcome", "client", "late"]
    answer = api.get("/api/v1/query", params={"metric": "login_burst_matches", "from": "now-1h",
                                              "group_by": "client,late"})
    assert answer.status_code == 200, answer.text
