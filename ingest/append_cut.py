"""Batches cut at one log append time (issue 16; docs/tables.md "Time semantics").

An event is enriched with its table as the log knew it at the event's append time: every change
appended at or before it must be read in the event's batch or an earlier one. A batch that reads
each partition by its own share of `max_records_per_batch` (fair, or in proportion to its backlog
as Spark's Kafka source shares `maxOffsetsPerTrigger`) can read a stream's event before a change
of its table appended ahead of it, and then the answer depends on how batches split the log: a
reprocessing run and the live pipeline could differ for the same events.

So a pipeline that enriches cuts each batch of the table and the streams it enriches at one
append time: every partition up to its last record appended at or before the cut, the cut the
latest one at which the batch holds at most `max_rows` records. Records appended in the same
millisecond stay together where the bound allows; where even the earliest millisecond's records
are more than `max_rows`, that millisecond is split (the tables' partitions first, so a change
tied with an event is read no later than it), so that a batch always reads something. The
group's `max_rows` is what the fair plan gave its partitions in all (`cut_group`): the pipeline's
other streams keep their share. The cut lies within what the batch may read (the log's end as
the batch found it, read partition by partition), which is not itself a cut: the one gap left
(docs/tables.md "Time semantics").

The log is asked for one thing (`EndAt`): given a cut, the first offset from the batch's start
of each partition whose record was appended after it. A partition's append times are taken as
they rise: a record appended out of order (an older time after a newer one) waits for the cut to
pass the newest time before it. Kafka answers by its time index (offsets_for_times, one request
per topic, the broker's LogAppendTime), the embedded log from its segments (one append time each).

Pure: the log is reached only through the given `end_at` (or `first_appended_after`); keys are
opaque (callers use (stream, partition)).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from typing import TYPE_CHECKING

from catalog.enrichment import append_cut_streams

if TYPE_CHECKING:
    from catalog import Catalog

Key = Hashable
# end_at(cut_ms) -> {key: the first offset at or after the batch's start whose record was appended
# after cut_ms (running maximum), or None when there is none}: the caller clips it to the range.
EndAt = Callable[[int], Mapping[Key, int | None]]

# Append times are epoch milliseconds: every record is appended after NO_TIME and at or before ALL_TIME.
NO_TIME = -1
ALL_TIME = 2**62


def cut_end_offsets(ranges: Mapping[Key, tuple[int, int]], end_at: EndAt, max_rows: int, *,
                    first: Collection[Key] = (), bounds: tuple[int, int] | None = None) -> dict[Key, int]:
    """The end offsets of the next batch over `ranges` ({key: (start, end)}: what is left to read
    of each partition): all of it when it is at most `max_rows` records; else every partition up
    to one append-time cut, the latest cut with at most `max_rows` records in all (module doc),
    or, where the earliest append time alone has more, `max_rows` of its records (the `first`
    keys' first, shared fairly). At least one record when anything is left and `max_rows` > 0.
    `bounds`: (a time before every record's, a time at or after every record's), a hint that
    narrows the search; checked, and widened where it is wrong."""
    left = {k: (s, max(s, e)) for k, (s, e) in ranges.items()}
    total = sum(e - s for s, e in left.values())
    if total <= max_rows:
        return {k: e for k, (_, e) in left.items()}
    if max_rows <= 0:
        return {k: s for k, (s, _) in left.items()}

    def ends(cut: int) -> dict[Key, int]:
        found = end_at(cut)
        out = {}
        for k, (s, e) in left.items():
            at = found.get(k)
            out[k] = e if at is None else min(e, max(s, at))
        return out

    def count(end: Mapping[Key, int]) -> int:
        return sum(end[k] - s for k, (s, _) in left.items())

    lo, hi = bounds if bounds is not None else (NO_TIME, ALL_TIME)
    at_lo = ends(lo)
    if count(at_lo) > max_rows:  # a wrong hint: no record can be at or before NO_TIME
        lo, at_lo = NO_TIME, ends(NO_TIME)
    if hi <= lo or count(ends(hi)) <= max_rows:
        hi = ALL_TIME
    # Invariant: at most max_rows records at or before lo, more than max_rows at or before hi.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        at_mid = ends(mid)
        if count(at_mid) <= max_rows:
            lo, at_lo = mid, at_mid
        else:
            hi = mid
    if count(at_lo) > 0:
        return at_lo
    # The earliest append time (hi) alone holds more than max_rows records: split it.
    tied = {k: end - left[k][0] for k, end in ends(hi).items()}
    grants = share({k: n for k, n in tied.items() if k in first}, max_rows)
    grants.update(share({k: n for k, n in tied.items() if k not in first}, max_rows - sum(grants.values())))
    return {k: s + grants.get(k, 0) for k, (s, _) in left.items()}


def share(backlog: Mapping[Key, int], budget: int) -> dict[Key, int]:
    """`budget` records shared fairly over `backlog` ({key: records}): water-filling, the smaller
    backlogs first, none more than its backlog."""
    grant = dict.fromkeys(backlog, 0)
    pending = sorted((k for k, n in backlog.items() if n > 0), key=lambda k: backlog[k])
    while budget > 0 and pending:
        each = max(1, budget // len(pending))
        still = []
        for k in pending:
            take = min(each, backlog[k] - grant[k], budget)
            grant[k] += take
            budget -= take
            if grant[k] < backlog[k]:
                still.append(k)
            if budget == 0:
                break
        pending = still
    return grant


Offsets = Mapping[str, Mapping]  # {stream: {partition: offset}}, partitions as the caller keys them


def cut_group(start: Offsets, targets: Offsets, planned: Offsets, group: Collection[str], end_at: EndAt,
              *, first: Collection[str] = (), bounds: tuple[int, int] | None = None) -> dict[str, dict]:
    """`planned` (a batch's end offsets, each partition's fair share) with the partitions of the
    `group` streams (the tables and the streams they enrich) cut at one append time instead, within
    the records `planned` gave them in all; the other streams as planned. `end_at` is keyed by
    (stream, partition); the `first` streams' records (the tables') go first in a split millisecond;
    `bounds` as for `cut_end_offsets`."""
    out = {s: dict(parts) for s, parts in planned.items()}
    ranges = {(s, p): (start.get(s, {}).get(p, 0), end) for s in group for p, end in targets.get(s, {}).items()}
    if not ranges:
        return out
    budget = sum(max(0, planned.get(s, {}).get(p, lo) - lo) for (s, p), (lo, _) in ranges.items())
    cut = cut_end_offsets(ranges, end_at, budget, first={k for k in ranges if k[0] in first}, bounds=bounds)
    for (s, p), end in cut.items():
        out.setdefault(s, {})[p] = end
    return out


def log_end_at(first_appended_after: Callable[[str, Mapping[int, int], int], Mapping[int, int | None]],
               start: Offsets, targets: Offsets, group: Collection[str]) -> EndAt:
    """`EndAt` over the partitions of the `group` streams left to read (start below target), keyed
    (stream, partition) as `targets` keys them, from a log's `first_appended_after(stream,
    {partition: start}, cut_ms)` (ingest/log/base.py; partitions as ints there)."""
    asked = {}
    for s in group:
        parts = {p: start.get(s, {}).get(p, 0) for p, end in targets.get(s, {}).items()
                 if end > start.get(s, {}).get(p, 0)}
        if parts:
            asked[s] = parts

    def end_at(cut_ms: int) -> dict[Key, int | None]:
        out: dict[Key, int | None] = {}
        for s, parts in asked.items():
            named = {int(p): p for p in parts}
            for p, at in first_appended_after(s, {int(p): o for p, o in parts.items()}, cut_ms).items():
                out[(s, named[p])] = at
        return out

    return end_at


Cut = Callable[[Offsets, Offsets, Offsets], dict]  # (start, targets, planned) -> the batch's end offsets


def catalog_cut(catalog: Catalog, first_appended_after, ingest_time_ms=None) -> Cut | None:
    """How a pipeline of `catalog` re-plans a batch (`cut_group`): its tables and the streams they
    enrich (catalog/enrichment.py append_cut_streams) at one append time, read from the log by its
    `first_appended_after`; None where nothing is enriched. `ingest_time_ms(stream, partition,
    offset)` (the log's): the search starts between the backlog's first and last append times
    instead of all of time (bench/append_cut.py: 64 probes a batch without it)."""
    group, tables = append_cut_streams(catalog)
    if not group:
        return None

    def cut(start: Offsets, targets: Offsets, planned: Offsets) -> dict:
        bounds = None if ingest_time_ms is None else time_bounds(ingest_time_ms, start, targets, group)
        return cut_group(start, targets, planned, group, log_end_at(first_appended_after, start, targets, group),
                         first=tables, bounds=bounds)

    return cut


def time_bounds(ingest_time_ms, start: Offsets, targets: Offsets, group: Collection[str]) -> tuple[int, int] | None:
    """(just before the earliest first record's append time, the latest last record's) over the
    group's partitions left to read; None where the log cannot tell one (a hint only: checked)."""
    firsts, lasts = [], []
    for s in group:
        for p, end in targets.get(s, {}).items():
            lo = start.get(s, {}).get(p, 0)
            if end > lo:
                firsts.append(ingest_time_ms(s, int(p), lo))
                lasts.append(ingest_time_ms(s, int(p), end - 1))
    if not firsts or None in firsts or None in lasts:
        return None
    return min(firsts) - 1, max(lasts)
