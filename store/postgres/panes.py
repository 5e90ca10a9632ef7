"""The serving store on PostgreSQL: what store/sqlite.py keeps in a file, in tables several
processes (pipeline driver, API replicas) share.

Exactly-once as in SQLite: a batch's pane merges, change-feed rows, corrections, dead
letters, progress, offsets, tier rows, Bloom bits and its batch id are written in one
transaction, and a batch id already present is skipped. What the commit decides comes from
store/commit_plan.py, the same code the SQLite store runs.

Commits take a transaction-level advisory lock (schema.COMMIT_LOCK) first: they are
serialized, so the state read before planning is the state the plan is written over, and
change-feed sequence numbers become visible in order (a reader tailing `seq > n` never
sees 12 committed while 11 is still in flight). They increase, consecutive within a batch;
a rolled-back commit leaves a gap (an identity's sequence does not roll back). Reads take a
pooled connection each and see the last committed batch."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import psycopg
import pyarrow as pa
from psycopg_pool import ConnectionPool

from store.retention_clock import recorded_commit_ms
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
from store.bloom import BloomReader
from store.gc_pause import paused_gc
from store import batch_totals, dead_letter_counts, dim_sets, event_ids, tier_fold_store, tier_retention
from store import joins as join_store
from store import patterns as pattern_store
from store import sessions as session_store
from store.commit_plan import (
    CORRECTIONS_DROPPED_PER_COMMIT,
    DROP_DUE_CORRECTIONS,
    DROP_OLD_CHANGES,
    StreamState,
    batch_newest,
    bloom_horizons,
    change_feed_horizon,
    merged_tier_rows,
    pane_ids,
    pane_keys,
    pane_rows,
    plan_batch,
    rebuild_chunks,
    rebuilt_rows,
    rebuilt_rows_to_save,
    retention_horizons,
    tier_row_keys,
    tiers_kept_by_rebuild,
    with_removed_streams,
)
from store.connection import where as where_clause
from store import view_state
from store import table_state, table_versions
from store.device_clocks import device_clock, device_clock_rows
from store.panes import Pane, dims_key
from store.postgres import rows
from store.postgres.db import PostgresDb, snapshot
from store.postgres.notify import ChangeListener, channel_for, notify_commit
from store.bloom import drop_expired as drop_expired_bloom
from store.postgres.bloom import PostgresBloomReader, apply_bloom_commit
from store.postgres.schema import COMMIT_LOCK, SCHEMA_LOCK, ensure_schema
from store import session_layout
from store.session_layout import LayoutChooser
from store.switch import check_definitions
from store.rollup import BucketStats, SketchRow
from store.tier_rebuild import drop_rows_to_rebuild
from store.tiers import ALL_DIMS, TierDelta, TierKey, TierLayout
from store.watermarks import PartitionMark


def open_pool(dsn: str, *, max_size: int = 8, connect_timeout_s: float = 10.0) -> ConnectionPool:
    """A pool of autocommit connections (transactions are explicit); fails fast, with the
    server's own message, when the DSN does not reach a server."""
    psycopg.connect(dsn, connect_timeout=int(connect_timeout_s)).close()
    pool = ConnectionPool(dsn, min_size=1, max_size=max_size, kwargs={"autocommit": True}, open=True,
                          name="sketchboard-store")
    pool.wait(timeout=connect_timeout_s)
    return pool


def _where(*conditions: tuple[str, object]) -> tuple[str, list]:
    clause, args = where_clause(*conditions)
    return clause.replace("?", "%s"), args


class PostgresPaneStore(PaneStore):
    def __init__(self, dsn: str, *, pool_size: int = 8):
        self.dsn = dsn
        self._pool = open_pool(dsn, max_size=pool_size)
        self._session_layouts = LayoutChooser(session_layout.POSTGRES)  # each stream's session layout, reckoned
        with self._pool.connection() as conn:
            ensure_schema(conn, "the PostgreSQL store")
            # Commits NOTIFY this channel: API replicas on this schema wake on it (store/postgres/notify.py).
            self.channel = channel_for(conn.execute("SELECT current_schema()").fetchone()[0])

    # -- writing ------------------------------------------------------------------------

    def commit_batch(self, commit: BatchCommit, *, lateness_ms: Mapping[str, int], now_ms: int,
                     retention_ms: Mapping[str, int] | None = None,
                     idle_timeout_ms: Mapping[str, int] | None = None,
                     membership_bucket_ms: Mapping[str, int] | None = None) -> CommitResult:
        # store/gc_pause.py: the collector is about half a backfill commit's CPU otherwise.
        with paused_gc(), self._pool.connection() as conn:
            rows.ensure_staging(conn)  # before the transaction: a rollback does not take them away
            with conn.transaction(), dim_sets.kept(conn):  # each dimension text looked up once
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMMIT_LOCK,))
                if conn.execute("SELECT 1 FROM batches WHERE pipeline = %s AND batch_id = %s",
                                (commit.pipeline, commit.batch_id)).fetchone():
                    return CommitResult(committed=False)
                # Fenced by a switch (store/switch.py).
                check_definitions(conn, commit.definition_versions, commit.pipeline)
                return self._commit_locked(conn, commit, lateness_ms, now_ms, retention_ms or {},
                                           idle_timeout_ms or {}, membership_bucket_ms or {})

    def _commit_locked(self, conn: psycopg.Connection, commit: BatchCommit, lateness_ms: Mapping[str, int],
                       now_ms: int, retention_ms: Mapping[str, int], idle_timeout_ms: Mapping[str, int],
                       membership_bucket_ms: Mapping[str, int]) -> CommitResult:
        marks: dict[str, dict[int, PartitionMark]] = defaultdict(dict)
        for stream, p, mx, read, end, progress in conn.execute(
                "SELECT stream, partition, max_event_ms, read_offset, log_end_offset, last_progress_ms"
                " FROM partition_watermarks"):
            marks[stream][p] = PartitionMark(mx, read, end, progress)
        streams_before = {s: StreamState(wm, mx, marks.get(s, {})) for s, wm, mx in conn.execute(
            "SELECT stream, watermark_ms, max_event_ms FROM stream_progress")}
        keys = pane_keys(commit)  # each partial's dimension text, once for the load and the plan
        stored = rows.load(conn, "panes", rows.PANE_KEY, pane_ids(commit, keys))
        layouts = _layouts(conn)
        with conn.cursor() as cur:
            # The coarser tiers' panes the streams' time passes (store/tier_fold_store.py), read before the write.
            fold = tier_fold_store.plan_fold(
                batch_newest(commit, streams_before), layouts, tier_fold_store.stored_clocks(cur), lateness_ms,
                lambda stream, lo, hi, keep: rows.read(conn, "panes", "stream = %s", (stream,), lo, hi, None,
                                                       stream=stream, keep=keep),
                clock_ms=commit.batch_now_ms)
        plan = plan_batch(commit, stored, streams_before, lateness_ms, layouts, now_ms=now_ms,
                          idle_timeout_ms=idle_timeout_ms, keys=keys, folds=fold.split)
        written = pane_rows(plan)
        stored_keys = rows.save_rows(conn, "panes", rows.PANE_KEY,
                                     [((stream, start, key), end, count, text, revision, blob)
                                      for stream, start, end, key, count, text, revision, blob, _, _ in written],
                                     now_ms, commit.batch_id)
        first_seq = last_seq = None
        with conn.cursor() as cur:
            # Each correction's id, in the rows' order (a pane two partials of the batch merged into
            # is written twice, each write with its own correction).
            correction_ids = iter(_save_corrections(conn, cur, [row for row in written if row[-1] is not None],
                                                    commit, now_ms))
            changes = []
            for stream, start, end, key, _, _, revision, _, added, c in written:
                correction_id = next(correction_ids) if c is not None else None
                changes.append((stream, start, stored_keys[(stream, start, key)][-1], revision, commit.batch_id,
                                added, now_ms, correction_id))
            if changes:
                rows.copy_rows(conn, "changes", ("stream", "start_ms", "dims_id", "revision", "batch_id", "count_added",
                                                 "at_ms", "correction_id"), changes)
                # The batch's rows took consecutive numbers: commits hold COMMIT_LOCK, nothing else inserts
                # changes meanwhile, and the identity's sequence hands them out one by one (no cache). Across
                # batches the numbers only increase: a sequence is not transactional, so a commit that rolls
                # back after this (a lock timeout, a refused value) leaves a gap before the next batch's.
                last_seq = cur.execute("SELECT currval(pg_get_serial_sequence('changes', 'seq'))").fetchone()[0]
                first_seq = last_seq - len(changes) + 1
            if plan.tier_deltas:
                _apply_deltas(conn, plan.tier_deltas, now_ms, commit.batch_id)
            if fold.deltas:
                _apply_deltas(conn, fold.deltas, now_ms, commit.batch_id)
            moved = {**fold.moved, **tier_fold_store.first_points(cur, "%s", fold.unset, layouts)}
            if moved:
                tier_fold_store.save_points(cur, "%s", moved)
            if plan.dead_counts:
                cur.executemany(
                    "INSERT INTO dead_letter_counts (stream, reason, count) VALUES (%s, %s, %s)"
                    " ON CONFLICT (stream, reason) DO UPDATE SET count = dead_letter_counts.count + excluded.count",
                    [(stream, reason, n) for (stream, reason), n in plan.dead_counts.items()])
            if commit.dead_letters:
                cur.executemany(
                    "INSERT INTO dead_letters (pipeline, batch_id, stream, partition, \"offset\", reason, event_time_ms,"
                    " ingest_time_ms, error, dims, at_ms, clock_correction_ms)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [(commit.pipeline, commit.batch_id, d.stream, d.partition, d.offset, d.reason, d.event_time_ms,
                      d.ingest_time_ms, d.error, None if d.dims is None else dims_key(d.dims), now_ms,
                      d.clock_correction_ms) for d in commit.dead_letters])
            forget, keep = device_clock_rows(commit)
            if forget:
                cur.executemany("DELETE FROM device_clocks WHERE stream = %s AND device = %s", forget)
            if keep:
                cur.executemany(
                    "INSERT INTO device_clocks (stream, device, buckets, offset_ms, correction_ms, newest_ms,"
                    " updated_at_ms) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, device) DO UPDATE SET"
                    " buckets = excluded.buckets, offset_ms = excluded.offset_ms,"
                    " correction_ms = excluded.correction_ms, newest_ms = excluded.newest_ms,"
                    " updated_at_ms = excluded.updated_at_ms", [(*row, now_ms) for row in keep])
            if plan.streams:
                cur.executemany(
                    "INSERT INTO stream_progress (stream, watermark_ms, max_event_ms, events_aggregated, events_read,"
                    " events_dead_lettered, held_by_partition) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (stream) DO UPDATE SET"
                    " watermark_ms = excluded.watermark_ms, max_event_ms = excluded.max_event_ms,"
                    " events_aggregated = stream_progress.events_aggregated + excluded.events_aggregated,"
                    " events_read = stream_progress.events_read + excluded.events_read,"
                    " events_dead_lettered = stream_progress.events_dead_lettered + excluded.events_dead_lettered,"
                    " held_by_partition = excluded.held_by_partition",
                    [(u.stream, u.watermark_ms, u.max_event_ms, u.aggregated, u.read, u.dead_lettered,
                      u.held_by_partition) for u in plan.streams])
            partition_rows = [(u.stream, p, m.max_event_ms, m.read_offset, m.log_end_offset, m.last_progress_ms, state)
                              for u in plan.streams for p, (m, state) in u.partitions.items()]
            if partition_rows:
                cur.executemany(
                    "INSERT INTO partition_watermarks (stream, partition, max_event_ms, read_offset, log_end_offset,"
                    " last_progress_ms, state) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, partition)"
                    " DO UPDATE SET max_event_ms = excluded.max_event_ms, read_offset = excluded.read_offset,"
                    " log_end_offset = excluded.log_end_offset, last_progress_ms = excluded.last_progress_ms,"
                    " state = excluded.state", partition_rows)
            offsets = [(commit.pipeline, stream, p, o) for stream, parts in commit.end_offsets.items()
                       for p, o in parts.items()]
            if offsets:
                cur.executemany(
                    "INSERT INTO pipeline_offsets (pipeline, stream, partition, end_offset) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (pipeline, stream, partition) DO UPDATE SET end_offset = excluded.end_offset",
                    offsets)
        if commit.table_changes:
            with conn.cursor() as cur:
                table_state.apply(cur, commit.table_changes, commit.batch_id, now_ms, "%s")
        if commit.views:
            with conn.cursor() as cur:
                view_state.apply(cur, commit.views, commit.batch_id, now_ms, "%s")
        if commit.enrichment is not None:
            with conn.cursor() as cur:
                table_versions.apply_commit(cur, commit.enrichment, commit.batch_id, "%s")
        if commit.bloom is not None:
            apply_bloom_commit(conn, commit.bloom, commit.batch_id, now_ms)
        if commit.event_ids is not None:
            with conn.cursor() as cur:
                event_ids.apply(cur, commit.event_ids, end_offsets=commit.end_offsets,
                                log_end_offsets=commit.log_end_offsets, placeholder="%s")
        if commit.joins:
            with conn.cursor() as cur:
                join_store.apply(cur, commit.joins, "%s", upsert=lambda table, columns, events: rows.upsert(
                    conn, table, columns, join_store.EVENT_KEY, ("matched",), events))
        if commit.patterns:
            with conn.cursor() as cur:
                pattern_store.apply(cur, commit.patterns, commit.batch_id, now_ms, "%s")
        if commit.sessions:
            with conn.cursor() as cur:
                session_store.apply(cur, commit.sessions, "%s", self._session_layouts)
        _prune(conn, commit, retention_ms, membership_bucket_ms, layouts)
        committed_at_ms = recorded_commit_ms(now_ms, commit.batch_now_ms)
        with conn.cursor() as cur:
            batch_totals.add(cur, commit.pipeline, commit.batch_id, committed_at_ms, commit.events_read, "%s",
                             "GREATEST")
        conn.execute(
            "INSERT INTO batches (pipeline, batch_id, committed_at_ms, events_read, panes_new, panes_updated)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (commit.pipeline, commit.batch_id, committed_at_ms, commit.events_read, plan.panes_new, plan.panes_updated))
        notify_commit(conn, self.channel, last_seq)  # delivered when this transaction commits
        return CommitResult(True, plan.panes_new, plan.panes_updated, first_seq, last_seq, plan.corrections,
                            len(commit.dead_letters))

    def configure_tiers(self, layouts: Mapping[str, TierLayout | None], *, now_ms: int,
                        progress: Callable[[str], None] | None = None) -> list[str]:
        rebuilt = []
        for stream, layout in layouts.items():
            if self.tier_layout(stream) == layout:
                continue
            with self._pool.connection() as conn:
                rows.ensure_staging(conn)  # before the transaction, as a commit's
                with conn.transaction():
                    # Under the commit lock: no batch adds panes while the tiers are rolled up from them,
                    # and another process that rebuilt meanwhile is seen.
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMMIT_LOCK,))
                    if _layouts(conn).get(stream) == layout:
                        continue
                    _rebuild(conn, stream, layout, now_ms, progress)
            rebuilt.append(stream)
        return rebuilt

    # -- reading ------------------------------------------------------------------------

    def _one(self, sql: str, args: Sequence = ()) -> tuple | None:
        with self._pool.connection() as conn:
            return conn.execute(sql, args).fetchone()

    def _all(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with self._pool.connection() as conn:
            return conn.execute(sql, args).fetchall()

    def last_batch_id(self, pipeline: str) -> int | None:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return batch_totals.newest(cur, pipeline, "%s")

    def last_commit_ms(self, pipeline: str) -> int | None:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return batch_totals.read(cur, pipeline, "%s").last_commit_ms

    def newest_commit_ms(self) -> int | None:
        from store.retention_clock import NEWEST_COMMIT_SQL

        return self._one(NEWEST_COMMIT_SQL)[0]

    def seen_event_ids(self, stream: str, ids: Sequence[str]) -> dict[str, int]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return event_ids.lookup(cur, stream, ids, "%s")

    def read_panes(self, stream: str, start_ms: int, end_ms: int, *, value_field: str | None = None,
                   distinct_field: str | None = None, with_sketches: bool = False) -> list[Pane]:
        from store import row_codec

        wanted = row_codec.wanted_sketches(with_sketches, value_field, distinct_field)
        with self._pool.connection() as conn:
            return rows.read(conn, "panes", "stream = %s", (stream,), start_ms, end_ms, wanted, stream=stream)

    def tier_layout(self, stream: str) -> TierLayout | None:
        row = self._one("SELECT layout FROM tier_layouts WHERE stream = %s", (stream,))
        return None if row is None else TierLayout.from_json(row[0])

    def tier_fold_clock(self, stream: str) -> int | None:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return tier_fold_store.stored_clock(cur, "%s", stream)

    def read_tier(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *,
                  value_field: str | None = None, distinct_field: str | None = None,
                  with_sketches: bool = False, pane_ms: int | None = None, with_stats: bool = True) -> list[Pane]:
        from store import row_codec

        wanted = row_codec.wanted_sketches(with_sketches, value_field, distinct_field)
        table, where, args = _tier_table(stream, granule_ms, proj, pane_ms)
        with self._pool.connection() as conn:
            return rows.read(conn, table, where, args, start_ms, end_ms, wanted, stats=with_stats, stream=stream)

    def read_tier_sketch(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *,
                         field: str, kind: str, pane_ms: int | None = None) -> list[SketchRow]:
        from store import row_codec

        table, where, args = _tier_table(stream, granule_ms, proj, pane_ms)
        with self._pool.connection() as conn:
            rows = conn.execute(row_codec.sketch_rows_select(table, f"{where} AND start_ms >= %s AND start_ms < %s"),
                                (*args, start_ms, end_ms)).fetchall()
        return row_codec.sketch_rows(rows, field, kind)

    def aggregate_tier(self, stream: str, granule_ms: int, proj: str, start_ms: int, end_ms: int, *, origin_ms: int,
                       bucket_ms: int, group_by: Sequence[str] = (), filters: Mapping[str, str] | None = None,
                       value_field: str | None = None, pane_ms: int | None = None) -> list[BucketStats]:
        table, where, args = _tier_table(stream, granule_ms, proj, pane_ms)
        with self._pool.connection() as conn:
            return rows.aggregate(conn, table, where, args, start_ms=start_ms, end_ms=end_ms, origin_ms=origin_ms,
                                  bucket_ms=bucket_ms, group_by=group_by, filters=filters or {},
                                  value_field=value_field,
                                  one_row_per_bucket=bucket_ms == granule_ms and origin_ms % granule_ms == 0)

    def newest_pane_ends(self, stream: str, start_ms: int, end_ms: int) -> list[tuple[dict[str, str], int]]:
        found = self._all(
            "SELECT d.dims, t.newest FROM " + dim_sets.joined(
                "SELECT stream, dims_id, MAX(end_ms) AS newest FROM panes WHERE stream = %s AND start_ms >= %s"
                " AND start_ms < %s AND count > 0 GROUP BY stream, dims_id"), (stream, start_ms, end_ms))
        return [(json.loads(dims), end) for dims, end in found]

    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        found = self._all(dim_sets.CHANGES_SINCE, (seq, limit))
        return [Change(*row) for row in found]

    def watermarks(self) -> dict[str, int]:
        return dict(self._all("SELECT stream, watermark_ms FROM stream_progress WHERE watermark_ms IS NOT NULL"))

    def progress(self, pipeline: str, *, row_counts: bool = True) -> PipelineProgress:
        with self._pool.connection() as conn, snapshot(conn):  # one snapshot of every table
            with conn.cursor() as cur:
                last_id, last_at, batches, events = batch_totals.read(cur, pipeline, "%s")
            offsets: dict[str, dict[int, int]] = defaultdict(dict)
            for stream, partition, end in conn.execute(
                    "SELECT stream, partition, end_offset FROM pipeline_offsets WHERE pipeline = %s", (pipeline,)):
                offsets[stream][partition] = end
            pane_counts = correction_counts = None
            if row_counts:  # a scan of every pane: asked by GET /api/v1/pipeline only (PaneStore.progress)
                pane_counts = dict(conn.execute("SELECT stream, COUNT(*) FROM panes GROUP BY stream").fetchall())
                correction_counts = dict(conn.execute(
                    "SELECT stream, COUNT(*) FROM corrections GROUP BY stream").fetchall())
            by_reason: dict[str, dict[str, int]] = defaultdict(dict)
            for stream, reason, n in conn.execute("SELECT stream, reason, count FROM dead_letter_counts"):
                by_reason[stream][reason] = n
            with conn.cursor() as cur:
                duplicates = event_ids.duplicate_counts(cur)
                misses = table_versions.miss_counts(cur)
            partitions: dict[str, dict[int, PartitionProgress]] = defaultdict(dict)
            for stream, p, mx, read, end, progress_ms, state in conn.execute(
                    "SELECT stream, partition, max_event_ms, read_offset, log_end_offset, last_progress_ms, state"
                    " FROM partition_watermarks"):
                partitions[stream][p] = PartitionProgress(PartitionMark(mx, read, end, progress_ms), state)
            streams = streams_progress(
                conn.execute(
                    "SELECT stream, watermark_ms, max_event_ms, events_aggregated, events_read, events_dead_lettered,"
                    " held_by_partition FROM stream_progress"),
                pane_counts=pane_counts, correction_counts=correction_counts, by_reason=by_reason, partitions=partitions,
                duplicates=duplicates, misses=misses)
        return PipelineProgress(pipeline, last_id, last_at, batches, events, dict(offsets), streams)

    def corrections(self, *, stream: str | None = None, start_ms: int | None = None, end_ms: int | None = None,
                    after_id: int = 0, limit: int = 1000, newest_first: bool = False) -> list[Correction]:
        clause, args = _where(("id > ?", after_id), ("stream = ?", stream), ("pane_start_ms >= ?", start_ms),
                              ("pane_start_ms < ?", end_ms))
        found = self._all(
            "SELECT id, stream, pane_start_ms, pane_end_ms, dims, revision_from, revision_to, batch_id,"
            " events_added, at_ms, old, new FROM corrections" + clause
            + f" ORDER BY id {'DESC' if newest_first else 'ASC'} LIMIT %s", (*args, limit))
        return [Correction(i, s, ps, pe, json.loads(d), rf, rt, b, n, at, json.loads(old), json.loads(new))
                for i, s, ps, pe, d, rf, rt, b, n, at, old, new in found]

    def count_corrections(self, stream: str, start_ms: int, end_ms: int, after_ms: int,
                          dims: Mapping[str, str]) -> int:
        tests = "".join(" AND COALESCE(dims::jsonb ->> %s, '') = %s" for _ in dims)
        return self._one(
            "SELECT COUNT(*) FROM corrections WHERE stream = %s AND pane_start_ms >= %s AND pane_start_ms < %s"
            " AND at_ms > %s" + tests,
            (stream, start_ms, end_ms, after_ms, *(arg for item in dims.items() for arg in item)))[0]

    def max_correction_id(self) -> int:
        return self._one("SELECT COALESCE(MAX(id), 0) FROM corrections")[0]

    def dead_letters(self, *, stream: str | None = None, reason: str | None = None,
                     limit: int = 1000) -> list[StoredDeadLetter]:
        clause, args = _where(("stream = ?", stream), ("reason = ?", reason))
        found = self._all(
            "SELECT id, pipeline, batch_id, at_ms, stream, partition, \"offset\", reason, event_time_ms,"
            " ingest_time_ms, error, dims, clock_correction_ms FROM dead_letters" + clause
            + " ORDER BY id DESC LIMIT %s", (*args, limit))
        return [StoredDeadLetter(i, pl, b, at, DeadLetter(s, p, o, r, et, it, err, None if d is None else json.loads(d),
                                                          cc))
                for i, pl, b, at, s, p, o, r, et, it, err, d, cc in found]

    def device_clocks(self, stream: str) -> dict[str, DeviceClock]:
        rows = self._all("SELECT device, buckets, offset_ms, correction_ms, newest_ms FROM device_clocks"
                         " WHERE stream = %s", (stream,))
        return {device: device_clock(*rest) for device, *rest in rows}

    def join_state(self, join: str, keys: Sequence[str], expire_through_ms: int | None) -> join_store.JoinState:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return join_store.lookup(cur, join, keys, expire_through_ms, "%s")

    def join_sizes(self) -> dict[str, join_store.JoinSizes]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return join_store.sizes(cur)

    def session_state(self, stream: str, keys: Sequence[str] | pa.Array | pa.ChunkedArray,
                      due_through_ms: int | None) -> Sequence[session_store.Session]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return session_store.lookup(cur, stream, keys, due_through_ms, "%s")

    def session_sizes(self) -> dict[str, int]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return session_store.sizes(cur)

    def pattern_state(self, pattern: str, keys: Sequence[str], due_through_ms: int | None,
                      history_keys: Sequence[str] = ()) -> pattern_store.PatternLoad:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return pattern_store.lookup(cur, pattern, keys, due_through_ms, "%s", history_keys)

    def pattern_sizes(self) -> dict[str, pattern_store.PatternSizes]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return pattern_store.sizes(cur)

    def pattern_matches(self, pattern: str, **filters) -> list[pattern_store.StoredMatch]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return pattern_store.matches_page(cur, pattern, "%s", **filters)

    def pattern_newest_match_id(self, pattern: str) -> int | None:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return pattern_store.newest_match_id(cur, pattern, "%s")

    def pattern_late(self, pattern: str, limit: int = 100) -> list[tuple]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return pattern_store.late_events(cur, pattern, "%s", limit)

    def table_row(self, stream: str, key: str) -> table_state.TableRow | None:
        found = self._one(table_state.row_query("%s"), (stream, key))
        return None if found is None else table_state.to_row(found)

    def seed_table_versions(self, versions: Mapping[str, Sequence[tuple[str, table_versions.TableVersion]]]) -> None:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            table_versions.apply(cur, versions, table_versions.SEEDED_BATCH_ID, "%s")

    def table_versions(self, stream: str) -> list[tuple[str, table_versions.TableVersion]]:
        return [table_versions.to_version(r) for r in self._all(table_versions.versions_query("%s"), (stream,))]

    def table_rows(self, stream: str, *, after: str | None = None, limit: int = 100) -> list[table_state.TableRow]:
        return [table_state.to_row(r) for r in self._all(table_state.page_query("%s", after),
                                                         (stream, table_state.page_start(after), limit))]

    def table_rows_by_key(self, stream: str, keys: Sequence[str]) -> dict[str, dict]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return view_state.table_rows_of(cur, stream, keys, "%s")

    def view_links(self, view: str, left_keys: Sequence[str], right_keys: Sequence[str]) -> list[view_state.ViewLink]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return view_state.lookup(cur, view, left_keys, right_keys, "%s")

    def view_definition(self, view: str) -> str | None:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return view_state.definition(cur, view, "%s")

    def drop_view(self, view: str) -> None:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (COMMIT_LOCK,))
            view_state.drop(cur, view, "%s")

    def view_row(self, view: str, key: str) -> table_state.TableRow | None:
        found = self._one(view_state.row_query("%s"), (view, key))
        return None if found is None else view_state.to_row(found)

    def view_rows(self, view: str, *, after: str | None = None, limit: int = 100) -> list[table_state.TableRow]:
        return [view_state.to_row(r) for r in self._all(view_state.page_query("%s", after),
                                                        (view, table_state.page_start(after), limit))]

    def view_changes(self, view: str, *, after: str = "", limit: int = 100) -> list[view_state.ViewChangeRow]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            return view_state.read_changes(cur, view, after, limit, "%s")

    def dead_letter_counts(self, start_ms: int, end_ms: int) -> dict[str, int]:
        return dead_letter_counts.counts(self._all(dead_letter_counts.DEAD_LETTER_COUNTS, (start_ms, end_ms)))

    def side_db(self) -> PostgresDb:
        return PostgresDb(self._pool)

    def bloom_reader(self) -> BloomReader:
        return PostgresBloomReader(self._pool)

    def change_signal(self) -> ChangeListener:
        return ChangeListener(self.dsn, self.channel)

    @property
    def closed(self) -> bool:
        return self._pool.closed

    def close(self) -> None:
        self._pool.close()


def _save_corrections(conn: psycopg.Connection, cur: psycopg.Cursor, corrected: Sequence[tuple], commit: BatchCommit,
                      now_ms: int) -> list[int]:
    """The ids of the batch's corrections (pane_rows' rows with one), saved: the ids taken from the
    table's sequence in one round trip, then one COPY. An INSERT ... RETURNING each took a round trip
    a correction, and the demo's whole traffic on PostgreSQL corrects ~100 panes a batch (mobile_app's
    late events; p90 ~260; bench.pg_bulk_writes). Ids in the rows' order, as one INSERT after the
    other gave them (commits hold COMMIT_LOCK: nothing else takes ids meanwhile)."""
    if not corrected:
        return []
    ids = sorted(row[0] for row in cur.execute(
        "SELECT nextval(pg_get_serial_sequence('corrections', 'id')) FROM generate_series(1, %s)",
        (len(corrected),)).fetchall())
    rows.copy_rows(conn, "corrections", CORRECTION_COLUMNS, [
        (i, stream, start, end, key, c.revision_from, c.revision_to, commit.pipeline, commit.batch_id, added, now_ms,
         _json(c.old), _json(c.new))
        for i, (stream, start, end, key, _, _, _, _, added, c) in zip(ids, corrected, strict=True)])
    return ids


CORRECTION_COLUMNS = ("id", "stream", "pane_start_ms", "pane_end_ms", "dims", "revision_from", "revision_to",
                      "pipeline", "batch_id", "events_added", "at_ms", "old", "new")


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _layouts(conn: psycopg.Connection) -> dict[str, TierLayout]:
    return {stream: TierLayout.from_json(text) for stream, text in conn.execute("SELECT stream, layout FROM tier_layouts")}


def _tier_table(stream: str, granule_ms: int, proj: str, pane_ms: int | None) -> tuple[str, str, tuple]:
    """Where a tier's rows are: the panes themselves for the pane granule with all dimensions."""
    if proj == ALL_DIMS and granule_ms == pane_ms:
        return "panes", "stream = %s", (stream,)
    return "tier_rows", "stream = %s AND granule_ms = %s AND proj = %s", (stream, granule_ms, proj)


def _prune(conn: psycopg.Connection, commit: BatchCommit, retention_ms: Mapping[str, int],
           membership_bucket_ms: Mapping[str, int], layouts: Mapping[str, TierLayout]) -> None:
    """Panes (with their corrections), dead letters, Bloom features and tier rows past their
    stream's retention; change records older than the longest retention. A few statements per
    stream and per tier (~150 a commit for the demo's 16 streams), sent in one pipeline: one round
    trip, not one each (~25 ms of a commit, bench.steady_commits, session 92)."""
    with conn.pipeline():
        retention_ms = with_removed_streams(retention_ms, layouts)
        for stream, horizon in retention_horizons(commit.batch_now_ms, retention_ms).items():
            # Only panes wholly before the horizon: every event they could get is dead-lettered.
            conn.execute("DELETE FROM panes WHERE stream = %s AND start_ms < %s AND end_ms <= %s",
                         (stream, horizon, horizon))
            conn.execute("DELETE FROM dead_letters WHERE stream = %s AND at_ms < %s", (stream, horizon))
            # A dropped pane's corrections go with it: kept, a stream with stragglers grew the table by
            # ~140 rows a second at 20 000 events/s of the demo. At most CORRECTIONS_DROPPED_PER_COMMIT a
            # commit: a store from before kept them all, and millions in one commit would hold its writers.
            conn.execute(DROP_DUE_CORRECTIONS, (stream, horizon, horizon, CORRECTIONS_DROPPED_PER_COMMIT))
        with conn.cursor() as cur:
            drop_expired_bloom(cur, bloom_horizons(commit.batch_now_ms, retention_ms, membership_bucket_ms, layouts),
                               "%s")
        feed_horizon = change_feed_horizon(commit.batch_now_ms, retention_ms)
        if feed_horizon is not None:
            conn.execute(DROP_OLD_CHANGES, (feed_horizon,))
        if commit.batch_now_ms is not None:
            for stream, layout in layouts.items():
                tier_retention.drop_expired(conn, "%s", stream, layout, commit.batch_now_ms)


def _apply_deltas(conn: psycopg.Connection, deltas: Mapping[str, Mapping[TierKey, TierDelta]], now_ms: int,
                  batch_id: int) -> None:
    """Merge each stream's deltas into their stored tier rows (creating those that are new): one
    load, one save, for every stream."""
    keys = tier_row_keys(deltas)
    stored = rows.load(conn, "tier_rows", rows.TIER_KEY, list(keys.values()))
    rows.save(conn, "tier_rows", rows.TIER_KEY, merged_tier_rows(deltas, keys, stored), now_ms, batch_id)


def _rebuild(conn: psycopg.Connection, stream: str, layout: TierLayout | None, now_ms: int,
             progress: Callable[[str], None] | None) -> None:
    """Replace a stream's tier rows by ones rolled up from its panes (None: no tiers), keeping the
    rows of a tier the old layout kept too that start before the first pane (history past the
    panes' retention: store.commit_plan.tiers_kept_by_rebuild)."""
    old = _layouts(conn).get(stream)
    conn.execute("DELETE FROM tier_layouts WHERE stream = %s", (stream,))
    with conn.cursor() as cur:  # rolled up from every pane: none is left to fold (store/tier_folds.py)
        tier_fold_store.forget(cur, "%s", stream)
    if layout is None:
        conn.execute("DELETE FROM tier_rows WHERE stream = %s", (stream,))
        return
    first, last = conn.execute("SELECT MIN(start_ms), MAX(start_ms) FROM panes WHERE stream = %s", (stream,)).fetchone()
    kept = tiers_kept_by_rebuild(old, layout)
    drop_rows_to_rebuild(conn, "%s", stream, kept, first)
    done = 0
    if first is not None:
        for lo, hi in rebuild_chunks(first, last, layout):
            panes = rows.read(conn, "panes", "stream = %s", (stream,), lo, hi, None, stream=stream)
            deltas, last_batch = rebuilt_rows(panes, layout)
            rows.save(conn, "tier_rows", rows.TIER_KEY,
                      [((stream, k.granule_ms, k.proj, k.start_ms, k.dims), k.start_ms + k.granule_ms, d.data,
                        d.revision) for k, d in rebuilt_rows_to_save(deltas, kept, first).items()], now_ms, last_batch)
            done += len(panes)
            if progress is not None and panes:
                progress(f"tiers of {stream!r}: {done} panes rolled up (to {hi} ms)")
    conn.execute("INSERT INTO tier_layouts (stream, layout) VALUES (%s, %s)", (stream, layout.to_json()))


__all__ = ["PostgresPaneStore", "SCHEMA_LOCK", "open_pool"]
