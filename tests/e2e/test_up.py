"""`sketchboard up` as a user runs it: real processes, real HTTP on loopback.

Each `up` costs a Spark start-up (~20 s, minutes under load), so the module starts as few as it
can: the query test and the SIGTERM test share one (`shared_up`: the query test only reads its
own events back, the SIGTERM test, next in the file, ends it); the SIGKILL test has its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from sketchboard.settings import Settings
from sketchboard.wiring import ingest_process_count
from tests.procs import alive, free_port, service_environment, stop_group

pytestmark = pytest.mark.e2e



def _up(tmp_path, settings: dict[str, str] | None = None):
    """`sketchboard up --no-demo` on a free port, answering /healthz: yields (base, proc, its folder).
    `settings`: SKETCHBOARD_* variables (another log backend's)."""
    port = free_port()
    env = {**service_environment(), "PYTHONUNBUFFERED": "1", **(settings or {})}
    log_file = open(tmp_path / "up.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sketchboard.cli", "up", "--no-demo", "--port", str(port), "--data-dir",
         str(tmp_path / "data")],
        env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:  # say so here, not as a refused connection in the test
            raise AssertionError(f"the API did not answer /healthz in 90 s:\n{(tmp_path / 'up.log').read_text()[-3000:]}")
        yield base, proc, tmp_path
    finally:
        stop_group(proc)
        log_file.close()


@pytest.fixture(scope="module")
def shared_up(tmp_path_factory):
    """One `up` for the tests that can share it; the last of them (SIGTERM) stops it."""
    yield from _up(tmp_path_factory.mktemp("shared-up"))


@pytest.fixture
def own_up(tmp_path):
    yield from _up(tmp_path)


def test_post_events_then_query_their_metrics_a_few_seconds_later(shared_up):
    base, proc, tmp_path = shared_up
    assert proc.poll() is None, "the shared `up` was stopped by an earlier test"
    before = _count(base)
    now_ms = int(time.time() * 1000)
    _post_then_query(base, proc, tmp_path, before, now_ms)
    # On the embedded log with a local master the pipeline runs its own batches: no JVM was started
    # (aggregates/spark.py LazySpark, aggregates/driver_serving.py).
    tree = _tree(proc.pid)
    assert [p for p in tree if _name(p) == "java"] == [], [_name(p) for p in tree]
    # The ingest worker processes of `ingest_processes: auto`, under the API, as the wiring resolves it
    # (its rule: tests/api/test_ingest_workers.py); they took the body above.
    workers = ingest_process_count(Settings(data_dir=tmp_path, ingest_processes="auto"))
    assert len(_ingest_workers(proc.pid)) == workers
    assert f"; ingest in {workers} worker processes)" in (tmp_path / "up.log").read_text()  # as the API says


@pytest.mark.kafka
def test_up_on_kafka_serves_the_topics_with_no_jvm(tmp_path, kafka_broker):
    """On Kafka with a local master the pipeline reads the topics with its own consumer, as its own
    batches: no JVM in `up`'s tree (the broker's is not in it)."""
    settings = {"SKETCHBOARD_LOG_BACKEND": "kafka", "SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
                "SKETCHBOARD_KAFKA_REPLICATION_FACTOR": "1", "SKETCHBOARD_KAFKA_TOPIC_PREFIX": f"up{time.time_ns()}."}
    for base, proc, folder in _up(tmp_path, settings):
        _post_then_query(base, proc, folder, 0, int(time.time() * 1000))
        tree = _tree(proc.pid)
        assert [p for p in tree if _name(p) == "java"] == [], [_name(p) for p in tree]
        assert _ingest_workers(proc.pid) == []  # `auto` on Kafka: the API's threads wait for the brokers
        assert "; ingest in threads)" in (folder / "up.log").read_text()


def _ingest_workers(pid: int) -> list[int]:
    """The ingest worker processes in `pid`'s tree (api/ingest_worker.py)."""
    found = []
    for child in _tree(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"api.ingest_worker" in f.read().split(b"\0"):
                    found.append(child)
        except OSError:
            continue
    return found


def _post_then_query(base: str, proc, tmp_path, before: float, now_ms: int) -> None:
    # The 500 events in the first 5 s of the current minute (up to 5 s ahead of now: accepted, far
    # under max_future_skew), so one 1-minute point holds them all: points are aligned to whole
    # minutes, and events spread over the 5 s before now crossed a minute's end now and then (~8 %
    # of runs), leaving the distinct users of the point short.
    minute = now_ms - now_ms % 60_000
    events = [
        {"time": minute + i * 10, "endpoint": "/api/cart", "status": 200, "region": "eu",
         "latency_ms": float(i % 100), "user_id": f"u{i % 37}"}
        for i in range(500)
    ]
    ndjson = "\n".join(json.dumps(e) for e in events)
    answer = httpx.post(f"{base}/api/v1/events?stream=http_requests", content=ndjson,
                        headers={"content-type": "application/x-ndjson"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["accepted"] == 500

    # The pipeline (a separate process) picks them up; poll the query API like a user would.
    _wait_for_count(base, proc, tmp_path, before + 500)
    q = httpx.get(f"{base}/api/v1/query", params={"metric": "requests", "stat": "distinct", "from": minute,
                                                  "to": minute + 60_000, "step": "1m"}, timeout=10).json()
    assert q["series"][0]["points"][0]["value"] == pytest.approx(37, abs=1)


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        todo.extend(children := _children(todo.pop()))
        out.extend(children)
    return out


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4: the parent pid
                out.append(int(entry))
    return out


def test_sigterm_to_up_alone_stops_its_children_cleanly(shared_up):
    base, proc, tmp_path = shared_up
    children = _started_children(proc.pid)
    # A pipeline busy with a batch: the first one (Spark's warm-up) committed, then more events,
    # and the stop comes while their batch runs. It must commit or be left for the next start,
    # without a Py4J traceback (aggregates/batch_gate.py).
    before = _count(base)  # the query test's events, when it ran first on this `up`
    _post(base, 200)
    _wait_for_count(base, proc, tmp_path, before + 200)
    _post(base, 5000)
    time.sleep(1.5)  # one trigger interval: the batch has started
    proc.send_signal(signal.SIGTERM)  # to `up` only, as `kill <pid>` or a service manager does
    assert proc.wait(timeout=60) == 0
    _assert_gone(children, "after SIGTERM to up")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{base}/healthz", timeout=2)
    output = (tmp_path / "up.log").read_text()
    assert "Traceback" not in output and "Py4J" not in output, output[-3000:]


def test_sigkill_to_up_alone_stops_its_children(own_up):
    base, proc, _ = own_up
    children = _started_children(proc.pid)
    proc.send_signal(signal.SIGKILL)  # up gets no chance to stop them: the kernel tells them (parent death)
    proc.wait(timeout=10)
    _assert_gone(children, "after SIGKILL to up")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{base}/healthz", timeout=2)


def _started_children(pid: int) -> list[int]:
    """`up`'s children (api and pipeline, --no-demo) and theirs: the API's ingest workers among them."""
    deadline = time.monotonic() + 30
    while len(children := _children(pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # the pipeline starts right after the API answers
    assert len(children) == 2
    while not _ingest_workers(pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # started in the background once the API serves
    assert _ingest_workers(pid)
    return _tree(pid)


def _assert_gone(children: list[int], when: str) -> None:
    deadline = time.monotonic() + 30
    while any(alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [c for c in children if alive(c)]
    assert left == [], f"children left running {when}: {left}"


def _post(base: str, n: int) -> None:
    now_ms = int(time.time() * 1000)
    events = [{"time": now_ms - i, "endpoint": "/api/cart", "status": 200, "region": "eu",
               "latency_ms": float(i % 100), "user_id": f"u{i % 37}"} for i in range(n)]
    answer = httpx.post(f"{base}/api/v1/events?stream=http_requests", json=events, timeout=30)
    assert answer.status_code == 200 and answer.json()["accepted"] == n


def _count(base: str) -> float:
    """The events of the last 30 minutes the pipeline has aggregated (wide enough that a shared
    `up`'s earlier events stay in it)."""
    q = httpx.get(f"{base}/api/v1/query", params={"metric": "latency", "stat": "count", "from": "now-30m",
                                                  "to": "now+1m", "step": "1m"}, timeout=10).json()
    return sum(p["value"] or 0 for s in q["series"] for p in s["points"])


def _wait_for_count(base: str, proc, tmp_path, expected: float) -> None:
    deadline = time.monotonic() + 180  # Spark's start and first batch: ~30 s quiet, minutes under load
    total = 0
    while time.monotonic() < deadline:
        total = _count(base)
        if total >= expected:
            break
        assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
        time.sleep(1)
    assert total == expected, (tmp_path / "up.log").read_text()[-3000:]
