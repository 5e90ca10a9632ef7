"""Patterns (complex event processing) in the pane pipeline's micro-batch (catalog/patterns.py
declares them, patterns/ is the matcher, aggregates/pattern_batch.py the per-batch rule,
store/patterns.py the state).

Per batch, on the driver: the records of the patterns' streams that the batch merges (not dead
letters) are collected once (one Arrow transfer of stream, partition, offset, event time and
the fields patterns read), each pattern reads the stored keys its events touch or that are due
at its watermark, the rule buffers, releases in event-time order and matches, and the matches
are rolled up into pane partials of the derived stream `<pattern>_matches`. The partials, the
state, the matches and the late events go into the batch's own store commit: the same
transaction as its panes and batch id, so a pattern is exactly once across restarts.

Why the driver and not Spark's transformWithState: the state and the matches must be written
in the store transaction that records the batch (a checkpointed operator state commits apart
from it, so a crash between the two would duplicate or lose matches), the matcher is plain
Python that the driver runs as is, and a batch touches only the keys it has events for or that
are due, which keeps the driver's share small at the embedded service's scale
(docs/patterns.md, "Running in the pipeline").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from aggregates.joins import derived_partials
from aggregates.partials import merged_records
from aggregates.pattern_batch import may_take, pattern_watermark, run_pattern_batch
from aggregates.window_join import DerivedRow
from catalog import Catalog
from catalog.model import StreamDef
from catalog.defined_patterns import deleted_patterns, pattern_definition_id
from catalog.patterns import LATE_DIMENSION, Condition, PatternDef, matches_stream_name
from ingest.log.records import bools
from patterns.events import Match, PatternEvent
from patterns.plan import Plan, compile_pattern, holds_alone
from sketches import DEFAULT_K
from store import BatchCommit, PaneData, PanePartial, PaneStore, ValueStats, pane_start
from store.patterns import PatternCommit, PatternLoad


RECORD_COLUMNS = ("stream", "partition", "offset", "event_time", "dims", "vals", "ids")  # what patterns read


@dataclass(frozen=True)
class PatternsBatch:
    partials: list[PanePartial] = field(default_factory=list)
    commits: list[PatternCommit] = field(default_factory=list)
    watermarks: dict[str, int] = field(default_factory=dict)  # per derived stream: its pattern's watermark
    matches: int = 0
    late: int = 0
    released: int = 0


def field_slot(stream: StreamDef, name: str) -> tuple[str, int] | None:
    """Where the pipeline's source carries a field: ('dims', i), ('ids', i) or ('vals', i)."""
    if name in stream.dimensions:
        return "dims", stream.dimensions.index(name)
    if name in stream.source_ids:
        return "ids", stream.source_ids.index(name)
    if name in stream.values:
        return "vals", stream.values.index(name)
    return None


def read_fields(plan: Plan, pattern: PatternDef, stream: str) -> tuple[str, ...]:
    """The fields of `stream` the pattern reads: its steps' tests, `same_as` targets, measures."""
    names: set[str] = set()
    steps = [*plan.steps, *((plan.absence,) if plan.absence else ())]
    for step in steps:
        if step.stream == stream:
            names.update(c.field for c in step.conditions)
    for step, kept in zip(plan.steps, plan.kept_fields):
        if step.stream == stream:
            names.update(kept)
    return tuple(sorted(names))


def slot_array(column: pa.ChunkedArray | pa.Array, i: int) -> pa.Array:
    """Element i of each row's list, null where the list is null or shorter: one vectorized take
    per slot rather than every row's list turned into Python."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = arr.offsets.to_numpy()
    present = (np.diff(offsets) > i) & bools(arr.is_valid())
    if not present.any():
        return pa.nulls(len(arr), arr.type.value_type)
    taken = arr.values.take(pa.array(np.where(present, offsets[:-1] + i, 0)))
    return taken if present.all() else pc.if_else(pa.array(present), taken, pa.scalar(None, taken.type))


def list_slot(column: pa.ChunkedArray | pa.Array, i: int) -> list:
    """slot_array as Python values (None where absent)."""
    return slot_array(column, i).to_pylist()


def condition_mask(condition: Condition, values: pa.Array) -> np.ndarray:
    """Which rows pass a condition that reads no earlier step, vectorized: the condition is
    decided once per distinct value (by the matcher's own rule, so exactly as it decides it)."""
    if values.null_count == len(values):
        return np.zeros(len(values), dtype=bool)  # a field never present passes nothing
    encoded = pc.dictionary_encode(values)
    distinct = encoded.dictionary.to_pylist()
    passes = np.array([holds_alone(condition, v) for v in distinct] + [False], dtype=bool)  # last: null
    return passes[encoded.indices.fill_null(len(distinct)).to_numpy(zero_copy_only=False)]


def may_match(plan: Plan, stream: str, column: Callable[[str], pa.Array], rows: int) -> np.ndarray | None:
    """Which of a stream's rows some step (or the absence step) might take: an event that every
    step refuses whatever a run holds changes nothing the matcher decides (no run of its key
    takes it, none is broken by it under `followed_by`, absences are decided by the next event
    or the watermark all the same), so it need not be buffered nor fed. None: all may (a `next`
    step makes every event of a key matter)."""
    if plan.any_strict():
        return None
    steps = [s for s in (*plan.steps, *((plan.absence,) if plan.absence else ())) if s.stream == stream]
    out = np.zeros(rows, dtype=bool)
    for step in steps:
        mask = np.ones(rows, dtype=bool)
        for condition in step.unbound_conditions:
            mask &= condition_mask(condition, column(condition.field))
        out |= mask
    return out


def pattern_events(records: pa.Table, catalog: Catalog, plan: Plan, pattern: PatternDef,
                   slots_cache: dict | None = None, late_through_ms: int | None = None) -> list[PatternEvent]:
    """The batch's records of the pattern's streams as matcher events, with the fields it reads;
    a record without the key matches nothing and is left out, and so is one that no step might
    take (may_match) unless it is late (at or before `late_through_ms`, the pattern's
    watermark: every late event is recorded). `slots_cache` shares the columns read between
    the patterns of one batch."""
    out: list[PatternEvent] = []
    cache = {} if slots_cache is None else slots_cache
    for stream_name in pattern.streams:
        stream = catalog.streams[stream_name]
        if ("rows", stream_name) not in cache:
            rows = records.filter(pc.equal(records["stream"], stream_name))
            cache["rows", stream_name] = (rows, rows["event_time"].to_pylist(), rows["partition"].to_pylist(),
                                          rows["offset"].to_pylist())
        rows, times, partitions, offsets = cache["rows", stream_name]
        if rows.num_rows == 0:
            continue

        def array(name: str) -> pa.Array:
            slot = field_slot(stream, name)
            if slot is None:
                return pa.nulls(rows.num_rows)
            if ("array", stream_name, slot) not in cache:
                cache["array", stream_name, slot] = slot_array(rows[slot[0]], slot[1])
            return cache["array", stream_name, slot]

        def column(name: str) -> list:
            slot = field_slot(stream, name)
            if ("list", stream_name, slot) not in cache:
                cache["list", stream_name, slot] = array(name).to_pylist()
            return cache["list", stream_name, slot]

        keep = may_match(plan, stream_name, array, rows.num_rows)
        if keep is not None and late_through_ms is not None:
            keep |= rows["event_time"].to_numpy() <= late_through_ms
        keys = column(pattern.key)
        names = read_fields(plan, pattern, stream_name)
        values = [column(name) for name in names]
        for i in (range(rows.num_rows) if keep is None else np.flatnonzero(keep).tolist()):
            key = keys[i]
            if key is None:
                continue
            fields = {name: v for name, col in zip(names, values) if (v := col[i]) is not None}
            out.append(PatternEvent(stream_name, partitions[i], offsets[i], times[i], key, fields))
    return out


def match_rows(matches: Iterable[Match], dimensions: tuple[str, ...] = (LATE_DIMENSION,)) -> list[DerivedRow]:
    """One derived row per match at its decided_at, with the values of the derived stream's
    `dimensions` (the match's own, then `late`: "true" for a match published flagged late) and its
    numeric measures as values."""
    return [DerivedRow(m.decided_at,
                       tuple(("true" if m.late else "false") if d == LATE_DIMENSION else m.dims.get(d)
                             for d in dimensions),
                       {name: v for name, v in m.measures.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
            for m in matches]


def retraction_partials(matches: Iterable[Match], stream_name: str, pane_ms: int,
                        dimensions: tuple[str, ...] = (LATE_DIMENSION,)) -> list[PanePartial]:
    """The retracted matches taken out of their panes (at their decided_at, with the dimensions and
    late value they were published with): count -1 each, and per numeric measure n -1 and its
    value off the sum. Min, max and the percentiles' sketch cannot be taken back: they keep the
    retracted value (docs/patterns.md, "Late events")."""
    groups: dict[tuple[int, tuple], dict] = {}
    for row in match_rows(matches, dimensions):
        g = groups.setdefault((pane_start(row.time_ms, pane_ms), row.dims), {"count": 0, "values": {}})
        g["count"] -= 1
        for name, v in row.values.items():
            n, total = g["values"].get(name, (0, 0.0))
            g["values"][name] = (n - 1, total - v)
    return [PanePartial(stream_name, start, start + pane_ms, {d: v for d, v in zip(dimensions, dims) if v is not None},
                        PaneData(g["count"], {name: ValueStats(n, float(total), None, None)
                                              for name, (n, total) in g["values"].items()}, {}))
            for (start, dims), g in sorted(groups.items(), key=lambda kv: (kv[0][0], [str(d) for d in kv[0][1]]))]


class PatternRunner:
    def __init__(self, catalog: Catalog, store: PaneStore, *, kll_k: int = DEFAULT_K):
        self.catalog, self.store, self.kll_k = catalog, store, kll_k
        self.patterns = [(p, compile_pattern(p, catalog)) for p in catalog.patterns]
        # Each pattern's definition id: state built by another definition of it is dropped first
        # (a replaced pattern); patterns deleted through the API have theirs dropped
        # (aggregates/pattern_definitions.py). Both in the batch's commit.
        self.ids = {p.name: pattern_definition_id(catalog, p) for p in catalog.patterns}
        self.dropped = deleted_patterns(catalog, store.pattern_sizes())
        self.enabled = bool(self.patterns or self.dropped)
        self.names = [matches_stream_name(p.name) for p in catalog.patterns]  # their derived streams
        self.streams = sorted({s for p in catalog.patterns for s in p.streams})

    def records(self, batch: DataFrame, batch_now_ms: int, *, on_driver: bool = False,
                streams: Collection[str] | None = None, rows=None) -> pa.Table:
        """The batch's records of the patterns' streams that it merges (dead letters match nothing)."""
        return merged_records(batch, self.catalog, batch_now_ms, self.streams, RECORD_COLUMNS, present=streams,
                              on_driver=on_driver, rows=rows)

    def process(self, batch: DataFrame, batch_now_ms: int, *, on_driver: bool = False,
                streams: Collection[str] | None = None, rows=None) -> PatternsBatch:
        """`rows`: the batch on the driver collected once (aggregates/driver_rows.py), or None."""
        return self.run(self.records(batch, batch_now_ms, on_driver=on_driver, streams=streams, rows=rows),
                        self.store.watermarks())

    def run(self, records: pa.Table, stream_watermarks: dict[str, int]) -> PatternsBatch:
        """Every pattern over the batch's records, with the streams' watermarks stored before it."""
        out = PatternsBatch()
        matches = late = released = 0
        slots: dict = {}  # the columns the patterns read, shared
        for pattern, plan in self.patterns:
            stored = self.store.pattern_state(pattern.name, [], None)
            reset = stored.definition_id not in (None, self.ids[pattern.name])  # state of another definition
            before = None if reset else stored.watermark_ms
            stream = self.catalog.streams[matches_stream_name(pattern.name)]
            if before is None:
                # Starting from nothing (created, replaced, or deleted and created again): no lower
                # than its derived stream's watermark, which an earlier definition may have moved on.
                # A match decided in order is then never behind it (no correction of a final pane);
                # the events at or behind it are late for the new definition.
                before = (stream_watermarks[stream.name] if stream.name in stream_watermarks
                          else self.store.watermarks().get(stream.name))
            events = pattern_events(records, self.catalog, plan, pattern, slots, before)
            now = pattern_watermark(before, stream_watermarks, pattern.streams)
            # The states of the keys whose events are released now; buffering an event reads nothing.
            ready = {e.key for e in events if now is not None and e.time <= now and (before is None or e.time > before)}
            # The keys with late events some step might take: their state and kept history, for the
            # replay that corrects them (the others are recorded only).
            late_keys = sorted({e.key for e in events if before is not None and e.time <= before and may_take(plan, e)})
            load = (PatternLoad() if reset
                    else self.store.pattern_state(pattern.name, sorted(ready | set(late_keys)), now, late_keys))
            if load.watermark_ms != before:  # started at its derived stream's watermark
                load = replace(load, watermark_ms=before)
            done = run_pattern_batch(plan, load, events, now)
            done = replace(done, commit=replace(done.commit, definition_id=self.ids[pattern.name], reset=reset))
            out.partials.extend(derived_partials(match_rows([*done.matches, *done.added], stream.dimensions),
                                                 stream.name, stream.dimensions, stream.pane, self.kll_k,
                                                 sketched=stream.values))
            # A retraction takes its match out of its pane again (the pane of its dimensions and late
            # value): a correction of the pane, as a late event makes.
            out.partials.extend(retraction_partials(done.retracted, stream.name, stream.pane, stream.dimensions))
            out.commits.append(done.commit)
            if done.commit.watermark_ms is not None:
                out.watermarks[stream.name] = done.commit.watermark_ms
            matches += len(done.matches) + len(done.added) - len(done.retracted)
            late += len(done.commit.late)
            released += done.released
        out.commits.extend(PatternCommit(name, None, drop=True) for name in self.dropped)
        return PatternsBatch(out.partials, out.commits, out.watermarks, matches, late, released)


def with_patterns(commit: BatchCommit, done: PatternsBatch, derived: Iterable[str]) -> BatchCommit:
    """The batch's commit with the patterns' derived partials, state, matches and late events.
    A `<pattern>_matches` stream is read from no log partition: its newest time is its pattern's
    watermark and its lateness 0, so its watermark is the pattern's (no match is decided behind it)."""
    names = set(derived)
    max_event = commit.max_event_with(done.watermarks)
    return replace(commit, partials=[*commit.partials, *done.partials], patterns=done.commits, max_event_ms=max_event,
                   partition_max_event_ms={s: m for s, m in commit.partition_max_event_ms.items() if s not in names})


__all__ = ["PatternRunner", "PatternsBatch", "field_slot", "pattern_events", "with_patterns"]
