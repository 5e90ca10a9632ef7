"""The declared views' final points computed ahead of their first query (query/warm.py).

Every `point_warm_interval` the dashboards' panels (dashboard/views.py: each panel's query over
its dashboard's range) are computed through a point cache that keeps their final points in the
store, in a websocket snapshot worker where there is one (its own interpreter: the API
process's GIL stays free for REST), else in this thread through the API's point cache. A first
query of such a view then loads its kept points (a 24 h, 1-minute p99 over a 1 h sliding window:
~18 ms of CPU instead of ~65 ms of KLL merges). A worker keeps its cache between runs, so a run
over unchanged views costs their fingerprints' sums: only the windows that became final since,
or whose rows a straggler or a correction revised, are computed again.

The standard views (query/standard_views.py: each metric's percentiles and distinct counts at
each tier's granule, and over a 1 h sliding window) are warmed with them, the newly final windows
at each run, so an undeclared 24 h query's first run loads kept points too.

One replica warms (`active`: the leader's), since the points it keeps are shared in the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from query import Query
from query.standard_views import StandardViews
from query.warm import warm
from store.point_cache import PointCache

log = logging.getLogger("sketchboard.warm")


class PointWarmer:
    def __init__(self, store: Any, views: Callable[[int], list[Query]], *, interval_s: float, max_points: int,
                 cache: PointCache | None = None, workers: Any = None, clock: Callable[[], float] = time.time,
                 active: Callable[[], bool] = lambda: True, standard: StandardViews | None = None):
        """`views`: the declared queries at an instant (ms); `workers`: api.ws_workers.SnapshotWorkers
        (None: computed in this process through `cache`); `standard`: the standard views warmed
        with them (None: only the declared ones)."""
        self.store = store
        self.views = views
        self.interval_s = interval_s
        self.max_points = max_points
        self.cache = cache
        self.workers = workers
        self.clock = clock
        self.active = active
        self.standard = standard
        self._generation = cache.generation if cache is not None else 0
        self.runs = 0  # runs that computed the views (for the status and tests)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> int | None:
        """Warm the declared views now: how many were computed; None when this run was skipped
        (not the leader, or the workers are still starting: their imports take a second or two)."""
        if not self.active():
            return None
        now_ms = int(self.clock() * 1000)
        queries = self.views(now_ms)
        watermarks = self.store.watermarks()
        generation = self.cache.generation if self.cache is not None else 0
        standard = None
        if self.standard is not None:
            if generation != self._generation:  # the kept points were cleared (a switch): whole ranges again
                self.standard.reset()
                self._generation = generation
            standard = self.standard.plan(now_ms, watermarks)
            queries = [*queries, *standard.queries]
        if not queries:
            return 0
        if self.workers is not None:
            self.workers.start()  # idempotent; otherwise started by the first websocket subscription
            done = self.workers.warm(queries, now_ms, watermarks, self.max_points, generation)
        elif self.cache is not None:
            done = warm(self.store, queries, now_ms=now_ms, watermarks=watermarks, max_points=self.max_points,
                        cache=self.cache)
        else:
            return None
        if done is not None:
            self.runs += 1
            if standard is not None:
                self.standard.done(standard)
        return done

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="point-warmer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        self._thread = None

    def _loop(self) -> None:
        while True:
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the store is down, a view is refused: queries compute them
                log.warning("could not warm the declared views' points", exc_info=True)
            if self._stop.wait(self.interval_s):
                return
