"""End to end in a browser: `sketchboard up --no-demo` (API + the real Spark pipeline, as
separate processes on loopback), events POSTed to the API, and the dashboard in headless
Chromium showing them, then the next ones, without a reload."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.procs import free_port, service_environment, stop_group

pytestmark = [pytest.mark.browser, pytest.mark.e2e]



@pytest.fixture
def service(tmp_path):
    port = free_port()
    log_path = tmp_path / "up.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sketchboard.cli", "up", "--no-demo", "--port", str(port),
             "--data-dir", str(tmp_path / "data")],
            env={**service_environment(), "PYTHONUNBUFFERED": "1"}, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the API did not come up"
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield base, proc, log_path
    finally:
        stop_group(proc)


def send(base: str, n: int, endpoint: str, offset: int = 0) -> None:
    now = int(time.time() * 1000)
    events = [{"time": now - i * 7, "endpoint": endpoint, "method": "GET", "status": 200, "region": "eu-west",
               "latency_ms": float(10 + i % 90), "user_id": f"u{offset + i}"} for i in range(n)]
    r = httpx.post(f"{base}/api/v1/events", params={"stream": "http_requests"}, json=events, timeout=10)
    assert r.status_code == 200 and r.json()["accepted"] == n


def test_events_posted_to_the_real_service_appear_live_on_the_dashboard(service, watched_page, artifacts):
    base, proc, log_path = service
    send(base, 300, "/api/cart")
    page, watch = watched_page(base, "/?metric=requests&stat=count&group_by=endpoint&range=5m")
    page.wait_for_selector("#status-connection[data-state=open]", timeout=20_000)
    # The Spark pipeline starts (JVM, first batch) while the page waits; the points are pushed when it commits.
    page.wait_for_function("window.sketchboard.charts.get('main').totalCount() === 300", timeout=150_000)
    assert proc.poll() is None

    send(base, 120, "/api/search", offset=1000)
    page.wait_for_function("window.sketchboard.charts.get('main').totalCount() === 420", timeout=60_000)
    page.wait_for_function("document.querySelectorAll('#chart-main .scatterlayer .trace').length === 2",
                           timeout=5_000)  # rendering is throttled: the model leads the DOM a little
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    page.wait_for_function("!document.querySelector('#status-last-batch').textContent.startsWith('no batch')",
                           timeout=10_000)
    # Its requests' users are in no `users` row (no demo traffic): the enrichment misses (counted
    # under the view http_requests is enriched through) show in the strip.
    page.wait_for_function("(e => !e.hidden && e.textContent.includes('http_requests→user_plans 420'))"
                           "(document.querySelector('#status-enrich-misses'))", timeout=10_000)
    page.wait_for_timeout(600)
    page.screenshot(path=str(artifacts / "dashboard-e2e.png"), full_page=True)
    assert watch.errors == [], log_path.read_text()[-2000:]
    assert watch.foreign == []
