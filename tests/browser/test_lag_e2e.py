"""Consumer lag on the dashboard, with real processes: the real-process lag scenario of
tests/e2e/lag_scenario.py (API and Spark pipeline as separate processes, a producer that keeps
sending, the pipeline stopped and started again), with the dashboard open in headless
Chromium the whole time. The page must show what the API says: the lag badge OK while the
pipeline runs, STOP with its reason and per-partition lag growing in events and seconds while
it is down, OK again once it is back; the status strip shows the Spark query's health."""

from __future__ import annotations

import pytest

from tests.e2e.lag_scenario import BROWSER_TEST, SETTINGS, run_lag_scenario

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# What the page shows follows the API's lag sampler and the websocket hub's pushes: on a quiet
# machine within a few seconds of the API, but make test runs this beside the Spark tests, and a
# fresh-clone run saw the "recovered" phase's status arrive after more than 10 s (the API said OK).
# The waits poll, so a longer limit costs a passing run nothing.
PAGE_WAIT_MS = 30_000

# The traces of the lag charts, per partition ("orders/0", ...): their names and y values.
TRACES = "(id) => document.getElementById(id).data.map((t) => ({name: t.name, y: Array.from(t.y)}))"
# Sum of the newest lag in events / max of the newest lag in seconds over the orders partitions.
ORDERS_LAST = """(id) => {
  const last = document.getElementById(id).data.filter((t) => t.name.startsWith('orders/'))
    .map((t) => t.y[t.y.length - 1]).filter((v) => v !== null && v !== undefined);
  return last.length ? {sum: last.reduce((a, b) => a + b, 0), max: Math.max(...last)} : null;
}"""


# The lag badge says OK, its state and its text at once.
BADGE_OK = "() => { const b = document.getElementById('lag-status'); return b.dataset.status === 'OK' && b.textContent === 'OK'; }"


def orders_last(page, chart: str) -> dict:
    return page.evaluate(ORDERS_LAST, chart)


def test_lag_stop_and_recovery_on_the_dashboard_with_real_processes(service_factory, watched_page, artifacts):
    service = service_factory(**SETTINGS)
    seen: dict = {}

    def observe(phase: str, **data) -> None:
        if phase == "api":  # open the page while Spark starts
            seen["page"], seen["watch"] = watched_page(service.base, "/")
            seen["page"].wait_for_selector("#status-connection[data-state=open]", timeout=20_000)
            return
        page = seen["page"]
        if phase == "running":
            # The badge's state and text read together: while the first batches take longer than the
            # status window (3 s here), the status rightly goes STOP and OK again between commits, and a
            # fresh-clone run saw it turn between two separate reads of the badge.
            page.wait_for_function(BADGE_OK, timeout=PAGE_WAIT_MS)
            page.wait_for_selector("#status-query[data-state=running]", timeout=PAGE_WAIT_MS)
            page.wait_for_function("/^query running · batch \\S+ ms/.test("
                                   "document.querySelector('#status-query').textContent)", timeout=PAGE_WAIT_MS)
            names = [t["name"] for t in page.evaluate(TRACES, "lag-chart-events")]
            assert any(n.startswith("orders/") for n in names), names  # one trace per partition
            assert names == [t["name"] for t in page.evaluate(TRACES, "lag-chart-seconds")]
        elif phase == "stopped":
            page.wait_for_selector("#lag-status[data-status=STOP]", timeout=PAGE_WAIT_MS)
            assert page.text_content("#lag-status") == "STOP"
            assert "no commit for" in page.text_content("#lag-reason")
            seen["at_stop"] = (orders_last(page, "lag-chart-events"), orders_last(page, "lag-chart-seconds"))
        elif phase == "grown":
            events0, seconds0 = seen["at_stop"]
            page.wait_for_function(f"(({ORDERS_LAST})('lag-chart-events') || {{sum: 0}}).sum > {events0['sum']}",
                                   timeout=PAGE_WAIT_MS)
            page.wait_for_function(f"(({ORDERS_LAST})('lag-chart-seconds') || {{max: 0}}).max > {seconds0['max']} + 1",
                                   timeout=PAGE_WAIT_MS)
            assert page.get_attribute("#lag-status", "data-status") == "STOP"
            assert "no commit for" in page.text_content("#lag-reason")
            # The charts are the history: the orders lag rose across the stop, in events and in seconds.
            for chart in ("lag-chart-events", "lag-chart-seconds"):
                for trace in page.evaluate(TRACES, chart):
                    if trace["name"].startswith("orders/"):
                        ys = [y for y in trace["y"] if y is not None]
                        assert ys[-1] > min(ys[-6:]), (chart, trace)
            page.wait_for_selector("#status-query[data-state=stopped]", timeout=PAGE_WAIT_MS)
            assert page.text_content("#status-query").startswith("query stopped")
            page.wait_for_timeout(500)  # let the throttled charts draw
            page.screenshot(path=str(artifacts / "lag-stop.png"), full_page=True)
        elif phase == "recovered":
            page.wait_for_selector("#lag-status[data-status=OK]", timeout=PAGE_WAIT_MS)
            page.wait_for_function(f"(({ORDERS_LAST})('lag-chart-events') || {{sum: 1}}).sum === 0", timeout=PAGE_WAIT_MS)
            page.wait_for_selector("#status-query[data-state=running]", timeout=PAGE_WAIT_MS)
            page.wait_for_timeout(500)
            page.screenshot(path=str(artifacts / "lag-recovered.png"), full_page=True)
        seen.setdefault("phases", []).append(phase)

    run_lag_scenario(service, observe)
    assert seen["phases"] == ["running", "stopped", "grown", "recovered"]
    watch = seen["watch"]
    assert watch.errors == [], watch.errors
    assert watch.foreign == [], watch.foreign
    assert seen["page"].evaluate("performance.getEntriesByType('navigation').length") == 1  # never reloaded


assert test_lag_stop_and_recovery_on_the_dashboard_with_real_processes.__name__ == BROWSER_TEST
