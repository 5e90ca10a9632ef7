"""Embedded serving store: one SQLite file (WAL) holding panes, sketches, the change feed,
committed batch ids, watermarks and pipeline offsets.

Exactly-once: a batch's pane merges, its change-feed rows, its offsets and its batch id are
written in one transaction, and a batch id already present is skipped, so Spark replaying
a batch after a crash changes nothing.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from store.retention_clock import recorded_commit_ms
from store import batch_totals
from store import bloom as bloom_store
from store import dead_letter_counts, dim_sets, row_codec, sqlite_tiers, tier_fold_store, tier_retention
from store.gc_pause import paused_gc
from store.base import (
    BatchCommit,
    Change,
    CommitResult,
    Correction,
    DeadLetter,
    DeviceClock,
    PaneStore,
    PartitionProgress,
    PipelineProgress,
    StoredDeadLetter,
    streams_progress,
)
from store import event_ids
from store import joins as join_store
from store.commit_plan import (BatchPlan, PaneId, StoredPane, StreamState, batch_newest, pane_ids, pane_keys,
                               pane_rows, plan_batch, retention_horizons)
from store.commit_plan import (CORRECTIONS_DROPPED_PER_COMMIT, DROP_DUE_CORRECTIONS, DROP_OLD_CHANGES, bloom_horizons,
                               change_feed_horizon, with_removed_streams)
from store.connection import SqliteDb, naming_file, open_connection, read_snapshot, transaction, where
from store.dim_sets import CHANGES_SINCE
from store.device_clocks import device_clock, device_clock_rows
from store.panes import Pane, dims_key
from store.retention_clock import NEWEST_COMMIT_SQL
from store.rollup import BucketStats, SketchRow
from store.schema_version import SCHEMA_VERSION, check_version
from store import view_state
from store import table_state, table_versions
from store import session_layout
from store.session_layout import LayoutChooser
from store.switch import check_definitions
from store.tables import EVENT_ID_TABLES, JOIN_TABLES, PANE_TABLES, TABLE_STATE_TABLES
from store.tables import VIEW_STATE_TABLES
from store import patterns as pattern_store
from store.patterns import PATTERN_TABLES
from store import sessions as session_store
from store.tiers import ALL_DIMS, TierLayout
from store.wal_checkpoints import SAFETY_NET_PAGES, BackgroundCheckpoints
from store.watermarks import PartitionMark


# The page cache of the store's own connection (the one commits write through), in KiB. A live batch
# reads and rewrites ~1 000 panes and as many tier rows (with their index and overflow pages, a few
# MiB), past SQLite's default of 2 000 KiB: pages were evicted between a commit's load and its save,
# and read again. bench.steady_commits' commit median, four rounds: 185-197 ms with the default,
# 173-185 ms with 16 or 64 MiB (session 93). Allocated as used, at most this.
PAGE_CACHE_KIB = 32 * 1024


class SqlitePaneStore(PaneStore):
    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL", busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self._synchronous, self._busy_timeout_s = synchronous, busy_timeout_s
        self._conn = open_connection(self.path, synchronous=synchronous, busy_timeout_s=busy_timeout_s)
        self._conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")  # negative: KiB, not pages
        self._lock = threading.Lock()
        self._bloom: bloom_store.BloomStore | None = None
        self._checkpoints: BackgroundCheckpoints | None = None  # checkpoint_apart's
        self._session_layouts = LayoutChooser(session_layout.SQLITE)  # each stream's session layout, reckoned
        with self._lock, naming_file(self.path):
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            check_version(version, f"SQLite store {self.path}")
            self._conn.executescript(PANE_TABLES + EVENT_ID_TABLES + JOIN_TABLES + TABLE_STATE_TABLES
                                     + VIEW_STATE_TABLES + PATTERN_TABLES + session_store.SESSION_TABLES)
            bloom_store.create_schema(self._conn)
            sqlite_tiers.create_schema(self._conn)
            self._migrate()
            sqlite_tiers.create_indexes(self._conn)
            if version != SCHEMA_VERSION:  # written only when it changes: an up-to-date store opens on a full disk
                self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _migrate(self) -> None:
        """Columns added after a store file may have been created (SQLite: ADD COLUMN only)."""
        def columns(table: str) -> set[str]:
            return {row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")}

        if "correction_id" not in columns("changes"):
            self._conn.execute("ALTER TABLE changes ADD COLUMN correction_id INTEGER")
        have = columns("stream_progress")
        if "events_read" not in have:
            self._conn.execute("ALTER TABLE stream_progress ADD COLUMN events_read INTEGER NOT NULL DEFAULT 0")
            # Before dead letters existed, every record read was aggregated.
            self._conn.execute("UPDATE stream_progress SET events_read = events_aggregated")
        if "events_dead_lettered" not in have:
            self._conn.execute(
                "ALTER TABLE stream_progress ADD COLUMN events_dead_lettered INTEGER NOT NULL DEFAULT 0"
            )
        if "held_by_partition" not in have:
            self._conn.execute("ALTER TABLE stream_progress ADD COLUMN held_by_partition INTEGER")
        if "clock_correction_ms" not in columns("dead_letters"):
            self._conn.execute("ALTER TABLE dead_letters ADD COLUMN clock_correction_ms INTEGER")
        if "retracts" not in columns("pattern_matches"):
            self._conn.execute("ALTER TABLE pattern_matches ADD COLUMN retracts INTEGER")
        if "dims" not in columns("pattern_matches"):
            self._conn.execute("ALTER TABLE pattern_matches ADD COLUMN dims TEXT")
        if "dropped_runs" not in columns("pattern_progress"):
            self._conn.execute("ALTER TABLE pattern_progress ADD COLUMN dropped_runs INTEGER NOT NULL DEFAULT 0")
        if "change_seq" not in columns("view_changes"):  # a view changelog's own order (store/view_state.py)
            self._conn.execute("ALTER TABLE view_changes ADD COLUMN change_seq INTEGER")
            view_state.fill_positions(self._conn.cursor())
        self._conn.execute(view_state.CHANGE_SEQ_INDEX)
        self._conn.execute(view_state.COMMITTED_AT_INDEX)
        sqlite_tiers.fold_old_sketch_tables(self._conn)  # sketches one row per (field, kind): now a column
        sqlite_tiers.number_dims(self._conn)  # dimensions as text in every row: now numbered

    # -- writing ------------------------------------------------------------------------

    def commit_batch(self, commit: BatchCommit, *, lateness_ms: Mapping[str, int], now_ms: int,
                     retention_ms: Mapping[str, int] | None = None,
                     idle_timeout_ms: Mapping[str, int] | None = None,
                     membership_bucket_ms: Mapping[str, int] | None = None) -> CommitResult:
        conn = self._conn
        # store/gc_pause.py: about half a backfill commit's CPU otherwise; dim_sets.kept: each text looked up once
        with self._lock, paused_gc(), dim_sets.kept(conn):
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = self._commit_locked(commit, lateness_ms, now_ms, retention_ms or {}, idle_timeout_ms or {},
                                             membership_bucket_ms or {})
                conn.execute("ROLLBACK" if not result.committed else "COMMIT")
                if result.committed and self._checkpoints is not None:
                    self._checkpoints.committed()
            except BaseException:
                # SQLITE_FULL or an I/O error may have rolled back already (a ROLLBACK would then
                # hide the real error); a COMMIT that failed is rolled back here.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

    def _commit_locked(self, commit: BatchCommit, lateness_ms: Mapping[str, int], now_ms: int,
                       retention_ms: Mapping[str, int], idle_timeout_ms: Mapping[str, int],
                       membership_bucket_ms: Mapping[str, int]) -> CommitResult:
        """One batch in the open transaction: skip a replay; read what the batch touches; decide
        (store/commit_plan.py); write panes with their changes, tiers, dead letters, progress and
        offsets, Bloom bits, event ids; prune past retention; record the batch id last."""
        conn = self._conn
        seen = conn.execute(
            "SELECT 1 FROM batches WHERE pipeline = ? AND batch_id = ?", (commit.pipeline, commit.batch_id)
        ).fetchone()
        if seen:
            return CommitResult(committed=False)
        check_definitions(conn, commit.definition_versions, commit.pipeline)  # fenced by a switch (store/switch.py)
        layouts = sqlite_tiers.stored_layouts(conn)
        keys = pane_keys(commit)  # each partial's dimension text, once for the load and the plan
        streams_before = self._stream_states()
        # The coarser tiers' panes the streams' time passes (store/tier_fold_store.py), read before the write.
        fold = tier_fold_store.plan_fold(
            batch_newest(commit, streams_before), layouts, tier_fold_store.stored_clocks(conn.cursor()), lateness_ms,
            lambda stream, lo, hi, keep: sqlite_tiers.read_rows(conn, "panes", "stream = ?", (stream,), lo, hi, None,
                                                                stream=stream, keep=keep),
            clock_ms=commit.batch_now_ms)
        plan = plan_batch(commit, self._stored_panes(commit, keys), streams_before, lateness_ms, layouts,
                          now_ms=now_ms, idle_timeout_ms=idle_timeout_ms, keys=keys, folds=fold.split)
        first_seq, last_seq = self._write_panes(commit, plan, now_ms)
        # The tier rows covering the merged panes, in the same transaction (store/tiers.py).
        if plan.tier_deltas:
            sqlite_tiers.apply_deltas(conn, plan.tier_deltas, now_ms, commit.batch_id)
        if fold.deltas:
            sqlite_tiers.apply_deltas(conn, fold.deltas, now_ms, commit.batch_id)
        moved = {**fold.moved, **tier_fold_store.first_points(conn.cursor(), "?", fold.unset, layouts)}
        if moved:
            tier_fold_store.save_points(conn.cursor(), "?", moved)
        self._write_dead_letters(commit, plan, now_ms)
        self._write_progress(commit, plan)
        if commit.bloom is not None:
            bloom_store.apply_bloom_commit(conn, commit.bloom, commit.batch_id, now_ms)
        if commit.event_ids is not None:
            event_ids.apply(conn.cursor(), commit.event_ids, end_offsets=commit.end_offsets,
                            log_end_offsets=commit.log_end_offsets, placeholder="?")
        if commit.joins:
            join_store.apply(conn.cursor(), commit.joins, "?")
        if commit.patterns:
            pattern_store.apply(conn.cursor(), commit.patterns, commit.batch_id, now_ms, "?")
        if commit.sessions:
            session_store.apply(conn.cursor(), commit.sessions, "?", self._session_layouts)
        table_state.apply(conn.cursor(), commit.table_changes, commit.batch_id, now_ms, "?")
        view_state.apply(conn.cursor(), commit.views, commit.batch_id, now_ms, "?")
        if commit.enrichment is not None:
            table_versions.apply_commit(conn.cursor(), commit.enrichment, commit.batch_id, "?")
        self._prune(commit, retention_ms, membership_bucket_ms, layouts)
        committed_at_ms = recorded_commit_ms(now_ms, commit.batch_now_ms)
        batch_totals.add(conn.cursor(), commit.pipeline, commit.batch_id, committed_at_ms, commit.events_read, "?", "MAX")
        conn.execute(
            "INSERT INTO batches (pipeline, batch_id, committed_at_ms, events_read, panes_new, panes_updated)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (commit.pipeline, commit.batch_id, committed_at_ms, commit.events_read, plan.panes_new, plan.panes_updated),
        )
        return CommitResult(True, plan.panes_new, plan.panes_updated, first_seq, last_seq, plan.corrections,
                            len(commit.dead_letters))

    def _stream_states(self) -> dict[str, StreamState]:
        """Every stream's watermark and partition marks, as stored before the batch."""
        marks: dict[str, dict[int, PartitionMark]] = defaultdict(dict)
        for stream, p, mx, read, end, progress in self._conn.execute(
                "SELECT stream, partition, max_event_ms, read_offset, log_end_offset, last_progress_ms"
                " FROM partition_watermarks"):
            marks[stream][p] = PartitionMark(mx, read, end, progress)
        return {stream: StreamState(wm, mx, marks.get(stream, {})) for stream, wm, mx in self._conn.execute(
            "SELECT stream, watermark_ms, max_event_ms FROM stream_progress")}

    def _stored_panes(self, commit: BatchCommit, keys: Sequence[str]) -> dict[PaneId, StoredPane]:
        """The stored panes the batch merges into (new panes are absent); `keys`: pane_keys(commit)."""
        return sqlite_tiers.load_many(self._conn, "panes", sqlite_tiers.PANE_KEY, pane_ids(commit, keys))

    def _write_panes(self, commit: BatchCommit, plan: BatchPlan, now_ms: int) -> tuple[int | None, int | None]:
        """The merged panes, a change record each (and a correction for a final pane); the first
        and last change sequence numbers. Panes, sketches and changes go in one executemany each."""
        conn = self._conn
        rows = pane_rows(plan)
        stored = sqlite_tiers.save_rows(conn, "panes", sqlite_tiers.PANE_KEY,
                                        [((stream, start, key), end, count, text, revision, blob)
                                         for stream, start, end, key, count, text, revision, blob, _, _ in rows],
                                        now_ms, commit.batch_id)
        changes = []
        for stream, start, end, key, _, _, revision, _, added, c in rows:
            correction_id = None
            if c is not None:  # few: one INSERT each, for its id
                correction_id = conn.execute(
                    "INSERT INTO corrections (stream, pane_start_ms, pane_end_ms, dims, revision_from, revision_to,"
                    " pipeline, batch_id, events_added, at_ms, old, new) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (stream, start, end, key, c.revision_from, c.revision_to,
                     commit.pipeline, commit.batch_id, added, now_ms, _json(c.old), _json(c.new)),
                ).lastrowid
            changes.append((stream, start, stored[(stream, start, key)][-1], revision, commit.batch_id, added, now_ms,
                            correction_id))
        if not changes:
            return None, None
        conn.executemany(
            "INSERT INTO changes (stream, start_ms, dims_id, revision, batch_id, count_added, at_ms, correction_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", changes)
        # Consecutive numbers: the commit holds the write lock and AUTOINCREMENT counts up one by one.
        last_seq = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
        return last_seq - len(changes) + 1, last_seq

    def _write_dead_letters(self, commit: BatchCommit, plan: BatchPlan, now_ms: int) -> None:
        conn = self._conn
        conn.executemany(
            "INSERT INTO dead_letter_counts (stream, reason, count) VALUES (?, ?, ?)"
            " ON CONFLICT (stream, reason) DO UPDATE SET count = count + excluded.count",
            [(stream, reason, n) for (stream, reason), n in plan.dead_counts.items()],
        )
        conn.executemany(
            "INSERT INTO dead_letters (pipeline, batch_id, stream, partition, \"offset\", reason, event_time_ms,"
            " ingest_time_ms, error, dims, at_ms, clock_correction_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(commit.pipeline, commit.batch_id, d.stream, d.partition, d.offset, d.reason, d.event_time_ms,
              d.ingest_time_ms, d.error, None if d.dims is None else dims_key(d.dims), now_ms, d.clock_correction_ms)
             for d in commit.dead_letters],
        )
        forget, keep = device_clock_rows(commit)
        conn.executemany("DELETE FROM device_clocks WHERE stream = ? AND device = ?", forget)
        conn.executemany(
            "INSERT OR REPLACE INTO device_clocks (stream, device, buckets, offset_ms, correction_ms, newest_ms,"
            " updated_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?)", [(*row, now_ms) for row in keep])

    def _write_progress(self, commit: BatchCommit, plan: BatchPlan) -> None:
        """Stream watermarks and counters, partition marks, and the pipeline's log offsets."""
        conn = self._conn
        conn.executemany(
            "INSERT INTO stream_progress (stream, watermark_ms, max_event_ms, events_aggregated, events_read,"
            " events_dead_lettered, held_by_partition) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream) DO UPDATE SET"
            " watermark_ms = excluded.watermark_ms, max_event_ms = excluded.max_event_ms,"
            " events_aggregated = events_aggregated + excluded.events_aggregated,"
            " events_read = events_read + excluded.events_read,"
            " events_dead_lettered = events_dead_lettered + excluded.events_dead_lettered,"
            " held_by_partition = excluded.held_by_partition",
            [(u.stream, u.watermark_ms, u.max_event_ms, u.aggregated, u.read, u.dead_lettered, u.held_by_partition)
             for u in plan.streams],
        )
        conn.executemany(
            "INSERT OR REPLACE INTO partition_watermarks (stream, partition, max_event_ms, read_offset, log_end_offset,"
            " last_progress_ms, state) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(u.stream, p, m.max_event_ms, m.read_offset, m.log_end_offset, m.last_progress_ms, state)
             for u in plan.streams for p, (m, state) in u.partitions.items()],
        )
        for stream, partitions in commit.end_offsets.items():
            conn.executemany(
                "INSERT INTO pipeline_offsets (pipeline, stream, partition, end_offset) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (pipeline, stream, partition) DO UPDATE SET end_offset = excluded.end_offset",
                [(commit.pipeline, stream, p, o) for p, o in partitions.items()],
            )

    def _prune(self, commit: BatchCommit, retention_ms: Mapping[str, int], membership_bucket_ms: Mapping[str, int],
               layouts: Mapping[str, TierLayout]) -> None:
        """Panes (with their sketches and corrections), dead letters, membership buckets and tier
        rows past their stream's retention, first-seen counts no pane or tier row serves; change
        records older than the longest retention."""
        conn = self._conn
        retention_ms = with_removed_streams(retention_ms, layouts)
        for stream, horizon in retention_horizons(commit.batch_now_ms, retention_ms).items():
            # Only panes wholly before the horizon: every event they could get is dead-lettered.
            conn.execute("DELETE FROM panes WHERE stream = ? AND start_ms < ? AND end_ms <= ?",
                         (stream, horizon, horizon))
            conn.execute("DELETE FROM dead_letters WHERE stream = ? AND at_ms < ?", (stream, horizon))
            # A dropped pane's corrections go with it: kept, a stream with stragglers grew the table by
            # ~140 rows a second at 20 000 events/s of the demo. At most CORRECTIONS_DROPPED_PER_COMMIT a
            # commit: a store from before kept them all, and millions in one commit would hold its writers.
            conn.execute(DROP_DUE_CORRECTIONS.replace("%s", "?"),
                         (stream, horizon, horizon, CORRECTIONS_DROPPED_PER_COMMIT))
        bloom_store.drop_expired(conn.cursor(), bloom_horizons(commit.batch_now_ms, retention_ms, membership_bucket_ms,
                                                               layouts), "?")
        feed_horizon = change_feed_horizon(commit.batch_now_ms, retention_ms)
        if feed_horizon is not None:
            conn.execute(DROP_OLD_CHANGES.replace("%s", "?"), (feed_horizon,))
        if commit.batch_now_ms is not None:
            for stream, layout in layouts.items():
                tier_retention.drop_expired(conn, "?", stream, layout, commit.batch_now_ms)

    # -- reading ------------------------------------------------------------------------

    def last_batch_id(self, pipeline: str) -> int | None:
        with self._lock:
            return batch_totals.newest(self._conn.cursor(), pipeline, "?")

    def last_commit_ms(self, pipeline: str) -> int | None:
        with self._lock:
            return batch_totals.read(self._conn.cursor(), pipeline, "?").last_commit_ms

    def newest_commit_ms(self) -> int | None:
        with self._lock:
            return self._conn.execute(NEWEST_COMMIT_SQL).fetchone()[0]

    def read_panes(self, stream: str, start_ms: int, end_ms: int, *, value_field: str | None = None,
                   distinct_field: str | None = None, with_sketches: bool = False) -> list[Pane]:
        wanted = row_codec.wanted_sketches(with_sketches, value_field, distinct_field)
        with self._lock:
            return sqlite_tiers.read_rows(self._conn, "panes", "stream = ?", (stream,), start_ms, end_ms, wanted,
                                          stream=stream)

    def tier_layout(self, stream: str) -> TierLayout | None:
        with self._lock:
            row = self._conn.execute("SELECT layout FROM tier_layouts WHERE stream = ?", (stream,)).fetchone()
        return None if row is None else TierLayout.from_json(row[0])

    def tier_fold_clock(self, stream: str) -> int | None:
        with self._lock:
            return tier_fold_store.stored_clock(self._conn.cursor(), "?", stream)

    def read_tier(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *,
                  value_field: str | None = None, distinct_field: str | None = None,
                  with_sketches: bool = False, pane_ms: int | None = None, with_stats: bool = True) -> list[Pane]:
        wanted = row_codec.wanted_sketches(with_sketches, value_field, distinct_field)
        table, where, args = self._tier_table(stream, granule_ms, proj, pane_ms)
        with self._lock:
            return sqlite_tiers.read_rows(self._conn, table, where, args, start_ms, end_ms, wanted,
                                          stats=with_stats, stream=stream)

    def read_tier_sketch(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *,
                         field: str, kind: str, pane_ms: int | None = None) -> list[SketchRow]:
        table, where, args = self._tier_table(stream, granule_ms, proj, pane_ms)
        with self._lock:  # each row's sketch taken as the row is read: a day's whole blobs are never all held
            return row_codec.sketch_rows(self._conn.execute(
                row_codec.sketch_rows_select(table, f"{where} AND start_ms >= ? AND start_ms < ?"),
                (*args, start_ms, end_ms)), field, kind)

    def aggregate_tier(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *, origin_ms: int,
                       bucket_ms: int, group_by: Sequence[str] = (), filters: Mapping[str, str] | None = None,
                       value_field: str | None = None, pane_ms: int | None = None) -> list[BucketStats]:
        table, where, args = self._tier_table(stream, granule_ms, proj, pane_ms)
        with self._lock:
            return sqlite_tiers.aggregate(self._conn, table, where, args, start_ms=start_ms, end_ms=end_ms,
                                          origin_ms=origin_ms, bucket_ms=bucket_ms, group_by=group_by,
                                          filters=filters or {}, value_field=value_field,
                                          one_row_per_bucket=bucket_ms == granule_ms and origin_ms % granule_ms == 0)

    @staticmethod
    def _tier_table(stream: str, granule_ms: int, proj: str, pane_ms: int | None) -> tuple[str, str, tuple]:
        """Where a tier's rows are: the panes themselves for the pane granule with all dimensions."""
        if proj == ALL_DIMS and granule_ms == pane_ms:
            return "panes", "stream = ?", (stream,)
        return "tier_rows", "stream = ? AND granule_ms = ? AND proj = ?", (stream, granule_ms, proj)

    def configure_tiers(self, layouts: Mapping[str, TierLayout | None], *, now_ms: int,
                        progress: Callable[[str], None] | None = None) -> list[str]:
        rebuilt = []
        for stream, layout in layouts.items():
            with self._lock:
                stored = sqlite_tiers.stored_layouts(self._conn).get(stream)
            if stored == layout:
                continue
            with self._lock, transaction(self._conn):
                # Read again under the write lock: another process may have rebuilt it meanwhile.
                if sqlite_tiers.stored_layouts(self._conn).get(stream) == layout:
                    continue
                sqlite_tiers.rebuild(self._conn, stream, layout,
                                     lambda st, lo, hi: sqlite_tiers.read_rows(self._conn, "panes", "stream = ?",
                                                                               (st,), lo, hi, None, stream=st),
                                     now_ms, progress=progress)
            rebuilt.append(stream)
        return rebuilt

    def newest_pane_ends(self, stream: str, start_ms: int, end_ms: int) -> list[tuple[dict[str, str], int]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT d.dims, t.newest FROM " + dim_sets.joined(
                    "SELECT stream, dims_id, MAX(end_ms) AS newest FROM panes WHERE stream = ? AND start_ms >= ?"
                    " AND start_ms < ? AND count > 0 GROUP BY stream, dims_id"), (stream, start_ms, end_ms)).fetchall()
        return [(json.loads(dims), end) for dims, end in rows]

    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        with self._lock:
            rows = self._conn.execute(CHANGES_SINCE.replace("%s", "?"), (seq, limit)).fetchall()
        return [Change(*row) for row in rows]

    def watermarks(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT stream, watermark_ms FROM stream_progress WHERE watermark_ms IS NOT NULL"
            ).fetchall()
        return dict(rows)

    def seen_event_ids(self, stream: str, ids: Sequence[str]) -> dict[str, int]:
        with self._lock:
            return event_ids.lookup(self._conn.cursor(), stream, ids, "?")

    def progress(self, pipeline: str, *, row_counts: bool = True) -> PipelineProgress:
        if not row_counts:
            with self._lock, read_snapshot(self._conn):  # one commit's counters, offsets and progress
                return self._progress(self._conn, pipeline, row_counts=False)
        # Counting the panes reads every one (~130 ms at a day of 3 M events): on a connection of its
        # own, so that the queries sharing this store's connection do not wait behind the count.
        conn = open_connection(self.path, synchronous=None, busy_timeout_s=self._busy_timeout_s, existing=True)
        try:
            with read_snapshot(conn):
                return self._progress(conn, pipeline, row_counts=True)
        finally:
            conn.close()

    def _progress(self, conn, pipeline: str, *, row_counts: bool) -> PipelineProgress:
        last_id, last_at, batches, events = batch_totals.read(conn.cursor(), pipeline, "?")
        offsets: dict[str, dict[int, int]] = defaultdict(dict)
        for stream, partition, end in conn.execute(
            "SELECT stream, partition, end_offset FROM pipeline_offsets WHERE pipeline = ?", (pipeline,)
        ):
            offsets[stream][partition] = end
        pane_counts = correction_counts = None
        if row_counts:
            pane_counts = dict(conn.execute("SELECT stream, COUNT(*) FROM panes GROUP BY stream").fetchall())
            correction_counts = dict(conn.execute(
                "SELECT stream, COUNT(*) FROM corrections GROUP BY stream").fetchall())
        by_reason: dict[str, dict[str, int]] = defaultdict(dict)
        for stream, reason, n in conn.execute("SELECT stream, reason, count FROM dead_letter_counts"):
            by_reason[stream][reason] = n
        duplicates = event_ids.duplicate_counts(conn.cursor())
        misses = table_versions.miss_counts(conn.cursor())
        partitions: dict[str, dict[int, PartitionProgress]] = defaultdict(dict)
        for stream, p, mx, read, end, progress_ms, state in conn.execute(
            "SELECT stream, partition, max_event_ms, read_offset, log_end_offset, last_progress_ms, state"
            " FROM partition_watermarks"
        ):
            partitions[stream][p] = PartitionProgress(PartitionMark(mx, read, end, progress_ms), state)
        streams = streams_progress(
            conn.execute(
                "SELECT stream, watermark_ms, max_event_ms, events_aggregated, events_read, events_dead_lettered,"
                " held_by_partition FROM stream_progress"
            ),
            pane_counts=pane_counts, correction_counts=correction_counts, by_reason=by_reason, partitions=partitions,
            duplicates=duplicates, misses=misses)
        return PipelineProgress(pipeline, last_id, last_at, batches, events, dict(offsets), streams)

    def corrections(self, *, stream: str | None = None, start_ms: int | None = None, end_ms: int | None = None,
                    after_id: int = 0, limit: int = 1000, newest_first: bool = False) -> list[Correction]:
        clause, args = where(("id > ?", after_id), ("stream = ?", stream), ("pane_start_ms >= ?", start_ms),
                             ("pane_start_ms < ?", end_ms))
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, stream, pane_start_ms, pane_end_ms, dims, revision_from, revision_to, batch_id,"
                " events_added, at_ms, old, new FROM corrections" + clause
                + f" ORDER BY id {'DESC' if newest_first else 'ASC'} LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [
            Correction(i, s, ps, pe, json.loads(d), rf, rt, b, n, at, json.loads(old), json.loads(new))
            for i, s, ps, pe, d, rf, rt, b, n, at, old, new in rows
        ]

    def count_corrections(self, stream: str, start_ms: int, end_ms: int, after_ms: int,
                          dims: Mapping[str, str]) -> int:
        # Each name goes in as a bound, quoted JSON path ($."name"), not spliced into the SQL.
        tests = "".join(" AND COALESCE(json_extract(dims, ?), '') = ?" for _ in dims)
        paths = [arg for name, want in dims.items() for arg in (f'$."{name}"', want)]
        with self._lock:
            return self._conn.execute(
                "SELECT COUNT(*) FROM corrections WHERE stream = ? AND pane_start_ms >= ? AND pane_start_ms < ?"
                " AND at_ms > ?" + tests, (stream, start_ms, end_ms, after_ms, *paths)).fetchone()[0]

    def max_correction_id(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM corrections").fetchone()[0]

    def dead_letters(self, *, stream: str | None = None, reason: str | None = None,
                     limit: int = 1000) -> list[StoredDeadLetter]:
        clause, args = where(("stream = ?", stream), ("reason = ?", reason))
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, pipeline, batch_id, at_ms, stream, partition, \"offset\", reason, event_time_ms,"
                " ingest_time_ms, error, dims, clock_correction_ms FROM dead_letters"
                + clause + " ORDER BY id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [
            StoredDeadLetter(i, pl, b, at, DeadLetter(s, p, o, r, et, it, err, None if d is None else json.loads(d), cc))
            for i, pl, b, at, s, p, o, r, et, it, err, d, cc in rows
        ]

    def device_clocks(self, stream: str) -> dict[str, DeviceClock]:
        with self._lock:
            rows = self._conn.execute("SELECT device, buckets, offset_ms, correction_ms, newest_ms FROM device_clocks"
                                      " WHERE stream = ?", (stream,)).fetchall()
        return {device: device_clock(*rest) for device, *rest in rows}

    def join_state(self, join: str, keys: Sequence[str], expire_through_ms: int | None) -> join_store.JoinState:
        with self._lock:
            return join_store.lookup(self._conn.cursor(), join, keys, expire_through_ms, "?")

    def join_sizes(self) -> dict[str, join_store.JoinSizes]:
        with self._lock:
            return join_store.sizes(self._conn.cursor())

    def session_state(self, stream: str, keys: Sequence[str] | pa.Array | pa.ChunkedArray,
                      due_through_ms: int | None) -> Sequence[session_store.Session]:
        with self._lock:
            return session_store.lookup(self._conn.cursor(), stream, keys, due_through_ms, "?")

    def session_sizes(self) -> dict[str, int]:
        with self._lock:
            return session_store.sizes(self._conn.cursor())

    def pattern_state(self, pattern: str, keys: Sequence[str], due_through_ms: int | None,
                      history_keys: Sequence[str] = ()) -> pattern_store.PatternLoad:
        with self._lock:
            return pattern_store.lookup(self._conn.cursor(), pattern, keys, due_through_ms, "?", history_keys)

    def pattern_sizes(self) -> dict[str, pattern_store.PatternSizes]:
        with self._lock:
            return pattern_store.sizes(self._conn.cursor())

    def pattern_matches(self, pattern: str, **filters) -> list[pattern_store.StoredMatch]:
        with self._lock:
            return pattern_store.matches_page(self._conn.cursor(), pattern, "?", **filters)

    def pattern_newest_match_id(self, pattern: str) -> int | None:
        with self._lock:
            return pattern_store.newest_match_id(self._conn.cursor(), pattern, "?")

    def pattern_late(self, pattern: str, limit: int = 100) -> list[tuple]:
        with self._lock:
            return pattern_store.late_events(self._conn.cursor(), pattern, "?", limit)

    def table_row(self, stream: str, key: str) -> table_state.TableRow | None:
        with self._lock:
            found = self._conn.execute(table_state.row_query("?"), (stream, key)).fetchone()
        return None if found is None else table_state.to_row(found)

    def seed_table_versions(self, versions: Mapping[str, Sequence[tuple[str, table_versions.TableVersion]]]) -> None:
        with self._lock, transaction(self._conn):
            table_versions.apply(self._conn.cursor(), versions, table_versions.SEEDED_BATCH_ID, "?")

    def table_versions(self, stream: str) -> list[tuple[str, table_versions.TableVersion]]:
        with self._lock:
            found = self._conn.execute(table_versions.versions_query("?"), (stream,)).fetchall()
        return [table_versions.to_version(r) for r in found]

    def table_rows(self, stream: str, *, after: str | None = None, limit: int = 100) -> list[table_state.TableRow]:
        with self._lock:
            found = self._conn.execute(table_state.page_query("?", after),
                                       (stream, table_state.page_start(after), limit)).fetchall()
        return [table_state.to_row(r) for r in found]

    def table_rows_by_key(self, stream: str, keys: Sequence[str]) -> dict[str, dict]:
        with self._lock:
            return view_state.table_rows_of(self._conn.cursor(), stream, keys, "?")

    def view_links(self, view: str, left_keys: Sequence[str], right_keys: Sequence[str]) -> list[view_state.ViewLink]:
        with self._lock:
            return view_state.lookup(self._conn.cursor(), view, left_keys, right_keys, "?")

    def view_definition(self, view: str) -> str | None:
        with self._lock:
            return view_state.definition(self._conn.cursor(), view, "?")

    def drop_view(self, view: str) -> None:
        with self._lock, transaction(self._conn) as conn:
            view_state.drop(conn.cursor(), view, "?")

    def view_row(self, view: str, key: str) -> table_state.TableRow | None:
        with self._lock:
            found = self._conn.execute(view_state.row_query("?"), (view, key)).fetchone()
        return None if found is None else view_state.to_row(found)

    def view_rows(self, view: str, *, after: str | None = None, limit: int = 100) -> list[table_state.TableRow]:
        with self._lock:
            found = self._conn.execute(view_state.page_query("?", after),
                                       (view, table_state.page_start(after), limit)).fetchall()
        return [view_state.to_row(r) for r in found]

    def view_changes(self, view: str, *, after: str = "", limit: int = 100) -> list[view_state.ViewChangeRow]:
        with self._lock:
            return view_state.read_changes(self._conn.cursor(), view, after, limit, "?")

    def dead_letter_counts(self, start_ms: int, end_ms: int) -> dict[str, int]:
        with self._lock:
            return dead_letter_counts.counts(self._conn.execute(
                dead_letter_counts.DEAD_LETTER_COUNTS.replace("%s", "?"), (start_ms, end_ms)).fetchall())

    def side_db(self) -> SqliteDb:
        # A connection of its own to the file, set up as the panes' is.
        return SqliteDb(open_connection(self.path, synchronous=self._synchronous, busy_timeout_s=self._busy_timeout_s))

    def bloom_reader(self) -> bloom_store.BloomReader:
        # Its own connection to the file, made once (WAL: it sees each batch as committed).
        with self._lock:
            if self._bloom is None:
                self._bloom = bloom_store.BloomStore(self.path)
            return self._bloom

    @property
    def checkpoints_apart(self) -> BackgroundCheckpoints | None:
        """The thread checkpointing this store's log, once `checkpoint_apart` started it."""
        return self._checkpoints

    def checkpoint_apart(self) -> None:
        """The write-ahead log copied into the file by a thread of its own, not by the commits
        (store/wal_checkpoints.py): a pipeline's store, whose batches' commits then return sooner.
        The thread stops when the store closes, or is collected unclosed (a pipeline rebuilt)."""
        with self._lock:
            if self._checkpoints is None:
                self._conn.execute(f"PRAGMA wal_autocheckpoint = {SAFETY_NET_PAGES}")
                self._checkpoints = BackgroundCheckpoints(self.path, busy_timeout_s=self._busy_timeout_s)
                self._stop_checkpoints = weakref.finalize(self, self._checkpoints.close)

    def close(self) -> None:
        with self._lock:
            if self._checkpoints is not None:
                self._stop_checkpoints()
                self._checkpoints = None
            self._conn.close()
            if self._bloom is not None:
                self._bloom.close()


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
