"""Panes: the event-time granules every metric is stored in, and how two of them merge.

A pane holds, for one stream, one pane interval and one combination of dimension values,
everything needed to answer any stat over any window made of panes: the event count,
per value field n/sum/min/max and a KLL sketch, per distinct field an HLL sketch.
Merging is associative and commutative, so batches, stragglers and query-time roll-ups
are all the same operation.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sketches import HllSketch, KllSketch
from sketches.kll_sorted import sorted_level_zero

EMPTY_SUMMARY = {"count": 0, "values": {}, "distinct": {}}


# json.dumps with non-default options builds a JSONEncoder per call, which was a tenth of a
# backfill commit's time; one encoder with the same options writes the same text.
_DIMS_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def matches_filters(dims: Mapping[str, str], filters: Mapping[str, str]) -> bool:
    """Whether a pane's dimensions hold the filters' values: a dimension it lacks reads as "", as
    every query reads it (an event that left a dimension out)."""
    return all(dims.get(name, "") == want for name, want in filters.items())


def filtered_group(dims: Mapping[str, str], group_by: Sequence[str], filters: Mapping[str, str]) -> tuple | None:
    """The group a pane's dimensions fall in (their values of `group_by`), None when the filters
    leave the pane out."""
    return tuple(dims.get(name, "") for name in group_by) if matches_filters(dims, filters) else None


def dims_key(dims: Mapping[str, str]) -> str:
    """Canonical text of a dimension combination (sorted keys), used as part of the pane key."""
    items = tuple(dims.items())
    # A cache hit must not mix up 1, 1.0 and True: only all-text combinations are cached. A
    # plain loop, not all() over a generator: a third of the cost, for every partial of a commit.
    for _, v in items:
        if type(v) is not str:
            return _DIMS_JSON.encode(dict(sorted(items)))
    return _dims_text(items)


@functools.lru_cache(maxsize=1 << 16)
def _dims_text(items: tuple) -> str:
    """A stream has few dimension combinations and a commit encodes each of its partials' twice
    (the stored panes' lookup and the plan): each combination is encoded once, then looked up."""
    return _DIMS_JSON.encode(dict(sorted(items)))


def pane_start(event_time_ms: int, pane_ms: int) -> int:
    """The start of the pane an event time falls in (floor, also for times before 1970)."""
    return event_time_ms - (event_time_ms % pane_ms)


@dataclass(frozen=True)
class ValueStats:
    n: int  # events that carried the value
    sum: float
    min: float | None
    max: float | None
    kll: bytes | None = None

    def merge(self, other: ValueStats) -> ValueStats:
        return ValueStats(
            n=self.n + other.n,
            sum=self.sum + other.sum,
            min=_opt(min, self.min, other.min),
            max=_opt(max, self.max, other.max),
            kll=_merge_sketch(KllSketch, self.kll, other.kll),
        )

    def to_json(self) -> dict:
        return {"n": self.n, "sum": self.sum, "min": self.min, "max": self.max}


@dataclass(frozen=True)
class PaneData:
    count: int
    values: Mapping[str, ValueStats] = field(default_factory=dict)
    distincts: Mapping[str, bytes] = field(default_factory=dict)  # HLL bytes per distinct field

    def merge(self, other: PaneData) -> PaneData:
        values = dict(self.values)
        for name, stats in other.values.items():
            values[name] = values[name].merge(stats) if name in values else stats
        distincts = dict(self.distincts)
        for name, hll in other.distincts.items():
            distincts[name] = _merge_sketch(HllSketch, distincts.get(name), hll)
        return PaneData(count=self.count + other.count, values=values, distincts=distincts)

    def summary(self) -> dict:
        """What a correction record shows: count, per value field n/sum/min/max, per distinct
        field the HLL estimate (JSON-able)."""
        return {
            "count": self.count,
            "values": {name: v.to_json() for name, v in sorted(self.values.items())},
            "distinct": {
                name: HllSketch.from_bytes(blob).estimate().estimate
                for name, blob in sorted(self.distincts.items()) if blob is not None
            },
        }


def advance_watermark(current: int | None, max_event_ms: int | None, lateness_ms: int) -> int | None:
    """The watermark after seeing events up to max_event_ms: never goes backwards."""
    if max_event_ms is None:
        return current
    candidate = max_event_ms - lateness_ms
    return candidate if current is None else max(current, candidate)


def is_final(watermark_ms: int | None, end_ms: int) -> bool:
    """A pane (or window) is final once the watermark is at or past its end."""
    return watermark_ms is not None and watermark_ms >= end_ms


def next_revision(stored_revision: int | None, final: bool) -> int:
    """The revision after a merge (see docs/event-time.md, "Revisions"): a new pane is published at 1;
    provisional changes keep the revision; each change to a final pane adds one. A pane born
    final starts at 2: revision 1 was the empty final window queries already showed."""
    if stored_revision is None:
        return 2 if final else 1
    return stored_revision + 1 if final else stored_revision


@dataclass(frozen=True)
class PaneKey:
    stream: str
    start_ms: int
    dims: str  # dims_key(...)

    def dims_dict(self) -> dict[str, str]:
        return json.loads(self.dims)


@dataclass(frozen=True)
class Pane:
    """A stored pane: its data plus bookkeeping (revision counts committed changes, from 1)."""

    key: PaneKey
    end_ms: int
    data: PaneData
    revision: int
    updated_at_ms: int
    last_batch: int


def merge_all(parts: Iterable[PaneData]) -> PaneData:
    out = PaneData(count=0)
    for part in parts:
        out = out.merge(part)
    return out


def _opt(fn, a, b):
    if a is None:
        return b
    if b is None:
        return a
    return fn(a, b)


def _merge_sketch(kind, a: bytes | None, b: bytes | None) -> bytes | None:
    if a is None:
        return b
    if b is None:
        return a
    if kind is HllSketch:
        return HllSketch.merged_bytes([a, b])
    merged = kind.merge_all([a, b]).to_bytes()
    # A stored KLL is written with its level 0 sorted: a quantile of it reads ~3x faster (sketches/kll_sorted.py).
    return sorted_level_zero(merged) if kind is KllSketch else merged
