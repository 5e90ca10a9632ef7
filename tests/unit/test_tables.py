"""Changelog tables (kind: table) without Spark: the catalog's rules, rows and tombstones as log
records on both record formats, the compaction selection (Hypothesis) and the embedded log's
compaction pass (offsets kept, reads and a replay from offset 0 giving the same table)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import Catalog, parse_catalog
from catalog.tables import DELETE, UPSERT
from ingest.kafka_source import RECORD_SCHEMA, RecordConverter
from ingest.log import SqliteEventLog
from ingest.log.compaction import Change, KeptKeys, next_drop_ms, offsets_to_drop
from ingest.log.kafka import topic_config
from ingest.log.records import event_to_json, json_to_event
from ingest.tables import TableRowValidator, is_tombstone, record_event, record_value, tombstone
from tests.log_backends import partition_weights

T0 = 1_700_000_000_000
CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan, country]
    values: [credit]
    partitions: 2
    tombstone_retention: 1h
"""


@pytest.fixture(scope="module")
def users():
    return parse_catalog(CONFIG).streams["users"]


# -- catalog -------------------------------------------------------------------------------------


def test_a_table_has_the_implicit_op_dimension_and_survives_a_round_trip(users):
    assert users.kind == "table"
    assert users.dimensions == ("op", "plan", "country")
    assert users.distinct_fields == ("user_id",)
    again = Catalog.model_validate_json(parse_catalog(CONFIG).model_dump_json())
    assert again.streams["users"] == users
    assert parse_catalog("streams: {s: {key_field: k}}").streams["s"].kind == "stream"


@pytest.mark.parametrize(("extra", "message"), [
    ("{kind: table}", "needs key_field"),
    ("{kind: table, key_field: u, event_id_field: e}", "cannot declare event_id_field"),
    ("{kind: table, key_field: u, sessions: {key: u}}", "cannot declare sessions"),
    ("{kind: table, key_field: u, sent_time_field: s}", "cannot declare sent_time_field"),
    ("{kind: table, key_field: u, distinct: [x]}", "must include its key_field"),
    ("{kind: table, key_field: u, values: [op]}", "implicit dimension"),
    ("{kind: table, key_field: u, dimensions: [u]}", "cannot also be a dimension"),
    ("{key_field: u, tombstone_retention: 1h}", "tombstone_retention is a setting of tables"),
    # A field named like the delete flag: every row was refused ("_deleted: must be true or false"),
    # and a delete of key k wrote a tombstone of the key "true" (the flag overwrote the key).
    ("{kind: table, key_field: _deleted}", "'_deleted' is the flag of a row that deletes its key"),
    ("{kind: table, key_field: u, dimensions: [_deleted]}", "'_deleted' is the flag"),
    ("{kind: table, key_field: u, values: [_deleted]}", "'_deleted' is the flag"),
    ("{kind: table, key_field: u, time_field: _deleted}", "'_deleted' is the flag"),
    ("{kind: table, key_field: u, distinct: [u, _deleted]}", "'_deleted' is the flag"),
    ("{kind: view, key_field: u}", "kind"),
])
def test_what_a_table_may_not_declare_is_refused_with_its_reason(extra, message):
    with pytest.raises(Exception, match=message):
        parse_catalog(f"streams:\n  t: {extra}\n")


# -- rows ----------------------------------------------------------------------------------------


def test_rows_are_upserts_and_a_flagged_row_a_tombstone(users):
    v = TableRowValidator(users)
    up = v.validate({"user_id": "u1", "plan": "pro", "credit": 3}, T0)
    assert (up.key, up.event_time_ms, up.strings["op"], up.strings["plan"], up.numbers["credit"]) == \
        ("u1", T0, UPSERT, "pro", 3.0)
    assert up.strings["country"] == ""
    timed = v.validate({"user_id": "u1", "time": T0 - 5}, T0)
    assert timed.event_time_ms == T0 - 5
    gone = v.validate({"user_id": "u1", "_deleted": True}, T0)
    assert is_tombstone(users, gone) and gone.key == "u1" and gone.strings["op"] == DELETE
    assert not is_tombstone(users, up)


@pytest.mark.parametrize(("row", "message"), [
    ([1], "must be a JSON object"),
    ({"plan": "pro"}, "user_id: required field is missing"),
    ({"user_id": "u", "op": "delete"}, "op: set by Sketchboard"),
    ({"user_id": "u", "age": 3}, "age: not a column of table 'users'"),
    ({"user_id": "u", "_deleted": "yes"}, "_deleted: must be true or false"),
    ({"user_id": "u", "plan": "x", "_deleted": True}, "plan: a delete carries only the key"),
    ({"user_id": "u", "credit": "lots"}, "credit: must be a number"),
    # An empty key was written, then missing from the listing (its cursor "" is the first page's)
    # and impossible to delete.
    ({"user_id": ""}, "user_id: empty key"),
    ({"user_id": "", "_deleted": True}, "user_id: empty key"),
])
def test_bad_rows_are_refused_with_their_reason(users, row, message):
    with pytest.raises(ValueError, match=message):
        TableRowValidator(users).validate(row, T0)


def test_kafka_records_a_tombstone_is_a_null_value_and_reads_back(users):
    v = TableRowValidator(users)
    up, gone = v.validate({"user_id": "u1", "plan": "pro"}, T0), tombstone(users, "u2", T0 + 1)
    assert record_value(users, gone, event_to_json) is None
    value = record_value(users, up, event_to_json)
    back = record_event(users, v.events, b"u1", value, T0 + 9, json_to_event)
    assert back == up
    assert record_event(users, v.events, b"u2", None, T0 + 1, json_to_event) == gone
    with pytest.raises(ValueError, match="without a key"):
        record_event(users, v.events, None, None, T0, json_to_event)
    # A tombstone's key meets the rules of a label, as a POSTed delete's does.
    with pytest.raises(ValueError, match=r"a tombstone's key: contains a NUL character \(U\+0000\)"):
        record_event(users, v.events, b"u\x00", None, T0, json_to_event)
    with pytest.raises(ValueError, match="a tombstone's key: longer than 1024 characters"):
        record_event(users, v.events, b"u" * 1025, None, T0, json_to_event)
    with pytest.raises(ValueError, match="a tombstone's key: empty key"):
        record_event(users, v.events, b"", None, T0, json_to_event)
    with pytest.raises(ValueError, match="user_id: empty key"):
        record_event(users, v.events, b"", b'{"user_id":"","time":1700000000000}', T0, json_to_event)
    # A direct producer's JSON row (no op) is an upsert; an event stream still refuses a null value.
    direct = record_event(users, v.events, b"u3", b'{"user_id":"u3","time":1700000000000}', T0, json_to_event)
    assert direct.strings["op"] == UPSERT
    events = parse_catalog("streams: {s: {key_field: k}}").streams["s"]
    from ingest.events import EventValidator

    with pytest.raises(ValueError, match="tombstone"):
        record_event(events, EventValidator(events), b"k", None, T0, json_to_event)


@pytest.mark.parametrize(("key", "value", "message"), [
    # Kafka compacts by the record key: u2's row filed under u1 would vanish with u1's tombstone.
    (b"u1", b'{"user_id":"u2","plan":"pro"}', "the record's key 'u1' is not its row's 'user_id' 'u2'"),
    (None, b'{"user_id":"u3"}', "a record without a key"),
    (b"\xff", b'{"user_id":"u1"}', "a record whose key is not UTF-8"),
    # The rules of a POSTed row (TableRowValidator): a delete is the key only, `op` is Sketchboard's.
    (b"u1", b'{"user_id":"u1","_deleted":true,"plan":"pro"}', "plan: a delete carries only the key"),
    (b"u1", b'{"user_id":"u1","op":"delete"}', "op: set by Sketchboard"),
])
def test_a_tables_json_record_meets_a_posted_rows_rules_under_its_own_key(users, key, value, message):
    with pytest.raises(ValueError, match=message):
        record_event(users, TableRowValidator(users).events, key, value, T0, json_to_event)


def test_a_tables_json_record_is_the_change_its_row_asks_for(users):
    events = TableRowValidator(users).events
    deleted = record_event(users, events, b"u1", b'{"user_id":"u1","_deleted":true,"time":1700000000005}', T0,
                           json_to_event)
    assert deleted == tombstone(users, "u1", T0 + 5)
    # Sketchboard's own upserts carry op "upsert"; a row without the time takes the record's timestamp.
    upsert = record_event(users, events, b"u1", b'{"user_id":"u1","op":"upsert","plan":"pro"}', T0 + 7, json_to_event)
    assert (upsert.strings["op"], upsert.strings["plan"], upsert.event_time_ms, upsert.extra) == (UPSERT, "pro", T0 + 7, {})
    with pytest.raises(ValueError, match="time: required field is missing"):
        record_event(users, events, b"u1", b'{"user_id":"u1"}', None, json_to_event)
    # A column declared since the record was read (a newer definition wrote it; a reprocessing run
    # reads it with that one): kept as the event's extra field, as an event stream's are.
    newer = record_event(users, events, b"u1", b'{"user_id":"u1","op":"upsert","age":40}', T0, json_to_event)
    assert newer.extra == {"age": 40}


def test_the_kafka_source_turns_a_tables_records_into_rows_tombstones_included(users):
    catalog = parse_catalog(CONFIG)
    up = record_value(users, TableRowValidator(users).validate({"user_id": "u1", "plan": "pro"}, T0), event_to_json)
    batch = pa.RecordBatch.from_pylist([
        {"topic": "p.users", "partition": 1, "offset": 7, "ingest_time": T0, "value": up, "key": b"u1"},
        {"topic": "p.users", "partition": 1, "offset": 8, "ingest_time": T0 + 1, "value": None, "key": b"u1"},
        {"topic": "p.users", "partition": 1, "offset": 9, "ingest_time": T0 + 2, "value": None, "key": None},
        {"topic": "p.users", "partition": 1, "offset": 10, "ingest_time": T0 + 3, "value": up, "key": b"u2"},
    ], schema=RECORD_SCHEMA)
    rows = pa.Table.from_batches(list(RecordConverter(catalog, "p.").convert(batch))).to_pylist()
    by_offset = {r["offset"]: r for r in rows}
    assert by_offset[7]["dims"] == ["upsert", "pro", ""] and by_offset[7]["ids"] == ["u1"]
    assert by_offset[8]["dims"] == ["delete", "", ""] and by_offset[8]["event_time"] == T0 + 1
    assert by_offset[9]["error_kind"] == "invalid" and "without a key" in by_offset[9]["error"]
    assert by_offset[10]["error_kind"] == "invalid" and "the record's key 'u2' is not its row's" in by_offset[10]["error"]


def test_a_tables_kafka_topic_is_compacted(users):
    assert topic_config(users) == {"message.timestamp.type": "LogAppendTime", "cleanup.policy": "compact",
                                   "delete.retention.ms": "3600000"}
    events = parse_catalog("streams: {s: {key_field: k}}").streams["s"]
    assert "cleanup.policy" not in topic_config(events)


# -- compaction selection ------------------------------------------------------------------------

changes_strategy = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", None]), st.booleans(),
                                      st.integers(0, 100)), max_size=60)


def as_changes(raw) -> list[Change]:
    return [Change(offset, key, dead, at) for offset, (key, dead, at) in enumerate(raw)]


def replay(changes) -> dict[str, int]:
    """The table a consumer builds from offset 0: key -> offset of the row's change."""
    table: dict[str, int] = {}
    for c in sorted(changes, key=lambda c: c.offset):
        if c.key is None:
            continue
        if c.tombstone:
            table.pop(c.key, None)
        else:
            table[c.key] = c.offset
    return table


@settings(max_examples=300, deadline=None)
@given(changes_strategy, st.integers(0, 150), st.integers(0, 100))
def test_a_compacted_partition_replays_to_the_same_table(raw, now, retention):
    changes = as_changes(raw)
    drop = offsets_to_drop(changes, now_ms=now, tombstone_retention_ms=retention)
    kept = [c for c in changes if c.offset not in drop]
    assert replay(kept) == replay(changes)
    # At most one record per key is kept; the newest one of each key always is, unless it is a
    # tombstone past its retention; keyless records are never dropped.
    newest = {c.key: c for c in changes if c.key is not None}
    assert len([c for c in kept if c.key is not None]) <= len(newest)
    for key, c in newest.items():
        assert (c.offset in drop) == (c.tombstone and c.ingest_time_ms < now - retention), key
    assert all(c.offset not in drop for c in changes if c.key is None)
    # A second pass at the same time drops nothing more.
    assert offsets_to_drop(kept, now_ms=now, tombstone_retention_ms=retention) == set()


@settings(max_examples=300, deadline=None)
@given(changes_strategy, st.integers(0, 150), st.integers(0, 100), st.none() | st.integers(0, 60))
def test_a_partition_with_nothing_to_drop_has_nothing_until_its_next_drop_time(raw, now, retention, read_through):
    """What lets the embedded log skip a table partition nothing was written to: after a pass,
    the same changes and read offset give nothing to drop before next_drop_ms and something from it on."""
    changes = as_changes(raw)
    drop = offsets_to_drop(changes, now_ms=now, tombstone_retention_ms=retention, read_through=read_through)
    kept = [c for c in changes if c.offset not in drop]
    due = next_drop_ms(kept, tombstone_retention_ms=retention, read_through=read_through)
    assert due is None or due > now
    for later in range(now, now + 250, 7):
        again = offsets_to_drop(kept, now_ms=later, tombstone_retention_ms=retention, read_through=read_through)
        assert bool(again) == (due is not None and later >= due), (later, due, again)
    if due is not None:
        assert offsets_to_drop(kept, now_ms=due, tombstone_retention_ms=retention, read_through=read_through)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(changes_strategy, st.integers(0, 40), st.none() | st.integers(0, 200)), min_size=1,
                max_size=5), st.integers(0, 100))
def test_a_pass_over_what_was_appended_since_drops_what_a_pass_over_everything_drops(passes, retention):
    """KeptKeys: a pass that reads only the records appended since the last complete pass, with
    the newest offset of each key that pass kept, drops what offsets_to_drop over every record
    left drops, pass after pass, and next_drop_ms is the same."""
    held: list[Change] = []  # what the full passes have left
    kept, offset, now = None, 0, 0
    for raw, later, read_through in passes:
        appended = [Change(offset + i, key, dead, now + at) for i, (key, dead, at) in enumerate(raw)]
        offset += len(raw) + 1
        now += later
        held += appended
        drop = offsets_to_drop(held, now_ms=now, tombstone_retention_ms=retention, read_through=read_through)
        if kept is None:
            kept = KeptKeys.of([c for c in held if c.offset not in drop], offset)
        else:
            assert kept.drop_with(appended, offset, now_ms=now, tombstone_retention_ms=retention,
                                  read_through=read_through) == drop
        held = [c for c in held if c.offset not in drop]
        assert kept == KeptKeys.of(held, offset)
        assert kept.next_drop_ms(tombstone_retention_ms=retention, read_through=read_through) \
            == next_drop_ms(held, tombstone_retention_ms=retention, read_through=read_through)


# -- the embedded log's compaction pass ----------------------------------------------------------


def table_of(log, stream) -> dict[str, tuple]:
    """Replay every partition from its start: key -> (plan, credit) of its newest row."""
    table: dict[str, tuple] = {}
    for partition, offsets in log.offsets(stream.name).items():
        for batch in log.read(stream, partition, offsets.start, offsets.end):
            for r in batch.to_pylist():
                if r["op"] == DELETE:
                    table.pop(r["user_id"], None)
                else:
                    table[r["user_id"]] = (r["plan"], r["credit"])
    return table


def all_offsets(log, stream) -> dict[int, list[int]]:
    return {p: [o for b in log.read(stream, p, 0, offs.end) for o in b.column(0).to_pylist()]
            for p, offs in log.offsets(stream.name).items()}


def test_compaction_keeps_offsets_and_the_table_and_drops_old_tombstones(tmp_path, users):
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    log.ensure_topic(users)
    v = TableRowValidator(users)
    for round_ in range(5):  # five appends (segments) of the same 40 keys, then deletes of 10
        log.append(users, [v.validate({"user_id": f"u{k}", "plan": f"p{round_}", "credit": round_ * k}, T0)
                           for k in range(40)], T0 + round_)
    before_deletes = {p: o.end for p, o in log.offsets("users").items()}
    log.append(users, [tombstone(users, f"u{k}", T0 + 10) for k in range(10)], T0 + 10)
    before, offsets_before = table_of(log, users), log.offsets("users")
    assert len(before) == 30

    dropped = log.compact(T0 + 20)  # tombstones younger than their hour: kept
    assert dropped == 40 * 4 + 10
    assert table_of(log, users) == before
    assert log.offsets("users") == offsets_before  # start and end offsets never change
    kept = all_offsets(log, users)
    assert sum(len(o) for o in kept.values()) == 40
    for offsets in kept.values():  # per partition: its keys' last round and its tombstones, in order
        keys = len(offsets)
        assert offsets == sorted(offsets) and all(o >= 4 * keys - 1 for o in offsets)
    # Reading from an offset inside a compacted segment gives the records from there on only.
    p, offsets = next((p, o) for p, o in kept.items() if len(o) > 2)
    assert [o for b in log.read(users, p, offsets[1], offsets_before[p].end) for o in b.column(0).to_pylist()] \
        == offsets[1:]

    assert log.compact(T0 + 20) == 0  # nothing more at the same time
    # The tombstones' hour is over, but the pipeline has committed only up to before them: a
    # pipeline that stored those rows and has not read their deletes would keep them for good.
    assert log.compact(T0 + 10 + 3_600_001, {"users": before_deletes}) == 0
    ends = {p: o.end for p, o in offsets_before.items()}
    assert log.compact(T0 + 10 + 3_600_001, {"users": ends}) == 10  # read: they go
    assert table_of(log, users) == before
    assert log.offsets("users") == offsets_before
    # New rows after a compaction land at the end as usual, and the next pass takes the old ones.
    log.append(users, [v.validate({"user_id": "u20", "plan": "new"}, T0)], T0 + 30)
    assert log.compact(T0 + 10 + 3_600_001) == 1
    assert table_of(log, users)["u20"] == ("new", None)
    # what retention by size would weigh: the segments' bytes after the rewrites and deletes
    assert all(kept == summed for kept, summed in partition_weights(tmp_path / "log.db").values())
    log.close()


def test_retention_by_age_spares_tables_and_an_event_stream_is_not_compacted(tmp_path, users):
    events = parse_catalog("streams: {clicks: {key_field: user_id, partitions: 1}}").streams["clicks"]
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    log.ensure_topic(users)
    log.ensure_topic(events)
    from ingest.events import EventValidator

    log.append(events, [EventValidator(events).validate({"time": T0, "user_id": "a"})] * 3, T0)
    log.append(users, [TableRowValidator(users).validate({"user_id": "a"}, T0)] * 3, T0)
    assert log.compact(T0) == 2  # the table's two older copies only
    assert log.apply_retention(T0 + 10 * 86_400_000, 86_400_000, 1 << 30) == 3  # the events only
    assert sum(o.end - o.start for o in log.offsets("clicks").values()) == 0
    assert table_of(log, users) == {"a": ("", None)}
    log.close()



def users_log_of_two_appends(tmp_path):
    """(the one-partition users table, its log, its row validator): u0-u9 on p0 at offsets 0-9,
    then u0-u4 on p1 at 10-14 (superseding 0-4)."""
    users = parse_catalog(CONFIG.replace("partitions: 2", "partitions: 1")).streams["users"]
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    log.ensure_topic(users)
    v = TableRowValidator(users)
    log.append(users, [v.validate({"user_id": f"u{k}", "plan": "p0"}, T0) for k in range(10)], T0)     # 0-9
    log.append(users, [v.validate({"user_id": f"u{k}", "plan": "p1"}, T0) for k in range(5)], T0 + 1)  # 10-14
    return users, log, v

def test_an_append_during_a_pass_does_not_wait_and_a_segment_changed_meanwhile_waits_for_the_next_pass(
        tmp_path, monkeypatch):
    """The pass decides what goes without the log's lock (docs/tables.md "Log compaction"): an
    append made meanwhile from another thread returns at once, after the records the pass read;
    a segment another pass rewrote in between is checked again under the lock and left alone, not
    overwritten with what this pass decided from its older copy (that would bring back records the
    other pass dropped)."""
    import threading

    import ingest.log.sqlite_compaction as pass_module

    users, log, v = users_log_of_two_appends(tmp_path)
    decide, nested = pass_module.offsets_to_drop, []

    def deciding(changes, **kwargs):
        drop = decide(changes, **kwargs)
        if not nested:  # the outer pass has read the segments (it drops 0-4) and not written yet
            nested.append(drop)
            appender = threading.Thread(target=log.append, args=(
                users, [v.validate({"user_id": f"u{k}", "plan": "late"}, T0) for k in range(5, 8)], T0 + 5))  # 15-17
            appender.start()
            appender.join(10)
            assert not appender.is_alive(), "an append waited on the compaction pass"
            nested.append(log.compact(T0 + 10))  # rewrites the first segment: 8 and 9 left in it
        return drop

    monkeypatch.setattr(pass_module, "offsets_to_drop", deciding)
    first = log.compact(T0 + 10)
    assert nested == [set(range(5)), 8]
    assert first == 0  # its only rewrite was of a segment changed since it read it
    assert all_offsets(log, users) == {0: [8, 9, *range(10, 18)]}
    assert log.offsets("users")[0].end == 18
    assert table_of(log, users) == {**{f"u{k}": ("p1", None) for k in range(5)},
                                    **{f"u{k}": ("late", None) for k in range(5, 8)}, "u8": ("p0", None),
                                    "u9": ("p0", None)}
    assert log.compact(T0 + 10) == 0
    log.close()


def counted_decodes(monkeypatch) -> list[int]:
    """[segments a compaction pass has decoded so far], counted from now on (reset it to zero at will)."""
    import ingest.log.sqlite_compaction as pass_module

    decoded = [0]
    decode = pass_module.decode_segment

    def counting(data):
        decoded[0] += 1
        return decode(data)

    monkeypatch.setattr(pass_module, "decode_segment", counting)
    return decoded


def test_a_pass_reads_a_table_partition_again_only_once_something_may_have_changed(tmp_path, monkeypatch):
    """The API process compacts once a minute: decoding every segment of every table each time
    grows with the tables' history. A partition a pass found nothing to drop in is looked at again
    on a write to it (from any process), a move of the readers' offset, or once its first read
    tombstone outlives its retention; not before. And then only the segments appended since the
    last complete pass are read, with those holding what they supersede."""
    decoded = counted_decodes(monkeypatch)

    def compact(at, through=None):  # (records dropped, segments decoded)
        decoded[0] = 0
        return log.compact(at, through), decoded[0]

    users, log, v = users_log_of_two_appends(tmp_path)
    log.append(users, [tombstone(users, "u5", T0 + 2)], T0 + 2)                                          # 15
    read = {"users": {0: 16}}
    assert compact(T0 + 10, read) == (6, 3)  # u0-u4's first rows, u5's row under its tombstone
    assert compact(T0 + 10, read) == (0, 0)  # what it left has nothing more to drop: remembered
    assert compact(T0 + 20, read) == (0, 0)
    due = T0 + 2 + 3_600_000 + 1  # the tombstone's hour is over (tombstone_retention: 1h)
    assert compact(due - 1, read) == (0, 0)
    # A pass when the tombstone may go, without any write: what the first pass kept says where it
    # is, and only its segment is read (and rewritten).
    assert compact(due, read) == (1, 1)
    assert compact(due, read) == (0, 0)
    assert compact(due, None) == (0, 0)  # the readers' offsets moved: nothing appended to read
    assert compact(due, None) == (0, 0)
    other = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")  # another process's append
    other.append(users, [v.validate({"user_id": "u1", "plan": "p2"}, T0)], T0 + 3)                     # 16
    other.close()
    assert compact(due) == (1, 2)  # u1's p1 row goes: the appended segment and the one holding it
    assert table_of(log, users)["u1"] == ("p2", None) and "u5" not in table_of(log, users)
    log.close()


# One step on both logs: ("append", keys, tombstone or not, by another process or not, ms later),
# ("compact", ms later, read through the end or not, by another process or not)
log_steps = st.lists(st.one_of(
    st.tuples(st.just("append"), st.lists(st.integers(0, 6), min_size=1, max_size=6), st.booleans(), st.booleans(),
              st.integers(0, 2_000_000)),
    st.tuples(st.just("compact"), st.integers(0, 2_000_000), st.booleans(), st.booleans())), min_size=1, max_size=14)


@settings(max_examples=60, deadline=None)
@given(log_steps)
def test_a_log_compacting_what_was_appended_since_keeps_what_full_passes_keep(steps):
    """The embedded log's passes that read only the segments appended since the last complete one
    (and those holding what they supersede) leave the same records, pass for pass, as passes that
    read every segment: through appends and passes of another process (another connection to the
    file), tombstones outliving their hour and the readers' offsets moving."""
    import tempfile
    from pathlib import Path

    users = parse_catalog(CONFIG).streams["users"]
    v = TableRowValidator(users)
    with tempfile.TemporaryDirectory() as tmp:
        logs = [SqliteEventLog(Path(tmp) / f"{name}.db", synchronous="OFF") for name in ("kept", "full")]
        for log in logs:
            log.ensure_topic(users)
        now = T0
        for step in steps:
            if step[0] == "append":
                _, keys, dead, elsewhere, later = step
                now += later
                rows = [tombstone(users, f"u{k}", now) if dead and i % 2 else
                        v.validate({"user_id": f"u{k}", "plan": f"p{now}"}, now) for i, k in enumerate(keys)]
            else:
                _, later, read_all, elsewhere = step
                now += later
            dropped = []
            for log in logs:
                target = SqliteEventLog(log.path, synchronous="OFF") if elsewhere else log
                if step[0] == "append":
                    target.append(users, rows, now)
                else:
                    if log is logs[1]:
                        log._compaction_kept.clear()  # every pass of this one reads every segment
                    through = {"users": {p: o.end for p, o in log.offsets("users").items()}} if read_all else None
                    dropped.append(target.compact(now, through))
                if elsewhere:
                    target.close()
            assert len(set(dropped)) <= 1, (step, dropped)
            assert all_offsets(logs[0], users) == all_offsets(logs[1], users), step
        for log in logs:
            log.close()


@pytest.mark.parametrize("limit, decoded_after_an_append", [(10, 2), (9, 3)])
def test_a_log_keeps_the_keys_of_its_last_pass_only_up_to_its_limit(tmp_path, monkeypatch, limit,
                                                                     decoded_after_an_append):
    """What a complete pass kept costs memory per key: past KEPT_KEYS_LIMIT (over all the log's
    table partitions) the next pass reads every segment again, as before."""
    import ingest.log.sqlite_compaction as pass_module

    monkeypatch.setattr(pass_module, "KEPT_KEYS_LIMIT", limit)
    decoded = counted_decodes(monkeypatch)
    users, log, v = users_log_of_two_appends(tmp_path)  # 10 keys
    assert log.compact(T0 + 10) == 5
    log.append(users, [v.validate({"user_id": "u7", "plan": "p2"}, T0)], T0 + 2)  # 15, supersedes 7
    decoded[0] = 0
    assert log.compact(T0 + 10) == 1
    assert decoded[0] == decoded_after_an_append  # (the new segment and 7's) or all three
    log.close()


def test_an_append_during_a_pass_that_drops_is_read_by_the_next_pass(tmp_path, monkeypatch):
    """A pass remembers what it left as having nothing to drop only if nothing was written to the
    partition while it decided: an append made meanwhile may supersede a row it kept."""
    import ingest.log.sqlite_compaction as pass_module

    users, log, v = users_log_of_two_appends(tmp_path)
    decide, appended = pass_module.offsets_to_drop, []

    def deciding(changes, **kwargs):
        if not appended:
            appended.append(log.append(users, [v.validate({"user_id": "u5", "plan": "p2"}, T0)], T0 + 2))  # 15
        return decide(changes, **kwargs)

    monkeypatch.setattr(pass_module, "offsets_to_drop", deciding)
    assert log.compact(T0 + 10) == 5  # u0-u4's first rows; it never saw offset 15
    assert log.compact(T0 + 10) == 1  # u5's first row, superseded meanwhile
    assert table_of(log, users)["u5"] == ("p2", None)
    assert all_offsets(log, users) == {0: [6, 7, 8, 9, *range(10, 16)]}
    log.close()


def test_the_newest_change_per_key_carries_its_ingest_time():
    """The batch's newest change of each key (picked on the driver) keeps the time the log accepted
    it: a view's change stream judges future skew against it (aggregates/views.py)."""
    from aggregates.tables import TableChanges
    from store.table_state import TableChange

    batch = pa.table({
        "stream": ["users", "users", "users"],
        "ids": [["u1"], ["u1"], ["u2"]],
        "dims": [[UPSERT, "gold", "nl"], [UPSERT, "free", "nl"], [DELETE, "", ""]],
        "vals": [[1.0], [2.0], [None]],
        "event_time": pa.array([T0, 253_402_214_400_000, T0 + 5], pa.int64()),
        "partition": pa.array([0, 0, 1], pa.int32()),
        "offset": pa.array([3, 4, 7], pa.int64()),
        "ingest_time": pa.array([T0 + 1, T0 + 2, T0 + 6], pa.int64()),
        "error": pa.array([None, None, None], pa.string()),
    })
    changes = TableChanges(parse_catalog(CONFIG)).process(batch, on_driver=True)
    assert changes == {"users": {
        "u1": TableChange({"plan": "free", "country": "nl", "credit": 2.0}, 253_402_214_400_000, 0, 4, T0 + 2),
        "u2": TableChange(None, T0 + 5, 1, 7, T0 + 6)}}


def test_an_append_never_carries_an_earlier_time_than_its_partitions_last(tmp_path, users):
    """Two POSTs read the clock before they take the log (or the clock steps back): the later
    append is stamped with the partition's last append time, so a key's newest change by append
    time is its newest in the log, whether the two are read in one batch or two."""
    from aggregates.tables import TableChanges
    from ingest.source_rows import to_source_batch

    log = SqliteEventLog(tmp_path / "log.db")
    log.ensure_topic(users)
    validator = TableRowValidator(users)
    first = log.append(users, [validator.validate({"user_id": "u1", "plan": "first", "country": "nl"}, T0)], T0)
    (p, (start, _)), = first.ranges.items()
    log.append(users, [validator.validate({"user_id": "u1", "plan": "second", "country": "nl"}, T0 - 5)], T0 - 5)
    rows = [r for b in log.read(users, p, start, start + 2) for r in b.to_pylist()]
    assert [(r["plan"], r["__ingest_time"]) for r in rows] == [("first", T0), ("second", T0)]
    assert log.ingest_time_ms("users", p, start + 1) == T0
    batch = pa.Table.from_batches([to_source_batch(users, p, b) for b in log.read(users, p, start, start + 2)])
    newest = TableChanges(parse_catalog(CONFIG)).process(batch, on_driver=True)["users"]["u1"]
    assert newest.row["plan"] == "second"
    log.close()
