"""One stream's pane partials of a batch as columns, beside the PanePartial objects. Pure: no I/O.

The Arrow partials (aggregates/commit.py table_to_partials) are read column by column into
Python lists; the commit's tier deltas (store/tier_levels.py) are computed column-wise too. In
between, each pane was a PanePartial whose fields the tier step read back into columns one row
at a time (~1.7 s of a 1 M-event backfill commit's ~12 s). A BatchCommit may carry, per
stream, the columns its partials were made from (`BatchCommit.partial_columns`); the commit
plan then hands them to the tier step as they are, and the objects serve the rest of the plan.

The columns hold exactly what the stream's partials hold, in their order: row g is the g-th
partial of the stream in `BatchCommit.partials`. A value field is in a row's PaneData where its
n is above 0 (the rule table_to_partials builds PaneData by); its min/max/sum/kll there are the
ValueStats'; elsewhere they are unused. A distinct field is in a row where its blob is not None.
`of` builds them from objects (a benchmark, the tests), and gives None where a partial does not
follow that rule, so the caller keeps the per-row path. tests/unit/test_partial_columns.py pins
the tier deltas from columns equal, byte for byte, to those from the objects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class PartialColumns:
    stream: str
    start: list  # pane start per row (int)
    count: list  # events per row (int)
    # Per value field (the stream's order): name, n, sum, min, max, KLL bytes, one item per row.
    values: Sequence[tuple[str, list, list, list, list, list]]
    # Per distinct field: name, HLL bytes or None, one item per row.
    distincts: Sequence[tuple[str, list]]

    def __len__(self) -> int:
        return len(self.start)

    @classmethod
    def of(cls, stream: str, partials: Sequence, values: Sequence[str], distincts: Sequence[str]) -> PartialColumns | None:
        """The columns of `partials` (all of `stream`, in order) for these field names; None when
        a partial has another field, its fields in another order, a value field with n 0 or
        without bounds, or a distinct field holding None (the columns could not say it)."""
        names_v, names_d = set(values), set(distincts)
        for p in partials:
            if p.stream != stream or not set(p.data.values) <= names_v or not set(p.data.distincts) <= names_d:
                return None
            for v in p.data.values.values():
                if not v.n or v.min is None or v.max is None:
                    return None
            if any(blob is None for blob in p.data.distincts.values()):
                return None
            # The fields in the given order: a row's order decides the order of its tier rows' sketches.
            if (list(p.data.values) != [n for n in values if n in p.data.values]
                    or list(p.data.distincts) != [n for n in distincts if n in p.data.distincts]):
                return None
        out_v = []
        for name in values:
            stats = [p.data.values.get(name) for p in partials]
            out_v.append((name, [0 if v is None else v.n for v in stats], [0.0 if v is None else v.sum for v in stats],
                          [0.0 if v is None else v.min for v in stats], [0.0 if v is None else v.max for v in stats],
                          [None if v is None else v.kll for v in stats]))
        out_d = [(name, [p.data.distincts.get(name) for p in partials]) for name in distincts]
        return cls(stream, [p.start_ms for p in partials], [p.data.count for p in partials], out_v, out_d)
