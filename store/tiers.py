"""Roll-up tiers: which coarser rows a stream keeps beside its panes, and a batch's
contribution to them. Pure: no I/O, no clock.

A tier row is one granule (the pane or a coarser one) x one projection of the dimensions
(all of them, none = the total, or a declared group-by; the pane granule keeps only the total,
a coarser one all of them unless its tier says all_dimensions: false) x one start x one value
of the projected dimensions. It holds what a pane holds (count, n/sum/min/max and a KLL per value
field, an HLL per distinct field) merged over the panes it covers, and the highest revision
among them, so a query answered from it reads the same numbers, `final` flags and
revisions as one answered from the panes (sketches: the same panes merged in another
order, within the same bounds).

The store keeps tier rows in the same transaction as the panes they cover: a batch's
partials become deltas (this module's types, computed column-wise in
store/tier_levels.py), merged into the stored rows with the batch id.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from store.panes import PaneData

ALL_DIMS = "*"  # the projection that keeps every dimension


def proj_name(dims: Sequence[str]) -> str:
    """The stored name of a projection: '' for the total, 'a,b' for a group-by."""
    return ",".join(dims)


def project(dims: Mapping[str, str], proj: str) -> dict[str, str]:
    """The dimensions of a pane as one row of `proj` keeps them (absent ones stay absent)."""
    if proj == ALL_DIMS:
        return dict(dims)
    if not proj:
        return {}
    return {name: dims[name] for name in proj.split(",") if name in dims}


def covers(proj: str, needed: Iterable[str]) -> bool:
    """Whether rows of `proj` can answer a query grouping or filtering by `needed`."""
    if proj == ALL_DIMS:
        return True
    have = set(proj.split(",")) if proj else set()
    return set(needed) <= have


@dataclass(frozen=True)
class Tier:
    granule_ms: int
    proj: str
    keep_ms: int


@dataclass(frozen=True)
class TierLayout:
    """What a store keeps for one stream: the pane size, the coarser granules with how long
    each is kept, and the projections kept besides all dimensions (at every coarser granule;
    at the pane granule only the total: see tiers())."""

    pane_ms: int
    retention_ms: int
    granules: tuple[tuple[int, int], ...] = ()  # (every_ms, keep_ms), finest first
    group_bys: tuple[str, ...] = ("",)  # projection names; '' (the total) is always kept
    narrow: tuple[int, ...] = ()  # granules keeping no all-dimensions rows (a tier's all_dimensions: false)

    def tiers(self) -> list[Tier]:
        """Every tier kept in the tier table (the panes, granule pane x all dimensions, are not).
        At the pane granule only the total: a pane-granule row per declared group-by merges
        about one pane (a group-by's value seldom has several dimension combinations in one
        pane) and those rows were most of a backfill's tier rows and bytes; a query reads the
        panes where it needs pane-granule rows of a group-by (store/planner.py)."""
        out = [Tier(self.pane_ms, p, self.retention_ms) for p in self.group_bys if p == ""]
        for every, keep in self.granules:
            if every not in self.narrow:
                out.append(Tier(every, ALL_DIMS, keep))
            out += [Tier(every, p, keep) for p in self.group_bys]
        return out

    def folded_granules(self) -> tuple[int, ...]:
        """The granules coarser than the first tier: their rows are brought up to date as the
        stream's time passes its panes, not by every batch (store/tier_folds.py)."""
        return tuple(every for every, _ in self.granules[1:])

    def granules_ms(self) -> list[int]:
        """Every granule a query may read, finest (the pane) first."""
        return [self.pane_ms, *(every for every, _ in self.granules)]

    def projections_at(self, granule_ms: int) -> list[str]:
        """The projections rows of `granule_ms` are kept in (all dimensions: the panes themselves
        at the pane granule)."""
        wide = [] if granule_ms in self.narrow else [ALL_DIMS]
        return [*wide, *(p for p in self.group_bys if granule_ms != self.pane_ms or p == "")]

    def to_json(self) -> str:
        raw = {"pane_ms": self.pane_ms, "retention_ms": self.retention_ms,
               "granules": [list(g) for g in self.granules], "group_bys": list(self.group_bys)}
        if self.narrow:  # absent otherwise: a layout from before the option keeps its text (no rebuild)
            raw["narrow"] = list(self.narrow)
        return json.dumps(raw, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TierLayout:
        raw = json.loads(text)
        return cls(raw["pane_ms"], raw["retention_ms"], tuple(tuple(g) for g in raw["granules"]),
                   tuple(raw["group_bys"]), tuple(raw.get("narrow", ())))


def layout_for(stream) -> TierLayout:
    """The tier layout a catalog.StreamDef declares."""
    order = {name: i for i, name in enumerate(stream.dimensions)}
    group_bys = [""]
    for group_by in stream.rollup_group_bys:
        name = proj_name(sorted(group_by, key=order.__getitem__))
        if name not in group_bys and len(group_by) < len(stream.dimensions):  # all dimensions: the '*' rows
            group_bys.append(name)
    if not stream.dimensions:
        group_bys = []  # the total is the panes themselves
    granules = tuple((t.every, t.keep if t.keep is not None else stream.retention) for t in stream.tier_defs)
    narrow = tuple(t.every for t in stream.tier_defs if not t.all_dimensions)
    return TierLayout(stream.pane, stream.retention, granules, tuple(group_bys), narrow)


def catalog_layouts(catalog) -> dict[str, TierLayout]:
    """The tier layout of every stream of a catalog.Catalog (what the pipeline configures)."""
    return {name: layout_for(stream) for name, stream in catalog.streams.items()}


@dataclass(frozen=True)
class TierKey:
    granule_ms: int
    proj: str
    start_ms: int
    dims: str  # dims_key of the projected dimensions


@dataclass(frozen=True)
class TierDelta:
    """A batch's contribution to one tier row, and the highest new revision of its panes."""

    dims: Mapping[str, str]
    data: PaneData
    revision: int


def tier_deltas(pane_rows: Iterable[tuple], layout: TierLayout, granules: Container[int] | None = None,
                split: tuple[Container[int], int] | None = None) -> dict[TierKey, TierDelta]:
    """Every tier row a batch touches, with its delta: from pane rows (start, dims, the batch's
    data for the pane, the pane's revision after the merge), optionally with dims_key(dims) as
    a third item when the caller has it; `granules`: only the tiers of these (None: every tier);
    `split` (granules, point): those tiers of the rows of panes before the point only.
    Computed column-wise (store/tier_levels.py)."""
    from store.tier_levels import tier_deltas as columnar  # it builds on this module's types

    return columnar(pane_rows, layout, granules, split)


def stored_pane_deltas(panes: Iterable, layout: TierLayout,
                       granules: Container[int] | None = None) -> dict[TierKey, TierDelta]:
    """tier_deltas of stored panes (store.panes.Pane) as a whole: a rebuild's rows, a fold's."""
    rows = [(p.key.start_ms, p.key.dims_dict(), p.data, p.revision) for p in panes]
    return tier_deltas(rows, layout, granules) if rows else {}


def narrower(proj: str, source: str) -> bool:
    """Whether rows of `proj` can be made from rows of `source`."""
    if source == ALL_DIMS:
        return True
    if proj == ALL_DIMS:
        return False
    return covers(source, proj.split(",") if proj else ())
