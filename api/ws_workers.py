"""Websocket snapshots computed in worker processes, off the API process's GIL.

A dashboard's 24 h view is a cold snapshot of thousands of points: tens of milliseconds of
sketch work (KLL sorted views, HLL unions) and of JSON per distinct view. Computed in the API
process, 50 subscriptions' snapshots hold the GIL that every REST request needs, and a REST
p99 becomes the time a request waits behind them. A worker process has its own interpreter
and its own store connection, so the API process only waits on a pipe for the text it sends.

The worker's point cache keeps its final points in the store (store/final_points.py): the
points a snapshot computed are then read, not computed, by the REST queries and the hub's
per-tick updates of the API process. The per-tick updates stay in the API process (a few
windows each) and share its point cache with REST.

Until the pool has started (a fresh interpreter imports the store and sketches: a second or
two), or if a worker dies, snapshots are computed in the caller's thread as before: a
subscription is never refused for want of a worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from query import Query

log = logging.getLogger("sketchboard.ws")

# What a worker opens once: (store, point cache) from a picklable callable (the wiring's).
WorkerState = Callable[[], tuple[Any, Any]]

_state: tuple[Any, Any] | None = None  # in a worker process: its store and point cache


def _open(open_state: WorkerState) -> None:
    global _state
    # Ctrl-C reaches the whole foreground process group, this worker too: the API process stops
    # the pool (stop()), so a worker's KeyboardInterrupt would only print a traceback per Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _state = open_state()


def _ready() -> bool:
    return _state is not None


def _snapshot(query: Query, now_ms: int, watermark_ms: int | None, max_points: int,
              generation: int) -> tuple[str, dict]:
    from api.ws_compute import group_marks, snapshot_result
    from api.ws_hub import _dumps

    store, cache = _state
    if cache is not None and cache.generation != generation:  # the API process's cache was cleared (a switch)
        cache.clear(generation=generation)
    # Only the text goes back (unpickling thousands of point dicts would hold the API process's GIL),
    # with the groups it shows (a few tuples), which the hub's updates fill in (api/ws_compute.py).
    result = snapshot_result(store, query, now_ms, watermark_ms, max_points, cache)
    return _dumps(result), group_marks(query, result["series"])


def _warm(queries: list[Query], now_ms: int, watermarks: dict[str, int], max_points: int, generation: int) -> int:
    from query.warm import warm

    store, cache = _state
    if cache is None:  # nowhere to keep the points: nothing to warm
        return 0
    if cache.generation != generation:
        cache.clear(generation=generation)
    return warm(store, queries, now_ms=now_ms, watermarks=watermarks, max_points=max_points, cache=cache)


WARM_CHUNK = 4  # views per task of a warm run (SnapshotWorkers.warm)


class SnapshotWorkers:
    """A pool of `processes` worker processes (spawned: the API process has threads) computing
    snapshots; compute() answers None while none is ready (the caller computes it then)."""

    def __init__(self, open_state: WorkerState, processes: int = 1):
        self._open_state = open_state
        self._processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None
        self._stopped = False
        self.computed = 0  # snapshots the workers computed

    def start(self) -> None:
        """Spawn the workers in the background (the caller does not wait for their imports)."""
        with self._lock:
            if self._pool is not None or self._starting is not None:
                return
            self._stopped = False
            self._starting = threading.Thread(target=self._spawn, name="ws-snapshot-workers", daemon=True)
            self._starting.start()

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    def _spawn(self) -> None:
        pool = ProcessPoolExecutor(self._processes, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_open, initargs=(self._open_state,))
        try:
            ready = all(pool.submit(_ready).result() for _ in range(self._processes))
        except Exception:
            log.exception("websocket snapshot workers did not start; snapshots are computed in the API process")
            pool.shutdown(wait=False, cancel_futures=True)
            return
        with self._lock:
            if not self._stopped:
                self._pool, pool = pool, None
                if ready:
                    self._ready.set()
        if pool is not None:  # stopped meanwhile
            pool.shutdown(wait=True, cancel_futures=True)

    def compute(self, query: Query, now_ms: int, watermark_ms: int | None, max_points: int,
                generation: int = 0) -> tuple[str, dict] | None:
        """The snapshot's result as JSON text and its groups (api.ws_compute.group_marks), or None
        where no worker can compute it now.
        `generation`: the API process's point cache's (a worker forgets its points when it changed)."""
        pool = self._pool
        if pool is None or not self._ready.is_set():
            return None
        try:
            future = pool.submit(_snapshot, query, now_ms, watermark_ms, max_points, generation)
        except (RuntimeError, BrokenProcessPool):  # stopped, or broken, meanwhile
            return None
        try:
            done = future.result()
        except BrokenProcessPool:
            log.error("a websocket snapshot worker died; snapshots are computed in the API process from now on")
            self._ready.clear()
            return None
        self.computed += 1
        return done

    def warm(self, queries: list[Query], now_ms: int, watermarks: dict[str, int], max_points: int,
             generation: int = 0) -> int | None:
        """Declared views computed in a worker so their final points are kept (api/point_warmer.py):
        how many were computed, or None where no worker can now. A worker keeps its point cache
        between runs, so a view's unchanged final points cost their fingerprints' sums only.

        Handed over WARM_CHUNK views at a time: the snapshots a websocket subscription asks
        meanwhile go to the same workers and wait behind one chunk, not behind a whole run (the
        first over a day of data computes ~250 series: seconds)."""
        done = 0
        for i in range(0, len(queries), WARM_CHUNK):
            pool = self._pool
            if pool is None or not self._ready.is_set():
                return None
            try:
                done += pool.submit(_warm, queries[i:i + WARM_CHUNK], now_ms, watermarks, max_points,
                                    generation).result()
            except (RuntimeError, BrokenProcessPool):  # stopped or broken meanwhile: the snapshots' path says so
                return None
        return done

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            starting, self._starting = self._starting, None
        if starting is not None:
            starting.join(timeout=60)
        with self._lock:
            pool, self._pool = self._pool, None
            self._ready.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
