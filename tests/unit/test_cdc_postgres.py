"""The CDC follower (ingest/cdc/follower.py) against a real PostgreSQL server with
wal_level=logical (tests/postgres_server.py): snapshot plus live changes end as the same table
in the stream's log as in PostgreSQL; a SIGKILL between the log's append and the slot's advance,
and PostgreSQL restarting, lose and duplicate nothing; truncate, a lost slot and a schema change.

The table in the log is read back as the pipeline would build it: the newest record per key,
a tombstone removing the key."""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
import textwrap
import time

import psycopg
import pytest

from catalog import parse_catalog
from catalog.tables import DELETE, OP_FIELD
from ingest.cdc.follower import CdcFollower, source_id
from ingest.log import SqliteEventLog

pytestmark = pytest.mark.postgres

CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan, active]
    values: [credit]
    partitions: 3
    source: {{postgres_dsn: "{dsn} password=${{CDC_TEST_PASSWORD}}", table: {table}, key: id, poll_interval: 50ms,
              max_changes_per_poll: {per_poll}, heartbeat_interval: 0s}}
"""
ENV = {"CDC_TEST_PASSWORD": "unused"}  # trust auth: the reference is resolved, its value ignored


@pytest.fixture
def server(logical_postgres_server):
    return logical_postgres_server


_tables = iter(range(10_000))


@pytest.fixture
def setup(server, tmp_path):
    """A fresh source table (and its stream with its own slot), the log, and a SQL helper."""
    table = f"users_{next(_tables)}"
    sql(server, f"CREATE TABLE {table} (id text PRIMARY KEY, plan text, credit numeric, active boolean,"
                " note text)")

    def make(per_poll: int = 1000, test_log=None):
        """The stream and its log: the embedded one, or `test_log`'s (a log_backend's)."""
        catalog = parse_catalog(CONFIG.format(dsn=server.dsn(), table=table, per_poll=per_poll))
        if test_log is not None:
            return catalog.streams["users"], test_log.open(catalog)
        log = SqliteEventLog(tmp_path / "log.db")
        log.ensure_topic(catalog.streams["users"])
        return catalog.streams["users"], log

    yield table, make
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active")
        conn.execute("DROP PUBLICATION IF EXISTS sketchboard_users")


def sql(server, *statements: str):
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def pg_rows(server, table) -> dict:
    with psycopg.connect(server.dsn()) as conn:
        rows = conn.execute(f"SELECT id, plan, credit::float8, active FROM {table}").fetchall()
    return {i: {"plan": p or "", "active": "" if a is None else str(a).lower(), "credit": c} for i, p, c, a in rows}


def log_records(log, stream) -> list[dict]:
    out = []
    for partition, offsets in log.offsets(stream.name).items():
        for batch in log.read(stream, partition, offsets.start, offsets.end):
            out += batch.to_pylist()
    return out


def log_table(log, stream) -> dict:
    table: dict = {}
    for partition, offsets in log.offsets(stream.name).items():
        for batch in log.read(stream, partition, offsets.start, offsets.end):
            for r in batch.to_pylist():
                if r[OP_FIELD] == DELETE:
                    table.pop(r["user_id"], None)
                else:
                    table[r["user_id"]] = {"plan": r["plan"], "active": r["active"], "credit": r["credit"]}
    return table


def catch_up(follower, rounds: int = 50):
    """Step until a step finds nothing new (reconnecting after PostgreSQL went away)."""
    for _ in range(rounds):
        try:
            if not follower.step():
                return
        except psycopg.OperationalError:
            follower._close()
    raise AssertionError("the follower did not catch up")


def test_snapshot_then_live_changes_end_as_the_same_table(server, setup, log_backend, tmp_path):
    """On both logs: the embedded one (a SQLite transaction) and Kafka (a Kafka transaction)."""
    table, make = setup
    sql(server, *[f"INSERT INTO {table} VALUES ('u{i}', 'free', {i}.5, {str(i % 2 == 0).lower()})" for i in range(20)])
    stream, log = make(per_poll=3, test_log=log_backend.new(tmp_path / "log"))  # several peeks per catch-up
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)
    status = follower.status()
    assert status["snapshot_rows"] == 20 and status["state"] == "streaming"
    assert log_table(log, stream) == pg_rows(server, table)
    sql(server, f"INSERT INTO {table} VALUES ('n1', 'pro', 7, true)",
        f"UPDATE {table} SET plan = 'pro', credit = credit * 2 WHERE id IN ('u1', 'u2')",
        f"DELETE FROM {table} WHERE id = 'u3'",
        f"UPDATE {table} SET id = 'u4-moved' WHERE id = 'u4'",  # a key change: retract and add
        f"UPDATE {table} SET note = 'not ours' WHERE id = 'u5'")  # an ignored column: an upsert all the same
    catch_up(follower)
    assert log_table(log, stream) == pg_rows(server, table)
    status = follower.status()
    assert (status["upserts"], status["deletes"], status["transactions"]) == (5, 2, 5)
    assert status["lag_bytes"] == 0 and status["applied_lsn"] == status["server_lsn"]
    assert status["dsn"].endswith("password=${CDC_TEST_PASSWORD}")  # the reference, never its value
    assert len(log_records(log, stream)) == 20 + 7  # each change once
    log.close()


@pytest.mark.kafka
def test_a_row_over_kafkas_record_limit_is_rejected_and_the_others_follow(server, setup, kafka_broker):
    """Kafka takes no record over the producer's message.max.bytes (the embedded log has no such
    limit): the follower retried such an append for ever, the table stuck. The row is rejected
    with its reason, as a row the mapper cannot read is, and the others are appended."""
    import uuid

    from ingest.log.kafka import KafkaEventLog

    table, _ = setup
    big = "x" * 1_000  # a dimension holds at most 1 024 characters; with the row's other fields, over 1 000 bytes
    sql(server, f"INSERT INTO {table} VALUES ('small', 'free', 1, true)",
        f"INSERT INTO {table} VALUES ('big', '{big}', 2, true)")
    stream = parse_catalog(CONFIG.format(dsn=server.dsn(), table=table, per_poll=1000)).streams["users"]
    log = KafkaEventLog(kafka_broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}.", replication_factor=1,
                        options={"message.max.bytes": 1000})
    log.ensure_topic(stream)
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)  # the snapshot
    assert set(log_table(log, stream)) == {"small"}
    status = follower.status()
    assert status["rejected"] == 1 and status["state"] == "streaming"
    assert "'big'" in status["last_rejection"] and "message.max.bytes" in status["last_rejection"]
    sql(server, f"UPDATE {table} SET plan = '{big}' WHERE id = 'small'",  # live: grown past the limit
        f"INSERT INTO {table} VALUES ('n1', 'pro', 3, true)")
    catch_up(follower)
    assert log_table(log, stream) == {"small": {"plan": "free", "active": "true", "credit": 1.0},
                                      "n1": {"plan": "pro", "active": "true", "credit": 3.0}}
    status = follower.status()
    assert (status["rejected"], status["upserts"]) == (2, 1)
    log.close()


KILLER = """
import os, signal, sys
sys.path.insert(0, {root!r})
from catalog import parse_catalog
from ingest.cdc.follower import CdcFollower
from ingest.log import SqliteEventLog
from ingest.log.kafka import KafkaEventLog
stream = parse_catalog({config!r}).streams["users"]
log = {log_code}
log.ensure_topic(stream)
def die(position):  # the append is durable, the slot is not advanced yet
    os.kill(os.getpid(), signal.SIGKILL)
follower = CdcFollower(stream, log, env={env!r}, after_append=die)
for _ in range(100):
    follower.step()
sys.exit(3)  # never killed: the changes did not come
"""


def test_a_kill_between_append_and_advance_and_a_postgres_restart_lose_and_duplicate_nothing(server, setup, tmp_path,
                                                                                             log_backend):
    table, make = setup
    sql(server, *[f"INSERT INTO {table} VALUES ('u{i}', 'free', {i}, true)" for i in range(5)])
    test_log = log_backend.new(tmp_path / "log")
    stream, log = make(test_log=test_log)
    log_code = (f"KafkaEventLog({test_log.bootstrap!r}, topic_prefix={test_log.prefix!r}, replication_factor=1)"
                if test_log.kafka else f"SqliteEventLog({str(test_log.root / 'log.db')!r})")
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)  # the snapshot
    follower.stop()
    sql(server, f"UPDATE {table} SET plan = 'pro' WHERE id = 'u1'", f"DELETE FROM {table} WHERE id = 'u2'")
    config = CONFIG.format(dsn=server.dsn(), table=table, per_poll=1000)
    script = textwrap.dedent(KILLER).format(root=os.getcwd(), config=config, log_code=log_code, env=ENV)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr  # killed by SIGKILL right after its append
    # The log has the two changes and their position; the slot was never told.
    position = log.source_position(source_id(stream))
    with psycopg.connect(server.dsn()) as conn:
        confirmed = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                 ("sketchboard_users",)).fetchone()[0]
    assert '"lsn": ' in position and len(log_records(log, stream)) == 5 + 2
    sql(server, f"INSERT INTO {table} VALUES ('u9', 'pro', 9, false)")
    server.restart()  # PostgreSQL crashes and comes back
    sql(server, f"UPDATE {table} SET credit = 99 WHERE id = 'u9'")
    again = CdcFollower(stream, log, env=ENV)
    catch_up(again)  # skips what the log has, confirms it to the slot, applies the rest
    assert log_table(log, stream) == pg_rows(server, table)
    assert len(log_records(log, stream)) == 5 + 2 + 2  # nothing twice
    assert again.status()["slot_confirmed_lsn"] != confirmed
    assert again.status()["lag_bytes"] == 0
    log.close()


def test_truncate_deletes_every_key_and_a_lost_slot_is_resynced_by_a_new_snapshot(server, setup):
    table, make = setup
    sql(server, *[f"INSERT INTO {table} VALUES ('u{i}', 'free', {i}, true)" for i in range(4)])
    stream, log = make()
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)
    sql(server, f"TRUNCATE {table}", f"INSERT INTO {table} VALUES ('t1', 'pro', 1, true)")
    catch_up(follower)
    assert log_table(log, stream) == pg_rows(server, table) and set(pg_rows(server, table)) == {"t1"}
    assert follower.status()["truncates"] == 1
    # Someone drops the slot; rows change meanwhile. A new snapshot, and tombstones for the gone keys.
    follower._close()
    sql(server, "SELECT pg_drop_replication_slot('sketchboard_users')",
        f"DELETE FROM {table} WHERE id = 't1'", f"INSERT INTO {table} VALUES ('r1', 'x', 1, false)")
    catch_up(follower)
    assert log_table(log, stream) == pg_rows(server, table) == {"r1": {"plan": "x", "active": "false", "credit": 1.0}}
    assert follower.status()["resyncs"] == 1


def test_an_update_leaving_a_toasted_label_unchanged_keeps_the_streams_value(server, setup):
    """PostgreSQL moves the widest values out of line (TOAST) once the whole row is over ~2 kB:
    here a valid 900-character label beside wide ignored columns. An update of another column
    (REPLICA IDENTITY DEFAULT) does not carry it; the label kept its value, which the stream's row
    of the key holds. Only a key the stream holds no row of is rejected, naming the remedy."""
    table, make = setup
    rnd = random.Random(7)  # random text: PostgreSQL cannot compress it small enough to keep it inline

    def text(length: int) -> str:
        return "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(length))

    label, wide = text(900), [text(800) for _ in range(3)]
    sql(server, f"ALTER TABLE {table} ADD COLUMN x1 text, ADD COLUMN x2 text",
        f"INSERT INTO {table} VALUES ('u1', '{label}', 1, true, '{wide[0]}', '{wide[1]}', '{wide[2]}')")
    stream, log = make()
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)
    sql(server, f"UPDATE {table} SET credit = 2 WHERE id = 'u1'",  # the label stays out of line, unchanged
        f"INSERT INTO {table} VALUES ('u2', '{label}', 'NaN', true, '{wide[0]}', '{wide[1]}', '{wide[2]}')",
        f"UPDATE {table} SET credit = 3 WHERE id = 'u2'")  # u2's insert was rejected: no row to keep it from
    catch_up(follower)
    status = follower.status()
    assert log_table(log, stream) == {"u1": {"plan": label, "active": "true", "credit": 2.0}}
    assert status["rejected"] == 2, status["last_rejection"]  # u2's NaN, then its update
    assert status["last_rejection"].startswith("plan: PostgreSQL keeps its value out of line (TOAST)")
    assert "REPLICA IDENTITY FULL" in status["last_rejection"]
    # With FULL, the update's old row holds the value: u2's row is written whole.
    sql(server, f"ALTER TABLE {table} REPLICA IDENTITY FULL", f"UPDATE {table} SET credit = 4 WHERE id = 'u2'")
    catch_up(follower)
    assert log_table(log, stream) == pg_rows(server, table)


def test_a_column_added_to_the_source_is_reported_and_errors_are_reported_not_raised(server, setup, tmp_path):
    table, make = setup
    sql(server, f"INSERT INTO {table} VALUES ('u1', 'free', 1, true)")
    stream, log = make()
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)
    assert follower.status()["schema"] == {"missing": [], "ignored": ["note"], "added": [], "removed": []}
    sql(server, f"ALTER TABLE {table} ADD COLUMN country text", f"INSERT INTO {table} VALUES ('u2', 'pro', 2)")
    catch_up(follower)
    assert follower.status()["schema"]["added"] == ["country"]
    assert log_table(log, stream) == pg_rows(server, table)
    assert follower.status()["warning"] is None
    # Keyed by a column that is not the primary key, with REPLICA IDENTITY DEFAULT: a delete would
    # not carry it. Said at the snapshot; the delete is then rejected with the reason, not lost.
    sql(server, "CREATE TABLE by_email (id int PRIMARY KEY, email text UNIQUE, plan text)",
        "INSERT INTO by_email VALUES (1, 'a@x', 'free')")
    keyed = parse_catalog(CONFIG.format(dsn=server.dsn(), table="by_email", per_poll=10)).streams["users"]
    keyed = keyed.model_copy(update={"source": keyed.source.model_copy(update={"key": "email", "slot": "by_email",
                                                                              "publication": "by_email"})})
    by_email = CdcFollower(keyed, SqliteEventLog(tmp_path / "by_email.db"), env=ENV)
    by_email.log.ensure_topic(keyed)
    catch_up(by_email)
    assert "REPLICA IDENTITY FULL" in by_email.status()["warning"]
    sql(server, "DELETE FROM by_email")
    catch_up(by_email)
    assert by_email.status()["rejected"] == 1 and "REPLICA IDENTITY FULL" in by_email.status()["last_rejection"]
    sql(server, "ALTER TABLE by_email REPLICA IDENTITY FULL", "INSERT INTO by_email VALUES (2, 'b@x', 'pro')",
        "DELETE FROM by_email")
    catch_up(by_email)
    assert set(log_table(by_email.log, keyed)) == {"a@x"}  # b@x's delete carried the key; a@x's (rejected) did not
    by_email._close()
    sql(server, "SELECT pg_drop_replication_slot('by_email')", "DROP PUBLICATION by_email")
    # A publication of that name that does not publish the table: said, not changed.
    sql(server, "CREATE PUBLICATION not_ours FOR TABLE by_email")
    wrong = CdcFollower(stream.model_copy(update={"source": stream.source.model_copy(
        update={"slot": "wrong_pub", "publication": "not_ours"})}), log, env=ENV)
    with pytest.raises(RuntimeError, match="does not publish"):
        wrong.step()
    wrong._close()
    sql(server, "DROP PUBLICATION not_ours")
    # A source table that is not there: the run loop reports the error and keeps trying.
    broken = parse_catalog(CONFIG.format(dsn=server.dsn(), table="no_such_table", per_poll=10)).streams["users"]
    other = CdcFollower(broken.model_copy(update={"source": broken.source.model_copy(update={"slot": "other"})}),
                        log, env=ENV)
    other.start()
    try:
        deadline = time.time() + 30
        while other.status()["state"] != "error" and time.time() < deadline:
            time.sleep(0.05)
        assert other.status()["state"] == "error" and "no_such_table" in other.status()["error"]
    finally:
        other.stop()


def test_a_quiet_tables_slot_is_confirmed_past_other_wal_by_heartbeats(server, setup):
    table, make = setup
    stream, log = make()
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)
    sql(server, "CREATE TABLE IF NOT EXISTS other_busy (n int)",
        *["INSERT INTO other_busy SELECT generate_series(1, 1000)"] * 5)  # WAL of a table not ours
    with psycopg.connect(server.dsn()) as conn:
        busy_end = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    from ingest.cdc.pgoutput import lsn_to_int

    # A heartbeat, flushed by the WAL writer within wal_writer_delay (it commits nothing), then
    # the peek that reads it and confirms the slot up to it.
    deadline = time.time() + 30
    while time.time() < deadline:
        follower.step()
        status = follower.status()
        if lsn_to_int(status["slot_confirmed_lsn"]) >= lsn_to_int(busy_end):
            break
        time.sleep(0.1)
    assert lsn_to_int(status["slot_confirmed_lsn"]) >= lsn_to_int(busy_end)
    assert status["upserts"] == status["transactions"] == 0  # the heartbeats are nobody's rows
    sql(server, f"INSERT INTO {table} VALUES ('late', 'pro', 1, true)")  # and nothing after them is skipped
    catch_up(follower)
    assert log_table(log, stream) == pg_rows(server, table)


CHUNK_KILLER = """
import os, signal, sys
sys.path.insert(0, {root!r})
from catalog import parse_catalog
from ingest.cdc.follower import CdcFollower
from ingest.log import SqliteEventLog
from ingest.log.kafka import KafkaEventLog
stream = parse_catalog({config!r}).streams["users"]
log = {log_code}
log.ensure_topic(stream)
def die(position):  # the second chunk is durable; the rest of the snapshot is not read yet
    if position.snapshot_rows >= 8:
        os.kill(os.getpid(), signal.SIGKILL)
follower = CdcFollower(stream, log, env={env!r}, after_chunk=die)
follower.step()
sys.exit(3)  # never killed: the snapshot came in fewer chunks
"""


def test_a_kill_between_snapshot_chunks_ends_as_the_same_table_with_nothing_that_changes_it_twice(
        server, setup, tmp_path, log_backend):
    """The snapshot is appended in chunks of 4 rows; a SIGKILL after the second leaves 8 rows and
    a position whose snapshot is not done. Rows change meanwhile, among them rows of those 8.
    The next start takes the snapshot again, writing only rows the stream does not hold as they
    are: the table in the log equals PostgreSQL's, and no row state is written twice."""
    table, make = setup
    sql(server, *[f"INSERT INTO {table} VALUES ('u{i:02}', 'free', {i}, true)" for i in range(25)])
    test_log = log_backend.new(tmp_path / "log")
    stream, log = make(test_log=test_log)
    config = CONFIG.format(dsn=server.dsn(), table=table, per_poll=1000).replace(
        "max_changes_per_poll:", "snapshot_chunk_rows: 4, max_changes_per_poll:")
    log_code = (f"KafkaEventLog({test_log.bootstrap!r}, topic_prefix={test_log.prefix!r}, replication_factor=1)"
                if test_log.kafka else f"SqliteEventLog({str(test_log.root / 'log.db')!r})")
    script = textwrap.dedent(CHUNK_KILLER).format(root=os.getcwd(), config=config, log_code=log_code, env=ENV)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    half = log_records(log, stream)
    assert len(half) == 8 and '"snapshot_done": false' in log.source_position(source_id(stream))
    written = {r["user_id"] for r in half}
    changed, deleted = sorted(written)[:2]
    sql(server, f"UPDATE {table} SET plan = 'pro' WHERE id = '{changed}'", f"DELETE FROM {table} WHERE id = '{deleted}'",
        f"INSERT INTO {table} VALUES ('n1', 'team', 1, false)", f"ANALYZE {table}")
    stream = stream.model_copy(update={"source": stream.source.model_copy(update={"snapshot_chunk_rows": 4})})
    progress = []
    again = CdcFollower(stream, log, env=ENV, after_chunk=lambda position: progress.append(again.status()))
    catch_up(again)
    assert log_table(log, stream) == pg_rows(server, table)
    # The half-made snapshot's 8; of the new one's 25 rows, the 17 it had not written, the changed
    # one and the new one (the 6 it wrote as they still are are not written again); and a
    # tombstone for the key deleted in between: one record per change of a row, none twice.
    assert len(log_records(log, stream)) == 8 + (17 + 1 + 1) + 1
    status = again.status()
    assert status["snapshot_done"] and status["snapshot_rows"] == 25 and status["snapshot_rows_done"] is None
    assert status["resyncs"] == 0 and status["deletes"] == 1 and status["snapshot_rows_unchanged"] == 6
    # Progress while it ran: rows appended so far, of PostgreSQL's estimate.
    assert [p["snapshot_rows_done"] for p in progress] == [4, 8, 12, 16, 20, 24, 25]
    assert {(p["state"], p["snapshot_done"], p["snapshot_rows_estimate"]) for p in progress} == {
        ("snapshotting", False, 25)}
    sql(server, f"UPDATE {table} SET credit = 5 WHERE id = 'n1'")  # and then it follows the slot
    catch_up(again)
    assert log_table(log, stream) == pg_rows(server, table) and len(log_records(log, stream)) == 8 + 19 + 1 + 1
    log.close()


def test_the_status_answers_from_memory_without_reading_the_log(server, setup, monkeypatch):
    """The dashboard's feed asks every follower's status once a second: the position comes from
    the follower's memory (it is the source's only writer), not from the log."""
    import threading

    from ingest.cdc import follower as follower_module

    table, make = setup
    sql(server, f"INSERT INTO {table} VALUES ('u1', 'free', 1, true)")
    stream, log = make()
    reads = []
    source_position = log.source_position

    def counted(source):
        if threading.current_thread() is threading.main_thread():  # not the follower's own steps
            reads.append(source)
        return source_position(source)

    monkeypatch.setattr(log, "source_position", counted)
    follower = CdcFollower(stream, log, env=ENV)
    catch_up(follower)
    reads.clear()
    follower.start()
    try:
        first = follower.status()["logged_lsn"]
        sql(server, f"UPDATE {table} SET plan = 'pro' WHERE id = 'u1'")
        deadline = time.time() + 30
        while follower.status()["logged_lsn"] == first and time.time() < deadline:
            time.sleep(0.02)
        assert follower.status()["logged_lsn"] != first  # the new position, from memory
        logged = follower_module.Position.load(source_position(source_id(stream))).lsn
        assert follower.status()["logged_lsn"] == follower_module.lsn_to_text(logged)
        assert reads == []
    finally:
        follower.stop()
    assert follower.status()["logged_lsn"] and reads == []  # stopped: what it knew is fresh for a while
    monkeypatch.setattr(follower_module, "POSITION_TTL_S", 0.0)  # then the log is read (another replica leads)
    assert follower.status()["logged_lsn"] and len(reads) == 1
