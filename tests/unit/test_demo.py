"""Demo traffic: shape of the generated events, and the producer against a tiny local HTTP server."""

from __future__ import annotations

import io
import json
import socket
import statistics
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from catalog import Catalog, parse_catalog
from demo import (
    MAX_JITTER_MS,
    RATE_MAX,
    RATE_MIN,
    SLOW_ENDPOINT,
    DemoProducer,
    DemoTraffic,
)
from tests.support.clock import FakeClock

NOW = 1_700_000_000.0  # a fixed clock: 2023-11-14T22:13:20Z


@pytest.fixture(scope="module")
def sample(catalog: Catalog) -> dict[str, list[dict]]:
    return DemoTraffic(catalog, seed=7, clock=FakeClock(NOW)).generate(20_000)


def _check_types(stream, events: list[dict]) -> None:
    # Not the enriched dimensions (http_requests' plan and country): the pipeline looks them up.
    sent = [f for f in stream.string_fields if f not in stream.enriched_dimensions]
    declared = {stream.time_field, *sent, *stream.values,
                *([stream.sent_time_field] if stream.sent_time_field else [])}
    for event in events:
        assert set(event) == declared
        assert json.loads(json.dumps(event)) == event
        assert type(event[stream.time_field]) is int
        for name in sent:
            assert type(event[name]) is str and event[name]
        for name in stream.values:
            assert type(event[name]) in (int, float)


def test_events_carry_exactly_the_declared_fields_with_json_types(catalog, sample):
    assert set(sample) == {"http_requests", "orders", "mobile_app", "searches", "clicks", "logins", "checkouts"}
    # Logins and checkouts come by the clock, not per request (tests/unit/test_demo_patterns.py): it stood still.
    assert sample["logins"] == sample["checkouts"] == []
    assert len(sample["http_requests"]) == 20_000
    assert 250 <= len(sample["orders"]) <= 550  # ~2 % of the requests
    assert 4_500 <= len(sample["mobile_app"]) <= 8_000  # ~25 %, plus offline backlogs
    assert 800 <= len(sample["searches"]) <= 1_200  # ~5 %; their clicks come later (tests/unit/test_demo_searches.py)
    for name, events in sample.items():
        _check_types(catalog.stream(name), events)
    assert all(type(e["response_bytes"]) is int for e in sample["http_requests"])
    assert all(type(e["items"]) is int and 1 <= e["items"] <= 8 for e in sample["orders"])
    assert all(e["amount"] > 0 and round(e["amount"], 2) == e["amount"] for e in sample["orders"])


def test_times_are_near_the_clock_and_some_out_of_order(sample):
    times = [e["time"] for e in sample["http_requests"]]
    now_ms = int(NOW * 1000)
    assert all(now_ms - MAX_JITTER_MS <= t <= now_ms for t in times)
    assert times != sorted(times)
    assert sum(a > b for a, b in zip(times, times[1:])) > len(times) // 10


def test_search_is_clearly_slower_than_other_endpoints(sample):
    latency: dict[str, list[float]] = {}
    for e in sample["http_requests"]:
        latency.setdefault(e["endpoint"], []).append(e["latency_ms"])
    assert len(latency) == 8
    search = statistics.median(latency.pop(SLOW_ENDPOINT))
    assert search > 3 * max(statistics.median(v) for v in latency.values())


def test_statuses_are_mostly_200_with_some_404_and_302(sample):
    status = Counter(e["status"] for e in sample["http_requests"])
    total = sum(status.values())
    assert status["200"] / total > 0.85
    assert status["404"] > 0 and status["302"] > 0


def test_users_are_skewed(sample):
    users = Counter(e["user_id"] for e in sample["http_requests"])
    top = users.most_common(max(1, len(users) // 100))
    assert sum(n for _, n in top) / len(sample["http_requests"]) > 0.2
    assert len(users) > 1_000  # skewed, but still a broad population


def test_same_seed_same_events(catalog):
    a = DemoTraffic(catalog, seed=3, clock=FakeClock(NOW)).generate(500)
    b = DemoTraffic(catalog, seed=3, clock=FakeClock(NOW)).generate(500)
    c = DemoTraffic(catalog, seed=4, clock=FakeClock(NOW)).generate(500)
    assert a == b and a != c


def test_streams_skipped_are_not_drawn_and_the_rest_keep_their_shares(catalog):
    traffic = DemoTraffic(catalog, seed=3, clock=FakeClock(NOW))
    drawn = traffic.generate(20_000, skip={"http_requests"})
    assert "http_requests" not in drawn
    assert 0.2 < len(drawn["mobile_app"]) / 20_000 < 0.3  # MOBILE_RATIO of the requests it stands for
    assert 0.01 < len(drawn["orders"]) / 20_000 < 0.03  # ORDER_RATIO


def test_rate_at_stays_in_range_with_a_daily_shape_and_bursts(catalog):
    traffic = DemoTraffic(catalog, seed=1)
    day = 1_699_920_000.0  # a UTC midnight
    rates = [traffic.rate_at(day + s) for s in range(0, 86_400, 5)]
    assert all(RATE_MIN - 1e-9 <= r <= RATE_MAX + 1e-9 for r in rates)
    assert any(r > 1.3 + 1e-9 for r in rates)  # bursts happen within a day
    # Deterministic, and afternoon is busier than night (medians ignore the bursts).
    assert traffic.rate_at(day + 123.4) == DemoTraffic(catalog, seed=1).rate_at(day + 123.4)
    afternoon = statistics.median(traffic.rate_at(day + 15 * 3600 + s) for s in range(0, 600, 10))
    night = statistics.median(traffic.rate_at(day + 3 * 3600 + s) for s in range(0, 600, 10))
    assert afternoon > 1.2 and night < 0.5


def test_error_burst_makes_one_endpoint_return_5xx(catalog):
    clock = FakeClock(NOW)
    traffic = DemoTraffic(catalog, seed=5, clock=clock)
    burst_at = next(t for t in range(int(NOW), int(NOW) + 7_200) if traffic.error_burst_at(t))
    failing = traffic.error_burst_at(burst_at)
    clock.now = burst_at
    events = traffic.generate(5_000)["http_requests"]
    hit = [e["status"] for e in events if e["endpoint"] == failing]
    rest = [e["status"] for e in events if e["endpoint"] != failing]
    assert sum(s in ("500", "503") for s in hit) / len(hit) > 0.5
    assert sum(s in ("500", "503") for s in rest) / len(rest) < 0.02
    # Bursts last seconds, not minutes.
    assert not traffic.error_burst_at(burst_at + 30)


def test_other_streams_get_generic_events():
    catalog = parse_catalog(
        "streams:\n"
        "  clicks:\n"
        "    key_field: session\n"
        "    time_field: ts\n"
        "    dimensions: [page, device]\n"
        "    values: [dwell_ms]\n"
        "    distinct: [session, visitor]\n"
    )
    events = DemoTraffic(catalog, seed=2, clock=FakeClock(NOW)).generate(2_000)
    assert set(events) == {"clicks"}
    _check_types(catalog.stream("clicks"), events["clicks"])
    assert len({e["page"] for e in events["clicks"]}) <= 6
    sessions = Counter(e["session"] for e in events["clicks"])
    assert sessions.most_common(1)[0][1] > 20  # Zipf: some keys repeat a lot


# -- the producer against a real HTTP server on loopback ----------------------------------


class _Recorder(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int):
        self.posts: list[tuple[str, str | None, object, str | None]] = []  # path, stream, body, content type
        self.keys: list[str | None] = []  # the Idempotency-Key of each post
        self.fail_first_try = False  # answer 503 to the first post of each key
        self.enough_events = threading.Event()  # set once `events_wanted` event bodies came in
        self.events_wanted: int | None = None
        self.tables_held: dict[str, list[str]] = {}  # table -> the keys its GET answers (loaded before)
        self.gets: list[str] = []
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        self.server.gets.append(url.path)
        name = url.path.removeprefix("/api/v1/tables/")
        query = parse_qs(url.query)
        limit, cursor = int(query.get("limit", ["100"])[0]), query.get("cursor", [""])[0]
        keys = sorted(k for k in self.server.tables_held.get(name, []) if k > cursor)  # a page, in key order
        rows = [{"key": k, "row": {}} for k in keys[:limit]]
        reply = json.dumps({"table": name, "rows": rows,
                            "next_cursor": rows[-1]["key"] if len(keys) > limit else None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        url = urlsplit(self.path)
        self.server.posts.append((url.path, parse_qs(url.query).get("stream", [None])[0], body, self.headers["Content-Type"]))
        key = self.headers["Idempotency-Key"]
        self.server.keys.append(key)
        wanted = self.server.events_wanted
        if wanted is not None and sum(p[0] == "/api/v1/events" for p in self.server.posts) >= wanted:
            self.server.enough_events.set()
        if self.server.fail_first_try and self.server.keys.count(key) == 1:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        reply = json.dumps({"accepted": len(body), "rejected": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int) -> _Recorder:
    server = _Recorder(port)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def test_producer_posts_json_arrays_per_stream(catalog):
    server = _serve(_free_port())
    try:
        out = io.StringIO()
        traffic = DemoTraffic(catalog, seed=1)
        producer = DemoProducer(
            f"http://127.0.0.1:{server.server_address[1]}", traffic, rate=500.0, progress_every_s=0.5, out=out
        )
        # The users' initial load (100 bodies) first, then events: stopped once 20 event bodies came
        # in, not after a fixed time (a loaded machine spent a fixed 2 s on the tables alone).
        server.events_wanted = 20
        started = time.monotonic()
        summary = producer.run(duration_s=120.0, stop=server.enough_events)
        elapsed = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert server.posts
    # The users table's rows come first (all users, then plan changes: demo/users.py), then the
    # plans' (demo/plans.py), then events.
    tables = [body for path, _, body, _ in server.posts if path == "/api/v1/tables/users"]
    assert server.posts[0][0] == "/api/v1/tables/users" and tables
    plans = [body for path, _, body, _ in server.posts if path == "/api/v1/tables/plans"]
    # Every plan first; a plan's change follows if the run crosses a ten-minute mark of the clock
    # (demo/plans.py CHANGE_EVERY_S: it did once, at 09:20:00, in a fresh clone's run).
    assert {row["plan_id"] for row in plans[0]} == {"free", "plus", "pro", "team"}
    assert all(body and {row["plan_id"] for row in body} <= {"free", "plus", "pro", "team"} for body in plans[1:])
    assert all(set(row) == {"time", "plan_id", "tier", "price"} for body in plans for row in body)
    assert all(set(row) == {"time", "user_id", "plan", "country"} for body in tables for row in body)
    assert summary["table_rows"] == {"users": sum(len(body) for body in tables),
                                     "plans": sum(len(body) for body in plans)} and len(tables[0]) == 500
    server.posts = [p for p in server.posts if not p[0].startswith("/api/v1/tables/")]
    for path, stream, body, content_type in server.posts:
        assert path == "/api/v1/events"
        assert stream in ("http_requests", "orders", "mobile_app", "searches", "clicks", "logins", "checkouts")
        assert content_type == "application/json"
        assert isinstance(body, list) and body and all(isinstance(e, dict) for e in body)
        _check_types(catalog.stream(stream), body)
    posted = sum(len(body) for _, _, body, _ in server.posts)
    assert len(server.posts) >= 20 and posted >= 20
    assert posted <= 500 * RATE_MAX * (elapsed + 1)  # paced: 500/s x the daily shape and bursts
    assert summary["sent"] == summary["accepted"] == posted
    assert summary["errors"] == 0 and summary["rejected"] == 0
    assert "demo: sent " in out.getvalue() and "errors 0" in out.getvalue()


def test_a_second_producer_sends_only_the_changes_of_a_table_the_service_holds(catalog):
    """A spike producer beside `make run` (or a restart on the same data) does not load every user
    again: the pipeline would spend a batch of ~50 000 upserts on them while no event is aggregated."""
    server = _serve(_free_port())
    server.tables_held = {"users": [row["user_id"] for row in DemoTraffic(catalog, seed=1).table_changes()["users"]]}
    try:
        out = io.StringIO()
        producer = DemoProducer(f"http://127.0.0.1:{server.server_address[1]}", DemoTraffic(catalog, seed=1),
                                rate=500.0, progress_every_s=0.5, out=out)
        server.events_wanted = 5
        summary = producer.run(duration_s=120.0, stop=server.enough_events)
    finally:
        server.shutdown()
        server.server_close()
    assert {"/api/v1/tables/users", "/api/v1/tables/plans"} <= set(server.gets)
    users = [body for path, _, body, _ in server.posts if path == "/api/v1/tables/users"]
    assert sum(len(body) for body in users) < 500  # no initial load: at most the few changes due since
    plans = [body for path, _, body, _ in server.posts if path == "/api/v1/tables/plans"]
    assert [len(body) for body in plans] == [4]  # the plans table was empty: loaded
    assert summary["table_rows"].get("users", 0) == sum(len(body) for body in users)
    assert "demo: table users: the service holds its rows already; only changes follow" in out.getvalue()


def test_a_producer_loads_the_rows_an_interrupted_initial_load_left_out(catalog):
    """Ctrl-C during a first `make run`'s users load left a part of the table: the next producer
    loads the keys the service lacks (every page of its keys read), not one row taken for all."""
    initial = DemoTraffic(catalog, seed=1).table_changes()["users"]
    held = [row["user_id"] for row in initial[: len(initial) // 3]]
    held_keys = set(held)
    server = _serve(_free_port())
    server.tables_held = {"users": held}
    try:
        out = io.StringIO()
        producer = DemoProducer(f"http://127.0.0.1:{server.server_address[1]}", DemoTraffic(catalog, seed=1),
                                rate=500.0, progress_every_s=0.5, out=out)
        server.events_wanted = 5
        producer.run(duration_s=120.0, stop=server.enough_events)
    finally:
        server.shutdown()
        server.server_close()
    users = [body for path, _, body, _ in server.posts if path == "/api/v1/tables/users"]
    loaded = [{k: v for k, v in row.items() if k != "time"} for body in users for row in body]
    missing = [{k: v for k, v in row.items() if k != "time"} for row in initial if row["user_id"] not in held_keys]
    assert loaded[: len(missing)] == missing  # every missing row, once, then at most the changes due since
    assert len(loaded) - len(missing) < 500
    assert (f"demo: table users: the service holds {len(held)} of its {len(initial)} rows;"
            f" loading the {len(missing)} missing") in out.getvalue()
    assert f"demo: table users: {len(missing)} rows loaded" in out.getvalue()
    assert server.gets.count("/api/v1/tables/users") == -(-len(held) // 1000)  # pages of 1000 keys


def test_producer_retries_until_the_service_is_up(catalog):
    port = _free_port()
    out = io.StringIO()
    producer = DemoProducer(f"http://127.0.0.1:{port}", DemoTraffic(catalog, seed=1), rate=500.0, out=out)
    result: dict = {}
    # Stopped once an event body came in, not after a fixed 2 s: on a loaded machine the retries'
    # back-off and the users table's load could use all of it (0 events accepted).
    enough = threading.Event()
    worker = threading.Thread(target=lambda: result.update(producer.run(duration_s=120.0, stop=enough)))
    worker.start()
    # The server comes up once the producer has been refused, not after a fixed 0.5 s: on a loaded
    # machine its first try could come later than that, and then nothing was refused.
    deadline = time.monotonic() + 60
    while "cannot reach" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    server = _serve(port)
    server.enough_events, server.events_wanted = enough, 1
    try:
        worker.join(timeout=150)
    finally:
        server.shutdown()
        server.server_close()
    assert not worker.is_alive()
    assert result["errors"] >= 1          # the refused connections were counted...
    assert result["accepted"] > 0         # ...and the events got through once it was up
    assert server.posts
    assert "cannot reach" in out.getvalue() and "connected" in out.getvalue()


def test_producer_retries_a_body_with_the_same_idempotency_key(catalog):
    server = _serve(_free_port())
    server.fail_first_try = True
    try:
        traffic = DemoTraffic(catalog, seed=1)
        traffic.user_table = traffic.plan_table = None  # events only: the users' initial load (100 bodies, each tried twice) takes the second
        producer = DemoProducer(f"http://127.0.0.1:{server.server_address[1]}", traffic, rate=200.0, out=io.StringIO())
        producer.BACKOFF_START_S = 0.01
        summary = producer.run(duration_s=1.0)
    finally:
        server.shutdown()
        server.server_close()
    tries: dict[str, list] = {}
    for key, (_, _, body, _) in zip(server.keys, server.posts):
        tries.setdefault(key, []).append(body)
    assert tries and all(key for key in tries)
    # Every try of a key carried the same body; a body got through on its second try (the first
    # was refused), or was dropped when the run ended first.
    assert all(all(b == bodies[0] for b in bodies) for bodies in tries.values())
    assert summary["accepted"] == sum(len(bodies[0]) for bodies in tries.values() if len(bodies) == 2) > 0


def test_producer_stops_on_event(catalog):
    stop = threading.Event()
    producer = DemoProducer(f"http://127.0.0.1:{_free_port()}", DemoTraffic(catalog), out=io.StringIO())

    def stop_after_a_failed_try():  # not on a fixed timer: a loaded machine may not have tried yet
        deadline = time.monotonic() + 30
        while producer.errors < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        stopping[0] = time.monotonic()
        stop.set()

    stopping = [None]
    threading.Thread(target=stop_after_a_failed_try, daemon=True).start()
    summary = producer.run(stop=stop)  # nothing listens: it must still stop promptly
    assert time.monotonic() - stopping[0] < 2.0
    assert summary["sent"] == 0 and summary["errors"] >= 1


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_the_demo_stopped_by_a_signal_says_what_it_sent(signum):
    """`sketchboard up` stops its demo with SIGTERM right after the Ctrl-C that reached the whole
    process group: killed while unwinding its KeyboardInterrupt, the demo never printed its summary."""
    import signal
    import subprocess
    import sys

    demo = subprocess.Popen([sys.executable, "-m", "demo", "--url", f"http://127.0.0.1:{_free_port()}",
                             "--rate", "10", "--users", "10"], stderr=subprocess.PIPE, text=True)
    try:
        first = demo.stderr.readline()
        assert first.startswith("demo: sending"), first
        time.sleep(0.5)  # retrying: nothing listens on the port
        demo.send_signal(getattr(signal, signum))
        _, err = demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, err
    assert "demo: done: {" in err and "Traceback" not in err
