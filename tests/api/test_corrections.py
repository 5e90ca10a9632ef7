"""GET /api/v1/corrections, /api/v1/dead-letters, the per-stream counters of /api/v1/pipeline,
and CorrectionsFeed, over a real store (SQLite and PostgreSQL) filled with commit_batch (no Spark)."""

from __future__ import annotations

import pytest

from api.corrections_routes import CorrectionsFeed
from catalog import load_catalog
from sketches import HllSketch, KllSketch
from store import BatchCommit, DeadLetter, PaneData, PanePartial, ValueStats
from tests.api.conftest import CONFIG

STREAM = "http_requests"
PANE = 10_000
T0 = 1_800_000_000_000 - 600_000  # conftest's fake now minus 10 minutes
DIMS = {"endpoint": "/a", "method": "GET", "status": "200", "region": "eu"}


@pytest.fixture
def pane_store(store_backend):
    """Every test here on SQLite and on PostgreSQL (tests/api/conftest.py)."""
    return store_backend.create()


def data(values, users) -> PaneData:
    kll, hll = KllSketch(), HllSketch()
    for v in values:
        kll.update(v)
    for u in users:
        hll.update(u)
    stats = {"latency_ms": ValueStats(len(values), sum(values), min(values), max(values), kll.to_bytes()),
             "response_bytes": ValueStats(len(values), 100.0 * len(values), 100.0, 100.0, kll.to_bytes())}
    return PaneData(len(values), stats, {"user_id": hll.to_bytes()})


def commit_batch(ctx, batch_id, partials, max_event=None, dead=()):
    lateness = {name: s.allowed_lateness for name, s in ctx.catalog.streams.items()}
    aggregated = sum(p.data.count for p in partials)
    counts = {}
    for d in dead:
        counts.setdefault(d.stream, {}).setdefault(d.reason, 0)
        counts[d.stream][d.reason] += 1
    commit = BatchCommit("main", batch_id, partials, aggregated + len(dead),
                         max_event_ms={} if max_event is None else {STREAM: max_event}, dead_letters=list(dead),
                         read_by_stream={STREAM: aggregated + len(dead)}, dead_by_stream=counts)
    assert ctx.store.commit_batch(commit, lateness_ms=lateness, now_ms=ctx.now_ms()).committed


def pane(start, values, users):
    return PanePartial(STREAM, start, start + PANE, DIMS, data(values, users))


@pytest.fixture
def corrected(ctx):
    """Pane T0 published, finalised by a later event, then corrected twice; one new pane born final."""
    commit_batch(ctx, 0, [pane(T0, [10.0, 20.0], ["a", "b"])], max_event=T0 + 5_000)
    commit_batch(ctx, 1, [pane(T0 + 120_000, [1.0], ["c"])], max_event=T0 + 120_000)
    commit_batch(ctx, 2, [pane(T0, [5.0], ["c"])])
    commit_batch(ctx, 3, [pane(T0, [40.0, 1.0], ["a", "d"]), pane(T0 + 30_000, [7.0], ["e"])],
                 dead=[DeadLetter(STREAM, 1, 5, "future_skew", T0 + 10**8, T0, None, DIMS),
                       DeadLetter(STREAM, 2, 9, "unparseable", None, None, "undecodable log segment")])
    return ctx


def test_corrections_list_newest_first_with_old_and_new(client, corrected):
    answer = client.get("/api/v1/corrections")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["count"] == 3
    rows = body["corrections"]
    assert [(r["pane_start_ms"], r["revision_from"], r["revision_to"], r["batch_id"]) for r in rows] == [
        (T0 + 30_000, 1, 2, 3), (T0, 2, 3, 3), (T0, 1, 2, 2)]
    first = rows[-1]
    assert first["type"] == "correction" and first["stream"] == STREAM and first["dims"] == DIMS
    assert first["pane_end_ms"] == T0 + PANE and first["events_added"] == 1
    assert first["old"]["count"] == 2 and first["new"]["count"] == 3
    assert first["old"]["values"]["latency_ms"] == {"n": 2, "sum": 30.0, "min": 10.0, "max": 20.0}
    assert first["new"]["values"]["latency_ms"] == {"n": 3, "sum": 35.0, "min": 5.0, "max": 20.0}
    assert first["new"]["distinct"]["user_id"] == pytest.approx(3, abs=0.01)
    # the corrections chain: each one's old is the previous one's new
    assert rows[1]["old"] == first["new"]
    assert rows[0]["old"] == {"count": 0, "values": {}, "distinct": {}}


def test_corrections_filters(client, corrected):
    def ids(**params):
        answer = client.get("/api/v1/corrections", params=params)
        assert answer.status_code == 200, answer.text
        return [r["pane_start_ms"] for r in answer.json()["corrections"]]

    assert ids(stream=STREAM) == [T0 + 30_000, T0, T0]
    assert ids(stream="orders") == []
    assert ids(**{"from": str(T0 + 10_000)}) == [T0 + 30_000]
    assert ids(**{"from": str(T0), "to": str(T0 + 10_000)}) == [T0, T0]
    assert ids(**{"from": "now-10m", "to": "now-9m"}) == [T0 + 30_000, T0, T0]
    assert ids(limit=1) == [T0 + 30_000]
    assert ids(after_id=1) == [T0, T0 + 30_000]  # tailing: oldest first
    answer = client.get("/api/v1/corrections", params={"metric": "latency"}).json()["corrections"][0]
    assert set(answer["new"]["values"]) == {"latency_ms"} and answer["new"]["distinct"] == {}
    answer = client.get("/api/v1/corrections", params={"metric": "requests"}).json()["corrections"][0]
    assert answer["new"]["values"] == {} and set(answer["new"]["distinct"]) == {"user_id"}
    assert client.get("/api/v1/corrections", params={"metric": "orders"}).json()["count"] == 0


@pytest.mark.parametrize(("params", "status", "words"), [
    ({"stream": "nope"}, 404, "unknown stream"),
    ({"metric": "nope"}, 404, "unknown metric"),
    ({"metric": "latency", "stream": "orders"}, 400, "belongs to stream"),
    ({"from": "yesterday"}, 400, "RFC 3339"),
    ({"from": "now", "to": "now-1h"}, 400, "must be after"),
    ({"limit": "0"}, 422, ""),
    ({"after_id": "-1"}, 422, ""),
])
def test_corrections_bad_params(client, params, status, words):
    answer = client.get("/api/v1/corrections", params=params)
    assert answer.status_code == status, answer.text
    assert words in answer.text


def test_dead_letters_route(client, corrected):
    body = client.get("/api/v1/dead-letters").json()
    assert [(d["partition"], d["offset"], d["reason"]) for d in body["dead_letters"]] == [
        (2, 9, "unparseable"), (1, 5, "future_skew")]
    assert body["dead_letters"][0]["error"] == "undecodable log segment"
    assert body["totals_by_reason"] == {STREAM: {"future_skew": 1, "unparseable": 1}}
    only = client.get("/api/v1/dead-letters", params={"reason": "future_skew", "stream": STREAM}).json()
    assert [d["offset"] for d in only["dead_letters"]] == [5] and only["dead_letters"][0]["dims"] == DIMS
    assert client.get("/api/v1/dead-letters", params={"reason": "late"}).status_code == 400
    assert client.get("/api/v1/dead-letters", params={"stream": "nope"}).status_code == 404


def test_pipeline_status_counts_and_the_invariant(client, corrected):
    s = client.get("/api/v1/pipeline").json()["streams"][STREAM]
    assert (s["events_read"], s["events_aggregated"], s["events_dead_lettered"]) == (9, 7, 2)
    assert s["events_read"] == s["events_aggregated"] + s["events_dead_lettered"]
    assert s["dead_lettered_by_reason"] == {"future_skew": 1, "unparseable": 1}
    assert s["corrections"] == 3
    o = client.get("/api/v1/pipeline").json()["streams"]["orders"]
    assert (o["events_read"], o["events_dead_lettered"], o["dead_lettered_by_reason"]) == (0, 0, {})


def test_metrics_count_dead_letters_per_stream_and_reason(client, corrected):
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    total = {s.labels["stream"]: s.value for s in families["sketchboard_events_dead_lettered"].samples}
    assert total == {name: 2.0 if name == STREAM else 0.0 for name in load_catalog(CONFIG).streams}
    by_reason = {(s.labels["stream"], s.labels["reason"]): s.value
                 for s in families["sketchboard_events_dead_lettered_by_reason"].samples}
    assert by_reason == {(STREAM, "future_skew"): 1.0, (STREAM, "unparseable"): 1.0}


def test_query_points_say_final_and_corrected(client, corrected):
    a = client.get("/api/v1/query", params={"metric": "latency", "stat": "count", "from": str(T0),
                                            "to": str(T0 + 60_000), "step": "10s"}).json()
    by_t = {p["t"]: p for p in a["series"][0]["points"]}
    assert by_t[T0]["final"] and by_t[T0]["revision"] == 3 and by_t[T0]["count"] == 5
    assert by_t[T0 + 30_000]["revision"] == 2
    # a 30 s hopping window over the corrected pane carries its revision too
    h = client.get("/api/v1/query", params={"metric": "latency", "stat": "count", "from": str(T0),
                                            "to": str(T0 + 60_000), "step": "10s", "window": "30s"}).json()
    hop = {p["t"]: p for p in h["series"][0]["points"]}
    assert hop[T0]["count"] == 5 and hop[T0]["revision"] == 3 and hop[T0 + 10_000]["revision"] == 2


def test_corrections_feed_starts_at_the_newest_and_follows(ctx, corrected):
    feed = CorrectionsFeed(ctx.store)
    assert feed.topic == "corrections"
    assert feed.poll() == []  # no replay of history
    commit_batch(ctx, 4, [pane(T0, [2.0], ["f"]), pane(T0 + 240_000, [1.0], ["g"])], max_event=T0 + 240_000)
    commit_batch(ctx, 5, [pane(T0 + 30_000, [3.0], ["h"])])
    messages = feed.poll()
    assert [(m["type"], m["pane_start_ms"], m["revision_from"], m["revision_to"], m["batch_id"]) for m in messages] == [
        ("correction", T0, 3, 4, 4), ("correction", T0 + 30_000, 2, 3, 5)]
    # a client that applied old can undo it exactly: new - old = what the batch added
    assert messages[0]["new"]["count"] - messages[0]["old"]["count"] == messages[0]["events_added"] == 1
    assert set(messages[0]) >= {"id", "stream", "pane_end_ms", "dims", "at_ms", "old", "new", "events_added"}
    assert feed.poll() == []
    fresh = CorrectionsFeed(ctx.store, max_per_poll=1)
    assert fresh.poll() == []


# The columns a correction row is copied with (a busy window's many corrections, made by SQL).
COPIED = ("stream, pane_start_ms, pane_end_ms, dims, revision_from, revision_to, pipeline, batch_id, events_added,"
          " at_ms, old, new")


def test_corrections_after_a_decision_are_counted_past_a_busy_window(ctx, clock):
    """What an alert history entry's `corrections_since` reads (alerts/source.py): corrections to
    the window's panes with the rule's filter values, published after the decision, counted by the
    store. A window with more than 10 000 earlier corrections still counts the later ones: they used
    to be read oldest first, 10 000 at most, and filtered in Python."""
    from alerts.source import StoreAlertData

    commit_batch(ctx, 0, [pane(T0, [10.0], ["a"])], max_event=T0 + 5_000)
    commit_batch(ctx, 1, [pane(T0 + 120_000, [1.0], ["c"])], max_event=T0 + 120_000)  # T0's panes are final
    other = {**DIMS, "endpoint": "/b"}
    commit_batch(ctx, 2, [PanePartial(STREAM, T0 + 10_000, T0 + 20_000, other, data([1.0], ["u"]))])
    # 16 384 corrections before the decision: the one committed, doubled by SQL 14 times (committing
    # that many panes takes half a minute on PostgreSQL)
    db = ctx.store.side_db()
    for _ in range(14):
        db.execute(f"INSERT INTO corrections ({COPIED}) SELECT {COPIED} FROM corrections WHERE batch_id = 2")
    db.close()
    decided_ms = ctx.now_ms()
    clock.now += 1
    commit_batch(ctx, 3, [pane(T0, [5.0], ["d"]), PanePartial(STREAM, T0, T0 + PANE, other, data([1.0], ["e"])),
                          pane(T0 + 60_000, [2.0], ["f"])])  # the last one outside the window read
    count = StoreAlertData(ctx.catalog, ctx.store).corrections_after
    assert count(STREAM, T0, T0 + 60_000, decided_ms, {"endpoint": "/a"}) == 1
    assert count(STREAM, T0, T0 + 60_000, decided_ms, {"endpoint": "/a", "region": "eu"}) == 1
    assert count(STREAM, T0, T0 + 60_000, decided_ms, {"region": "us"}) == 0
    assert count(STREAM, T0, T0 + 60_000, decided_ms, {}) == 2
    assert count(STREAM, T0, T0 + 60_000, decided_ms, {"device": ""}) == 2  # a dimension a pane lacks reads as ""
    assert count(STREAM, T0, T0 + 120_000, decided_ms, {}) == 3
    assert count("orders", T0, T0 + 120_000, decided_ms, {}) == 0
    assert count(STREAM, T0, T0 + 60_000, decided_ms - 1, {"endpoint": "/b"}) == 16_384 + 1
    assert ctx.store.count_corrections(STREAM, T0 + 10_000, T0 + 20_000, decided_ms - 1, other) == 16_384
