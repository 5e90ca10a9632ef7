"""The alerts panel and the rule editor in a real Chromium against the real app on loopback: the
real alert routes, store and service (alerts.service.AlertService over the real pane store),
evaluated by hand instead of by its thread so that the test decides when. Rules are created,
refused, edited, silenced and deleted through the form; a firing alert reaches the panel through
the websocket's `alerts` topic."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from alerts.loader import load_rules_file
from alerts.service import AlertService
from alerts.source import StoreAlertData
from api.app import create_app
from api.context import ApiContext
from api.ws_hub import HubConfig
from ingest.log import SqliteEventLog
from store import SqlitePaneStore
from store.alerts import SqliteAlertStore
from tests.api.test_ws import Server, ev, post
from tests.api.test_ws_support import drain_log_into_store
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.browser

FILE_RULE = "slow_endpoint"  # one rule of the repository's config/alerts.yaml, as the file-sourced example
RULE = "search_volume"
REFUSED = re.compile(r"the server responded with a status of (400|409)")


@contextmanager
def alerting_context(tmp_path, catalog, **options) -> Iterator[ApiContext]:
    """An ApiContext over a real log and store in tmp_path with the alert service on them
    (`options`: more ApiContext fields); closed on exit."""
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    alert_store = SqliteAlertStore(tmp_path / "store.db", synchronous="OFF")
    service = AlertService(catalog, alert_store, StoreAlertData(catalog, store), clock=time.time)
    try:
        yield ApiContext(catalog=catalog, log=log, store=store, clock=time.time, alerts=service, **options)
    finally:
        alert_store.close()
        store.close()
        log.close()


@pytest.fixture
def alerting(tmp_path, demo_catalog):
    with alerting_context(tmp_path, demo_catalog) as ctx:
        service = ctx.alerts
        service.sync_file({FILE_RULE: load_rules_file(REPO_ROOT / "config" / "alerts.yaml", demo_catalog)[FILE_RULE]})
        app = create_app(ctx, hub_config=HubConfig(poll_interval_s=0.1, heartbeat_interval_s=2, feed_interval_s=0.2))
        with Server(app) as server:
            yield server, ctx, service


def api_rules(server) -> dict[str, dict]:
    r = httpx.get(f"{server.http}/api/v1/alerts/rules", timeout=10)
    assert r.status_code == 200, r.text
    return {rule["name"]: rule for rule in r.json()["rules"]}


def open_panel(watched_page, server, **kw):
    page, watch = watched_page(server.http, "/", **kw)
    page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
    page.wait_for_selector("#rule-editor[data-ready=true]", timeout=10_000)
    page.wait_for_selector("#alerts-panel[data-state=live]", timeout=10_000)
    return page, watch


def rule_row(page, name: str):
    return page.locator(f"#alert-rules .alert-rule[data-rule='{name}']")


def fill_threshold_rule(page, name: str, *, threshold: str = "5") -> None:
    page.fill("#re-name", name)
    page.select_option("#re-kind", "threshold")
    page.select_option("#re-metric", "requests")
    page.fill("#re-stat", "count")
    page.fill("#re-window", "1m")
    page.fill("#re-group-by", "endpoint")
    page.fill("#re-filters", "method=GET")
    page.select_option("#re-op", ">")
    page.fill("#re-threshold", threshold)
    page.check("#re-provisional")  # reads the newest window, so events just sent count
    page.fill("#re-labels", "severity=page\nteam=search")
    page.fill("#re-annotations", "summary=<b>{{ $labels.endpoint }}</b> served {{ $value }} requests")


def only_expected_errors(watch, refused: list[str]) -> None:
    """Chromium logs each 4xx answer as a console error: the refused rules' (400 invalid, 409 name
    taken), in that order, and nothing else may be there."""
    statuses = [m.group(1) for e in watch.errors if (m := REFUSED.search(e))]
    unexpected = [e for e in watch.errors if not REFUSED.search(e)]
    assert unexpected == [], unexpected
    assert statuses == refused, watch.errors
    assert watch.foreign == [], watch.foreign


def test_rule_editor_creates_refuses_edits_and_deletes(alerting, watched_page, artifacts):
    server, ctx, service = alerting
    page, watch = open_panel(watched_page, server)

    # The file rule is listed read-only; there are no alerts yet.
    file_row = rule_row(page, FILE_RULE)
    file_row.wait_for()
    assert file_row.get_attribute("data-source") == "file"
    assert file_row.locator(".rule-readonly").text_content() == "declared in the alerts YAML file"
    assert file_row.locator(".edit-rule, .delete-rule").count() == 0
    assert page.text_content("#alerts-active-empty") == "nothing firing"
    assert page.text_content("#status-alerts") == "no alerts firing"

    # The form shows the fields of the kind picked.
    for kind, shown, hidden in [("threshold", ["metric", "stat", "window", "op", "threshold"], ["stream", "statuses"]),
                                ("absence", ["stream", "duration", "group_by"], ["metric", "threshold", "op"]),
                                ("lag_status", ["statuses", "stream"], ["metric", "window", "threshold"]),
                                ("trend", ["against", "mode", "metric"], ["duration"]),
                                ("pattern", ["pattern", "keep_firing_for"], ["metric", "stream", "window", "threshold"])]:
        page.select_option("#re-kind", kind)
        for field in shown:
            assert page.locator(f"#rule-editor [data-field={field}]").is_visible(), (kind, field)
        for field in hidden:
            assert page.locator(f"#rule-editor [data-field={field}]").is_hidden(), (kind, field)

    # A rule naming a metric the catalog does not define (a stale page: the select offered it) is
    # refused: the API's message shows verbatim, and nothing is created.
    fill_threshold_rule(page, "bad_rule")
    page.evaluate("""() => { const s = document.getElementById('re-metric');
        s.append(new Option('no_such_metric', 'no_such_metric')); s.value = 'no_such_metric'; }""")
    page.click("#rule-editor-submit")
    error = page.locator("#rule-editor-error")
    error.wait_for(state="visible", timeout=10_000)
    r = httpx.post(f"{server.http}/api/v1/alerts/rules", timeout=10, json={
        "name": "bad_rule", "kind": "threshold", "metric": "no_such_metric", "stat": "count", "window": "1m",
        "group_by": ["endpoint"], "filters": {"method": "GET"}, "op": ">", "threshold": 5, "provisional": True,
        "labels": {"severity": "page", "team": "search"},
        "annotations": {"summary": "<b>{{ $labels.endpoint }}</b> served {{ $value }} requests"}})
    assert r.status_code == 400
    assert error.text_content() == r.json()["detail"]  # verbatim, the same body as the form's
    assert "metric" in error.text_content() and "no_such_metric" in error.text_content()
    assert "bad_rule" not in api_rules(server)
    assert rule_row(page, "bad_rule").count() == 0
    page.locator("#alerts-panel").screenshot(path=str(artifacts / "alerts-editor-error.png"))

    # The same form with a known metric creates the rule: it is listed, and the API has what the form said.
    page.select_option("#re-metric", "requests")
    page.fill("#re-name", RULE)
    page.click("#rule-editor-submit")
    rule_row(page, RULE).wait_for(timeout=10_000)
    assert page.locator("#rule-editor-error").is_hidden()
    assert page.text_content("#rule-editor-status") == f"created {RULE}"
    assert page.input_value("#re-name") == ""  # the form is cleared
    stored = api_rules(server)[RULE]
    assert {k: stored[k] for k in ("kind", "metric", "stat", "window", "group_by", "filters", "op", "threshold",
                                   "provisional", "labels", "annotations", "source", "state")} == {
        "kind": "threshold", "metric": "requests", "stat": "count", "window": "1m", "group_by": ["endpoint"],
        "filters": {"method": "GET"}, "op": ">", "threshold": 5.0, "provisional": True,
        "labels": {"severity": "page", "team": "search"},
        "annotations": {"summary": "<b>{{ $labels.endpoint }}</b> served {{ $value }} requests"},
        "source": "api", "state": "normal"}
    row = rule_row(page, RULE)
    assert row.get_attribute("data-state") == "normal"
    assert row.locator(".rule-what").text_content() == "requests count over 1m by endpoint where method=GET > 5"

    # Creating it again: 409, shown verbatim.
    fill_threshold_rule(page, RULE)
    page.click("#rule-editor-submit")
    page.wait_for_function("document.getElementById('rule-editor-error').textContent.includes('already exists')",
                           timeout=10_000)
    page.click("#rule-editor-reset")
    assert page.locator("#rule-editor-error").is_hidden()

    # Edit: the row's button loads the rule into the form, PUT saves it.
    row.locator(".edit-rule").click()
    assert page.get_attribute("#rule-editor", "data-mode") == "edit"
    assert page.input_value("#re-name") == RULE and page.locator("#re-name").get_attribute("readonly") is not None
    assert page.input_value("#re-filters") == "method=GET"
    assert page.input_value("#re-labels") == "severity=page\nteam=search"
    assert page.is_checked("#re-provisional")
    page.fill("#re-threshold", "7")
    page.fill("#re-for", "30s")
    page.click("#rule-editor-submit")
    page.wait_for_function(f"document.getElementById('rule-editor-status').textContent === 'saved {RULE}'",
                           timeout=10_000)
    stored = api_rules(server)[RULE]
    assert (stored["threshold"], stored["for"], stored["filters"]) == (7.0, "30s", {"method": "GET"})
    assert page.get_attribute("#rule-editor", "data-mode") == "create"
    page.wait_for_function(f"""document.querySelector("#alert-rules .alert-rule[data-rule='{RULE}'] .rule-what")
        .textContent.endsWith('> 7 for 30s')""", timeout=10_000)

    # A lag_status rule (checkboxes) and its deletion (two clicks, no dialog).
    page.fill("#re-name", "consumer_stuck")
    page.select_option("#re-kind", "lag_status")
    page.uncheck("#re-statuses input[value=STALL]")
    page.check("#re-statuses input[value=ERR]")
    page.click("#rule-editor-submit")
    rule_row(page, "consumer_stuck").wait_for(timeout=10_000)
    assert api_rules(server)["consumer_stuck"]["statuses"] == ["STOP", "ERR"]
    page.screenshot(path=str(artifacts / "alerts-rules.png"), full_page=True)
    delete = rule_row(page, "consumer_stuck").locator(".delete-rule")
    delete.click()
    assert delete.text_content() == "really delete?"
    delete.click()
    rule_row(page, "consumer_stuck").wait_for(state="detached", timeout=10_000)
    assert "consumer_stuck" not in api_rules(server)
    only_expected_errors(watch, ["400", "409"])


def test_silence_and_a_firing_alert_live(alerting, watched_page, artifacts):
    server, ctx, service = alerting
    page, watch = open_panel(watched_page, server)
    page.evaluate("window.__alertMessages = 0;"
                  "window.addEventListener('sketchboard:alert', () => { window.__alertMessages += 1; })")

    fill_threshold_rule(page, RULE)
    page.click("#rule-editor-submit")
    row = rule_row(page, RULE)
    row.wait_for(timeout=10_000)

    # Silence for 4 h: the row says until when, and the API agrees.
    row.locator(".silence-duration").select_option("4h")
    before = int(time.time() * 1000)
    row.locator(".silence-button").click()
    row.locator(".silenced-until").wait_for(timeout=10_000)
    until = api_rules(server)[RULE]["silenced_until_ms"]
    assert before + 4 * 3_600_000 <= until <= int(time.time() * 1000) + 4 * 3_600_000
    expected = time.strftime("%H:%M", time.localtime(until / 1000))
    assert re.fullmatch(rf"silenced until {expected}( tomorrow)?", row.locator(".silenced-until").text_content())
    assert row.get_attribute("data-silenced") == "true"

    # Traffic on /api/search, committed as the pipeline would; one evaluation by hand: it fires
    # (for 0s), and the panel shows it through the websocket's alert message, long before its
    # 15-second fallback refresh.
    now = int(time.time() * 1000)
    post(server, [ev(now - 2_000 + i, endpoint="/api/search", user=f"u{i}") for i in range(12)]
         + [ev(now - 2_000, endpoint="/api/cart")])
    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, now)
    loaded = next(r for r in service.rules() if r.stored.name == RULE)
    result = service.evaluate_rule(loaded, int(time.time() * 1000))
    assert [(i.labels["endpoint"], i.state.value) for i in result.instances] == [("/api/search", "firing")], result
    started = time.monotonic()
    instance = page.locator(f"#alerts-active .alert-instance[data-rule='{RULE}'][data-state=firing]")
    instance.wait_for(timeout=5_000)
    shown_after_s = time.monotonic() - started
    assert page.evaluate("window.__alertMessages") >= 1  # it came by the websocket
    assert instance.locator(".alert-state").text_content() == "firing"
    assert instance.locator(".alert-labels").text_content() == "endpoint=/api/search"
    assert instance.locator(".alert-value").text_content() == "value 12"
    assert instance.locator(".alert-since").text_content().startswith("firing since ")
    assert instance.get_attribute("data-silenced") == "true"
    # The annotation is text, never markup.
    assert instance.locator(".alert-summary").text_content() == "<b>/api/search</b> served 12 requests"
    assert instance.locator(".alert-summary b").count() == 0
    assert page.get_attribute("#alerts-firing-count", "data-count") == "1"
    assert page.text_content("#status-alerts") == "1 alert firing"
    page.wait_for_function(f"""document.querySelector("#alert-rules .alert-rule[data-rule='{RULE}']")
        .dataset.state === 'firing'""", timeout=5_000)
    event = page.locator(f"#alerts-history .alert-event[data-rule='{RULE}']").first
    assert (event.get_attribute("data-from"), event.get_attribute("data-to")) == ("normal", "firing")
    assert event.locator(".alert-transition").text_content() == "normal → firing"
    api = httpx.get(f"{server.http}/api/v1/alerts", timeout=10).json()
    assert [(a["rule"], a["state"], a["value"]) for a in api["active"]] == [(RULE, "firing", 12.0)]
    page.locator("#alerts-panel").screenshot(path=str(artifacts / "alerts-panel-firing-dark.png"))

    # Unsilence; the light theme keeps the states readable.
    row.locator(".unsilence-button").click()
    row.locator(".silence-button").wait_for(timeout=10_000)
    assert api_rules(server)[RULE]["silenced_until_ms"] is None
    page.click("#theme-toggle")
    page.wait_for_timeout(300)
    page.locator("#alerts-panel").screenshot(path=str(artifacts / "alerts-panel-firing-light.png"))
    page.screenshot(path=str(artifacts / "alerts-dashboard-light.png"), full_page=True)

    # The traffic stops being enough (threshold raised through the form): resolved, live again.
    row.locator(".edit-rule").click()
    page.fill("#re-threshold", "100")
    page.click("#rule-editor-submit")
    page.wait_for_function(f"document.getElementById('rule-editor-status').textContent === 'saved {RULE}'",
                           timeout=10_000)
    loaded = next(r for r in service.rules() if r.stored.name == RULE)
    service.evaluate_rule(loaded, int(time.time() * 1000))
    instance.wait_for(state="detached", timeout=5_000)
    assert page.text_content("#alerts-active-empty") == "nothing firing"
    newest = page.locator("#alerts-history .alert-event").first
    assert (newest.get_attribute("data-from"), newest.get_attribute("data-to")) == ("firing", "resolved")
    print(f"firing alert shown {shown_after_s:.2f} s after the evaluation")
    only_expected_errors(watch, [])


def test_without_the_alert_service_the_panel_says_so_quietly(tmp_path, demo_catalog, watched_page):
    """The other browser tests build the app without alerts: the panel must not send them 404s
    (Chromium logs each as a console error)."""
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in demo_catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    app = create_app(ApiContext(catalog=demo_catalog, log=log, store=store, clock=time.time),
                     hub_config=HubConfig(poll_interval_s=0.1, heartbeat_interval_s=2, feed_interval_s=0.2))
    with Server(app) as server:
        page, watch = watched_page(server.http, "/")
        page.wait_for_selector("#alerts-panel[data-state=disabled]", timeout=15_000)
        assert page.text_content("#alert-rules-empty") == "alerts are not enabled on this server"
        assert page.locator("#rule-editor-submit").is_disabled()
        page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
        assert not any("/api/v1/alerts" in url for url in watch.requests), watch.requests
        assert watch.errors == [] and watch.foreign == []
    store.close()
    log.close()
