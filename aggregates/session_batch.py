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

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from aggregates.firstseen import BloomFeatures
from aggregates.joins import stream_watermarks_after
from aggregates.driver_batch import among
from aggregates.key_rows import (KEY_RECORD_COLUMNS, TAG_SESSIONS, KeyItem, KeyRows, key_rows,
                                 key_rows_on_driver)
from aggregates.partials import dead_letter_reason_column
from aggregates.session_window import due_through, session_batch_columns
from catalog import Catalog
from catalog.features import SESSION_VALUES, sessions_stream_name, source_field
from sketches import DEFAULT_K, DEFAULT_LG_K, HllSketch, KllSketch
from store import BatchCommit, PaneData, PanePartial, PaneStore, ValueStats
from store.bloom import BloomCommit
from store.panes import pane_start
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
    with n/sum/min/max and a KLL sketch; the keys in an HLL sketch (the derived stream's distinct)."""
    groups: dict[int, list[Session]] = {}
    for s in closed:
        groups.setdefault(pane_start(s.first_ms, pane_ms), []).append(s)
    out = []
    for start, sessions in sorted(groups.items()):
        values = {}
        for name, of in zip(SESSION_VALUES, (lambda s: s.last_ms - s.first_ms, lambda s: s.events), strict=True):
            xs = [float(of(s)) for s in sessions]
            kll = KllSketch(kll_k)
            for x in xs:
                kll.update(x)
            values[name] = ValueStats(len(xs), float(sum(xs)), min(xs), max(xs), kll.to_bytes())
        hll = HllSketch(lg_k)
        for s in sessions:
            hll.update(s.key)
        data = PaneData(len(sessions), values, {key_field: hll.to_bytes()})
        out.append(PanePartial(stream, start, start + pane_ms, {}, data))
    return out


def runs_of(runs: pa.Table, stream: str) -> SessionColumns:
    """One stream's rows of the batch's runs table, as columns (no object per run)."""
    mine = runs.filter(pc.equal(runs["stream"], stream))
    return SessionColumns(*(mine[c].to_pylist() for c in ("key", "first_ms", "last_ms", "events")))


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
                self._items.append(KeyItem(name, TAG_SESSIONS, stream.sessions.key, F.get(F.col(column), index),
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
            stored = self.store.session_state(name, batch_runs.keys, due_through(gap, watermark))
            outcome = session_batch_columns(name, gap, as_columns(stored), batch_runs, watermark)
            # A session older than the derived stream's retention comes from events the panes
            # dead-letter as beyond_retention already: not counted as a session either.
            closed = [s for s in outcome.closed if s.first_ms >= now_ms - derived.retention]
            out.partials.extend(session_partials(closed, derived.name, stream.sessions.key, derived.pane,
                                                 lg_k=self.lg_k, kll_k=self.kll_k))
            out.commits.append(outcome.commit)
            if closed:
                out.max_event_ms[derived.name] = max(s.first_ms for s in closed)
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
    if rows is not None:
        records = rows.merged(sorted({i.stream for i in items}), KEY_RECORD_COLUMNS)
        keyed = key_rows_on_driver(records, items)
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
