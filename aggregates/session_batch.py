"""Session windows in the pane pipeline's micro-batch (catalog/features.py declares `sessions: {key,
gap}`, aggregates/session_window.py is the rule, store/sessions.py the open sessions).

Per batch: the batch's merged records (not dead letters; after the device clock step, so in
corrected event time; after duplicates are dropped) of the streams declaring sessions are cut into
runs, per key: sorted by event time, a new run where the next event is `gap` or more after the
previous one, and per run its first and last event times and its count. The batch's one per-key
job, shared with first-seen and membership (aggregates/key_rows.py: a stream whose Bloom features
and sessions read the same key is one row per event for all), gives each key's events per slot
of at most `gap` (earliest, latest, count); the driver cuts the slots into runs with numpy,
exactly as it would cut the events. Then, on the driver, per stream: the open
sessions its runs' keys touch or that the stream's watermark after this batch closes (one store
lookup), the rule, and the closed sessions rolled up into pane partials of the derived stream
`<stream>_sessions` (event time = session start; values duration_ms = last - first with a KLL
sketch, events with a KLL sketch; an HLL of the key), as the partial aggregation would roll them
up. The partials and the open sessions' changes go into the batch's own store commit: exactly once
across restarts, and a session closed behind its pane's finality merges through the normal late
path (a correction).

Why not Spark's session_window (what ran before): it needs a second streaming query per stream
that reads the whole log again and keeps its state in its own checkpoint, and it drops events
behind its watermark (docs/first-seen-membership-sessions.md, "Sessions").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from aggregates.arrow_partials import hlls_per_group, value_stats_per_group
from aggregates.firstseen import BloomFeatures
from aggregates.joins import stream_watermarks_after
from aggregates.driver_batch import among
from aggregates.key_rows import (KEY_RECORD_COLUMNS, TAG_SESSIONS, KeyItem, KeyRows, key_rows,
                                 key_rows_on_driver)
from aggregates.partials import dead_letter_reason_column
from aggregates.session_window import due_through, session_batch_columns
from aggregates.spark import LazyColumn
from catalog import Catalog
from catalog.features import SESSION_VALUES, sessions_stream_name, source_field
from sketches import DEFAULT_K, DEFAULT_LG_K
from store import BatchCommit, PaneData, PanePartial, PaneStore, ValueStats
from store.bloom import BloomCommit
from store.sessions import Session, SessionColumns, SessionCommit


@dataclass(frozen=True)
class SessionsBatch:
    partials: list[PanePartial] = field(default_factory=list)
    commits: list[SessionCommit] = field(default_factory=list)
    max_event_ms: dict[str, int] = field(default_factory=dict)  # per derived stream: its newest session start
    runs: int = 0
    closed: int = 0
    opened: int = 0  # open sessions written (new or grown)


def session_partials(closed: Iterable[Session], stream: str, key_field: str, pane_ms: int, *, lg_k: int = DEFAULT_LG_K,
                     kll_k: int = DEFAULT_K) -> list[PanePartial]:
    """Closed sessions rolled up per pane of their start: count = sessions; duration_ms and events
    with n/sum/min/max and a KLL sketch; the keys in an HLL sketch (the derived stream's distinct).
    By whole columns (a backfill closes hundreds of thousands of sessions a batch): the sessions
    sorted by pane, stably, and each pane's values and keys written as the Arrow group-by writes a
    group's (aggregates/arrow_partials.py: KLL exact-mode bytes up to k items, HLL LIST bytes up to
    7 coupons, DataSketches fed in order past that), so a pane's sketches hold what one sketch fed
    its sessions in their (key, first) order would."""
    sessions = as_columns(closed)
    n = len(sessions)
    if n == 0:
        return []
    table = sessions.table
    first = table["first_ms"].to_numpy()
    panes = first - np.mod(first, pane_ms)  # store.panes.pane_start: floor, also before 1970
    order = np.argsort(panes, kind="stable")
    sorted_panes = panes[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_panes[1:] != sorted_panes[:-1])))
    ends = np.append(starts[1:], n)
    durations = table["last_ms"].to_numpy() - first
    every = np.ones(n, bool)
    values = {}
    for i, (name, xs) in enumerate(zip(SESSION_VALUES, (durations, table["events"].to_numpy()),
                                       strict=True)):
        cols = value_stats_per_group(i, xs[order].astype(np.float64), every, starts, ends, kll_k)
        values[name] = zip(*(cols[f"{c}_{i}"].to_pylist() for c in ("n", "sum", "min", "max", "kll")), strict=True)
    hlls = hlls_per_group(table["session_key"].combine_chunks(), order, starts, ends, lg_k).to_pylist()
    stats = zip(*(values[name] for name in SESSION_VALUES), strict=True)
    out = []
    for start, count, per_value, hll in zip(sorted_panes[starts].tolist(), (ends - starts).tolist(), stats, hlls,
                                            strict=True):
        data = PaneData(count, {name: ValueStats(int(c), float(total), lo, hi, kll)
                                for name, (c, total, lo, hi, kll) in zip(SESSION_VALUES, per_value, strict=True)},
                        {key_field: hll})
        out.append(PanePartial(stream, start, start + pane_ms, {}, data))
    return out


def runs_of(runs: pa.Table, stream: str) -> SessionColumns:
    """One stream's rows of the batch's runs table, as columns (no object per run)."""
    mine = runs.filter(pc.equal(runs["stream"], stream))
    return SessionColumns.of_table(mine.select(["key", "first_ms", "last_ms", "events"]))


def as_columns(sessions) -> SessionColumns:
    if isinstance(sessions, SessionColumns):
        return sessions
    sessions = list(sessions)
    return SessionColumns([s.key for s in sessions], [s.first_ms for s in sessions], [s.last_ms for s in sessions],
                          [s.events for s in sessions])


class SessionWindows:
    def __init__(self, catalog: Catalog, store: PaneStore, *, lg_k: int = DEFAULT_LG_K, kll_k: int = DEFAULT_K):
        self.catalog, self.store, self.lg_k, self.kll_k = catalog, store, lg_k, kll_k
        self.streams = sorted(n for n, s in catalog.streams.items() if s.sessions is not None and not s.derived_from)
        self.enabled = bool(self.streams)
        self.names = [sessions_stream_name(n) for n in self.streams]  # the derived streams
        self._items: list[KeyItem] | None = None

    def items(self, streams: Collection[str] | None = None) -> list[KeyItem]:
        """Per event of a stream with sessions: its session key and the gap (aggregates/key_rows.py:
        one row with the Bloom features where they read the same field). `streams`: those with
        records in the batch (None: unknown); built once (their Columns are calls into the JVM)."""
        if self._items is None:
            self._items = []
            for name in self.streams:
                stream = self.catalog.streams[name]
                column, index = source_field(stream, stream.sessions.key)
                key = LazyColumn(lambda c=column, i=index: F.get(F.col(c), i))  # the Spark path's (LazySpark)
                self._items.append(KeyItem(name, TAG_SESSIONS, stream.sessions.key, key,
                                           times=True, gap=stream.sessions.gap, source=(column, index)))
        present = set(among(self.streams, streams))
        return [i for i in self._items if i.stream in present]

    def runs_of_rows(self, rows: KeyRows) -> pa.Table:
        """The runs (stream, key, first_ms, last_ms, events) of `key_rows`' slots."""
        return rows.runs()

    def runs(self, batch: DataFrame, batch_now_ms: int) -> pa.Table:
        """The batch's merged records of the streams with sessions, cut into runs per key:
        stream, key, first_ms, last_ms, events (one Spark job, the cut in numpy on the driver)."""
        merged = batch.where(dead_letter_reason_column(self.catalog, batch_now_ms).isNull())
        return self.runs_of_rows(key_rows(merged, self.items()))

    def process(self, batch: DataFrame, batch_now_ms: int, commit: BatchCommit,
                idle_timeout_ms: Mapping[str, int] | None = None) -> SessionsBatch:
        return self.sessionize(self.runs(batch, batch_now_ms), commit, now_ms=batch_now_ms,
                               idle_timeout_ms=idle_timeout_ms)

    def sessionize(self, runs: pa.Table, commit: BatchCommit, *, now_ms: int,
                   idle_timeout_ms: Mapping[str, int] | None = None) -> SessionsBatch:
        """Every stream's sessions over the batch's runs, with the open sessions the store holds;
        `commit` is the batch's own commit (its streams' progress: the watermark that closes them)."""
        marks = stream_watermarks_after(self.store, self.catalog, self.streams, commit, now_ms=now_ms,
                                        idle_timeout_ms=idle_timeout_ms)
        out = SessionsBatch()
        for name in self.streams:
            stream, derived = self.catalog.streams[name], self.catalog.streams[sessions_stream_name(name)]
            gap, watermark = stream.sessions.gap, marks.get(name)
            batch_runs = runs_of(runs, name)
            stored = self.store.session_state(name, batch_runs.table["session_key"], due_through(gap, watermark))
            outcome = session_batch_columns(name, gap, as_columns(stored), batch_runs, watermark)
            # A session older than the derived stream's retention comes from events the panes
            # dead-letter as beyond_retention already: not counted as a session either.
            closed = as_columns(outcome.closed)
            starts = closed.table["first_ms"].to_numpy()
            kept = np.flatnonzero(starts >= now_ms - derived.retention)
            if len(kept) < len(closed):
                closed, starts = SessionColumns.of_table(closed.table.take(pa.array(kept, pa.int64()))), starts[kept]
            out.partials.extend(session_partials(closed, derived.name, stream.sessions.key, derived.pane,
                                                 lg_k=self.lg_k, kll_k=self.kll_k))
            out.commits.append(outcome.commit)
            if len(closed):
                out.max_event_ms[derived.name] = int(starts.max())
            out = replace(out, runs=out.runs + len(batch_runs), closed=out.closed + len(closed),
                          opened=out.opened + len(outcome.commit.kept))
        return out


def bloom_and_runs(merged: DataFrame | None, bloom: BloomFeatures, sessions: SessionWindows, *,
                   streams: Collection[str] | None = None, rows=None) -> tuple[BloomCommit | None, pa.Table | None]:
    """The batch's Bloom commit and its sessions' runs from one Spark job over its merged records
    (aggregates/key_rows.py): a stream whose session key is its Bloom features' field is grouped by
    that key once for all. None for a feature no stream has. `streams`: those with records in the
    batch (None: unknown), the others skipped. `rows` (a batch on the driver, aggregates/driver_rows.py):
    no Spark job, the same rows computed from its records here; `merged` is not read then (None)."""
    plan = bloom.plan(streams) if bloom.enabled else None
    items = [*(plan.items if plan else ()), *(sessions.items(streams) if sessions.enabled else ())]
    if rows is not None:  # the batch's rows as they are, its merged ones picked by position (no copy)
        keyed = key_rows_on_driver(rows.table.select(KEY_RECORD_COLUMNS), items, keep=rows.good, ids=rows.ids)
    else:
        keyed = key_rows(merged, items)
    return (bloom.commit(keyed, plan) if plan else None, sessions.runs_of_rows(keyed) if sessions.enabled else None)


def with_sessions(commit: BatchCommit, done: SessionsBatch, derived: Iterable[str]) -> BatchCommit:
    """The batch's commit with the closed sessions' partials and the open sessions' changes. A
    `<stream>_sessions` stream is read from no log partition: its watermark follows the stream-wide
    rule (its newest session start - its allowed lateness, which includes the gap)."""
    names = set(derived)
    max_event = commit.max_event_with(done.max_event_ms)
    return replace(commit, partials=[*commit.partials, *done.partials], sessions=done.commits, max_event_ms=max_event,
                   partition_max_event_ms={s: m for s, m in commit.partition_max_event_ms.items() if s not in names})


__all__ = ["SessionWindows", "SessionsBatch", "bloom_and_runs", "session_partials", "with_sessions"]
