"""Roll-up tiers of a stream: coarser granules kept beside its panes, and the group-bys kept
at every granule, so a query's cost follows its points, not its range.

    tiers: [{every: 1m, keep: 8d}, {every: 1h, keep: 90d}]   # default: 1m and 1h, keep = retention
    rollup_group_bys: [[endpoint], [region]]                   # besides the total and all dimensions

Every coarser granule keeps rows for the total over all dimensions and for each declared
group-by, and rows for all dimensions (any filter or group-by can be answered) unless the tier
says `all_dimensions: false`: then a query grouped or filtered by other dimensions reads finer
rows for that span (the panes, or a finer tier's). The pane granule keeps only the total
besides the panes (its all-dimensions rows): a declared group-by's pane-granule row merges
about one pane, so a grouped query reads the panes where it needs that granule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from catalog.durations import DurationMs, format_duration_ms

if TYPE_CHECKING:
    from catalog.model import StreamDef


DEFAULT_GRANULES_MS = (60_000, 3_600_000)
_DAY_MS = 86_400_000


class TierDef(BaseModel):
    """One coarser granule: rows of `every` rolled up from the panes, kept for `keep`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: DurationMs
    keep: DurationMs | None = None  # default: the stream's retention
    # False: no all-dimensions rows at this granule (about half of a backfill's tier rows at 1m);
    # a query needing a dimension no declared group-by holds reads finer rows instead.
    all_dimensions: bool = True


def default_tiers(pane_ms: int) -> tuple[TierDef, ...]:
    """1m and 1h, where coarser than the pane and a multiple of it."""
    return tuple(TierDef(every=format_duration_ms(g)) for g in DEFAULT_GRANULES_MS if g > pane_ms and g % pane_ms == 0)


def check_tiers(stream: StreamDef) -> None:
    """Raise ValueError naming what is wrong with a stream's tiers and rollup group-bys."""
    previous = stream.pane
    for i, tier in enumerate(stream.tiers or ()):
        where = f"tiers[{i}]"
        if tier.every <= previous or tier.every % previous:
            raise ValueError(f"{where}.every ({format_duration_ms(tier.every)}) must be a multiple of, and coarser"
                             f" than, the {'pane' if i == 0 else 'previous tier'} ({format_duration_ms(previous)})")
        if _DAY_MS % tier.every and tier.every % _DAY_MS:
            raise ValueError(f"{where}.every ({format_duration_ms(tier.every)}) must divide one day evenly"
                             " or be whole days")
        if tier.keep is not None and tier.keep < stream.retention:
            # A straggler inside the retention must still find its tier rows.
            raise ValueError(f"{where}.keep ({format_duration_ms(tier.keep)}) must be at least the stream's"
                             f" retention ({format_duration_ms(stream.retention)})")
        previous = tier.every
    seen: set[tuple[str, ...]] = set()
    for i, group_by in enumerate(stream.rollup_group_bys):
        for name in group_by:
            if name not in stream.dimensions:
                raise ValueError(f"rollup_group_bys[{i}]: {name!r} is not a dimension of the stream"
                                 f" (dimensions: {', '.join(stream.dimensions) or 'none'})")
        key = tuple(sorted(set(group_by)))
        if len(key) != len(group_by):
            raise ValueError(f"rollup_group_bys[{i}]: a dimension is named twice")
        if key in seen:
            raise ValueError(f"rollup_group_bys[{i}]: declared twice")
        seen.add(key)
