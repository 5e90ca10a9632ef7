"""Dashboards on a configuration that is not the demo's (tests/configs/sensors: a sensor stream
with `site` and `kind` dimensions), in a real headless Chromium against the real app on
loopback: the dashboard generated from the catalog shows a panel per metric with data; a
dashboard built in the page's editor comes back, panels, range and the panel being edited, from
its URL; a drag on one chart zooms every chart; a change made elsewhere (the API) is not
overwritten by the page's editor, which says so and offers to reload."""

from __future__ import annotations

import time

import httpx
import pytest

from api.app import create_app
from api.ws_hub import HubConfig
from catalog import load_catalog
from tests.api.test_dashboards_api import SENSORS
from tests.api.test_ws import Server, post
from tests.api.test_ws_support import drain_log_into_store
from tests.browser.test_dashboard import LiveClock

pytestmark = pytest.mark.browser

STREAM = "sensor_readings"
HAS_DATA = "(id) => Number(document.getElementById(id).dataset.nonEmptyPoints || 0) > 0"


@pytest.fixture
def live(tmp_path):
    from api.context import ApiContext
    from dashboard.service import DashboardService
    from ingest.log import SqliteEventLog
    from store import SqlitePaneStore
    from store.dashboards import DashboardStore

    catalog = load_catalog(SENSORS)
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    dashboards = DashboardStore(store.side_db())
    ctx = ApiContext(catalog=catalog, log=log, store=store, clock=LiveClock(),
                     dashboards=DashboardService(catalog, dashboards))
    app = create_app(ctx, hub_config=HubConfig(poll_interval_s=0.1, heartbeat_interval_s=2, feed_interval_s=0.2))
    with Server(app) as server:
        now = int(time.time() * 1000)
        post(server, [{"ts": now - 50_000 + i * 200, "device": f"d{i % 7}", "site": ("north", "south")[i % 2],
                       "kind": ("temp", "humidity")[i % 3 == 0], "reading": float(i % 40)} for i in range(240)],
             stream=STREAM)
        drain_log_into_store(catalog, log, store, now)
        yield server
    dashboards.close()
    store.close()
    log.close()


def open_dashboard(watched_page, server, path="/"):
    page, watch = watched_page(server.http, path)
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    page.wait_for_selector("[data-testid=dash-panel]", timeout=15_000)
    return page, watch


def panels(page) -> list[dict]:
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid=dash-panel]')].map((p) => ({
        metric: p.dataset.metric, kind: p.dataset.kind, title: p.querySelector('.panel-title').textContent}))""")


def test_the_generated_dashboard_shows_a_panel_per_metric_with_data(live, watched_page, artifacts):
    page, watch = open_dashboard(watched_page, live)
    assert page.get_attribute("#dashboard-source", "data-source") == "generated"
    assert [p["metric"] for p in panels(page)] == ["readings", "reading_value"]
    for i in range(2):
        page.wait_for_function(HAS_DATA, arg=f"panel-chart-{i}", timeout=15_000)
    page.wait_for_function(HAS_DATA, arg="chart-main", timeout=15_000)
    # The explorer offers this configuration's names, and its placeholders come from them.
    assert page.input_value("#metric") == "reading_value"
    assert page.get_attribute("#filter", "placeholder") == "site=…, kind=…"
    assert page.evaluate("[...document.querySelectorAll('#group-by option')].map((o) => o.value)") == ["", "site", "kind"]
    link = page.get_attribute("#query-link", "href")  # the explorer's series over REST
    assert link.startswith("/api/v1/query?metric=reading_value&stat=p99&from=now-1h&to=now&step=30s"), link
    page.screenshot(path=str(artifacts / "dashboard-generated-sensors.png"), full_page=True)

    # Provisioned and generated dashboards are edited as copies: duplicate, then delete the copy.
    assert page.is_disabled("#dashboard-delete")
    page.click("#dashboard-duplicate")
    assert page.input_value("#df-name") == "metrics-copy"
    page.click("#df-submit")
    page.wait_for_selector("#dashboard-area[data-dashboard=metrics-copy]", timeout=10_000)
    assert page.get_attribute("#dashboard-source", "data-source") == "api" and len(panels(page)) == 2
    page.click("#dashboard-delete")
    page.click("#dashboard-delete")  # the second click confirms
    page.wait_for_selector("#dashboard-area[data-dashboard=metrics]", timeout=10_000)
    assert page.get_attribute("#dashboard-source", "data-source") == "generated"
    page.wait_for_function(HAS_DATA, arg="panel-chart-1", timeout=15_000)
    assert watch.errors == [] and watch.foreign == []


def test_a_dashboard_built_in_the_editor_comes_back_from_its_url(live, watched_page, artifacts):
    page, watch = open_dashboard(watched_page, live)
    page.click("#dashboard-new")
    page.fill("#df-name", "plant")
    page.fill("#df-title", "Plant floor")
    page.click("#df-submit")
    page.wait_for_selector("#dashboard-area[data-dashboard=plant]", timeout=10_000)
    assert panels(page) == [] and "dashboard=plant" in page.url

    page.click("#panel-add")
    assert "edit=new" in page.url
    page.select_option("#pe-metric", "reading_value")
    page.select_option("#pe-kind", "line")
    page.select_option("#pe-stat", "p95")
    page.select_option("#pe-group-by", ["site"])
    page.fill("#pe-filters", "kind=temp")
    page.click("#panel-apply")
    page.wait_for_function("document.querySelectorAll('[data-testid=dash-panel]').length === 1", timeout=10_000)
    assert "edit=" not in page.url

    # A table needs a group-by: the server's reason is shown and nothing is saved.
    page.click("#panel-add")
    page.select_option("#pe-metric", "readings")
    page.select_option("#pe-kind", "table")
    page.click("#panel-apply")
    page.wait_for_selector("#panel-editor-error:not([hidden])", timeout=10_000)
    assert "top groups" in page.text_content("#panel-editor-error")
    page.select_option("#pe-group-by", ["kind"])
    page.click("#panel-apply")
    page.wait_for_function("document.querySelectorAll('[data-testid=dash-panel]').length === 2", timeout=10_000)

    page.select_option("#range", "6h")
    page.locator("[data-testid=dash-panel][data-index='0'] [data-testid=panel-edit]").click()
    assert "range=6h" in page.url and "edit=0" in page.url
    built = panels(page)
    assert [(p["metric"], p["kind"]) for p in built] == [("reading_value", "line"), ("readings", "table")]

    again, watch2 = open_dashboard(watched_page, live, page.url[len(live.http):])
    assert panels(again) == built
    assert again.input_value("#range") == "6h" and again.input_value("#dashboard-select") == "plant"
    again.wait_for_selector("#panel-editor:not([hidden])", timeout=5_000)
    assert again.input_value("#pe-stat") == "p95" and again.input_value("#pe-filters") == "kind=temp"
    again.wait_for_function(HAS_DATA, arg="panel-chart-0", timeout=15_000)
    again.wait_for_selector("#panel-chart-1 [data-testid=top-groups] tr[data-group=temp]", timeout=15_000)
    assert again.evaluate("window.sketchboard.charts.get('panel-0').query.from") == "now-6h"
    again.screenshot(path=str(artifacts / "dashboard-built-in-editor.png"), full_page=True)
    # The browser logs the refused table's 400 itself; nothing else may be logged.
    assert [e for e in watch.errors if "status of 400" not in e] == [] and watch2.errors == []


def test_the_editor_does_not_overwrite_a_change_made_elsewhere_and_offers_to_reload(live, watched_page):
    """Optimistic concurrency: the page edited version v; automation changed the dashboard since
    (a panel added through the API): the page's save is refused, says why, and its reload button
    shows the current dashboard; a delete elsewhere and a link to an unknown name are announced."""
    api = f"{live.http}/api/v1/dashboards"
    board = {"name": "plant", "title": "Plant", "panels": [
        {"title": "P-one", "metric": "readings", "stat": "count"},
        {"title": "P-two", "metric": "reading_value", "stat": "p95"}]}
    assert httpx.post(api, json=board, timeout=10).status_code == 201
    page, watch = open_dashboard(watched_page, live, "/?dashboard=plant")
    assert [p["title"] for p in panels(page)] == ["P-one", "P-two"]

    three = {**board, "panels": [*board["panels"], {"title": "P-three", "metric": "readings", "stat": "count"}]}
    assert httpx.put(f"{api}/plant", json=three, timeout=10).status_code == 200  # automation: unversioned
    page.locator("[data-testid=dash-panel][data-index='1'] [data-testid=panel-edit]").click()
    page.fill("#pe-title", "renamed")
    page.click("#panel-apply")
    page.wait_for_selector("#panel-editor-error:not([hidden])", timeout=10_000)
    assert "changed by someone else since you loaded it" in page.text_content("#panel-editor-error")
    assert "changed by someone else" in page.text_content("#dashboard-notice-text")
    stored = httpx.get(f"{api}/plant", timeout=10).json()
    assert [p["title"] for p in stored["panels"]] == ["P-one", "P-two", "P-three"]  # nothing overwritten

    page.click("#dashboard-notice-reload")
    page.wait_for_function("document.querySelectorAll('[data-testid=dash-panel]').length === 3", timeout=10_000)
    assert page.is_hidden("#dashboard-notice")

    assert httpx.delete(f"{api}/plant", timeout=10).status_code == 204
    page.wait_for_selector("#dashboard-notice:not([hidden])", timeout=15_000)  # the periodic check
    assert "deleted elsewhere" in page.text_content("#dashboard-notice-text")

    other, watch2 = open_dashboard(watched_page, live, "/?dashboard=nope")
    other.wait_for_selector("#dashboard-notice:not([hidden])", timeout=10_000)
    assert 'no dashboard named "nope"' in other.text_content("#dashboard-notice-text")
    # The browser logs the refused save's 409 itself; nothing else may be logged.
    assert [e for e in watch.errors if "status of 409" not in e] == [] and watch2.errors == []


def test_a_drag_on_one_chart_zooms_every_chart(live, watched_page):
    page, watch = open_dashboard(watched_page, live)
    page.wait_for_function(HAS_DATA, arg="panel-chart-0", timeout=15_000)
    box = page.locator("#panel-chart-0 .nsewdrag").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.6, y)  # to the right edge: the data is in the last minute
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] - 1, y, steps=8)
    page.mouse.up()
    page.wait_for_function("document.getElementById('range').value === 'custom'", timeout=5_000)
    assert "range=custom" in page.url and "from=" in page.url and "to=" in page.url
    # The charts resubscribe once range changes pause (main.js RESUBSCRIBE_MS).
    page.wait_for_function("[...window.sketchboard.charts.values()].every((c) => !/^now/.test(c.query.from))",
                           timeout=5_000)
    ranges = page.evaluate("[...window.sketchboard.charts.values()].map((c) => [c.query.from, c.query.to])")
    assert len(ranges) == 3 and len(set(map(tuple, ranges))) == 1, ranges  # the explorer and both panels
    start, end = map(int, ranges[0])
    assert page.evaluate("window.sketchboard.dashboards.current.range") == "1h"  # the generated one's
    assert 0.3 * 3_600_000 < end - start < 0.5 * 3_600_000  # about the 40 % of the hour dragged over
    for i in range(2):
        page.wait_for_function(HAS_DATA, arg=f"panel-chart-{i}", timeout=15_000)
    # An absolute range stays still; a double click goes back to the relative range.
    page.wait_for_timeout(1500)
    assert page.evaluate("window.sketchboard.charts.get('panel-1').query.from") == str(start)
    page.mouse.dblclick(box["x"] + box["width"] / 2, y)
    page.wait_for_function("document.getElementById('range').value === '1h'", timeout=5_000)
    page.wait_for_function("window.sketchboard.charts.get('panel-0').query.from === 'now-1h'", timeout=5_000)
    assert watch.errors == []
