"""The CDC follower of one table stream: snapshot, then the changes of a logical replication slot.

- Setup: the publication (FOR TABLE the source) is created when missing, and the slot with the
  built-in `pgoutput` plugin over a replication connection (`replication=database`), whose
  CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT answers the slot's consistent point and a
  snapshot of the database exactly there. The table is read in that snapshot, so every change
  committed before the consistent point is in the rows and every later one comes from the slot:
  nothing is missed or seen twice. The table is read through a server-side cursor and appended
  a chunk (`snapshot_chunk_rows`) at a time, each chunk atomically with a position that says the
  snapshot is not done yet (`snapshot_done` false, the rows so far); the last append adds a
  tombstone for each key the stream held that the table no longer has (a re-snapshot after the
  slot was lost, or after a half-made snapshot) and marks it done. A position whose snapshot is
  not done (a crash between chunks: that exported snapshot is gone with its connection) starts
  the snapshot over with a new slot. Every snapshot first reads what the stream holds (a digest
  per key: changes.row_digest) and appends only the rows it does not hold as they are, so the
  rows a half-made snapshot wrote are not written twice; the keys it wrote that are gone by now
  get tombstones.
- Following: `pg_logical_slot_peek_binary_changes` over an ordinary connection (psycopg 3 has no
  streaming replication protocol) returns whole transactions; those that end past the recorded
  position become upserts and tombstones (ingest/cdc/changes.py; a declared column an update
  left unchanged TOASTed keeps the value the stream's row of the key holds, read from the log
  once per peek for just those keys), appended in one transaction
  of the embedded log together with the new position (EventLog.append_at). Only then is the slot
  advanced (`pg_replication_slot_advance`): a crash in between leaves the slot behind, and the
  next peek's transactions up to the recorded position are skipped. So no change is lost (the
  slot keeps everything past what it was confirmed) nor appended twice (the position, written
  with the append, says what is in the log already), across restarts of either side.
- Errors (PostgreSQL down, a permission, a missing table) are reported in `status()` and the
  follower tries again after a back-off; it never stops the API.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from catalog import StreamDef
from catalog.cdc import publication_name, resolve_dsn, slot_name
from catalog.tables import DELETE, OP_FIELD
from ingest.cdc.changes import ChangeMapper, Transaction, live_after, row_after, row_digest, schema_report, stored_values
from ingest.cdc.pgoutput import Column, Commit, LogicalMessage, decode, lsn_to_int, lsn_to_text
from ingest.log.base import EventLog, RecordTooLarge
from ingest.tables import is_tombstone, tombstone

log = logging.getLogger("sketchboard.cdc")

MAX_BACKOFF_S = 30.0
HEARTBEAT_PREFIX = "sketchboard_cdc_heartbeat"
POSITION_TTL_S = 5.0  # how stale a stopped follower's status may show the position (see _known_position)


def source_id(stream: StreamDef) -> str:
    """The name of the stream's position in the log (EventLog.source_position)."""
    return f"cdc:{stream.name}"


@dataclass
class Position:
    """What the log records with each append of the source (JSON): the LSN every change before
    which is in the log, the slot it came from, and what the snapshot was."""

    lsn: int
    slot: str
    snapshot_lsn: int
    snapshot_rows: int
    snapshot_at_ms: int
    columns: list[str] = field(default_factory=list)  # the table's columns at the snapshot
    # False while the snapshot's chunks are being appended (snapshot_rows: so far); positions
    # written before snapshots were chunked have no such field: they were whole.
    snapshot_done: bool = True

    def dump(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def load(cls, text: str | None) -> Position | None:
        return None if text is None else cls(**json.loads(text))


class CdcFollower:
    """Follows one PostgreSQL table into one table stream (`stream.source`)."""

    def __init__(self, stream: StreamDef, event_log: EventLog, *, clock: Callable[[], float] = time.time,
                 env=None, after_append: Callable[[Position], None] | None = None,
                 after_chunk: Callable[[Position], None] | None = None):
        assert stream.source is not None
        self.stream, self.source, self.log = stream, stream.source, event_log
        self.clock = clock
        self.env = env
        self.after_append = after_append  # tests: what happens between the append and the slot's advance
        self.after_chunk = after_chunk  # tests: what happens between two chunks of the snapshot
        # The source's position as last read from or written to the log, and when (monotonic s):
        # status() answers from it, so the dashboard's feed polling it does no log I/O.
        self._position: Position | None = None
        self._position_at: float | None = None
        self.slot, self.publication = slot_name(stream), publication_name(stream)
        self.mapper = ChangeMapper(stream, self.source.key)
        self._conn: psycopg.Connection | None = None
        self._last_heartbeat = 0.0
        self._table_oid: int | None = None
        self._columns_now: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # state: stopped (not running here: another replica leads), snapshotting, streaming, error
        self._status: dict = {"state": "stopped", "error": None, "upserts": 0, "deletes": 0, "rejected": 0,
                              "last_rejection": None, "transactions": 0, "resyncs": 0, "truncates": 0,
                              "caught_up_at_ms": None, "caught_up_lsn": None, "server_lsn": None, "slot_confirmed_lsn": None,
                              "slot_restart_lsn": None, "slot_active": None, "warning": None,
                              "snapshot_rows_done": None, "snapshot_rows_estimate": None,
                              "snapshot_rows_unchanged": 0}

    # -- running ------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"cdc-{self.stream.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._close()
        self._set(state="stopped")

    def run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                busy = self.step()
                backoff = 1.0
                if not busy:
                    self._stop.wait(self.source.poll_interval / 1000)
            except Exception as exc:  # reported and retried: the follower never takes the API down
                log.warning("cdc %s: %s", self.stream.name, exc)
                self._set(state="error", error=f"{type(exc).__name__}: {exc}")
                self._close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def step(self) -> bool:
        """Set up if needed, then apply one peek's changes; True when there were changes."""
        conn = self._connection()
        position = Position.load(self.log.source_position(source_id(self.stream)))
        self._remember(position)
        slot = self._slot_row(conn)
        if position is not None and not position.snapshot_done:
            log.warning("cdc %s: the snapshot was interrupted after %d rows: taking it again", self.stream.name,
                        position.snapshot_rows)
            self._snapshot(conn, position, drop_slot=slot is not None)
            return True
        if position is None or slot is None or position.slot != self.slot:
            if position is not None:
                self._bump("resyncs")
                log.warning("cdc %s: slot %s is gone: its changes since %s are lost to us, taking a new snapshot",
                            self.stream.name, self.slot, lsn_to_text(position.lsn))
            self._snapshot(conn, position, drop_slot=slot is not None)
            return True
        if position.lsn > lsn_to_int(slot["confirmed"]):
            self._advance(conn, position.lsn)  # the append was durable, the advance did not happen
        return self._follow(conn, position)

    # -- snapshot -----------------------------------------------------------------------

    def _snapshot(self, conn: psycopg.Connection, before: Position | None, *, drop_slot: bool) -> None:
        self._set(state="snapshotting", error=None, snapshot_rows_done=0, snapshot_rows_unchanged=0)
        self._ensure_publication(conn)
        held = self._stream_rows()  # what the stream holds now (no other writer changes it meanwhile)
        if drop_slot:  # a slot without a whole snapshot in the log (a crash while snapshotting): start over
            conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        with psycopg.connect(self._dsn(), autocommit=True, replication="database") as replication:
            created = replication.pgconn.exec_(
                f"CREATE_REPLICATION_SLOT {self.slot} LOGICAL pgoutput EXPORT_SNAPSHOT".encode())
            if created.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise RuntimeError(f"CREATE_REPLICATION_SLOT {self.slot}: "
                                   f"{created.error_message.decode(errors='replace').strip()}")
            consistent = lsn_to_int(created.get_value(0, 1).decode())
            snapshot = created.get_value(0, 2).decode()
            # The exported snapshot lives while the replication connection is open and idle: it
            # stays open until the reading transaction has imported it (and to the end, simply).
            now_ms = int(self.clock() * 1000)
            position = Position(lsn=consistent, slot=self.slot, snapshot_lsn=consistent, snapshot_rows=0,
                                snapshot_at_ms=now_ms, snapshot_done=False)
            position, snapshot_keys, written = self._append_snapshot(snapshot, position, before, now_ms, held)
        # The last append: the keys the stream holds that the table did not have (deleted while
        # we had no slot, or written by a half-made snapshot and deleted since), and "done".
        gone = sorted(set(held) - snapshot_keys)
        done = Position(**{**position.__dict__, "snapshot_done": True, "columns": self._columns_now})
        self._append(self.stream, [tombstone(self.stream, key, now_ms) for key in gone], now_ms, done, written)
        self._columns_now = done.columns
        self._bump("deletes", len(gone))
        log.info("cdc %s: snapshot of %s at %s: %d rows", self.stream.name, self.source.table,
                 lsn_to_text(consistent), done.snapshot_rows)
        self._set(state="streaming")

    def _append_snapshot(self, snapshot: str, position: Position, before: Position | None,
                         now_ms: int, held: dict[str, bytes]) -> tuple[Position, set[str], Position | None]:
        """Read the table in the exported `snapshot` with a server-side cursor and append it a
        chunk at a time, each with the position so far; returns the last position, the keys read
        and the position last written (`before` when the table was empty). A row the stream
        already `held` as it is (digests) is not appended again: a snapshot taken again after a
        crash or a lost slot writes only what changed."""
        keys: set[str] = set()  # the keys only, to find the gone ones at the end
        expected = before
        with psycopg.connect(self._dsn()) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            columns = self._table_columns(conn)
            self._columns_now = [c.name for c in columns]
            wanted = [c for c in columns if c.name in self.mapper.fields or c.name == self.source.key]
            if not any(c.name == self.source.key for c in wanted):
                raise RuntimeError(f"table {self.source.table} has no column {self.source.key!r} (source.key)")
            self._set(warning=self._identity_warning(conn, columns), snapshot_rows_estimate=conn.execute(
                "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s::regclass",
                (self.source.table,)).fetchone()[0])
            query = sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c.name)) for c in wanted),
                self._table_ident())
            chunk = self.source.snapshot_chunk_rows
            with conn.cursor(name=f"{self.slot}_snapshot") as cursor:  # server-side: rows come a chunk at a time
                cursor.itersize = chunk
                cursor.execute(query)
                while rows := cursor.fetchmany(chunk):
                    events = []
                    for values in rows:
                        try:
                            events.append(self.mapper.row_event(wanted, values, now_ms))
                        except ValueError as exc:
                            self._bump("rejected")
                            self._set(last_rejection=str(exc))
                    keys.update(e.key for e in events)
                    fresh = [e for e in events if held.get(e.key) != row_digest(self.stream, e.strings, e.numbers)]
                    self._bump("snapshot_rows_unchanged", len(events) - len(fresh))
                    events = fresh
                    position = Position(**{**position.__dict__, "snapshot_rows": position.snapshot_rows + len(rows)})
                    self._append(self.stream, events, now_ms, position, expected)
                    expected = position
                    self._set(snapshot_rows_done=position.snapshot_rows)
                    if self.after_chunk is not None:
                        self.after_chunk(position)
            conn.rollback()
        return position, keys, expected

    def _append(self, stream: StreamDef, events: list, now_ms: int, position: Position,
                expected: Position | None) -> int:
        """Append with the source's new position (atomically), then remember it: the status reads
        it from memory (no log I/O per status). Returns how many rows the log refused (rejected)."""
        refused_rows = 0
        while True:
            try:
                self.log.append_at(stream, events, now_ms, source_id(stream), position.dump(),
                                   None if expected is None else expected.dump())
                break
            except RecordTooLarge as exc:
                # A row the log cannot hold as one record (Kafka's message.max.bytes): nothing of the
                # append was written, and retrying would refuse it for ever. The row is rejected, as
                # a row the mapper cannot read is, and the rest goes on (the table then lacks it).
                refused = events[exc.index]
                events = events[:exc.index] + events[exc.index + 1:]
                refused_rows += 1
                self._bump("rejected")
                self._set(last_rejection=f"row {refused.key!r}: {exc.reason}")
        self._remember(position)
        return refused_rows

    def _remember(self, position: Position | None) -> None:
        with self._lock:
            self._position, self._position_at = position, time.monotonic()

    def _identity_warning(self, conn: psycopg.Connection, columns: list[Column]) -> str | None:
        """Why deletes would come without the key (REPLICA IDENTITY), or None: checked at the
        snapshot, so the setup is fixed before the first delete is rejected."""
        identity = conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass",
                                (self.source.table,)).fetchone()[0]
        primary = [c.name for c in columns if c.is_key]
        if identity == "f" or (identity == "d" and primary == [self.source.key]):
            return None
        return (f"deletes of {self.source.table} will not carry the key {self.source.key!r} (REPLICA IDENTITY"
                f" {dict(d='DEFAULT', n='NOTHING', i='USING INDEX').get(identity, identity)}, primary key"
                f" {primary or 'none'}): make {self.source.key!r} the primary key, or ALTER TABLE"
                f" {self.source.table} REPLICA IDENTITY FULL")

    def _table_columns(self, conn: psycopg.Connection) -> list[Column]:
        rows = conn.execute(
            "SELECT a.attname, a.atttypid, COALESCE(a.attnum = ANY(i.indkey), false)"
            " FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary"
            " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (self.source.table,)).fetchall()
        return [Column(name, oid, bool(key)) for name, oid, key in rows]

    def _stream_rows(self) -> dict[str, bytes]:
        """Each key that holds a row in the stream's log, with its row's digest (row_digest)."""
        rows: dict[str, bytes] = {}
        strings = [f for f in self.stream.string_fields if f != OP_FIELD]
        for partition, offsets in self.log.offsets(self.stream.name).items():
            for batch in self.log.read(self.stream, partition, offsets.start, offsets.end):
                columns = {name: batch.column(name).to_pylist() for name in (*strings, OP_FIELD, *self.stream.values)}
                for i, key in enumerate(columns[self.stream.key_field]):
                    if columns[OP_FIELD][i] == DELETE:
                        rows.pop(key, None)
                    else:
                        rows[key] = row_digest(self.stream, {f: columns[f][i] for f in strings},
                                               {v: columns[v][i] for v in self.stream.values})
        return rows

    def _stream_rows_of(self, keys: set[str]) -> dict:
        """The row (changes.stored_values) each of `keys` holds in the stream's log, for those that
        hold one: one pass over the log, keeping only these keys' rows."""
        rows: dict = {}
        if not keys:
            return rows
        for partition, offsets in self.log.offsets(self.stream.name).items():
            for batch in self.log.read(self.stream, partition, offsets.start, offsets.end):
                wanted = [i for i, key in enumerate(batch.column(self.stream.key_field).to_pylist()) if key in keys]
                for record in batch.take(wanted).to_pylist() if wanted else ():
                    key = record[self.stream.key_field]
                    if record[OP_FIELD] == DELETE:
                        rows.pop(key, None)
                    else:
                        rows[key] = stored_values(self.stream, _RecordRow(record))
        return rows

    def _live_keys(self, pending=()) -> set[str]:
        """The keys that hold a row in the stream's log (its newest record is not a tombstone),
        after `pending` events: what a Truncate deletes and a re-snapshot checks."""
        newest: dict[str, bool] = {}
        for partition, offsets in self.log.offsets(self.stream.name).items():
            for batch in self.log.read(self.stream, partition, offsets.start, offsets.end):
                keys = batch.column(self.stream.key_field).to_pylist()
                ops = batch.column(OP_FIELD).to_pylist()
                for key, op in zip(keys, ops, strict=True):
                    newest[key] = op != DELETE
        return live_after({k for k, alive in newest.items() if alive}, self.stream, pending)

    # -- following ----------------------------------------------------------------------

    def _follow(self, conn: psycopg.Connection, position: Position) -> bool:
        self._set(state="streaming", error=None)
        server_lsn = self._observe(conn)  # before the peek: what an empty peek proves applied
        rows = conn.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s,"
            " 'proto_version', '1', 'publication_names', %s, 'messages', 'true')",
            (self.slot, self.source.max_changes_per_poll, self.publication)).fetchall()
        transactions: list[Transaction] = []
        pending: list = []
        current: list = []
        # Where the slot may be confirmed once the rows are in the log: the end of each
        # transaction read, or a heartbeat outside any (every record before it was decoded in this
        # peek; a transaction still open then commits after it, so it is not skipped).
        confirmable = position.lsn
        decoded = [decode(data) for _lsn, data in rows]
        # The rows an update's unchanged TOASTed columns kept, read from the log in one pass.
        held = self._stream_rows_of(self.mapper.kept_keys(decoded))
        for message in decoded:
            if isinstance(message, LogicalMessage) and not message.transactional:
                confirmable = max(confirmable, message.lsn)
                continue
            current.append(message)
            if isinstance(message, Commit):
                confirmable = max(confirmable, message.end_lsn)
                if message.end_lsn > position.lsn:  # else: in the log already (the slot was not advanced)
                    txn = self.mapper.transaction(
                        current, lambda events: self._live_keys([*pending, *events]),
                        lambda key, events: row_after(key, held.get(key), self.stream, [*pending, *events]))
                    transactions.append(txn)
                    pending.extend(txn.events)
                else:
                    self.mapper.transaction(current, lambda events: set())  # keeps its Relation messages
                current = []
        if not transactions:
            # Nothing of the table's was waiting before the peek (what the status reports as
            # applied). The slot is confirmed only up to what was decoded (`confirmable`): the
            # server's LSN could be inside a commit record not yet flushed, which would be skipped.
            self._set(caught_up_at_ms=int(self.clock() * 1000), caught_up_lsn=server_lsn)
            if confirmable > lsn_to_int(self._status["slot_confirmed_lsn"] or "0/0"):
                self._advance(conn, confirmable)
            elif lsn_to_int(server_lsn) > confirmable:
                self._heartbeat(conn)
            return False
        new = Position(**{**position.__dict__, "lsn": transactions[-1].end_lsn})
        now_ms = int(self.clock() * 1000)
        refused = self._append(self.stream, pending, now_ms, new, position)
        if self.after_append is not None:
            self.after_append(new)
        self._advance(conn, max(new.lsn, confirmable))
        self._count(transactions)
        self._bump("upserts", -refused)  # counted with their transactions, but never written (rejected)
        return True

    def _heartbeat(self, conn: psycopg.Connection) -> None:
        """A non-transactional logical message in the WAL (nothing of any table), at most once
        per heartbeat_interval: the next peek reads it, and the slot may be confirmed up to it."""
        now = self.clock()
        if now - self._last_heartbeat < self.source.heartbeat_interval / 1000:
            return
        self._last_heartbeat = now
        conn.execute("SELECT pg_logical_emit_message(false, %s, '')", (HEARTBEAT_PREFIX,))

    def _count(self, transactions: list[Transaction]) -> None:
        for txn in transactions:
            deletes = sum(1 for e in txn.events if is_tombstone(self.stream, e))
            self._bump("deletes", deletes)
            self._bump("upserts", len(txn.events) - deletes)
            self._bump("rejected", len(txn.rejected))
            self._bump("transactions")
            self._bump("truncates", int(txn.truncated))
            if txn.rejected:
                self._set(last_rejection=txn.rejected[-1])

    def _advance(self, conn: psycopg.Connection, lsn: int) -> None:
        """Confirm to the slot that everything before `lsn` is durably in the log: PostgreSQL may
        recycle that WAL, and the slot's next peek starts there."""
        conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, lsn_to_text(lsn)))

    # -- PostgreSQL -----------------------------------------------------------------------

    def _dsn(self) -> str:
        return resolve_dsn(self.source.postgres_dsn, self.env)

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn(), autocommit=True)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None

    def _table_ident(self) -> sql.Composable:
        return sql.Identifier(*self.source.table.split("."))

    def _ensure_publication(self, conn: psycopg.Connection) -> None:
        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)).fetchone():
            # Made by someone else (or for another table): it must publish ours, else the slot
            # would never show a change of it.
            if not conn.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s"
                                " AND format('%%I.%%I', schemaname, tablename)::regclass = %s::regclass",
                                (self.publication, self.source.table)).fetchone():
                raise RuntimeError(f"publication {self.publication} exists but does not publish {self.source.table}:"
                                   f" ALTER PUBLICATION {self.publication} ADD TABLE {self.source.table}, or set"
                                   " source.publication to another name")
            return
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(self.publication), self._table_ident()))

    def _slot_row(self, conn: psycopg.Connection) -> dict | None:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text, restart_lsn::text, active FROM pg_replication_slots"
            " WHERE slot_name = %s AND database = current_database()", (self.slot,)).fetchone()
        return None if row is None else {"confirmed": row[0], "restart": row[1], "active": row[2]}

    def _observe(self, conn: psycopg.Connection) -> str:
        """The server's LSN and the slot's, for the lag (bytes of WAL the slot holds back); returns
        the server's."""
        row = conn.execute(
            "SELECT pg_current_wal_lsn()::text, s.confirmed_flush_lsn::text, s.restart_lsn::text"
            " FROM pg_replication_slots s WHERE s.slot_name = %s", (self.slot,)).fetchone()
        if row:
            self._set(server_lsn=row[0], slot_confirmed_lsn=row[1], slot_restart_lsn=row[2])
        # The table's columns now, to report a schema change (a column added or dropped) even
        # before a change of a row shows it.
        self._columns_now = [c.name for c in self._table_columns(conn)]
        return row[0] if row else conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]

    # -- status ---------------------------------------------------------------------------

    def _set(self, **values) -> None:
        with self._lock:
            self._status.update(values)

    def _bump(self, name: str, by: int = 1) -> None:
        with self._lock:
            self._status[name] += by

    def _known_position(self) -> Position | None:
        """The source's position without log I/O when it can be known: a running follower is the
        source's only writer (a second one's append is refused) and keeps what it read or wrote
        last; a stopped one (another replica leads) reads the log at most every POSITION_TTL_S."""
        with self._lock:
            position, at = self._position, self._position_at
        running = self._thread is not None and self._thread.is_alive()
        if at is not None and (running or time.monotonic() - at < POSITION_TTL_S):
            return position
        position = Position.load(self.log.source_position(source_id(self.stream)))
        self._remember(position)
        return position

    def status(self) -> dict:
        """Progress and lag, for GET /api/v1/cdc and /metrics."""
        with self._lock:
            s = dict(self._status)
        position = self._known_position()
        now_ms = int(self.clock() * 1000)
        applied = position.lsn if position else None
        if applied is not None and s["caught_up_lsn"]:  # an empty peek proved everything before it applied
            applied = max(applied, lsn_to_int(s["caught_up_lsn"]))
        server = lsn_to_int(s["server_lsn"]) if s["server_lsn"] else None
        restart = lsn_to_int(s["slot_restart_lsn"]) if s["slot_restart_lsn"] else None
        caught_up = s["caught_up_at_ms"]
        # Stopped (another replica leads, or shutting down): what the last poll saw is old news, and
        # a lag counted from it would grow for ever on every former leader. The leader's says it.
        stopped = s["state"] == "stopped"
        return {
            "stream": self.stream.name,
            "table": self.source.table,
            "dsn": self.source.postgres_dsn,  # as written: ${NAME} references, never their values
            "slot": self.slot,
            "publication": self.publication,
            "state": s["state"],
            "error": s["error"],
            "warning": s["warning"],
            "applied_lsn": lsn_to_text(applied) if applied is not None else None,
            "logged_lsn": lsn_to_text(position.lsn) if position else None,
            "server_lsn": s["server_lsn"],
            "slot_confirmed_lsn": s["slot_confirmed_lsn"],
            "lag_bytes": max(0, server - applied) if server is not None and applied is not None and not stopped
            else None,
            "lag_seconds": None if caught_up is None or stopped else max(0.0, (now_ms - caught_up) / 1000),
            "retained_wal_bytes": max(0, server - restart) if server is not None and restart is not None else None,
            "snapshot_rows": position.snapshot_rows if position else None,
            "snapshot_lsn": lsn_to_text(position.snapshot_lsn) if position else None,
            "snapshot_at_ms": position.snapshot_at_ms if position else None,
            "snapshot_done": position.snapshot_done if position else None,
            # While snapshotting: the rows appended so far, and PostgreSQL's estimate of all (pg_class).
            "snapshot_rows_done": s["snapshot_rows_done"] if s["state"] == "snapshotting" else None,
            "snapshot_rows_estimate": s["snapshot_rows_estimate"] if s["state"] == "snapshotting" else None,
            "snapshot_rows_unchanged": s["snapshot_rows_unchanged"],
            "upserts": s["upserts"], "deletes": s["deletes"], "transactions": s["transactions"],
            "truncates": s["truncates"], "resyncs": s["resyncs"],
            "rejected": s["rejected"], "last_rejection": s["last_rejection"],
            "schema": schema_report((*self.stream.dimensions, *self.stream.values), self.source.key,
                                    position.columns if position else self._columns_now, self._columns_now)
            if self._columns_now else None,
        }


class _RecordRow:
    """A log record seen as an Event's columns (strings and numbers), for stored_values."""

    def __init__(self, record: dict):
        self.strings = self.numbers = record


def followers_for(streams, event_log: EventLog, **options) -> list[CdcFollower]:
    """One follower per table stream with a `source` (none started)."""
    return [CdcFollower(stream, event_log, **options) for stream in streams if stream.source is not None]
