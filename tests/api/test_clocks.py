"""GET /api/v1/clocks and the device clock gauges of /metrics, over a store holding the
estimates a batch committed (the demo's mobile_app stream declares a sent_time_field); and the
ingest API taking the sent time (a malformed one is rejected with its reason)."""

from __future__ import annotations

from store import BatchCommit, DeviceClock
from tests.api.conftest import NOW_MS

HOUR = 3_600_000


def commit_clocks(ctx, clocks: dict[str, int]) -> None:
    ctx.store.commit_batch(BatchCommit("main", 0, [], 0, device_clocks={"mobile_app": {
        d: DeviceClock(((NOW_MS, o),), o, o if abs(o) > 2_000 else 0, NOW_MS) for d, o in clocks.items()}}),
        lateness_ms={}, now_ms=NOW_MS)


def test_the_offsets_per_stream_with_the_devices_above_the_threshold(ctx, client):
    commit_clocks(ctx, {"a": 120, "b": -3 * HOUR, "c": 2 * HOUR, "d": 40_000})
    answer = client.get("/api/v1/clocks", params={"above": "30s", "limit": 2})
    assert answer.status_code == 200, answer.text
    (app,) = answer.json()["streams"]
    assert (app["stream"], app["devices"], app["corrected"], app["above"]) == ("mobile_app", 4, 3, 3)
    assert [(d["device"], d["offset_ms"], d["correction_ms"]) for d in app["worst"]] == [
        ("b", -3 * HOUR, -3 * HOUR), ("c", 2 * HOUR, 2 * HOUR)]
    text = client.get("/metrics").text
    assert 'sketchboard_device_clocks{above="1h",stream="mobile_app"} 2.0' in text
    assert 'sketchboard_device_clock_offset_seconds{quantile="0",stream="mobile_app"} -10800.0' in text


def test_bad_parameters_say_why(client):
    assert client.get("/api/v1/clocks", params={"stream": "nope"}).status_code == 404
    answer = client.get("/api/v1/clocks", params={"stream": "orders"})
    assert answer.status_code == 400 and "declares no sent_time_field" in answer.json()["detail"]
    answer = client.get("/api/v1/clocks", params={"above": "soon"})
    assert answer.status_code == 400 and "above" in answer.text


def test_the_ingest_api_takes_the_sent_time_and_explains_a_bad_one(client):
    good = {"time": NOW_MS, "sent_at": NOW_MS + 10, "device_id": "d1", "screen": "home", "platform": "ios",
            "app_version": "4.2", "duration_ms": 1200, "user_id": "u1"}
    answer = client.post("/api/v1/events", params={"stream": "mobile_app"},
                         json=[good, {**good, "sent_at": "yesterday"}]).json()
    assert answer["accepted"] == 1
    assert answer["rejected"] == [{"index": 1, "reason": "sent_at: sent time 'yesterday' is not an RFC 3339"
                                                        " timestamp (e.g. 2026-11-21T10:00:00Z)"}]
