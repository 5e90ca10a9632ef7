"""The OpenAPI document describes what the API really does: every operation lists each status
it can answer with a non-empty body schema (4xx included), and real answers over real data
(corrections, dead letters, progress, lag samples, rules) match the document. The fuzz test
(test_fuzz_openapi.py) checks the same on generated requests, which seldom reach such data."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import schemathesis
    from fastapi.testclient import TestClient

from api.app import create_app
from tests.api.test_corrections import corrected  # noqa: F401  (a fixture: panes corrected, dead letters)

RULE = {"name": "r1", "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m", "threshold": 5,
        "for": "30s", "labels": {"severity": "page"}}
DASHBOARD = {"name": "d1", "panels": [{"metric": "latency", "stat": "band", "kind": "area"},
                                      {"metric": "requests", "stat": "rate", "group_by": ["endpoint"], "kind": "table"}]}


@pytest.fixture
def app(wired_ctx):
    return create_app(wired_ctx)


@pytest.fixture
def document(app) -> dict:
    return app.openapi()


def operations(document):
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            yield f"{method.upper()} {path}", op


def test_every_status_has_a_description_and_a_body_schema(document):
    for label, op in operations(document):
        assert op["responses"], label
        for status, response in op["responses"].items():
            assert response.get("description"), (label, status)
            if status == "204":
                assert not response.get("content"), label
                continue
            content = response.get("content")
            assert content, (label, status, "no body described")
            for media, body in content.items():
                schema = body.get("schema")
                assert schema and schema != {"type": "object"} and "additionalProperties" not in schema, \
                    (label, status, media, schema)


def test_operations_taking_input_describe_their_4xx(document):
    for label, op in operations(document):
        takes_input = bool(op.get("parameters") or op.get("requestBody"))
        codes = {int(s) for s in op["responses"]}
        if takes_input:
            assert codes & {400, 404, 422}, (label, codes)
        for code in codes - {422}:
            if 400 <= code < 500:
                ref = op["responses"][str(code)]["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorOut", (label, code, ref)


def test_request_bodies_are_documented(document):
    paths = document["paths"]
    events = paths["/api/v1/events"]["post"]["requestBody"]["content"]
    assert set(events) == {"application/json", "application/x-ndjson"}
    rule = paths["/api/v1/alerts/rules"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    kinds = {option["properties"]["kind"]["const"] for option in rule["oneOf"]}
    assert kinds == {"threshold", "trend", "absence", "lag", "lag_status", "dead_letters", "pattern"}
    silence = paths["/api/v1/alerts/rules/{name}/silence"]["post"]["requestBody"]["content"]["application/json"]
    assert silence["schema"]["required"] == ["duration"]


def test_metrics_is_documented_as_prometheus_text(document, app):
    assert set(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    with TestClient(app) as client:
        assert client.get("/metrics").headers["content-type"].startswith("text/plain")


def test_answers_over_real_data_match_the_document(app, document, corrected, wired_ctx, now_ms):  # noqa: F811
    schema = schemathesis.openapi.from_dict(document)
    wired_ctx.lag.sampler.sample_and_store()
    with TestClient(app) as client:
        assert client.post("/api/v1/alerts/rules", json=RULE).status_code == 201
        assert client.post("/api/v1/alerts/rules/r1/silence", json={"duration": "1h"}).status_code == 200
        created = client.post("/api/v1/dashboards", json=DASHBOARD)
        assert created.status_code == 201, created.text
        schema["/api/v1/dashboards"]["POST"].validate_response(created)
        schema["/api/v1/dashboards/{name}"]["GET"].validate_response(client.get("/api/v1/dashboards/d1"))
        wired_ctx.alerts.evaluate_due()
        calls = [
            ("GET", "/api/v1/corrections", {}), ("GET", "/api/v1/corrections", {"metric": "latency"}),
            ("GET", "/api/v1/dead-letters", {}), ("GET", "/api/v1/pipeline", {}), ("GET", "/api/v1/streams", {}),
            ("GET", "/api/v1/metrics", {}), ("GET", "/api/v1/lag", {}), ("GET", "/api/v1/alerts/rules", {}),
            ("GET", "/api/v1/alerts/rules/{name}", {}), ("GET", "/api/v1/alerts", {}), ("GET", "/healthz", {}),
            ("GET", "/readyz", {}), ("GET", "/api/v1/dashboards", {}),
            ("GET", "/api/v1/query", {"metric": "latency", "stat": "p99", "from": "now-1d", "step": "1m"}),
        ]
        for method, path, params in calls:
            response = client.request(method, path.replace("{name}", "r1"), params=params)
            assert response.status_code == 200, (path, response.text)
            schema[path][method].validate_response(response)
        body = client.get("/api/v1/corrections").json()
        assert body["count"] >= 1 and client.get("/api/v1/dead-letters").json()["count"] == 2
        assert client.get("/api/v1/alerts").json()["active"], "the rule should be NoData before any watermark"
        for url, status in (("/api/v1/alerts/rules/nope", 404), ("/api/v1/query?metric=latency&step=1x", 400),
                            ("/api/v1/alerts?after_id=-1", 422)):
            response = client.get(url)
            assert response.status_code == status, (url, response.text)
            path = url.split("?")[0].replace("nope", "{name}")
            schema[path]["GET"].validate_response(response)
