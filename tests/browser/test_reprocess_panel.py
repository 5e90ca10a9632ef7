"""The dashboard's reprocessing panel in a real Chromium against the API as `sketchboard api`
wires it (uvicorn in a thread, no Spark: the test plays the run's pipeline, committing its
output and its offsets as the pipeline would): a changed definition is shown with the command,
a run's progress moves (bar, offsets done / to do, events/s, ETA, complete from), and once it
has caught up the Switch button serves its output, and the explorer's chart follows the switch
without a reload (a dimension only the new definition has: one group "" before, its values after); a token without the admin scope gets the
curl command instead of the button."""

from __future__ import annotations

import time

import httpx
import pytest
import yaml

from api.security.tokens import hash_token
from catalog.versions import catalog_versions
from sketchboard.definitions import pin_definitions
from sketchboard.settings import Settings
from sketchboard.wiring import build_api, open_catalog, open_store
from store.base import BatchCommit, PanePartial
from store.panes import PaneData
from tests.api.test_ws import Server

pytestmark = pytest.mark.browser

OLD = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"], "values": ["latency_ms"]}},
       "metrics": {"latency": {"stream": "http", "value": "latency_ms"}}}
NEW = {**OLD, "streams": {"http": {**OLD["streams"]["http"], "dimensions": ["endpoint", "region"]}}}
EVENTS = 40


def write(store, pipeline: str, catalog, pane: int, counts: dict[tuple, int]) -> None:
    dims = catalog.streams["http"].dimensions
    store.commit_batch(BatchCommit(
        pipeline=pipeline, batch_id=0, events_read=sum(counts.values()), max_event_ms={"http": pane},
        partials=[PanePartial("http", pane, pane + 10_000, dict(zip(dims, k)), PaneData(count=n))
                  for k, n in counts.items()], end_offsets={"http": {0: sum(counts.values())}},
        definition_versions=catalog_versions(catalog)), lateness_ms={"http": 0}, now_ms=pane)


@pytest.fixture
def reprocess_live(tmp_path, request):
    """The API over a store whose http output was built before `region` was added to the stream."""
    config = tmp_path / "streams.yaml"
    config.write_text(yaml.safe_dump(OLD))
    tokens = getattr(request, "param", [])
    settings = Settings(data_dir=tmp_path / "data", streams_config=config, alerts_config=None, tokens=tokens)
    pane = (int(time.time() * 1000) - 600_000) // 10_000 * 10_000
    root = open_store(settings)
    pin_definitions(root, open_catalog(settings), "main")
    write(root, "main", open_catalog(settings), pane, {("/a",): EVENTS})
    root.close()
    config.write_text(yaml.safe_dump(NEW))
    app, ctx = build_api(settings)
    ctx.reprocess.launch = lambda run: None  # the test plays the run's pipeline
    with Server(app) as server:
        yield server, ctx, settings, pane


def wait_text(page, selector: str, prefix: str) -> None:
    """Until the element (the panel renders its rows anew at each poll) has text starting with prefix."""
    page.wait_for_function("([sel, prefix]) => { const e = document.querySelector(sel);"
                           " return e !== null && e.textContent.startsWith(prefix); }", arg=[selector, prefix],
                           timeout=15_000)


def start_run(server, ctx, headers=None) -> dict:
    events = [{"time": int(time.time() * 1000) - 1000, "user": f"u{i}", "endpoint": "/a",
               "region": ("eu", "us")[i % 2], "latency_ms": 5.0} for i in range(EVENTS)]
    assert httpx.post(f"{server.http}/api/v1/events", params={"stream": "http"}, json=events, headers=headers,
                      timeout=10).status_code == 200
    started = httpx.post(f"{server.http}/api/v1/reprocess", json={"stream": "http"}, headers=headers, timeout=10)
    assert started.status_code == 202, started.text
    return started.json()


def chart_groups(page) -> dict[str, float] | None:
    """The explorer chart's series as it holds them now: the region of each group -> its count
    (None before the page has made its charts)."""
    return page.evaluate("() => { const chart = window.sketchboard && window.sketchboard.charts.get('main');"
                         " return chart ? Object.fromEntries([...chart.series.values()].map((e) => [e.group.region ?? '',"
                         " [...e.points.values()].reduce((n, p) => n + (p.count || 0), 0)])) : null; }")


def wait_groups(page, want: dict[str, float]) -> None:
    deadline = time.monotonic() + 15
    while (got := chart_groups(page)) != want:
        assert time.monotonic() < deadline, got
        time.sleep(0.2)


def test_reprocess_panel_shows_progress_and_switches(reprocess_live, watched_page, artifacts):
    server, ctx, settings, pane = reprocess_live
    # The explorer's chart, grouped by the dimension only the new definition has, follows the switch.
    page, watch = watched_page(server.http, "/?metric=latency&stat=count&group_by=region&range=1h")
    wait_groups(page, {"": EVENTS})  # the served output has no region yet: one group ""
    changed = page.locator("#reprocess-changed li[data-stream=http]")
    changed.wait_for(timeout=15_000)
    assert "sketchboard reprocess http" in changed.text_content()

    run = start_run(server, ctx)
    assert run["progress"]["to_do"] == EVENTS
    row = page.locator(f"#reprocess-runs li[data-run='{run['id']}']")
    row.wait_for(timeout=15_000)
    # The run's pipeline commits half of the log: the registry's copy of its offsets is its progress.
    ends = {p["partition"]: p["to_do"] for p in run["progress"]["partitions"]}
    ctx.reprocess.registry.record_commit(run["id"], 0, ctx.now_ms(), {"http": {p: n // 2 for p, n in ends.items()}})
    numbers = row.locator("[data-testid=reprocess-numbers]")
    wait_text(page, f"li[data-run='{run['id']}'] [data-testid=reprocess-numbers]", "50%")
    assert f"{EVENTS // 2}/{EVENTS} offsets" in numbers.text_content() and "ev/s" in numbers.text_content()
    assert "ETA" in numbers.text_content() and "ETA –" not in numbers.text_content()
    # Offsets done / to do per partition, as the CLI's bar shows them.
    shown = row.locator("[data-testid=reprocess-partitions]").text_content()
    assert shown == " · ".join(f"p{p} {n // 2}/{n}" for p, n in sorted(ends.items())), shown
    assert float(row.locator("progress").get_attribute("value")) == pytest.approx(0.5)
    assert "complete from" in row.locator("[data-testid=reprocess-complete-from]").text_content()
    assert row.locator("[data-testid=reprocess-switch]").count() == 0  # not caught up: nothing to switch
    row.screenshot(path=str(artifacts / "reprocess-running.png"))

    # It reaches the log's end as of its start with the new definition's output, and catches up.
    output = open_store(settings, run["id"])
    pin_definitions(output, ctx.catalog, run["id"])
    write(output, run["id"], ctx.catalog, pane, {("/a", "eu"): EVENTS // 2, ("/a", "us"): EVENTS // 2})
    output.close()
    ctx.reprocess.registry.record_commit(run["id"], 1, ctx.now_ms(), {"http": ends})
    ctx.reprocess.definitions.set_state(run["id"], "caught_up", ctx.now_ms())
    button = row.locator("[data-testid=reprocess-switch]")
    button.wait_for(timeout=15_000)
    assert row.get_attribute("data-state") == "caught_up" and numbers.text_content().startswith("100%")
    page.locator("#reprocess-panel").screenshot(path=str(artifacts / "reprocess-caught-up.png"))

    button.click()
    message = row.locator("[data-testid=reprocess-message]")
    wait_text(page, f"li[data-run='{run['id']}'] [data-testid=reprocess-message]", "switched")
    assert "the old output is kept as previous-http-" in message.text_content()
    page.locator(f"#reprocess-runs li[data-run='{run['id']}'] .badge.serving").wait_for(timeout=15_000)
    assert page.locator("#reprocess-changed li").count() == 0  # served with the configured definition now
    assert ctx.reprocess.serving_version("http") == run["version"]
    # The page was not reloaded: its subscription got the switched output as a new snapshot.
    wait_groups(page, {"eu": EVENTS // 2, "us": EVENTS // 2})
    answer = httpx.get(f"{server.http}/api/v1/query", params={"metric": "latency", "stat": "count", "from": "now-1h",
                                                            "group_by": "region"}, timeout=10).json()
    assert {s["group"]["region"]: sum(p["count"] for p in s["points"]) for s in answer["series"]} == \
        {"eu": EVENTS // 2, "us": EVENTS // 2}
    # The replaced output is listed as a finished run that can be switched back to.
    previous = page.locator("#reprocess-runs li[data-run^='previous-http-']")
    previous.locator("[data-testid=reprocess-switch]").wait_for(timeout=15_000)
    page.locator("#reprocess-panel").screenshot(path=str(artifacts / "reprocess-switched.png"))
    assert watch.errors == [] and watch.foreign == []


VIEWER = [{"name": "viewer", "sha256": hash_token("sb_viewer"), "scopes": ["read", "ingest"]},
          {"name": "ops", "sha256": hash_token("sb_ops"), "scopes": ["admin", "read", "ingest"]}]


@pytest.mark.parametrize("reprocess_live", [VIEWER], indirect=True)
def test_a_token_without_admin_scope_gets_the_curl_command(reprocess_live, watched_page):
    server, ctx, settings, pane = reprocess_live
    run = start_run(server, ctx, headers={"Authorization": "Bearer sb_ops"})
    ctx.reprocess.definitions.set_state(run["id"], "caught_up", ctx.now_ms())
    page, watch = watched_page(server.http, storage={"sketchboard.token": "sb_viewer"})
    curl = page.locator(f"#reprocess-runs li[data-run='{run['id']}'] [data-testid=reprocess-curl]")
    curl.wait_for(timeout=15_000)
    assert curl.text_content() == (f'curl -X POST -H "Authorization: Bearer $ADMIN_TOKEN"'
                                   f" {server.http}/api/v1/reprocess/{run['id']}/switch")
    assert page.locator("[data-testid=reprocess-switch]").count() == 0
