"""Issue 23: inputs that used to answer 500 (an OverflowError from a huge id, duration or
time, a RecursionError from a deeply nested body) or 200 with an absurd range now answer a
4xx whose body names the parameter and the bound crossed; and a rejected request changes
nothing. Over the real app, a real SQLite log and store (wired_client: every route)."""

from __future__ import annotations

import pytest

from api.errors import MAX_ID

BIG = "9" * 400
HUGE_DAYS = "99999999999999999999d"

RULE = {"name": "r1", "kind": "lag", "threshold": 5}


def _error(r, status: int, param: str | None, *fragments: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    if param is not None:
        assert body["param"] == param, body
    for fragment in fragments:
        assert fragment in body["detail"], body
    return body


@pytest.mark.parametrize("path", ["/api/v1/alerts", "/api/v1/corrections"])
def test_an_id_past_64_bits_is_422_naming_the_parameter(wired_client, path):
    r = wired_client.get(path, params={"after_id": str(MAX_ID + 1)})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", "after_id"]
    assert wired_client.get(path, params={"after_id": str(MAX_ID)}).status_code == 200


def test_ids_are_declared_64_bit_in_the_openapi_document(wired_client):
    paths = wired_client.get("/openapi.json").json()["paths"]
    for path in ("/api/v1/alerts", "/api/v1/corrections"):
        (after_id,) = [p for p in paths[path]["get"]["parameters"] if p["name"] == "after_id"]
        schema = after_id["schema"]
        schema = next((s for s in schema.get("anyOf", [schema]) if s.get("type") == "integer"), schema)
        assert schema["minimum"] == 0 and schema["maximum"] == MAX_ID, (path, after_id)


@pytest.mark.parametrize("url,param", [
    (f"/api/v1/lag?from=now-{HUGE_DAYS}", "from"),
    (f"/api/v1/query?metric=latency&step={HUGE_DAYS}", "step"),
    (f"/api/v1/query?metric=latency&window={HUGE_DAYS}", "window"),
    (f"/api/v1/query?metric=latency&to=now%2B{HUGE_DAYS}", "to"),
    (f"/api/v1/query?metric=latency&step={BIG}s", "step"),
    (f"/api/v1/query?metric=latency&from=now-{BIG}ms", "from"),
    (f"/api/v1/corrections?from=now-{HUGE_DAYS}", "from"),
    (f"/api/v1/membership?stream=http_requests&key=k&from=now-{BIG}d", "from"),
])
def test_a_huge_duration_is_400_naming_the_parameter_and_the_maximum(wired_client, url, param):
    _error(wired_client.get(url), 400, param, f"{param}: duration", "exceeds the maximum of 36500d (100 years)")


@pytest.mark.parametrize("url,param", [
    # was 200 with a start 270 million years before 1970
    ("/api/v1/lag?from=now-99999999999d", "from"),
    ("/api/v1/corrections?from=now-99999999999d", "from"),
])
def test_a_start_millions_of_years_back_is_400_not_an_absurd_200(wired_client, url, param):
    _error(wired_client.get(url), 400, param, "exceeds the maximum")


@pytest.mark.parametrize("value,fragment", [
    ("now-36500d", "is outside 1970-01-01T00:00:00Z..9999-12-31T23:59:59.999Z"),  # a century back: 1927
    ("-1", "outside 1970"),
    ("1e400", "is not a finite number"),
    ("nan", "is not a finite number"),
    (BIG, "is not a finite number"),
    ("99999999999999999999", "outside 1970..9999"),
    ("1900-01-01T00:00:00Z", "outside 1970..9999"),
    ("2026-11-21T10:00:00", "no time zone"),
    ("yesterday", "is not a time in 1970-01-01"),
])
@pytest.mark.parametrize("path,params", [
    ("/api/v1/query", {"metric": "latency"}), ("/api/v1/lag", {}), ("/api/v1/corrections", {}),
    ("/api/v1/membership", {"stream": "http_requests", "key": "k"}),
])
def test_an_instant_outside_the_epoch_range_is_400(wired_client, path, params, value, fragment):
    _error(wired_client.get(path, params={**params, "from": value}), 400, "from", "from: ", fragment)


def test_the_whole_supported_range_still_answers(wired_client):
    r = wired_client.get("/api/v1/query", params={"metric": "latency", "from": "0", "to": "9999-12-31T00:00:00Z",
                                                   "step": "36500d"})
    assert r.status_code == 200, r.text
    assert r.json()["step_ms"] == 36_500 * 86_400_000


@pytest.mark.parametrize("change", [
    {"for": HUGE_DAYS}, {"for": BIG + "s"}, {"for": 1e308}, {"for": 10**30},
    {"keep_firing_for": "36501d"}, {"interval": BIG + "ms"},
])
def test_a_rule_with_a_huge_duration_is_400_and_is_not_stored(wired_client, change):
    r = wired_client.post("/api/v1/alerts/rules", json={**RULE, **change})
    body = _error(r, 400, None, f"{next(iter(change))}: ", "exceeds the maximum of 36500d")
    assert len(body["detail"]) < 300  # the 400-digit value is cut short
    assert wired_client.get("/api/v1/alerts/rules").json()["rules"] == []


@pytest.mark.parametrize("duration", [HUGE_DAYS, BIG + "s", 10**30, 1e308, "367d", "0s"])
def test_a_silence_with_a_huge_duration_is_400(wired_client, duration):
    assert wired_client.post("/api/v1/alerts/rules", json=RULE).status_code == 201
    r = wired_client.post("/api/v1/alerts/rules/r1/silence", json={"duration": duration})
    _error(r, 400, "duration", "duration: ")
    assert wired_client.get("/api/v1/alerts/rules/r1").json()["silenced_until_ms"] is None


# Nested 20 000 deep: far past Python's recursion limit, yet under the test app's 64 KiB body cap.
@pytest.mark.parametrize("body", [b"[" * 20_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
                                  b"[" + b"1" * 5000 + b"]"])
def test_hostile_json_is_400_and_writes_nothing(wired_client, snapshot, body):
    before = snapshot()
    r = wired_client.post("/api/v1/events?stream=orders", content=body, headers={"content-type": "application/json"})
    _error(r, 400, None, "malformed JSON")
    r = wired_client.post("/api/v1/alerts/rules", content=body, headers={"content-type": "application/json"})
    _error(r, 400, None, "not valid JSON")
    assert snapshot() == before


def test_a_deeply_nested_ndjson_line_rejects_that_line_only(wired_client, now_ms):
    body = b"[" * 20_000 + b"\n" + f'{{"time": {now_ms}, "customer_id": "c1"}}'.encode()
    r = wired_client.post("/api/v1/events?stream=orders", content=body,
                          headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 1 and "nested too deeply" in r.json()["rejected"][0]["reason"]


def test_a_rule_body_over_its_limit_is_413(wired_client):
    r = wired_client.post("/api/v1/alerts/rules", json={**RULE, "description": "x" * 70_000})
    _error(r, 413, None, "exceeds the limit")


@pytest.mark.parametrize("method,path,allow", [
    ("OPTIONS", "/api/v1/alerts/rules", "GET, POST"),
    ("PATCH", "/api/v1/alerts/rules/r1", "DELETE, GET, PUT"),
    ("PUT", "/api/v1/alerts/rules/r1/silence", "DELETE, POST"),
    ("POST", "/api/v1/query", "GET"),
])
def test_405_names_every_method_of_the_path(wired_client, method, path, allow):
    # Starlette named only the first matching route's methods: 'GET' for the rule routes.
    r = wired_client.request(method, path)
    assert r.status_code == 405 and r.headers["allow"] == allow, (r.headers, r.text)


@pytest.mark.parametrize("field,value,reason", [
    ("time", "9" * 4000, "time: event time 999"),         # math.isfinite(int) raised OverflowError
    ("time", "-" + "9" * 4000, "outside 1970..9999"),
    ("latency_ms", "9" * 400, "latency_ms: value must be a finite number"),  # float(int) too
    ("latency_ms", "-" + "9" * 4000, "latency_ms: value must be a finite number"),
    ("latency_ms", "NaN", "latency_ms: value must be a finite number"),
    ("latency_ms", "1e400", "latency_ms: value must be a finite number"),
])
def test_huge_numbers_in_an_event_reject_that_event(wired_client, snapshot, now_ms, field, value, reason):
    event = {"time": str(now_ms), "endpoint": '"/a"', "user_id": '"u"', field: value}
    body = "[{" + ", ".join(f'"{k}": {v}' for k, v in event.items()) + "}]"
    before = snapshot()
    r = wired_client.post("/api/v1/events?stream=http_requests", content=body,
                          headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    (rejected,) = r.json()["rejected"]
    assert reason in rejected["reason"] and len(rejected["reason"]) < 200, rejected
    assert snapshot() == before
