"""What a batch commit decides, the same for every store backend. Pure: no I/O, no clock.

A backend's commit_batch, in one transaction: skip a batch id already recorded; read the
stored state the batch touches (the panes it merges into, each stream's watermark and newest
event, the tier layouts); `plan_batch` here; write the plan. Which merges are corrections,
the revisions, the watermark's advance, the tier deltas and the read = aggregated +
dead-lettered (+ duplicates dropped) invariant are decided here once, so SQLite and PostgreSQL cannot drift apart
and a change of rule (per-partition watermarks, say) is made in one place.

Commits are serialized by the backend (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory
transaction lock), so the state read before planning is still the state when the plan is
written: the plan carries absolute values (watermark, merged pane) rather than SQL MAX().
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from catalog.model import DEFAULT_PARTITION_IDLE_TIMEOUT_MS
from store import row_codec, tier_folds
from store.base import BatchCommit, PanePartial
from store.panes import EMPTY_SUMMARY, PaneData, advance_watermark, dims_key, is_final, next_revision
from store.partial_columns import PartialColumns
from store.row_columns import encode_columns
from store.tier_levels import tier_deltas_of_columns
from store.tiers import TierDelta, TierKey, TierLayout, stored_pane_deltas, tier_deltas
from store.watermarks import PartitionMark, advance_stream, partition_state

# A pane as the store identifies it: (stream, start_ms, dims_key).
PaneId = tuple[str, int, str]


@dataclass(frozen=True)
class StoredPane:
    """What the store holds for a pane (or tier row) a batch merges into."""

    data: PaneData
    revision: int


@dataclass(frozen=True)
class StreamState:
    """A stream's progress as stored before the batch."""

    watermark_ms: int | None = None
    max_event_ms: int | None = None
    partitions: Mapping[int, PartitionMark] = field(default_factory=dict)  # store/watermarks.py


@dataclass(frozen=True)
class CorrectionRecord:
    revision_from: int
    revision_to: int
    old: dict  # PaneData.summary() of the pane before the merge (EMPTY_SUMMARY when it was new)
    new: dict


@dataclass(frozen=True)
class PaneWrite:
    """One partial merged: the pane's new content, and its change-feed (and correction) entry."""

    stream: str
    start_ms: int
    end_ms: int
    dims: str  # dims_key
    data: PaneData  # the merged pane
    revision: int
    count_added: int
    correction: CorrectionRecord | None  # set when the pane was final before this batch


@dataclass(frozen=True)
class StreamUpdate:
    """A stream's progress after the batch: absolute watermark and newest event, added counters,
    and where the commit carries partition marks, every partition's mark and state after it."""

    stream: str
    watermark_ms: int | None
    max_event_ms: int | None
    aggregated: int
    read: int
    dead_lettered: int
    held_by_partition: int | None = None
    partitions: dict[int, tuple[PartitionMark, str]] = field(default_factory=dict)  # (mark, state)


@dataclass(frozen=True, eq=False)
class FreshPanes:
    """Rows of a stream's partial columns (BatchCommit.partial_columns) whose panes are new in the
    batch (none stored, no other partial of the pane in the batch) and not final: each pane is
    written as its partial holds it, at revision 1 (next_revision of a new pane), with a change
    record adding its count. No object per pane: every pane of a backfill into new time."""

    columns: PartialColumns
    rows: list[int]  # indexes into the columns, in order
    # The columns' other rows, merged as objects: their PaneWrites are the plan's first `panes`,
    # block after block, in order. The rows are written in the columns' order, as the objects' would be.
    merged: list[int] = field(default_factory=list)


FRESH_REVISION = next_revision(None, False)


@dataclass(frozen=True)
class BatchPlan:
    panes: list[PaneWrite]  # the merges of the partials' objects (and of column rows that are not fresh)
    panes_new: int
    panes_updated: int
    tier_deltas: dict[str, dict[TierKey, TierDelta]]  # per stream with a layout
    streams: list[StreamUpdate]
    dead_counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (stream, reason) -> records
    fresh: list[FreshPanes] = field(default_factory=list)  # written before `panes`

    @property
    def corrections(self) -> int:
        return sum(1 for p in self.panes if p.correction is not None)


def pane_keys(commit: BatchCommit) -> list[str]:
    """dims_key of each partial object's dimensions, in the partials' order. A backend computes
    them once and hands them to pane_ids and plan_batch: each computed them for every partial,
    two dimension texts per partial of a backfill (~0.3 s per 1 M events)."""
    return [dims_key(p.dims) for p in commit.partials]


def pane_ids(commit: BatchCommit, keys: Sequence[str] | None = None) -> list[PaneId]:
    """The stored panes a batch merges into (what the backend reads before planning), each once:
    those of the partial columns' rows, then of the partials' objects. `keys`: pane_keys(commit),
    when the caller has them."""
    if keys is None:
        keys = pane_keys(commit)
    ids = [(stream, start, key) for stream, cols in commit.partial_columns.items()
           for start, key in zip(cols.start, cols.row_keys(), strict=True)]
    ids.extend((p.stream, p.start_ms, key) for p, key in zip(commit.partials, keys, strict=True))
    return list(dict.fromkeys(ids))


def column_partials(cols: PartialColumns, rows: Iterable[int]) -> list[PanePartial]:
    """Rows of partial columns as the PanePartial objects they stand for."""
    return [PanePartial(cols.stream, cols.start[i], cols.start[i] + cols.pane_ms, cols.dims[cols.combo[i]], cols.data(i))
            for i in rows]


def _fresh_rows(cols: PartialColumns, stored: Mapping[PaneId, object], watermark_ms: int | None) -> np.ndarray:
    """Which rows of a stream's columns are fresh (FreshPanes): no stored pane, the only row of
    their pane among the columns, not final (the watermark before the batch short of the end)."""
    size = len(cols)
    start = np.asarray(cols.start, np.int64).reshape(size)
    combo = np.asarray(cols.combo, np.int64).reshape(size)
    fresh = np.ones(size, bool)
    if watermark_ms is not None:
        fresh &= start + cols.pane_ms > watermark_ms
    if size > 1:  # rows sharing a pane: none of them fresh (they merge in turn, as objects)
        order = np.lexsort((combo, start))
        same = (start[order][1:] == start[order][:-1]) & (combo[order][1:] == combo[order][:-1])
        shared = np.zeros(size, bool)
        shared[order[1:][same]] = True
        shared[order[:-1][same]] = True
        fresh &= ~shared
    mine = [(start, key) for stream, start, key in stored if stream == cols.stream]
    if mine:
        at = {(s, c): i for i, (s, c) in enumerate(zip(cols.start, cols.combo))}
        combo_of = {key: c for c, key in enumerate(cols.keys)}
        for s, key in mine:
            i = at.get((s, combo_of.get(key)))
            if i is not None:
                fresh[i] = False
    return fresh


def partition_clock_ms(commit: BatchCommit, now_ms: int) -> int:
    """The one instant a batch's partition marks are judged and stamped at (store/watermarks.py:
    which partitions are idle, and `last_progress_ms` of those it read): the batch's own
    `batch_now_ms`, or `now_ms` (the store's clock at the commit) for a commit without one.

    Not the commit's clock, for two reasons. The batch's own steps judge the stream's watermark
    after the batch before it is committed (aggregates/joins.py `stream_watermarks_after`: what
    closes sessions and is the joins' clock) at `batch_now_ms`; judged at the commit's clock, a
    batch straddling a partition's idle timeout closed sessions on one watermark and stored
    another. And `batch_now_ms` is held at the last commit's instant through a step back of the
    wall clock of up to an hour (aggregates/batch_clock.py), so a progress stamped by an earlier
    batch is never ahead of it: judged at a wall clock stepped back, a stuck partition that had
    gone idle was `active` again and held the watermark for as long as the step."""
    return now_ms if commit.batch_now_ms is None else commit.batch_now_ms


def plan_batch(commit: BatchCommit, stored: Mapping[PaneId, StoredPane], streams_before: Mapping[str, StreamState],
               lateness_ms: Mapping[str, int], layouts: Mapping[str, TierLayout], *, now_ms: int = 0,
               idle_timeout_ms: Mapping[str, int] | None = None, keys: Sequence[str] | None = None,
               folds: Mapping[str, tuple[int, ...]] | None = None) -> BatchPlan:
    """Everything the batch writes. `stored` holds the panes of pane_ids(commit) that exist;
    `keys` are pane_keys(commit) when the caller has them (computed here otherwise).
    The watermark is per partition for streams whose commit carries partition marks
    (store/watermarks.py: `idle_timeout_ms` judges idle partitions at `partition_clock_ms`, the
    batch's own instant, not at `now_ms`), else the stream-wide newest event - lateness. (`now_ms`,
    the store's clock at the commit, stamps what records when the store took the batch: the
    backends' change, correction and dead-letter times, `committed_at_ms`.)

    A pane is final when the watermark stored before this batch is at or past its end (the
    batch's own events never finalize the panes they land in); a merge into a final pane is
    a correction and raises its revision (store.panes.next_revision). Two partials of one pane
    in a batch merge in turn, as two batches would.

    `folds`: where each stream's partials split (store/tier_fold_store.py Fold.split, each shard's
    fold point after the batch): its folded tiers' deltas are of its partials before their shard's
    point only."""
    # The stored panes, then as merged so far in this batch: (data, revision) (no object per partial).
    current = {pane_id: (pane.data, pane.revision) for pane_id, pane in stored.items()}
    writes: list[PaneWrite] = []
    fresh_blocks: list[FreshPanes] = []
    counts = {"new": 0, "updated": 0}
    aggregated: dict[str, int] = defaultdict(int)
    tier_input: dict[str, list] = defaultdict(list)  # per stream: (start, dims, key, batch's data, new revision)
    watermarks = {stream: state.watermark_ms for stream, state in streams_before.items()}
    folds = folds or {}
    if keys is None:
        keys = pane_keys(commit)
    judged_ms = partition_clock_ms(commit, now_ms)

    def merge(partial: PanePartial, key: str) -> int:
        """The partial merged into its pane as stored or merged so far; its new revision."""
        pane_id = (partial.stream, partial.start_ms, key)
        before = current.get(pane_id)
        if before is None and pane_id in fresh_at:  # a fresh row's pane: its data as written
            cols, row = fresh_at.pop(pane_id)
            before = (cols.data(row), FRESH_REVISION)
        final = is_final(watermarks.get(partial.stream), partial.end_ms)
        if before is None:
            merged = partial.data
            counts["new"] += 1
        else:
            merged = before[0].merge(partial.data)
            counts["updated"] += 1
        revision = next_revision(None if before is None else before[1], final)
        current[pane_id] = (merged, revision)
        correction = None
        if final:
            old = before[0].summary() if before is not None else EMPTY_SUMMARY
            correction = CorrectionRecord(revision - 1, revision, old, merged.summary())
        writes.append(PaneWrite(partial.stream, partial.start_ms, partial.end_ms, key, merged, revision,
                                partial.data.count, correction))
        aggregated[partial.stream] += partial.data.count
        return revision

    # The partial columns first (store/partial_columns.py): fresh rows as they are, the others
    # merged as objects, in order.
    with_objects = {p.stream for p in commit.partials}
    fresh_at: dict[PaneId, tuple[PartialColumns, int]] = {}  # fresh rows an object partial may merge into
    deltas: dict[str, dict[TierKey, TierDelta]] = {}
    for stream, cols in commit.partial_columns.items():
        if not len(cols):
            continue
        fresh = _fresh_rows(cols, current, watermarks.get(stream))
        rows = np.flatnonzero(fresh).tolist()
        revisions = [FRESH_REVISION] * len(cols)
        slow = np.flatnonzero(~fresh).tolist()
        fresh_blocks.append(FreshPanes(cols, rows, slow))
        if rows:
            counts["new"] += len(rows)
            aggregated[stream] += sum(map(cols.count.__getitem__, rows))
        # Each row's key, where objects need it (a backfill into new time makes none).
        row_keys = cols.row_keys() if slow or stream in with_objects else []
        if stream in with_objects:
            fresh_at.update(((stream, cols.start[i], row_keys[i]), (cols, i)) for i in rows)
        for i, partial in zip(slow, column_partials(cols, slow), strict=True):
            revisions[i] = merge(partial, row_keys[i])
        if stream in layouts:
            if stream in with_objects:  # rows of both kinds: the tier step over objects, in order
                tier_input[stream].extend((p.start_ms, p.dims, row_keys[i], p.data, revisions[i])
                                          for i, p in enumerate(column_partials(cols, range(len(cols)))))
            else:
                deltas[stream] = _column_deltas(cols, revisions, layouts[stream], folds.get(stream))
    for partial, key in zip(commit.partials, keys, strict=True):
        revision = merge(partial, key)
        if partial.stream in layouts:
            tier_input[partial.stream].append((partial.start_ms, partial.dims, key, partial.data, revision))
    for stream, rows in tier_input.items():
        deltas[stream] = _row_deltas(rows, layouts[stream], folds.get(stream))
    # Per stream in the order the batch first has it (the order the stores write the tier rows in).
    deltas = {stream: deltas[stream] for stream in dict.fromkeys([*commit.partial_columns,
                                                                  *(p.stream for p in commit.partials)])
              if stream in deltas}
    new, updated = counts["new"], counts["updated"]
    dead_counts: dict[tuple[str, str], int] = {}
    dead_total: dict[str, int] = defaultdict(int)
    for stream, reasons in commit.dead_by_stream.items():
        for reason, n in reasons.items():
            if n:
                dead_counts[(stream, reason)] = n
                dead_total[stream] += n
    updates = []
    duplicates = dict(commit.event_ids.duplicates) if commit.event_ids is not None else {}
    for stream in sorted(batch_streams(commit, streams_before)):
        done = aggregated.get(stream, 0) + dead_total.get(stream, 0) + duplicates.get(stream, 0)
        read = commit.read_by_stream.get(stream, done)
        if read != done:
            raise ValueError(
                f"batch {commit.batch_id}, stream {stream!r}: {read} records read but"
                f" {aggregated.get(stream, 0)} aggregated + {dead_total.get(stream, 0)} dead-lettered"
                f" + {duplicates.get(stream, 0)} duplicates dropped"
            )
        before = streams_before.get(stream, StreamState())
        max_event = commit.max_event_ms.get(stream)
        newest = newest_event_ms(commit, streams_before, stream)
        held_by, partitions = None, {}
        if stream in commit.partition_max_event_ms:
            idle = (idle_timeout_ms or {}).get(stream, DEFAULT_PARTITION_IDLE_TIMEOUT_MS)
            marks, result = advance_stream(
                before.watermark_ms, before.partitions, batch_max_event_ms=commit.partition_max_event_ms[stream],
                read_offsets=commit.end_offsets.get(stream, {}), log_end_offsets=commit.log_end_offsets.get(stream, {}),
                lateness_ms=lateness_ms.get(stream, 0), now_ms=judged_ms, idle_timeout_ms=idle)
            watermark, held_by = result.watermark_ms, result.held_by
            partitions = {p: (m, partition_state(m, now_ms=judged_ms, idle_timeout_ms=idle)) for p, m in marks.items()}
        else:  # a commit without partition marks: the stream-wide rule
            watermark = advance_watermark(before.watermark_ms, max_event, lateness_ms.get(stream, 0))
        if stream in commit.watermark_cap_ms:
            # By its newest event ever (a batch without one may still move the cap), never past
            # the cap; a cap of None holds it where it was.
            cap = commit.watermark_cap_ms[stream]
            by_rule = advance_watermark(before.watermark_ms, newest, lateness_ms.get(stream, 0))
            if cap is not None and by_rule is not None:
                watermark = max((w for w in (before.watermark_ms, min(by_rule, cap)) if w is not None))
            else:
                watermark = before.watermark_ms
        updates.append(StreamUpdate(stream, watermark, newest, aggregated.get(stream, 0), read,
                                    dead_total.get(stream, 0), held_by, partitions))
    return BatchPlan(writes, new, updated, deltas, updates, dead_counts, fresh_blocks)


def batch_streams(commit: BatchCommit, streams_before: Mapping[str, StreamState]) -> set[str]:
    """The streams a batch updates (a StreamUpdate each): those it aggregated, read, dead-lettered
    or dropped duplicates of, or saw an event time or a watermark cap for."""
    dead = {stream for stream, reasons in commit.dead_by_stream.items() if any(reasons.values())}
    duplicates = commit.event_ids.duplicates if commit.event_ids is not None else {}
    return (set(map(attrgetter("stream"), commit.partials))
            | {stream for stream, cols in commit.partial_columns.items() if len(cols)}
            | set(commit.max_event_ms) | set(commit.read_by_stream) | dead | set(commit.partition_max_event_ms)
            | {s for s, n in duplicates.items() if n}
            | {s for s in commit.watermark_cap_ms if streams_before.get(s, StreamState()).max_event_ms is not None})


def batch_newest(commit: BatchCommit, streams_before: Mapping[str, StreamState]) -> dict[str, int | None]:
    """Each stream the batch updates, by its newest event time after it (store/tier_fold_store.py)."""
    return {stream: newest_event_ms(commit, streams_before, stream) for stream in batch_streams(commit, streams_before)}


def newest_event_ms(commit: BatchCommit, streams_before: Mapping[str, StreamState], stream: str) -> int | None:
    """A stream's newest event time after the batch: as stored before it or the batch's own."""
    before = streams_before.get(stream, StreamState()).max_event_ms
    return max((t for t in (before, commit.max_event_ms.get(stream)) if t is not None), default=None)


def _column_deltas(cols: PartialColumns, revisions: list[int], layout: TierLayout,
                   points: tuple[int, ...] | None) -> dict[TierKey, TierDelta]:
    """The tier deltas of a stream's partial columns (_split)."""
    return tier_deltas_of_columns(cols, revisions, layout, split=_split(layout, points))


def _row_deltas(rows: list[tuple], layout: TierLayout, points: tuple[int, ...] | None) -> dict[TierKey, TierDelta]:
    """The tier deltas of pane rows (start, dims, key, data, revision) (_split)."""
    return tier_deltas(rows, layout, split=_split(layout, points))


def _split(layout: TierLayout, points: tuple[int, ...] | None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Every tier takes a stream's partials, its folded tiers only those before their shard's point
    (stragglers, corrections, a backlog: store/tier_folds.py)."""
    coarse = tier_folds.folded(layout, points)
    return (coarse, points) if coarse else None


def pane_rows(plan: BatchPlan) -> list[tuple]:
    """The pane rows a plan writes, in the order the partials' objects would write them (each
    block of columns' rows in order, then the objects' merges): per row (stream, start_ms, end_ms,
    dims key, count, stats text, revision, sketches blob, count added, correction or None), the
    text and blob as store/row_codec.py writes them. A fresh row's are encoded column-wise
    (store/row_columns.py), or from its PaneData where that leaves them."""
    merges = row_codec.encoded_rows((None, w.end_ms, w.data, w.revision) for w in plan.panes)
    merged = [(w.stream, w.start_ms, w.end_ms, w.dims, count, text, w.revision, blob, w.count_added, w.correction)
              for w, (_, _, count, text, _, blob) in zip(plan.panes, merges, strict=True)]
    out = []
    taken = 0  # the merges written so far
    for block in plan.fresh:
        fresh = _fresh_block_rows(block)
        if not block.merged:
            out.extend(fresh)
            continue
        mine = merged[taken:taken + len(block.merged)]
        taken += len(block.merged)
        # The two lists merged by row, each in order.
        at = sorted([(i, 0, k) for k, i in enumerate(block.rows)] + [(i, 1, k) for k, i in enumerate(block.merged)])
        out.extend(fresh[k] if kind == 0 else mine[k] for _, kind, k in at)
    out.extend(merged[taken:])
    return out


def _fresh_block_rows(block: FreshPanes) -> list[tuple]:
    cols, rows = block.columns, block.rows
    if not rows:
        return []
    part = cols if len(rows) == len(cols) else cols.take(rows)
    encoded = encode_columns(part)
    texts, blobs = encoded if encoded is not None else ([None] * len(rows), [None] * len(rows))
    keys = part.row_keys()
    pane, stream = cols.pane_ms, cols.stream
    out = []
    for j, (start, count, text, blob) in enumerate(zip(part.start, part.count, texts, blobs, strict=True)):
        if text is None or blob is None:
            data = part.data(j)
            text, blob = row_codec.stats_text(data), row_codec.sketches_blob(data)
        out.append((stream, start, start + pane, keys[j], count, text, FRESH_REVISION, blob, count, None))
    return out


def tier_row_after(stored: StoredPane | None, delta: TierDelta) -> StoredPane:
    """A tier row after a batch's delta merged into it: the highest revision of its panes."""
    if stored is None:
        return StoredPane(delta.data, delta.revision)
    return StoredPane(stored.data.merge(delta.data), max(stored.revision, delta.revision))


def tier_row_keys(deltas: Mapping[str, Mapping[TierKey, TierDelta]]) -> dict[tuple[str, TierKey], tuple]:
    """Every stream's tier deltas -> their rows' keys as the stores take them (stream, granule,
    projection, start, dimensions' text): one load and one save for all the streams of a batch,
    not a round of statements per stream (six streams in the demo)."""
    return {(stream, key): (stream, key.granule_ms, key.proj, key.start_ms, key.dims)
            for stream, by_key in deltas.items() for key in by_key}


def merged_tier_rows(deltas: Mapping[str, Mapping[TierKey, TierDelta]], keys: Mapping[tuple[str, TierKey], tuple],
                     stored: Mapping[tuple, StoredPane]) -> Iterator[tuple[tuple, int, PaneData, int]]:
    """The tier rows a batch writes, stream by stream: each delta merged into its `stored` row
    (by its key in `keys`: tier_row_keys), as the stores' save takes them (key, end, data,
    revision). A generator: a backfill's rows are encoded one by one, not all held merged."""
    for stream, by_key in deltas.items():
        for key, delta in by_key.items():
            row_key = keys[(stream, key)]
            row = tier_row_after(stored.get(row_key), delta)
            yield row_key, key.start_ms + key.granule_ms, row.data, row.revision


def retention_horizons(batch_now_ms: int | None, retention_ms: Mapping[str, int]) -> dict[str, int]:
    """Per stream, the time before which panes (ending at or before it) and dead letters are
    dropped: every event they could still get would be dead-lettered. None: no retention run."""
    if batch_now_ms is None:
        return {}
    return {stream: batch_now_ms - keep for stream, keep in retention_ms.items()}


def with_removed_streams(retention_ms: Mapping[str, int], layouts: Mapping[str, TierLayout]) -> Mapping[str, int]:
    """The retention of every stream the store keeps tiers for: the configured one, else the one
    its layout was stored with (a stream since removed from the configuration), so a removed
    stream's panes, dead letters and first-seen counts go when they would have had it stayed, not
    never. Only in a retention run (retention_ms given): a commit without one drops nothing."""
    if not retention_ms:
        return retention_ms
    removed = {stream: layout.retention_ms for stream, layout in layouts.items() if stream not in retention_ms}
    return {**removed, **retention_ms} if removed else retention_ms


def change_feed_horizon(batch_now_ms: int | None, retention_ms: Mapping[str, int]) -> int | None:
    """The commit time before which change records are dropped: the longest retention of any
    stream (the feed is shared; its readers tail it, and a record older than that is about a
    pane that may be gone). None: no retention run."""
    horizons = retention_horizons(batch_now_ms, retention_ms)
    return min(horizons.values()) if horizons else None


# The change records before the first one committed at or after a horizon (a scan of the
# rowid from the start that stops there: no index on the commit time).
DROP_OLD_CHANGES = "DELETE FROM changes WHERE seq < (SELECT seq FROM changes WHERE at_ms >= %s ORDER BY seq LIMIT 1)"

# Corrections of dropped panes a retention commit drops per stream, at most: ~140 a second come due
# at 20 000 events/s of the demo's traffic (~100 a commit), and a store from before session 91 kept
# them all. Deleting 10 000 of a million took 0.15 s on SQLite here, all of them 2.3 s.
CORRECTIONS_DROPPED_PER_COMMIT = 2_000
# The corrections of a stream's panes dropped by retention (start before the horizon, ending at or
# before it, as the panes' own DELETE), a range of corrections_by_pane_time: stream, horizon twice, limit.
DROP_DUE_CORRECTIONS = ("DELETE FROM corrections WHERE id IN (SELECT id FROM corrections WHERE stream = %s"
                        " AND pane_start_ms < %s AND pane_end_ms <= %s LIMIT %s)")


def tier_rows_to_drop(layout: TierLayout, batch_now_ms: int) -> list[tuple[int, str, int, int]]:
    """(granule, projection, last start, horizon) per tier of a layout: its rows ending at or before
    the horizon (its own retention) are dropped. A tier row spans one granule, so they are the rows
    starting at or before horizon - granule: a range of the rows' key (stream, granule, projection,
    start). Asked by `end_ms` alone, each batch's commit read every row of the granule, of every
    projection over all the time kept, to drop a few: the demo's ~300 000 rows of 8 days, ~0.6 s a
    commit (python -m bench.tier_retention --days 8)."""
    return sorted((t.granule_ms, t.proj, batch_now_ms - t.keep_ms - t.granule_ms, batch_now_ms - t.keep_ms)
                  for t in layout.tiers())


def tier_horizons(layout: TierLayout, batch_now_ms: int) -> list[tuple[int, int]]:
    """(granule, horizon) per granule of a layout: its rows ending at or before the horizon
    (its own retention) are dropped."""
    return sorted({(t.granule_ms, batch_now_ms - t.keep_ms) for t in layout.tiers()})


@dataclass(frozen=True)
class BloomHorizons:
    """What a retention run drops of one stream's Bloom features (store/bloom.py drop_expired).
    The long-lived first-seen filter is never dropped: "first seen" looks back over the
    stream's whole life (docs/first-seen-membership-sessions.md)."""

    membership_through_ms: int | None  # membership buckets starting at or before it; None: keep them all
    first_seen_ends_by_ms: int  # first-seen counts of panes ending at or before it ...
    first_seen_starts_before_ms: int  # ... and starting before it


def bloom_horizons(batch_now_ms: int | None, retention_ms: Mapping[str, int], membership_bucket_ms: Mapping[str, int],
                   layouts: Mapping[str, TierLayout]) -> dict[str, BloomHorizons]:
    """Per stream with a retention run, what of its Bloom features goes: a membership bucket once
    all of it is past the retention (like a pane: no event it could get is accepted any more);
    a pane's first-seen counts once its pane is gone and no kept tier row serves a window over
    it (a first_seen point takes its count from the panes or tiers and its value from these
    counts, query/compute.py: dropped with the panes, a point served from a tier would say 0)."""
    return {stream: BloomHorizons(membership_through(horizon, membership_bucket_ms.get(stream)), horizon,
                                  min(horizon, tier_rows_kept_from(layouts.get(stream), batch_now_ms)))
            for stream, horizon in retention_horizons(batch_now_ms, retention_ms).items()}


def membership_through(retention_horizon_ms: int, bucket_ms: int | None) -> int | None:
    """The start of the newest membership bucket wholly before the horizon (a bucket [b, b + bucket)
    is, when b + bucket <= horizon). None without a declared bucket: a bucket's end is unknown."""
    return None if bucket_ms is None else retention_horizon_ms - bucket_ms


def tier_rows_kept_from(layout: TierLayout | None, batch_now_ms: int) -> int | float:
    """The earliest start of a tier row the layout still keeps (a row goes once it ends at or
    before its granule's horizon, so the kept ones start at the horizon rounded down to the
    granule); +inf with no tier rows kept."""
    kept = [horizon - horizon % granule for granule, horizon in tier_horizons(layout, batch_now_ms)] if layout else []
    return min(kept, default=math.inf)


def rebuild_chunks(first_start_ms: int, last_start_ms: int, layout: TierLayout,
                   chunk_ms: int = 6 * 3_600_000) -> list[tuple[int, int]]:
    """The [lo, hi) spans of event time a tier rebuild reads the panes in: each a whole number
    of every granule (no tier row is split across chunks), so memory stays bounded."""
    chunk = max(chunk_ms, *layout.granules_ms())
    chunk -= chunk % max(layout.granules_ms())
    first = first_start_ms - first_start_ms % chunk
    return [(lo, lo + chunk) for lo in range(first, last_start_ms + 1, chunk)]


def tiers_kept_by_rebuild(old: TierLayout | None, new: TierLayout) -> set[tuple[int, str]]:
    """The (granule, projection) tiers both layouts keep. A rebuild keeps their rows that start
    before the first stored pane: coarse tiers are kept longer than the panes (the demo's 1 h rows
    90 days, its panes 8), so those rows hold history no pane holds any more. A tier the old
    layout did not keep (a new granule or group-by) has no such rows: its history starts at the
    panes."""
    if old is None:
        return set()
    return {(t.granule_ms, t.proj) for t in old.tiers()} & {(t.granule_ms, t.proj) for t in new.tiers()}


def rebuilt_rows_to_save(deltas: Mapping[TierKey, TierDelta], kept: set[tuple[int, str]],
                         first_pane_ms: int) -> dict[TierKey, TierDelta]:
    """The rows a rebuild writes: all it rolled up from the panes, but for a kept tier's row that
    starts before the first pane (it covers panes gone since; the stored row still holds them)."""
    return {key: delta for key, delta in deltas.items()
            if key.start_ms >= first_pane_ms or (key.granule_ms, key.proj) not in kept}


def rebuilt_rows(panes: Iterable, layout: TierLayout) -> tuple[dict[TierKey, TierDelta], int]:
    """The tier rows rolled up from stored panes (store.panes.Pane), and the newest batch among them."""
    panes = list(panes)
    return stored_pane_deltas(panes, layout), max((p.last_batch for p in panes), default=0)


__all__: Sequence[str] = [
    "BatchPlan", "CorrectionRecord", "PaneId", "PaneWrite", "StoredPane", "StreamState", "StreamUpdate",
    "FreshPanes", "column_partials", "pane_ids", "partition_clock_ms", "pane_rows", "pane_keys", "plan_batch", "rebuild_chunks", "rebuilt_rows", "rebuilt_rows_to_save", "retention_horizons", "tier_horizons",
    "tier_rows_to_drop",
    "tier_row_after", "tiers_kept_by_rebuild",
]
