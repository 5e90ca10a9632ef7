"""POST /api/v1/events against a real SQLite log: what is accepted, what is rejected and why,
and that a refused request writes nothing (log offsets and store unchanged)."""

from __future__ import annotations

import json

import pytest

from ingest.partitioner import partition_for

URL = "/api/v1/events"
STREAM = "http_requests"
JSON = {"content-type": "application/json"}
NDJSON = {"content-type": "application/x-ndjson"}


def event(now_ms: int, i: int, **overrides) -> dict:
    e = {
        "time": now_ms - 1000 * (i + 1),
        "user_id": f"u{i}",
        "endpoint": "/cart" if i % 2 else "/search",
        "method": "GET",
        "status": 200,
        "region": "eu" if i % 3 else "us",
        "latency_ms": 10 + i,
        "response_bytes": 512.5,
    }
    e.update(overrides)
    return {k: v for k, v in e.items() if v is not ...}


def post(client, body, *, headers=JSON, stream=STREAM, **params):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    query = {"stream": stream, **params} if stream is not None else params
    return client.post(URL, params=query, content=content, headers=headers)


def ndjson(events) -> bytes:
    return "".join(json.dumps(e) + "\n" for e in events).encode()


def log_rows(ctx, stream_name: str = STREAM) -> list[dict]:
    """Every record in the stream's log, with its partition, in partition/offset order."""
    stream = ctx.catalog.streams[stream_name]
    rows = []
    for p, o in sorted(ctx.log.offsets(stream_name).items()):
        for batch in ctx.log.read(stream, p, o.start, o.end):
            rows += [{"partition": p, **r} for r in batch.to_pylist()]
    return rows


def total_events(ctx, stream_name: str = STREAM) -> int:
    return sum(o.end - o.start for o in ctx.log.offsets(stream_name).values())


@pytest.fixture
def seeded(client, ctx, now_ms):
    """A log that already holds a few events, so 'unchanged' is not just 'all zero'."""
    r = post(client, [event(now_ms, i) for i in range(5)])
    assert r.status_code == 200, r.text
    assert total_events(ctx) == 5
    return r.json()


# -- accepted -------------------------------------------------------------------------


def test_json_array_accepted(client, ctx, now_ms):
    events = [event(now_ms, i) for i in range(8)]
    r = post(client, events)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["stream"] == STREAM
    assert answer["accepted"] == 8
    assert answer["rejected"] == []
    assert answer["ingest_time_ms"] == now_ms == 1_800_000_000_000
    # partition -> [first offset, records written], each partition the key's crc32 partition
    expected: dict[str, int] = {}
    for e in events:
        p = str(partition_for(e["user_id"], 4))
        expected[p] = expected.get(p, 0) + 1
    assert answer["partitions"] == {p: [0, n] for p, n in expected.items()}
    assert sum(n for _, n in answer["partitions"].values()) == 8


def test_ingest_time_follows_the_clock(client, clock):
    clock.now = 1_900_000_000.25
    r = post(client, [event(1_900_000_000_000, 0)])
    assert r.status_code == 200, r.text
    assert r.json()["ingest_time_ms"] == 1_900_000_000_250


def test_events_readable_from_log_with_offsets_and_fields(client, ctx, now_ms):
    first = [event(now_ms, i) for i in range(6)]
    second = [event(now_ms, i, time=f"2027-01-15T07:5{i}:00.5Z", extra_field={"a": i}) for i in range(6)]
    a1 = post(client, first).json()
    a2 = post(client, second).json()
    # the second append continues each partition's offsets where the first ended
    for p, (start, count) in a2["partitions"].items():
        before = a1["partitions"].get(p, [0, 0])
        assert start == before[0] + before[1]

    offsets = ctx.log.offsets(STREAM)
    assert set(offsets) == {0, 1, 2, 3}
    assert sum(o.end for o in offsets.values()) == 12
    assert all(o.start == 0 for o in offsets.values())

    rows = log_rows(ctx)
    assert len(rows) == 12
    by_user: dict[str, list[dict]] = {}
    for row in rows:
        by_user.setdefault(row["user_id"], []).append(row)
        assert row["partition"] == partition_for(row["user_id"], 4)
        assert row["__ingest_time"] == now_ms
    # offsets within each partition are 0..n-1, in append order
    for p in offsets:
        assert [r["__offset"] for r in rows if r["partition"] == p] == list(range(offsets[p].end))

    for i in range(6):
        old, new = by_user[f"u{i}"]  # same key, same partition, in order
        assert old["__offset"] < new["__offset"]
        assert old["__event_time"] == now_ms - 1000 * (i + 1)
        assert new["__event_time"] == now_ms - 600_000 + 60_000 * i + 500  # 07:5i:00.5Z
        assert old["endpoint"] == ("/cart" if i % 2 else "/search")
        assert old["region"] == ("eu" if i % 3 else "us")
        assert old["status"] == "200"  # an integer label is stored as text
        assert old["method"] == "GET"
        assert old["latency_ms"] == float(10 + i)
        assert old["response_bytes"] == 512.5
        assert old["__extra"] is None
        assert json.loads(new["__extra"]) == {"extra_field": {"a": i}}


def test_rfc3339_event_time_is_stored_as_epoch_ms(client, ctx):
    r = post(client, [{"time": "2027-01-15T08:00:00.5+01:00", "user_id": "x"}])
    assert r.status_code == 200, r.text
    [row] = log_rows(ctx)
    assert row["__event_time"] == 1_800_000_000_000 - 3_600_000 + 500
    # missing dimensions read as "", missing values as null
    assert row["endpoint"] == "" and row["region"] == ""
    assert row["latency_ms"] is None


def test_epoch_seconds_event_time(client, ctx):
    r = post(client, [{"time": 1_800_000_000.25, "user_id": "x"}])
    assert r.status_code == 200, r.text
    [row] = log_rows(ctx)
    assert row["__event_time"] == 1_800_000_000_250


def test_ndjson_accepted(client, ctx, now_ms):
    events = [event(now_ms, i) for i in range(4)]
    r = post(client, ndjson(events), headers=NDJSON)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["accepted"] == 4 and answer["rejected"] == []
    assert total_events(ctx) == 4
    assert sorted(row["user_id"] for row in log_rows(ctx)) == ["u0", "u1", "u2", "u3"]


def test_a_body_without_a_json_or_ndjson_content_type_is_refused(client, ctx, now_ms):
    """No Content-Type, or text/plain (what a page on another origin can send without a CORS
    preflight): 415, nothing written (issue 22's CSRF finding)."""
    body = ndjson([event(now_ms, i) for i in range(3)])
    for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}):
        r = client.post(URL, params={"stream": STREAM}, content=body, headers=headers)
        assert r.status_code == 415, (headers, r.text)
        assert "application/json or application/x-ndjson" in r.json()["detail"]
    assert total_events(ctx) == 0


def test_ndjson_malformed_line_rejected_others_accepted(client, ctx, now_ms):
    lines = [json.dumps(event(now_ms, 0)), "", json.dumps(event(now_ms, 1)), '{"time": 1, "user_id": ',
             json.dumps(event(now_ms, 2))]
    r = post(client, "\n".join(lines).encode(), headers=NDJSON)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["accepted"] == 3
    [rejection] = answer["rejected"]
    assert rejection["index"] == 2  # the third non-blank line (blank lines are not events)
    assert "malformed JSON" in rejection["reason"]
    assert "line 4" in rejection["reason"]  # the physical line, for the producer to find it
    assert total_events(ctx) == 3
    assert sorted(row["user_id"] for row in log_rows(ctx)) == ["u0", "u1", "u2"]


@pytest.mark.parametrize("char", ["\u2028", "\u0085"])
def test_ndjson_string_with_unicode_line_separator(client, ctx, now_ms, char):
    line = json.dumps(event(now_ms, 0, endpoint=f"/a{char}b"), ensure_ascii=False)
    r = post(client, (line + "\n").encode("utf-8"), headers=NDJSON)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 1 and r.json()["rejected"] == []
    [row] = log_rows(ctx)
    assert row["endpoint"] == f"/a{char}b"


# -- per-event rejections -------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"time": ...}, ["time", "required field is missing"]),
        ({"latency_ms": "abc"}, ["latency_ms", "must be a number", "string"]),
        ({"latency_ms": True}, ["latency_ms", "must be a number", "boolean"]),
        ({"time": "yesterday"}, ["time", "not an RFC 3339 timestamp"]),
        ({"time": "2027-01-15T08:00:00"}, ["time", "no time zone"]),
        ({"time": True}, ["time", "boolean"]),
        ({"user_id": ...}, ["user_id", "required field is missing"]),
        ({"region": ["eu"]}, ["region", "must be a string or an integer"]),
        ({"latency_ms": {"v": 1}}, ["latency_ms", "must be a number"]),
        ({"user_id": "u\x001"}, ["user_id", "NUL character"]),  # PostgreSQL's text refuses it
        ({"region": "e\x00u"}, ["region", "NUL character"]),
        # A lone "\ud800" escape: no Unicode text (a partition's hash of the key raised a 500)
        ({"user_id": "u\ud800"}, ["user_id", "lone surrogate"]),
        ({"region": "\udc00"}, ["region", "lone surrogate"]),
    ],
    ids=["missing-time", "latency-string", "latency-bool", "bad-time-string", "time-without-zone", "time-bool",
         "missing-key", "dimension-array", "latency-object", "key-with-nul", "dimension-with-nul",
         "key-with-surrogate", "dimension-with-surrogate"],
)
def test_per_event_rejection_with_index_and_reason(client, ctx, now_ms, overrides, fragments):
    events = [event(now_ms, 0), event(now_ms, 1, **overrides), event(now_ms, 2)]
    r = post(client, events)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["accepted"] == 2
    [rejection] = answer["rejected"]
    assert rejection["index"] == 1
    for fragment in fragments:
        assert fragment in rejection["reason"]
    assert total_events(ctx) == 2


def test_non_object_event_rejected(client, ctx, now_ms):
    r = post(client, [event(now_ms, 0), 42, "x", None, [1]])
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["accepted"] == 1
    assert [x["index"] for x in answer["rejected"]] == [1, 2, 3, 4]
    assert all("must be a JSON object" in x["reason"] for x in answer["rejected"])


def test_mixed_batch_writes_only_the_valid_ones(client, ctx, now_ms):
    events = [
        event(now_ms, 0),
        event(now_ms, 1, time=...),
        event(now_ms, 2, latency_ms="abc"),
        event(now_ms, 3),
        event(now_ms, 4, latency_ms=True),
        event(now_ms, 5, time="not a time"),
        event(now_ms, 6),
    ]
    r = post(client, events)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["accepted"] == 3
    assert [x["index"] for x in answer["rejected"]] == [1, 2, 4, 5]
    assert sum(n for _, n in answer["partitions"].values()) == 3
    assert sorted(row["user_id"] for row in log_rows(ctx)) == ["u0", "u3", "u6"]


def test_all_rejected_writes_nothing_but_answers_200(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    r = post(client, [event(now_ms, 0, time=...), event(now_ms, 1, latency_ms="x")])
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 0 and r.json()["partitions"] == {}
    assert snapshot() == before


def test_atomic_all_valid_is_written(client, ctx, now_ms):
    r = post(client, [event(now_ms, i) for i in range(3)], atomic="true")
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 3
    assert total_events(ctx) == 3


def test_atomic_with_one_bad_event_is_422_and_writes_nothing(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    events = [event(now_ms, 10), event(now_ms, 11, latency_ms="abc"), event(now_ms, 12)]
    r = post(client, events, atomic="true")
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "nothing was written" in detail["message"]
    [rejection] = detail["rejected"]
    assert rejection["index"] == 1 and "latency_ms" in rejection["reason"]
    assert snapshot() == before
    assert total_events(ctx) == 5


def test_atomic_ndjson_with_malformed_line_is_422(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    body = (json.dumps(event(now_ms, 10)) + "\n{not json\n").encode()
    r = post(client, body, headers=NDJSON, atomic="true")
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["rejected"][0]["index"] == 1
    assert snapshot() == before


# -- refused bodies -------------------------------------------------------------------


def test_malformed_json_array_is_400_with_line_and_column(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    body = ("[\n" + json.dumps(event(now_ms, 0)) + ",\n{oops}\n]").encode()
    r = post(client, body)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "malformed JSON" in detail
    assert "line 3" in detail and "column 2" in detail
    assert snapshot() == before


def test_truncated_json_array_is_400(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    r = post(client, b'[{"time": 1800000000000, "user_id": "a"},')
    assert r.status_code == 400, r.text
    assert "line 1" in r.json()["detail"] and "column" in r.json()["detail"]
    assert snapshot() == before


@pytest.mark.parametrize("indent", [None, 2], ids=["one-line", "pretty"])
def test_non_array_json_object_is_400(client, ctx, now_ms, seeded, snapshot, indent):
    before = snapshot()
    r = post(client, json.dumps(event(now_ms, 20), indent=indent).encode())
    assert r.status_code == 400, r.text
    assert "array" in r.json()["detail"]
    assert snapshot() == before


@pytest.mark.parametrize("body", [b"", b"   \n\t\n "], ids=["empty", "whitespace"])
def test_empty_body_is_400(client, ctx, seeded, snapshot, body):
    before = snapshot()
    r = post(client, body)
    assert r.status_code == 400, r.text
    assert "empty" in r.json()["detail"]
    assert snapshot() == before


def test_empty_array_is_accepted_as_nothing(client, ctx, seeded, snapshot):
    before = snapshot()
    r = post(client, b"[]")
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 0 and r.json()["rejected"] == []
    assert snapshot() == before


def test_non_utf8_body_is_400(client, ctx, seeded, snapshot):
    before = snapshot()
    body = b'[{"time": 1800000000000, "user_id": "caf\xe9"}]'  # latin-1
    r = post(client, body)
    assert r.status_code == 400, r.text
    assert "UTF-8" in r.json()["detail"]
    assert f"byte {body.index(0xE9)}" in r.json()["detail"]
    assert snapshot() == before


def test_body_over_limit_by_content_length_is_413(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    limit = ctx.max_body_bytes
    body = json.dumps([event(now_ms, 0, padding="x" * limit)]).encode()
    assert len(body) > limit
    r = post(client, body)
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == f"body of {len(body)} bytes exceeds the limit of {limit} bytes"
    assert snapshot() == before


def test_body_at_limit_is_not_413(client, ctx, now_ms):
    limit = ctx.max_body_bytes
    head = json.dumps([event(now_ms, 0, padding="")]).encode()
    body = json.dumps([event(now_ms, 0, padding="x" * (limit - len(head)))]).encode()
    assert len(body) == limit
    r = post(client, body)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 1


def test_streamed_body_over_limit_without_content_length_is_413(client, ctx, seeded, snapshot):
    before = snapshot()
    limit = ctx.max_body_bytes

    def chunks():
        yield b"["
        for _ in range(limit // 1000 + 2):
            yield b" " * 1000
        yield b"]"

    r = client.post(URL, params={"stream": STREAM}, content=chunks(), headers=JSON)
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == f"body exceeds the limit of {limit} bytes"
    assert snapshot() == before


@pytest.mark.parametrize("fmt", ["json", "ndjson"])
def test_too_many_events_is_413(client, ctx, now_ms, seeded, snapshot, fmt):
    before = snapshot()
    events = [{"time": now_ms, "user_id": "u"}] * (ctx.max_events_per_request + 1)
    body = json.dumps(events).encode() if fmt == "json" else ndjson(events)
    assert len(body) <= ctx.max_body_bytes  # the count, not the size, is over the limit
    r = post(client, body, headers=JSON if fmt == "json" else NDJSON)
    assert r.status_code == 413, r.text
    detail = r.json()["detail"]
    assert str(ctx.max_events_per_request + 1) in detail and str(ctx.max_events_per_request) in detail
    assert snapshot() == before


def test_exactly_max_events_is_accepted(client, ctx, now_ms):
    events = [{"time": now_ms, "user_id": f"u{i}"} for i in range(ctx.max_events_per_request)]
    r = post(client, events)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == ctx.max_events_per_request
    assert total_events(ctx) == ctx.max_events_per_request


def test_unknown_stream_is_404_naming_the_defined_streams(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    r = post(client, [event(now_ms, 0)], stream="nope")
    assert r.status_code == 404, r.text
    detail = r.json()["detail"]
    assert "nope" in detail
    for name in ctx.catalog.streams:
        assert name in detail
    assert snapshot() == before


def test_missing_stream_parameter_is_422(client, ctx, now_ms, seeded, snapshot):
    before = snapshot()
    r = post(client, [event(now_ms, 0)], stream=None)
    assert r.status_code == 422, r.text
    assert any("stream" in err["loc"] for err in r.json()["detail"])
    assert snapshot() == before


def test_events_go_to_the_named_stream_only(client, ctx, now_ms):
    r = post(client, [{"time": now_ms, "customer_id": "c1", "country": "DE", "amount": 12.5, "items": 2}],
             stream="orders")
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 1
    assert total_events(ctx, "orders") == 1
    assert total_events(ctx, STREAM) == 0
    [row] = log_rows(ctx, "orders")
    assert row["customer_id"] == "c1" and row["amount"] == 12.5 and row["items"] == 2.0
    assert row["payment_method"] == ""


# -- the answer's format ----------------------------------------------------------------


@pytest.mark.parametrize("shape", ["columnar", "per-event with rejections"])
def test_the_answer_is_the_documented_model_as_fastapi_would_send_it(client, now_ms, shape):
    """The 200 answer is built as JSON without FastAPI's model round trip: it must be exactly
    what the documented IngestAnswer serializes to, on both paths."""
    from api.ingest_routes import IngestAnswer

    events = [event(now_ms, i) for i in range(40)]  # more than a few: the columnar path takes them
    if shape != "columnar":
        events[2]["latency_ms"] = "slow"
    r = post(client, events)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    answer = r.json()
    assert (len(answer["rejected"]) == 1) == (shape != "columnar")
    assert json.loads(IngestAnswer.model_validate(answer).model_dump_json()) == answer
    assert list(answer) == list(IngestAnswer.model_fields)


def test_a_body_of_a_few_events_takes_the_per_event_path_and_a_bigger_one_the_columnar_path(client, now_ms,
                                                                                           monkeypatch):
    """(api/bodies.py few_events) The columnar path's fixed cost (Arrow's reader, the column
    checks: ~1.5 ms) is more than a few events cost one by one; either way the answer is the same."""
    from api import ingest_routes

    asked, columnar_body = [], ingest_routes.columnar_body

    def counting(*args, **kwargs):
        asked.append(True)
        return columnar_body(*args, **kwargs)

    monkeypatch.setattr(ingest_routes, "columnar_body", counting)
    for n, columnar in ((1, False), (32, False), (33, True), (200, True)):
        asked.clear()
        events = [event(now_ms, i, status="200") for i in range(n)]
        r = post(client, events)
        assert r.status_code == 200 and r.json()["accepted"] == n, r.text
        assert asked == ([True] if columnar else []), n


def test_the_per_event_path_runs_off_the_event_loop(client, now_ms, monkeypatch):
    """A body the columnar path declines may hold 100 000 events: validated in a worker thread,
    never on the event loop that every other request waits on."""
    import threading

    from ingest.events import EventValidator

    threads, validate = set(), EventValidator.validate

    def recording(self, raw):
        threads.add(threading.current_thread().name)
        return validate(self, raw)

    monkeypatch.setattr(EventValidator, "validate", recording)
    events = [event(now_ms, i, status="200") for i in range(40)]
    events[7]["latency_ms"] = "slow"  # one bad event: the columnar path declines the body
    r = post(client, events)
    assert r.status_code == 200 and r.json()["accepted"] == 39, r.text
    assert threads and all(name.startswith("AnyIO worker thread") for name in threads), threads


def test_few_events_bounds_a_bodys_events_by_its_opening_braces_and_its_size():
    from api.bodies import SMALL_BODY_BYTES, few_events

    assert few_events(b"[" + b",".join([b'{"a":1}'] * 32) + b"]")
    assert not few_events(b"[" + b",".join([b'{"a":1}'] * 33) + b"]")
    assert not few_events(b'[{"a":{"b":{"c":1}}}]' * 11)  # nested objects count: never too few
    assert not few_events(b'[{"a":"' + b"x" * SMALL_BODY_BYTES + b'"}]')  # one big event: columnar


def test_the_columnar_path_is_warmed_as_the_server_starts_not_by_the_first_request(ctx, monkeypatch):
    """Its first call imports pandas and anyio's thread backend (0.3-1 s): the app's lifespan
    pays it, in a worker thread, before any request is served."""
    from fastapi.testclient import TestClient

    from api import ingest_routes
    from api.app import create_app

    warmed = []
    monkeypatch.setattr(ingest_routes, "warm_columnar_path", lambda: warmed.append(True))
    app = create_app(ctx)
    assert warmed == []
    with TestClient(app):
        assert warmed == [True]
    # The real warm-up's body goes the columnar way (it would warm nothing if refused).
    assert ingest_routes.columnar_events(ingest_routes.WARM_STREAM, b'{"t": 1700000000000, "k": "a", "v": 1}\n').num_rows == 1


def test_a_client_gone_mid_body_is_a_400_not_an_asgi_traceback():
    """starlette raises ClientDisconnect from the body's stream when the client goes mid-body (a
    producer stopped with Ctrl-C): it escaped read_capped as an 'Exception in ASGI application'."""
    from fastapi import HTTPException
    from starlette.requests import Request

    from api.bodies import read_capped
    from tests.support.loops import run_on_own_loop

    messages = [{"type": "http.request", "body": b'[{"time": 1', "more_body": True}, {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    request = Request({"type": "http", "method": "POST", "path": "/api/v1/events", "headers": []}, receive)
    with pytest.raises(HTTPException) as raised:
        run_on_own_loop(read_capped(request, 1 << 20))
    assert raised.value.status_code == 400 and "disconnected after 11 bytes" in raised.value.detail
