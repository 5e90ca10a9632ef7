"""ingest.log: the log contract, run against every backend through the `backend` fixture (the
embedded SQLite segment log on real files in tmp_path, and Kafka on the session's real broker,
one fresh topic prefix per test), plus the embedded log's own segments and retention and the
Arrow record format. Kafka-only behaviour is in test_log_kafka.py."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from catalog import StreamDef
from ingest.events import Event, EventValidator
from ingest.log import EventLog, PartitionOffsets, SqliteEventLog
from ingest.log.sqlite import PAGE_SIZE
from ingest.log.records import (
    EVENT_TIME,
    EXTRA,
    INGEST_TIME,
    OFFSET,
    decode_segment,
    encode_segment,
    events_to_batch,
    project,
    segment_schema,
)
from ingest.partitioner import partition_for
from tests.log_backends import partition_weights
from tests.sqlite_steps import counted_steps

T0 = 1_700_000_000_000
STREAM = StreamDef(name="clicks", key_field="user", dimensions=("page",), values=("ms",), partitions=4)


def make_events(stream: StreamDef, start: int, n: int, keys: int = 7) -> list[Event]:
    """Events numbered start..start+n-1: value ms = number, key = user<number % keys>."""
    v = EventValidator(stream)
    return [
        v.validate({"time": T0 + i, "user": f"user{i % keys}", "page": f"/p{i % 3}", "ms": float(i), "note": i})
        for i in range(start, start + n)
    ]


class Model:
    """What the log should hold: per partition, the event numbers in offset order."""

    def __init__(self) -> None:
        self.rows: dict[int, list[int]] = defaultdict(list)

    def add(self, stream: StreamDef, events: list[Event]) -> None:
        for e in events:
            self.rows[partition_for(e.key, stream.partitions)].append(int(e.numbers["ms"]))


def read_table(log: EventLog, stream: StreamDef, partition: int, start: int, end: int) -> pa.Table:
    batches = list(log.read(stream, partition, start, end))
    if not batches:
        return pa.table({OFFSET: pa.array([], pa.int64())})
    return pa.Table.from_batches(batches)


def offsets_read(log: EventLog, stream: StreamDef, partition: int, start: int, end: int) -> list[int]:
    return read_table(log, stream, partition, start, end).column(OFFSET).to_pylist()


def segment_rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT stream, partition, base_offset, record_count, bytes FROM segments ORDER BY stream, partition, base_offset"
        ).fetchall()


@dataclass
class Backend:
    name: str
    open: Callable[[], EventLog]  # a new handle on the same log (same file, same topics)
    path: Path | None  # the embedded log's SQLite file
    grows_partitions: bool  # ensure_topic adds partitions (embedded) or refuses (Kafka)
    stamps_ingest_time: bool  # the log sets ingest times itself (Kafka LogAppendTime), ignoring the caller's


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def backend(request, tmp_path: Path):
    opened: list[EventLog] = []
    if request.param == "embedded":
        path = tmp_path / "log" / "events.db"
        factory, spec = (lambda: SqliteEventLog(path)), dict(path=path, grows_partitions=True, stamps_ingest_time=False)
    else:
        from ingest.log.kafka import KafkaEventLog

        broker = request.getfixturevalue("kafka_broker")
        prefix = f"test-{uuid.uuid4().hex[:10]}."  # the broker lives for the session: fresh topics per test
        factory = lambda: KafkaEventLog(broker.bootstrap, topic_prefix=prefix, replication_factor=1)  # noqa: E731
        spec = dict(path=None, grows_partitions=False, stamps_ingest_time=True)

    def open_log() -> EventLog:
        opened.append(factory())
        return opened[-1]

    yield Backend(request.param, open_log, **spec)
    for log in opened:
        log.close()


# Tests about the embedded log's own storage (segments, SQLite rows) run on it alone.
embedded_only = pytest.mark.parametrize("backend", ["embedded"], indirect=True)


@pytest.fixture
def path(backend: Backend) -> Path | None:
    return backend.path


@pytest.fixture
def log(backend: Backend):
    log = backend.open()
    log.ensure_topic(STREAM)
    return log


# -- topics ---------------------------------------------------------------------------


def test_ensure_topic_creates_empty_partitions(log: EventLog) -> None:
    assert log.offsets("clicks") == {p: PartitionOffsets(0, 0) for p in range(4)}
    assert log.offsets("unknown") == {}


def test_ensure_topic_is_idempotent_and_can_grow(backend: Backend, log: EventLog) -> None:
    log.append(STREAM, make_events(STREAM, 0, 20), T0)
    before = dict(log.offsets("clicks"))
    log.ensure_topic(STREAM)
    assert log.offsets("clicks") == before
    grown = STREAM.model_copy(update={"partitions": 6})
    if backend.grows_partitions:
        log.ensure_topic(grown)
        after = log.offsets("clicks")
        assert {p: after[p] for p in range(4)} == before
        assert after[4] == after[5] == PartitionOffsets(0, 0)
    else:  # Kafka: an operator's topic is never repartitioned by us; the error says what to do
        with pytest.raises(ValueError, match="has 4 partitions, fewer than the 6 configured.*--partitions 6"):
            log.ensure_topic(grown)
        assert log.offsets("clicks") == before


def test_shrinking_partitions_raises(log: EventLog) -> None:
    with pytest.raises(ValueError, match="can grow but not shrink"):
        log.ensure_topic(STREAM.model_copy(update={"partitions": 2}))
    assert set(log.offsets("clicks")) == {0, 1, 2, 3}


# -- appending ------------------------------------------------------------------------


def test_empty_append(log: EventLog) -> None:
    result = log.append(STREAM, [], T0)
    assert result.ranges == {}
    assert result.count == 0


def test_append_ranges_are_contiguous_per_partition(log: EventLog) -> None:
    model = Model()
    next_offset = defaultdict(int)
    start = 0
    for n in (10, 1, 25, 7):
        events = make_events(STREAM, start, n)
        result = log.append(STREAM, events, T0 + start)
        model.add(STREAM, events)
        assert result.count == n
        expected_counts = defaultdict(int)
        for e in events:
            expected_counts[partition_for(e.key, STREAM.partitions)] += 1
        assert {p: c for p, (_, c) in result.ranges.items()} == dict(expected_counts)
        for p, (first, count) in result.ranges.items():
            # Continues exactly where the partition ended; Kafka may acknowledge a retried record
            # without its offset (None, tests/unit/test_log_kafka.py), never another offset.
            assert first in (next_offset[p], None)
            next_offset[p] += count
        start += n
    assert log.offsets("clicks") == {p: PartitionOffsets(0, next_offset[p]) for p in range(4)}
    # Several streams at once (Kafka: two requests for all their partitions); one with no topic has none.
    assert log.offsets_of(["clicks", "nowhere"]) == {"clicks": log.offsets("clicks"), "nowhere": {}}
    for p in range(4):
        table = read_table(log, STREAM, p, 0, next_offset[p])
        assert table.column(OFFSET).to_pylist() == list(range(next_offset[p]))
        assert [int(x) for x in table.column("ms").to_pylist()] == model.rows[p]


def test_same_key_same_partition(log: EventLog) -> None:
    v = EventValidator(STREAM)
    for key in ("alice", "bob", "carol", "dave", "erin"):
        expected = partition_for(key, STREAM.partitions)
        for i in range(3):
            result = log.append(STREAM, [v.validate({"time": T0 + i, "user": key})], T0)
            assert list(result.ranges) == [expected]
        table = read_table(log, STREAM, expected, 0, log.offsets("clicks")[expected].end)
        assert table.column("user").to_pylist().count(key) == 3
    for p in range(4):
        users = set(read_table(log, STREAM, p, 0, 10_000).column("user").to_pylist()) if log.offsets("clicks")[p].end else set()
        assert all(partition_for(u, 4) == p for u in users)


def test_keyless_events_spread_round_robin(backend: Backend) -> None:
    stream = StreamDef(name="ticks", values=("x",), partitions=3)
    log = backend.open()
    log.ensure_topic(stream)
    v = EventValidator(stream)
    result = log.append(stream, [v.validate({"time": T0, "x": i}) for i in range(9)], T0)
    assert {p: c for p, (_, c) in result.ranges.items()} == {0: 3, 1: 3, 2: 3}


def assert_ingest_times(backend: Backend, got: list, given: list[int], before_ms: int, after_ms: int) -> None:
    """The caller's ingest time, or (Kafka, LogAppendTime) the broker's clock during the append."""
    if not backend.stamps_ingest_time:
        assert got == given
    else:
        assert len(got) == len(given) and all(before_ms - 1000 <= at <= after_ms + 1000 for at in got), got


def test_read_fields(backend: Backend, log: EventLog) -> None:
    events = make_events(STREAM, 0, 30)
    before_ms = int(time.time() * 1000)
    log.append(STREAM, events, T0 + 99)
    after_ms = int(time.time() * 1000)
    p = partition_for("user3", 4)
    table = read_table(log, STREAM, p, 0, 100)
    assert table.schema.names == [OFFSET, EVENT_TIME, INGEST_TIME, "page", "user", "ms", EXTRA]
    mine = [e for e in events if partition_for(e.key, 4) == p]
    assert table.column(EVENT_TIME).to_pylist() == [e.event_time_ms for e in mine]
    assert_ingest_times(backend, table.column(INGEST_TIME).to_pylist(), [T0 + 99] * len(mine), before_ms, after_ms)
    assert table.column("user").to_pylist() == [e.key for e in mine]
    assert table.column("page").to_pylist() == [e.strings["page"] for e in mine]
    assert table.column("ms").to_pylist() == [e.numbers["ms"] for e in mine]
    assert table.column(EXTRA).to_pylist() == [f'{{"note":{int(e.numbers["ms"])}}}' for e in mine]


def test_ingest_time_of_an_offset(backend: Backend, log: EventLog) -> None:
    before_ms = int(time.time() * 1000)
    result = log.append(STREAM, make_events(STREAM, 0, 10, keys=1), T0 + 5)  # all user0
    after_ms = int(time.time() * 1000)
    ((p, (first, count)),) = result.ranges.items()
    times = [log.ingest_time_ms("clicks", p, first + i) for i in range(count)]
    assert_ingest_times(backend, times, [T0 + 5] * count, before_ms, after_ms)
    assert log.ingest_time_ms("clicks", p, first + count) is None  # not written yet
    assert log.ingest_time_ms("clicks", (p + 1) % 4, 0) is None  # an empty partition


def test_first_offset_appended_after_a_time(backend: Backend, log: EventLog) -> None:
    """Where a batch cut at an append time ends (ingest/append_cut.py): from a start, the first
    offset whose record was appended after the cut, checked against each record's own time."""
    p = partition_for("user0", 4)
    for i in range(4):  # four appends of three records each, on Kafka stamped by the broker apart
        log.append(STREAM, make_events(STREAM, 3 * i, 3, keys=1), T0 + 10 * i)
        time.sleep(0.01 if backend.stamps_ingest_time else 0)
    times = [log.ingest_time_ms("clicks", p, o) for o in range(12)]
    assert all(t is not None for t in times) and times == sorted(times)
    for start in (0, 4, 11):
        for cut in sorted({times[0] - 1, *times, times[-1] + 1}):
            want = next((o for o in range(start, 12) if times[o] > cut), None)
            assert log.first_appended_after("clicks", {p: start}, cut) == {p: want}, (start, cut)
    # A partition without records: nothing after any time.
    empty = (p + 1) % 4
    assert log.first_appended_after("clicks", {empty: 0, p: 0}, times[0] - 1) == {empty: None, p: 0}


# -- reading ranges -------------------------------------------------------------------


@pytest.fixture
def segmented(log: EventLog) -> tuple[EventLog, Model, int]:
    """Partition of user0 holds several segments (one per append)."""
    model = Model()
    start = 0
    for n in (14, 21, 7, 35):
        events = make_events(STREAM, start, n)
        log.append(STREAM, events, T0 + start)
        model.add(STREAM, events)
        start += n
    return log, model, partition_for("user0", 4)


@embedded_only
def test_segments_exist(path: Path, segmented) -> None:
    log, _, p = segmented
    assert len([r for r in segment_rows(path) if r[1] == p]) == 4


@pytest.mark.parametrize(
    ("start", "end"),
    [(0, 1), (1, 3), (0, 2), (2, 5), (1, 9), (0, 10_000), (3, 10_000), (5, 5), (7, 3), (10_000, 20_000)],
)
def test_read_ranges(segmented, start: int, end: int) -> None:
    log, model, p = segmented
    total = log.offsets("clicks")[p].end
    table = read_table(log, STREAM, p, start, end)
    expected = list(range(max(0, start), min(end, total)))
    assert table.column(OFFSET).to_pylist() == expected
    if expected:
        assert [int(x) for x in table.column("ms").to_pylist()] == [model.rows[p][o] for o in expected]


def test_read_every_range_exhaustively(segmented) -> None:
    log, model, p = segmented
    total = log.offsets("clicks")[p].end
    for start in range(total + 2):
        for end in range(start, total + 3):
            got = read_table(log, STREAM, p, start, end)
            expected = list(range(start, min(end, total)))
            assert got.column(OFFSET).to_pylist() == expected, (start, end)
            if expected:
                assert [int(x) for x in got.column("ms").to_pylist()] == model.rows[p][start : min(end, total)]


def test_reads_are_batches_with_the_offset_first(segmented) -> None:
    log, _, p = segmented
    for batch in log.read(STREAM, p, 0, 10_000):
        assert isinstance(batch, pa.RecordBatch)
        assert batch.schema.field(0).name == OFFSET
        assert not batch.schema.field(0).nullable


def test_data_survives_reopening(backend: Backend, segmented) -> None:
    log, model, _ = segmented
    offsets = dict(log.offsets("clicks"))
    before = {p: read_table(log, STREAM, p, 0, 10_000) for p in range(4)}
    log.close()
    again = backend.open()
    assert again.offsets("clicks") == offsets
    for p in range(4):
        assert read_table(again, STREAM, p, 0, 10_000).equals(before[p])
    result = again.append(STREAM, make_events(STREAM, 1000, 5, keys=1), T0)  # all user0
    p0 = partition_for("user0", 4)
    assert result.ranges == {p0: (offsets[p0].end, 5)}


def test_failed_append_writes_nothing(path: Path | None, log: EventLog) -> None:
    log.append(STREAM, make_events(STREAM, 0, 12), T0)
    before = dict(log.offsets("clicks"))
    segments_before = segment_rows(path) if path else None
    wider = STREAM.model_copy(update={"partitions": 8})  # the log has only 4 partitions
    events = make_events(wider, 100, 40, keys=40)
    targets = {partition_for(e.key, 8) for e in events}
    assert targets & {0, 1, 2, 3} and targets & {4, 5, 6, 7}  # some partitions succeed before the failure
    with pytest.raises(KeyError, match="has no partition"):
        log.append(wider, events, T0)
    assert log.offsets("clicks") == before
    if path:
        assert segment_rows(path) == segments_before
    for p in range(4):
        assert offsets_read(log, STREAM, p, 0, 10_000) == list(range(before[p].end))
    # the log still works afterwards
    result = log.append(STREAM, make_events(STREAM, 200, 4), T0)
    for p, (first, _) in result.ranges.items():
        assert first == before[p].end


# -- retention ------------------------------------------------------------------------


def test_retention_by_age(tmp_path: Path) -> None:
    one = STREAM.model_copy(update={"partitions": 1})
    log2 = SqliteEventLog(tmp_path / "age.db")
    log2.ensure_topic(one)
    for i, n in enumerate((10, 20, 30)):
        log2.append(one, make_events(one, i * 100, n), ingest_time_ms=T0 + i * 1_000)
    assert log2.offsets("clicks") == {0: PartitionOffsets(0, 60)}
    # nothing is old enough yet
    assert log2.apply_retention(T0 + 2_000, max_age_ms=10_000, max_bytes_per_partition=10**9) == 0
    assert log2.offsets("clicks") == {0: PartitionOffsets(0, 60)}
    # the first two segments are older than 500 ms at T0 + 2500
    assert log2.apply_retention(T0 + 2_500, max_age_ms=500, max_bytes_per_partition=10**9) == 30
    assert log2.offsets("clicks") == {0: PartitionOffsets(30, 60)}
    assert offsets_read(log2, one, 0, 0, 100) == list(range(30, 60))
    assert offsets_read(log2, one, 0, 25, 35) == list(range(30, 35))
    table = read_table(log2, one, 0, 0, 100)
    assert [int(x) for x in table.column("ms").to_pylist()] == list(range(200, 230))
    # appending continues after the end; retention never moves an offset backwards
    result = log2.append(one, make_events(one, 300, 5), ingest_time_ms=T0 + 10_000)
    assert result.ranges == {0: (60, 5)}
    assert log2.apply_retention(T0 + 10_000, max_age_ms=500, max_bytes_per_partition=10**9) == 30
    assert log2.offsets("clicks") == {0: PartitionOffsets(60, 65)}
    assert log2.apply_retention(T0, max_age_ms=10**9, max_bytes_per_partition=10**9) == 0
    assert log2.offsets("clicks") == {0: PartitionOffsets(60, 65)}
    # everything old: all dropped, start == end, and the next append goes on from there
    assert log2.apply_retention(T0 + 100_000, max_age_ms=1, max_bytes_per_partition=10**9) == 5
    assert log2.offsets("clicks") == {0: PartitionOffsets(65, 65)}
    assert offsets_read(log2, one, 0, 0, 1_000) == []
    assert log2.append(one, make_events(one, 400, 2), T0 + 100_000).ranges == {0: (65, 2)}
    log2.close()


def test_retention_by_size(tmp_path: Path) -> None:
    one = STREAM.model_copy(update={"partitions": 1})
    path = tmp_path / "size.db"
    log = SqliteEventLog(path)
    log.ensure_topic(one)
    for i in range(5):
        log.append(one, make_events(one, i * 100, 10), ingest_time_ms=T0)
    sizes = [row[4] for row in segment_rows(path)]
    assert len(sizes) == 5
    # budget for exactly the newest three segments
    budget = sum(sizes[2:])
    assert log.apply_retention(T0, max_age_ms=10**9, max_bytes_per_partition=budget) == 20
    assert log.offsets("clicks") == {0: PartitionOffsets(20, 50)}
    assert [r[2] for r in segment_rows(path)] == [20, 30, 40]
    assert offsets_read(log, one, 0, 0, 100) == list(range(20, 50))
    # one byte less than the newest two: only the newest stays
    assert log.apply_retention(T0, max_age_ms=10**9, max_bytes_per_partition=sizes[3] + sizes[4] - 1) == 20
    assert log.offsets("clicks") == {0: PartitionOffsets(40, 50)}
    log.close()


def test_retention_applies_per_partition_and_stream(tmp_path: Path) -> None:
    path = tmp_path / "multi.db"
    log = SqliteEventLog(path)
    other = StreamDef(name="other", key_field="user", values=("ms",), partitions=2)
    log.ensure_topic(STREAM)
    log.ensure_topic(other)
    log.append(STREAM, make_events(STREAM, 0, 40), ingest_time_ms=T0)
    log.append(other, make_events(other, 0, 40), ingest_time_ms=T0 + 5_000)
    dropped = log.apply_retention(T0 + 5_000, max_age_ms=1_000, max_bytes_per_partition=10**9)
    assert dropped == 40
    assert all(o.start == o.end for o in log.offsets("clicks").values())
    assert all(o.start == 0 and o.end > 0 for o in log.offsets("other").values())
    log.close()


def retention_steps(log: SqliteEventLog, now_ms: int, max_age_ms: int, max_bytes: int) -> tuple[int, int]:
    """(records dropped, SQLite virtual-machine steps a retention pass took, in tens): what it
    read, counted, not timed."""
    return counted_steps(log._conn, lambda: log.apply_retention(now_ms, max_age_ms=max_age_ms,
                                                                max_bytes_per_partition=max_bytes))


def test_retention_reads_what_it_drops_not_the_whole_partition(tmp_path: Path) -> None:
    """A pass once a minute over a log at its size cap must not read every segment each time
    (it held the log's write lock ~300 ms at 14 minutes of 20 000 events/s, growing with the log)."""
    one = STREAM.model_copy(update={"partitions": 1})
    steps = {}
    for segments in (20, 400):
        log = SqliteEventLog(tmp_path / f"{segments}.db", synchronous="OFF")
        log.ensure_topic(one)
        for i in range(segments):
            log.append(one, make_events(one, i, 1), ingest_time_ms=T0 + i)
        nothing = retention_steps(log, T0 + segments, max_age_ms=10**9, max_bytes=10**9)
        two_by_age = retention_steps(log, T0 + 1_002, max_age_ms=1_000, max_bytes=10**9)
        one_by_size = retention_steps(log, T0, max_age_ms=10**9,
                                      max_bytes=sum(r[4] for r in segment_rows(tmp_path / f"{segments}.db")) - 1)
        assert (nothing[0], two_by_age[0], one_by_size[0]) == (0, 2, 1)
        steps[segments] = (nothing[1], two_by_age[1], one_by_size[1])
        log.close()
    # 20 times the segments, about the same work (the pass before read them all: ~20 times more)
    assert all(many <= 2 * few + 2 for few, many in zip(steps[20], steps[400])), steps


def test_the_partitions_weight_follows_appends_retention_and_a_log_made_before_it(tmp_path: Path) -> None:
    path = tmp_path / "weights.db"
    log = SqliteEventLog(path, synchronous="OFF")
    log.ensure_topic(STREAM)
    for i in range(6):
        log.append(STREAM, make_events(STREAM, i * 100, 40), ingest_time_ms=T0 + i)
    weights = partition_weights(path)
    assert all(kept == summed > 0 for kept, summed in weights.values()), weights
    log.close()
    # A log made before the weight: the column is added as unknown, and the first pass weighs it.
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE partitions DROP COLUMN bytes")
    log = SqliteEventLog(path, synchronous="OFF")
    assert all(kept is None for kept, _ in partition_weights(path).values())
    sizes = defaultdict(list)
    for stream, p, _, _, size in segment_rows(path):
        sizes[p].append(size)
    budget = min(sum(s[-2:]) for s in sizes.values())  # at most the newest two stay anywhere
    dropped = log.apply_retention(T0, max_age_ms=10**9, max_bytes_per_partition=budget)
    assert dropped > 0
    weights = partition_weights(path)
    assert all(kept == summed <= max(budget, sizes[p][-1]) for (_, p), (kept, summed) in weights.items()), weights
    log.append(STREAM, make_events(STREAM, 900, 40), ingest_time_ms=T0 + 10)
    assert all(kept == summed for kept, summed in partition_weights(path).values())
    log.close()


# -- schema evolution -----------------------------------------------------------------


def test_field_added_later_reads_from_extras_or_as_null_or_empty(log: EventLog) -> None:
    old = [
        EventValidator(STREAM).validate({"time": T0 + i, "user": "u", "page": "/a", "ms": i, "region": "eu"})
        for i in range(3)
    ]
    log.append(STREAM, old, T0)
    newer = StreamDef(
        name="clicks",
        key_field="user",
        dimensions=("page", "region"),
        values=("ms", "bytes"),
        distinct=("user", "session"),
        partitions=4,
    )
    p = partition_for("u", 4)
    table = read_table(log, newer, p, 0, 100)
    assert table.schema.names == [OFFSET, *segment_schema(newer).names]
    # A dimension declared later reads from the old events' extra fields where they sent it.
    assert table.column("region").to_pylist() == ["eu", "eu", "eu"]
    assert table.column("bytes").to_pylist() == [None, None, None]  # value added later: null
    assert table.column("session").to_pylist() == [None, None, None]  # distinct-only field: null
    assert table.column("ms").to_pylist() == [0.0, 1.0, 2.0]
    assert table.column("page").to_pylist() == ["/a"] * 3
    # new events under the new definition sit next to the old ones
    log.append(newer, [EventValidator(newer).validate({"time": T0, "user": "u", "region": "us", "bytes": 7})], T0)
    table = read_table(log, newer, p, 0, 100)
    assert table.column("region").to_pylist() == ["eu", "eu", "eu", "us"]
    assert table.column("bytes").to_pylist() == [None, None, None, 7.0]
    assert table.column("page").to_pylist() == ["/a", "/a", "/a", ""]
    # and the old definition drops the columns it does not know
    table = read_table(log, STREAM, p, 0, 100)
    assert "region" not in table.schema.names
    assert table.num_rows == 4


def test_project_directly() -> None:
    events = make_events(STREAM, 0, 5)
    stored = decode_segment(encode_segment(events_to_batch(STREAM, events, T0)))
    assert stored.schema == segment_schema(STREAM)
    newer = StreamDef(name="clicks", key_field="user", dimensions=("page", "country"), values=("ms", "cost"))
    projected = project(stored, newer)
    assert projected.schema == segment_schema(newer)
    assert projected.column("country").to_pylist() == [""] * 5
    assert projected.column("cost").to_pylist() == [None] * 5
    assert projected.column("ms").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    fewer = StreamDef(name="clicks", values=("ms",))
    assert project(stored, fewer).schema.names == [EVENT_TIME, INGEST_TIME, "ms", EXTRA]


def test_a_segment_written_under_the_current_definition_is_read_as_it_is() -> None:
    stored = decode_segment(encode_segment(events_to_batch(STREAM, make_events(STREAM, 0, 5), T0)))
    assert project(stored, STREAM) is stored  # nothing rebuilt
    newer = StreamDef(name="clicks", key_field="user", dimensions=("page", "country"), values=("ms", "cost"))
    assert project(stored, newer) is not stored


def test_value_field_becoming_a_dimension_reads_as_text() -> None:
    as_value = StreamDef(name="s", values=("x",))
    as_dim = StreamDef(name="s", dimensions=("x",))
    e = EventValidator(as_value).validate({"time": T0, "x": 1.5})
    assert project(events_to_batch(as_value, [e], T0), as_dim).column("x").to_pylist() == ["1.5"]


def test_dimension_becoming_a_value_does_not_break_reads() -> None:
    as_dim = StreamDef(name="s", dimensions=("x",))
    as_value = StreamDef(name="s", values=("x",))
    e = EventValidator(as_dim).validate({"time": T0, "x": "abc"})
    assert project(events_to_batch(as_dim, [e], T0), as_value).column("x").to_pylist() == [None]


def test_dimension_added_later_that_old_events_lacked_reads_empty(log: EventLog) -> None:
    old = [EventValidator(STREAM).validate({"time": T0 + i, "user": "u", "page": "/a", "ms": i}) for i in range(2)]
    log.append(STREAM, old, T0)
    newer = StreamDef(name="clicks", key_field="user", dimensions=("page", "region"), values=("ms",), partitions=4)
    table = read_table(log, newer, partition_for("u", 4), 0, 100)
    assert table.column("region").to_pylist() == ["", ""]


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
def test_append_columns_writes_what_append_writes(backend: Backend, keyed: bool) -> None:
    """The ingest API's columnar path (ingest/columnar.py) appends columns: the same partitions,
    offsets and records as appending the same events one by one (the default turns the columns
    into events; the embedded log writes them as they are)."""
    from ingest.columnar import columnar_events

    rows, columns_stream, log, other = two_streams(backend, keyed, "rows", "columns")
    raws = [{"time": T0 + i, "user": f"u{i % 11}", **({"page": f"/p{i % 3}"} if i % 4 else {}), "ms": i * 1.5}
            for i in range(200)]
    body = "\n".join(json.dumps(r) for r in raws).encode()
    columns = columnar_events(columns_stream, body)
    assert columns is not None
    validator = EventValidator(rows)
    by_rows = log.append(rows, [validator.validate(r) for r in raws], T0 + 500)
    by_columns = other.append_columns(columns_stream, columns, T0 + 500)
    assert by_columns.ranges == by_rows.ranges
    assert_same_records(log, rows, columns_stream)


def two_streams(backend: Backend, keyed: bool, first: str, second: str):
    """Two streams alike in 3 partitions (keyed by user, or keyless), their topics made, and two
    handles on the log, each with its own round-robin counter starting at 0."""
    def stream(name: str) -> StreamDef:
        return StreamDef(name=name, key_field="user" if keyed else None, dimensions=("page",),
                         distinct=None if keyed else ("user",), values=("ms",), partitions=3)

    one, two = stream(first), stream(second)
    log, other = backend.open(), backend.open()
    for s in (one, two):
        log.ensure_topic(s)
    return one, two, log, other


def assert_same_records(log: EventLog, one: StreamDef, two: StreamDef) -> None:
    """Both streams hold the same records at the same offsets, ingest times aside."""
    for p in range(one.partitions):
        end = log.offsets(one.name)[p].end
        assert log.offsets(two.name)[p].end == end
        if end:
            a, b = read_table(log, one, p, 0, end), read_table(log, two, p, 0, end)
            assert b.drop_columns([INGEST_TIME]).equals(a.drop_columns([INGEST_TIME]))


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
def test_append_column_groups_writes_what_appends_one_after_another_write(backend: Backend, keyed: bool) -> None:
    """The ingest workers' group commit: several bodies' columns appended at once give each body
    the ranges, and the log the records, of appending them one after another (an empty body
    among them included)."""
    from ingest.columnar import columnar_events

    one_by_one, grouped, log, other = two_streams(backend, keyed, "one_by_one", "grouped")
    bodies = []
    for size in (7, 40, 1, 25):
        raws = [{"time": T0 + i, "user": f"u{(i * size) % 13}", "page": f"/p{i % 3}", "ms": i * 0.5}
                for i in range(size)]
        bodies.append(columnar_events(one_by_one, "\n".join(json.dumps(r) for r in raws).encode()))
    bodies.insert(2, bodies[0].slice(0, 0))
    separately = [log.append_columns(one_by_one, table, T0 + 500) for table in bodies]
    together = other.append_column_groups(grouped, bodies, T0 + 500)
    assert [r.ranges for r in together] == [r.ranges for r in separately]
    assert together[2].ranges == {} and sum(r.count for r in together) == 73
    assert_same_records(log, one_by_one, grouped)


@embedded_only
def test_append_column_groups_writes_all_or_nothing(backend: Backend) -> None:
    """The embedded log appends a group in one transaction: a partition it cannot write leaves
    every body of the group unwritten, not the ones before it."""
    from ingest.columnar import columnar_events

    log = backend.open()
    log.ensure_topic(STREAM)
    wider = StreamDef(name=STREAM.name, key_field="user", dimensions=("page",), values=("ms",),
                      partitions=STREAM.partitions + 8)  # partitions the log does not have

    def body(users: list[str]) -> pa.Table:
        lines = (json.dumps({"time": T0, "user": user, "page": "/a", "ms": 1.0}) for user in users)
        return columnar_events(wider, "\n".join(lines).encode())

    users = [f"u{i}" for i in range(60)]
    fits = body([u for u in users if partition_for(u, wider.partitions) < STREAM.partitions])
    does_not = body([u for u in users if partition_for(u, wider.partitions) >= STREAM.partitions])
    with pytest.raises(KeyError):
        log.append_column_groups(wider, [fits, does_not], T0)
    assert sum(o.end for o in log.offsets(STREAM.name).values()) == 0
    log.append_column_groups(wider, [fits], T0)  # the first alone fits
    assert sum(o.end for o in log.offsets(STREAM.name).values()) == fits.num_rows


def _per_buffer_lz4_segment(batch: pa.RecordBatch) -> bytes:
    """A segment as the log wrote them before one LZ4 frame: Arrow's IPC compression per buffer."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_a_segment_is_one_lz4_frame_and_older_segments_still_read() -> None:
    batch = events_to_batch(STREAM, make_events(STREAM, 0, 300), T0)
    new = encode_segment(batch)
    assert new[:4] == b"\x04\x22\x4d\x18"  # the LZ4 frame magic
    assert decode_segment(new).equals(batch)
    old = _per_buffer_lz4_segment(batch)
    assert old[:4] != new[:4] and decode_segment(old).equals(batch)
    assert len(new) < len(old) * 1.1  # as small as before (smaller, measured)


@pytest.mark.parametrize("damage", ["truncated", "garbled", "magic only"])
def test_a_corrupt_segment_frame_is_a_value_error_not_an_io_error(damage: str) -> None:
    """The source steps over a segment it cannot decode (error rows) but fails the batch on an
    OSError, the log being unreadable: Arrow reports a bad frame as one (ArrowIOError)."""
    data = encode_segment(events_to_batch(STREAM, make_events(STREAM, 0, 300), T0))
    bad = {"truncated": data[: len(data) // 2], "garbled": data[:20] + b"x" * 64 + data[84:],
           "magic only": data[:4]}[damage]
    with pytest.raises(ValueError):
        decode_segment(bad)


def test_a_log_written_before_reads_on_with_new_segments(tmp_path: Path) -> None:
    """A log whose older segments have per-buffer compression: reads cross from those into
    the new ones."""
    log = SqliteEventLog(tmp_path / "log.db")
    log.ensure_topic(STREAM)
    first = make_events(STREAM, 0, 40)
    log.append(STREAM, first, T0)
    with sqlite3.connect(tmp_path / "log.db") as conn:
        rows = conn.execute("SELECT rowid, data FROM segments").fetchall()
        for rowid, data in rows:
            conn.execute("UPDATE segments SET data = ? WHERE rowid = ?",
                         (_per_buffer_lz4_segment(decode_segment(data)), rowid))
    second = make_events(STREAM, 40, 40)
    log.append(STREAM, second, T0)
    read = sum(batch.num_rows for p, o in log.offsets(STREAM.name).items() for batch in log.read(STREAM, p, o.start, o.end))
    assert read == 80
    log.close()


def test_a_new_log_file_has_large_pages_and_one_made_before_keeps_its_own(tmp_path: Path) -> None:
    """A segment is a blob of hundreds of KB at line rate: a new file gets PAGE_SIZE pages (fewer
    write-ahead log frames an append); a file made with SQLite's default 4 KiB pages (an older
    log) keeps them, and reads and appends as before."""
    new = SqliteEventLog(tmp_path / "new.db")
    new.ensure_topic(STREAM)
    older_path = tmp_path / "older.db"
    with sqlite3.connect(older_path) as conn:
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE made_before (x)")
    older = SqliteEventLog(older_path)
    older.ensure_topic(STREAM)
    for log in (new, older):
        log.append(STREAM, make_events(STREAM, 0, 3_000), T0)
    older.close()
    older = SqliteEventLog(older_path)  # opened again: still its own pages
    older.append(STREAM, make_events(STREAM, 3_000, 40), T0)
    sizes = {}
    for name, log in (("new", new), ("older", older)):
        read = sum(batch.num_rows for p, o in log.offsets(STREAM.name).items()
                   for batch in log.read(STREAM, p, o.start, o.end))
        sizes[name] = log._conn.execute("PRAGMA page_size").fetchone()[0]
        log.close()
        assert read == {"new": 3_000, "older": 3_040}[name]
    assert sizes == {"new": PAGE_SIZE, "older": 4096}
    assert PAGE_SIZE > 4096


def test_an_extra_field_declared_later_reads_as_null_where_no_label_could_hold_it() -> None:
    """Undeclared fields are kept unchecked; one declared a dimension later must not bring back a
    value the validator refuses as a label (a NUL: a batch no PostgreSQL store could commit; over
    1 024 characters or 2 048 bytes), so each reads as "" (null, as a value that does not convert)."""
    sent = ["eu", "e\x00u", "\u4e2d" * 683, "x" * 1025, 7]  # a lone surrogate is refused even there now
    old = [EventValidator(STREAM).validate({"time": T0, "user": "u", "page": "/a", "region": r}) for r in sent]
    batch = events_to_batch(STREAM, old, T0)
    newer = STREAM.model_copy(update={"dimensions": (*STREAM.dimensions, "region")})
    assert project(batch, newer).column("region").to_pylist() == ["eu", "", "", "", "7"]


@embedded_only
@pytest.mark.parametrize("overtaken", [False, True], ids=["guessed", "overtaken"])
def test_an_append_behind_a_later_one_is_encoded_with_that_time_or_restamped_if_overtaken(
        backend: Backend, overtaken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several writers (the ingest worker processes) append with times read before they took the
    log: a partition's records never carry a time before its last append's. The log reads that
    time before encoding, so a segment is encoded once; only another append between that read
    and the transaction makes it re-stamp the encoded segment (or the times would go back)."""
    from ingest.columnar import columnar_events
    import ingest.log.sqlite as sqlite_log

    log, other = backend.open(), backend.open()
    log.ensure_topic(STREAM)
    lines = [json.dumps({"time": T0, "user": f"u{i}", "page": "/a", "ms": 1.0}) for i in range(40)]
    body = columnar_events(STREAM, "\n".join(lines).encode())
    log.append_column_groups(STREAM, [body], T0 + 100)
    restamped, restamp = [], sqlite_log.restamped_segment
    monkeypatch.setattr(sqlite_log, "restamped_segment", lambda data, at: restamped.append(at) or restamp(data, at))
    if overtaken:  # another writer appends at a later time after the guess, before the transaction
        guess = log._append_times

        def guessed_then_overtaken(stream, ingest_time_ms):
            stamps = guess(stream, ingest_time_ms)
            other.append_column_groups(STREAM, [body], T0 + 300)
            return stamps
        monkeypatch.setattr(log, "_append_times", guessed_then_overtaken)
    (result,) = log.append_column_groups(STREAM, [body], T0 + 50)  # read the clock before the one above
    latest = T0 + 300 if overtaken else T0 + 100
    for partition, (first, count) in result.ranges.items():
        times = [t for b in log.read(STREAM, partition, first, first + count) for t in b.column(INGEST_TIME).to_pylist()]
        assert times == [latest] * count
        assert log.ingest_time_ms(STREAM.name, partition, first) == latest
    assert restamped == ([latest] * len(result.ranges) if overtaken else [])
