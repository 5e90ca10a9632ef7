"""The ingest API's columnar path in worker processes (api/ingest_workers.py), over real HTTP on
loopback, real worker processes and the real SQLite log: the events they append are the ones the
API process appends itself, a body they decline gets the per-event answer, a refusal (413, 429)
writes nothing, a worker that dies is replaced without a request lost, and the workers end with
the app."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from api.app import create_app
from api.ingest_workers import BODY_BYTES_MAX, IngestWorkers
from api.security.ratelimit import RateLimiter
from ingest.log.records import EVENT_TIME
from sketchboard.settings import Settings
from tests.api.test_ws import Server
from tests.support.clock import FakeClock

STREAM = "http_requests"
EVENTS = "/api/v1/events"


def events(now_ms: int, n: int, first: int = 0) -> list[dict]:
    """Plain, valid events: a body of 200 takes the columnar path."""
    return [{"time": now_ms - i, "user_id": f"u{i % 37}", "endpoint": "/cart", "method": "GET", "status": "200",
             "region": "eu", "latency_ms": 12.5 + i, "response_bytes": 512} for i in range(first, first + n)]


@pytest.fixture
def workers(ctx):
    return IngestWorkers(ctx.log.path, "OFF", ctx.security.json_limits, 2, environment={"SKETCHBOARD_MARK": "worker"})


def started(server_ctx, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while server_ctx.ingest_workers.ready < server_ctx.ingest_workers.processes:
        assert time.monotonic() < deadline, "the ingest workers did not start"
        time.sleep(0.05)


def stored(ctx) -> list[dict]:
    """Every event of the stream in the log, in partition and offset order, without its ingest time."""
    out = []
    stream = ctx.catalog.stream(STREAM)
    for partition, offsets in sorted(ctx.log.offsets(STREAM).items()):
        for batch in ctx.log.read(stream, partition, offsets.start, offsets.end):
            out += [{k: v for k, v in row.items() if k != "__ingest_time"} for row in batch.to_pylist()]
    return out


def test_the_workers_append_what_the_api_process_appends(ctx, workers, now_ms, tmp_path):
    from tests.api.conftest import context

    bodies = [events(now_ms, 200, first=k * 200) for k in range(6)]
    served = replace(ctx, ingest_workers=workers, max_body_bytes=BODY_BYTES_MAX)
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        answers = [http.post(EVENTS, params={"stream": STREAM}, json=body) for body in bodies]
        # Over what the socket to a worker holds at once (~208 KiB): the worker reads it in parts.
        ndjson = "\n".join(json.dumps({**e, "endpoint": f"/cart/{'x' * 200}"})
                           for e in events(now_ms, 1000, first=5000))
        assert 256 * 1024 < len(ndjson) <= BODY_BYTES_MAX
        answers.append(http.post(EVENTS, params={"stream": STREAM}, content=ndjson,
                                 headers={"content-type": "application/x-ndjson"}))
    assert [a.status_code for a in answers] == [200] * 7
    assert workers.handled == 7  # every body went to a worker
    assert [a.json()["accepted"] for a in answers] == [200] * 6 + [1000]
    assert [a.json()["rejected"] for a in answers] == [[]] * 7

    # The same bodies appended by the API process itself, into another log.
    (tmp_path / "alone").mkdir()
    with context(tmp_path / "alone", ctx.clock, ctx.catalog) as alone, \
            Server(create_app(replace(alone, max_body_bytes=BODY_BYTES_MAX))) as server, \
            httpx.Client(base_url=server.http, timeout=30) as http:
        again = [http.post(EVENTS, params={"stream": STREAM}, json=body) for body in bodies]
        again.append(http.post(EVENTS, params={"stream": STREAM}, content=ndjson,
                               headers={"content-type": "application/x-ndjson"}))
        assert [a.json()["partitions"] for a in again] == [a.json()["partitions"] for a in answers]
        assert stored(alone) == stored(ctx)
    assert len(stored(ctx)) == 2200


MODES = pytest.mark.parametrize("mode", ["no-events-limit", "events-reserved", "events-counted"])


def in_mode(ctx, mode: str, workers: IngestWorkers):
    """The context serving `workers`, at most 250 events a request, and an events rate limit every
    test body fits or none. With the limit, a body's events are set aside from the bucket (its
    opening braces: no fewer than its events) and it is appended unasked (`events-reserved`); but
    where they are more than 250, it is counted first and charged exactly (`events-counted`: the
    group's second step). `bodies` gives the events of that mode."""
    limit = None if mode == "no-events-limit" else RateLimiter(100_000, 100_000, clock=FakeClock(0.0))
    return replace(ctx, ingest_workers=workers, max_events_per_request=250,
                   security=replace(ctx.security, event_limit=limit))


def bodies(mode: str, *bodies: list[dict]) -> list[list[dict]]:
    """The bodies, with two braces in every event's endpoint in `events-counted` (an upper bound on
    its events of twice as many, over the 250 a request that in_mode allows)."""
    if mode != "events-counted":
        return list(bodies)
    return [[{**event, "endpoint": "/cart/{id}"} for event in body] for body in bodies]


def held(served, bodies: list, then: int = signal.SIGCONT) -> list[httpx.Response]:
    """`bodies` POSTed to a server whose one worker is stopped (SIGSTOP) with the first of them in
    hand, the others waiting behind it; then the worker gets `then` (SIGCONT: it goes on; SIGKILL).
    The answers, in the bodies' order."""
    from concurrent.futures import ThreadPoolExecutor

    one = served.ingest_workers
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        worker = one.running()[0]
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(len(bodies)) as pool:
                posts = [pool.submit(http.post, EVENTS, params={"stream": STREAM}, json=bodies[0])]
                wait_until(lambda: one.busy == 1)
                posts += [pool.submit(http.post, EVENTS, params={"stream": STREAM}, json=body) for body in bodies[1:]]
                wait_until(lambda: one.waiting == len(bodies) - 1)
                os.kill(worker.pid, then)
                return [post.result() for post in posts]
        finally:
            if worker.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)


@MODES
def test_bodies_that_wait_for_a_worker_are_appended_together_each_with_its_own_answer(ctx, now_ms, mode):
    """The group commit: bodies that waited while the one worker was busy go to it together and
    are appended in one transaction, one segment a partition; each answer's ranges hold exactly
    that body's events."""
    import sqlite3

    one = IngestWorkers(ctx.log.path, "OFF", ctx.security.json_limits, 1)
    sent = bodies(mode, *(events(now_ms, 200, first=1000 * k) for k in range(6)))
    answers = held(in_mode(ctx, mode, one), sent)
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    assert (one.handled, one.groups) == (6, 2)
    partitions = ctx.catalog.stream(STREAM).partitions
    with sqlite3.connect(ctx.log.path) as conn:
        segments = conn.execute("SELECT count(*) FROM segments WHERE stream = ?", (STREAM,)).fetchone()[0]
    assert segments <= 2 * partitions  # the first body's, then the five others' together
    stream = ctx.catalog.stream(STREAM)
    got = []
    for answer in answers:
        read = []
        for partition, (first, count) in answer.json()["partitions"].items():
            for batch in ctx.log.read(stream, int(partition), first, first + count):
                read += [(row[EVENT_TIME], row["user_id"]) for row in batch.to_pylist()]
        got.append(sorted(read))
    assert got == [sorted((e["time"], e["user_id"]) for e in body) for body in sent]
    assert len({a.json()["ingest_time_ms"] for a in answers[1:]}) == 1  # one ingest time a group


@MODES
def test_a_group_answers_each_body_on_its_own(ctx, now_ms, mode):
    """In one group: a body with an invalid event gets the per-event answer, one over
    max_events_per_request a 413, and the others are appended."""
    one = IngestWorkers(ctx.log.path, "OFF", ctx.security.json_limits, 1)
    invalid = events(now_ms, 200, first=1000)
    invalid[3]["latency_ms"] = "slow"
    sent = bodies(mode, events(now_ms, 200), invalid, events(now_ms, 300, first=2000), events(now_ms, 200, first=3000))
    answers = held(in_mode(ctx, mode, one), sent)
    assert [a.status_code for a in answers] == [200, 200, 413, 200], [a.text for a in answers]
    assert [r["index"] for r in answers[1].json()["rejected"]] == [3]
    assert "exceed the limit of 250 per request" in answers[2].text
    assert one.handled == 2  # the first and the last
    assert len(stored(ctx)) == 200 + 199 + 200


@MODES
def test_a_worker_killed_with_a_group_in_hand_answers_503_for_it_and_the_waiting_bodies_go_on(ctx, now_ms, mode):
    """The first body was handed to the worker. Admitted unasked, it may have been appended: 503,
    as a lost Kafka acknowledgement. Held for the API's word, it was not: the API process appends
    it. The bodies waiting behind it were not handed over, and are appended elsewhere."""
    one = IngestWorkers(ctx.log.path, "OFF", ctx.security.json_limits, 1)
    sent = bodies(mode, *(events(now_ms, 200, first=1000 * k) for k in range(4)))
    answers = held(in_mode(ctx, mode, one), sent, then=signal.SIGKILL)
    counted = mode == "events-counted"
    assert [a.status_code for a in answers] == [200 if counted else 503, 200, 200, 200], [a.text for a in answers]
    if not counted:
        assert "may or may not have been committed" in answers[0].text
    assert len(stored(ctx)) == (800 if counted else 600)


def test_the_dispatcher_outlives_a_failure_and_its_bodies_are_handled_in_the_api_process(ctx, now_ms, workers,
                                                                                        monkeypatch):
    failures = []
    real = IngestWorkers._next_group

    def fails_once(self):
        if not failures:
            failures.append(1)
            raise RuntimeError("a bug")
        return real(self)

    monkeypatch.setattr(IngestWorkers, "_next_group", fails_once)
    served = replace(ctx, ingest_workers=workers)
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        answers = [http.post(EVENTS, params={"stream": STREAM}, json=events(now_ms, 200, first=1000 * k))
                   for k in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert failures == [1] and workers.handled == 1  # the first in the API process, the second in a worker
    assert len(stored(ctx)) == 400


def test_a_body_appended_unasked_is_charged_its_events_not_its_braces(ctx, now_ms, workers):
    """The events set aside for a body (its opening braces: here twice its events) come back but
    for the events appended, which the bucket is charged exactly."""
    limit = RateLimiter(1000, 1000, clock=FakeClock(0.0))
    served = replace(ctx, ingest_workers=workers, security=replace(ctx.security, event_limit=limit))
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        answer = http.post(EVENTS, params={"stream": STREAM}, json=bodies("events-counted", events(now_ms, 200))[0])
    assert answer.status_code == 200 and answer.json()["accepted"] == 200
    assert workers.handled == 1
    assert limit.take("addr:127.0.0.1", 800) == 0 and limit.take("addr:127.0.0.1", 1) > 0


def wait_until(condition, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_body_over_the_workers_size_is_handled_in_the_api_process(ctx, workers, now_ms, monkeypatch):
    import api.ingest_workers

    small, large = events(now_ms, 200), events(now_ms, 200, first=1000)
    monkeypatch.setattr(api.ingest_workers, "BODY_BYTES_MAX", len(json.dumps(small)) + 100)
    served = replace(ctx, ingest_workers=workers)
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        answers = [http.post(EVENTS, params={"stream": STREAM}, content=json.dumps(body),
                             headers={"content-type": "application/json"}) for body in (small, large + large[:20])]
    assert [a.status_code for a in answers] == [200, 200]
    assert workers.handled == 1  # the small one
    assert len(stored(ctx)) == 420


def test_a_body_the_workers_decline_gets_the_per_event_answer(ctx, workers, now_ms, monkeypatch):
    import api.ingest_routes

    parsed_here = []
    monkeypatch.setattr(api.ingest_routes, "columnar_body", lambda *a: parsed_here.append(1))
    body = events(now_ms, 200)
    body[7]["latency_ms"] = "slow"
    served = replace(ctx, ingest_workers=workers)
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        answer = http.post(EVENTS, params={"stream": STREAM}, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == 199
    assert [r["index"] for r in answer.json()["rejected"]] == [7]
    assert "latency_ms" in answer.json()["rejected"][0]["reason"]
    assert workers.handled == 0
    assert parsed_here == []  # not parsed as columns again in the API process
    assert len(stored(ctx)) == 199


@pytest.mark.parametrize("refusal", ["413", "429"])
def test_a_refused_body_writes_nothing_and_the_worker_serves_on(ctx, workers, now_ms, refusal):
    if refusal == "413":
        served = replace(ctx, ingest_workers=workers, max_events_per_request=150)
    else:
        limit = RateLimiter(250, 250, clock=FakeClock(0.0))  # the first body fits, the second does not
        served = replace(ctx, ingest_workers=workers, security=replace(ctx.security, event_limit=limit))
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        first = http.post(EVENTS, params={"stream": STREAM}, json=events(now_ms, 140))
        refused = http.post(EVENTS, params={"stream": STREAM}, json=events(now_ms, 200, first=500))
        # Both workers asked again: each still answers.
        after = [http.post(EVENTS, params={"stream": STREAM}, json=events(now_ms, 100, first=1000 + 100 * k))
                 for k in range(2)] if refusal == "413" else []
    assert first.status_code == 200
    assert refused.status_code == int(refusal), refused.text
    assert ("exceed the limit of 150 per request" if refusal == "413" else "over 250 events/s") in refused.text
    assert [a.status_code for a in after] == [200] * len(after)
    assert len(stored(ctx)) == 140 + 100 * len(after)  # nothing of the refused body


def test_a_worker_that_dies_is_replaced_and_no_request_is_lost(ctx, workers, now_ms):
    served = replace(ctx, ingest_workers=workers)
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        started(served)
        pids = {p.pid for p in workers.running()}
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        # Each dead worker's next body is handled by the API process; new workers take over.
        answers = [http.post(EVENTS, params={"stream": STREAM}, json=events(now_ms, 200, first=200 * k))
                   for k in range(4)]
        started(served)
        assert {p.pid for p in workers.running()}.isdisjoint(pids)
        later = http.post(EVENTS, params={"stream": STREAM}, json=events(now_ms, 200, first=5000))
        scraped = http.get("/metrics").text
    assert [a.status_code for a in answers + [later]] == [200] * 5
    assert sum(a.json()["accepted"] for a in answers + [later]) == 1000
    assert len(stored(ctx)) == 1000
    assert workers.handled >= 1  # the last one at least went to a new worker
    # What an operator sees of it on /metrics.
    assert 'sketchboard_scrape_source_up{source="ingest_workers"} 1.0' in scraped
    for line in ("sketchboard_ingest_workers_configured 2.0", "sketchboard_ingest_workers_ready 2.0",
                 "sketchboard_ingest_workers_replaced_total 2.0", "sketchboard_ingest_bodies_waiting 0.0",
                 "sketchboard_ingest_worker_groups_in_progress 0.0",
                 f"sketchboard_ingest_worker_bodies_appended_total {workers.handled:.1f}",
                 f"sketchboard_ingest_worker_groups_total {workers.groups:.1f}"):
        assert line in scraped.splitlines(), line


def test_workers_that_cannot_start_leave_the_bodies_to_the_api_process(ctx, now_ms, tmp_path):
    (tmp_path / "file").write_text("")
    broken = IngestWorkers(tmp_path / "file" / "log.db", "OFF", ctx.security.json_limits, 2)  # no such folder
    served = replace(ctx, ingest_workers=broken)
    with Server(create_app(served)) as server, httpx.Client(base_url=server.http, timeout=30) as http:
        deadline = time.monotonic() + 60
        while broken.starting:  # both tried, and failed
            assert time.monotonic() < deadline
            time.sleep(0.05)
        answers = [http.post(EVENTS, params={"stream": STREAM}, json=events(now_ms, 200, first=200 * k))
                   for k in range(3)]
    assert [a.status_code for a in answers] == [200] * 3
    assert broken.ready == 0 and broken.handled == 0
    assert len(stored(ctx)) == 600


def test_the_workers_end_with_the_app(ctx, workers, now_ms):
    served = replace(ctx, ingest_workers=workers)
    with Server(create_app(served)):
        started(served)
        processes = workers.running()
        for process in processes:  # the environment the wiring gives them (the allocators' settings)
            assert b"SKETCHBOARD_MARK=worker" in Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
    assert len(processes) == 2
    assert all(p.poll() is not None for p in processes)


def test_a_stream_definition_goes_to_a_worker_once_and_again_when_it_changes(ctx, now_ms, monkeypatch):
    """Not pickled with every group: sent with the first, and again when the catalog's definition
    is another object (here with one more value field, which the first refuses as undeclared)."""
    from api import ingest_workers

    first = ctx.catalog.stream(STREAM)
    changed = first.model_copy(update={"values": (*first.values, "cost")})
    body = json.dumps([{**event, "cost": 1.5} for event in events(now_ms, 200)]).encode()
    sent = []  # per group: whether its message carried the definition
    send = ingest_workers._Worker.send

    async def recording(worker, message, payloads=()):
        if message[0] == "group":
            sent.append(message[2] is not None)
        await send(worker, message, payloads)

    monkeypatch.setattr(ingest_workers._Worker, "send", recording)
    one = IngestWorkers(ctx.log.path, "OFF", ctx.security.json_limits, 1)

    async def run() -> list:
        await one.start()
        try:
            while one.ready < 1:
                await asyncio.sleep(0.05)
            answers = []
            for stream in (first, first, first, changed, changed):
                answers.append(await one.ingest(stream, body, "application/json", lambda rows: None,
                                                admitted=10_000, now_ms=lambda: now_ms))
            return answers
        finally:
            await one.stop()

    answers = asyncio.run(run())
    assert sent == [True, False, False, True, False]
    assert answers[:3] == [ingest_workers.DECLINED] * 3  # "cost" is undeclared there
    assert [answer[0] for answer in answers[3:]] == [200, 200]  # the worker reads by the changed one


def test_a_worker_reads_a_body_cut_short_by_a_signal_and_none_when_the_socket_ends_midway():
    """The bodies follow their frame as they are; the worker reads each with MSG_WAITALL, which
    a signal cuts short after part of it (the rest is read on), and the end of the socket too."""
    from api.ingest_worker import _read_exactly

    ours, theirs = socket.socketpair()
    body = os.urandom(600_000)

    def send() -> None:
        ours.sendall(body[:250_000])
        time.sleep(0.3)  # the alarm goes off meanwhile, with part of the body read
        ours.sendall(body[250_000:] + b"tail")
        ours.close()

    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    sender = threading.Thread(target=send)
    sender.start()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        assert _read_exactly(theirs, len(body)) == body
        assert _read_exactly(theirs, 10) is None  # 4 bytes, then the end
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sender.join()
        theirs.close()


def test_ingest_processes_append_to_the_embedded_log_only(tmp_path):
    assert Settings(data_dir=tmp_path, ingest_processes=2).ingest_processes == 2
    with pytest.raises(ValueError, match="ingest_processes append to the embedded log"):
        Settings(data_dir=tmp_path, ingest_processes=2, log_backend="kafka", kafka_bootstrap_servers="b:9092")


KAFKA = {"log_backend": "kafka", "kafka_bootstrap_servers": "b:9092"}


@pytest.mark.parametrize(("cores", "log", "expected"), [
    (1, {}, 2), (2, {}, 3), (3, {}, 4), (16, {}, 4),  # one more than the cores, at most 4
    (2, KAFKA, 0),  # on Kafka the API's threads wait for the brokers' acknowledgements
])
def test_ingest_processes_auto_is_one_more_than_the_cores_at_most_four_on_the_embedded_log(
        tmp_path, monkeypatch, cores, log, expected):
    from sketchboard import wiring

    monkeypatch.delenv("SKETCHBOARD_INGEST_PROCESSES", raising=False)  # the suite's own 0 (tests/conftest.py)
    monkeypatch.setattr(wiring, "available_cores", lambda: cores)
    settings = Settings(data_dir=tmp_path, **log)
    assert settings.ingest_processes == "auto"  # the default
    assert wiring.ingest_process_count(settings) == expected
    assert wiring.ingest_process_count(Settings(data_dir=tmp_path, ingest_processes=1)) == 1  # as set
    assert wiring.ingest_process_count(Settings(data_dir=tmp_path, ingest_processes=0, **log)) == 0


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("3", 3), ("0", 0)])
def test_ingest_processes_from_the_environment(tmp_path, monkeypatch, value, expected):
    monkeypatch.setenv("SKETCHBOARD_INGEST_PROCESSES", value)
    assert Settings(data_dir=tmp_path).ingest_processes == expected


@pytest.mark.parametrize("value", ["-1", "65", "many", "2.5"])
def test_an_ingest_processes_neither_a_count_nor_auto_is_refused_with_its_reason(tmp_path, monkeypatch, value):
    monkeypatch.setenv("SKETCHBOARD_INGEST_PROCESSES", value)
    with pytest.raises(ValueError, match="ingest_processes") as refused:
        Settings(data_dir=tmp_path)
    assert "auto" in str(refused.value)  # the other form it may take
