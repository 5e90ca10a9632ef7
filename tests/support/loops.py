"""Coroutines run to completion from a synchronous test, whatever else the worker process runs."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor


def run_on_own_loop(coroutine):
    """asyncio.run(coroutine) on a loop of its own, in a thread: once a browser test ran in the same
    pytest worker, Playwright's sync API (a session-wide fixture) leaves its event loop running in
    the main thread, where asyncio.run() refuses (seen in CI, and whenever --dist loadfile puts a
    browser test's file before the caller's in one worker)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()
