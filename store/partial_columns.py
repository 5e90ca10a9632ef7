"""One stream's pane partials of a batch as columns, not as PanePartial objects. Pure: no I/O.

The Arrow partials (aggregates/commit.py table_to_partials) are read column by column into
Python lists, and a BatchCommit carries them per stream as these columns
(`BatchCommit.partial_columns`), in addition to its `partials` (objects, not among them). The
commit plan (store/commit_plan.py) writes the panes new in the batch from the columns as they are
(their stats text and sketches blob encoded column-wise, store/row_columns.py), computes the tier
deltas from them (store/tier_levels.py), and makes objects only of the rows that merge into a
stored pane. A 1 M-event backfill batch is ~320 000 new panes: each was a PanePartial, a PaneData,
ValueStats and a PaneWrite, built and read back (~15 % of the batch).

Row g holds: its pane start, event count, and per value field n/sum/min/max/KLL, per distinct
field its HLL; its dimension combination is `combo[g]`, an index into `dims` (the combinations,
each once) and `keys` (their dims_key). A value field is in a row's PaneData where its n is above
0 (the rule table_to_partials builds PaneData by); its min/max/sum/kll there are the ValueStats';
elsewhere they are unused. A distinct field is in a row where its blob is not None. `of` builds
them from objects (a benchmark, the tests), and gives None where a partial does not follow that
rule. tests/unit/test_partial_columns.py pins the plan, the tier deltas and the rows the stores
write from columns equal, byte for byte, to those from the objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from store.panes import PaneData, ValueStats, dims_key


@dataclass(frozen=True, eq=False)
class PartialColumns:
    stream: str
    pane_ms: int  # the stream's pane length: a row's pane ends at start + pane_ms
    start: list  # pane start per row (int)
    count: list  # events per row (int)
    # Per value field (the stream's order): name, n, sum, min, max, KLL bytes, one item per row.
    values: Sequence[tuple[str, list, list, list, list, list]]
    # Per distinct field: name, HLL bytes or None, one item per row.
    distincts: Sequence[tuple[str, list]]
    combo: list  # per row: its dimension combination's index in `dims` and `keys`
    dims: Sequence[Mapping[str, str]]  # the combinations, each once
    keys: Sequence[str]  # dims_key of each combination

    def __len__(self) -> int:
        return len(self.start)

    def row_keys(self) -> list[str]:
        """dims_key of each row's combination."""
        return list(map(self.keys.__getitem__, self.combo))

    def data(self, row: int) -> PaneData:
        """Row `row` as the PaneData its partial holds."""
        stats = {name: ValueStats(n[row], sums[row], lo[row], hi[row], kll[row])
                 for name, n, sums, lo, hi, kll in self.values if n[row]}
        return PaneData(self.count[row], stats,
                        {name: blobs[row] for name, blobs in self.distincts if blobs[row] is not None})

    def take(self, rows: Sequence[int]) -> PartialColumns:
        """These rows only, in this order (their combinations as they are)."""
        def at(column: list) -> list:
            return list(map(column.__getitem__, rows))
        return PartialColumns(self.stream, self.pane_ms, at(self.start), at(self.count),
                              [(name, at(n), at(s), at(lo), at(hi), at(kll)) for name, n, s, lo, hi, kll in self.values],
                              [(name, at(blobs)) for name, blobs in self.distincts], at(self.combo), self.dims, self.keys)

    @staticmethod
    def combos(dims: Sequence[Mapping[str, str]]) -> tuple[list[int], list[Mapping[str, str]], list[str]]:
        """Each row's combination index, the combinations each once (in the order rows first have
        them) and their dims_key: `combo`, `dims` and `keys` of rows with these dimensions."""
        index: dict[str, int] = {}
        combo, found = [], []
        for d in dims:
            key = dims_key(d)
            c = index.get(key)
            if c is None:
                c = index[key] = len(found)
                found.append(d)
            combo.append(c)
        return combo, found, list(index)

    @classmethod
    def of(cls, stream: str, partials: Sequence, values: Sequence[str], distincts: Sequence[str]) -> PartialColumns | None:
        """The columns of `partials` (all of `stream`, in order) for these field names; None when
        a partial has another field, its fields in another order, a value field with n 0 or
        without bounds, a distinct field holding None, or another pane length than the first's
        (the columns could not say it)."""
        names_v, names_d = set(values), set(distincts)
        pane_ms = partials[0].end_ms - partials[0].start_ms if partials else 0
        for p in partials:
            if p.stream != stream or not set(p.data.values) <= names_v or not set(p.data.distincts) <= names_d:
                return None
            if p.end_ms - p.start_ms != pane_ms:
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
        combo, dims, keys = cls.combos([p.dims for p in partials])
        return cls(stream, pane_ms, [p.start_ms for p in partials], [p.data.count for p in partials], out_v, out_d,
                   combo, dims, keys)
