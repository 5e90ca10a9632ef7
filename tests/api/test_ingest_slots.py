"""The API works on at most `ingest_slots` request bodies at once (api/ingest_routes.py), over real
HTTP on loopback with the real SQLite log: requests past the bound wait their turn and are all
appended, on the columnar path and on the per-event one; without a bound they run side by side.
How many slots a service gets is `sketchboard.wiring.ingest_slots`."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from dataclasses import replace

import httpx
import pytest

from api.app import create_app
from ingest.log import SqliteEventLog
from sketchboard.settings import Settings
from sketchboard.wiring import available_cores, ingest_slots
from tests.api.test_ws import Server

STREAM = "http_requests"
REQUESTS = 6
HOLD_S = 0.3  # each append's time: long enough for every request to be in by the time the first ends


class CountingLog(SqliteEventLog):
    """The real log, counting how many appends run at once (each held HOLD_S)."""

    def __init__(self, path):
        super().__init__(path, synchronous="OFF")
        self.guard = threading.Lock()
        self.running = self.most = 0

    def _counted(self, append, *args):
        with self.guard:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(HOLD_S)
            return append(*args)
        finally:
            with self.guard:
                self.running -= 1

    def append_columns(self, stream, columns, ingest_time_ms):
        return self._counted(super().append_columns, stream, columns, ingest_time_ms)

    def append(self, stream, events, ingest_time_ms):
        return self._counted(super().append, stream, events, ingest_time_ms)


def events(now_ms: int, n: int) -> list[dict]:
    """Plain, valid events: a body of 200 takes the columnar path, a body of 3 the per-event one."""
    return [{"time": now_ms - i, "user_id": f"u{i}", "endpoint": "/cart", "method": "GET", "status": "200",
             "region": "eu", "latency_ms": 12.5, "response_bytes": 512} for i in range(n)]


@pytest.fixture
def counting(ctx, tmp_path):
    log = CountingLog(tmp_path / "counted-log.db")
    log.ensure_topic(ctx.catalog.stream(STREAM))
    yield log
    log.close()


def post_at_once(ctx, bodies: list[list[dict]]) -> list[httpx.Response]:
    with Server(create_app(ctx)) as server, httpx.Client(base_url=server.http, timeout=30) as client:
        def post(body):
            return client.post("/api/v1/events", params={"stream": STREAM}, json=body)

        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            return list(pool.map(post, bodies))


@pytest.mark.parametrize("size", [200, 3], ids=["columnar", "per-event"])
def test_bodies_past_the_slots_wait_their_turn_and_are_all_appended(ctx, counting, now_ms, size):
    answers = post_at_once(replace(ctx, log=counting, ingest_slots=2), [events(now_ms, size)] * REQUESTS)
    assert [a.status_code for a in answers] == [200] * REQUESTS
    assert sum(a.json()["accepted"] for a in answers) == REQUESTS * size
    assert sum(o.end - o.start for o in counting.offsets(STREAM).values()) == REQUESTS * size
    assert counting.most == 2


def test_without_slots_the_bodies_run_side_by_side(ctx, counting, now_ms):
    """What the bound changes: the same requests, unbounded, overlap past two."""
    answers = post_at_once(replace(ctx, log=counting, ingest_slots=None), [events(now_ms, 200)] * REQUESTS)
    assert [a.status_code for a in answers] == [200] * REQUESTS
    assert counting.most > 2


def test_a_service_gets_a_slot_per_core_on_the_embedded_log_and_none_on_kafka(tmp_path):
    assert ingest_slots(Settings(data_dir=tmp_path)) == available_cores() == len(os.sched_getaffinity(0))
    assert ingest_slots(Settings(data_dir=tmp_path, ingest_threads=3)) == 3
    kafka = dict(data_dir=tmp_path, log_backend="kafka", kafka_bootstrap_servers="127.0.0.1:9092")
    assert ingest_slots(Settings(**kafka)) is None
    assert ingest_slots(Settings(**kafka, ingest_threads=8)) == 8  # a bound asked for is kept
    with pytest.raises(ValueError, match="ingest_threads"):
        Settings(data_dir=tmp_path, ingest_threads=-1)
