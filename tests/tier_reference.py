"""The row-wise tier derivation the commit used before store/tier_levels.py (issue 27): the
oracle tests/unit/test_tier_levels.py compares the column-wise one with. Each tier row's parts
grouped in Python dicts and merged one row at a time."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from sketches import HllSketch, KllSketch
from store.panes import PaneData, ValueStats, dims_key
from store.tiers import ALL_DIMS, TierDelta, TierKey, TierLayout, narrower, project


def merge_many(parts: Sequence[PaneData]) -> PaneData:
    """The merge of many pane data at once: each sketch merged in one pass (DataSketches
    union), sums added exactly rounded (fsum) so the order of parts does not matter."""
    if len(parts) == 1:
        return parts[0]
    count = 0
    values: dict[str, list] = {}
    distincts: dict[str, list] = {}
    for part in parts:
        count += part.count
        for name, v in part.values.items():
            acc = values.get(name)
            if acc is None:
                acc = values[name] = [0, [], None, None, []]
            acc[0] += v.n
            acc[1].append(v.sum)
            if v.min is not None and (acc[2] is None or v.min < acc[2]):
                acc[2] = v.min
            if v.max is not None and (acc[3] is None or v.max > acc[3]):
                acc[3] = v.max
            if v.kll is not None:
                acc[4].append(v.kll)
        for name, blob in part.distincts.items():
            if blob is not None:
                distincts.setdefault(name, []).append(blob)
    return PaneData(
        count=count,
        values={name: ValueStats(n, math.fsum(sums), lo, hi, _merged(KllSketch, blobs))
                for name, (n, sums, lo, hi, blobs) in values.items()},
        distincts={name: _merged(HllSketch, blobs) for name, blobs in distincts.items()},
    )


def _merged(kind, blobs: list[bytes]) -> bytes | None:
    if not blobs:
        return None
    if len(blobs) == 1:
        return blobs[0]
    # HLLs through DataSketches alone: the reference the numpy union (sketches/hll_dense.py) is pinned to.
    return (HllSketch.library_union(blobs) if kind is HllSketch else kind.merge_all(blobs)).to_bytes()


# One row of a level while deltas are derived: (start, dims, dims_key(dims), data, revision).
_Row = tuple[int, Mapping[str, str], str, PaneData, int]


def tier_deltas_by_row(pane_rows: Iterable[tuple], layout: TierLayout) -> dict[TierKey, TierDelta]:
    """Every tier row a batch touches, with its delta: from pane rows (start, dims, the batch's
    data for the pane, the pane's revision after the merge), optionally with dims_key(dims) as
    a third item when the caller has it.

    Each tier is derived from the smallest level already computed that can make it (a
    finer-or-equal granule that divides it, with a projection that covers it), so a pane
    is deserialized about once per granule rather than once per tier row."""
    root = [row if len(row) == 5 else (row[0], row[1], dims_key(row[1]), row[2], row[3]) for row in pane_rows]
    levels: list[tuple[int, str, list[_Row]]] = [(layout.pane_ms, ALL_DIMS, root)]
    out: dict[TierKey, TierDelta] = {}
    # Coarse granules and wide projections first would waste work: finest first, all dims first.
    for tier in sorted(layout.tiers(), key=lambda t: (t.granule_ms, t.proj != ALL_DIMS, -len(t.proj))):
        sources = [lv for lv in levels if tier.granule_ms % lv[0] == 0 and narrower(tier.proj, lv[1])]
        _, source_proj, rows = min(sources, key=lambda lv: len(lv[2]))
        g = tier.granule_ms
        same_dims = tier.proj == ALL_DIMS or tier.proj == source_proj
        # A level has many rows but few distinct dimension combinations: each is projected
        # (and its key encoded) once, not once per row.
        projected: dict[str, tuple[Mapping[str, str], str]] = {}
        groups: dict[tuple[int, str], list] = {}  # (start, projected key) -> [dims, key, parts, revision]
        for start, dims, key, data, revision in rows:
            if not same_dims:
                found = projected.get(key)
                if found is None:
                    dims_p = project(dims, tier.proj)
                    found = projected[key] = (dims_p, dims_key(dims_p))
                dims, key = found
            group_key = (start - start % g, key)
            found = groups.get(group_key)
            if found is None:
                groups[group_key] = [dims, key, [data], revision]
            else:
                found[2].append(data)
                if revision > found[3]:
                    found[3] = revision
        level: list[_Row] = []
        for (start, _), (dims, key, parts, revision) in groups.items():
            data = merge_many(parts)
            out[TierKey(g, tier.proj, start, key)] = TierDelta(dims, data, revision)
            level.append((start, dims, key, data, revision))
        levels.append((g, tier.proj, level))
    return out


