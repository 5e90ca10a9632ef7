"""Change data capture without PostgreSQL: the catalog's `source:`, the pgoutput decoder (on
messages a PostgreSQL 15 server wrote), the mapping of changes to upserts and tombstones, and
the embedded log's append that records a source's position atomically (ingest/cdc/, catalog/cdc.py).
The follower against a real server: tests/unit/test_cdc_postgres.py."""

from __future__ import annotations

import struct

import pytest

from catalog import ConfigError, parse_catalog
from catalog.cdc import resolve_dsn
from catalog.tables import DELETE, UPSERT
from ingest.cdc.changes import ChangeMapper, live_after, row_after, schema_report
from ingest.cdc.pgoutput import (
    PG_EPOCH_MS, UNCHANGED, Begin, Column, Commit, Delete, Insert, LogicalMessage, PgoutputError, Relation, Truncate, Update, decode,
    lsn_to_int, lsn_to_text,
)
from ingest.log.base import PositionConflict
from ingest.tables import is_tombstone, tombstone

CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan, active]
    values: [credit]
    partitions: 2
    source: {postgres_dsn: "host=db dbname=app user=cdc password=${APP_PG_PASSWORD}", table: public.users, key: id}
"""
T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def users():
    return parse_catalog(CONFIG).streams["users"]


# -- catalog ---------------------------------------------------------------------------------------


def test_a_table_declares_its_postgres_source_with_default_slot_and_publication(users):
    from catalog.cdc import publication_name, slot_name

    assert users.source.table == "public.users" and users.source.key == "id"
    assert slot_name(users) == publication_name(users) == "sketchboard_users"
    named = parse_catalog(CONFIG.replace("key: id}", "key: id, slot: my_slot, publication: my_pub}")).streams["users"]
    assert (slot_name(named), publication_name(named)) == ("my_slot", "my_pub")


@pytest.mark.parametrize(("source", "message"), [
    ("{postgres_dsn: 'host=db password=hunter2', table: t, key: id}", "spells out a password"),
    ("{postgres_dsn: 'postgresql://cdc:hunter2@db/app', table: t, key: id}", "spells out a password"),
    ("{postgres_dsn: 'postgresql://cdc@db/app?password=hunter2', table: t, key: id}", "spells out a password"),
    ("{postgres_dsn: 'postgresql://cdc@db/app?sslmode=require&pass%77ord=hunter2', table: t, key: id}",
     "spells out a password"),  # libpq decodes a query's keywords too
    ("{postgres_dsn: 'host=db', table: 'no such; table', key: id}", "table"),
    ("{postgres_dsn: 'host=db', table: t}", "key"),
    ("{postgres_dsn: 'host=db', table: t, key: id, slot: Bad-Slot}", "slot"),
    ("{postgres_dsn: 'host=db', table: t, key: id, extra: 1}", "extra"),
])
def test_a_bad_source_is_refused_with_its_reason(source, message):
    with pytest.raises(Exception, match=message):
        parse_catalog(f"streams:\n  t: {{kind: table, key_field: k, source: {source}}}\n")


TWO_TABLES = """\
streams:
  Users:
    kind: table
    key_field: id
    source: {postgres_dsn: "host=db dbname=app", table: public.users, key: id}
  users:
    kind: table
    key_field: id
    source: {postgres_dsn: "host=db dbname=app", table: public.accounts, key: id}
"""


def test_two_tables_whose_default_slots_collide_are_refused_naming_both():
    with pytest.raises(ConfigError) as info:
        parse_catalog(TWO_TABLES, source="t.yaml")
    assert str(info.value) == (
        "t.yaml: line 9: streams.users.source: the replication slot 'sketchboard_users' (the default name) is"
        " already that of table 'Users' (its default name): each table's source needs a replication slot of its"
        " own (set source.slot)")


@pytest.mark.parametrize(("field", "what"), [("slot", "replication slot"), ("publication", "publication")])
def test_a_slot_or_publication_written_as_another_tables_is_refused(field, what):
    text = TWO_TABLES.replace("  Users:", "  plans:").replace("table: public.accounts, key: id}",
                                                              f"table: public.accounts, key: id, {field}: sketchboard_plans}}")
    with pytest.raises(ConfigError) as info:
        parse_catalog(text, source="t.yaml")
    assert str(info.value) == (
        f"t.yaml: line 9: streams.users.source.{field}: the {what} 'sketchboard_plans' is already that of table"
        f" 'plans' (its default name): each table's source needs a {what} of its own (set source.{field})")


def test_tables_with_slots_and_publications_of_their_own_load():
    text = TWO_TABLES.replace("table: public.accounts, key: id}", "table: public.accounts, key: id, slot: accounts,"
                              " publication: accounts}")
    assert set(parse_catalog(text).streams) == {"Users", "users"}


def test_only_a_table_takes_a_source():
    with pytest.raises(Exception, match="declare kind: table"):
        parse_catalog("streams:\n  s: {key_field: k, source: {postgres_dsn: 'host=db', table: t, key: id}}\n")


def test_the_dsn_takes_its_secrets_from_the_environment(users):
    assert resolve_dsn(users.source.postgres_dsn, {"APP_PG_PASSWORD": "s3"}) == "host=db dbname=app user=cdc password='s3'"
    with pytest.raises(ValueError, match="APP_PG_PASSWORD, which is not set"):
        resolve_dsn(users.source.postgres_dsn, {})
    # A URL with its password from the environment is fine too.
    assert resolve_dsn("postgresql://cdc:${P}@db/app", {"P": "x"}) == "postgresql://cdc:x@db/app"
    # So are the references in a URL's query and quoted by hand.
    for dsn in ("postgresql://cdc@db/app?password=${P}", "host=db password='${P}'", "host=db password = '${P}'"):
        assert parse_catalog(CONFIG.replace("host=db dbname=app user=cdc password=${APP_PG_PASSWORD}", dsn))


@pytest.mark.parametrize("secret", [
    "x host=evil.example sslmode=disable",  # unquoted, it would set the host and sslmode
    "correct horse", "it's", "back\\slash", "'", "a@b:c/d?e&f=g#h%i",
])
@pytest.mark.parametrize("dsn", [
    "host=db user=cdc password=${PW}", "host=db user=cdc password='${PW}'", "host=db user=cdc password = ${PW}",
    "postgresql://cdc:${PW}@db/app", "postgresql://cdc@db/app?sslmode=require&password=${PW}",
])
def test_a_dsns_reference_is_its_value_whatever_the_value_holds(dsn, secret):
    """libpq reads back exactly the value (psycopg's parser is libpq's): quoted and escaped in a
    key=value DSN, percent-encoded in a URL, it can neither break the DSN nor set another key."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(resolve_dsn(dsn, {"PW": secret}))
    assert params == {"host": "db", "user": "cdc", "password": secret, **({"dbname": "app"} if "app" in dsn else {}),
                      **({"sslmode": "require"} if "sslmode" in dsn else {})}


def test_a_reference_within_a_value_or_outside_any_is_resolved_as_libpq_reads_it():
    from psycopg.conninfo import conninfo_to_dict

    env = {"H": "my host", "Q": "'", "URL": "postgresql://u@db/app", "MORE": "dbname=app"}
    # Part of an unquoted value: the whole value is quoted, its own escapes kept.
    assert conninfo_to_dict(resolve_dsn(r"host=${H}.internal dbname=a\ b${Q} user=o'k", env)) == \
        {"host": "my host.internal", "dbname": "a b'", "user": "o'k"}
    # Outside any value the reference is DSN text by intent (a whole DSN from the environment).
    assert resolve_dsn("${URL}", env) == "postgresql://u@db/app"
    assert conninfo_to_dict(resolve_dsn("host=db ${MORE}", env)) == {"host": "db", "dbname": "app"}
    # A quote left open stays open: libpq refuses it, the value cannot close it.
    assert resolve_dsn("host=db password='${Q} host=evil", env) == "host=db password='\\' host=evil"


# -- pgoutput ----------------------------------------------------------------------------------------

# Messages as a PostgreSQL 15 server sent them for: INSERT u2; UPDATE u1; DELETE u2; TRUNCATE.
RELATION = (b"R\x00\x00@\x00public\x00users\x00d\x00\x04\x01id\x00\x00\x00\x00\x19\xff\xff\xff\xff\x00plan\x00"
            b"\x00\x00\x00\x19\xff\xff\xff\xff\x00credit\x00\x00\x00\x06\xa4\xff\xff\xff\xff\x00active\x00\x00\x00"
            b"\x00\x10\xff\xff\xff\xff")
BEGIN = b"B\x00\x00\x00\x00\x01PZ\xb0\x00\x03\x03\xf4\xb7,\xd2\xfa\x00\x00\x02\xd7"
INSERT = b"I\x00\x00@\x00N\x00\x04t\x00\x00\x00\x02u2t\x00\x00\x00\x03prot\x00\x00\x00\x012t\x00\x00\x00\x01f"
COMMIT = b"C\x00\x00\x00\x00\x00\x01PZ\xb0\x00\x00\x00\x00\x01PZ\xe0\x00\x03\x03\xf4\xb7,\xd2\xfa"
UPDATE = b"U\x00\x00@\x00N\x00\x04t\x00\x00\x00\x02u1t\x00\x00\x00\x01xt\x00\x00\x00\x031.5t\x00\x00\x00\x01t"
DELETE_KEY = b"D\x00\x00@\x00K\x00\x04t\x00\x00\x00\x02u2nnn"
TRUNCATE = b"T\x00\x00\x00\x01\x00\x00\x00@\x00"


def test_pgoutput_messages_decode():
    relation = decode(RELATION)
    assert relation == Relation(16384, "public", "users", "d", (
        Column("id", 25, True), Column("plan", 25, False), Column("credit", 1700, False), Column("active", 16, False)))
    begin, commit = decode(BEGIN), decode(COMMIT)
    assert isinstance(begin, Begin) and begin.xid == 727 and begin.final_lsn == lsn_to_int("0/1505AB0")
    assert isinstance(commit, Commit) and commit.end_lsn == lsn_to_int("0/1505AE0")
    assert commit.commit_time_ms == begin.commit_time_ms > PG_EPOCH_MS
    assert decode(INSERT) == Insert(16384, ("u2", "pro", "2", "f"))
    assert decode(UPDATE) == Update(16384, None, None, ("u1", "x", "1.5", "t"))
    assert decode(DELETE_KEY) == Delete(16384, ("u2", None, None, None), "K")
    assert decode(TRUNCATE) == Truncate((16384,), False, False)
    # An update with its old key (the key changed) and an unchanged TOASTed column.
    moved = b"U\x00\x00@\x00K\x00\x01t\x00\x00\x00\x02u1N\x00\x02t\x00\x00\x00\x02u9u"
    assert decode(moved) == Update(16384, ("u1",), "K", ("u9", UNCHANGED))


@pytest.mark.parametrize(("data", "message"), [
    (b"Z", "unknown pgoutput message"),
    (INSERT[:-3], "cut short"),
    (b"I\x00\x00@\x00N\x00\x01b\x00\x00\x00\x01x", "unknown tuple column kind"),
])
def test_a_message_the_decoder_does_not_understand_is_an_error_with_its_reason(data, message):
    with pytest.raises(PgoutputError, match=message):
        decode(data)


def test_lsn_text_round_trip():
    assert lsn_to_text(lsn_to_int("16/B374D848")) == "16/B374D848"
    assert lsn_to_int("0/0") == 0


# -- changes -----------------------------------------------------------------------------------------


def messages(*raw: bytes):
    return [decode(m) for m in raw]


def test_inserts_and_updates_are_upserts_deletes_tombstones_with_json_values(users):
    mapper = ChangeMapper(users, "id")
    txn = mapper.transaction(messages(BEGIN, RELATION, INSERT, UPDATE, DELETE_KEY, COMMIT), lambda events: set())
    assert txn.end_lsn == lsn_to_int("0/1505AE0") and not txn.rejected
    inserted, updated, deleted = txn.events
    assert (inserted.key, inserted.strings["op"], inserted.strings["plan"], inserted.strings["active"],
            inserted.numbers["credit"]) == ("u2", UPSERT, "pro", "false", 2.0)
    assert inserted.event_time_ms == txn.commit_time_ms  # the commit's time
    assert (updated.key, updated.strings["plan"], updated.numbers["credit"]) == ("u1", "x", 1.5)
    assert is_tombstone(users, deleted) and deleted.key == "u2" and deleted.strings["op"] == DELETE


def test_a_key_change_retracts_the_old_key_and_a_truncate_deletes_every_live_key(users):
    mapper = ChangeMapper(users, "id")
    moved = b"U\x00\x00@\x00K\x00\x04t\x00\x00\x00\x02u1nnnN\x00\x04t\x00\x00\x00\x02u9t\x00\x00\x00\x01xnn"
    txn = mapper.transaction(messages(BEGIN, RELATION, moved, COMMIT), lambda events: set())
    assert [(e.key, e.strings["op"]) for e in txn.events] == [("u1", DELETE), ("u9", UPSERT)]
    asked = []

    def live(events):
        asked.append(list(events))
        return live_after({"a", "b"}, users, events)

    txn = mapper.transaction(messages(BEGIN, INSERT, TRUNCATE, COMMIT), live)
    assert txn.truncated and [(e.key, e.strings["op"]) for e in txn.events] == \
        [("u2", UPSERT), ("a", DELETE), ("b", DELETE), ("u2", DELETE)]
    assert len(asked[0]) == 1  # the keys as they are after the transaction's earlier changes


def test_a_change_the_table_refuses_is_rejected_with_its_reason_not_dropped(users):
    mapper = ChangeMapper(users, "id")
    bad = b"I\x00\x00@\x00N\x00\x04t\x00\x00\x00\x02u3nt\x00\x00\x00\x03NaNn"
    no_key = b"D\x00\x00@\x00K\x00\x04nnnn"
    wide = ("中" * 683).encode()  # 2 049 bytes: no key a store can index (a label's bound)
    wide_key = b"D\x00\x00@\x00K\x00\x04t" + len(wide).to_bytes(4, "big") + wide + b"nnn"
    txn = mapper.transaction(messages(BEGIN, RELATION, bad, no_key, wide_key, INSERT, COMMIT), lambda events: set())
    assert [e.key for e in txn.events] == ["u2"]
    assert "credit" in txn.rejected[0] and "finite" in txn.rejected[0]
    assert "REPLICA IDENTITY FULL" in txn.rejected[1]
    assert txn.rejected[2].startswith("id: longer than 2048 bytes as UTF-8")
    # A row moved off such a key (never stored: nothing to delete) keeps its new version.
    moved = (b"U\x00\x00@\x00K\x00\x04t" + len(wide).to_bytes(4, "big") + wide + b"nnnN\x00\x04t\x00\x00\x00\x02u9"
             b"t\x00\x00\x00\x01xnn")
    txn = mapper.transaction(messages(BEGIN, moved, COMMIT), lambda events: set())
    assert [(e.key, e.strings["op"]) for e in txn.events] == [("u9", UPSERT)] and not txn.rejected


def test_a_row_moved_to_a_key_whose_new_row_is_refused_is_still_deleted_from_its_old_key(users):
    """The whole change was rejected, so the old key's row stayed in the stream for good though the
    source had no row of it any more: its delete is written, only the new row is rejected."""
    mapper = ChangeMapper(users, "id")
    relation = decode(RELATION)
    moved_nan = Update(16384, ("u1", None, None, None), "K", ("u9", "pro", "NaN", "t"))
    moved_empty = Update(16384, ("u2", None, None, None), "K", ("", "pro", "1", "t"))
    moved_ok = Update(16384, ("u3", None, None, None), "K", ("u8", "pro", "1", "t"))
    txn = mapper.transaction([decode(BEGIN), relation, moved_nan, moved_empty, moved_ok, decode(COMMIT)],
                             lambda events: set())
    assert [(e.key, e.strings["op"]) for e in txn.events] == [("u1", DELETE), ("u2", DELETE), ("u3", DELETE),
                                                             ("u8", UPSERT)]
    assert txn.rejected == [
        "credit: value must be a finite number (the row moved off key 'u1': its delete is written)",
        "user_id: empty key (a row's key is at least one character) (the row moved off key 'u2': its delete is"
        " written)"]
    # A refused change that moves no row is rejected whole, as before.
    txn = mapper.transaction([decode(BEGIN), Update(16384, None, None, ("u4", "pro", "NaN", "t")), decode(COMMIT)],
                             lambda events: set())
    assert txn.events == [] and txn.rejected == ["credit: value must be a finite number"]


@pytest.mark.parametrize(("text", "number"), [
    ("12", 12.0), ("-1.5e3", -1500.0), ("0.25", 0.25), ("12   ", 12.0),  # char(n) pads with spaces
    ("1_000", None), ("١٢", None), ("１２", None), ("inf", None), ("NaN", None), ("+1", None), ("", None),
])
def test_a_text_column_is_a_value_only_when_it_holds_a_json_number(users, text, number):
    """Python's float() also reads underscores, Unicode digits and inf: a text column's number is
    what a JSON number may be, as a value posted to the API is."""
    mapper = ChangeMapper(users, "id")
    relation = Relation(16384, "public", "users", "d", (Column("id", 25, True), Column("credit", 25, False)))
    txn = mapper.transaction([decode(BEGIN), relation, Insert(16384, ("u1", text)), decode(COMMIT)], lambda events: set())
    if number is None:
        assert txn.events == [] and txn.rejected == [f"credit: {text!r} is not a number"]
    else:
        assert not txn.rejected and txn.events[0].numbers["credit"] == number


def test_an_unchanged_toasted_column_keeps_the_old_rows_value_or_the_streams(users):
    """An update leaving a TOASTed (`u`) column unchanged does not carry it: the column kept its
    value, which the whole old row holds ("O", FULL), else the row the stream holds for the key
    (the old key, for a row that moved: "K" has null in every other column, never a value)."""
    mapper = ChangeMapper(users, "id")
    moved_with_key = Update(16384, ("u1", None, None, None), "K", ("u9", UNCHANGED, "2", "t"))
    txn = mapper.transaction([decode(BEGIN), decode(RELATION), moved_with_key, decode(COMMIT)], lambda events: set())
    # The stream holds no u1: u9's row is neither blanked nor dropped, but rejected; u1 is gone all the same.
    assert [(e.key, e.strings["op"]) for e in txn.events] == [("u1", DELETE)] and len(txn.rejected) == 1
    assert txn.rejected[0].startswith("plan: PostgreSQL keeps its value out of line (TOAST)")
    assert "the stream holds no row of the key" in txn.rejected[0] and "REPLICA IDENTITY FULL" in txn.rejected[0]
    moved_with_row = Update(16384, ("u1", "pro", "1", "f"), "O", ("u9", UNCHANGED, "2", "t"))
    txn = mapper.transaction([decode(BEGIN), moved_with_row, decode(COMMIT)], lambda events: set())
    assert not txn.rejected
    assert [(e.key, e.strings["op"], e.strings["plan"]) for e in txn.events] == [("u1", DELETE, ""), ("u9", UPSERT, "pro")]

    # DEFAULT identity: no old tuple, or the old key. The stream's row of the key holds the value.
    label = "p" * 900  # a valid label, out of line once the whole row is over ~2 kB
    stored = {"u1": {"plan": label, "active": "true", "credit": 1.0}}
    asked = []

    def stored_row(key, events):
        asked.append((key, len(events)))
        return row_after(key, stored.get(key), users, events)

    updated = Update(16384, None, None, ("u1", UNCHANGED, "2", "t"))
    moved = Update(16384, ("u1", None, None, None), "K", ("u7", UNCHANGED, "3", "t"))
    unknown = Update(16384, None, None, ("u5", UNCHANGED, "4", "t"))
    changes = [decode(BEGIN), updated, moved, unknown, decode(COMMIT)]
    assert mapper.kept_keys(changes) == {"u1", "u5"}  # what the follower reads from the log
    txn = mapper.transaction(changes, lambda events: set(), stored_row)
    assert [(e.key, e.strings["op"], e.strings["plan"], e.numbers["credit"]) for e in txn.events] == \
        [("u1", UPSERT, label, 2.0), ("u1", DELETE, "", None), ("u7", UPSERT, label, 3.0)]
    assert asked == [("u1", 0), ("u1", 1), ("u5", 3)]  # after the transaction's changes so far
    assert len(txn.rejected) == 1 and txn.rejected[0].startswith("plan: PostgreSQL keeps its value out of line")


def test_an_empty_key_is_a_rejected_change_not_a_row(users):
    # A row keyed "" was written, then missing from the table's listing and impossible to delete.
    mapper = ChangeMapper(users, "id")
    insert = b"I\x00\x00@\x00N\x00\x04t\x00\x00\x00\x00nnn"
    delete = b"D\x00\x00@\x00K\x00\x04t\x00\x00\x00\x00nnn"
    moved = b"U\x00\x00@\x00K\x00\x04t\x00\x00\x00\x00nnnN\x00\x04t\x00\x00\x00\x02u9t\x00\x00\x00\x01xnn"
    txn = mapper.transaction(messages(BEGIN, RELATION, insert, delete, moved, COMMIT), lambda events: set())
    assert txn.rejected == ["user_id: empty key (a row's key is at least one character)", "id: empty key"]
    # A row moved off the empty key (never stored: nothing to delete) keeps its new version.
    assert [(e.key, e.strings["op"]) for e in txn.events] == [("u9", UPSERT)]


def test_schema_report_names_missing_ignored_added_and_removed_columns():
    report = schema_report(("op", "plan", "country"), "id", ["id", "plan", "x"], ["id", "plan", "x", "y"])
    assert report == {"missing": ["country"], "ignored": ["x", "y"], "added": ["y"], "removed": []}


# -- the log's position ------------------------------------------------------------------------------


def test_the_log_records_a_sources_position_with_the_append_or_not_at_all(tmp_path, users, log_backend):
    """On both logs: the embedded one (one SQLite transaction), Kafka (one Kafka transaction with
    the compacted positions topic)."""
    test_log = log_backend.new(tmp_path / "log")
    catalog = parse_catalog(CONFIG)
    log = test_log.open(catalog)
    assert log.source_position("cdc:users") is None
    rows = [tombstone(users, "u1", T0)]
    log.append_at(users, rows, T0, "cdc:users", "p1", None)
    log.append_at(users, [], T0, "cdc:users", "p2", "p1")  # a position without rows (nothing of ours changed)
    assert log.source_position("cdc:users") == "p2"
    with pytest.raises(PositionConflict, match="another writer"):
        log.append_at(users, rows, T0, "cdc:users", "p3", "p1")
    assert log.source_position("cdc:users") == "p2"
    assert sum(b.num_rows for p, o in log.offsets("users").items() for b in log.read(users, p, o.start, o.end)) == 1  # the refused append wrote nothing
    if not test_log.kafka:
        with pytest.raises(KeyError):  # a failed append records no position either
            log._append_encoded(users, {9: [(1, b"x")]}, T0, ("cdc:users", "p9", "p2"))
        assert log.source_position("cdc:users") == "p2"

    # A second writer of the source (another replica took over) moves it on: the first one, back,
    # finds its expected position gone (on Kafka: its producer was fenced; a new one checks again).
    other = test_log.open(catalog)
    other.append_at(users, rows, T0, "cdc:users", "p3", "p2")
    with pytest.raises(PositionConflict, match="another writer"):
        log.append_at(users, rows, T0, "cdc:users", "p4", "p2")
    other.close()
    log.append_at(users, rows, T0, "cdc:users", "p4", "p3")  # the writer again, from where the other left it
    log.close()
    again = test_log.open(catalog)
    assert again.source_position("cdc:users") == "p4"
    assert sum(b.num_rows for p, o in again.offsets("users").items() for b in again.read(users, p, o.start, o.end)) == 3
    again.close()


def test_struct_layout_of_a_begin_message_is_what_the_docs_say():
    # Byte1('B') Int64 final LSN, Int64 commit time (µs since 2000-01-01), Int32 xid.
    data = b"B" + struct.pack("!QqI", 5, 1_000_000, 7)
    assert decode(data) == Begin(5, PG_EPOCH_MS + 1000, 7)
    # Byte1('M') Int8 flags (1: transactional), Int64 LSN, String prefix, Int32 length, bytes.
    message = b"M" + struct.pack("!BQ", 0, 9) + b"beat\0" + struct.pack("!i", 2) + b"hi"
    assert decode(message) == LogicalMessage(False, 9, "beat", b"hi")
