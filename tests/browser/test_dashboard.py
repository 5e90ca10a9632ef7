"""The dashboard in a real headless Chromium against the real app on loopback (uvicorn in a
thread; the test commits batches into the store itself, as the pipeline would): charts fill
and update without a reload, the page asks nothing of any host but 127.0.0.1, logs no console
error, keeps its state in the URL, shows corrections and lag from their feeds."""

from __future__ import annotations

import contextlib
import time
import urllib.parse

import pytest

from api.app import create_app
from api.ws_hub import HubConfig
from tests.api.test_ws import ListFeed, Server, ev, post
from tests.api.test_ws_support import drain_log_into_store
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.browser


class LiveClock:
    """Wall time: the page computes 'now' from the browser's clock, so the server must agree."""

    def __call__(self) -> float:
        return time.time()


@pytest.fixture
def live(tmp_path, demo_catalog):
    catalog = demo_catalog
    from api.context import ApiContext
    from ingest.log import SqliteEventLog
    from store import SqlitePaneStore

    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    ctx = ApiContext(catalog=catalog, log=log, store=store, clock=LiveClock(),
                     dashboards=demo_dashboards(catalog, store))
    feeds = {"corrections": ListFeed("corrections"), "lag": ListFeed("lag")}
    app = create_app(ctx, feeds=list(feeds.values()),
                     hub_config=HubConfig(poll_interval_s=0.1, heartbeat_interval_s=2, feed_interval_s=0.2))
    with Server(app) as server:
        yield server, ctx, feeds
    store.close()
    log.close()


def demo_dashboards(catalog, store):
    """The demo's provisioned dashboards (config/dashboards/), as `sketchboard api` wires them."""
    from dashboard.provisioning import load_dashboards_dir
    from dashboard.service import DashboardService
    from store.dashboards import DashboardStore

    service = DashboardService(catalog, DashboardStore(store.side_db()))
    service.sync_files(load_dashboards_dir(REPO_ROOT / "config" / "dashboards", catalog))
    return service


def commit(server, ctx, events):
    post(server, events)
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(time.time() * 1000))


def points_of(page, chart_id: str) -> int:
    return int(page.get_attribute(f"#{chart_id}", "data-non-empty-points") or 0)


def total_count(page, chart: str) -> float:
    return page.evaluate(f"window.sketchboard.charts.get('{chart}').totalCount()")


def test_dashboard_shows_live_points_offline_without_errors(live, watched_page, artifacts):
    server, ctx, feeds = live
    now = int(time.time() * 1000)
    commit(server, ctx, [ev(now - 60_000 + i * 100, endpoint=("/api/cart", "/api/search")[i % 2],
                            latency=float(5 + i % 50), user=f"u{i}", region=("eu", "us")[i % 2]) for i in range(200)])

    page, watch = watched_page(server.http, "/?metric=requests&stat=count&group_by=endpoint&range=15m")
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    page.wait_for_function("Number(document.querySelector('#chart-main').dataset.nonEmptyPoints || 0) > 0",
                           timeout=15_000)
    page.wait_for_function("document.querySelectorAll('#chart-main .scatterlayer .trace').length === 2",
                           timeout=5_000)  # one per endpoint
    assert total_count(page, "main") == 200
    renders = int(page.get_attribute("#chart-main", "data-renders"))

    # New events through the API, committed: they appear without a reload.
    commit(server, ctx, [ev(now - 5_000, endpoint="/api/checkout", latency=80.0, user=f"v{i}") for i in range(30)])
    page.wait_for_function("window.sketchboard.charts.get('main').totalCount() === 230", timeout=15_000)
    page.wait_for_function("document.querySelectorAll('#chart-main .scatterlayer .trace').length === 3",
                           timeout=5_000)  # rendering is throttled: the model leads the DOM a little
    assert int(page.get_attribute("#chart-main", "data-renders")) > renders
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # never reloaded

    # The demo's overview dashboard fills too (its latency band is panel 1); the pipeline feed
    # drives the status strip.
    assert page.get_attribute("#dashboard-area", "data-dashboard") == "overview"
    page.wait_for_function("Number(document.querySelector('#panel-chart-1').dataset.nonEmptyPoints || 0) > 0",
                           timeout=10_000)
    page.wait_for_function("document.querySelector('#status-last-batch').textContent.startsWith('batch 1')",
                           timeout=10_000)
    page.wait_for_timeout(600)
    page.screenshot(path=str(artifacts / "dashboard-dark.png"), full_page=True)

    assert watch.errors == []
    assert watch.foreign == [], watch.foreign
    assert any(u.endswith("/static/plotly.min.js") for u in watch.requests)


def test_url_state_theme_corrections_and_lag_panels(live, watched_page, artifacts):
    server, ctx, feeds = live
    now = int(time.time() * 1000)
    commit(server, ctx, [ev(now - 30_000 + i, latency=float(i), user=f"u{i}") for i in range(50)])

    page, watch = watched_page(server.http, "/", color_scheme="light")
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    assert page.text_content("#lag-status") == "waiting for data"
    assert page.text_content("#corrections-empty") == "waiting for data"

    # Choosing a view puts it in the URL; reloading that URL restores it.
    page.select_option("#metric", "latency")
    page.select_option("#stat", "p99")
    page.select_option("#group-by", "region")
    page.select_option("#range", "1h")
    assert "metric=latency" in page.url and "stat=p99" in page.url and "group_by=region" in page.url
    assert "range=1h" in page.url
    page.wait_for_function("Number(document.querySelector('#chart-main').dataset.nonEmptyPoints || 0) > 0",
                           timeout=10_000)
    page.reload()
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    assert page.input_value("#metric") == "latency" and page.input_value("#stat") == "p99"
    assert page.input_value("#group-by") == "region" and page.input_value("#range") == "1h"
    page.wait_for_function("Number(document.querySelector('#chart-main').dataset.nonEmptyPoints || 0) > 0",
                           timeout=10_000)

    # Feeds: a correction is listed and marks the chart; a lag message sets the badge and charts.
    pane = now - 30_000 - (now - 30_000) % 10_000
    feeds["corrections"].put({
        "type": "correction", "id": 1, "stream": "http_requests", "pane_start_ms": pane, "pane_end_ms": pane + 10_000,
        "dims": {"endpoint": "/api/cart", "method": "GET", "status": "200", "region": "eu"}, "revision_from": 1,
        "revision_to": 2, "batch_id": 3, "events_added": 2, "at_ms": now,
        "old": {"count": 50, "values": {}, "distinct": {}}, "new": {"count": 52, "values": {}, "distinct": {}}})
    feeds["lag"].put({
        "type": "lag", "at_ms": now, "pipeline": "main", "status": "WARN", "reason": "lag grew for 3 checks",
        "lag_events": 1200, "lag_seconds": 3.4,
        "streams": {"http_requests": {"status": "WARN", "reason": "x", "lag_events": 1200, "lag_seconds": 3.4,
                                      "partitions": {"0": {"log_end": 10, "committed": 5, "lag_events": 700,
                                                           "lag_seconds": 3.4, "status": "WARN", "reason": "x"},
                                                     "1": {"log_end": 10, "committed": 5, "lag_events": 500,
                                                           "lag_seconds": 1.0, "status": "OK", "reason": ""}}}}})
    page.wait_for_selector("#corrections-list li", timeout=10_000)
    assert "rev 1→2" in page.text_content("#corrections-list li")
    assert page.evaluate("window.sketchboard.charts.get('main').corrections.length") == 1
    page.wait_for_selector("#lag-status[data-status=WARN]", timeout=10_000)
    assert page.text_content("#lag-reason") == "lag grew for 3 checks"
    page.wait_for_function("document.querySelectorAll('#lag-chart-events .scatterlayer .trace').length === 2",
                           timeout=5_000)

    page.click("#theme-toggle")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.wait_for_timeout(600)
    page.screenshot(path=str(artifacts / "dashboard-feeds.png"), full_page=True)
    assert watch.errors == []
    assert watch.foreign == []


def test_bad_explorer_input_shows_the_servers_reason(live, watched_page):
    server, ctx, feeds = live
    page, watch = watched_page(server.http, "/?metric=latency&stat=avg&filter=planet%3Dmars")
    page.wait_for_selector("#chart-main[data-state=error]", timeout=15_000)
    assert "unknown dimension 'planet'" in page.text_content("#chart-main")
    assert watch.errors == []


def test_an_explorer_filter_value_may_hold_a_comma(live, watched_page):
    # util.js splitPairs splits as the server does: before a name and '=' only (was: every comma,
    # so 'region=eu,west' sent 'west' alone and the chart showed the server's 400).
    server, ctx, feeds = live
    page, watch = watched_page(server.http, "/?metric=latency&stat=avg&filter=region%3Deu%2Cwest%2C%20method%3DGET")
    page.wait_for_selector("#chart-main[data-state=live]", timeout=15_000)
    assert watch.errors == []


def test_the_search_dashboard_shows_the_click_through_rate_of_demo_traffic(live, watched_page, artifacts):
    """The shipped `search_clicks` join: the demo's searches and clicks of the last 5 minutes,
    POSTed and committed (the join by the pipeline's driver side), make the search dashboard's
    CTR panel show per category and minute the exact sum(clicked) / sum(searches) of the events."""
    from tests.support.search_traffic import demo_search_traffic, exact_ctr

    server, ctx, _ = live
    traffic = demo_search_traffic(ctx.catalog, seconds=300, end_s=time.time())
    for stream, events in (("searches", traffic.searches), ("clicks", traffic.clicks)):
        for i in range(0, len(events), 2000):
            post(server, events[i:i + 2000], stream=stream)
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(time.time() * 1000))
    want = {k: c / n for k, (n, c) in exact_ctr(traffic, 30 * 60_000, 60_000).items()}

    page, watch = watched_page(server.http, "/?dashboard=search&range=15m")
    page.wait_for_selector("#dashboard-area[data-dashboard=search]", timeout=15_000)
    index = page.evaluate("""() => [...document.querySelectorAll('[data-testid=dash-panel]')]
        .find((p) => p.dataset.metric === 'search_clicks_clicked').dataset.index""")
    chart = f"panel-chart-{index}"
    page.wait_for_function("(id) => Number(document.getElementById(id).dataset.nonEmptyPoints || 0) > 0",
                           arg=chart, timeout=15_000)
    shown = page.evaluate(f"""() => [...window.sketchboard.charts.get('panel-{index}').series.values()]
        .flatMap((e) => [...e.points.values()].filter((p) => p.value !== null && p.count > 0)
        .map((p) => [e.group.query_category, p.t, p.value]))""")
    assert shown and {(cat, t): v for cat, t, v in shown} == want
    # A category's minute may have no click (CTR 0): the demo's traffic is random; some must have some.
    assert 0 <= min(want.values()) and 0 < max(want.values()) <= 1
    page.screenshot(path=str(artifacts / "dashboard-search-ctr.png"), full_page=True)
    assert watch.errors == [] and watch.foreign == []


HOSTILE_VALUES = ['<a href="https://evil.example/login">sign in</a>', '<b>bold</b> & <span style="font-size:60px">big</span>']


def test_a_producers_dimension_values_show_as_text_in_the_legend(live, watched_page):
    # Plotly renders trace names as pseudo-HTML: a region of '<a href=...>' drew a link in the
    # legend and the hover label (was: groupLabel raw as the trace name; util.js plotlyText).
    server, ctx, feeds = live
    now = int(time.time() * 1000)
    commit(server, ctx, [ev(now - 60_000 + i * 1000, region=HOSTILE_VALUES[i % 2], user=f"u{i}") for i in range(20)])
    page, watch = watched_page(server.http, "/?metric=requests&stat=count&group_by=region&range=15m")
    page.wait_for_function("() => document.querySelectorAll('#chart-main .legend .traces').length === 2", timeout=15_000)
    legend = page.evaluate("""() => [...document.querySelectorAll('#chart-main .legend .traces')].map((t) => ({
        text: t.querySelector('text').textContent, links: t.querySelectorAll('a').length,
        styled: t.querySelectorAll('tspan[style]').length}))""")
    assert sorted(x["text"] for x in legend) == sorted(HOSTILE_VALUES)
    assert all(x["links"] == 0 and x["styled"] == 0 for x in legend), legend
    hover = page.evaluate("""async () => {
        const gd = document.getElementById('chart-main');
        Plotly.Fx.hover(gd, [{curveNumber: 0, pointNumber: 0}]);
        await new Promise((r) => setTimeout(r, 200));
        const h = gd.querySelector('.hoverlayer');
        return {text: h.textContent, links: h.querySelectorAll('a').length,
                big: [...h.querySelectorAll('tspan[style]')].filter((s) => /60px/.test(s.getAttribute('style'))).length}; }""")
    assert hover["links"] == 0 and hover["big"] == 0 and any(v in hover["text"] for v in HOSTILE_VALUES), hover
    assert watch.errors == []


def test_the_explorer_filter_in_the_url_shows_as_text_in_the_error(live, watched_page):
    # The server's reason quotes the filter; the chart's error annotation rendered it as markup.
    server, ctx, feeds = live
    bad = "<b>THIS DASHBOARD HAS MOVED</b><br>see evil.example"
    page, watch = watched_page(server.http, "/?metric=requests&stat=count&range=15m&filter="
                               + urllib.parse.quote(bad + "=1"))
    page.wait_for_selector("#chart-main[data-state=error]", timeout=15_000)
    page.wait_for_selector("#chart-main .annotation text", timeout=5_000)
    shown = page.evaluate("""() => { const t = document.querySelector('#chart-main .annotation text');
        return {text: t.textContent, links: t.querySelectorAll('a').length, bold: t.querySelectorAll('tspan[style]').length}; }""")
    assert bad in shown["text"] and shown["links"] == 0 and shown["bold"] == 0, shown


WS_RECORDER = """window.__ws = { opened: 0, sent: 0, closes: [] };
(() => { const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(url, protocols) { super(url, protocols); window.__ws.opened += 1;
      this.addEventListener("close", (e) => window.__ws.closes.push({ code: e.code, reason: e.reason })); }
    send(data) { window.__ws.sent += 1; return super.send(data); } }; })();"""


@contextlib.contextmanager
def opened_page(browser, url: str, *, record_ws: bool = False, page_clock: bool = False, **context_options):
    """A page of its own browser context (`context_options`: locale, timezone_id, ...) at `url`,
    its websocket open; with `record_ws`, its sockets counted in window.__ws (WS_RECORDER); with
    `page_clock`, Playwright's clock installed before it loads (page.clock can then jump its time)."""
    context = browser.new_context(bypass_csp=True, **context_options)
    try:
        page = context.new_page()
        if record_ws:
            page.add_init_script(WS_RECORDER)
        if page_clock:
            page.clock.install()
        page.goto(url)
        page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
        yield page
    finally:
        context.close()


def test_quick_range_changes_on_a_big_dashboard_keep_the_socket_open(live, browser):
    # Each range change sent an unsubscribe and a subscribe per panel (32 messages on the
    # overview): two changes within a second passed the server's 20 messages/s (burst 50) and
    # the socket was closed with 1008. Now one subscribe per chart under its stable id
    # (replace-by-id), the changes coalesced into one round.
    server, ctx, _ = live
    now = int(time.time() * 1000)
    commit(server, ctx, [ev(now - 30_000 + i * 500, user=f"u{i}") for i in range(20)])
    with opened_page(browser, server.http + "/?dashboard=overview&range=15m", record_ws=True) as page:
        panels = page.locator("[data-testid=dash-panel]").count()
        assert panels >= 10
        page.wait_for_timeout(3_000)  # the server's message bucket is full again
        before = page.evaluate("window.__ws.sent")
        page.focus("#range")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowDown")
        assert page.eval_on_selector("#range", "e => e.value") == "6h"
        page.wait_for_function("""() => [...window.sketchboard.charts.values()].every((c) => c.result &&
            c.query.from === 'now-6h' && c.result.end - c.result.start >= 6 * 3600e3 - 60e3)""", timeout=15_000)
        page.wait_for_timeout(1_500)
        assert page.evaluate("window.__ws.closes") == []
        assert page.evaluate("window.__ws.opened") == 1
        assert page.get_attribute("#status-connection", "data-state") == "open"
        assert page.evaluate("window.__ws.sent") - before <= panels + 1  # one round: a subscribe per chart


def test_range_changes_in_a_row_on_a_24_panel_dashboard_are_paced_within_the_servers_limits(live, browser):
    # A round is 25 messages on the biggest dashboard (24 panels, the explorer, ...): range
    # changes 400 ms apart, each its own round, passed 20 messages/s (burst 50) and the server
    # closed the socket with 1008. Now the page paces what it sends by the limits the pong says.
    import httpx

    server, ctx, _ = live
    now = int(time.time() * 1000)
    commit(server, ctx, [ev(now - 60_000 + i * 100, endpoint=f"/e{i % 3}", user=f"u{i}") for i in range(60)])
    r = httpx.post(server.http + "/api/v1/dashboards", json={"name": "big", "range": "15m", "panels": [
        {"metric": "requests", "stat": "count", "kind": "line", "group_by": ["endpoint"] if i % 2 else []}
        for i in range(24)]}, timeout=10)
    assert r.status_code in (200, 201), r.text
    with opened_page(browser, server.http + "/?dashboard=big&range=5m", record_ws=True) as page:
        assert page.locator("[data-testid=dash-panel]").count() == 24
        page.wait_for_timeout(3_000)  # the server's message bucket is full again
        for rng in ["15m", "1h", "6h", "24h", "5m", "1h"]:
            page.select_option("#range", rng)
            page.wait_for_timeout(400)
        page.wait_for_function("""() => [...window.sketchboard.charts.values()].every((c) => c.result &&
            c.query.from === 'now-1h')""", timeout=20_000)
        page.wait_for_timeout(1_000)
        assert page.evaluate("window.__ws.closes") == []
        assert page.evaluate("window.__ws.opened") == 1
        assert page.get_attribute("#status-connection", "data-state") == "open"


class FreezableProxy:
    """A TCP proxy on loopback in front of the server that can stop forwarding in both
    directions while keeping its connections open: a server that answers nothing (as a frozen
    process or a dead network path looks to the browser)."""

    def __init__(self, port: int):
        import socket
        import threading

        self.upstream = port
        self.frozen = threading.Event()
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.http = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        src.settimeout(0.2)
        while not self.stopped.is_set():
            if self.frozen.is_set():
                time.sleep(0.1)
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break

    def close(self):
        self.stopped.set()
        for s in [self.listener, *self.sockets]:
            try:
                s.close()
            except OSError:
                pass


def test_a_silent_socket_is_not_shown_live_and_is_replaced_at_once(live, browser):
    # The page took a socket silent for 3 heartbeat intervals for dead but called ws.close() and
    # waited for onclose, which fires only once the closing handshake with a server that answers
    # nothing times out (about a minute): "live" all along. Now it drops the socket and reconnects.
    server, ctx, _ = live
    proxy = FreezableProxy(server.port)
    try:
        with opened_page(browser, proxy.http + "/?metric=requests&stat=count&range=15m", record_ws=True) as page:
            page.wait_for_function("() => window.sketchboard.conn.heartbeatMs > 0", timeout=5_000)
            heartbeat_ms = page.evaluate("window.sketchboard.conn.heartbeatMs")
            proxy.frozen.set()
            frozen_at = time.monotonic()
            page.wait_for_function("() => window.__ws.opened >= 2", timeout=3 * heartbeat_ms + 6_000)
            assert time.monotonic() - frozen_at < (3 * heartbeat_ms + 5_000) / 1000
            assert page.get_attribute("#status-connection", "data-state") != "open"
            proxy.frozen.clear()  # the server answers again: the new socket opens
            page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    finally:
        proxy.close()


def test_a_page_held_up_with_its_clock_running_does_not_take_its_socket_for_dead(live, browser):
    # After the machine was held up (a laptop's sleep, a VM without CPU for seconds), the page's
    # silence check ran first and saw no message for longer than 3 heartbeat intervals while the
    # server had had no chance to send: it closed a live socket (1005, CI's 24-panel dashboard
    # test). A late check now leaves the judgement to the next one. Playwright's clock jumps the
    # page's time ahead, firing the check once, late, as such a hold-up does.
    server, ctx, _ = live
    url = server.http + "/?metric=requests&stat=count&range=15m"
    with opened_page(browser, url, record_ws=True, page_clock=True) as page:
        page.wait_for_function("() => window.sketchboard.conn.heartbeatMs > 0", timeout=5_000)
        heartbeat_ms = page.evaluate("window.sketchboard.conn.heartbeatMs")
        page.clock.fast_forward(3 * heartbeat_ms + 4_000)
        page.wait_for_timeout(2_500)  # checks on time after it, heartbeats coming
        assert page.evaluate("window.__ws.closes") == [] and page.evaluate("window.__ws.opened") == 1
        assert page.get_attribute("#status-connection", "data-state") == "open"


@pytest.mark.parametrize("locale, want", [
    ("en-US", {"1234": "1,234", "1.234": "1.234", "1234567.5": "1,234,568", "big": "1.235E290"}),
    ("de-DE", {"1234": "1.234", "1.234": "1,234", "1234567.5": "1.234.568", "big": "1,235E290"}),
])
def test_numbers_read_the_same_in_every_locale(live, browser, locale, want):
    # fmtNum localized only |v| >= 1000: in de-DE 1234 and 1.234 both printed "1.234"; 1e290
    # printed 291 digits.
    server, ctx, _ = live
    with opened_page(browser, server.http + "/?metric=requests&stat=count&range=15m", locale=locale) as page:
        got = page.evaluate("""async () => { const u = await import('/static/util.js');
            return {"1234": u.fmtNum(1234), "1.234": u.fmtNum(1.234), "1234567.5": u.fmtNum(1234567.5),
                    "big": u.fmtNum(1.2345e290)}; }""")
        assert got == want


def test_a_dashboard_without_refresh_keeps_its_time_axis_still_as_points_arrive(live, watched_page):
    # dashboard.md: `refresh` none, the range stays still (points arrive live either way). Each
    # render drew the relative range up to the browser's now, and each push moved it.
    import httpx

    server, ctx, _ = live
    commit(server, ctx, [ev(int(time.time() * 1000) - 30_000 + i * 1000, user=f"u{i}") for i in range(10)])
    r = httpx.post(server.http + "/api/v1/dashboards", json={"name": "still", "range": "5m", "refresh": None,
                   "panels": [{"metric": "requests", "stat": "count", "kind": "line"}]}, timeout=10)
    assert r.status_code in (200, 201), r.text
    page, watch = watched_page(server.http, "/?dashboard=still&range=5m")
    page.wait_for_selector("#panel-chart-0[data-state=live]", timeout=15_000)
    shown = "() => document.getElementById('panel-chart-0').layout.xaxis.range.join(' .. ')"
    before = page.evaluate(shown)
    renders = int(page.get_attribute("#panel-chart-0", "data-renders"))
    for i in range(2):
        page.wait_for_timeout(1_500)
        commit(server, ctx, [ev(int(time.time() * 1000) - 1_000, user=f"v{i}")])
    page.wait_for_function("(n) => Number(document.getElementById('panel-chart-0').dataset.renders) > n",
                           arg=renders, timeout=10_000)
    page.wait_for_timeout(1_000)
    assert page.evaluate(shown) == before
    assert watch.errors == []


@pytest.mark.parametrize("timezone", ["UTC", "Europe/Berlin", "America/New_York"])
def test_a_shared_custom_range_url_shows_the_same_window_in_every_time_zone(live, browser, timezone):
    # The URL held the custom range as zone-less local wall time: one link, another window per
    # zone. It now holds epoch ms; an old link's local form is still read (as local time).
    server, ctx, _ = live
    start, end = 1_796_068_800_000, 1_796_072_400_000  # 2026-11-30 20:00Z .. 21:00Z
    context = browser.new_context(timezone_id=timezone, bypass_csp=True)
    try:
        page = context.new_page()
        page.goto(server.http + f"/?metric=requests&stat=count&range=custom&from={start}&to={end}")
        page.wait_for_selector("#chart-main[data-state=live]", timeout=15_000)
        assert page.evaluate("window.sketchboard.charts.get('main').query")["from"] == str(start)
        assert page.evaluate("window.sketchboard.charts.get('main').query")["to"] == str(end)
        assert f"from={start}" in page.url and f"to={end}" in page.url
        page.goto(server.http + "/?metric=requests&stat=count&range=custom&from=2026-11-30T20:00:00&to=2026-11-30T21:00:00")
        page.wait_for_selector("#chart-main[data-state=live]", timeout=15_000)
        local = page.evaluate("[new Date('2026-11-30T20:00:00').getTime(), new Date('2026-11-30T21:00:00').getTime()]")
        query = page.evaluate("window.sketchboard.charts.get('main').query")
        assert [int(query["from"]), int(query["to"])] == local
        assert f"from={local[0]}" in page.url  # rewritten as an instant
    finally:
        context.close()


def test_the_two_instants_of_a_dst_fall_back_hour_are_drawn_apart(live, browser):
    # Charts gave Plotly local wall time ("2026-11-01 01:30:00.000"): in New York the fall-back
    # night's 01:00-02:00 EDT and 01:00-02:00 EST got the same x, drawn on top of each other.
    # Now x is the instant (epoch ms) and only the labels are local.
    server, ctx, _ = live
    with opened_page(browser, server.http + "/?metric=requests&stat=count&range=15m",
                     timezone_id="America/New_York") as page:
        got = page.evaluate("""async () => {
            const { LiveChart } = await import('/static/chart.js');
            const host = document.createElement('div');
            host.style.width = '800px'; host.style.height = '300px';
            document.body.append(host);
            const chart = new LiveChart(host, { kind: 'line' });
            const step = 15 * 60e3, t0 = Date.UTC(2026, 10, 1, 4, 0), end = t0 + 4 * 3600e3;
            const points = [];
            for (let t = t0; t < end; t += step) points.push({ t, value: 1, count: 1, final: true, revision: 1 });
            chart.query = { from: String(t0), to: String(end) };
            chart.snapshot({ start: t0, end, step_ms: step, window_ms: step, watermark_ms: null, stat: 'count',
                             stats: ['count'], series: [{ stat: 'count', group: {}, points }] });
            chart.renderPlot();
            const xa = host._fullLayout.xaxis, xs = host._fullData[0].x;
            return { pixels: xs.map((x) => xa.d2p(x)), hover: chart.traces()[0].customdata.map((c) => c.split('<br>')[0]),
                     ticks: [...host.querySelectorAll('.xtick text')].map((t) => t.textContent) };
        }""")
        pixels = got["pixels"]
        assert len(pixels) == 16 and all(b - a > 5 for a, b in zip(pixels, pixels[1:])), pixels
        assert len(set(got["hover"])) == 16  # 01:30 EDT and 01:30 EST read apart
        assert "2026-11-01 01:30:00 (UTC−04:00)" in got["hover"] and "2026-11-01 01:30:00 (UTC−05:00)" in got["hover"]
        assert got["ticks"], got


def test_the_lag_charts_draw_a_dst_fall_back_hours_samples_apart(live, browser):
    # The lag charts gave Plotly local wall time too: in New York the samples of the fall-back
    # night's two 01:00-02:00 hours shared their x. Their x is the sample's instant now.
    server, ctx, _ = live
    with opened_page(browser, server.http + "/?metric=requests&stat=count&range=15m",
                     timezone_id="America/New_York") as page:
        got = page.evaluate("""async () => {
            const s = window.sketchboard.status;
            s.handle = () => {};  // the live feed draws no more
            await new Promise((r) => setTimeout(r, 1500));  // a draw it had planned is done
            clearTimeout(s.lag.timer);
            s.lag = { keys: [], plotted: false, pending: [], timer: null, drawnAt: 0, consumers: null };
            const t0 = Date.UTC(2026, 10, 1, 5, 0), step = 15 * 60e3;  // 01:00 EDT; 01:00 EST is 4 steps on
            for (let i = 0; i < 9; i++) {
              s.onLag({ type: 'lag', status: 'OK', at_ms: t0 + i * step,
                        streams: { http_requests: { lag_events: i, lag_seconds: i, partitions: {} } } });
            }
            clearTimeout(s.lag.timer);
            s.drawLag();
            const host = document.getElementById('lag-chart-events');
            const xa = host._fullLayout.xaxis, trace = host._fullData[0];
            return { pixels: trace.x.map((x) => xa.d2p(x)), hover: trace.customdata,
                     ticks: host._fullLayout.xaxis.ticktext };
        }""")
        pixels = got["pixels"]
        assert len(pixels) == 9 and all(b - a > 5 for a, b in zip(pixels, pixels[1:])), pixels
        assert "2026-11-01 01:00:00 (UTC−04:00)" in got["hover"] and "2026-11-01 01:00:00 (UTC−05:00)" in got["hover"]
        assert len(set(got["hover"])) == 9 and got["ticks"], got


def test_stat_and_table_panels_show_the_newest_final_step_when_traffic_stops(live, watched_page):
    # dashboard.md: `stat` the newest value, `table` the groups by their newest value. Every step
    # without events was passed over, so a final empty step (traffic stopped) showed the value of
    # ten minutes ago: now only the step still filling is, a final empty one is 0 (a count) or
    # "no data" (a percentile of no events).
    import httpx

    server, ctx, _ = live
    now = int(time.time() * 1000)
    then = (now - 600_000) // 60_000 * 60_000 + 1_000  # the 50 events in one 1-minute step, not across two
    commit(server, ctx, [ev(then + i * 100, endpoint="/a", latency=900.0, user=f"u{i}") for i in range(50)])
    commit(server, ctx, [ev(now - 1_000, endpoint="/b", latency=1.0)])  # the stream's clock moves on
    r = httpx.post(server.http + "/api/v1/dashboards", json={"name": "stopped", "range": "15m", "panels": [
        {"metric": "requests", "stat": "count", "kind": "stat", "step": "1m", "filters": {"endpoint": "/a"}},
        {"metric": "latency", "stat": "p99", "kind": "stat", "step": "1m", "filters": {"endpoint": "/a"}},
        {"metric": "requests", "stat": "count", "kind": "table", "step": "1m", "group_by": ["endpoint"]}]},
        timeout=10)
    assert r.status_code in (200, 201), r.text
    page, watch = watched_page(server.http, "/?dashboard=stopped&range=15m")
    for i in range(3):
        page.wait_for_selector(f"#panel-chart-{i}[data-state=live]", timeout=15_000)
    page.wait_for_selector("#panel-chart-2 [data-testid=top-groups] tr[data-group='/a']", timeout=10_000)
    stat = "(i) => document.querySelector(`#panel-chart-${i} .stat-value b`).textContent"
    assert page.evaluate(stat, 0) == "0"
    assert page.evaluate(stat, 1) == "no data"
    row = page.evaluate("""() => [...document.querySelectorAll("#panel-chart-2 tr[data-group='/a'] td")]
        .map((td) => td.textContent)""")
    assert row == ["/a", "0", "50"]  # newest 0, its peak beside it
    assert watch.errors == []
