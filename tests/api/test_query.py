"""GET /api/v1/streams, /api/v1/metrics and /api/v1/query against a real SQLite pane store
filled (via commit_batch) from a known list of synthetic events: every exact stat is
checked against a computation over the raw events, sketch stats against their bounds."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from api.query_routes import QueryAnswer
import yaml

from sketches import HllSketch, KllSketch
from store import BatchCommit, PaneData, PanePartial, ValueStats, dims_key, pane_start

CONFIG = Path(__file__).resolve().parents[2] / "config" / "streams.yaml"
URL = "/api/v1/query"
STREAM = "http_requests"
NOW_MS = 1_800_000_000_000  # the fake clock of conftest: 2027-01-15T08:00:00Z
PANE = 10_000
LATENESS = 30_000
MAX_EVENT_MS = NOW_MS - 65_000
GAP = (NOW_MS - 200_000, NOW_MS - 170_000)  # no events here: empty windows
ENDPOINTS = ("/cart", "/checkout", "/search")
REGIONS = ("eu", "us")


@dataclass(frozen=True)
class Ev:
    t: int
    user: str
    latency: float | None
    dims: dict


def make_events(n: int = 400, seed: int = 7) -> list[Ev]:
    rng = random.Random(seed)
    events = []
    while len(events) < n - 1:
        t = NOW_MS - 300_000 + rng.randrange(0, 235_000)
        if GAP[0] <= t < GAP[1]:
            continue
        dims = {
            "endpoint": rng.choice(ENDPOINTS),
            "method": rng.choice(("GET", "POST")),
            "status": rng.choice(("200", "500")),
            "region": rng.choice(REGIONS),
        }
        latency = None if rng.random() < 0.1 else float(rng.randint(1, 1000))  # integers: sums are exact
        events.append(Ev(t, f"u{rng.randrange(60)}", latency, dims))
    events.append(Ev(MAX_EVENT_MS, "u0", 5.0, {"endpoint": "/cart", "method": "GET", "status": "200", "region": "eu"}))
    return events


EVENTS = make_events()


def partials(events: list[Ev]) -> list[PanePartial]:
    """What the aggregator would commit for these events: one partial per pane and dimension
    combination, with exact count/n/sum/min/max and real KLL and HLL bytes."""
    by_pane: dict[tuple[int, str], list[Ev]] = defaultdict(list)
    for e in events:
        by_pane[(pane_start(e.t, PANE), dims_key(e.dims))].append(e)
    out = []
    for (start, key), evs in sorted(by_pane.items()):
        values = {}
        latencies = [e.latency for e in evs if e.latency is not None]
        if latencies:
            kll = KllSketch()
            for v in latencies:
                kll.update(v)
            values["latency_ms"] = ValueStats(len(latencies), math.fsum(latencies), min(latencies), max(latencies),
                                              kll.to_bytes())
        hll = HllSketch()
        for e in evs:
            hll.update(e.user)
        data = PaneData(count=len(evs), values=values, distincts={"user_id": hll.to_bytes()})
        out.append(PanePartial(STREAM, start, start + PANE, json.loads(key), data))
    return out


@pytest.fixture(scope="module")
def batches() -> list[BatchCommit]:
    """The events as two batches (many panes get a second revision); built once, sketches are slow-ish."""
    return [BatchCommit("main", batch_id, partials(part), len(part), {STREAM: max(e.t for e in part)})
            for batch_id, part in ((0, EVENTS[:250]), (1, EVENTS[250:]))]


@pytest.fixture
def populated(ctx, batches):
    """The store after committing both batches."""
    lateness = {name: s.allowed_lateness for name, s in ctx.catalog.streams.items()}
    assert lateness[STREAM] == LATENESS
    assert ctx.pipeline_name == "main"
    for commit in batches:
        result = ctx.store.commit_batch(commit, lateness_ms=lateness, now_ms=NOW_MS)
        assert result.committed
    assert ctx.store.watermarks() == {STREAM: MAX_EVENT_MS - LATENESS}
    return EVENTS


def window_events(events, t: int, window: int, filters: dict | None = None) -> list[Ev]:
    return [e for e in events if t <= e.t < t + window
            and all(e.dims.get(k, "") == v for k, v in (filters or {}).items())]


def exact(stat: str, evs: list[Ev], window: int):
    latencies = [e.latency for e in evs if e.latency is not None]
    if stat == "count":
        return float(len(evs))
    if stat == "rate":
        return len(evs) * 1000.0 / window
    if stat == "sum":
        return math.fsum(latencies)
    if stat == "avg":
        return math.fsum(latencies) / len(latencies) if latencies else None
    if stat == "min":
        return min(latencies) if latencies else None
    if stat == "max":
        return max(latencies) if latencies else None
    raise AssertionError(stat)


def query(client, **params):
    params.setdefault("metric", "latency")
    for name in ("from_", "to_"):
        if name in params:
            params[name[:-1]] = params.pop(name)
    return client.get(URL, params=params)


def ok(client, **params) -> dict:
    r = query(client, **params)
    assert r.status_code == 200, r.text
    # The route writes its JSON by hand (fast); it must still be what the OpenAPI model says.
    assert QueryAnswer.model_validate(r.json()).model_dump(mode="json") == r.json()
    return r.json()


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


# -- definitions ----------------------------------------------------------------------


def test_streams_lists_the_configured_streams(client, ctx):
    declared = yaml.safe_load(CONFIG.read_text())["streams"]
    answer = client.get("/api/v1/streams")
    assert answer.status_code == 200
    streams = {s["name"]: s for s in answer.json()["streams"]}
    assert set(declared) == {"http_requests", "orders", "mobile_app", "searches", "clicks", "users", "plans", "logins",
                             "checkouts"}
    # generated by `sessions:`, by the window join `search_clicks`, by the view `user_plans`, by the two
    # `patterns:` and by mobile_app's `sent_time_field`:
    assert set(streams) == set(declared) | {"http_requests_sessions", "mobile_app_sessions", "search_clicks",
                                            "user_plans", "credential_stuffing_matches", "checkout_abandoned_matches",
                                            "mobile_app_clocks"}
    for name, spec in declared.items():
        s = streams[name]
        table = ["op"] if spec.get("kind") == "table" else []  # a table's implicit dimension
        enriched = [c for e in spec.get("enrich", ()) for c in e["columns"]]  # http_requests' plan and country
        assert s["dimensions"] == table + spec["dimensions"] + enriched
        assert s["values"] == spec.get("values", [])
        assert s["distinct"] == spec.get("distinct", [spec["key_field"]])
        assert s["key_field"] == spec["key_field"]
        assert s["pane"] == spec.get("pane", "10s")
        assert s["partitions"] == spec["partitions"]
        assert set(s["partitions_offsets"]) == {str(p) for p in range(spec["partitions"])}
        assert s["events_in_log"] == 0


def test_streams_count_events_in_log(client, ctx):
    r = client.post("/api/v1/events", params={"stream": STREAM},
                    json=[{"time": NOW_MS, "user_id": f"u{i}"} for i in range(3)])
    assert r.status_code == 200, r.text
    streams = {s["name"]: s for s in client.get("/api/v1/streams").json()["streams"]}
    assert streams[STREAM]["events_in_log"] == 3
    assert sum(o["end"] for o in streams[STREAM]["partitions_offsets"].values()) == 3
    assert streams["orders"]["events_in_log"] == 0


def test_metrics_lists_the_configured_metrics_and_their_stats(client):
    declared = yaml.safe_load(CONFIG.read_text())
    answer = client.get("/api/v1/metrics")
    assert answer.status_code == 200
    metrics = {m["name"]: m for m in answer.json()["metrics"]}
    generated = {f"{s}_{m}" for s in ("http_requests", "mobile_app") for m in ("sessions", "session_duration", "session_events")}
    joined = {f"search_clicks_{v}" for v in ("searches", "pairs", "clicked", "latency", "unmatched_right")}
    matched = {"credential_stuffing_matches", "credential_stuffing_matches_attempts", "checkout_abandoned_matches",
               "checkout_abandoned_matches_amount"}
    clocks = {"mobile_app_clock_offset", "mobile_app_clock_devices"}
    # by the streams' `sessions:`, `joins:`, `patterns:` (a metric per pattern and per measure) and
    # `sent_time_field`:
    assert set(metrics) == set(declared["metrics"]) | generated | joined | matched | clocks
    assert metrics["search_clicks_clicked"]["stats"][-1] == "ratio"
    for name, spec in declared["metrics"].items():
        m = metrics[name]
        stream = declared["streams"][spec["stream"]]
        assert m["stream"] == spec["stream"]
        assert m["value"] == spec.get("value")
        assert m["distinct"] == spec.get("distinct")
        assert m["unit"] == spec.get("unit", "")
        table = ["op"] if stream.get("kind") == "table" else []  # a table's implicit dimension
        enriched = [c for e in stream.get("enrich", ()) for c in e["columns"]]  # http_requests' plan and country
        assert m["dimensions"] == table + stream["dimensions"] + enriched
        assert m["pane"] == stream.get("pane", "10s")
        expected = ["count", "rate"]
        if spec.get("value"):
            expected += ["sum", "avg", "min", "max", "pNN"]
        if spec.get("distinct"):
            expected += ["distinct"]
        if spec.get("first_seen"):
            expected += ["first_seen"]
        assert m["stats"] == expected
    assert metrics["requests"]["stats"] == ["count", "rate", "distinct"]
    assert metrics["latency"]["stats"] == ["count", "rate", "sum", "avg", "min", "max", "pNN"]


# -- time parameters ------------------------------------------------------------------


def test_from_and_to_as_epoch_ms_rfc3339_relative_and_epoch_s_agree(client, populated):
    start, end = NOW_MS - 360_000, NOW_MS
    answers = [
        ok(client, stat="count", step="30s", from_=str(start), to_=str(end)),
        ok(client, stat="count", step="30s", from_=rfc3339(start), to_=rfc3339(end)),
        ok(client, stat="count", step="30s", from_="2027-01-15T08:54:00+01:00", to_="2027-01-15T09:00:00+01:00"),
        ok(client, stat="count", step="30s", from_="now-6m", to_="now"),
        ok(client, stat="count", step="30s", from_="now-360s"),  # 'to' defaults to now
        ok(client, stat="count", step="30s", from_=str(start // 1000), to_=str(end // 1000)),
    ]
    assert rfc3339(start) == "2027-01-15T07:54:00Z"
    for a in answers:
        assert (a["start"], a["end"]) == (start, end)
        assert a == answers[0]
    assert sum(p["count"] for p in answers[0]["series"][0]["points"]) == len(EVENTS)


def test_relative_times_follow_the_fake_clock(client, populated, clock):
    clock.now += 120  # two minutes later: now-6m covers less of the data
    a = ok(client, stat="count", step="30s", from_="now-6m")
    assert (a["start"], a["end"]) == (NOW_MS - 240_000, NOW_MS + 120_000)
    assert sum(p["count"] for p in a["series"][0]["points"]) == len([e for e in EVENTS if e.t >= NOW_MS - 240_000])


def test_default_range_and_step(client, populated):
    a = ok(client)  # from=now-1h, to=now, stat=count, ~300 points at most
    assert (a["start"], a["end"]) == (NOW_MS - 3_600_000, NOW_MS)
    assert a["stat"] == "count" and a["metric"] == "latency" and a["stream"] == STREAM and a["unit"] == "ms"
    assert a["step_ms"] == a["window_ms"] == 30_000  # the first nice step (multiple of 10s) giving <= 300 points
    assert len(a["series"][0]["points"]) == 120
    b = ok(client, from_="now-6m")
    assert b["step_ms"] == 10_000 and len(b["series"][0]["points"]) == 36


def test_unaligned_range_is_widened_to_whole_steps(client, populated):
    a = ok(client, stat="count", step="30s", from_=str(NOW_MS - 355_000), to_=str(NOW_MS - 5_000))
    assert (a["start"], a["end"]) == (NOW_MS - 360_000, NOW_MS)


# -- exact stats ----------------------------------------------------------------------


@pytest.mark.parametrize("stat", ["count", "sum", "min", "max", "avg", "rate"])
def test_tumbling_window_stats_are_exact(client, populated, stat):
    a = ok(client, stat=stat, step="30s", from_="now-6m", to_="now")
    assert a["step_ms"] == a["window_ms"] == 30_000
    [series] = a["series"]
    assert series["group"] == {}
    points = series["points"]
    assert [p["t"] for p in points] == list(range(NOW_MS - 360_000, NOW_MS, 30_000))
    empty = 0
    for p in points:
        evs = window_events(EVENTS, p["t"], 30_000)
        assert p["count"] == len(evs)
        expected = exact(stat, evs, 30_000)
        assert p["value"] == expected, (p["t"], stat)
        assert p["error"] is None  # exact stats carry no bounds
        empty += not evs
    assert empty >= 3  # the first minute, the gap and the tail have no events


@pytest.mark.parametrize("stat", ["count", "sum", "min", "max", "avg", "rate"])
@pytest.mark.parametrize(("window", "step"), [("60s", "30s"), ("50s", "20s"), ("2m", "10s")])
def test_hopping_window_stats_are_exact(client, populated, stat, window, step):
    window_ms, step_ms = int(window[:-1]) * (60_000 if window.endswith("m") else 1000), int(step[:-1]) * 1000
    a = ok(client, stat=stat, step=step, window=window, from_="now-6m", to_="now")
    assert a["step_ms"] == step_ms and a["window_ms"] == window_ms
    points = a["series"][0]["points"]
    assert [p["t"] for p in points] == list(range(NOW_MS - 360_000, NOW_MS, step_ms))
    for p in points:
        evs = window_events(EVENTS, p["t"], window_ms)
        assert p["count"] == len(evs)
        expected = exact(stat, evs, window_ms)
        if expected is None:
            assert p["value"] is None
        else:
            assert p["value"] == pytest.approx(expected, rel=1e-12), (p["t"], stat)


def test_hopping_windows_overlap(client, populated):
    """Each event is counted in window/step = 2 windows (where both lie in the range)."""
    a = ok(client, stat="count", step="30s", window="60s", from_="now-6m", to_="now")
    assert sum(p["count"] for p in a["series"][0]["points"]) == 2 * len(EVENTS)


def test_range_excludes_events_outside_it(client, populated):
    a = ok(client, stat="count", step="30s", from_="now-4m", to_="now-2m")
    assert sum(p["count"] for p in a["series"][0]["points"]) == len(
        [e for e in EVENTS if NOW_MS - 240_000 <= e.t < NOW_MS - 120_000])


def test_response_size_metric_has_no_values_but_counts(client, populated):
    """The panes carry no response_bytes stats: counts are there, value stats are null."""
    a = ok(client, metric="response_size", stat="avg", step="30s", from_="now-6m")
    for p in a["series"][0]["points"]:
        assert p["value"] is None
        assert p["count"] == len(window_events(EVENTS, p["t"], 30_000))


# -- grouping and filtering -----------------------------------------------------------


def test_group_by_endpoint_gives_one_series_per_endpoint(client, populated):
    a = ok(client, stat="sum", step="30s", from_="now-6m", group_by="endpoint")
    groups = [s["group"] for s in a["series"]]
    assert groups == [{"endpoint": e} for e in sorted(ENDPOINTS)]
    for s in a["series"]:
        for p in s["points"]:
            evs = window_events(EVENTS, p["t"], 30_000, s["group"])
            assert p["count"] == len(evs)
            assert p["value"] == exact("sum", evs, 30_000)
    totals = [sum(p["count"] for p in s["points"]) for s in a["series"]]
    assert sum(totals) == len(EVENTS)


@pytest.mark.parametrize("stat", ["min", "avg"])
def test_group_by_with_hopping_windows(client, populated, stat):
    a = ok(client, stat=stat, step="30s", window="90s", from_="now-6m", group_by="endpoint")
    assert [s["group"] for s in a["series"]] == [{"endpoint": e} for e in sorted(ENDPOINTS)]
    for s in a["series"]:
        for p in s["points"]:
            evs = window_events(EVENTS, p["t"], 90_000, s["group"])
            assert p["count"] == len(evs)
            expected = exact(stat, evs, 90_000)
            assert p["value"] == (None if expected is None else pytest.approx(expected, rel=1e-12))


@pytest.mark.parametrize("form", ["comma", "repeat"])
def test_group_by_two_dimensions(client, populated, form):
    group_by = "endpoint,region" if form == "comma" else ["endpoint", "region"]
    a = ok(client, stat="count", step="60s", from_="now-6m", group_by=group_by)
    assert [s["group"] for s in a["series"]] == [
        {"endpoint": e, "region": r} for e in sorted(ENDPOINTS) for r in sorted(REGIONS)]
    for s in a["series"]:
        for p in s["points"]:
            assert p["count"] == len(window_events(EVENTS, p["t"], 60_000, s["group"]))


def test_filter_region(client, populated):
    a = ok(client, stat="max", step="30s", from_="now-6m", filter="region=eu")
    [series] = a["series"]
    assert series["group"] == {}
    for p in series["points"]:
        evs = window_events(EVENTS, p["t"], 30_000, {"region": "eu"})
        assert p["count"] == len(evs)
        assert p["value"] == exact("max", evs, 30_000)
    eu = sum(p["count"] for p in series["points"])
    assert 0 < eu < len(EVENTS)
    assert eu == len([e for e in EVENTS if e.dims["region"] == "eu"])


def test_filter_and_group_by_together(client, populated):
    a = ok(client, stat="count", step="60s", from_="now-6m", filter=["region=us", "method=POST"],
           group_by="endpoint")
    for s in a["series"]:
        for p in s["points"]:
            wanted = {"region": "us", "method": "POST", **s["group"]}
            assert p["count"] == len(window_events(EVENTS, p["t"], 60_000, wanted))


def test_filter_on_a_value_nobody_has_gives_an_empty_series(client, populated):
    a = ok(client, stat="avg", step="30s", from_="now-6m", filter="region=mars")
    [series] = a["series"]
    assert all(p["count"] == 0 and p["value"] is None for p in series["points"])


# -- sketch stats ---------------------------------------------------------------------


@pytest.mark.parametrize("stat, q", [("p99", 0.99), ("p50", 0.50), ("p99.9", 0.999)])
def test_percentile_has_kll_error_bounds(client, populated, stat, q):
    a = ok(client, stat=stat, step="60s", from_="now-6m")
    seen = 0
    for p in a["series"][0]["points"]:
        latencies = sorted(e.latency for e in window_events(EVENTS, p["t"], 60_000) if e.latency is not None)
        if not latencies:
            assert p["value"] is None and p["error"] is None
            continue
        seen += 1
        err = p["error"]
        assert err["kind"] == "kll"
        assert 0 < err["rank_error"] < 0.05
        assert err["relative_error"] is None
        assert err["lower"] <= p["value"] <= err["upper"]
        assert p["value"] in latencies  # fewer items than k: the sketch keeps them all
        # the value's true rank lies within the sketch's rank error of q
        n = len(latencies)
        below = sum(v < p["value"] for v in latencies) / n
        at_or_below = sum(v <= p["value"] for v in latencies) / n
        assert below - err["rank_error"] - 1 / n <= q <= at_or_below + err["rank_error"] + 1 / n
    assert seen >= 3


def test_distinct_has_hll_bounds(client, populated):
    a = ok(client, metric="requests", stat="distinct", step="60s", from_="now-6m")
    seen = 0
    for p in a["series"][0]["points"]:
        users = {e.user for e in window_events(EVENTS, p["t"], 60_000)}
        if not users:
            assert p["value"] == 0.0 and p["error"] is None
            continue
        seen += 1
        err = p["error"]
        assert err["kind"] == "hll"
        assert err["rank_error"] is None
        assert 0 < err["relative_error"] < 0.05
        assert err["lower"] <= p["value"] <= err["upper"]
        assert err["lower"] <= len(users) <= err["upper"]
        assert p["value"] == pytest.approx(len(users), rel=0.05)
    assert seen >= 3


def test_distinct_over_the_whole_range(client, populated):
    a = ok(client, metric="requests", stat="distinct", step="6m", from_="now-6m")
    [p] = a["series"][0]["points"]
    users = {e.user for e in EVENTS}
    assert p["count"] == len(EVENTS)
    assert p["error"]["lower"] <= len(users) <= p["error"]["upper"]


# -- finality and revisions -----------------------------------------------------------


@pytest.mark.parametrize("window", ["30s", "60s"])
def test_final_flag_follows_the_watermark(client, populated, window):
    a = ok(client, stat="count", step="30s", window=window, from_="now-6m")
    watermark = a["watermark_ms"]
    assert watermark == MAX_EVENT_MS - LATENESS == NOW_MS - 95_000
    points = a["series"][0]["points"]
    for p in points:
        assert p["final"] == (p["t"] + a["window_ms"] <= watermark)
    assert any(p["final"] for p in points) and not all(p["final"] for p in points)
    # the last window ending before NOW-95s is final, the one ending at NOW-90s is not
    by_end = {p["t"] + a["window_ms"]: p for p in points}
    assert by_end[NOW_MS - 120_000]["final"] is True
    assert by_end[NOW_MS - 90_000]["final"] is False


def test_no_watermark_means_nothing_final(client, ctx):
    a = ok(client, stat="count", step="30s", from_="now-6m")
    assert a["watermark_ms"] is None
    assert all(not p["final"] and p["count"] == 0 and p["revision"] == 0 for p in a["series"][0]["points"])


def test_revisions(client, populated):
    """A pane's revision goes up only for changes after it became final (the watermark stored
    before the batch at or past its end; a pane born final starts at 2); a point shows its
    panes' highest."""
    first, second = EVENTS[:250], EVENTS[250:]
    watermark_0 = max(e.t for e in first) - LATENESS
    revision: dict[tuple[int, str], int] = {}
    for e in first:
        revision[(pane_start(e.t, PANE), dims_key(e.dims))] = 1
    for key in {(pane_start(e.t, PANE), dims_key(e.dims)) for e in second}:
        final = key[0] + PANE <= watermark_0
        revision[key] = (revision[key] + 1 if key in revision else 2) if final else revision.get(key, 1)
    a = ok(client, stat="count", step="30s", from_="now-6m")
    revisions = [p["revision"] for p in a["series"][0]["points"]]
    expected = [max((r for (start, _), r in revision.items() if t <= start < t + 30_000), default=0)
                for t in range(NOW_MS - 360_000, NOW_MS, 30_000)]
    assert revisions == expected
    assert 0 in revisions and 1 in revisions


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "status", "fragments"),
    [
        ({"metric": "nope"}, 404, ["nope", "latency", "requests"]),
        ({"metric": "requests", "stat": "p99"}, 400, ["requests", "percentiles"]),
        ({"metric": "requests", "stat": "avg"}, 400, ["requests"]),
        ({"metric": "latency", "stat": "distinct"}, 400, ["distinct"]),
        ({"stat": "median"}, 400, ["unknown stat", "median"]),
        ({"stat": "p999"}, 400, ["unknown stat"]),
        ({"from": "now-1m", "to": "now-2m"}, 400, ["after"]),
        ({"from": "now-1m", "to": "now-1m"}, 400, ["after"]),
        ({"from": "now-6m", "step": "15s"}, 400, ["multiple", "pane"]),
        ({"from": "now-6m", "step": "30s", "window": "15s"}, 400, ["multiple", "pane"]),
        ({"from": "now-6m", "step": "60s", "window": "30s"}, 400, ["at least"]),
        ({"from": "now-30d", "step": "10s"}, 400, ["11000"]),
        ({"from": "now-6m", "group_by": "nope"}, 400, ["nope", "endpoint"]),
        ({"from": "now-6m", "group_by": "latency_ms"}, 400, ["latency_ms"]),
        ({"from": "now-6m", "filter": "region"}, 400, ["region", "dimension=value"]),
        ({"from": "now-6m", "filter": "planet=mars"}, 400, ["planet"]),
        ({"from": "yesterday"}, 400, ["yesterday"]),
        ({"from": "now-6m", "to": "2027-01-15T08:00:00"}, 400, ["time zone"]),
        ({"from": "now-abc"}, 400, ["duration"]),
        ({"from": "now-6m", "step": "ten seconds"}, 400, ["duration"]),
        ({"from": "now-6m", "step": "0s"}, 400, ["positive"]),
        ({"from": "１７００００００００"}, 400, ["１７"]),  # full-width digits are no epoch
        ({"from": "1_700_000_000"}, 400, ["1_700_000_000"]),
    ],
    ids=["unknown-metric", "p99-without-value", "avg-without-value", "distinct-without-field", "unknown-stat",
         "p999", "to-before-from", "empty-range", "step-not-pane-multiple", "window-not-pane-multiple",
         "window-below-step", "too-many-points", "group-by-unknown", "group-by-value-field", "filter-without-eq",
         "filter-unknown-dimension", "bad-time", "time-without-zone", "bad-relative", "bad-step", "zero-step",
         "full-width-epoch", "underscored-epoch"],
)
def test_bad_queries(client, populated, params, status, fragments):
    params = {"metric": "latency", **params}
    r = client.get(URL, params=params)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str)
    for fragment in fragments:
        assert fragment in detail, detail


def test_a_single_valued_parameter_given_twice_is_refused_naming_it(client, populated):
    """FastAPI would answer for the last `stat` silently; list parameters still take repeats."""
    for name, values in (("stat", ("count", "p99")), ("from", ("now-6m", "now-1h")), ("step", ("1m", "1m"))):
        r = client.get(URL, params=[("metric", "latency"), *((name, v) for v in values)])
        assert r.status_code == 400, r.text
        assert r.json()["param"] == name and "given 2 times" in r.json()["detail"], r.json()
    r = client.get(URL, params=[("metric", "latency"), ("from", "now-6m"), ("group_by", "endpoint"),
                                ("group_by", "region")])
    assert r.status_code == 200, r.text


def test_too_many_points_names_the_limit(client, ctx):
    r = client.get(URL, params={"metric": "latency", "from": "now-30d", "step": "10s"})
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert str(ctx.query_max_points) in detail and "limit" in detail
    assert str(30 * 86_400 // 10) in detail  # the points asked for


def test_missing_metric_is_422(client):
    assert client.get(URL).status_code == 422


# -- one query path: REST, the websocket and alert rules resolve and compute a query alike --

FIRST_SEEN_ROWS = [(NOW_MS - 290_000, 4, 10, 1, 0.5, 2), (NOW_MS - 120_000, 6, 9, 2, 0.25, 1)]


@pytest.fixture
def with_first_seen(ctx, populated):
    """The populated panes plus first_seen rows, as the pipeline commits them beside its panes."""
    from store.bloom import BloomCommit, FirstSeenPartial

    rows = [FirstSeenPartial(STREAM, start, start + PANE, *counts) for start, *counts in FIRST_SEEN_ROWS]
    assert ctx.store.commit_batch(BatchCommit("main", 2, [], 0, bloom=BloomCommit(first_seen=rows)),
                                  lateness_ms={}, now_ms=NOW_MS).committed
    return populated


def ws_snapshot(client, query: dict) -> dict:
    with client.websocket_connect("/api/v1/ws") as ws:
        ws.send_text(json.dumps({"type": "subscribe", "id": "s", "query": query}))
        msg = ws.receive_json()
        while msg["type"] not in ("snapshot", "error"):
            msg = ws.receive_json()
    return msg


@pytest.mark.parametrize(("metric", "stat", "extra"), [
    ("requests", "count", {"group_by": "region"}),
    ("latency", "avg", {"filter": "region=eu"}),
    ("latency", "p50", {}),
    ("latency", "p99.9", {"group_by": "endpoint", "window": "1m"}),
    ("requests", "distinct", {"window": "30s"}),
    ("new_users", "first_seen", {"window": "1m"}),
])
def test_rest_and_websocket_answer_the_same_points(client, with_first_seen, metric, stat, extra):
    params = {"metric": metric, "stat": stat, "from": "now-5m", "to": "now", "step": "10s", **extra}
    rest = client.get(URL, params=params)
    assert rest.status_code == 200, rest.text
    snapshot = ws_snapshot(client, params)
    assert snapshot["type"] == "snapshot", snapshot
    assert snapshot["result"] == rest.json()
    assert any(p["value"] for s in rest.json()["series"] for p in s["points"])  # not an empty answer
    if stat == "first_seen":
        values = [p["value"] for p in rest.json()["series"][0]["points"]]
        assert sum(values) > sum(r[1] for r in FIRST_SEEN_ROWS)  # each row counted in the 1m windows it lies in


@pytest.mark.parametrize(("metric", "stat", "group_by", "fragment"), [
    ("requests", "p99", [], "has no value field, so it has no percentiles"),
    ("requests", "avg", [], "has no value field, so it has no avg"),
    ("latency", "distinct", [], "declares no distinct field"),
    ("latency", "first_seen", [], "does not declare first_seen"),
    ("latency", "median", [], "unknown stat 'median'"),
    ("new_users", "first_seen", ["region"], "first_seen is counted per stream"),
])
def test_a_stat_a_metric_does_not_have_is_rejected_alike(client, catalog, metric, stat, group_by, fragment):
    from alerts.rules import RuleError, parse_rule

    rest = client.get(URL, params={"metric": metric, "stat": stat, "group_by": group_by})
    assert rest.status_code == 400 and rest.json()["param"] == "stat"
    reason = rest.json()["detail"]
    assert fragment in reason
    ws = ws_snapshot(client, {"metric": metric, "stat": stat, "group_by": group_by})
    assert ws["type"] == "error" and ws["reason"] == reason
    with pytest.raises(RuleError) as rule:
        parse_rule({"name": "r", "kind": "threshold", "metric": metric, "stat": stat, "group_by": group_by,
                    "threshold": 1}, catalog)
    assert str(rule.value) == f"rule 'r': stat: {reason}"


def test_an_alert_rule_reads_the_window_rest_answers(ctx, client, with_first_seen):
    """alerts.source computes its one window through the same query.compute as REST."""
    from alerts.source import StoreAlertData

    data = StoreAlertData(ctx.catalog, ctx.store)
    start, end = NOW_MS - 300_000, NOW_MS - 240_000
    for metric, stat in (("latency", "p90"), ("requests", "distinct"), ("new_users", "first_seen")):
        rest = client.get(URL, params={"metric": metric, "stat": stat, "from": start, "to": start + 1,
                                       "step": "1m"}).json()
        (value,) = data.window_values(metric, stat, start, end, (), {}, now_ms=NOW_MS)
        assert value.value == rest["series"][0]["points"][0]["value"], (metric, stat)
