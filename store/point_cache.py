"""Points of final windows of sketch stats, kept between queries: a dashboard that refreshes
a 24 h percentile every second recomputes only the windows whose rows changed.

A point is reused only while its window's fingerprint is unchanged: the events in it, the
rows under it, the newest batch that changed one of them and their highest revision, as the
store sums them (PaneStore.aggregate_tier). A straggler merged into a final window changes
its newest batch, so the corrected window is computed again. Only final points are kept:
provisional ones change with nearly every batch. The text the API writes of a kept point is
written once (store/point_text.py holds it while this cache holds the point). Pure: no I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING

from store.point_text import hold, hold_many, let_go
from store.rollup import Point

if TYPE_CHECKING:
    from store.final_points import FinalPoints

Fingerprint = tuple[int, int, int, int]  # (events, rows, newest batch, highest revision)


class PointCache:
    def __init__(self, max_points: int = 200_000, backing: FinalPoints | None = None):
        self.max_points = max_points
        self.backing = backing
        self._entries: OrderedDict[Hashable, tuple[Fingerprint, Point]] = OrderedDict()
        self._per_shape: dict[Hashable, int] = {}  # shape -> points kept of it (a key is (shape, group, t_ms))
        self._lock = threading.Lock()  # the API computes queries in a thread pool
        self._unsaved: list = []  # (shape, group, t_ms, fingerprint, point) put since the last save()
        self.hits = self.misses = 0
        # (shape, chunk start) -> (validity, {window start: point}) of a chunk of final windows, by
        # how recently asked (store/series.py: reused while the rows under them are unchanged)
        self._chunks: OrderedDict[Hashable, tuple[str, dict[int, Point]]] = OrderedDict()
        self._chunk_points = 0
        self.chunk_hits = 0
        self.generation = 0  # how many times clear() was called: a worker process's cache follows it (api/ws_workers.py)

    def get(self, key: Hashable, fingerprint: Fingerprint) -> Point | None:
        """The point kept under `key` while its window's fingerprint is unchanged, else None."""
        return self.get_many([(key, fingerprint)])[0]

    def get_many(self, wanted: Iterable[tuple[Hashable, Fingerprint]]) -> list[Point | None]:
        """get() of each (key, fingerprint), under one hold of the lock: a day of 1-minute points
        is 1 440 of them a query."""
        out: list[Point | None] = []
        hits = 0
        with self._lock:
            entries = self._entries
            for key, fingerprint in wanted:
                found = entries.get(key)
                if found is None or found[0] != fingerprint:
                    out.append(None)
                    continue
                entries.move_to_end(key)
                hits += 1
                out.append(found[1])
            self.hits += hits
            self.misses += len(out) - hits
        return out

    def put(self, key: Hashable, fingerprint: Fingerprint, point: Point) -> None:
        """Keep a final point (key: (shape, group, t_ms)); provisional points are not kept."""
        self.put_many([(key, fingerprint, point)])

    def put_many(self, items: Iterable[tuple[Hashable, Fingerprint, Point]], *, keep_ms: int | None = None) -> None:
        """put() of each (key, fingerprint, point), under one hold of the lock. keep_ms: how long
        after its window's start a point can still be asked (its backing forgets it then)."""
        final = [item for item in items if item[2].final]
        if not final:
            return
        with self._lock:
            for key, fingerprint, point in final:
                self._keep(key, fingerprint, point)
            if self.backing is not None:
                self._unsaved.extend((*key, fingerprint, point, keep_ms) for key, fingerprint, point in final)

    def load(self, shape: Hashable, lo_ms: int, hi_ms: int) -> None:
        """The backing's saved points of `shape` with windows starting in [lo_ms, hi_ms), into
        memory where it holds none of that key (what it holds is as new or newer); get() then
        compares fingerprints as for any kept point."""
        if self.backing is None:
            return
        saved = self.backing.load(shape, lo_ms, hi_ms)
        with self._lock:
            for group, t_ms, fingerprint, point, text in saved:
                if (shape, group, t_ms) not in self._entries:
                    self._keep((shape, group, t_ms), fingerprint, point, text)

    def final_chunks(self, shape: Hashable, validities: dict[int, str]) -> dict[int, dict[int, Point]]:
        """The chunks of final windows keep_chunks() kept of `shape` (chunk start -> {window start:
        point}) whose validity is the one asked (store/series.py _chunk_validities), from memory,
        else from the backing (a process before this one kept them). The points are this cache's:
        not to be changed."""
        found: dict[int, dict[int, Point]] = {}
        with self._lock:
            for c, validity in validities.items():
                kept = self._chunks.get((shape, c))
                if kept is not None and kept[0] == validity:
                    self._chunks.move_to_end((shape, c))
                    found[c] = kept[1]
        missing = [c for c in validities if c not in found]
        if missing and self.backing is not None:
            loaded = {c: (points, texts) for c, points, texts
                      in self.backing.load_chunks(shape, {c: validities[c] for c in missing})}
            if loaded:
                with self._lock:
                    for c, (points, texts) in loaded.items():
                        self._keep_chunk((shape, c), validities[c], points, texts)
                found.update((c, points) for c, (points, _) in loaded.items())
        with self._lock:
            self.chunk_hits += len(found)
            # Points reused, not computed (an empty window's is made as asked, never counted)
            self.hits += sum(p.count > 0 for chunk in found.values() for p in chunk.values())
        return found

    def keep_chunks(self, shape: Hashable, chunks: dict[int, tuple[str, dict[int, Point]]], *,
                    keep_ms: int | None = None) -> None:
        """Keep chunks of a view's final windows (chunk start -> (validity, {window start: point}))
        while their validity holds: the views asked again and again (a dashboard's, the standard
        views), at most a quarter of max_points in all, counted apart from the points kept by window
        (a chunk holds points those may have let go), the least recently asked let go first. The
        backing keeps them too (keep_ms: as for put_many)."""
        if not chunks:
            return
        with self._lock:
            for c, (validity, points) in chunks.items():
                self._keep_chunk((shape, c), validity, points)
        if self.backing is not None:
            self.backing.save_chunks_soon([(shape, c, validity, points, keep_ms)
                                           for c, (validity, points) in chunks.items()])

    def _keep_chunk(self, key: Hashable, validity: str, points: dict[int, Point],
                    texts: list[str] | None = None) -> None:
        budget = self.max_points // 4
        gone = self._chunks.pop(key, None)
        if gone is not None:
            self._drop_chunk(gone[1])
        if len(points) > budget:
            return
        self._chunks[key] = (validity, points)
        self._chunk_points += len(points)
        hold_many(points.values(), texts)  # an exact stat's points are kept by no window: their texts too
        while self._chunk_points > budget:
            self._drop_chunk(self._chunks.popitem(last=False)[1][1])

    def _drop_chunk(self, points: dict[int, Point]) -> None:
        self._chunk_points -= len(points)
        for point in points.values():
            let_go(point)

    def holds(self, shape: Hashable) -> bool:
        """Whether any point of `shape` is in memory: where none is, a query has nothing to reuse and
        computes every window from the rows it reads (store.series), fingerprints included."""
        with self._lock:
            return self._per_shape.get(shape, 0) > 0

    def save(self) -> None:
        """Hand the points put since the last save to the backing (written in the background)."""
        if self.backing is None:
            return
        with self._lock:
            unsaved, self._unsaved = self._unsaved, []
        self.backing.save_soon(unsaved)

    def _keep(self, key: Hashable, fingerprint: Fingerprint, point: Point, text: str | None = None) -> None:
        """text: the point as the API writes it, where the backing kept it (store/point_text.py)."""
        replaced = self._entries.get(key, (None, None))[1]
        if replaced is not point:
            if replaced is None:
                self._per_shape[key[0]] = self._per_shape.get(key[0], 0) + 1
            else:
                let_go(replaced)
            hold(point, text)
        self._entries[key] = (fingerprint, point)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_points:
            old, (_, gone) = self._entries.popitem(last=False)
            let_go(gone)
            left = self._per_shape[old[0]] - 1
            if left:
                self._per_shape[old[0]] = left
            else:
                del self._per_shape[old[0]]

    def clear(self, *, generation: int | None = None) -> None:
        """Forget every point (a switch replaced a stream's rows: store/switch.py), those kept
        in the store too; `generation`: another process's cache cleared them (only this memory)."""
        with self._lock:
            for _, point in self._entries.values():
                let_go(point)
            for _, points in self._chunks.values():
                self._drop_chunk(points)
            self._entries.clear()
            self._per_shape.clear()
            self._chunks.clear()
            self._unsaved.clear()
            self.generation = self.generation + 1 if generation is None else generation
        if self.backing is not None and generation is None:
            self.backing.clear()

    def __len__(self) -> int:
        return len(self._entries)
