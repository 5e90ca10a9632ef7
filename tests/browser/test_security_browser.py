"""Issue 22 in a real Chromium: the dashboard runs under its Content-Security-Policy, asks for a
token when the API requires one and works with it (REST and websocket), and a page served from
another origin can neither read nor write a Sketchboard open on loopback."""

from __future__ import annotations

import time

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from api.app import create_app
from api.context import ApiContext
from api.security.config import SecurityConfig
from api.security.scopes import Scope
from api.security.token_file import TokenRegistry, create_token
from api.ws_hub import HubConfig
from ingest.log import SqliteEventLog
from store import SqlitePaneStore
from tests.api.test_ws import Server, ev
from tests.browser.test_dashboard import LiveClock, commit, live  # noqa: F401  (live: fixture)

pytestmark = pytest.mark.browser

# Recorded from before the page's own scripts run (an init script is injected by the browser's
# debugging protocol, which the CSP does not govern).
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI + ' ' + e.sourceFile + ':' + e.lineNumber));
"""
HAS_POINTS = "#chart-main[data-non-empty-points]:not([data-non-empty-points='0'])"


def some_events(now_ms: int) -> list[dict]:
    return [ev(now_ms - 60_000 + i * 500, endpoint=("/api/cart", "/api/search")[i % 2], latency=float(5 + i),
               user=f"u{i}") for i in range(40)]


def test_the_dashboard_works_under_its_csp(live, browser):  # noqa: F811
    server, ctx, _ = live
    commit(server, ctx, some_events(int(time.time() * 1000)))
    context = browser.new_context()  # the CSP enforced (no bypass)
    try:
        page = context.new_page()
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.add_init_script(RECORD_VIOLATIONS)
        response = page.goto(server.http + "/?metric=requests&stat=count&range=15m&theme=light")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
        page.wait_for_selector(HAS_POINTS, timeout=15_000)
        page.wait_for_selector("#chart-main .scatterlayer .trace", timeout=5_000)  # Plotly drew
        assert page.get_attribute("html", "data-theme") == "light"  # theme.js ran
        page.locator("#filter").press("Enter")  # the explorer form must not submit (no inline onsubmit)
        time.sleep(0.3)
        # A submitted form would have replaced the query; the page adds only its own state (dashboard=).
        assert "theme=light" in page.url and page.evaluate("window.__csp") == []
        assert errors == []
    finally:
        context.close()


@pytest.fixture
def secured(tmp_path, demo_catalog):
    path = tmp_path / "tokens.json"
    tokens = {scope: create_token(path, f"t_{scope}", frozenset({Scope(scope)}), now_ms=0)
              for scope in ("ingest", "read")}
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    for stream in demo_catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    ctx = ApiContext(catalog=demo_catalog, log=log, store=store, clock=LiveClock(),
                     security=SecurityConfig(tokens=TokenRegistry(path=path, reload_every_s=0)))
    app = create_app(ctx, hub_config=HubConfig(poll_interval_s=0.1, heartbeat_interval_s=2))
    with Server(app) as server:
        yield server, ctx, tokens
    store.close()
    log.close()


def test_the_dashboard_asks_for_a_token_and_works_with_it(secured, browser, artifacts):
    server, ctx, tokens = secured
    import httpx

    body = some_events(int(time.time() * 1000))
    r = httpx.post(server.http + "/api/v1/events?stream=http_requests", json=body,
                   headers={"Authorization": f"Bearer {tokens['ingest']}"})
    assert r.status_code == 200, r.text
    from tests.api.test_ws_support import drain_log_into_store

    drain_log_into_store(ctx.catalog, ctx.log, ctx.store, int(time.time() * 1000))

    context = browser.new_context()  # under the CSP
    try:
        page = context.new_page()
        requests = []
        page.on("request", lambda req: requests.append((req.url, req.headers.get("authorization"))))
        page.goto(server.http + "/?metric=requests&stat=count&range=15m")
        dialog = page.locator("#token-dialog")
        dialog.wait_for(state="visible", timeout=10_000)
        assert page.get_attribute("#status-connection", "data-state") != "open"
        page.screenshot(path=str(artifacts / "dashboard-token-prompt.png"))

        page.fill("#token-input", "sb_not_a_real_token")
        page.click("[data-testid=token-submit]")
        dialog.wait_for(state="visible", timeout=10_000)
        page.wait_for_selector("#token-reason:has-text('refused')", timeout=10_000)

        page.fill("#token-input", tokens["read"])
        page.click("[data-testid=token-submit]")  # kept for this tab; the page reloads with it
        page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)  # websocket: token accepted
        page.wait_for_selector(HAS_POINTS, timeout=15_000)
        assert not dialog.is_visible()
        assert page.evaluate("sessionStorage.getItem('sketchboard.token')") == tokens["read"]
        assert page.evaluate("localStorage.getItem('sketchboard.token')") is None
        api_calls = [(url, auth) for url, auth in requests if "/api/v1/" in url and url.startswith("http")]
        good = f"Bearer {tokens['read']}"
        assert ("http://127.0.0.1:%d/api/v1/metrics" % server.port, "Bearer sb_not_a_real_token") in api_calls
        # Once the read token is in, every request carries it (before, the refused one was dropped
        # and the page's other panels may have asked without a token: all 401s).
        after = api_calls[min(i for i, (_, a) in enumerate(api_calls) if a == good):]
        assert len(after) >= 2 and all(a == good for _, a in after), api_calls
        assert api_calls[0][1] is None  # before the prompt: no token at all
        page.wait_for_selector("#token-forget:not([hidden])")
        page.screenshot(path=str(artifacts / "dashboard-with-token.png"))
    finally:
        context.close()


EVIL_PAGE = """<!doctype html><html><body><script>
window.results = {};
const target = new URL(location.href).searchParams.get("target");
const events = JSON.stringify([{time: Date.now(), endpoint: "/evil", method: "GET", status: 200, region: "eu",
                               latency_ms: 1, response_bytes: 1, user_id: "evil"}]);
// A simple request (no preflight): the browser sends it, the service must refuse it (415).
fetch(target + "/api/v1/events?stream=http_requests", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: events})
  .then(() => results.write_plain = "sent", e => results.write_plain = "failed");
// JSON needs a preflight, which gets no CORS headers: never sent.
fetch(target + "/api/v1/events?stream=http_requests", {method: "POST",
      headers: {"Content-Type": "application/json"}, body: events})
  .then(() => results.write_json = "ok", e => results.write_json = "blocked");
// Reading: the answer is not readable without CORS headers.
fetch(target + "/api/v1/streams").then(r => r.text()).then(() => results.read = "read", e => results.read = "blocked");
const ws = new WebSocket(target.replace("http", "ws") + "/api/v1/ws");
ws.onopen = () => results.ws = "open";
ws.onclose = () => { results.ws = results.ws || "refused"; };
</script></body></html>"""


def test_a_page_from_another_origin_cannot_read_or_write(live, browser):  # noqa: F811
    server, ctx, _ = live  # open: loopback, no tokens, as `make run`
    before = {name: dict(ctx.log.offsets(name)) for name in ctx.catalog.streams}
    evil = Starlette(routes=[Route("/", lambda request: HTMLResponse(EVIL_PAGE))])
    with Server(evil) as other:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"{other.http}/?target={server.http}")
            page.wait_for_function("['write_plain', 'write_json', 'read', 'ws'].every(k => k in window.results)",
                                   timeout=15_000)
            results = page.evaluate("window.results")
        finally:
            context.close()
    assert results == {"write_plain": "sent", "write_json": "blocked", "read": "blocked", "ws": "refused"}
    assert {name: dict(ctx.log.offsets(name)) for name in ctx.catalog.streams} == before  # nothing written


def test_a_read_token_sees_the_rules_but_the_editor_shows_the_403_and_an_admin_token_saves(tmp_path, demo_catalog,
                                                                                             watched_page):
    from tests.browser.test_alerts_panel import alerting_context, fill_threshold_rule, open_panel, rule_row

    path = tmp_path / "tokens.json"
    read = create_token(path, "viewer", frozenset({Scope.READ}), now_ms=0)
    admin = create_token(path, "ops", frozenset({Scope.ADMIN}), now_ms=0)
    security = SecurityConfig(tokens=TokenRegistry(path=path, reload_every_s=0))
    with alerting_context(tmp_path, demo_catalog, security=security) as ctx, \
            Server(create_app(ctx, hub_config=HubConfig(poll_interval_s=0.1, heartbeat_interval_s=2))) as server:
        service = ctx.alerts
        page, _ = open_panel(watched_page, server, storage={"sketchboard.token": read})
        fill_threshold_rule(page, "viewer_rule")
        page.click("#rule-editor-submit")
        page.wait_for_selector("#rule-editor-error:not([hidden])", timeout=10_000)
        assert "token 'viewer' has scopes [read]; this needs 'admin'" in page.text_content("#rule-editor-error")
        assert service.store.rules() == []

        page, _ = open_panel(watched_page, server, storage={"sketchboard.token": admin})
        fill_threshold_rule(page, "ops_rule")
        page.click("#rule-editor-submit")
        rule_row(page, "ops_rule").wait_for(timeout=10_000)
        assert [r.name for r in service.store.rules()] == ["ops_rule"]


def test_a_token_dialog_dismissed_with_escape_is_opened_again_from_the_header(secured, browser):
    # auth.js's `asking` stayed true once the dialog was dismissed: nothing could ask again. Then
    # every later 401 (the alerts panel polls every 15 s) opened it over the page again. Now
    # Escape means "not now": the header's "enter token" button opens it.
    server, ctx, tokens = secured
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.http + "/")
        dialog = page.locator("#token-dialog")
        dialog.wait_for(state="visible", timeout=10_000)
        assert page.is_hidden("#token-enter")
        page.keyboard.press("Escape")
        dialog.wait_for(state="hidden", timeout=5_000)
        assert page.evaluate("fetch('/api/v1/metrics').then((r) => r.status)") == 401
        page.wait_for_timeout(500)
        assert page.is_hidden("#token-dialog") and page.is_visible("#token-enter")
        page.click("#token-enter")
        dialog.wait_for(state="visible", timeout=5_000)
        page.fill("#token-input", tokens["read"])
        page.click("[data-testid=token-submit]")
        page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
        assert page.is_hidden("#token-enter") and page.is_hidden("#token-dialog")
    finally:
        context.close()


def test_a_token_without_the_read_scope_is_refused_with_the_servers_reason(secured, browser):
    # An ingest-only token got 403 insufficient_scope on every GET: the page stayed on "error:
    # GET /api/v1/metrics: HTTP 403" with no way to enter another token (only a 401 asked). Now a
    # 403 for the read scope is a refused token: forgotten, the dialog open with the reason.
    server, ctx, tokens = secured
    context = browser.new_context()
    context.add_init_script(  # the first load only: the reload after the dialog has the token typed in
        f"if (!sessionStorage.getItem('seeded')) {{ sessionStorage.setItem('seeded', '1');"
        f" sessionStorage.setItem('sketchboard.token', {tokens['ingest']!r}); }}")
    try:
        page = context.new_page()
        page.goto(server.http + "/?metric=requests&stat=count&range=15m")
        page.locator("#token-dialog").wait_for(state="visible", timeout=10_000)
        reason = page.text_content("#token-reason")
        assert "this token lacks the read scope" in reason and "t_ingest" in reason, reason
        assert page.evaluate("sessionStorage.getItem('sketchboard.token')") is None
        page.fill("#token-input", tokens["read"])
        page.click("[data-testid=token-submit]")
        page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
        assert page.is_hidden("#token-dialog")
    finally:
        context.close()


def test_a_revoked_token_is_forgotten_and_asked_for_again(secured, browser, tmp_path):
    # The server closes the page's socket 1008 "token 't_read' was revoked": the page dropped
    # the reason and retried the revoked token forever. Now it shows the reason, forgets the
    # token, opens the dialog and waits for it (no retries).
    from api.security.token_file import revoke_token
    from tests.browser.test_dashboard import WS_RECORDER

    server, ctx, tokens = secured
    context = browser.new_context()
    context.add_init_script(f"sessionStorage.setItem('sketchboard.token', {tokens['read']!r});")
    try:
        page = context.new_page()
        page.add_init_script(WS_RECORDER)
        page.goto(server.http + "/?metric=requests&stat=count&range=15m")
        page.wait_for_selector("#status-connection[data-state=open]", timeout=15_000)
        revoke_token(tmp_path / "tokens.json", "t_read")
        dialog = page.locator("#token-dialog")
        dialog.wait_for(state="visible", timeout=10_000)
        assert page.evaluate("sessionStorage.getItem('sketchboard.token')") is None
        assert "revoked" in page.text_content("#token-reason")
        assert "revoked" in page.text_content("#status-connection")
        assert page.evaluate("window.__ws.closes.map((c) => c.code)") == [1008]
        page.wait_for_timeout(3_000)  # waiting for the dialog: no retry with the revoked token
        assert page.evaluate("window.__ws.opened") == 1
        assert page.get_attribute("#status-connection", "data-state") == "closed"
    finally:
        context.close()


def test_the_api_docs_load_nothing_from_another_host_and_run_under_the_csp(live, browser):  # noqa: F811
    # FastAPI's /docs loaded Swagger UI from cdn.jsdelivr.net (a floating @5, no SRI) with no CSP,
    # on the origin whose sessionStorage holds the dashboard's token. Now its assets are local
    # (swagger-ui-bundle) and the page carries the dashboard's CSP.
    server, ctx, _ = live
    context = browser.new_context()  # the CSP enforced
    try:
        page = context.new_page()
        page.add_init_script(RECORD_VIOLATIONS)
        foreign, errors = [], []
        page.on("request", lambda r: None if r.url.startswith(server.http) else foreign.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        response = page.goto(server.http + "/docs")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_selector(".swagger-ui .opblock", timeout=15_000)  # Swagger UI drew the API
        assert page.locator(".swagger-ui .opblock-summary-path[data-path='/api/v1/query']").count() >= 1
        assert foreign == [] and errors == [] and page.evaluate("window.__csp") == []
    finally:
        context.close()
