"""Browser tests: Debian's headless Chromium (/usr/bin/chromium, never a downloaded browser)
driven by Playwright for Python. Screenshots go to test-artifacts/ in the repository root
(git-ignored)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.teardown import reported_if_slow

CHROMIUM = os.environ.get("SKETCHBOARD_CHROMIUM", "/usr/bin/chromium")
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"


def pytest_collection_modifyitems(config, items):
    if Path(CHROMIUM).exists():
        return
    skip = pytest.mark.skip(reason=f"no Chromium at {CHROMIUM} (Debian package 'chromium'; .ci/run installs it)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        with reported_if_slow("Chromium"):
            b.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


class PageWatch:
    """Console errors, page errors and requests that left 127.0.0.1, collected while a page lives."""

    def __init__(self, page, base: str):
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} {r.failure}"))

        def on_request(req):
            self.requests.append(req.url)
            if not (req.url.startswith(base) or req.url.startswith(base.replace("http", "ws"))
                    or req.url.startswith("data:")):
                self.foreign.append(req.url)

        page.on("request", on_request)


@pytest.fixture
def watched_page(browser):
    pages = []

    def open_page(base: str, path: str = "/", *, color_scheme: str = "dark", viewport=(1366, 900),
                  bypass_csp: bool = True, storage: dict | None = None):
        """bypass_csp: Playwright's string predicates (wait_for_function) are evaluated with
        eval, which the dashboard's Content-Security-Policy forbids; tests/browser/test_security_browser.py
        opens the dashboard under its CSP (bypass_csp=False) and checks it works there.
        storage: sessionStorage items set before the page's scripts run (an API token)."""
        context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]},
                                      color_scheme=color_scheme, bypass_csp=bypass_csp)
        if storage:
            import json

            context.add_init_script("".join(f"sessionStorage.setItem({json.dumps(k)}, {json.dumps(v)});"
                                            for k, v in storage.items()))
        page = context.new_page()
        watch = PageWatch(page, base)
        pages.append(context)
        page.goto(base + path)
        return page, watch

    yield open_page
    for context in pages:
        context.close()


@pytest.fixture(scope="session", autouse=True)
def _no_proxy_for_loopback():
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    yield


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
