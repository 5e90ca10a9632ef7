"""Points of final windows of sketch stats, kept between queries: a dashboard that refreshes
a 24 h percentile every second recomputes only the windows whose rows changed.

A point is reused only while its window's fingerprint is unchanged: the events in it, the
rows under it, the newest batch that changed one of them and their highest revision, as the
store sums them (PaneStore.aggregate_tier). A straggler merged into a final window changes
its newest batch, so the corrected window is computed again. Only final points are kept for
long (and by the store): provisional ones change with nearly every batch. The text the API
writes of a kept point is written once, when it is kept, and kept beside it. Points are kept as
plain tuples, out of the garbage collector's reach, and handed out as KeptPoints with their texts
(store/kept_point.py).

Provisional points (windows the watermark has not passed) are kept apart, in memory only, each with
its fingerprint and the watermark it was computed under: reused while both are unchanged, which
is until the next batch that reaches them (or moves the watermark). A 24 h view with a 1 h
sliding window has 60 of them, each a merge of up to an hour of sketches, computed again at every
query and by every viewer between two batches before.
Pure: no I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING

from store.kept_point import Form, KeptPoint, form, served
from store.point_text import format_point, point_text
from store.rollup import Point

if TYPE_CHECKING:
    from store.final_points import FinalPoints

Fingerprint = tuple[int, int, int, int]  # (events, rows, newest batch, highest revision)
# A kept chunk's groups: (group, its points' forms in their windows' order, their texts) each
ChunkGroups = tuple[tuple[tuple, tuple[Form, ...], tuple[str, ...]], ...]


def _count(per_shape: dict[Hashable, int], shape: Hashable, change: int) -> None:
    """Add `change` to a shape's count of points, forgetting the shape at 0."""
    left = per_shape.get(shape, 0) + change
    if left:
        per_shape[shape] = left
    else:
        per_shape.pop(shape, None)


def _points_in(groups: ChunkGroups) -> int:
    """What a chunk counts against the budget: its points, at least one (a group-by's chunk whose
    groups were all empty there holds none, and is still an entry to let go)."""
    return max(1, sum(len(forms) for _, forms, _ in groups))


class PointCache:
    def __init__(self, max_points: int = 200_000, backing: FinalPoints | None = None):
        self.max_points = max_points
        self.backing = backing
        # key -> (fingerprint, point's form, its text): exact tuples of numbers and strings only, which
        # the collector stops tracking (store/kept_point.py), as the key tuples and fingerprints
        self._entries: OrderedDict[Hashable, tuple[Fingerprint, Form, str]] = OrderedDict()
        self._per_shape: dict[Hashable, int] = {}  # shape -> points kept of it (a key is (shape, group, t_ms))
        self._lock = threading.Lock()  # the API computes queries in a thread pool
        self._unsaved: list = []  # (shape, group, t_ms, fingerprint, point, keep_ms, text) put since the last save()
        self.hits = self.misses = 0  # final points found / not found (a miss may be a provisional hit)
        # key -> (fingerprint, watermark, point's form, its text) of provisional points, by how recently
        # kept or asked; at most max_points // 8, never saved (they change with the next batch)
        self._provisional: OrderedDict[Hashable, tuple[Fingerprint, int, Form, str]] = OrderedDict()
        self._provisional_per_shape: dict[Hashable, int] = {}  # shape -> provisional points kept of it
        self.provisional_hits = 0
        # (shape, chunk start) -> (validity, its groups) of a chunk of final windows, by how recently
        # asked (store/series.py: reused while the rows under them are unchanged); a group: (group,
        # forms of its points, their texts)
        self._chunks: OrderedDict[Hashable, tuple[str, ChunkGroups]] = OrderedDict()
        self._chunk_points = 0
        self.chunk_hits = 0
        self.generation = 0  # how many times clear() was called: a worker process's cache follows it (api/ws_workers.py)

    def get(self, key: Hashable, fingerprint: Fingerprint) -> KeptPoint | None:
        """The point kept under `key` while its window's fingerprint is unchanged, else None."""
        return self.get_many([(key, fingerprint)])[0]

    def get_many(self, wanted: Iterable[tuple[Hashable, Fingerprint]], *,
                 watermark_ms: int | None = None) -> list[KeptPoint | None]:
        """get() of each (key, fingerprint), under one hold of the lock: a day of 1-minute points
        is 1 440 of them a query. With watermark_ms, a key without a final point gets the
        provisional one put_many() kept under the same fingerprint and watermark."""
        found: list[tuple | None] = []
        with self._lock:
            entries, provisional = self._entries, self._provisional
            misses = 0
            for key, fingerprint in wanted:
                entry = entries.get(key)
                if entry is not None and entry[0] == fingerprint:
                    entries.move_to_end(key)
                    found.append((entry[1], entry[2]))
                    continue
                misses += 1
                entry = provisional.get(key) if watermark_ms is not None and provisional else None
                if entry is not None and entry[0] == fingerprint and entry[1] == watermark_ms:
                    provisional.move_to_end(key)
                    found.append((entry[2], entry[3]))
                    self.provisional_hits += 1
                else:
                    found.append(None)
            self.hits += len(found) - misses
            self.misses += misses
        return [None if entry is None else served(*entry) for entry in found]

    def put(self, key: Hashable, fingerprint: Fingerprint, point: Point) -> None:
        """Keep a final point (key: (shape, group, t_ms)); provisional points are not kept."""
        self.put_many([(key, fingerprint, point)])

    def put_many(self, items: Iterable[tuple[Hashable, Fingerprint, Point]], *, keep_ms: int | None = None,
                 watermark_ms: int | None = None) -> None:
        """put() of each (key, fingerprint, point), under one hold of the lock. keep_ms: how long
        after its window's start a point can still be asked (its backing forgets it then). Each
        point's text is written here (outside the lock), once: every query of its window reads it.
        watermark_ms: the watermark the points were computed under; with it, the provisional ones
        are kept too, in memory only, for get_many() under the same watermark."""
        final, provisional = [], []
        for key, fingerprint, point in items:
            if point.final:
                final.append((key, fingerprint, point, point_text(point)))
            elif watermark_ms is not None:
                provisional.append((key, (fingerprint, watermark_ms, form(point), point_text(point))))
        if not final and not provisional:
            return
        with self._lock:
            for key, fingerprint, point, text in final:
                self._keep(key, fingerprint, form(point), text)
            if self.backing is not None:
                self._unsaved.extend((*key, fingerprint, point, keep_ms, text) for key, fingerprint, point, text in final)
            kept = self._provisional
            for key, entry in provisional:
                if key not in kept:
                    _count(self._provisional_per_shape, key[0], 1)
                kept[key] = entry
                kept.move_to_end(key)
            while len(kept) > self.max_points // 8:
                _count(self._provisional_per_shape, kept.popitem(last=False)[0][0], -1)

    def load(self, shape: Hashable, lo_ms: int, hi_ms: int) -> None:
        """The backing's saved points of `shape` with windows starting in [lo_ms, hi_ms), into
        memory where it holds none of that key (what it holds is as new or newer); get() then
        compares fingerprints as for any kept point."""
        if self.backing is None:
            return
        saved = [(group, t_ms, fingerprint, kept, text if text is not None else format_point(served(kept, None)))
                 for group, t_ms, fingerprint, kept, text in self.backing.load(shape, lo_ms, hi_ms)]
        with self._lock:
            for group, t_ms, fingerprint, kept, text in saved:
                if (shape, group, t_ms) not in self._entries:
                    self._keep((shape, group, t_ms), fingerprint, kept, text)

    def final_chunks(self, shape: Hashable, validities: dict[int, str]) -> dict[int, dict[tuple, dict[int, KeptPoint]]]:
        """The chunks of final windows keep_chunks() kept of `shape` (chunk start -> {group: {window
        start: point}}) whose validity is the one asked (store/series.py _chunk_validities), from
        memory, else from the backing (a process before this one kept them)."""
        found: dict[int, ChunkGroups] = {}
        with self._lock:
            for c, validity in validities.items():
                kept = self._chunks.get((shape, c))
                if kept is not None and kept[0] == validity:
                    self._chunks.move_to_end((shape, c))
                    found[c] = kept[1]
        missing = [c for c in validities if c not in found]
        if missing and self.backing is not None:
            loaded = dict(self.backing.load_chunks(shape, {c: validities[c] for c in missing}))
            if loaded:
                with self._lock:
                    for c, groups in loaded.items():
                        self._keep_chunk((shape, c), validities[c], groups)
                found.update(loaded)
        with self._lock:
            self.chunk_hits += len(found)
            # Points reused, not computed (an empty window's is made as asked, never counted)
            self.hits += sum(kept[2] > 0 for groups in found.values() for _, forms, _ in groups for kept in forms)
        return {c: {group: {kept[0]: served(kept, text) for kept, text in zip(forms, texts)}
                    for group, forms, texts in groups}
                for c, groups in found.items()}

    def keep_chunks(self, shape: Hashable, chunks: dict[int, tuple[str, dict[tuple, dict[int, Point]]]], *,
                    keep_ms: int | None = None) -> dict[tuple, dict[int, KeptPoint]]:
        """Keep chunks of a view's final windows (chunk start -> (validity, {group: {window start:
        point}})) while their validity holds: the views asked again and again (a dashboard's, the
        standard views, a websocket's), at most a quarter of max_points in all, counted apart from
        the points kept by window (a chunk holds points those may have let go), the least recently
        asked let go first. The backing keeps them too (keep_ms: as for put_many). Each point's
        text is written here: the points as kept, with their texts ({group: {window start:
        point}}, every chunk's), for the query's answer to write them no second time."""
        kept = {c: (validity, tuple((group, tuple(map(form, points.values())), tuple(map(point_text, points.values())))
                                    for group, points in groups.items()))
                for c, (validity, groups) in chunks.items()}
        if not kept:
            return {}
        with self._lock:
            for c, (validity, groups) in kept.items():
                self._keep_chunk((shape, c), validity, groups)
        if self.backing is not None:
            self.backing.save_chunks_soon([(shape, c, validity, groups, keep_ms)
                                           for c, (validity, groups) in kept.items()])
        out: dict[tuple, dict[int, KeptPoint]] = {}
        for _, groups in kept.values():
            for group, forms, texts in groups:
                out.setdefault(group, {}).update((f[0], served(f, text)) for f, text in zip(forms, texts))
        return out

    def _keep_chunk(self, key: Hashable, validity: str, groups: ChunkGroups) -> None:
        budget = self.max_points // 4
        gone = self._chunks.pop(key, None)
        if gone is not None:
            self._chunk_points -= _points_in(gone[1])
        if _points_in(groups) > budget:
            return
        self._chunks[key] = (validity, groups)
        self._chunk_points += _points_in(groups)
        while self._chunk_points > budget:
            self._chunk_points -= _points_in(self._chunks.popitem(last=False)[1][1])

    def holds(self, shape: Hashable) -> bool:
        """Whether any point of `shape` is in memory, final or provisional: where none is, a query has
        nothing to reuse and computes every window from the rows it reads (store.series),
        fingerprints included. (A view whose windows are all provisional, a 1 h range of a 1 h
        window, holds only provisional ones.)"""
        with self._lock:
            return self._per_shape.get(shape, 0) > 0 or self._provisional_per_shape.get(shape, 0) > 0

    def save(self) -> None:
        """Hand the points put since the last save to the backing (written in the background)."""
        if self.backing is None:
            return
        with self._lock:
            unsaved, self._unsaved = self._unsaved, []
        self.backing.save_soon(unsaved)

    def _keep(self, key: Hashable, fingerprint: Fingerprint, kept: Form, text: str) -> None:
        if key not in self._entries:
            _count(self._per_shape, key[0], 1)
        self._entries[key] = (fingerprint, kept, text)
        self._entries.move_to_end(key)
        if self._provisional.pop(key, None) is not None:  # its window is final now (put, or loaded from the store)
            _count(self._provisional_per_shape, key[0], -1)
        while len(self._entries) > self.max_points:
            _count(self._per_shape, self._entries.popitem(last=False)[0][0], -1)

    def clear(self, *, generation: int | None = None) -> None:
        """Forget every point (a switch replaced a stream's rows: store/switch.py), those kept
        in the store too; `generation`: another process's cache cleared them (only this memory)."""
        with self._lock:
            self._entries.clear()
            self._per_shape.clear()
            self._chunks.clear()
            self._chunk_points = 0
            self._provisional.clear()
            self._provisional_per_shape.clear()
            self._unsaved.clear()
            self.generation = self.generation + 1 if generation is None else generation
        if self.backing is not None and generation is None:
            self.backing.clear()

    def __len__(self) -> int:
        return len(self._entries)
