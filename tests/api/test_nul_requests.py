"""A NUL character (U+0000) in a request: no name, key or label the service stores can hold one
(ingest refuses it; PostgreSQL's text cannot hold it at all). On PostgreSQL these requests
answered 500 (psycopg.DataError) where SQLite answered 404 or 200, and DELETE of a table key
holding one appended a tombstone no PostgreSQL store could commit. Now every backend answers a
400 that names the parameter, and nothing changes; so does a definition's body holding a lone
surrogate (no Unicode text). On every store backend (SQLite, PostgreSQL),
the side stores beside the pane store as the service wires them (wired_client)."""

from __future__ import annotations

import json

import pytest

from api.text_guard import nul_in_request

RULE = {"name": "r1", "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m", "threshold": 1}


@pytest.fixture
def pane_store(store_backend):
    return store_backend.create()


@pytest.mark.parametrize("method,url,param", [
    ("get", "/api/v1/dashboards/a%00b", None),
    ("delete", "/api/v1/dashboards/a%00b", None),
    ("get", "/api/v1/alerts/rules/a%00b", None),
    ("post", "/api/v1/alerts/rules/a%00b/silence", None),
    ("delete", "/api/v1/alerts/rules/a%00b", None),
    ("get", "/api/v1/reprocess/a%00b", None),
    ("get", "/api/v1/patterns/a%00b", None),
    ("get", "/api/v1/tables/users?key=u%00", "key"),
    ("get", "/api/v1/tables/users?cursor=u%00", "cursor"),
    ("delete", "/api/v1/tables/users/u%00", None),
    ("get", "/api/v1/alerts?rule=r%001", "rule"),
    ("get", "/api/v1/query?metric=latency&filter=endpoint%3D%2Fa%00", "filter"),
    ("get", "/api/v1/membership?stream=http_requests&key=u%00", "key"),
])
def test_a_nul_in_the_path_or_query_is_400_naming_it_and_changes_nothing(wired_client, state, method, url, param):
    before = state()
    r = getattr(wired_client, method)(url)
    assert r.status_code == 400, r.text
    assert r.json()["param"] == param and "contains a NUL character (U+0000)" in r.json()["detail"], r.json()
    assert state() == before


def test_a_table_delete_is_refused_for_a_key_no_row_can_have(wired_client, state):
    before = state()
    r = wired_client.delete("/api/v1/tables/users/" + "u" * 1025)
    assert r.status_code == 400 and r.json()["param"] == "key", r.text
    assert "longer than 1024 characters" in r.json()["detail"]
    assert state() == before
    assert wired_client.delete("/api/v1/tables/users/" + "u" * 1024).json()["deletes"] == 1


def test_a_rule_filter_or_a_body_label_with_a_nul_is_refused_with_its_reason(wired_client, state, now_ms):
    before = state()
    r = wired_client.post("/api/v1/alerts/rules", json={**RULE, "filters": {"endpoint": "/a\x00"}})
    assert r.status_code == 400 and "NUL character" in r.json()["detail"], r.text
    absence = {"name": "r2", "kind": "absence", "stream": "http_requests", "duration": "1m", "filters": {"endpoint": "\x00"}}
    r = wired_client.post("/api/v1/alerts/rules", json=absence)
    assert r.status_code == 400 and "NUL character" in r.json()["detail"], r.text
    board = {"name": "b1", "panels": [{"metric": "latency", "stat": "p99", "filters": {"method": "G\x00"}}]}
    r = wired_client.post("/api/v1/dashboards", json=board)
    assert r.status_code == 400 and r.json()["param"] == "panels[0].filters" and "NUL character" in r.json()["detail"]
    assert state() == before
    r = wired_client.post("/api/v1/events", params={"stream": "http_requests"},
                          json=[{"time": now_ms, "user_id": "u\x00", "endpoint": "/a"}])
    assert r.json()["rejected"][0]["reason"].startswith("user_id: contains a NUL character"), r.text
    assert state() == before


def test_every_operation_documents_the_400(wired_client):
    for path, ops in wired_client.get("/openapi.json").json()["paths"].items():
        for method, op in ops.items():
            assert "400" in op["responses"], (method, path)
    assert wired_client.get("/healthz?x=%00").status_code == 400  # even one that takes no parameter


@pytest.mark.parametrize("path,query,found", [
    ("/api/v1/dashboards/a\x00", b"", (None, "the path contains")),
    ("/api/v1/query", b"metric=latency&filter=endpoint%3Da%00", ("filter", "filter: contains")),
    ("/api/v1/query", b"a%00=1", (None, "a query parameter's name contains")),
    ("/api/v1/query", b"metric=latency&filter=endpoint%3Da", None),
    ("/api/v1/query", b"metric=%2500", None),  # an escaped percent sign: the text "%00", no NUL
])
def test_what_counts_as_a_nul(path, query, found):
    got = nul_in_request(path, query)
    assert (got is None) == (found is None)
    if found:
        assert got[0] == found[0] and got[1].startswith(found[1])


@pytest.mark.parametrize("path,body", [
    ("/api/v1/alerts/rules", {**RULE, "description": "x"}),
    ("/api/v1/dashboards", {"name": "b1", "title": "x", "panels": [{"metric": "latency", "stat": "p99"}]}),
])
def test_a_definition_holding_a_lone_surrogate_is_refused_and_the_listing_still_answers(wired_client, state, path,
                                                                                        body):
    """A rule whose description was a lone "\\ud800" escape was stored, and every later listing of
    the rules answered 500 (no UTF-8 for the answer)."""
    before = state()
    content = json.dumps(body).replace('"x"', '"\\ud800"')
    r = wired_client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["detail"], r.text
    assert state() == before
    assert wired_client.get(path).status_code == 200
