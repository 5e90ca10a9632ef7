"""Points of final windows of sketch stats, kept between queries: a dashboard that refreshes
a 24 h percentile every second recomputes only the windows whose rows changed.

A point is reused only while its window's fingerprint is unchanged: the events in it, the
rows under it, the newest batch that changed one of them and their highest revision, as the
store sums them (PaneStore.aggregate_tier). A straggler merged into a final window changes
its newest batch, so the corrected window is computed again. Only final points are kept:
provisional ones change with nearly every batch. Pure: no I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from store.rollup import Point

Fingerprint = tuple[int, int, int, int]  # (events, rows, newest batch, highest revision)


class PointCache:
    def __init__(self, max_points: int = 200_000):
        self.max_points = max_points
        self._entries: OrderedDict[Hashable, tuple[Fingerprint, Point]] = OrderedDict()
        self._lock = threading.Lock()  # the API computes queries in a thread pool
        self.hits = self.misses = 0

    def get(self, key: Hashable, fingerprint: Fingerprint) -> Point | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None or found[0] != fingerprint:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found[1]

    def put(self, key: Hashable, fingerprint: Fingerprint, point: Point) -> None:
        if not point.final:
            return
        with self._lock:
            self._entries[key] = (fingerprint, point)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_points:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every point (a switch replaced a stream's rows: store/switch.py)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
