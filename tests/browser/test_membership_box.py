"""The dashboard's key lookup box in a real Chromium: it lists the streams that declare
membership and answers "no" or "probably yes" from the stored Bloom filters."""

from __future__ import annotations

import pytest

from tests.api.test_membership import BASE, HOUR, membership_commit
from tests.browser.test_dashboard import live  # noqa: F401  (fixture)

pytestmark = pytest.mark.browser


def look_up(page, key: str) -> str:
    box = page.locator("#membership-panel form.sb-membership")
    box.locator("input[aria-label=key]").fill(key)
    box.locator("input[aria-label=from]").fill(str(BASE))
    box.locator("input[aria-label=to]").fill(str(BASE + 2 * HOUR))
    box.locator("button").click()
    answer = box.locator("output")
    page.wait_for_function("el => el.textContent && el.textContent !== '…'", arg=answer.element_handle(),
                           timeout=10_000)
    return answer.text_content()


def test_lookup_box_answers_from_the_bloom_filters(live, watched_page, artifacts):  # noqa: F811
    server, ctx, _ = live
    assert ctx.store.commit_batch(membership_commit(ctx.catalog, 0, {BASE: ["alice"], BASE + HOUR: ["carol"]}),
                                  lateness_ms={}, now_ms=BASE).committed
    page, watch = watched_page(server.http)
    page.wait_for_selector("#membership-panel select option[value=http_requests]", state="attached")
    assert look_up(page, "alice").startswith("Probably yes")
    assert look_up(page, "mallory").startswith("No")
    page.locator("#membership-panel").screenshot(path=str(artifacts / "membership-box.png"))
    assert watch.errors == [] and watch.foreign == []
