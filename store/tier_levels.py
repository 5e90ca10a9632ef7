"""A batch's tier deltas computed column-wise (store/tiers.py says what tier rows are). Pure:
no I/O, no clock.

The batch's pane rows become one level of columns (numpy arrays for start, dimension
combination, count, revision and each value field's n/min/max; lists for sums and sketch
blobs). Each tier is a coarser grouping of a finer level already computed (the smallest that
can make it: a finer-or-equal granule that divides it, with a projection that covers it): its
groups are found with one sort of (granule start, projected combination), and the exact stats
of all groups are reduced at once (numpy reduceat). Only groups of more than one row do
per-group work: the sum (math.fsum over the group's parts, exactly rounded, so the result does
not depend on the parts' order) and the sketch merges (small KLLs merged byte-wise,
sketches/kll_exact.py; a group that compacts gets its exact-mode parts' items in one
DataSketches update, which is what its merge of such a part does, and its other parts
merged; HLLs under 8 coupons as lists, others with DataSketches). The pane rows' KLL headers
are read for all rows at once (kll_exact.exact_items_many). So the commit no longer groups and merges
each tier row in Python objects; what is left per row is building the TierDelta the store
writes.

The numbers equal the row-wise derivation this replaced (tests/tier_reference.py, pinned by
tests/unit/test_tier_levels.py): counts, n, min, max, sums and revisions identical, sketches
holding the same items (the same bytes where no compaction happens)."""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Sequence

import numpy as np

from sketches import DEFAULT_K, DEFAULT_LG_K, HllSketch, KllSketch
from sketches.hll_list import merged_list_bytes
from sketches.kll_exact import ABSENT, OPAQUE, exact_bytes_of, exact_items_many
from sketches.kll_sorted import sorted_level_zero
from store.exact_sum import exact_sum
from store.panes import PaneData, ValueStats, dims_key
from store.partial_columns import PartialColumns
from store.tier_folds import shard
from store.tiers import ALL_DIMS, TierDelta, TierKey, TierLayout, narrower, project


class _Field:
    """A value field's columns; rows without the field hold n 0, sum 0.0, no bounds, no sketch."""

    __slots__ = ("present", "n", "sums", "lo", "lo_none", "hi", "hi_none", "kll")

    def __init__(self, size: int):
        self.present = np.zeros(size, bool)
        self.n = np.zeros(size, np.int64)
        self.sums: list = [0.0] * size
        self.lo = np.full(size, math.inf)
        self.lo_none = np.ones(size, bool)
        self.hi = np.full(size, -math.inf)
        self.hi_none = np.ones(size, bool)
        self.kll: _Kll | None = None  # set once the rows are read


_ABSENT, _OPAQUE = ABSENT, OPAQUE  # a row's KLL length when it has none / when it is not in exact mode


class _Kll:
    """A value field's KLL sketches as columns. A sketch in exact mode (at most k items: no
    compaction yet) is kept as its items (`items[offset:offset + length]`), so the sketches of
    a group that together hold at most k items merge as one gather of the items, for every
    group at once; others are kept as bytes (length _OPAQUE) and merged by DataSketches.
    `blobs` holds each row's bytes where it has them already (None: built from the items)."""

    __slots__ = ("length", "offset", "items", "blobs")

    def __init__(self, length: np.ndarray, offset: np.ndarray, items: np.ndarray, blobs: list):
        self.length, self.offset, self.items, self.blobs = length, offset, items, blobs

    @classmethod
    def of(cls, blobs: list) -> _Kll:
        length, items = exact_items_many(blobs, DEFAULT_K)  # every row's header read at once
        used = np.maximum(length, 0)
        return cls(length, np.cumsum(used) - used, items, list(blobs))

    def all_blobs(self) -> list:
        """Every row's sketch bytes (None: the row has no sketch). Rows hold their items one
        after the other in `items`, so each row's min and max come from one reduceat over the
        segments of every row with items (not only the rows written here: a segment runs to the
        next one's start, and rows that keep their bytes hold items too)."""
        blobs = list(self.blobs)
        todo = [i for i, (blob, n) in enumerate(zip(blobs, self.length.tolist())) if blob is None and n >= 0]
        if not todo:
            return blobs
        rows = np.asarray(todo, np.int64)
        lengths, offsets = self.length[rows], self.offset[rows]
        lo = np.zeros(len(self.length))
        hi = np.zeros(len(self.length))
        with_items = np.flatnonzero(self.length > 0)
        if len(with_items):  # rows with items are contiguous and in order, and hold all of `items`
            lo[with_items] = np.minimum.reduceat(self.items, self.offset[with_items])
            hi[with_items] = np.maximum.reduceat(self.items, self.offset[with_items])
        lo, hi = lo[rows], hi[rows]
        flat = self.items.astype("<f8", copy=False).tobytes()
        for i, n, at, mn, mx in zip(todo, lengths.tolist(), offsets.tolist(), lo.tolist(), hi.tolist()):
            blobs[i] = exact_bytes_of(flat[8 * at:8 * (at + n)], n, mn, mx, DEFAULT_K)
        return blobs

    def grouped(self, order: np.ndarray, first: np.ndarray, multi: list[tuple[int, int, int]]) -> _Kll:
        """The sketches of the groups of rows `order[first[g]:first[g + 1]]`."""
        length, offset = self.length[order], self.offset[order]
        used = np.maximum(length, 0)
        total = np.add.reduceat(used, first)
        absent = np.logical_and.reduceat(length == _ABSENT, first)
        exact = ~np.logical_or.reduceat(length == _OPAQUE, first) & ~absent & (total <= DEFAULT_K)
        new_length = np.where(absent, _ABSENT, np.where(exact, total, _OPAQUE))
        sizes = np.diff(np.append(first, len(order)))
        # The items of exact groups, gathered group after group (each group's parts in order).
        items = self._gather(offset, used, np.repeat(exact, sizes) & (used > 0))
        kept = np.where(exact, total, 0)
        new_offset = np.cumsum(kept) - kept
        blobs = [self.blobs[i] for i in order[first].tolist()] if len(order) else []
        exact_list = exact.tolist()
        opaque = np.flatnonzero(new_length == _OPAQUE)
        if len(opaque):
            # Groups that compact: their parts in exact mode go in as one array of items, their
            # others merge as sketches (DataSketches merges an exact-mode part item by item, as an
            # update does: the same sketch, without writing and parsing each part's bytes).
            in_group = np.repeat(new_length == _OPAQUE, sizes)
            loose = self._gather(offset, used, in_group & (used > 0))
            counts = np.add.reduceat(np.where(in_group, used, 0), first)
            at = (np.cumsum(counts) - counts).tolist()
            counts, length_list, order_list = counts.tolist(), self.length.tolist(), order.tolist()
            bounds = np.append(first, len(order)).tolist()
            for g in opaque.tolist():
                if bounds[g + 1] - bounds[g] == 1:
                    continue  # one part: its bytes as they are
                sketch = KllSketch.merge_all([self.blobs[i] for i in order_list[bounds[g]:bounds[g + 1]]
                                              if length_list[i] == _OPAQUE])
                if counts[g]:
                    sketch.update_all(loose[at[g]:at[g] + counts[g]])
                blobs[g] = sorted_level_zero(sketch.to_bytes())  # read faster: sketches/kll_sorted.py
        for g, lo, hi in multi:
            if exact_list[g]:
                blobs[g] = None  # built from the gathered items when written
        return _Kll(new_length, new_offset, items, blobs)

    def _gather(self, offset: np.ndarray, used: np.ndarray, take: np.ndarray) -> np.ndarray:
        """The items of the rows where `take` is set (`offset` and `used` in the same order), one
        row after the other."""
        lens, starts = used[take], offset[take]
        ends = np.cumsum(lens)
        return self.items[np.repeat(starts - ends + lens, lens) + np.arange(ends[-1] if len(ends) else 0)]


class _Level:
    """Rows of one granule and projection, as columns; combo indexes `dims` and `keys`."""

    def __init__(self, granule: int, proj: str, start: np.ndarray, combo: np.ndarray, dims: list, keys: list[str],
                 count: np.ndarray, revision: np.ndarray, fields: dict[str, _Field], distincts: dict[str, list]):
        self.granule, self.proj, self.start, self.combo, self.dims, self.keys = granule, proj, start, combo, dims, keys
        self.count, self.revision, self.fields, self.distincts = count, revision, fields, distincts

    def __len__(self) -> int:
        return len(self.start)


# (granules, point): the tiers of these granules take only the rows of panes starting before the
# point (a folded tier's, store/tier_folds.py: the batch's partials before the stream's fold point),
# one for every row or one per shard of dimension combinations (each row its shard's).
Split = tuple[Container[int], int | tuple[int, ...]]


def tier_deltas(pane_rows: Iterable[tuple], layout: TierLayout,
                granules: Container[int] | None = None, split: Split | None = None) -> dict[TierKey, TierDelta]:
    """Every tier row a batch touches, with its delta: from pane rows (start, dims, the batch's
    data for the pane, the pane's revision after the merge), optionally with dims_key(dims) as
    a third item when the caller has it. `granules`: only the tiers of these (None: every tier);
    `split`: see Split."""
    return _deltas(_root(pane_rows, layout.pane_ms), layout, granules, split)


def tier_deltas_of_columns(columns: PartialColumns, revisions: Sequence[int], layout: TierLayout,
                           granules: Container[int] | None = None, split: Split | None = None
                           ) -> dict[TierKey, TierDelta]:
    """tier_deltas of a stream's partials given as columns (store/partial_columns.py), with each
    row's pane revision after the merge: the same deltas, without reading each partial's objects
    back into columns."""
    return _deltas(_root_of_columns(columns, revisions, layout.pane_ms), layout, granules, split)


def _deltas(root: _Level, layout: TierLayout, granules: Container[int] | None = None,
            split: Split | None = None) -> dict[TierKey, TierDelta]:
    # A split's tiers are made of the root's rows before its point and of levels made of those:
    # one root for both (building a second root of the early rows cost a backlog's commit ~8 %).
    levels, early_levels = [root], []
    early = np.flatnonzero(root.start < _row_points(root, split[1])) if split is not None else None
    out: dict[TierKey, TierDelta] = {}
    tiers = [t for t in layout.tiers() if granules is None or t.granule_ms in granules]
    # Coarse granules and wide projections first would waste work: finest first, all dims first.
    for tier in sorted(tiers, key=lambda t: (t.granule_ms, t.proj != ALL_DIMS, -len(t.proj))):
        split_here = split is not None and tier.granule_ms in split[0]
        if split_here and not len(early):
            continue
        pool = early_levels if split_here else levels
        # The root first, as in `levels`: of sources as small, the first is taken (a sum's rounding).
        # Also when every row is early, a split tier comes from the root or its own levels, never
        # from a finer tier's: the same rows, and the same roundings, as a pass over the early rows.
        sources = [(root, None if len(early) == len(root) else early)] if split_here else []
        sources += [(lv, None) for lv in pool if tier.granule_ms % lv.granule == 0 and narrower(tier.proj, lv.proj)]
        src, rows = min(sources, key=lambda s: len(s[0]) if s[1] is None else len(s[1]))
        level = _group(src, tier.granule_ms, tier.proj, rows)
        pool.append(level)
        _emit(level, out)
    return out


def _row_points(root: _Level, points: int | tuple[int, ...]) -> int | np.ndarray:
    """Each root row's fold point: one for all, or its combination's shard's (store/tier_folds.py)."""
    if isinstance(points, int):
        return points
    by_combo = np.asarray([points[shard(key)] for key in root.keys], np.int64)
    return by_combo[root.combo] if len(by_combo) else np.zeros(0, np.int64)


def _root(pane_rows: Iterable[tuple], pane_ms: int) -> _Level:
    rows = list(pane_rows)
    size = len(rows)
    combos: dict[str, int] = {}
    dims_of: list = []
    keys: list[str] = []
    start, combo, count, revision = [], [], [], []
    values: dict[str, tuple] = {}  # per value field: its rows' indexes, n, sums, mins, maxes, KLLs
    distincts: dict[str, list] = {}
    # Python lists, made arrays once: a numpy item assignment per row and column cost more
    # than the rest of the loop.
    for i, row in enumerate(rows):
        if len(row) == 5:
            s, dims, key, data, rev = row
        else:
            s, dims, data, rev = row
            key = dims_key(dims)
        c = combos.get(key)
        if c is None:
            c = combos[key] = len(keys)
            keys.append(key)
            dims_of.append(dims)
        start.append(s)
        combo.append(c)
        count.append(data.count)
        revision.append(rev)
        for name, v in data.values.items():
            column = values.get(name)
            if column is None:
                column = values[name] = ([], [], [], [], [], [])
            column[0].append(i)
            column[1].append(v.n)
            column[2].append(v.sum)
            column[3].append(v.min)
            column[4].append(v.max)
            column[5].append(v.kll)
        for name, blob in data.distincts.items():
            if blob is not None:
                column = distincts.get(name)
                if column is None:
                    column = distincts[name] = [None] * size
                column[i] = blob
    fields: dict[str, _Field] = {}
    for name, (at, n, sums, lo, hi, klls) in values.items():
        f = fields[name] = _Field(size)
        at = np.asarray(at, np.int64)
        f.present[at] = True
        f.n[at] = n
        if len(at) == size:
            f.sums = sums
        else:
            for i, total in zip(at.tolist(), sums):
                f.sums[i] = total
        f.lo_none[at] = [x is None for x in lo]
        f.lo[at] = [math.inf if x is None else x for x in lo]
        f.hi_none[at] = [x is None for x in hi]
        f.hi[at] = [-math.inf if x is None else x for x in hi]
        column = [None] * size
        for i, kll in zip(at.tolist(), klls):
            column[i] = kll
        f.kll = _Kll.of(column)
    return _Level(pane_ms, ALL_DIMS, np.asarray(start, np.int64).reshape(size), np.asarray(combo, np.int64).reshape(size),
                  dims_of, keys, np.asarray(count, np.int64).reshape(size), np.asarray(revision, np.int64).reshape(size),
                  fields, distincts)


def _root_of_columns(cols: PartialColumns, revisions: Sequence[int], pane_ms: int) -> _Level:
    """_root's level from columns: the same arrays, lists and field order (a field's place is
    where a row first has it, then the stream's order, as _root meets them row by row; the
    columns number their combinations in the order rows first have them, as _root does)."""
    size = len(cols)
    if len(revisions) != size:
        raise ValueError(f"{size} rows of columns, {len(revisions)} revisions")
    found = []  # (first row, place in the stream's order, name, its _Field)
    for place, (name, n, sums, lo, hi, klls) in enumerate(cols.values):
        n = np.asarray(n, np.int64).reshape(size)
        present = n > 0
        if not present.any():
            continue
        f = _Field(0)
        f.present, f.n = present, np.where(present, n, 0)
        whole = bool(present.all())
        f.sums = list(sums) if whole else [x if p else 0.0 for x, p in zip(sums, present.tolist())]
        f.lo = np.where(present, np.asarray(lo, np.float64).reshape(size), math.inf)
        f.hi = np.where(present, np.asarray(hi, np.float64).reshape(size), -math.inf)
        f.lo_none, f.hi_none = ~present, ~present
        f.kll = _Kll.of(list(klls) if whole else [k if p else None for k, p in zip(klls, present.tolist())])
        found.append((int(np.argmax(present)), place, name, f))
    fields = {name: f for _, _, name, f in sorted(found, key=lambda x: x[:2])}
    seen = []
    for place, (name, blobs) in enumerate(cols.distincts):
        first = next((i for i, blob in enumerate(blobs) if blob is not None), None)
        if first is not None:
            seen.append((first, place, name, list(blobs)))
    distincts = {name: blobs for _, _, name, blobs in sorted(seen, key=lambda x: x[:2])}
    return _Level(pane_ms, ALL_DIMS, np.asarray(cols.start, np.int64).reshape(size),
                  np.asarray(cols.combo, np.int64).reshape(size), list(cols.dims), list(cols.keys),
                  np.asarray(cols.count, np.int64).reshape(size), np.asarray(revisions, np.int64).reshape(size),
                  fields, distincts)


def _group(src: _Level, granule: int, proj: str, rows: np.ndarray | None = None) -> _Level:
    """The rows of tier (granule, proj) made from the rows of `src` (`rows`: only these, ascending)."""
    if proj == ALL_DIMS or proj == src.proj:
        combo, dims, keys = src.combo, src.dims, src.keys
    else:  # few distinct combinations: each projected (and its key encoded) once
        found: dict[str, int] = {}
        dims, keys, mapping = [], [], []
        for d in src.dims:
            p = project(d, proj)
            key = dims_key(p)
            c = found.get(key)
            if c is None:
                c = found[key] = len(keys)
                keys.append(key)
                dims.append(p)
            mapping.append(c)
        combo = np.asarray(mapping, np.int64)[src.combo]
    start = src.start - np.mod(src.start, granule)
    # Stable: a group's parts keep their order in `src`.
    order = (_by_start_and_combo(start, combo, granule) if rows is None
             else rows[_by_start_and_combo(start[rows], combo[rows], granule)])
    s_start, s_combo = start[order], combo[order]
    if len(order):
        breaks = np.flatnonzero((s_start[1:] != s_start[:-1]) | (s_combo[1:] != s_combo[:-1])) + 1
        first = np.concatenate(([0], breaks))
    else:
        first = np.zeros(0, np.int64)
    bounds = np.append(first, len(order)).tolist()
    multi = [(g, bounds[g], bounds[g + 1]) for g in np.flatnonzero(np.diff(bounds) > 1).tolist()]
    order_list = order.tolist()

    heads = order[first].tolist() if len(order) else []

    # The parts of the groups of several rows, group after group: each group's parts are one
    # slice of a column taken at these rows (a list comprehension per group cost more).
    parts = [i for _, lo, hi in multi for i in order_list[lo:hi]]
    part_at = np.cumsum([0] + [hi - lo for _, lo, hi in multi]).tolist()

    def objects(column: list, merge) -> list:
        """Per group: the one part's object, or `merge` of the parts (in `src` order)."""
        out = list(map(column.__getitem__, heads))
        if multi:
            taken = list(map(column.__getitem__, parts))
            for k, (g, _, _) in enumerate(multi):
                out[g] = merge(taken[part_at[k]:part_at[k + 1]])
        return out

    def reduce(ufunc, column: np.ndarray) -> np.ndarray:
        return ufunc.reduceat(column[order], first) if len(order) else column[:0]

    fields = {}
    for name, f in src.fields.items():
        g = _Field(0)
        g.present, g.n = reduce(np.logical_or, f.present), reduce(np.add, f.n)
        g.lo, g.lo_none = reduce(np.minimum, f.lo), reduce(np.logical_and, f.lo_none)
        g.hi, g.hi_none = reduce(np.maximum, f.hi), reduce(np.logical_and, f.hi_none)
        g.sums = objects(f.sums, exact_sum)
        g.kll = f.kll.grouped(order, first, multi)
        fields[name] = g
    distincts = {name: objects(blobs, _merge_hll) for name, blobs in src.distincts.items()}
    return _Level(granule, proj, s_start[first], s_combo[first], dims, keys, reduce(np.add, src.count),
                  reduce(np.maximum, src.revision), fields, distincts)


def _by_start_and_combo(start: np.ndarray, combo: np.ndarray, granule: int) -> np.ndarray:
    """np.lexsort((combo, start)), as a stable sort of one int64 per row where they fit: the
    granule's number since the first, times the combinations, plus the combination."""
    if not len(start):
        return np.zeros(0, np.int64)
    first, combos = int(start.min()), int(combo.max()) + 1
    if (int(start.max()) - first) // granule * combos >= 1 << 62 or int(combo.min()) < 0:
        return np.lexsort((combo, start))
    return np.argsort((start - first) // granule * combos + combo, kind="stable")


def _merge_hll(blobs: list) -> bytes | None:
    parts = [b for b in blobs if b is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    merged = merged_list_bytes(parts, DEFAULT_LG_K)  # a handful of users: their coupons, without repeats
    return merged if merged is not None else HllSketch.merged_bytes(parts)


def _emit(level: _Level, out: dict[TierKey, TierDelta]) -> None:
    """The level's rows as TierDeltas (the objects the store's commit plan merges and writes)."""
    fields = [(name, f.present.tolist(), f.n.tolist(), f.sums, f.lo.tolist(), f.lo_none.tolist(), f.hi.tolist(),
               f.hi_none.tolist(), f.kll.all_blobs()) for name, f in level.fields.items()]
    distincts = list(level.distincts.items())
    dims, keys, g, proj = level.dims, level.keys, level.granule, level.proj
    for i, (start, c, count, revision) in enumerate(zip(level.start.tolist(), level.combo.tolist(),
                                                        level.count.tolist(), level.revision.tolist())):
        values = {name: ValueStats(n[i], sums[i], None if lo_none[i] else lo[i], None if hi_none[i] else hi[i], kll[i])
                  for name, present, n, sums, lo, lo_none, hi, hi_none, kll in fields if present[i]}
        hlls = {name: blobs[i] for name, blobs in distincts if blobs[i] is not None}
        out[TierKey(g, proj, start, keys[c])] = TierDelta(dims[c], PaneData(count, values, hlls), revision)

